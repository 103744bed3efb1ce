//! A transaction's scans: each goes to every shard that may hold keys of its range, the
//! rows come back per shard and are merged in key order up to the scan's limit. Every row
//! joins the transaction's reads (validated at prepare like a get), and the range itself is
//! validated at each shard's prepare against phantoms.

use std::collections::{BTreeMap, BTreeSet};

use crate::messages::{Request, Response};
use bytes::Bytes;
use virga_net::role::{Command, Nanos};
use virga_storage::{Timestamp, TxnId};

use super::txn::{describe_failure, Phase, ReadCall, ReadState};
use super::{CallFor, Out, TxnClient};
use crate::layout::ShardMap;
use crate::shard::ScanRange;

/// One scan of a running transaction.
#[derive(Debug)]
pub(super) struct ScanState {
    start: Bytes,
    end: Option<Bytes>,
    limit: u32,
    /// The shards asked, and those that answered.
    shards: Vec<u32>,
    answered: BTreeSet<u32>,
    rows: BTreeMap<Bytes, Bytes>,
    pub(super) prepared_below: bool,
}

impl ScanState {
    /// The scans of a program, each with the shards its range covers.
    pub(super) fn of_program(program: &super::Program, map: &ShardMap) -> Vec<ScanState> {
        program.scans().into_iter().map(|(start, end, limit)| ScanState::new(start, end, limit, map)).collect()
    }

    /// A scan of `[start, end)` (`end` None: unbounded), at most `limit` rows, asking every
    /// shard its range covers.
    pub(super) fn new(start: Bytes, end: Option<Bytes>, limit: u32, map: &ShardMap) -> ScanState {
        ScanState {
            shards: map.shards_overlapping(&start, end.as_deref()).into_iter().map(|shard| shard.0).collect(),
            start,
            end,
            limit,
            answered: BTreeSet::new(),
            rows: BTreeMap::new(),
            prepared_below: false,
        }
    }

    /// Every shard asked has answered.
    pub(super) fn is_complete(&self) -> bool {
        self.shards.iter().all(|shard| self.answered.contains(shard))
    }

    pub(super) fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_ref() && self.end.as_ref().is_none_or(|end| key < end.as_ref())
    }

    /// Every row the shards returned, merged (each shard returns up to the limit).
    pub(super) fn all_rows(&self) -> &BTreeMap<Bytes, Bytes> {
        &self.rows
    }

    pub(super) fn limit(&self) -> usize {
        self.limit as usize
    }

    pub(super) fn shards(&self) -> &[u32] {
        &self.shards
    }

    pub(super) fn covers(&self, shard: u32) -> bool {
        self.shards.contains(&shard)
    }

    pub(super) fn range(&self, ts: Timestamp) -> ScanRange {
        ScanRange { start: self.start.clone(), end: self.end.clone(), ts }
    }

    /// The merged rows, the first `limit` in key order.
    pub(super) fn rows(&self) -> Vec<(Bytes, Bytes)> {
        self.rows.iter().take(self.limit as usize).map(|(key, value)| (key.clone(), value.clone())).collect()
    }
}

impl TxnClient {
    /// Every (scan, shard) part of transaction `id`'s scans from index `from` on.
    pub(super) fn scan_parts(&self, id: TxnId, from: usize) -> Vec<(usize, u32)> {
        let Some(txn) = self.txns.get(&id) else { return Vec::new() };
        txn.scans
            .iter()
            .enumerate()
            .skip(from)
            .flat_map(|(index, scan)| scan.shards.iter().map(move |shard| (index, *shard)))
            .collect()
    }

    pub(super) fn send_scan(&mut self, id: TxnId, index: usize, shard: u32, out: &mut Out) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let Some(active) = self.txns.get_mut(&id) else { return };
        let Some(scan) = active.scans.get(index) else { return };
        let range = ScanRange { start: scan.start.clone(), end: scan.end.clone(), ts: active.ts_begin };
        let request = crate::messages::Scan { shard, epoch, range, limit: scan.limit };
        let Phase::Reading(calls) = &mut active.phase else { return };
        let call = self.ids.call();
        calls.insert(call, ReadCall::Scan(index, shard));
        self.calls.insert(call, CallFor::Txn(id));
        self.stats.scans += 1;
        out.push(Command::Call { to, call, request: Request::Scan(request), deadline: self.config.deadline });
    }

    pub(super) fn on_scan_reply(
        &mut self,
        now: Nanos,
        id: TxnId,
        index: usize,
        shard: u32,
        result: Result<Response, virga_net::NetError>,
        out: &mut Out,
    ) {
        let Some(active) = self.txns.get_mut(&id) else { return };
        match result {
            Ok(Response::Rows(reply)) => {
                let Some(scan) = active.scans.get_mut(index) else { return };
                scan.answered.insert(shard);
                scan.prepared_below |= reply.prepared_below;
                for row in reply.rows {
                    let (key, value, version, writer) = (row.key, row.value, row.version, row.writer);
                    self.observed = self.observed.max(version);
                    scan.rows.insert(key.clone(), value.clone());
                    let read = ReadState {
                        value: Some(value),
                        version,
                        writer,
                        prepared_below: false,
                        cached: false,
                        freshness: active.ts_begin,
                    };
                    active.reads.entry(key).or_insert(read);
                }
            }
            Ok(Response::TooOld(too_old)) => {
                let reason = too_old.explain(active.ts_begin);
                self.aborted(id, reason, out);
                return;
            }
            failure => {
                active.last_failure = Some(describe_failure(&failure));
                active.lost_scans.push((index, shard));
            }
        }
        self.reads_progressed(now, id, out);
    }
}
