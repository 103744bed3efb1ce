//! SEMEL's unordered primary-backup replication: a primary logs each prepare and decision
//! and sends it to every backup, which logs it and acknowledges in any order. A prepare's
//! vote waits for the primary's own log and f backups (a majority with the primary); a
//! decision's acknowledgement waits for the primary's log only. A record is sent again to a
//! backup that did not acknowledge, until every backup has it.
//!
//! [`Replication`] holds what a primary replicates and decides when a record is safe and
//! when it is held everywhere; it knows nothing of calls or the map (the core names the
//! backups and the quorum, and sends what it hands out).

use std::collections::{BTreeMap, BTreeSet};

use crate::messages::{RefusalKind, Replicate, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::TxnId;

use super::group_log::AfterLog;
use super::{vote, CallFor, DataCore};
use crate::layout::{ReplicaRole, ShardId};
use crate::shard::replica::ShardRecord;
use crate::shard::DataIo;

/// The kind of a replicated record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum PendingKind {
    Prepared,
    Decided,
    /// A part of the settled state, numbered by the primary (in place of a transaction).
    Settled,
}

/// A replicated record: its shard, transaction (or part number) and kind.
pub(super) type PendingKey = (u32, TxnId, PendingKind);

/// The key a transaction's record of `shard` is replicated under (none for the records a
/// replica keeps to itself, and for settled parts, which are numbered as they are sent).
pub(super) fn pending_key(shard: u32, record: &ShardRecord) -> Option<PendingKey> {
    match record {
        ShardRecord::Prepared { txn, .. } => Some((shard, *txn, PendingKind::Prepared)),
        ShardRecord::Decided { txn, .. } => Some((shard, *txn, PendingKind::Decided)),
        ShardRecord::LeaseGranted { .. } | ShardRecord::Fence { .. } | ShardRecord::Settled(_) => None,
    }
}

/// About how many bytes of versions one part of a settled state carries.
pub(super) const SETTLED_PART_BYTES: usize = 256 * 1024;

/// A record replicated by a primary, until every backup has it.
#[derive(Debug)]
struct Pending {
    record: ShardRecord,
    /// Backups that acknowledged, and backups with a call in flight.
    acked: BTreeSet<String>,
    in_flight: BTreeSet<String>,
    local_durable: bool,
    /// Callers answered once the record is safe (for a prepare: a majority holds it; for a
    /// decision: it is durable here).
    waiters: Vec<(String, CallId)>,
    answered: bool,
    /// When it was logged and sent (for the prepare latency).
    since: Nanos,
}

/// The callers of a record that became safe, the answer they get, and, for a prepare's
/// first answer, how long it took.
#[derive(Debug, PartialEq)]
pub(super) struct Answer {
    pub(super) waiters: Vec<(String, CallId)>,
    pub(super) response: Response,
    pub(super) prepare_latency: Option<Nanos>,
}

/// Every record a primary replicates, until each backup of its shard holds it.
#[derive(Debug, Default)]
pub(super) struct Replication {
    pending: BTreeMap<PendingKey, Pending>,
}

impl Replication {
    /// A record logged here now: durable nowhere yet.
    pub(super) fn logged(
        &mut self,
        key: PendingKey,
        record: ShardRecord,
        waiter: Option<(String, CallId)>,
        now: Nanos,
    ) {
        let pending = Pending {
            record,
            acked: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            local_durable: false,
            waiters: waiter.into_iter().collect(),
            answered: false,
            since: now,
        };
        self.pending.insert(key, pending);
    }

    /// A record already durable here, sent (again) to the backups not in `acked`. One that
    /// is `answered` had its safety decided before (it was sent to f backups in an earlier
    /// life); one that is not waits for f acknowledgements before a retried request hears it.
    pub(super) fn durable(
        &mut self,
        key: PendingKey,
        record: ShardRecord,
        acked: BTreeSet<String>,
        answered: bool,
        now: Nanos,
    ) {
        let pending = Pending {
            record,
            acked,
            in_flight: BTreeSet::new(),
            local_durable: true,
            waiters: Vec::new(),
            answered,
            since: now,
        };
        self.pending.insert(key, pending);
    }

    pub(super) fn contains(&self, key: &PendingKey) -> bool {
        self.pending.contains_key(key)
    }

    /// Records not yet held by every backup.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    pub(super) fn keys(&self) -> Vec<PendingKey> {
        self.pending.keys().copied().collect()
    }

    /// Adds a caller to a record on its way.
    pub(super) fn join(&mut self, key: &PendingKey, waiter: Option<(String, CallId)>) {
        if let Some(pending) = self.pending.get_mut(key) {
            pending.waiters.extend(waiter);
        }
    }

    /// Adds a caller to a record whose answer has not gone out yet; false if it has (or the
    /// record is held everywhere), and the caller is answered at once.
    pub(super) fn wait_unanswered(&mut self, key: &PendingKey, waiter: (String, CallId)) -> bool {
        match self.pending.get_mut(key) {
            Some(pending) if !pending.answered => {
                pending.waiters.push(waiter);
                true
            }
            _ => false,
        }
    }

    /// Whether the record's answer went out, or it is no longer replicated at all.
    pub(super) fn answered_or_done(&self, key: &PendingKey) -> bool {
        self.pending.get(key).is_none_or(|pending| pending.answered)
    }

    /// The backups of `backups` the record must go to now (neither acknowledged nor with a
    /// call in flight), each now counted in flight, with the record.
    pub(super) fn unsent(&mut self, key: &PendingKey, backups: &[String]) -> Vec<(String, ShardRecord)> {
        let Some(pending) = self.pending.get_mut(key) else { return Vec::new() };
        let mut sends = Vec::new();
        for backup in backups {
            if pending.acked.contains(backup) || !pending.in_flight.insert(backup.clone()) {
                continue;
            }
            sends.push((backup.clone(), pending.record.clone()));
        }
        sends
    }

    /// A backup's call ended, acknowledged or not; false if the record is gone.
    pub(super) fn call_ended(&mut self, key: &PendingKey, backup: String, acknowledged: bool) -> bool {
        let Some(pending) = self.pending.get_mut(key) else { return false };
        pending.in_flight.remove(&backup);
        if acknowledged {
            pending.acked.insert(backup);
        }
        true
    }

    /// The record is durable in this primary's log.
    pub(super) fn durable_here(&mut self, key: &PendingKey) {
        if let Some(pending) = self.pending.get_mut(key) {
            pending.local_durable = true;
        }
    }

    /// A backup that lost its log: its acknowledgement of the record counts no more.
    pub(super) fn forget_ack(&mut self, key: &PendingKey, backup: &str) -> bool {
        let Some(pending) = self.pending.get_mut(key) else { return false };
        pending.acked.remove(backup);
        true
    }

    /// Whether the record is safe: durable here, and for a prepare held by `f` backups.
    pub(super) fn is_safe(&self, key: &PendingKey, f: usize) -> bool {
        self.pending.get(key).is_some_and(|pending| {
            pending.local_durable && (key.2 != PendingKind::Prepared || pending.acked.len() >= f)
        })
    }

    /// The answer due for a safe record: its first, or the one to callers that joined since.
    pub(super) fn answer(&mut self, key: &PendingKey, now: Nanos) -> Option<Answer> {
        let pending = self.pending.get_mut(key)?;
        if pending.answered && pending.waiters.is_empty() {
            return None;
        }
        let first_vote = !pending.answered && key.2 == PendingKind::Prepared && !pending.waiters.is_empty();
        pending.answered = true;
        let response = match key.2 {
            PendingKind::Prepared => vote(Ok(())),
            PendingKind::Decided | PendingKind::Settled => Response::Ack,
        };
        let prepare_latency = first_vote.then(|| now.saturating_sub(pending.since));
        Some(Answer { waiters: std::mem::take(&mut pending.waiters), response, prepare_latency })
    }

    /// Forgets the record once it was answered and all `backups` hold it.
    pub(super) fn forget_if_held(&mut self, key: &PendingKey, backups: usize) {
        if self.pending.get(key).is_some_and(|pending| pending.answered && pending.acked.len() >= backups) {
            self.pending.remove(key);
        }
    }

    /// Stops replicating `shard` (this node no longer leads it).
    pub(super) fn drop_shard(&mut self, shard: u32) {
        self.pending.retain(|(pending, _, _), _| *pending != shard);
    }

    /// Records of `shard` some of its `backups` backups do not hold yet.
    pub(super) fn backlog(&self, shard: u32, backups: usize) -> usize {
        self.pending.iter().filter(|(key, pending)| key.0 == shard && pending.acked.len() < backups).count()
    }
}

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
        self.log.push(shard, &record, AfterLog::Reply { to: from.to_string(), call, response: Response::Ack });
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
        // Already on its way (a decision from the client and from a termination).
        if self.replication.contains(&key) {
            self.replication.join(&key, waiter);
            self.settle(key, out);
            return;
        }
        self.log.push(key.0, &record, AfterLog::LocalDurable(key));
        self.replication.logged(key, record, waiter, self.now);
        self.send_replicas(key, out);
    }

    /// Sends this primary's settled state of `shard`, in parts, to the backups `to` (each part
    /// replicated as a record until they acknowledge it): a backup new to the group, or one
    /// that lost the end of its log, lacks what settled entries no longer carry.
    pub(super) fn send_settled_state(&mut self, shard: u32, to: &[String], out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(shard)).cloned() else { return };
        let Some(replica) = self.replicas.get(&shard) else { return };
        let others: BTreeSet<String> = group.backups.iter().filter(|backup| !to.contains(backup)).cloned().collect();
        for part in replica.settled_parts(SETTLED_PART_BYTES) {
            self.settled_parts_sent += 1;
            let key = (shard, self.settled_parts_sent, PendingKind::Settled);
            self.replication.durable(key, ShardRecord::Settled(part), others.clone(), true, self.now);
            self.send_replicas(key, out);
        }
        self.stats.settled_states_sent += 1;
    }

    /// Sends a pending record to each backup that has neither acknowledged it nor a call in
    /// flight.
    pub(super) fn send_replicas(&mut self, key: PendingKey, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(key.0)) else { return };
        for (backup, record) in self.replication.unsent(&key, &group.backups) {
            let call = self.ids.call();
            self.calls.insert(call, CallFor::Replicate { key, backup: backup.clone() });
            // The group's epoch now, not the one the record was made at: a backup added or
            // removed since raised it, and backups refuse other epochs.
            let replicate = Replicate { shard: key.0, epoch: group.epoch, record };
            out.push(Command::Call {
                to: backup,
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
        let safe = self.replication.is_safe(&key, f);
        if safe && key.2 == PendingKind::Prepared && self.commit_on_vote.remove(&(key.0, key.1)) {
            // Installed before the vote goes out: a read after the client hears "committed"
            // sees the write. The decision is replicated like any other.
            self.decide_here(key.0, key.1, true, None, out);
        }
        if let Some(answer) = safe.then(|| self.replication.answer(&key, self.now)).flatten() {
            if let Some(latency) = answer.prepare_latency {
                self.stats.prepare_latency.record(latency);
            }
            for (to, call) in answer.waiters {
                out.push(Command::Reply { to, call, response: answer.response.clone() });
            }
        }
        self.replication.forget_if_held(&key, backups);
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
                self.termination.prepared((*shard, txn), now);
            }
        }
        for (key, record) in resumed {
            self.replication.durable(key, record, BTreeSet::new(), false, self.now);
            self.send_replicas(key, out);
        }
    }

    pub(super) fn on_retry(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        self.retry_timer = None;
        for (shard, txn, commit) in self.termination.take_lost_decisions() {
            self.send_decision(shard, txn, commit, out);
        }
        for key in self.replication.keys() {
            self.send_replicas(key, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: usize = 1;

    fn prepared(txn: TxnId) -> (PendingKey, ShardRecord) {
        let record = ShardRecord::Prepared {
            txn,
            commit_ts: virga_storage::Timestamp::ZERO,
            writes: Vec::new(),
            participants: vec![0],
            takeover_of: Vec::new(),
        };
        ((0, txn, PendingKind::Prepared), record)
    }

    fn backups() -> Vec<String> {
        vec!["b1".to_string(), "b2".to_string()]
    }

    #[test]
    fn a_prepare_is_safe_once_durable_here_and_at_f_backups_and_kept_until_every_backup_has_it() {
        let mut replication = Replication::default();
        let (key, record) = prepared(7);
        replication.logged(key, record, Some(("client".into(), CallId(3))), 100);
        let sent: Vec<String> = replication.unsent(&key, &backups()).into_iter().map(|(to, _)| to).collect();
        assert_eq!(sent, backups());
        assert!(replication.unsent(&key, &backups()).is_empty(), "calls in flight are not sent twice");
        assert!(replication.call_ended(&key, "b1".into(), true));
        assert!(!replication.is_safe(&key, F), "not durable here yet");
        replication.durable_here(&key);
        assert!(replication.is_safe(&key, F));
        let answer = replication.answer(&key, 250).expect("the first answer");
        assert_eq!(answer.waiters, vec![("client".to_string(), CallId(3))]);
        assert_eq!(answer.response, vote(Ok(())));
        assert_eq!(answer.prepare_latency, Some(150));
        assert_eq!(replication.answer(&key, 300), None, "answered once");
        replication.forget_if_held(&key, 2);
        assert!(replication.contains(&key), "b2 does not hold it yet");
        assert!(replication.call_ended(&key, "b2".into(), false));
        let again: Vec<String> = replication.unsent(&key, &backups()).into_iter().map(|(to, _)| to).collect();
        assert_eq!(again, vec!["b2".to_string()], "only the backup that did not acknowledge");
        replication.call_ended(&key, "b2".into(), true);
        replication.forget_if_held(&key, 2);
        assert!(!replication.contains(&key));
        assert!(replication.answered_or_done(&key));
    }

    #[test]
    fn a_decision_is_safe_once_durable_here() {
        let mut replication = Replication::default();
        let key = (0, 9, PendingKind::Decided);
        replication.logged(key, ShardRecord::Decided { txn: 9, commit: true }, None, 0);
        replication.durable_here(&key);
        assert!(replication.is_safe(&key, F));
        let answer = replication.answer(&key, 5).expect("the decision is answered");
        assert_eq!(answer.response, Response::Ack);
        assert_eq!(answer.prepare_latency, None);
    }

    #[test]
    fn a_prepare_resumed_after_a_restart_holds_a_retried_prepare_until_f_backups_have_it() {
        let mut replication = Replication::default();
        let (key, record) = prepared(4);
        replication.durable(key, record, BTreeSet::new(), false, 0);
        assert!(!replication.answered_or_done(&key));
        assert!(replication.wait_unanswered(&key, ("client".into(), CallId(1))));
        assert!(!replication.is_safe(&key, F));
        replication.unsent(&key, &backups());
        replication.call_ended(&key, "b2".into(), true);
        let answer = replication.answer(&key, 10).expect("safe now");
        assert_eq!(answer.waiters.len(), 1);
        assert!(
            !replication.wait_unanswered(&key, ("client".into(), CallId(2))),
            "answered: the retry hears it at once"
        );
    }

    #[test]
    fn a_backup_that_lost_its_log_is_sent_the_record_again() {
        let mut replication = Replication::default();
        let (key, record) = prepared(5);
        replication.durable(key, record, backups().into_iter().collect(), true, 0);
        assert!(replication.unsent(&key, &backups()).is_empty());
        assert_eq!(replication.backlog(0, 2), 0);
        assert!(replication.forget_ack(&key, "b1"));
        assert_eq!(replication.backlog(0, 2), 1);
        let again: Vec<String> = replication.unsent(&key, &backups()).into_iter().map(|(to, _)| to).collect();
        assert_eq!(again, vec!["b1".to_string()]);
        replication.drop_shard(0);
        assert_eq!(replication.len(), 0);
        assert!(!replication.call_ended(&key, "b1".into(), true), "a dropped record takes no answers");
    }
}
