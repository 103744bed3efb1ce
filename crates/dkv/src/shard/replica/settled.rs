//! Settling: a decided transaction's entry (its write values, participants and validator
//! passes) is dropped once every replica of the group holds its prepare and its decision,
//! keeping only its id, outcome and commit timestamp ([`SettledTxn`]).
//!
//! The group's **settled point** is a commit timestamp below which every transaction is
//! settled, and stays settled: it is at most the primary's watermark, and the primary
//! refuses writes below its watermark, so no transaction below it is prepared later in the
//! primary's epoch. The primary computes it from what its replication knows (a record is
//! pending until every backup acknowledged it) and sends it with its lease requests; a
//! backup drops the decided entries below it. A new primary's settled point starts from its
//! own table, so a backup takes the settled point of the newest epoch it heard, never a
//! maximum across epochs: a new primary may prepare below an old primary's settled point.
//!
//! What the entry answered, the id still answers: a late or repeated record of the
//! transaction changes nothing, a retried prepare gets its outcome, a terminator's query its
//! phase. Its versions are in every replica's store, installed when the decision was
//! applied, so no takeover needs the write values again.

use std::ops::Bound;

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId, VersionedStore};

use super::{insert_below_newer, SettledPart, ShardRecord, ShardReplica, TxnStatus};

/// What stays of a settled transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettledTxn {
    pub commit: bool,
    pub commit_ts: Timestamp,
}

/// The settled point of the primary of `epoch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SettledPoint {
    pub(super) epoch: u64,
    pub(super) below: Timestamp,
}

impl<S: VersionedStore> ShardReplica<S> {
    /// As the primary of `epoch`: drops the entries of decided transactions below the
    /// watermark that are no longer `unsettled` (some backup lacks a record of them), oldest
    /// first, up to the first that is; returns the settled point (never lower than one it
    /// returned before in the same epoch).
    pub fn settle(&mut self, epoch: u64, unsettled: impl Fn(TxnId) -> bool) -> Timestamp {
        let watermark = self.watermark;
        let mut point = watermark;
        let mut settled = Vec::new();
        for &(commit_ts, txn) in &self.by_ts {
            if commit_ts >= watermark {
                break;
            }
            let decided = self.txns.get(&txn).is_some_and(|entry| entry.status != TxnStatus::Prepared);
            if !decided || unsettled(txn) {
                point = commit_ts;
                break;
            }
            settled.push(txn);
        }
        for txn in settled {
            self.drop_entry(txn);
        }
        self.raise_settled(epoch, point);
        self.settled.below
    }

    /// As a backup: the settled point the primary of `epoch` sent. Drops the entries of
    /// decided transactions below it; returns how many. A point from an older epoch than one
    /// heard before is ignored.
    pub fn learn_settled(&mut self, epoch: u64, point: Timestamp) -> usize {
        if !self.raise_settled(epoch, point) {
            return 0;
        }
        let below = self.settled.below;
        let settled: Vec<TxnId> = self
            .by_ts
            .range(..(below, 0))
            .filter(|(_, txn)| self.txns.get(txn).is_some_and(|entry| entry.status != TxnStatus::Prepared))
            .map(|(_, txn)| *txn)
            .collect();
        let dropped = settled.len();
        for txn in settled {
            self.drop_entry(txn);
        }
        dropped
    }

    /// This replica's settled state in parts of about `part_bytes` each: every key's
    /// versions, and every settled transaction. A backup that merges them all holds every
    /// version and outcome this replica dropped the entries of.
    pub fn settled_parts(&self, part_bytes: usize) -> Vec<SettledPart> {
        let mut parts = Vec::new();
        let mut part = SettledPart::default();
        let mut bytes = 0;
        let store = &self.store;
        store.visit_range(Bound::Unbounded, Bound::Unbounded, &mut |key, entry| {
            let mut versions = Vec::new();
            let mut at = Some(Timestamp::MAX);
            while let Some(ts) = at {
                let Some(version) = store.read_at(entry, ts).visible else { break };
                at = super::just_below(version.ts);
                bytes += 24 + version.value.as_ref().map_or(0, Bytes::len);
                versions.push(version);
            }
            bytes += key.len();
            part.versions.push((key.clone(), versions));
            if bytes >= part_bytes {
                parts.push(std::mem::take(&mut part));
                bytes = 0;
            }
            true
        });
        let mut txns: Vec<_> = self.settled_txns.iter().map(|(txn, settled)| (*txn, *settled)).collect();
        txns.sort_unstable_by_key(|(txn, _)| *txn);
        for chunk in txns.chunks((part_bytes / 32).max(1)) {
            part.txns.extend_from_slice(chunk);
            parts.push(std::mem::take(&mut part));
        }
        if !part.versions.is_empty() || parts.is_empty() {
            parts.push(part);
        }
        if let Some(last) = parts.last_mut() {
            last.validator_floors =
                self.validator_takeovers.iter().map(|(validator, high)| (*validator, *high)).collect();
        }
        parts
    }

    /// Merges a part of the primary's settled state: versions this replica lacks go where
    /// they belong, and each settled transaction is decided here (installing its versions
    /// from the entry, if this replica held it prepared) and settled.
    pub(super) fn merge_settled(&mut self, part: &SettledPart) {
        for (key, versions) in &part.versions {
            let entry = self.store.entry(key);
            for version in versions.iter().rev() {
                if self.store.read_at(&entry, version.ts).visible.is_some_and(|held| held.ts == version.ts) {
                    continue;
                }
                if self.store.install(&entry, version.clone(), Timestamp::ZERO).is_err() {
                    insert_below_newer(&self.store, &entry, version.clone());
                }
            }
        }
        for (validator, high) in &part.validator_floors {
            let held = self.validator_takeovers.entry(*validator).or_default();
            *held = (*held).max(*high);
        }
        for (txn, settled) in &part.txns {
            self.early_decisions.remove(txn);
            if self.txns.contains_key(txn) {
                self.decide(*txn, settled.commit);
                self.drop_entry(*txn);
            } else {
                self.settled_txns.insert(*txn, *settled);
            }
        }
    }

    /// The records that rebuild this replica from nothing, as a checkpoint holds them: its
    /// settled state in parts, its lease and fence, and its live entries.
    pub fn checkpoint_records(&self, part_bytes: usize) -> Vec<ShardRecord> {
        let mut records: Vec<ShardRecord> =
            self.settled_parts(part_bytes).into_iter().map(ShardRecord::Settled).collect();
        records.push(ShardRecord::LeaseGranted { epoch: self.fence, until: self.lease_granted });
        records.push(ShardRecord::Fence { epoch: self.fence });
        records.extend(self.records());
        records
    }

    /// The settled point this replica knows, and the epoch of the primary that set it.
    pub fn settled_point(&self) -> (u64, Timestamp) {
        (self.settled.epoch, self.settled.below)
    }

    /// Settled transactions (ids without entries).
    pub fn settled_entries(&self) -> usize {
        self.settled_txns.len()
    }

    /// Takes `point` as the settled point of `epoch`; false if `epoch` is older than the
    /// one held.
    fn raise_settled(&mut self, epoch: u64, point: Timestamp) -> bool {
        if epoch > self.settled.epoch {
            self.settled = SettledPoint { epoch, below: point };
        } else if epoch == self.settled.epoch {
            self.settled.below = self.settled.below.max(point);
        } else {
            return false;
        }
        true
    }

    pub(super) fn drop_entry(&mut self, txn: TxnId) {
        if let Some(entry) = self.txns.remove(&txn) {
            self.by_ts.remove(&(entry.commit_ts, txn));
            let commit = entry.status == TxnStatus::Committed;
            #[cfg(test)]
            if self.forget_settled_ids {
                return;
            }
            self.settled_txns.insert(txn, SettledTxn { commit, commit_ts: entry.commit_ts });
        }
    }
}
