//! SEMEL's unordered primary-backup replication: a primary logs each prepare and decision
//! and sends it to every backup, which logs it and acknowledges in any order. A prepare's
//! vote waits for the primary's own log and f backups (a majority with the primary); a
//! decision's acknowledgement waits for the primary's log only. A record is sent again to a
//! backup that did not acknowledge, until every backup has it.

use std::collections::BTreeSet;

use crate::messages::{RefusalKind, Replicate, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};

use super::{vote, AfterLog, CallFor, DataCore, Pending, PendingKey, PendingKind};
use crate::layout::{ReplicaRole, ShardId};
use crate::shard::replica::ShardRecord;
use crate::shard::wire;
use crate::shard::DataIo;

impl DataCore {
    pub(super) fn on_replicate(&mut self, from: &str, call: CallId, replicate: Replicate) -> Option<Response> {
        let Replicate { shard, record, .. } = replicate;
        match self.role(shard, replicate.epoch) {
            Ok(ReplicaRole::Backup) => {}
            Ok(ReplicaRole::Primary) => {
                return Some(Response::refused(
                    RefusalKind::NotServing,
                    format!("{} is the primary of shard {shard}", self.config.node),
                ))
            }
            Err(refusal) => return Some(refusal),
        }
        if matches!(record, ShardRecord::LeaseGranted { .. } | ShardRecord::Fence { .. }) {
            return Some(Response::refused(RefusalKind::Invalid, "lease and fence records are a replica's own"));
        }
        let replica = self.replicas.get_mut(&shard)?;
        replica.apply(&record);
        self.stats.replicated += 1;
        let after = AfterLog::Reply { to: from.to_string(), call, response: Response::Ack };
        self.unlogged.push((wire::encode_log_record(shard, &record), after));
        None
    }

    /// Logs `record` here and sends it to every backup of `shard`; the waiter is answered
    /// when it is safe.
    pub(super) fn replicate(
        &mut self,
        key: PendingKey,
        record: ShardRecord,
        waiter: Option<(String, CallId)>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        if let Some(pending) = self.pending.get_mut(&key) {
            // Already on its way (a decision from the client and from a termination).
            pending.waiters.extend(waiter);
            self.settle(key, out);
            return;
        }
        self.unlogged.push((wire::encode_log_record(key.0, &record), AfterLog::LocalDurable(key)));
        let pending = Pending {
            record,
            acked: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            local_durable: false,
            waiters: waiter.into_iter().collect(),
            answered: false,
            since: self.now,
        };
        self.pending.insert(key, pending);
        self.send_replicas(key, out);
    }

    /// Sends a pending record to each backup that has neither acknowledged it nor a call in
    /// flight.
    pub(super) fn send_replicas(&mut self, key: PendingKey, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(key.0)) else { return };
        let Some(pending) = self.pending.get_mut(&key) else { return };
        for backup in &group.backups {
            if pending.acked.contains(backup) || pending.in_flight.contains(backup) {
                continue;
            }
            let call = self.ids.call();
            pending.in_flight.insert(backup.clone());
            self.calls.insert(call, CallFor::Replicate { key, backup: backup.clone() });
            let replicate = Replicate {
                shard: key.0,
                // The group's epoch now, not the one the record was made at: a backup added
                // or removed since raised it, and backups refuse other epochs.
                epoch: group.epoch,
                record: pending.record.clone(),
            };
            out.push(Command::Call {
                to: backup.clone(),
                call,
                request: Request::Replicate(replicate),
                deadline: self.config.replicate_deadline,
            });
        }
    }

    /// Answers a pending record's waiters once it is safe, and forgets it once every backup
    /// has it.
    pub(super) fn settle(&mut self, key: PendingKey, out: &mut Vec<Command<Dkv, DataIo>>) {
        let f = self.map.f();
        let backups = self.map.group(ShardId(key.0)).map_or(0, |group| group.backups.len());
        let Some(pending) = self.pending.get_mut(&key) else { return };
        let safe = pending.local_durable && (key.2 == PendingKind::Decided || pending.acked.len() >= f);
        if safe && key.2 == PendingKind::Prepared && self.commit_on_vote.remove(&(key.0, key.1)) {
            // Installed before the vote goes out: a read after the client hears "committed"
            // sees the write. The decision is replicated like any other.
            self.decide_here(key.0, key.1, true, None, out);
        }
        let Some(pending) = self.pending.get_mut(&key) else { return };
        if safe && (!pending.answered || !pending.waiters.is_empty()) {
            if !pending.answered && key.2 == PendingKind::Prepared && !pending.waiters.is_empty() {
                self.stats.prepare_latency.record(self.now.saturating_sub(pending.since));
            }
            pending.answered = true;
            let response = match key.2 {
                PendingKind::Prepared => vote(Ok(())),
                PendingKind::Decided => Response::Ack,
            };
            for (to, call) in pending.waiters.drain(..) {
                out.push(Command::Reply { to, call, response: response.clone() });
            }
        }
        if pending.answered && pending.acked.len() >= backups {
            self.pending.remove(&key);
        }
    }

    /// After a restart: a prepare in this primary's log may not have reached f backups
    /// before the crash (its vote was never sent then), so it is replicated again, and a
    /// retried prepare waits for it as the first one would have.
    pub(super) fn resume_replication(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, DataIo>>) {
        let mut resumed = Vec::new();
        for (shard, replica) in &self.replicas {
            let Some(group) = self.map.group(ShardId(*shard)) else { continue };
            if group.primary != self.config.node {
                continue;
            }
            for (txn, entry) in replica.prepared() {
                let record = ShardRecord::Prepared {
                    txn,
                    commit_ts: entry.commit_ts,
                    writes: entry.writes.clone(),
                    participants: entry.participants.clone(),
                    takeover_of: entry.takeover_of.clone(),
                };
                resumed.push(((*shard, txn, PendingKind::Prepared), record));
                self.undecided.insert((*shard, txn), now);
            }
        }
        for (key, record) in resumed {
            let pending = Pending {
                record,
                acked: BTreeSet::new(),
                in_flight: BTreeSet::new(),
                local_durable: true,
                waiters: Vec::new(),
                answered: false,
                since: self.now,
            };
            self.pending.insert(key, pending);
            self.send_replicas(key, out);
        }
    }

    pub(super) fn on_retry(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        self.retry_timer = None;
        for (shard, txn, commit) in std::mem::take(&mut self.lost_decisions) {
            self.send_decision(shard, txn, commit, out);
        }
        let keys: Vec<PendingKey> = self.pending.keys().copied().collect();
        for key in keys {
            self.send_replicas(key, out);
        }
    }
}
