//! Commit in two steps, as a two-phase-commit participant needs them: [`Txn::prepare`]
//! validates, holds the written keys and chooses the commit timestamp, answering with a
//! [`Vote`]; [`Txn::decide`] then logs and installs ([`Decision::Commit`]) or releases
//! ([`Decision::Abort`]). A single-node [`Txn::commit`] runs them back to back.
//!
//! Read-write transactions under OCC follow MILANA's Algorithm 1: writes are prepared (no
//! other writer may hold the key, no later reader may have read it, no later version may
//! exist), then every read is validated (still the latest version, not prepared by anyone
//! else) and the key's `latestRead` is raised to the commit timestamp in the same latch
//! hold, so a writer validating afterwards with a smaller timestamp aborts. The commit is
//! logged before its versions are installed, so the log's order is each key's commit order
//! and a durable record's dependencies are durable before it.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use virga_storage::{Timestamp, Version};

use crate::abort::{Abort, AbortReason};
use crate::cc::{LockedKey, Prepared, TxnStore};
use crate::checker::TxnRecord;
use crate::config::{ConcurrencyControl, TimestampScheme};
use crate::engine::{bytes_of, CommitInfo};
use crate::txn::{ReadMode, Txn};
use crate::wal;

/// A participant's answer to [`Txn::prepare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vote {
    /// Validated: the written keys are held and the transaction can commit at `ts`.
    Commit {
        /// The commit timestamp (a read-only transaction's: its snapshot).
        ts: Timestamp,
    },
    /// Validation failed; the transaction has already released everything and aborted.
    Abort(AbortReason),
}

/// The outcome a coordinator hands to [`Txn::decide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Log and install the prepared writes, then release.
    Commit,
    /// Release everything; nothing of the transaction remains.
    Abort,
}

impl<S: TxnStore> Txn<'_, S> {
    /// Validates and commits: [`Txn::prepare`] then [`Txn::decide`]. On `Err` nothing of
    /// the transaction remains.
    pub fn commit(mut self) -> Result<CommitInfo, Abort> {
        match self.prepare() {
            Vote::Commit { .. } => self.decide(Decision::Commit),
            Vote::Abort(reason) => Err(Abort { reason }),
        }
    }

    /// Validates the transaction and, if it can commit, holds its written keys and fixes
    /// its commit timestamp until [`Txn::decide`]. While held, conflicting transactions
    /// abort (or vote [`Vote::Abort`]) instead of waiting. A no vote has already aborted
    /// the transaction. Preparing again returns the same vote; after a yes vote, reads and
    /// writes are refused.
    ///
    /// The prepared state lives in memory only: nothing is logged before `decide`, so a
    /// participant restarted between its yes vote and the decision has forgotten the
    /// transaction. A two-phase-commit participant that must honour its vote across a crash
    /// needs a logged prepare record (the distributed-transactions work adds it). An engine
    /// whose log has failed votes no, since it could not log the commit.
    pub fn prepare(&mut self) -> Vote {
        if let Some(reason) = self.aborted {
            return Vote::Abort(reason);
        }
        if let Some(ts) = self.prepared {
            return Vote::Commit { ts };
        }
        if !self.read_only && self.session.engine.log_failed() {
            self.fail(AbortReason::LogFailed);
            return Vote::Abort(AbortReason::LogFailed);
        }
        let result = if self.read_only {
            self.prepare_read_only()
        } else if self.session.engine.config.cc == ConcurrencyControl::TwoPhaseLocking {
            self.prepare_locking()
        } else {
            self.prepare_optimistic()
        };
        match result {
            Ok(ts) => {
                self.prepared = Some(ts);
                Vote::Commit { ts }
            }
            Err(reason) => {
                self.fail(reason);
                Vote::Abort(reason)
            }
        }
    }

    /// Carries out the coordinator's decision. [`Decision::Commit`] on a transaction not
    /// prepared yet prepares it first (and fails if that votes no); [`Decision::Abort`]
    /// releases everything and reports [`AbortReason::Coordinator`].
    pub fn decide(mut self, decision: Decision) -> Result<CommitInfo, Abort> {
        if decision == Decision::Abort {
            return Err(self.fail(AbortReason::Coordinator));
        }
        let ts = match self.prepare() {
            Vote::Commit { ts } => ts,
            Vote::Abort(reason) => return Err(Abort { reason }),
        };
        let result = if self.read_only { Ok(self.finish_read_only()) } else { self.log_and_install(ts) };
        match result {
            Ok(info) => {
                self.finished = true;
                self.prepared = None;
                self.session.count_commit();
                let (reads, writes) = (&self.reads, &self.writes);
                self.session.record_history(|| TxnRecord {
                    id: info.txn,
                    commit_ts: info.ts,
                    reads: reads.iter().map(|r| (S::key_of(&r.entry).clone(), r.writer)).collect(),
                    writes: writes.iter().map(|w| S::key_of(&w.entry).clone()).collect(),
                });
                Ok(info)
            }
            Err(reason) => Err(self.fail(reason)),
        }
    }

    fn prepare_read_only(&mut self) -> Result<Timestamp, AbortReason> {
        if self.mode == ReadMode::Snapshot && self.saw_prepared {
            return Err(AbortReason::SnapshotPrepared);
        }
        if self.mode == ReadMode::Locking {
            self.validate_scans(Timestamp::ZERO)?;
        }
        Ok(self.begin)
    }

    fn finish_read_only(&mut self) -> CommitInfo {
        if self.mode == ReadMode::Locking {
            self.release_shared(None);
        }
        if self.mode == ReadMode::DependentRead {
            // LocalTS <- max(LocalTS, read timestamp): later transactions of this client
            // never read an older state than this one did.
            self.session.clock.observe(self.begin.time);
        }
        let engine = &self.session.engine;
        let lsn = engine.log.as_ref().map(|_| engine.installed_lsn.load(Ordering::Acquire));
        CommitInfo { txn: self.id, ts: self.begin, lsn }
    }

    fn prepare_optimistic(&mut self) -> Result<Timestamp, AbortReason> {
        let scheme = self.session.engine.config.timestamps;
        let skip_reads = self.session.engine.config.skip_read_validation;
        // MILANA picks the commit timestamp first and validates against it; DST derives it
        // from the timestamps of the tuples it has prepared and read.
        let mut commit = match scheme {
            TimestampScheme::Clock | TimestampScheme::Hlc => {
                let time = self.session.clock.now().max(self.begin.time + 1);
                Timestamp::new(time, self.session.client)
            }
            TimestampScheme::Dst => Timestamp::MAX,
        };
        let id = self.id;
        let store = &self.session.engine.store;
        let mut tuple_time = 0u64;
        let mut inserts = false;
        for write in &mut self.writes {
            let mut key = store.lock(&write.entry);
            let newest = key.newest();
            let state = key.cc_mut();
            if state.held_by_other(id) {
                return Err(AbortReason::WritePrepared);
            }
            if scheme != TimestampScheme::Dst {
                if state.latest_read >= commit {
                    return Err(AbortReason::WriteAfterRead);
                }
                if newest.ts >= commit {
                    return Err(AbortReason::WriteStale);
                }
            }
            tuple_time = tuple_time.max(state.latest_read.time).max(newest.ts.time);
            inserts |= !newest.live;
            state.prepared = Some(Prepared { owner: id, ts: commit });
            write.held = true;
        }
        if inserts {
            let guard = self.session.engine.scan_guard.load(Ordering::SeqCst);
            if scheme == TimestampScheme::Dst {
                tuple_time = tuple_time.max(guard);
            } else if guard >= commit.time {
                // A hybrid clock learns from the conflict, so the retry commits above it.
                self.session.clock.observe(guard);
                return Err(AbortReason::Phantom);
            }
        }
        if scheme == TimestampScheme::Dst {
            for read in &self.reads {
                tuple_time = tuple_time.max(read.ts.time);
            }
            let local = self.session.clock.now();
            commit = Timestamp::new(local.max(tuple_time + 1), self.session.client);
        }
        if !skip_reads {
            let store = &self.session.engine.store;
            for read in &self.reads {
                let mut key = store.lock(&read.entry);
                if key.cc().held_by_other(id) {
                    return Err(AbortReason::ReadPrepared);
                }
                if key.newest().ts != read.ts {
                    return Err(AbortReason::ReadStale);
                }
                let state = key.cc_mut();
                // In the same latch hold as the check: a writer below `commit` that
                // validates after this point sees it and aborts.
                state.latest_read = state.latest_read.max(commit);
            }
            self.validate_scans(commit)?;
        }
        Ok(commit)
    }

    fn prepare_locking(&mut self) -> Result<Timestamp, AbortReason> {
        let scheme = self.session.engine.config.timestamps;
        let store = &self.session.engine.store;
        // Every key touched is locked, so its versions cannot change: the commit timestamp
        // only has to order after them (and, under DST, after readers' tuple timestamps).
        let mut floor = 0u64;
        let mut inserts = false;
        for write in &self.writes {
            let key = store.lock(&write.entry);
            let newest = key.newest();
            floor = floor.max(newest.ts.time);
            inserts |= !newest.live;
            if scheme == TimestampScheme::Dst {
                floor = floor.max(key.cc().latest_read.time);
            }
        }
        for read in &self.reads {
            floor = floor.max(read.ts.time);
        }
        if inserts && scheme == TimestampScheme::Dst {
            floor = floor.max(self.session.engine.scan_guard.load(Ordering::SeqCst));
        }
        let time = self.session.clock.now().max(floor + 1).max(self.begin.time + 1);
        let commit = Timestamp::new(time, self.session.client);
        self.validate_scans(commit)?;
        Ok(commit)
    }

    /// Re-reads every scanned range: it must still hold exactly the live keys seen, and no
    /// other writer may hold a key in it. Keys this transaction writes are left out on both
    /// sides: its own scan saw its own value for them, whatever the store holds.
    fn validate_scans(&self, commit: Timestamp) -> Result<(), AbortReason> {
        if self.scans.is_empty() {
            return Ok(());
        }
        let own = |key: &Bytes| self.writes.iter().any(|w| S::key_of(&w.entry) == key);
        let engine = &self.session.engine;
        engine.scan_guard.fetch_max(commit.time, Ordering::SeqCst);
        for scan in &self.scans {
            let mut live = Vec::with_capacity(scan.keys.len());
            let mut conflict = false;
            let (start, end) = (scan.start.as_ref().map(|b| b.as_ref()), scan.end.as_ref().map(|b| b.as_ref()));
            engine.store.visit_range(start, end, &mut |key, entry| {
                let locked = engine.store.lock(entry);
                if locked.cc().held_by_other(self.id) {
                    conflict = true;
                    return false;
                }
                if locked.newest().live && !own(key) {
                    live.push(key.clone());
                }
                true
            });
            if conflict || !live.iter().eq(scan.keys.iter().filter(|k| !own(k))) {
                return Err(AbortReason::Phantom);
            }
        }
        Ok(())
    }

    /// Appends the commit record, installs the versions and releases every key held.
    fn log_and_install(&mut self, commit: Timestamp) -> Result<CommitInfo, AbortReason> {
        let engine = &*self.session.engine;
        let mut lsn = None;
        if !self.writes.is_empty() {
            if let Some(log) = &engine.log {
                if engine.log_failed() {
                    return Err(AbortReason::LogFailed);
                }
                let record = &mut self.session.record;
                record.clear();
                wal::encode_commit(
                    record,
                    self.id,
                    commit,
                    self.writes.iter().map(|w| (S::key_of(&w.entry).as_ref(), bytes_of(w.value.as_ref()))),
                );
                match log.append(record) {
                    Ok(n) => {
                        // Raised before the versions become visible: a reader of them is
                        // acknowledged only once this record is durable.
                        engine.installed_lsn.fetch_max(n, Ordering::AcqRel);
                        lsn = Some(n);
                    }
                    Err(_) => {
                        engine.note_log_failure();
                        return Err(AbortReason::LogFailed);
                    }
                }
            }
        }
        let watermark = engine.watermark();
        for write in &mut self.writes {
            // Installed under the key's latch: validation, which reads the newest version
            // under the same latch, sees the key either prepared or installed.
            let mut key = engine.store.lock(&write.entry);
            let version = Version { ts: commit, writer: self.id, value: write.value.take() };
            let installed = key.install(version, watermark);
            // Validation guarantees the order; a refusal is a concurrency-control bug.
            debug_assert!(installed.is_ok(), "install out of timestamp order: {installed:?}");
            key.cc_mut().prepared = None;
            write.held = false;
        }
        if lsn.is_none() && engine.log.is_some() {
            // Nothing written, but what was read must be durable before the acknowledgement.
            lsn = Some(engine.installed_lsn.load(Ordering::Acquire));
        }
        if self.mode == ReadMode::Locking {
            self.release_shared(Some(commit));
        }
        self.session.clock.observe(commit.time);
        Ok(CommitInfo { txn: self.id, ts: commit, lsn })
    }

    pub(crate) fn release_shared(&mut self, commit: Option<Timestamp>) {
        let store = &self.session.engine.store;
        for read in &mut self.reads {
            if read.locked {
                let mut key = store.lock(&read.entry);
                let state = key.cc_mut();
                state.readers -= 1;
                if let Some(commit) = commit {
                    state.latest_read = state.latest_read.max(commit);
                }
                read.locked = false;
            }
        }
    }

    /// Releases everything held, counts the abort, and marks the transaction finished. A
    /// transaction already aborted keeps its first reason.
    pub(crate) fn fail(&mut self, reason: AbortReason) -> Abort {
        if let Some(first) = self.aborted {
            return Abort { reason: first };
        }
        if !self.finished {
            self.finished = true;
            self.aborted = Some(reason);
            self.prepared = None;
            let store = &self.session.engine.store;
            for write in &mut self.writes {
                if write.held {
                    let mut key = store.lock(&write.entry);
                    let state = key.cc_mut();
                    if state.prepared.is_some_and(|p| p.owner == self.id) {
                        state.prepared = None;
                    }
                    write.held = false;
                }
            }
            self.release_shared(None);
            self.session.count_abort(reason);
        }
        Abort { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig};

    #[test]
    fn an_engine_whose_log_failed_votes_no_and_holds_nothing() {
        let (engine, _) = Engine::open(EngineConfig::default()).unwrap();
        let mut session = engine.session().unwrap();
        engine.note_log_failure();
        let mut txn = session.begin();
        txn.put(b"k", b"v".to_vec()).unwrap();
        assert_eq!(txn.prepare(), Vote::Abort(AbortReason::LogFailed));
        drop(txn);
        // Nothing was held or installed: a read-only transaction sees no version of the key.
        let mut reader = session.begin_read_only();
        assert_eq!(reader.get(b"k").unwrap(), None);
    }
}
