//! A backup that restarts catches up from its primaries before anything else can count on
//! what it acknowledged before the crash.
//!
//! Its log cannot tell it what it lost: a write the disk acknowledged and dropped at the end
//! of the log reads as a torn tail, which recovery cuts as it would an unfinished write. So
//! a node that restarts with a log (records, or a cut tail) asks the primary of every shard
//! it backs for the shard's records again ([`Request::Resync`]); the primary sends them as
//! ordinary replication, each again until this backup acknowledges it, and counts this
//! backup's earlier acknowledgements of records still pending as void. A shard whose group
//! failed over meanwhile needs none: the new primary's takeover pushes its merged table to
//! every backup. What this does not close is the window before the primary answers: a
//! takeover that counts this backup's table then may miss a record only it and the old
//! primary held.

use std::collections::{BTreeMap, BTreeSet};

use crate::messages::{RefusalKind, Request, Response, Resync};
use crate::Dkv;
use virga_net::role::{CallId, Command};

use super::replication::pending_key;
use super::{CallFor, DataCore};
use crate::layout::ShardId;
use crate::shard::DataIo;

#[derive(Debug, Default)]
pub(super) struct Resyncs {
    /// The node opened a log that held records (or had its tail cut): it resyncs at start.
    on_start: bool,
    /// Shards whose primary has not answered yet, with the call in flight, if any.
    waiting: BTreeMap<u32, Option<CallId>>,
}

impl Resyncs {
    /// Shards still waiting for their primary's answer.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

impl DataCore {
    /// Makes this node, at its start, ask the primary of each shard it backs to send the
    /// shard's records again (its log held some, so it ran before and may have lost some).
    pub fn resync_on_start(&mut self) {
        self.resyncs.on_start = true;
    }

    /// At the start: every shard this node backs waits for a resync.
    pub(super) fn start_resyncs(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        if !self.resyncs.on_start || crate::shard::replica::weakened!(self.config.weakened, skip_resync) {
            return;
        }
        let node = self.config.node.clone();
        for (shard, group) in self.map.groups().iter().enumerate() {
            if group.backups.contains(&node) {
                self.resyncs.waiting.insert(shard as u32, None);
            }
        }
        self.send_resyncs(out);
    }

    /// Asks each waiting shard's primary (again, at every check, until one answers). A shard
    /// this node no longer backs, or now leads, waits no more.
    pub(super) fn send_resyncs(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        let node = self.config.node.clone();
        let shards: Vec<u32> = self.resyncs.waiting.keys().copied().collect();
        for shard in shards {
            let group = self.map.group(ShardId(shard)).cloned();
            let Some(group) = group.filter(|group| group.backups.contains(&node)) else {
                self.resyncs.waiting.remove(&shard);
                continue;
            };
            if self.resyncs.waiting.get(&shard).is_some_and(Option::is_some) {
                continue;
            }
            let call = self.ids.call();
            self.resyncs.waiting.insert(shard, Some(call));
            self.calls.insert(call, CallFor::Resync { shard });
            out.push(Command::Call {
                to: group.primary.clone(),
                call,
                request: Request::Resync(Resync { shard, epoch: group.epoch }),
                deadline: self.config.replicate_deadline,
            });
        }
    }

    /// The primary's answer: an acknowledgement ends the wait (the records follow as
    /// replication); anything else is asked again at the next check.
    pub(super) fn on_resynced(&mut self, shard: u32, body: Option<Response>) {
        if matches!(body, Some(Response::Ack)) {
            self.resyncs.waiting.remove(&shard);
            self.stats.resyncs += 1;
        } else if let Some(call) = self.resyncs.waiting.get_mut(&shard) {
            *call = None;
        }
    }

    /// A restarted backup of `shard` asks for its records again: every record this primary
    /// holds goes to it, and its acknowledgements of records still pending count no more.
    pub(super) fn on_resync(&mut self, from: &str, resync: Resync, out: &mut Vec<Command<Dkv, DataIo>>) -> Response {
        if let Err(refusal) = self.primary_of(resync.shard, resync.epoch) {
            return refusal;
        }
        let Some(group) = self.map.group(ShardId(resync.shard)).cloned() else {
            return Response::refused(RefusalKind::NotServing, format!("shard {} is not in the map", resync.shard));
        };
        if !group.backups.iter().any(|backup| backup == from) {
            return Response::refused(
                RefusalKind::Invalid,
                format!("{from} is no backup of shard {} at epoch {}", resync.shard, group.epoch),
            );
        }
        let Some(replica) = self.replicas.get(&resync.shard) else {
            return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", resync.shard));
        };
        let others: BTreeSet<String> = group.backups.iter().filter(|backup| *backup != from).cloned().collect();
        for record in replica.records() {
            let Some(key) = pending_key(resync.shard, &record) else { continue };
            if !self.replication.forget_ack(&key, from) {
                self.replication.durable(key, record, others.clone(), true, self.now);
            }
            self.send_replicas(key, out);
        }
        // What it lost may have settled here since: its versions and outcomes go in parts.
        self.send_settled_state(resync.shard, &[from.to_string()], out);
        self.stats.resyncs_served += 1;
        Response::Ack
    }
}
