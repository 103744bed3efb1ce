//! One transaction: reads, buffered writes, scans, and commit under the configured
//! concurrency control and timestamp scheme.
//!
//! Read-write transactions under OCC follow MILANA's Algorithm 1: writes are prepared (no
//! other writer may hold the key, no later reader may have read it, no later version may
//! exist), then every read is validated (still the latest version, not prepared by anyone
//! else) and the key's `latestRead` is raised to the commit timestamp in the same latch
//! hold, so a writer validating afterwards with a smaller timestamp aborts. The commit is
//! logged before its versions are installed, so the log's order is each key's commit order
//! and a durable record's dependencies are durable before it.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::MutexGuard;
use virga_storage::{KeyInner, KeyState, Prepared, Timestamp, TxnId, Version};

use crate::abort::{Abort, AbortReason};
use crate::checker::TxnRecord;
use crate::config::{ConcurrencyControl, TimestampScheme};
use crate::engine::{bytes_of, CommitInfo, Session};
use crate::wal;

/// How this transaction reads, fixed at begin from its kind and the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
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

struct ReadEntry {
    state: Arc<KeyState>,
    ts: Timestamp,
    writer: TxnId,
    value: Option<Bytes>,
    /// Holds a shared lock (two-phase locking).
    locked: bool,
}

struct WriteEntry {
    state: Arc<KeyState>,
    value: Option<Bytes>,
    /// Holds the key's prepared mark (OCC after prepare; 2PL from the first write).
    held: bool,
}

/// A session's read, write and scan sets, kept between transactions so that a transaction
/// allocates nothing for them once the session has warmed up.
#[derive(Default)]
pub(crate) struct TxnBuffers {
    reads: Vec<ReadEntry>,
    writes: Vec<WriteEntry>,
    scans: Vec<ScanEntry>,
}

/// A range scan to re-check at commit: the keys it saw live, and the range it covered.
struct ScanEntry {
    start: Bound<Bytes>,
    end: Bound<Bytes>,
    keys: Vec<Bytes>,
}

/// A transaction in progress. Dropping it without committing aborts it.
pub struct Txn<'s> {
    session: &'s mut Session,
    id: TxnId,
    mode: ReadMode,
    read_only: bool,
    begin: Timestamp,
    reads: Vec<ReadEntry>,
    writes: Vec<WriteEntry>,
    scans: Vec<ScanEntry>,
    /// A read-only snapshot read saw a writer prepared at or below the snapshot.
    saw_prepared: bool,
    finished: bool,
    /// Set once aborted: every later operation reports the same abort.
    aborted: Option<AbortReason>,
}

impl<'s> Txn<'s> {
    pub(crate) fn begin(session: &'s mut Session, read_only: bool) -> Txn<'s> {
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
        self.check_live()?;
        if let Some(write) = self.writes.iter().find(|w| w.state.key().as_ref() == key) {
            return Ok(write.value.clone());
        }
        if let Some(read) = self.reads.iter().find(|r| r.state.key().as_ref() == key) {
            return Ok(read.value.clone());
        }
        if self.mode == ReadMode::Snapshot && self.session.engine.config.history.is_none() {
            return Ok(self.snapshot_read(key));
        }
        let state = self.session.engine.store.key_or_insert(key);
        self.read_state(state).map_err(|reason| self.fail(reason))
    }

    /// MILANA's read-only read, done in place in the index: nothing needs the key again (a
    /// read-only transaction validates only its `saw_prepared` flag, and a repeated read
    /// returns the same version), so no reference to the key's state is taken or kept.
    fn snapshot_read(&mut self, key: &[u8]) -> Option<Bytes> {
        let (begin, id) = (self.begin, self.id);
        let mut saw_prepared = false;
        let engine = Arc::clone(&self.session.engine);
        let value = engine.store.with_key(key, |state| {
            let mut inner = lock_unprepared(state, id);
            inner.latest_read = inner.latest_read.max(begin);
            saw_prepared = inner.prepared.is_some_and(|p| p.ts <= begin);
            inner.visible_at(begin).and_then(|v| v.value.clone())
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
        self.check_live()?;
        self.scan_inner(start, end, limit).map_err(|reason| self.fail(reason))
    }

    /// Aborts, releasing everything held.
    pub fn abort(mut self) {
        let _ = self.fail(AbortReason::User);
    }

    /// Validates and commits. On `Err` nothing of the transaction remains.
    pub fn commit(mut self) -> Result<CommitInfo, Abort> {
        self.check_live()?;
        let result = if self.read_only {
            self.commit_read_only()
        } else if self.session.engine.config.cc == ConcurrencyControl::TwoPhaseLocking {
            self.commit_locking()
        } else {
            self.commit_optimistic()
        };
        match result {
            Ok(info) => {
                self.finished = true;
                self.session.count_commit();
                let (reads, writes) = (&self.reads, &self.writes);
                self.session.record_history(|| TxnRecord {
                    id: info.txn,
                    commit_ts: info.ts,
                    reads: reads.iter().map(|r| (r.state.key().clone(), r.writer)).collect(),
                    writes: writes.iter().map(|w| w.state.key().clone()).collect(),
                });
                Ok(info)
            }
            Err(reason) => Err(self.fail(reason)),
        }
    }

    fn check_live(&self) -> Result<(), Abort> {
        match self.aborted {
            Some(reason) => Err(Abort { reason }),
            None => Ok(()),
        }
    }

    fn write(&mut self, key: &[u8], value: Option<Bytes>) -> Result<(), Abort> {
        self.check_live()?;
        if self.read_only {
            return Err(self.fail(AbortReason::WriteInReadOnly));
        }
        if let Some(write) = self.writes.iter_mut().find(|w| w.state.key().as_ref() == key) {
            write.value = value;
            return Ok(());
        }
        // A key read first (the usual read-modify-write) needs no second index lookup.
        let state = match self.reads.iter().find(|r| r.state.key().as_ref() == key) {
            Some(read) => Arc::clone(&read.state),
            None => self.session.engine.store.key_or_insert(key),
        };
        let held = if self.mode == ReadMode::Locking {
            if let Err(reason) = self.lock_exclusive(&state) {
                return Err(self.fail(reason));
            }
            true
        } else {
            false
        };
        self.writes.push(WriteEntry { state, value, held });
        Ok(())
    }

    /// Two-phase locking: the exclusive lock is the key's prepared mark, taken only when no
    /// other transaction holds a shared or exclusive lock.
    fn lock_exclusive(&mut self, state: &Arc<KeyState>) -> Result<(), AbortReason> {
        let own_shared = self.reads.iter().any(|r| r.locked && Arc::ptr_eq(&r.state, state));
        let mut inner = state.lock();
        if inner.prepared.is_some() || inner.readers > u32::from(own_shared) {
            return Err(AbortReason::LockConflict);
        }
        inner.prepared = Some(Prepared { owner: self.id, ts: Timestamp::MAX });
        Ok(())
    }

    /// Reads one key per the transaction's mode and records the read.
    fn read_state(&mut self, state: Arc<KeyState>) -> Result<Option<Bytes>, AbortReason> {
        let begin = self.begin;
        let mut locked = false;
        let version = match self.mode {
            ReadMode::Snapshot => {
                let mut inner = lock_unprepared(&state, self.id);
                inner.latest_read = inner.latest_read.max(begin);
                if inner.prepared.is_some_and(|p| p.ts <= begin) {
                    self.saw_prepared = true;
                }
                inner.visible_at(begin).cloned()
            }
            ReadMode::DependentRead => dependent_read(&state, begin)?,
            ReadMode::SnapshotForWrite => {
                let mut inner = lock_unprepared(&state, self.id);
                inner.latest_read = inner.latest_read.max(begin);
                if inner.prepared.is_some_and(|p| p.owner != self.id && p.ts <= begin) {
                    return Err(AbortReason::ReadPrepared);
                }
                let visible = inner.visible_at(begin).cloned();
                // A newer version already exists: validation could only fail, so stop now.
                if inner.latest_ts() > visible.as_ref().map_or(Timestamp::ZERO, |v| v.ts) {
                    return Err(AbortReason::ReadStale);
                }
                visible
            }
            ReadMode::Latest => {
                let inner = lock_unprepared(&state, self.id);
                if inner.prepared.is_some_and(|p| p.owner != self.id) {
                    return Err(AbortReason::ReadPrepared);
                }
                inner.latest().cloned()
            }
            ReadMode::Locking => {
                let mut inner = state.lock();
                if inner.prepared.is_some_and(|p| p.owner != self.id) {
                    return Err(AbortReason::LockConflict);
                }
                inner.readers += 1;
                locked = true;
                inner.latest().cloned()
            }
        };
        let (ts, writer, value) = match version {
            Some(Version { ts, writer, value }) => (ts, writer, value),
            None => (Timestamp::ZERO, crate::checker::INITIAL_WRITER, None),
        };
        if self.session.engine.config.timestamps == TimestampScheme::Hlc {
            self.session.clock.observe(ts.time);
        }
        self.reads.push(ReadEntry { state, ts, writer, value: value.clone(), locked });
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
        engine.store.for_each_in(start, end, |state| {
            let key = state.key().clone();
            // Keys this transaction already touched answer from its own sets.
            let value = if let Some(w) = self.writes.iter().find(|w| w.state.key() == &key) {
                w.value.clone()
            } else if let Some(r) = self.reads.iter().find(|r| r.state.key() == &key) {
                r.value.clone()
            } else {
                match self.read_state(Arc::clone(state)) {
                    Ok(value) => value,
                    Err(reason) => {
                        failure = Some(reason);
                        return false;
                    }
                }
            };
            if let Some(value) = value {
                found.push((key, value));
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
                .filter(|(k, _)| !self.writes.iter().any(|w| w.state.key() == k))
                .map(|(k, _)| k.clone())
                .collect();
            self.scans.push(ScanEntry { start: start.map(Bytes::copy_from_slice), end: covered_end, keys });
        }
        Ok(found)
    }

    fn commit_read_only(&mut self) -> Result<CommitInfo, AbortReason> {
        if self.mode == ReadMode::Snapshot && self.saw_prepared {
            return Err(AbortReason::SnapshotPrepared);
        }
        if self.mode == ReadMode::Locking {
            self.validate_scans(Timestamp::ZERO)?;
            self.release_shared(None);
        }
        if self.mode == ReadMode::DependentRead {
            // LocalTS <- max(LocalTS, read timestamp): later transactions of this client
            // never read an older state than this one did.
            self.session.clock.observe(self.begin.time);
        }
        let engine = &self.session.engine;
        let lsn = engine.log.as_ref().map(|_| engine.installed_lsn.load(Ordering::Acquire));
        Ok(CommitInfo { txn: self.id, ts: self.begin, lsn })
    }

    fn commit_optimistic(&mut self) -> Result<CommitInfo, AbortReason> {
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
        let mut tuple_time = 0u64;
        let mut inserts = false;
        for i in 0..self.writes.len() {
            let state = Arc::clone(&self.writes[i].state);
            let mut inner = state.lock();
            if inner.prepared.is_some_and(|p| p.owner != self.id) {
                return Err(AbortReason::WritePrepared);
            }
            if scheme != TimestampScheme::Dst {
                if inner.latest_read >= commit {
                    return Err(AbortReason::WriteAfterRead);
                }
                if inner.latest_ts() >= commit {
                    return Err(AbortReason::WriteStale);
                }
            }
            tuple_time = tuple_time.max(inner.latest_read.time).max(inner.latest_ts().time);
            inserts |= inner.is_absent();
            inner.prepared = Some(Prepared { owner: self.id, ts: commit });
            self.writes[i].held = true;
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
            for read in &self.reads {
                let mut inner = read.state.lock();
                if inner.prepared.is_some_and(|p| p.owner != self.id) {
                    return Err(AbortReason::ReadPrepared);
                }
                if inner.latest_ts() != read.ts {
                    return Err(AbortReason::ReadStale);
                }
                // In the same latch hold as the check: a writer below `commit` that
                // validates after this point sees it and aborts.
                inner.latest_read = inner.latest_read.max(commit);
            }
            self.validate_scans(commit)?;
        }
        self.log_and_install(commit)
    }

    fn commit_locking(&mut self) -> Result<CommitInfo, AbortReason> {
        let scheme = self.session.engine.config.timestamps;
        // Every key touched is locked, so its versions cannot change: the commit timestamp
        // only has to order after them (and, under DST, after readers' tuple timestamps).
        let mut floor = 0u64;
        let mut inserts = false;
        for write in &self.writes {
            let inner = write.state.lock();
            floor = floor.max(inner.latest_ts().time);
            inserts |= inner.is_absent();
            if scheme == TimestampScheme::Dst {
                floor = floor.max(inner.latest_read.time);
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
        let info = self.log_and_install(commit)?;
        self.release_shared(Some(commit));
        Ok(info)
    }

    /// Re-reads every scanned range: it must still hold exactly the live keys seen, and no
    /// other writer may hold a key in it. Keys this transaction writes are left out on both
    /// sides: its own scan saw its own value for them, whatever the store holds.
    fn validate_scans(&self, commit: Timestamp) -> Result<(), AbortReason> {
        if self.scans.is_empty() {
            return Ok(());
        }
        let own = |key: &Bytes| self.writes.iter().any(|w| w.state.key() == key);
        let engine = &self.session.engine;
        engine.scan_guard.fetch_max(commit.time, Ordering::SeqCst);
        for scan in &self.scans {
            let mut live = Vec::with_capacity(scan.keys.len());
            let mut conflict = false;
            engine.store.for_each_in(
                scan.start.as_ref().map(|b| b.as_ref()),
                scan.end.as_ref().map(|b| b.as_ref()),
                |s| {
                    let inner = s.lock();
                    if inner.prepared.is_some_and(|p| p.owner != self.id) {
                        conflict = true;
                        return false;
                    }
                    if !inner.is_absent() && !own(s.key()) {
                        live.push(s.key().clone());
                    }
                    true
                },
            );
            if conflict || !live.iter().eq(scan.keys.iter().filter(|k| !own(k))) {
                return Err(AbortReason::Phantom);
            }
        }
        Ok(())
    }

    /// Appends the commit record, installs the versions and releases the prepared marks.
    fn log_and_install(&mut self, commit: Timestamp) -> Result<CommitInfo, AbortReason> {
        let engine = Arc::clone(&self.session.engine);
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
                    self.writes.iter().map(|w| (w.state.key().as_ref(), bytes_of(w.value.as_ref()))),
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
        let watermark = self.session.watermark();
        let mut dropped = 0;
        for write in &mut self.writes {
            let mut inner = write.state.lock();
            let version = Version { ts: commit, writer: self.id, value: write.value.take() };
            // Validation guarantees the order; a refusal would be a concurrency-control bug,
            // and keeping the newer version is the only safe outcome.
            if let Ok(n) = inner.install(version, watermark) {
                dropped += n;
            }
            debug_assert!(inner.latest().is_some_and(|v| v.writer == self.id), "install out of timestamp order");
            inner.prepared = None;
            write.held = false;
        }
        engine.store.note_dropped(dropped as u64);
        if lsn.is_none() && engine.log.is_some() {
            // Nothing written, but what was read must be durable before the acknowledgement.
            lsn = Some(engine.installed_lsn.load(Ordering::Acquire));
        }
        self.session.clock.observe(commit.time);
        Ok(CommitInfo { txn: self.id, ts: commit, lsn })
    }

    fn release_shared(&mut self, commit: Option<Timestamp>) {
        for read in &mut self.reads {
            if read.locked {
                let mut inner = read.state.lock();
                inner.readers -= 1;
                if let Some(commit) = commit {
                    inner.latest_read = inner.latest_read.max(commit);
                }
                read.locked = false;
            }
        }
    }

    /// Releases everything held, counts the abort, and marks the transaction finished.
    fn fail(&mut self, reason: AbortReason) -> Abort {
        if !self.finished {
            self.finished = true;
            self.aborted = Some(reason);
            for write in &mut self.writes {
                if write.held {
                    let mut inner = write.state.lock();
                    if inner.prepared.is_some_and(|p| p.owner == self.id) {
                        inner.prepared = None;
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

impl Drop for Txn<'_> {
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

/// How long an optimistic reader waits for a prepared writer to install before giving up
/// (and aborting or flagging, as its mode says).
const PREPARED_WAIT: Duration = Duration::from_micros(50);

/// The longest a DST read-only reader waits for one held tuple.
const DEPENDENT_READ_WAIT: Duration = Duration::from_secs(1);

/// Takes the key's latch once no other transaction holds the key, or after
/// [`PREPARED_WAIT`]. A prepared writer under OCC is inside its commit (log append and
/// install), so waiting briefly is cheaper than an abort and a retry; the reader holds no
/// key itself while it waits, so no wait cycle can form.
fn lock_unprepared(state: &KeyState, me: TxnId) -> MutexGuard<'_, KeyInner> {
    let held = |inner: &KeyInner| inner.prepared.is_some_and(|p| p.owner != me);
    let inner = state.lock();
    if !held(&inner) {
        return inner;
    }
    drop(inner);
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        spins += 1;
        let inner = state.lock();
        if !held(&inner) || started.elapsed() >= PREPARED_WAIT {
            return inner;
        }
    }
}

/// DST's `DEP_READ`, waiting whenever the tuple is held (not only when its timestamp is at
/// or below the reader's, as printed): the printed rule lets a reader skip a writer whose
/// commit timestamp will still be below the read timestamp.
///
/// Under OCC a holder is inside its commit and lets go within microseconds; under 2PL it
/// holds the key for its whole transaction, so the wait is bounded by [`DEPENDENT_READ_WAIT`]
/// (then the reader aborts with `read-prepared` rather than hang on a stalled writer).
fn dependent_read(state: &KeyState, read_ts: Timestamp) -> Result<Option<Version>, AbortReason> {
    let mut spins = 0u32;
    let started = Instant::now();
    loop {
        {
            let mut inner = state.lock();
            inner.latest_read = inner.latest_read.max(read_ts);
            if inner.prepared.is_none() {
                return Ok(inner.visible_at(read_ts).cloned());
            }
        }
        if started.elapsed() >= DEPENDENT_READ_WAIT {
            return Err(AbortReason::ReadPrepared);
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
