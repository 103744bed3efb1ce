//! One transaction: reads, buffered writes and scans under the configured concurrency
//! control and timestamp scheme. Commit (prepare, then decide) is in `commit.rs`.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId, Version};

use crate::abort::{Abort, AbortReason};
use crate::cc::{dependent_read, lock_unprepared, DefaultStore, LockedKey, Prepared, TxnStore};
use crate::config::{ConcurrencyControl, TimestampScheme};
use crate::engine::Session;

/// How this transaction reads, fixed at begin from its kind and the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// MILANA read-only: snapshot at the begin timestamp, note prepared writers at or below
    /// it, validate locally at commit.
    Snapshot,
    /// DST read-only: raise the tuple timestamp to the read timestamp, wait while any
    /// writer holds the tuple, read the newest version at or below the read timestamp.
    DependentRead,
    /// MILANA read-write: read at the begin timestamp; validation checks it is still latest.
    SnapshotForWrite,
    /// DST read-write under OCC: read the latest committed version.
    Latest,
    /// Two-phase locking: take a shared lock (no-wait), read the latest version.
    Locking,
}

pub(crate) struct ReadEntry<E> {
    pub(crate) entry: E,
    pub(crate) ts: Timestamp,
    pub(crate) writer: TxnId,
    value: Option<Bytes>,
    /// Holds a shared lock (two-phase locking).
    pub(crate) locked: bool,
}

pub(crate) struct WriteEntry<E> {
    pub(crate) entry: E,
    pub(crate) value: Option<Bytes>,
    /// Holds the key's prepared mark (OCC after prepare; 2PL from the first write).
    pub(crate) held: bool,
}

/// A session's read, write and scan sets, kept between transactions so that a transaction
/// allocates nothing for them once the session has warmed up.
pub(crate) struct TxnBuffers<E> {
    reads: Vec<ReadEntry<E>>,
    writes: Vec<WriteEntry<E>>,
    scans: Vec<ScanEntry>,
}

impl<E> Default for TxnBuffers<E> {
    fn default() -> Self {
        TxnBuffers { reads: Vec::new(), writes: Vec::new(), scans: Vec::new() }
    }
}

/// A range scan to re-check at commit: the keys it saw live, and the range it covered.
pub(crate) struct ScanEntry {
    pub(crate) start: Bound<Bytes>,
    pub(crate) end: Bound<Bytes>,
    pub(crate) keys: Vec<Bytes>,
}

/// A transaction in progress. Dropping it without committing aborts it.
pub struct Txn<'s, S: TxnStore = DefaultStore> {
    pub(crate) session: &'s mut Session<S>,
    pub(crate) id: TxnId,
    pub(crate) mode: ReadMode,
    pub(crate) read_only: bool,
    pub(crate) begin: Timestamp,
    pub(crate) reads: Vec<ReadEntry<S::Entry>>,
    pub(crate) writes: Vec<WriteEntry<S::Entry>>,
    pub(crate) scans: Vec<ScanEntry>,
    /// A read-only snapshot read saw a writer prepared at or below the snapshot.
    pub(crate) saw_prepared: bool,
    /// The commit timestamp once prepared (voted to commit), until decided.
    pub(crate) prepared: Option<Timestamp>,
    pub(crate) finished: bool,
    /// Set once aborted: every later operation reports the same abort.
    pub(crate) aborted: Option<AbortReason>,
}

impl<'s, S: TxnStore> Txn<'s, S> {
    pub(crate) fn begin(session: &'s mut Session<S>, read_only: bool) -> Txn<'s, S> {
        let config = &session.engine.config;
        let mode = match (read_only, config.timestamps, config.cc) {
            (true, TimestampScheme::Dst, _) => ReadMode::DependentRead,
            (true, _, ConcurrencyControl::Occ) => ReadMode::Snapshot,
            (false, TimestampScheme::Dst, ConcurrencyControl::Occ) => ReadMode::Latest,
            (false, _, ConcurrencyControl::Occ) => ReadMode::SnapshotForWrite,
            (_, _, ConcurrencyControl::TwoPhaseLocking) => ReadMode::Locking,
        };
        let (id, time) = session.start_txn();
        let begin = Timestamp::new(time, session.client);
        let buffers = std::mem::take(&mut session.buffers);
        Txn {
            session,
            id,
            mode,
            read_only,
            begin,
            reads: buffers.reads,
            writes: buffers.writes,
            scans: buffers.scans,
            saw_prepared: false,
            prepared: None,
            finished: false,
            aborted: None,
        }
    }

    /// This transaction's id.
    pub fn id(&self) -> TxnId {
        self.id
    }

    /// Its begin (snapshot) timestamp.
    pub fn begin_ts(&self) -> Timestamp {
        self.begin
    }

    /// Whether it was started read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Reads `key`: this transaction's own write if any, otherwise the version its
    /// concurrency control allows.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, Abort> {
        self.check_open()?;
        if let Some(write) = self.writes.iter().find(|w| S::key_of(&w.entry).as_ref() == key) {
            return Ok(write.value.clone());
        }
        if let Some(read) = self.reads.iter().find(|r| S::key_of(&r.entry).as_ref() == key) {
            return Ok(read.value.clone());
        }
        if self.mode == ReadMode::Snapshot && self.session.engine.config.history.is_none() {
            return Ok(self.snapshot_read(key));
        }
        let entry = self.session.engine.store.entry(key);
        self.read_key(entry).map_err(|reason| self.fail(reason))
    }

    /// MILANA's read-only read, done in place in the index: nothing needs the key again (a
    /// read-only transaction validates only its `saw_prepared` flag, and a repeated read
    /// returns the same version), so no reference to the key's state is taken or kept.
    fn snapshot_read(&mut self, key: &[u8]) -> Option<Bytes> {
        let (begin, id) = (self.begin, self.id);
        let engine = &*self.session.engine;
        let mut saw_prepared = false;
        let value = engine.store.with_entry(key, |entry| {
            let mut locked = lock_unprepared(&engine.store, entry, id);
            let state = locked.cc_mut();
            state.latest_read = state.latest_read.max(begin);
            saw_prepared = state.prepared.is_some_and(|p| p.ts <= begin);
            locked.read_at(begin).visible.and_then(|v| v.value)
        });
        self.saw_prepared |= saw_prepared;
        value
    }

    /// Buffers a write of `value` to `key`.
    pub fn put(&mut self, key: &[u8], value: impl Into<Bytes>) -> Result<(), Abort> {
        self.write(key, Some(value.into()))
    }

    /// Buffers a delete of `key`.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Abort> {
        self.write(key, None)
    }

    /// Up to `limit` live pairs with keys in `(start, end)`, in key order, including this
    /// transaction's own writes.
    pub fn scan(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>, Abort> {
        self.check_open()?;
        self.scan_inner(start, end, limit).map_err(|reason| self.fail(reason))
    }

    /// Aborts, releasing everything held.
    pub fn abort(mut self) {
        let _ = self.fail(AbortReason::User);
    }

    /// Fails once aborted. A read or write after a yes vote aborts the transaction: the
    /// read and write sets are what the vote was about.
    fn check_open(&mut self) -> Result<(), Abort> {
        if let Some(reason) = self.aborted {
            return Err(Abort { reason });
        }
        if self.prepared.is_some() {
            return Err(self.fail(AbortReason::User));
        }
        Ok(())
    }

    fn write(&mut self, key: &[u8], value: Option<Bytes>) -> Result<(), Abort> {
        self.check_open()?;
        if self.read_only {
            return Err(self.fail(AbortReason::WriteInReadOnly));
        }
        if let Some(write) = self.writes.iter_mut().find(|w| S::key_of(&w.entry).as_ref() == key) {
            write.value = value;
            return Ok(());
        }
        // A key read first (the usual read-modify-write) needs no second index lookup.
        let entry = match self.reads.iter().find(|r| S::key_of(&r.entry).as_ref() == key) {
            Some(read) => read.entry.clone(),
            None => self.session.engine.store.entry(key),
        };
        let held = if self.mode == ReadMode::Locking {
            if let Err(reason) = self.lock_exclusive(&entry) {
                return Err(self.fail(reason));
            }
            true
        } else {
            false
        };
        self.writes.push(WriteEntry { entry, value, held });
        Ok(())
    }

    /// Two-phase locking: the exclusive lock is the key's prepared mark, taken only when no
    /// other transaction holds a shared or exclusive lock.
    fn lock_exclusive(&mut self, entry: &S::Entry) -> Result<(), AbortReason> {
        let key = S::key_of(entry);
        let own_shared = self.reads.iter().any(|r| r.locked && S::key_of(&r.entry) == key);
        let mut locked = self.session.engine.store.lock(entry);
        let state = locked.cc_mut();
        if state.prepared.is_some() || state.readers > u32::from(own_shared) {
            return Err(AbortReason::LockConflict);
        }
        state.prepared = Some(Prepared { owner: self.id, ts: Timestamp::MAX });
        Ok(())
    }

    /// Reads one key per the transaction's mode and records the read. The store is read
    /// under the key's concurrency-control latch, so the version read and the state checked
    /// belong together.
    fn read_key(&mut self, entry: S::Entry) -> Result<Option<Bytes>, AbortReason> {
        let (begin, id) = (self.begin, self.id);
        let store = &self.session.engine.store;
        let mut locked = false;
        let version = match self.mode {
            ReadMode::Snapshot => {
                let mut key = lock_unprepared(store, &entry, id);
                let state = key.cc_mut();
                state.latest_read = state.latest_read.max(begin);
                if state.prepared.is_some_and(|p| p.ts <= begin) {
                    self.saw_prepared = true;
                }
                key.read_at(begin).visible
            }
            ReadMode::DependentRead => dependent_read(store, &entry, begin)?,
            ReadMode::SnapshotForWrite => {
                let mut key = lock_unprepared(store, &entry, id);
                let state = key.cc_mut();
                state.latest_read = state.latest_read.max(begin);
                if state.prepared.is_some_and(|p| p.owner != id && p.ts <= begin) {
                    return Err(AbortReason::ReadPrepared);
                }
                let read = key.read_at(begin);
                // A newer version already exists: validation could only fail, so stop now.
                if read.newest > read.visible.as_ref().map_or(Timestamp::ZERO, |v| v.ts) {
                    return Err(AbortReason::ReadStale);
                }
                read.visible
            }
            ReadMode::Latest => {
                let key = lock_unprepared(store, &entry, id);
                if key.cc().held_by_other(id) {
                    return Err(AbortReason::ReadPrepared);
                }
                key.read_at(Timestamp::MAX).visible
            }
            ReadMode::Locking => {
                let mut key = store.lock(&entry);
                if key.cc().held_by_other(id) {
                    return Err(AbortReason::LockConflict);
                }
                key.cc_mut().readers += 1;
                locked = true;
                key.read_at(Timestamp::MAX).visible
            }
        };
        let (ts, writer, value) = match version {
            Some(Version { ts, writer, value }) => (ts, writer, value),
            None => (Timestamp::ZERO, crate::checker::INITIAL_WRITER, None),
        };
        if self.session.engine.config.timestamps == TimestampScheme::Hlc {
            self.session.clock.observe(ts.time);
        }
        self.reads.push(ReadEntry { entry, ts, writer, value: value.clone(), locked });
        Ok(value)
    }

    fn scan_inner(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, AbortReason> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let engine = Arc::clone(&self.session.engine);
        if matches!(self.mode, ReadMode::Snapshot | ReadMode::DependentRead) {
            // Announce the snapshot before looking, so an insert validating later with a
            // timestamp at or below it aborts (or, under DST, commits above it).
            engine.scan_guard.fetch_max(self.begin.time, Ordering::SeqCst);
        }
        let mut found: Vec<(Bytes, Bytes)> = Vec::new();
        let mut failure = None;
        engine.store.visit_range(start, end, &mut |key, entry| {
            // Keys this transaction already touched answer from its own sets.
            let value = if let Some(w) = self.writes.iter().find(|w| S::key_of(&w.entry) == key) {
                w.value.clone()
            } else if let Some(r) = self.reads.iter().find(|r| S::key_of(&r.entry) == key) {
                r.value.clone()
            } else {
                match self.read_key(entry.clone()) {
                    Ok(value) => value,
                    Err(reason) => {
                        failure = Some(reason);
                        return false;
                    }
                }
            };
            if let Some(value) = value {
                found.push((key.clone(), value));
            }
            found.len() < limit
        });
        if let Some(reason) = failure {
            return Err(reason);
        }
        // Own inserts of keys the store has no entry for yet cannot exist: writes create the
        // entry. So `found` already merges own writes. Record the range for re-checking.
        if !matches!(self.mode, ReadMode::Snapshot | ReadMode::DependentRead) {
            let covered_end = if found.len() >= limit {
                found.last().map_or(Bound::Unbounded, |(k, _)| Bound::Included(k.clone()))
            } else {
                end.map(Bytes::copy_from_slice)
            };
            let keys = found
                .iter()
                .filter(|(k, _)| !self.writes.iter().any(|w| S::key_of(&w.entry) == k))
                .map(|(k, _)| k.clone())
                .collect();
            self.scans.push(ScanEntry { start: start.map(Bytes::copy_from_slice), end: covered_end, keys });
        }
        Ok(found)
    }
}

impl<S: TxnStore> Drop for Txn<'_, S> {
    fn drop(&mut self) {
        if !self.finished {
            self.fail(AbortReason::User);
        }
        // Hand the (emptied) sets back to the session for its next transaction.
        let mut buffers = TxnBuffers {
            reads: std::mem::take(&mut self.reads),
            writes: std::mem::take(&mut self.writes),
            scans: std::mem::take(&mut self.scans),
        };
        buffers.reads.clear();
        buffers.writes.clear();
        buffers.scans.clear();
        self.session.buffers = buffers;
    }
}
