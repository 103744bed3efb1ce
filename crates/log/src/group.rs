//! Group commit on top of [`RecordLog`].
//!
//! Many threads append one record per committed transaction; a commit may be acknowledged
//! only once its record is durable, but an fsync per transaction would cap throughput at the
//! disk's flush rate. [`GroupLog`] decouples the two: appending only copies the record into a
//! shared staging buffer and assigns its LSN, and a background flusher repeatedly writes
//! everything staged so far and covers it with a single fsync. Callers that need durability
//! wait for the durable LSN to pass theirs.
//!
//! The records go through [`RecordLog::append`] in LSN order, so segments, on-disk format
//! and recovery are exactly the record log's.
//!
//! Invariant: an LSN is reported durable ([`GroupLog::durable_lsn`], [`GroupLog::wait_durable`],
//! [`GroupLog::sync`]) only after the fsync that covers its record returned successfully
//! (except in [`SyncMode::None`], where durability is switched off by request). After any
//! failed write or fsync nothing more is reported durable and every later call fails.
//!
//! Locks, always taken in this order: `writer` (the record log; held while writing and
//! fsyncing), then `staging` (held only to copy a record in or to swap the buffer out), then
//! `waiters`. Appenders in [`SyncMode::Group`] and [`SyncMode::None`] take only `staging`,
//! so they never wait for a disk flush unless the staging buffer is full.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use virga_core::device::IntoStorage;

use crate::{
    LogError, LogOptions, OpenMode, RecordLocation, RecordLog, Recovered, SyncPolicy, DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_SEGMENT_BYTES, DEFAULT_WRITE_BUFFER_BYTES,
};

/// Default for [`GroupLogOptions::max_staged_bytes`]: 64 MiB.
pub const DEFAULT_MAX_STAGED_BYTES: usize = 64 << 20;

/// When records appended to a [`GroupLog`] become durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// No fsync: the background flusher hands records to the operating system, and a record
    /// counts as durable as soon as it is appended, so nothing ever waits. A machine crash
    /// can lose acknowledged records; [`GroupLog::sync`] still forces an fsync on request.
    None,
    /// Group commit: the background flusher writes everything appended so far and fsyncs
    /// once for all of it, then publishes the new durable LSN.
    #[default]
    Group,
    /// Every append writes and fsyncs its own record before returning; appends from several
    /// threads are serialised. The baseline group commit is measured against.
    Every,
}

impl SyncMode {
    /// Every mode, from the least to the most durable per append.
    pub const ALL: [SyncMode; 3] = [SyncMode::None, SyncMode::Group, SyncMode::Every];

    /// The mode's name as accepted by [`FromStr`]: `none`, `group` or `every`.
    pub fn name(self) -> &'static str {
        match self {
            SyncMode::None => "none",
            SyncMode::Group => "group",
            SyncMode::Every => "every",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SyncMode {
    type Err = ParseSyncModeError;

    /// Parses `none`, `group` or `every`, ignoring ASCII case.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        SyncMode::ALL
            .into_iter()
            .find(|mode| mode.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| ParseSyncModeError { input: text.to_string() })
    }
}

/// A string that names no [`SyncMode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown log sync mode {input:?}: expected one of \"none\", \"group\", \"every\"")]
pub struct ParseSyncModeError {
    /// The rejected text.
    pub input: String,
}

/// Tuning knobs of a [`GroupLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLogOptions {
    /// When records become durable.
    pub sync: SyncMode,
    /// As [`LogOptions::segment_bytes`].
    pub segment_bytes: u64,
    /// As [`LogOptions::max_record_bytes`]: larger appends are refused.
    pub max_record_bytes: u32,
    /// As [`LogOptions::write_buffer_bytes`]: the record log writes a large batch to the
    /// operating system in pieces of about this size.
    pub write_buffer_bytes: usize,
    /// In [`SyncMode::Group`], how long the flusher waits after noticing new records before
    /// taking them, to let more arrive and share the fsync. Zero (the default) flushes at
    /// once; batching then comes from records that arrive while the previous fsync runs.
    pub group_delay: Duration,
    /// Appends block while this many bytes are staged and not yet taken by the flusher, so
    /// that a disk slower than the appenders cannot make memory grow without bound.
    pub max_staged_bytes: usize,
}

impl Default for GroupLogOptions {
    fn default() -> Self {
        GroupLogOptions {
            sync: SyncMode::default(),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            write_buffer_bytes: DEFAULT_WRITE_BUFFER_BYTES,
            group_delay: Duration::ZERO,
            max_staged_bytes: DEFAULT_MAX_STAGED_BYTES,
        }
    }
}

impl GroupLogOptions {
    /// Options for opening the same directory as a plain [`RecordLog`]. The group log syncs
    /// explicitly, so the record log itself never does on append.
    pub fn log_options(&self) -> LogOptions {
        LogOptions {
            segment_bytes: self.segment_bytes,
            max_record_bytes: self.max_record_bytes,
            sync: SyncPolicy::None,
            write_buffer_bytes: self.write_buffer_bytes,
        }
    }
}

/// Counters of a [`GroupLog`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupLogStats {
    /// Records appended.
    pub appended: u64,
    /// Records written to the operating system (and, except in [`SyncMode::None`], fsynced).
    pub flushed: u64,
    /// Fsyncs that made appended records durable. The fsyncs the record log adds on its own
    /// when it starts a new segment are not counted.
    pub fsyncs: u64,
    /// Write rounds that carried at least one record.
    pub batches: u64,
    /// Most records written in one round.
    pub largest_batch: u64,
}

impl GroupLogStats {
    /// Records made durable per fsync (0 when there was no fsync).
    pub fn records_per_fsync(&self) -> f64 {
        if self.fsyncs == 0 {
            0.0
        } else {
            self.flushed as f64 / self.fsyncs as f64
        }
    }
}

/// The bytes of one record being encoded by [`GroupLog::append_with`].
///
/// It only exposes the record's own bytes, so an encoder cannot disturb records that other
/// threads staged before it. If the encoder panics, the partial record is removed.
pub struct RecordBuf<'a> {
    bytes: &'a mut Vec<u8>,
    start: usize,
    keep: bool,
}

impl<'a> RecordBuf<'a> {
    fn new(bytes: &'a mut Vec<u8>) -> Self {
        let start = bytes.len();
        RecordBuf { bytes, start, keep: false }
    }

    /// Length of the record so far.
    pub fn len(&self) -> usize {
        self.bytes.len() - self.start
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `data` to the record.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
    }

    /// Appends one byte to the record.
    pub fn push(&mut self, byte: u8) {
        self.bytes.push(byte);
    }

    /// Reserves room for at least `additional` more bytes.
    pub fn reserve(&mut self, additional: usize) {
        self.bytes.reserve(additional);
    }

    /// Shortens the record to `len` bytes; no effect if it is not longer.
    pub fn truncate(&mut self, len: usize) {
        self.bytes.truncate(self.start.saturating_add(len));
    }

    /// The record's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    /// The record's bytes, writable in place (e.g. to fill in a length written as a
    /// placeholder).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..]
    }

    /// Accepts the record; returns its length.
    fn finish(mut self) -> usize {
        self.keep = true;
        self.len()
    }
}

impl io::Write for RecordBuf<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.extend_from_slice(data);
        Ok(data.len())
    }

    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RecordBuf<'_> {
    fn drop(&mut self) {
        if !self.keep {
            self.bytes.truncate(self.start);
        }
    }
}

/// A record log shared by many appending threads, with group commit.
///
/// Appending copies the record into a staging buffer and assigns its LSN; in
/// [`SyncMode::Group`] a background flusher writes everything staged and covers it with one
/// fsync, then raises [`durable_lsn`](GroupLog::durable_lsn) and wakes the threads in
/// [`wait_durable`](GroupLog::wait_durable). A record is reported durable only after the
/// fsync that covers it returned successfully (in [`SyncMode::None`] durability is off and
/// records count as durable once appended). After a failed write or fsync nothing more is
/// reported durable and every call fails with [`LogError::Poisoned`].
///
/// ```
/// use std::sync::Arc;
/// use virga_log::{GroupLog, GroupLogOptions};
///
/// let dir = tempfile::tempdir()?;
/// let (log, _recovered) = GroupLog::open(dir.path(), GroupLogOptions::default())?;
/// let log = Arc::new(log);
/// let committers: Vec<_> = (0..4u8)
///     .map(|t| {
///         let log = Arc::clone(&log);
///         std::thread::spawn(move || -> Result<u64, virga_log::LogError> {
///             let lsn = log.append(&[t; 32])?;
///             log.wait_durable(lsn)?; // only now may the transaction be acknowledged
///             Ok(lsn)
///         })
///     })
///     .collect();
/// for committer in committers {
///     assert!(committer.join().unwrap()? <= log.durable_lsn());
/// }
/// println!("{:.1} records per fsync", log.stats().records_per_fsync());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `GroupLog` is `Send + Sync`; share it with `Arc<GroupLog>`. Every method takes `&self`
/// except [`close`](GroupLog::close). Dropping it stops the flusher after it has written what
/// was staged (and fsynced it, in [`SyncMode::Group`]); [`close`](GroupLog::close) also
/// reports errors and makes everything durable in every mode.
pub struct GroupLog {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

struct Shared {
    dir: PathBuf,
    /// Opened with [`OpenMode::ReadOnly`]: appends are refused.
    read_only: bool,
    mode: SyncMode,
    max_record_bytes: u32,
    group_delay: Duration,
    max_staged_bytes: usize,
    /// Last LSN in the log when it was opened; appended counts start after it.
    opened_last_lsn: u64,
    writer: Mutex<Writer>,
    staging: Mutex<Staging>,
    /// The flusher sleeps here (with `staging`) while nothing is staged.
    work: Condvar,
    /// Appenders sleep here (with `staging`) while the staging buffer is full.
    space: Condvar,
    /// Number of threads blocked in `wait_durable`.
    waiters: Mutex<usize>,
    /// Those threads sleep here (with `waiters`).
    durable_changed: Condvar,
    /// Highest LSN assigned to an append (0 if none).
    last_lsn: AtomicU64,
    /// Highest LSN reported durable (0 if none).
    durable_lsn: AtomicU64,
    /// Why the log became unusable; set once, by the first failure.
    failure: OnceLock<String>,
    fsyncs: AtomicU64,
    flushed: AtomicU64,
    batches: AtomicU64,
    largest_batch: AtomicU64,
}

/// State behind the `writer` lock: whoever holds it writes to the log.
struct Writer {
    log: RecordLog,
    /// An empty batch to swap in for the staged one, so that buffers are reused.
    spare: Batch,
}

/// Staged records: their payloads back to back, and each payload's length.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lens: Vec<u32>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.lens.clear();
    }
}

struct Staging {
    batch: Batch,
    /// LSN of the first record in `batch`.
    first_lsn: u64,
    /// LSN the next append gets.
    next_lsn: u64,
    /// The flusher is waiting on `work` and must be woken for new records.
    flusher_idle: bool,
    /// Number of appenders waiting on `space`.
    space_waiters: usize,
    /// Set by drop / close: the flusher drains what is staged and exits.
    shutdown: bool,
}

impl fmt::Debug for GroupLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.shared;
        f.debug_struct("GroupLog")
            .field("dir", &shared.dir)
            .field("mode", &shared.mode)
            .field("last_lsn", &shared.last_lsn.load(Ordering::Relaxed))
            .field("durable_lsn", &shared.durable_lsn.load(Ordering::Relaxed))
            .field("failure", &shared.failure.get())
            .finish()
    }
}

impl GroupLog {
    /// Opens (creating if needed) the log at `at` (a directory or a storage) as
    /// [`RecordLog::open`] does, refusing a torn tail, and starts the background flusher
    /// (except in [`SyncMode::Every`], which needs none).
    pub fn open(at: impl IntoStorage, options: GroupLogOptions) -> Result<(GroupLog, Recovered), LogError> {
        GroupLog::open_with(at, options, OpenMode::Strict, |_, _| {})
    }

    /// As [`open`](GroupLog::open), cutting a torn tail first (as [`RecordLog::recover`]):
    /// what a process restarting after a crash wants.
    pub fn recover(at: impl IntoStorage, options: GroupLogOptions) -> Result<(GroupLog, Recovered), LogError> {
        GroupLog::open_with(at, options, OpenMode::Repair, |_, _| {})
    }

    /// Opens the log as [`RecordLog::open_with`] does (showing each record's payload to
    /// `visit` while indexing) and starts the flusher. Every indexed record is durable, so
    /// [`durable_lsn`](GroupLog::durable_lsn) starts at the last one. A log opened in
    /// [`OpenMode::ReadOnly`] refuses appends.
    pub fn open_with(
        at: impl IntoStorage,
        options: GroupLogOptions,
        mode: OpenMode,
        visit: impl FnMut(u64, &[u8]),
    ) -> Result<(GroupLog, Recovered), LogError> {
        let (log, recovered) = RecordLog::open_with(at, options.log_options(), mode, visit)?;
        let dir = log.dir().to_path_buf();
        let next_lsn = log.next_lsn();
        let last_lsn = next_lsn.saturating_sub(1);
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            read_only: mode == OpenMode::ReadOnly,
            mode: options.sync,
            max_record_bytes: options.max_record_bytes,
            group_delay: options.group_delay,
            max_staged_bytes: options.max_staged_bytes,
            opened_last_lsn: last_lsn,
            writer: Mutex::new(Writer { log, spare: Batch::default() }),
            staging: Mutex::new(Staging {
                batch: Batch::default(),
                first_lsn: next_lsn,
                next_lsn,
                flusher_idle: false,
                space_waiters: 0,
                shutdown: false,
            }),
            work: Condvar::new(),
            space: Condvar::new(),
            waiters: Mutex::new(0),
            durable_changed: Condvar::new(),
            last_lsn: AtomicU64::new(last_lsn),
            durable_lsn: AtomicU64::new(last_lsn),
            failure: OnceLock::new(),
            fsyncs: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
        });
        let flusher = match options.sync {
            SyncMode::Every => None,
            SyncMode::None | SyncMode::Group => {
                let for_thread = Arc::clone(&shared);
                let handle = thread::Builder::new()
                    .name("virga-log-flusher".to_string())
                    .spawn(move || run_flusher(&for_thread))
                    .map_err(|source| LogError::Io { op: "start the flusher thread for", path: dir, source })?;
                Some(handle)
            }
        };
        Ok((GroupLog { shared, flusher }, recovered))
    }

    /// Appends a record and returns its LSN. LSNs are assigned in append order, contiguous,
    /// and equal to the LSNs the records carry on disk.
    ///
    /// In [`SyncMode::Group`] this only copies the payload into the staging buffer; call
    /// [`wait_durable`](GroupLog::wait_durable) before acknowledging the transaction. In
    /// [`SyncMode::Every`] the record is durable when this returns.
    pub fn append(&self, payload: &[u8]) -> Result<u64, LogError> {
        self.shared.check_len(payload.len())?;
        match self.shared.mode {
            SyncMode::Every => self.shared.append_every(payload),
            SyncMode::None | SyncMode::Group => {
                self.shared.stage(payload.len(), |record| record.extend_from_slice(payload))
            }
        }
    }

    /// Appends a record that `encode` writes in place, saving the copy of an encoded buffer.
    /// `len_hint` is the expected length, reserved up front.
    ///
    /// In [`SyncMode::Group`] and [`SyncMode::None`], `encode` runs while the staging lock is
    /// held: keep it short, and never call back into this log from it (that would deadlock). A record longer than
    /// [`GroupLogOptions::max_record_bytes`] is discarded and refused with
    /// [`LogError::RecordTooLarge`]; if `encode` panics, nothing is appended.
    pub fn append_with<F>(&self, len_hint: usize, encode: F) -> Result<u64, LogError>
    where
        F: FnOnce(&mut RecordBuf<'_>),
    {
        match self.shared.mode {
            SyncMode::Every => {
                let mut bytes = Vec::with_capacity(len_hint);
                let mut record = RecordBuf::new(&mut bytes);
                encode(&mut record);
                record.finish();
                self.shared.check_len(bytes.len())?;
                self.shared.append_every(&bytes)
            }
            SyncMode::None | SyncMode::Group => self.shared.stage(len_hint, encode),
        }
    }

    /// Appends a record and waits until it is durable; returns its LSN.
    pub fn append_durable(&self, payload: &[u8]) -> Result<u64, LogError> {
        let lsn = self.append(payload)?;
        self.wait_durable(lsn)?;
        Ok(lsn)
    }

    /// Highest LSN that is durable (per the mode); every record at or below it is. Does not
    /// block.
    pub fn durable_lsn(&self) -> u64 {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// Highest LSN assigned so far (0 if the log never held a record).
    pub fn last_lsn(&self) -> u64 {
        self.shared.last_lsn.load(Ordering::Acquire)
    }

    /// Blocks until the record with LSN `lsn` (and every earlier one) is durable.
    ///
    /// Fails with [`LogError::Poisoned`] if the log failed before that happened: the record
    /// may or may not be on disk, and must not be acknowledged. Asking for an LSN that has
    /// not been appended yet is an error, as nothing would ever make it durable.
    pub fn wait_durable(&self, lsn: u64) -> Result<(), LogError> {
        let shared = &*self.shared;
        if shared.durable_lsn.load(Ordering::Acquire) >= lsn {
            return Ok(());
        }
        let last = shared.last_lsn.load(Ordering::Acquire);
        if lsn > last {
            let message = format!("LSN {lsn} has not been appended (the last appended LSN is {last})");
            return Err(LogError::Io {
                op: "wait for durability in",
                path: shared.dir.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, message),
            });
        }
        let mut waiting = shared.lock_waiters();
        loop {
            // Checked under the lock that publishers take after raising the durable LSN or
            // recording a failure, so a wake-up cannot slip in between check and wait.
            if shared.durable_lsn.load(Ordering::Acquire) >= lsn {
                return Ok(());
            }
            shared.check_failed()?;
            *waiting += 1;
            waiting = shared.durable_changed.wait(waiting).unwrap_or_else(PoisonError::into_inner);
            *waiting -= 1;
        }
    }

    /// Makes every record appended so far durable now, in any mode (also in
    /// [`SyncMode::None`]), and returns the highest durable LSN.
    pub fn sync(&self) -> Result<u64, LogError> {
        self.shared.flush_staged(true)
    }

    /// Deletes whole segments all of whose records have LSNs below `before_lsn`, as
    /// [`RecordLog::truncate_prefix`]; returns how many were deleted. Records at or above
    /// `before_lsn`, including staged ones, are kept.
    pub fn truncate_prefix(&self, before_lsn: u64) -> Result<usize, LogError> {
        let mut writer = self.shared.lock_writer()?;
        writer.log.truncate_prefix(before_lsn)
    }

    /// The payload of record `lsn`, as [`RecordLog::read`]. Records still staged (appended
    /// but not yet handed to the record log by the flusher or [`sync`](GroupLog::sync)) are
    /// not readable yet: [`LogError::NoSuchRecord`].
    pub fn read(&self, lsn: u64) -> Result<Vec<u8>, LogError> {
        self.shared.lock_writer()?.log.read(lsn)
    }

    /// The first `len` bytes of record `lsn`'s payload, as [`RecordLog::read_prefix`].
    pub fn read_prefix(&self, lsn: u64, len: usize) -> Result<Vec<u8>, LogError> {
        self.shared.lock_writer()?.log.read_prefix(lsn, len)
    }

    /// Where record `lsn` lies, as [`RecordLog::location`].
    pub fn location(&self, lsn: u64) -> Result<Option<RecordLocation>, LogError> {
        Ok(self.shared.lock_writer()?.log.location(lsn))
    }

    /// Lowest LSN the log still holds.
    pub fn first_lsn(&self) -> Result<u64, LogError> {
        Ok(self.shared.lock_writer()?.log.first_lsn())
    }

    /// Counters since the log was opened.
    pub fn stats(&self) -> GroupLogStats {
        let shared = &*self.shared;
        GroupLogStats {
            appended: shared.last_lsn.load(Ordering::Acquire) - shared.opened_last_lsn,
            flushed: shared.flushed.load(Ordering::Relaxed),
            fsyncs: shared.fsyncs.load(Ordering::Relaxed),
            batches: shared.batches.load(Ordering::Relaxed),
            largest_batch: shared.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// The mode the log was opened with.
    pub fn mode(&self) -> SyncMode {
        self.shared.mode
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Makes everything durable, stops the flusher and closes the log; returns the highest
    /// durable LSN. Unlike drop, this reports a failure.
    pub fn close(mut self) -> Result<u64, LogError> {
        let synced = self.sync();
        let stopped = self.stop_flusher();
        let durable = synced?;
        stopped?;
        Ok(durable)
    }

    fn stop_flusher(&mut self) -> Result<(), LogError> {
        let Some(handle) = self.flusher.take() else {
            return Ok(());
        };
        {
            let mut staging = self.shared.lock_staging();
            staging.shutdown = true;
            self.shared.work.notify_one();
        }
        handle.join().map_err(|_| self.shared.fail(self.shared.poisoned("the log flusher thread panicked")))
    }
}

impl Drop for GroupLog {
    fn drop(&mut self) {
        // Errors have already been recorded for waiters; there is nobody left to tell.
        let _ = self.stop_flusher();
    }
}

impl Shared {
    fn check_len(&self, len: usize) -> Result<(), LogError> {
        if self.read_only {
            return Err(LogError::ReadOnly { dir: self.dir.clone() });
        }
        let max = self.max_record_bytes;
        match u32::try_from(len) {
            Ok(len) if len <= max => Ok(()),
            _ => Err(LogError::RecordTooLarge { len, max }),
        }
    }

    fn check_failed(&self) -> Result<(), LogError> {
        match self.failure.get() {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned { dir: self.dir.clone(), cause: cause.clone() }),
        }
    }

    fn poisoned(&self, cause: &str) -> LogError {
        LogError::Poisoned { dir: self.dir.clone(), cause: cause.to_string() }
    }

    /// Records `error` as the reason the log is unusable (the first failure wins), wakes
    /// everyone who could be waiting for progress that will now never come, and returns it.
    fn fail(&self, error: LogError) -> LogError {
        let _ = self.failure.set(error.to_string());
        {
            let _staging = self.lock_staging();
            self.space.notify_all();
            self.work.notify_one();
        }
        {
            let _waiting = self.lock_waiters();
            self.durable_changed.notify_all();
        }
        error
    }

    /// The record log's own validation errors leave it intact; anything else means a write,
    /// fsync or segment creation failed and what reached the disk is unknown.
    fn fail_if_fatal(&self, error: LogError) -> LogError {
        match error {
            LogError::RecordTooLarge { .. } | LogError::LsnExhausted { .. } | LogError::ReadOnly { .. } => error,
            _ => self.fail(error),
        }
    }

    fn lock_writer(&self) -> Result<MutexGuard<'_, Writer>, LogError> {
        // A panic while writing leaves the record log in an unknown state: refuse to go on.
        let writer = self.writer.lock().map_err(|_| self.fail(self.poisoned("a thread panicked while writing")))?;
        self.check_failed()?;
        Ok(writer)
    }

    // The staging and waiter states are updated in single steps, and a panicking encoder's
    // partial record is removed by `RecordBuf`, so they stay consistent across a panic.
    fn lock_staging(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_waiters(&self) -> MutexGuard<'_, usize> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a record to the staging buffer (group modes).
    fn stage<F>(&self, len_hint: usize, encode: F) -> Result<u64, LogError>
    where
        F: FnOnce(&mut RecordBuf<'_>),
    {
        let mut staging = self.lock_staging();
        while staging.batch.bytes.len() >= self.max_staged_bytes && !staging.batch.is_empty() {
            self.check_failed()?;
            // Unconditionally: the flusher may be sitting out the group delay.
            staging.flusher_idle = false;
            self.work.notify_one();
            staging.space_waiters += 1;
            staging = self.space.wait(staging).unwrap_or_else(PoisonError::into_inner);
            staging.space_waiters -= 1;
        }
        // Checked under the staging lock, which `fail` takes after recording the failure: a
        // record staged after this point is either flushed or, if the flusher fails first,
        // reported as failed to whoever waits for it.
        self.check_failed()?;
        let lsn = staging.next_lsn;
        let Some(following) = lsn.checked_add(1) else {
            return Err(LogError::LsnExhausted { dir: self.dir.clone() });
        };

        let len = {
            let batch = &mut staging.batch;
            batch.bytes.reserve(len_hint);
            let mut record = RecordBuf::new(&mut batch.bytes);
            encode(&mut record);
            // On error, dropping `record` removes its bytes.
            self.check_len(record.len())?;
            record.finish()
        };
        // `check_len` bounded it by a `u32` maximum.
        staging.batch.lens.push(len as u32);
        staging.next_lsn = following;
        if self.mode == SyncMode::None {
            // Durability is off: the record counts as durable once appended. Published before
            // `last_lsn` so that a waiter who sees the LSN appended also sees it durable.
            self.durable_lsn.store(lsn, Ordering::Release);
        }
        self.last_lsn.store(lsn, Ordering::Release);
        wake_flusher(&mut staging, &self.work);
        Ok(lsn)
    }

    /// Appends, writes and fsyncs one record under the writer lock ([`SyncMode::Every`]).
    fn append_every(&self, payload: &[u8]) -> Result<u64, LogError> {
        let mut writer = self.lock_writer()?;
        let lsn = writer.log.append(payload).map_err(|e| self.fail_if_fatal(e))?;
        let durable = writer.log.sync().map_err(|e| self.fail(e))?;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.count_batch(1);
        self.last_lsn.store(lsn, Ordering::Release);
        self.publish_durable(durable);
        Ok(lsn)
    }

    /// Takes everything staged, writes it through the record log and, when `fsync` is set,
    /// fsyncs and publishes the new durable LSN, which it returns.
    ///
    /// Runs under the writer lock from the moment the batch is taken until it is written, so
    /// batches reach the record log in LSN order whoever (flusher or `sync` caller) takes them.
    fn flush_staged(&self, fsync: bool) -> Result<u64, LogError> {
        let mut guard = self.lock_writer()?;
        let writer = &mut *guard;
        let (mut batch, first_lsn) = {
            let mut staging = self.lock_staging();
            let batch = std::mem::replace(&mut staging.batch, std::mem::take(&mut writer.spare));
            let next_lsn = staging.next_lsn;
            let first_lsn = std::mem::replace(&mut staging.first_lsn, next_lsn);
            if staging.space_waiters > 0 {
                self.space.notify_all();
            }
            (batch, first_lsn)
        };
        let result = self.write_batch(&mut writer.log, &batch, first_lsn, fsync);
        batch.clear();
        writer.spare = batch;
        // Staged records were taken out of the buffer: whatever failed, they are lost.
        result.map_err(|e| self.fail(e))
    }

    fn write_batch(&self, log: &mut RecordLog, batch: &Batch, first_lsn: u64, fsync: bool) -> Result<u64, LogError> {
        if !batch.is_empty() {
            if log.next_lsn() != first_lsn {
                return Err(self.poisoned(&format!(
                    "internal error: staged records start at LSN {first_lsn} but the record log is at LSN {}",
                    log.next_lsn()
                )));
            }
            let mut offset = 0usize;
            for &len in &batch.lens {
                let end = offset + len as usize;
                let Some(payload) = batch.bytes.get(offset..end) else {
                    return Err(self.poisoned("internal error: staged record lengths disagree with the staged bytes"));
                };
                log.append(payload)?;
                offset = end;
            }
            self.count_batch(batch.lens.len() as u64);
        }
        if fsync {
            let before = log.durable_lsn();
            let durable = log.sync()?;
            if durable > before {
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
            }
            self.publish_durable(durable);
            Ok(durable)
        } else {
            log.flush()?;
            Ok(self.durable_lsn.load(Ordering::Acquire))
        }
    }

    fn count_batch(&self, records: u64) {
        self.flushed.fetch_add(records, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.largest_batch.fetch_max(records, Ordering::Relaxed);
    }

    /// Raises the durable LSN to `lsn` and wakes the threads waiting for it.
    fn publish_durable(&self, lsn: u64) {
        let previous = self.durable_lsn.fetch_max(lsn, Ordering::AcqRel);
        if lsn > previous {
            // Taking the lock orders this wake-up after any waiter's check of the old value.
            let waiting = self.lock_waiters();
            if *waiting > 0 {
                self.durable_changed.notify_all();
            }
        }
    }
}

/// Wakes the flusher if it sleeps. Only the transition from idle costs a wake-up, so a burst
/// of appends during one fsync signals once.
/// How long the flusher waits between looks at an empty staging buffer while it polls.
const IDLE_POLL: Duration = Duration::from_micros(50);
/// Empty looks before the flusher sleeps until woken (a few milliseconds of quiet).
const IDLE_POLLS: u32 = 100;

fn wake_flusher(staging: &mut Staging, work: &Condvar) {
    if staging.flusher_idle {
        staging.flusher_idle = false;
        work.notify_one();
    }
}

/// The background flusher: waits for staged records, writes them and (in
/// [`SyncMode::Group`]) fsyncs, until shut down or the log fails.
fn run_flusher(shared: &Shared) {
    // A panic here would leave waiters blocked forever; turn it into a log failure instead.
    struct PanicGuard<'a>(&'a Shared);
    impl Drop for PanicGuard<'_> {
        fn drop(&mut self) {
            if thread::panicking() {
                self.0.fail(self.0.poisoned("the log flusher thread panicked"));
            }
        }
    }
    let _guard = PanicGuard(shared);

    let fsync = shared.mode == SyncMode::Group;
    loop {
        let shutting_down = {
            let mut staging = shared.lock_staging();
            let mut empty_polls = 0;
            loop {
                if shared.failure.get().is_some() {
                    return;
                }
                if !staging.batch.is_empty() || staging.shutdown {
                    break;
                }
                // Under load the flusher polls instead of being woken: waking it is a
                // system call, and appenders would make it while their transactions still
                // hold keys. Only after a quiet spell does it sleep until an append wakes it.
                if empty_polls < IDLE_POLLS {
                    empty_polls += 1;
                    staging = shared.work.wait_timeout(staging, IDLE_POLL).unwrap_or_else(PoisonError::into_inner).0;
                } else {
                    staging.flusher_idle = true;
                    staging = shared.work.wait(staging).unwrap_or_else(PoisonError::into_inner);
                }
            }
            staging.flusher_idle = false;
            if staging.batch.is_empty() {
                return; // shut down with nothing left to write
            }
            staging.shutdown
        };
        if fsync && !shutting_down && !shared.group_delay.is_zero() {
            delay_batch(shared);
        }
        if shared.flush_staged(fsync).is_err() {
            return; // `flush_staged` recorded the failure and woke everyone
        }
    }
}

/// Waits up to [`GroupLogOptions::group_delay`] for more records to join the batch. Cut
/// short by shutdown, a failure, or a full staging buffer (whose appenders would otherwise
/// sit out the delay).
fn delay_batch(shared: &Shared) {
    let deadline = Instant::now().checked_add(shared.group_delay);
    let mut staging = shared.lock_staging();
    loop {
        if staging.shutdown || staging.batch.bytes.len() >= shared.max_staged_bytes || shared.failure.get().is_some() {
            return;
        }
        staging = match deadline {
            None => shared.work.wait(staging).unwrap_or_else(PoisonError::into_inner),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return;
                }
                shared.work.wait_timeout(staging, deadline - now).unwrap_or_else(PoisonError::into_inner).0
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path, sync: SyncMode) -> GroupLog {
        GroupLog::open(dir, GroupLogOptions { sync, ..GroupLogOptions::default() }).unwrap().0
    }

    #[test]
    fn failure_releases_waiters_and_refuses_appends() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(open(dir.path(), SyncMode::Group));
        // Hold the writer lock so that the flusher cannot make the record durable.
        let writer = log.shared.lock_writer().unwrap();
        let lsn = log.append(b"never acknowledged").unwrap();
        let waiter = {
            let log = Arc::clone(&log);
            thread::spawn(move || log.wait_durable(lsn))
        };
        thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the record cannot be durable yet");
        log.shared.fail(LogError::Io {
            op: "fsync",
            path: dir.path().join("simulated"),
            source: io::Error::other("simulated disk failure"),
        });
        drop(writer);
        let error = waiter.join().unwrap().unwrap_err();
        assert!(matches!(error, LogError::Poisoned { .. }), "{error}");
        assert!(error.to_string().contains("simulated disk failure"), "{error}");
        assert!(log.durable_lsn() < lsn);
        assert!(matches!(log.append(b"more"), Err(LogError::Poisoned { .. })));
        assert!(matches!(log.sync(), Err(LogError::Poisoned { .. })));
        let log = Arc::try_unwrap(log).unwrap();
        assert!(log.close().is_err());
    }

    #[test]
    fn failure_releases_appenders_blocked_on_a_full_staging_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let options = GroupLogOptions { max_staged_bytes: 8, ..GroupLogOptions::default() };
        let log = Arc::new(GroupLog::open(dir.path(), options).unwrap().0);
        let writer = log.shared.lock_writer().unwrap();
        log.append(b"0123456789").unwrap();
        let blocked = {
            let log = Arc::clone(&log);
            thread::spawn(move || log.append(b"x"))
        };
        thread::sleep(Duration::from_millis(50));
        assert!(!blocked.is_finished(), "the staging buffer is full");
        log.shared.fail(log.shared.poisoned("simulated"));
        drop(writer);
        assert!(matches!(blocked.join().unwrap(), Err(LogError::Poisoned { .. })));
    }

    #[test]
    fn record_buf_exposes_only_its_own_bytes_and_rolls_back_unless_finished() {
        let mut bytes = b"other".to_vec();
        {
            let mut record = RecordBuf::new(&mut bytes);
            record.extend_from_slice(&[0, 0]);
            record.push(7);
            io::Write::write_all(&mut record, b"ab").unwrap();
            record.as_mut_slice()[0] = 9;
            assert_eq!(record.as_slice(), &[9, 0, 7, b'a', b'b']);
            record.truncate(100);
            record.truncate(3);
            assert_eq!(record.len(), 3);
        }
        assert_eq!(bytes, b"other", "an unfinished record is removed");
        let mut record = RecordBuf::new(&mut bytes);
        record.push(1);
        assert_eq!(record.finish(), 1);
        assert_eq!(bytes, b"other\x01");
    }
}
