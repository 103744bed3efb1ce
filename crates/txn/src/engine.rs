//! The engine: a versioned store with the concurrency-control state beside it, the
//! optional write-ahead log, the clocks, the registry of sessions (clients) that defines the
//! garbage-collection watermark, and abort accounting.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use virga_core::clock::{Clock, HybridClock};
use virga_log::{GroupLog, GroupLogOptions, LogError, OpenMode};
use virga_storage::{Timestamp, TxnId, Version, VersionedStore};

use crate::abort::AbortReason;
use crate::cc::{DefaultStore, TxnStore};
use crate::checker::INITIAL_WRITER;
use crate::clocks::{ClockSource, SkewedClocks};
use crate::config::{Durability, EngineConfig, TimestampScheme};
use crate::txn::Txn;
use crate::wal::{self, LogRecord};

/// The most sessions that may be open at once.
pub const MAX_SESSIONS: usize = 4096;

/// Bytes of initial data per log record written by [`Engine::load`].
const LOAD_RECORD_BYTES: usize = 1 << 20;

/// How many transactions a session runs between refreshes of the watermark.
const WATERMARK_PERIOD: u32 = 256;

/// A session idle this long (in nanoseconds of its clock) stops holding the watermark back.
pub(crate) const IDLE_GRACE_NS: u64 = 1_000_000_000;

/// Transaction ids a session takes from the engine at a time.
const TXN_ID_BLOCK: u64 = 1 << 16;

/// A session slot: the oldest time its client may still read at. Padded to a cache line so
/// that clients updating their own slots do not contend.
#[repr(align(64))]
struct Slot(AtomicU64);

const FREE_SLOT: u64 = u64::MAX;

/// An engine failure that is not an abort: the log could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The write-ahead log failed.
    #[error("write-ahead log in {dir}: {source}")]
    Log {
        /// The log directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: LogError,
    },
    /// A log record passed its checksum but does not decode: written by something else.
    #[error("write-ahead log in {dir}: record {lsn} is malformed: {why}")]
    BadRecord {
        /// The log directory.
        dir: PathBuf,
        /// The record's sequence number.
        lsn: u64,
        /// What is wrong with it.
        why: crate::wal::WalDecodeError,
    },
    /// Too many sessions are open.
    #[error("all {MAX_SESSIONS} session slots are in use")]
    TooManySessions,
}

/// What [`Engine::open`] found in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Committed transactions replayed.
    pub committed: u64,
    /// Initial key-value pairs replayed.
    pub loaded_pairs: u64,
    /// Bytes of a torn tail cut off the last segment.
    pub truncated_bytes: u64,
}

/// Commit and abort counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnStats {
    /// Committed transactions.
    pub commits: u64,
    /// Aborts by reason, indexed like [`AbortReason::ALL`].
    pub aborts: [u64; AbortReason::ALL.len()],
}

impl TxnStats {
    /// All aborts.
    pub fn total_aborts(&self) -> u64 {
        self.aborts.iter().sum()
    }

    /// Aborts of one reason.
    pub fn aborts_of(&self, reason: AbortReason) -> u64 {
        self.aborts[reason.index()]
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: &TxnStats) {
        self.commits += other.commits;
        for (mine, theirs) in self.aborts.iter_mut().zip(other.aborts) {
            *mine += theirs;
        }
    }
}

struct Registry {
    next_client: u32,
}

/// The transactional key-value engine over a [`TxnStore`] (by default [`DefaultStore`], the
/// in-memory multi-version store; any [`VersionedStore`] through
/// [`SideTable`](crate::SideTable)). Share it as `Arc<Engine>`; each worker thread opens its
/// own [`Session`].
pub struct Engine<S: TxnStore = DefaultStore> {
    pub(crate) config: EngineConfig,
    pub(crate) store: S,
    clocks: Arc<dyn ClockSource>,
    pub(crate) log: Option<GroupLog>,
    slots: Box<[Slot]>,
    registry: Mutex<Registry>,
    /// Time part of the garbage-collection watermark: no session reads below it.
    watermark: AtomicU64,
    /// The largest snapshot time of any range scan: an insert below it could be a phantom.
    pub(crate) scan_guard: AtomicU64,
    /// The largest log sequence number appended by a commit that may be visible to readers.
    pub(crate) installed_lsn: AtomicU64,
    /// The next unused block of transaction ids (ids are unique for the engine's life).
    next_txn_id: AtomicU64,
    /// [`IDLE_GRACE_NS`] in the units of the timestamp scheme's clock.
    idle_grace: u64,
    log_failed: AtomicBool,
    stats: Mutex<TxnStats>,
}

impl<S: TxnStore> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Engine<DefaultStore> {
    /// Opens an engine on a new in-memory store, with each client's clock skewed from the
    /// system clock per `config.clock_skew`; with a log, recovers every committed
    /// transaction from it first.
    pub fn open(config: EngineConfig) -> Result<(Arc<Engine>, Recovery), EngineError> {
        let clocks = Arc::new(SkewedClocks::system(config.clock_skew, config.seed));
        Engine::open_with(config, DefaultStore::with_attachments(), clocks)
    }
}

impl<S: TxnStore> Engine<S> {
    /// Opens an engine on `store`, reading each client's time from a clock `clocks` builds
    /// (`config.clock_skew` is then not consulted); with a log, recovers every committed
    /// transaction from it into `store` first.
    pub fn open_with(
        config: EngineConfig,
        store: S,
        clocks: Arc<dyn ClockSource>,
    ) -> Result<(Arc<Engine<S>>, Recovery), EngineError> {
        let mut recovery = Recovery::default();
        let log = match &config.durability {
            Durability::Off => None,
            Durability::Log { dir, sync } => {
                let options = GroupLogOptions { sync: *sync, ..GroupLogOptions::default() };
                // Each record is replayed as the log's index is built, without keeping it.
                let mut bad_record = None;
                let (log, recovered) = GroupLog::open_with(dir, options, OpenMode::Repair, |lsn, payload| {
                    if bad_record.is_some() {
                        return;
                    }
                    match wal::decode(payload) {
                        Ok(decoded) => replay(&store, decoded, &mut recovery),
                        Err(why) => bad_record = Some(EngineError::BadRecord { dir: dir.clone(), lsn, why }),
                    }
                })
                .map_err(|source| EngineError::Log { dir: dir.clone(), source })?;
                if let Some(error) = bad_record {
                    return Err(error);
                }
                recovery.truncated_bytes = recovered.truncated_bytes;
                Some(log)
            }
        };
        let idle_grace = match config.timestamps {
            TimestampScheme::Clock => IDLE_GRACE_NS,
            // Hybrid clocks count milliseconds above a 16-bit counter.
            TimestampScheme::Hlc | TimestampScheme::Dst => (IDLE_GRACE_NS / 1_000_000) << 16,
        };
        let engine = Engine {
            config,
            store,
            clocks,
            log,
            slots: (0..MAX_SESSIONS).map(|_| Slot(AtomicU64::new(FREE_SLOT))).collect(),
            registry: Mutex::new(Registry { next_client: 1 }),
            watermark: AtomicU64::new(0),
            scan_guard: AtomicU64::new(0),
            installed_lsn: AtomicU64::new(0),
            next_txn_id: AtomicU64::new(1),
            idle_grace,
            log_failed: AtomicBool::new(false),
            stats: Mutex::new(TxnStats::default()),
        };
        Ok((Arc::new(engine), recovery))
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The versioned store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Stores initial data outside any transaction (version timestamp zero, writer 0),
    /// logging it first and syncing when the engine is durable. Returns the pairs stored.
    pub fn load(&self, pairs: impl Iterator<Item = (Vec<u8>, Vec<u8>)>) -> Result<u64, EngineError> {
        let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut batch_bytes = 0;
        let mut count = 0;
        let mut record = Vec::new();
        let mut flush = |batch: &mut Vec<(Vec<u8>, Vec<u8>)>| -> Result<(), EngineError> {
            if let Some(log) = &self.log {
                record.clear();
                wal::encode_load(&mut record, batch.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
                log.append(&record).map_err(|source| self.log_error(source))?;
            }
            for (key, value) in batch.drain(..) {
                let version = Version { ts: Timestamp::ZERO, writer: INITIAL_WRITER, value: Some(value.into()) };
                self.store.reset(&self.store.entry(&key), version);
            }
            Ok(())
        };
        for (key, value) in pairs {
            batch_bytes += key.len() + value.len() + 8;
            batch.push((key, value));
            count += 1;
            if batch_bytes >= LOAD_RECORD_BYTES {
                flush(&mut batch)?;
                batch_bytes = 0;
            }
        }
        flush(&mut batch)?;
        self.sync()?;
        Ok(count)
    }

    /// Opens a session: one client with its own clock, for one thread at a time.
    pub fn session(self: &Arc<Self>) -> Result<Session<S>, EngineError> {
        let mut registry = self.registry.lock();
        let slot = self.slots.iter().position(|s| s.0.load(Ordering::Relaxed) == FREE_SLOT);
        let slot = slot.ok_or(EngineError::TooManySessions)?;
        let client = registry.next_client;
        registry.next_client = registry.next_client.wrapping_add(1).max(1);
        let physical = self.clocks.clock(client);
        let mut clock = match self.config.timestamps {
            TimestampScheme::Clock => SessionClock::Physical(physical),
            TimestampScheme::Hlc | TimestampScheme::Dst => SessionClock::Hybrid(HybridClock::new(physical)),
        };
        // Registered under the registry latch, so no watermark computed after this point can
        // pass the session's first snapshot.
        let start = clock.now().max(self.watermark.load(Ordering::Acquire));
        clock.observe(start);
        self.slots[slot].0.store(start, Ordering::Release);
        drop(registry);
        Ok(Session {
            engine: Arc::clone(self),
            client,
            slot,
            clock,
            ids: 0..0,
            since_watermark: 0,
            stats: TxnStats::default(),
            record: Vec::new(),
            buffers: Default::default(),
        })
    }

    /// The garbage-collection watermark as a timestamp: every session reads at or above it.
    pub fn watermark(&self) -> Timestamp {
        Timestamp::new(self.watermark.load(Ordering::Acquire), 0)
    }

    /// Recomputes the watermark as the oldest time any open session may still read at.
    pub fn refresh_watermark(&self) -> Timestamp {
        self.refresh_watermark_at(None)
    }

    /// As [`Engine::refresh_watermark`]; given the caller's current time, sessions idle for
    /// longer than [`IDLE_GRACE_NS`] no longer hold the watermark back (they are pulled up
    /// to it when they begin again).
    fn refresh_watermark_at(&self, now: Option<u64>) -> Timestamp {
        let _registry = self.registry.lock();
        let stale_before = now.map_or(0, |now| now.saturating_sub(self.idle_grace));
        let oldest = self
            .slots
            .iter()
            .map(|s| s.0.load(Ordering::SeqCst))
            .filter(|&t| t != FREE_SLOT && t >= stale_before)
            .min()
            .unwrap_or(stale_before);
        self.watermark.fetch_max(oldest, Ordering::SeqCst);
        self.watermark()
    }

    /// A full garbage-collection pass at the current watermark. Installs also collect the
    /// key they touch, so this is only needed for keys that stopped being written.
    pub fn gc(&self) -> virga_storage::GcStats {
        let watermark = self.refresh_watermark();
        self.store.gc(watermark)
    }

    /// Every commit with a log sequence number at most this is durable.
    pub fn durable_lsn(&self) -> u64 {
        self.log.as_ref().map_or(u64::MAX, |log| log.durable_lsn())
    }

    /// Blocks until the commit with log sequence number `lsn` is durable.
    pub fn wait_durable(&self, lsn: u64) -> Result<(), EngineError> {
        match &self.log {
            Some(log) => log.wait_durable(lsn).map_err(|source| self.log_error(source)),
            None => Ok(()),
        }
    }

    /// Makes every commit so far durable.
    pub fn sync(&self) -> Result<(), EngineError> {
        match &self.log {
            Some(log) => log.sync().map(|_| ()).map_err(|source| self.log_error(source)),
            None => Ok(()),
        }
    }

    /// Commits and aborts of sessions closed so far plus those flushed by open sessions.
    pub fn stats(&self) -> TxnStats {
        self.stats.lock().clone()
    }

    /// Whether a log write or sync failed; the engine then refuses to commit writes.
    pub fn log_failed(&self) -> bool {
        self.log_failed.load(Ordering::Acquire)
    }

    pub(crate) fn note_log_failure(&self) {
        self.log_failed.store(true, Ordering::Release);
    }

    fn log_error(&self, source: LogError) -> EngineError {
        self.note_log_failure();
        let dir = match &self.config.durability {
            Durability::Log { dir, .. } => dir.clone(),
            Durability::Off => PathBuf::new(),
        };
        EngineError::Log { dir, source }
    }

    fn release_slot(&self, slot: usize) {
        let _registry = self.registry.lock();
        self.slots[slot].0.store(FREE_SLOT, Ordering::Release);
    }
}

/// Applies one recovered record. Only each key's final value matters after a restart (no
/// snapshot predates it), so every recovered version gets timestamp zero and new commits
/// order after it whatever the timestamp scheme.
fn replay<S: VersionedStore>(store: &S, record: LogRecord, recovery: &mut Recovery) {
    match record {
        LogRecord::Load { pairs } => {
            recovery.loaded_pairs += pairs.len() as u64;
            for (key, value) in pairs {
                let version = Version { ts: Timestamp::ZERO, writer: INITIAL_WRITER, value: Some(value) };
                store.reset(&store.entry(&key), version);
            }
        }
        LogRecord::Commit { writes, .. } => {
            recovery.committed += 1;
            // Transaction ids restart with the engine: recovered versions count as initial.
            for (key, value) in writes {
                store.reset(&store.entry(&key), Version { ts: Timestamp::ZERO, writer: INITIAL_WRITER, value });
            }
        }
    }
}

/// A client's clock: a physical clock from the engine's [`ClockSource`], or a hybrid clock
/// on top of one.
pub(crate) enum SessionClock {
    Physical(Box<dyn Clock>),
    Hybrid(HybridClock<Box<dyn Clock>>),
}

impl SessionClock {
    /// The next time; strictly increasing for hybrid clocks, non-decreasing for physical.
    pub(crate) fn now(&mut self) -> u64 {
        match self {
            SessionClock::Physical(clock) => clock.now_ns(),
            SessionClock::Hybrid(clock) => clock.now(),
        }
    }

    /// Records having seen `time` (a receive event); only hybrid clocks move.
    pub(crate) fn observe(&mut self, time: u64) {
        if let SessionClock::Hybrid(clock) = self {
            clock.observe(time);
        }
    }
}

/// One client of the engine: its clock, its identity, its counters. A session runs one
/// transaction at a time; open one per thread.
pub struct Session<S: TxnStore = DefaultStore> {
    pub(crate) engine: Arc<Engine<S>>,
    pub(crate) client: u32,
    slot: usize,
    pub(crate) clock: SessionClock,
    /// Transaction ids reserved for this session and not used yet.
    ids: std::ops::Range<u64>,
    since_watermark: u32,
    pub(crate) stats: TxnStats,
    /// Reused buffer for encoding log records.
    pub(crate) record: Vec<u8>,
    /// Reused read, write and scan sets.
    pub(crate) buffers: crate::txn::TxnBuffers<S::Entry>,
}

impl<S: TxnStore> std::fmt::Debug for Session<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("client", &self.client).field("stats", &self.stats).finish()
    }
}

impl<S: TxnStore> Session<S> {
    /// Starts a read-write transaction.
    pub fn begin(&mut self) -> Txn<'_, S> {
        Txn::begin(self, false)
    }

    /// Starts a read-only transaction: it reads a snapshot and validates locally, writing
    /// nothing to shared state (MILANA), or reads at the client's `LocalTS` and never aborts
    /// (DST).
    pub fn begin_read_only(&mut self) -> Txn<'_, S> {
        Txn::begin(self, true)
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine<S>> {
        &self.engine
    }

    /// This client's id (also the tie-breaker in its timestamps).
    pub fn client(&self) -> u32 {
        self.client
    }

    /// Commits and aborts of this session.
    pub fn stats(&self) -> &TxnStats {
        &self.stats
    }

    /// A fresh transaction id and snapshot time for a transaction starting now.
    pub(crate) fn start_txn(&mut self) -> (TxnId, u64) {
        let id = match self.ids.next() {
            Some(id) => id,
            None => {
                let start = self.engine.next_txn_id.fetch_add(TXN_ID_BLOCK, Ordering::Relaxed);
                self.ids = start + 1..start + TXN_ID_BLOCK;
                start
            }
        };
        let mut time = self.clock.now();
        self.since_watermark += 1;
        if self.since_watermark >= WATERMARK_PERIOD {
            self.since_watermark = 0;
            self.engine.refresh_watermark_at(Some(time));
        }
        // Never read below the watermark: a lagging or long-idle clock is pulled up to it.
        // The slot is published before the watermark is checked again, and a refresh reads
        // the slots before it publishes (all sequentially consistent), so either the refresh
        // counted this slot or this check sees the refreshed watermark.
        loop {
            let floor = self.engine.watermark.load(Ordering::SeqCst);
            if time < floor {
                self.clock.observe(floor);
                time = floor;
            }
            self.engine.slots[self.slot].0.store(time, Ordering::SeqCst);
            if self.engine.watermark.load(Ordering::SeqCst) <= time {
                return (id, time);
            }
        }
    }

    pub(crate) fn count_commit(&mut self) {
        self.stats.commits += 1;
    }

    pub(crate) fn count_abort(&mut self, reason: AbortReason) {
        self.stats.aborts[reason.index()] += 1;
    }

    pub(crate) fn record_history(&self, record: impl FnOnce() -> crate::checker::TxnRecord) {
        if let Some(history) = &self.engine.config.history {
            history.record(record());
        }
    }
}

impl<S: TxnStore> Drop for Session<S> {
    fn drop(&mut self) {
        self.engine.stats.lock().merge(&self.stats);
        self.engine.release_slot(self.slot);
    }
}

/// What a commit returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// The transaction.
    pub txn: TxnId,
    /// Its commit timestamp (a read-only transaction's: its snapshot).
    pub ts: Timestamp,
    /// With a log: the commit is durable (and may be acknowledged) once
    /// [`Engine::durable_lsn`] reaches this. A read-only transaction gets the last installed
    /// commit's number, so it is acknowledged only after everything it could have read.
    pub lsn: Option<u64>,
}

pub(crate) fn bytes_of(value: Option<&Bytes>) -> Option<&[u8]> {
    value.map(|v| v.as_ref())
}
