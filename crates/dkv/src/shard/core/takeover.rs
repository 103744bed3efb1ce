//! A primary taking over a shard (after a failover, or its own restart): the seed's
//! Algorithm 2.
//!
//! It fetches the transaction tables of f other replicas of the group (which, on answering,
//! fence the old primary out: they take no record of an older epoch), merges them with its
//! own (a transaction committed anywhere is committed; one decided aborted anywhere is
//! aborted; one prepared stays prepared, and cooperative termination decides it if its
//! client does not), rebuilds its versions in commit order, refuses commit timestamps at or
//! below the largest lease granted, and pushes the merged table to its backups. It serves
//! nothing until then.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::messages::{Fetch, FetchTable, RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::Timestamp;

use super::group_log::AfterLog;
use super::replication::PendingKind;
use super::{CallFor, DataCore};
use crate::layout::ShardId;
use crate::shard::replica::ShardRecord;
use crate::shard::DataIo;

#[derive(Debug, Default)]
pub(super) struct Takeover {
    epoch: u64,
    /// Tables received, by replica.
    tables: BTreeMap<String, (Vec<ShardRecord>, Timestamp)>,
    calls: HashMap<CallId, String>,
}

impl DataCore {
    /// Starts taking over `shard` at `epoch`: fetches from every backup of the group.
    pub(super) fn start_takeover(&mut self, shard: u32, epoch: u64, out: &mut Vec<Command<Dkv, DataIo>>) {
        self.stats.takeovers += 1;
        tracing::info!(node = %self.config.node, shard, epoch, "taking over the shard as its primary");
        self.leases.held.remove(&shard);
        self.assume_validator_leases(shard);
        self.takeovers.insert(shard, Takeover { epoch, ..Takeover::default() });
        self.send_fetches(shard, out);
    }

    /// Fetches from each backup not yet heard and not being asked.
    pub(super) fn send_fetches(&mut self, shard: u32, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(shard)).cloned() else { return };
        let Some(takeover) = self.takeovers.get_mut(&shard) else { return };
        for backup in &group.backups {
            if takeover.tables.contains_key(backup) || takeover.calls.values().any(|asked| asked == backup) {
                continue;
            }
            let call = self.ids.call();
            takeover.calls.insert(call, backup.clone());
            self.calls.insert(call, CallFor::Fetch { shard });
            out.push(Command::Call {
                to: backup.clone(),
                call,
                request: Request::Fetch(Fetch { shard, epoch: takeover.epoch }),
                deadline: self.config.replicate_deadline,
            });
        }
        if group.backups.is_empty() {
            self.finish_takeover(shard, out);
        }
    }

    /// A replica answers a new primary's fetch: it fences older epochs out (durably), then
    /// sends its table.
    pub(super) fn on_fetch(&mut self, from: &str, call: CallId, fetch: Fetch) -> Option<Response> {
        let shard = fetch.shard;
        let Some(group) = self.map.group(ShardId(shard)) else {
            return Some(Response::refused(RefusalKind::NotServing, format!("shard {shard} is not in the map")));
        };
        let known_primary = group.primary == from && group.epoch == fetch.epoch;
        // The node may not have the new map yet: a member of the group asking for a newer
        // epoch is taken at its word (the configuration service made it primary; if not,
        // it cannot gather the f backups it needs anyway).
        let newer_member = fetch.epoch > group.epoch && group.replicas().any(|replica| replica == from);
        if !known_primary && !newer_member {
            return Some(Response::WrongEpoch(group.epoch));
        }
        let replica = self.replicas.get_mut(&shard)?;
        if fetch.epoch < replica.fence() {
            return Some(Response::WrongEpoch(replica.fence()));
        }
        let record = ShardRecord::Fence { epoch: fetch.epoch };
        replica.apply(&record);
        let table = FetchTable { records: replica.records(), lease: replica.lease_granted() };
        let after = AfterLog::Reply { to: from.to_string(), call, response: Response::Table(table) };
        self.log.push(shard, &record, after);
        // A newer epoch than this node's map: fetch the map at the next check.
        self.link.refresh_soon();
        None
    }

    /// A fetched table (or its failure: the next check asks again).
    pub(super) fn on_table(
        &mut self,
        now: Nanos,
        call: CallId,
        shard: u32,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let Some(takeover) = self.takeovers.get_mut(&shard) else { return };
        let Some(from) = takeover.calls.remove(&call) else { return };
        match body {
            Some(Response::Table(table)) => {
                // A prepare of another shard's transaction is no part of this shard's table.
                let records: Vec<ShardRecord> = table
                    .records
                    .into_iter()
                    .filter(|record| match record {
                        ShardRecord::Prepared { participants, .. } => participants.contains(&shard),
                        _ => true,
                    })
                    .collect();
                takeover.tables.insert(from, (records, table.lease));
            }
            Some(Response::WrongEpoch(_)) => {
                // This node's map may be the stale one.
                self.fetch_map(now, out);
                return;
            }
            _ => return,
        }
        if takeover.tables.len() >= self.map.f() {
            self.finish_takeover(shard, out);
        }
    }

    /// Algorithm 2's merge and what follows it.
    fn finish_takeover(&mut self, shard: u32, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(takeover) = self.takeovers.remove(&shard) else { return };
        let leases = self.config.leases();
        let Some(replica) = self.replicas.get_mut(&shard) else { return };
        let mut floor = replica.lease_granted();
        let mut fetched = Vec::new();
        for (records, lease) in takeover.tables.into_values() {
            floor = floor.max(lease);
            fetched.extend(records);
        }
        // Prepares first, so that every decision finds its transaction.
        fetched.sort_by_key(|record| !matches!(record, ShardRecord::Prepared { .. }));
        for record in &fetched {
            replica.apply(record);
        }
        replica.take_over(if leases { floor } else { Timestamp::ZERO });
        let records = replica.records();
        let prepared: Vec<u64> = replica.prepared().into_iter().map(|(txn, _)| txn).collect();
        self.stats.merged_records += records.len() as u64;
        for record in records {
            let key = match &record {
                ShardRecord::Prepared { txn, .. } => (shard, *txn, PendingKind::Prepared),
                ShardRecord::Decided { txn, .. } => (shard, *txn, PendingKind::Decided),
                ShardRecord::LeaseGranted { .. } | ShardRecord::Fence { .. } => continue,
            };
            self.replicate(key, record, None, out);
        }
        for txn in prepared {
            self.termination.prepared((shard, txn), self.now);
        }
    }

    /// Sends every record this primary holds for `shard` to its backups (one just added
    /// starts empty), without logging them again; records already on their way are left to
    /// their own replication.
    pub(super) fn push_table(&mut self, shard: u32, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(replica) = self.replicas.get(&shard) else { return };
        for record in replica.records() {
            let key = match &record {
                ShardRecord::Prepared { txn, .. } => (shard, *txn, PendingKind::Prepared),
                ShardRecord::Decided { txn, .. } => (shard, *txn, PendingKind::Decided),
                ShardRecord::LeaseGranted { .. } | ShardRecord::Fence { .. } => continue,
            };
            if self.replication.contains(&key) {
                continue;
            }
            self.replication.durable(key, record, BTreeSet::new(), true, self.now);
            self.send_replicas(key, out);
        }
    }
}
