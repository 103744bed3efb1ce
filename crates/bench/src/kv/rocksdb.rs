//! RocksDB as a peer engine for the transactional key-value benchmarks (feature `rocksdb`).
//!
//! [`RocksPeer`] implements [`KvBackend`] over either of RocksDB's transactional databases,
//! chosen by [`RocksMode`]:
//!
//! - [`RocksMode::Optimistic`]: `OptimisticTransactionDB`. Reads and writes are buffered and
//!   validated at commit; a key read or written by the transaction that another transaction
//!   wrote after this one's snapshot fails the commit with `Busy`.
//! - [`RocksMode::Pessimistic`]: `TransactionDB` (write-committed). Every read and write takes a
//!   point lock at once; with the default lock timeout of 0 ms a transaction that meets a held
//!   lock fails at once (`TimedOut`), which is no-wait two-phase locking like Virga's.
//!
//! # Isolation
//!
//! Both modes are made serializable for point operations the same way: every transaction sets
//! its snapshot when it begins, reads as of that snapshot, and reads every key with
//! `get_for_update` (RocksDB's plain `get` is not tracked, and would give only snapshot
//! isolation). In optimistic mode that adds the key to the commit-time validation; in
//! pessimistic mode it locks the key (exclusively unless [`RocksOptions::shared_read_locks`]) and
//! fails with `Busy` if the key changed after the snapshot. A scan in a read-write transaction
//! registers each key it returns the same way, but RocksDB has no range locks or range
//! validation in these modes, so an insert into a scanned range (a phantom) is not detected.
//!
//! Read-only transactions take no locks and track nothing: they read one consistent snapshot of
//! the database, which is serializable (up to the phantoms above) because every writing
//! transaction is.
//!
//! # Abort reasons
//!
//! | RocksDB status | [`TxAbort::reason`] | when |
//! | --- | --- | --- |
//! | `Busy` | `"conflict"` | optimistic commit-time validation failed, or a pessimistic read or write found the key changed after the snapshot |
//! | `TimedOut` | `"lock-timeout"` | pessimistic lock not granted within the lock timeout (0 ms: at once) |
//! | `TryAgain` | `"try-again"` | optimistic validation could not see far enough back in the memtables |
//! | `Expired` | `"expired"` | pessimistic transaction outlived its expiration (not set here) |
//! | anything else | `"rocksdb-error"` | printed to stderr the first time, counted in [`RocksPeer::unexpected_errors`] |
//! | a write in a read-only transaction | `"write-in-read-only"` | a workload bug |
//!
//! # Durability
//!
//! [`RocksDurability`] mirrors Virga's settings:
//!
//! - `None`: every commit writes its WAL record to the operating system (`WriteOptions::sync =
//!   false`) and nothing is ever fsynced; commits are acknowledged at once.
//! - `Every`: every commit fsyncs the WAL before it returns (`WriteOptions::sync = true`);
//!   RocksDB's write thread already groups concurrent commits under one fsync.
//! - `Group`: pipelined group commit, as in Virga. Commits write the WAL without sync and
//!   return [`Ack::After`] with a ticket from a counter incremented after each commit. A
//!   background thread loops: it reads the counter, calls `flush_wal(true)` (which syncs the
//!   WAL: RocksDB's `FlushWAL` + `SyncWAL`), then publishes the value it read as the durable
//!   ticket. Every commit counted before the read had already written its WAL record, so the
//!   fsync covers it; a commit is acknowledged only after an fsync that began after it
//!   committed. The thread sleeps while nothing is pending and commits wake it.
//!
//! # Tuning
//!
//! The benchmark's data sets fit in memory, so the peer is set up as RocksDB's own guides
//! advise for a memory-resident data set; see [`RocksOptions`] for the sizes:
//!
//! - One block cache (HyperClockCache, RocksDB's recommended cache for concurrent reads) large
//!   enough for the data set, uncompressed blocks (no compression library is even built), full
//!   Bloom filters of 10 bits per key, and a hash index inside data blocks for point lookups.
//! - A memtable Bloom filter over whole keys, so point reads skip the memtable cheaply.
//! - `max_open_files = -1`: every table reader and its index stay open.
//! - 64 MiB write buffers, up to 4 of them; leveled compaction with dynamic level sizes (the
//!   default); 2 background jobs, one per core of the benchmark machine.
//! - [`KvBackend::load`] writes in large batches without the WAL, then flushes the memtables to
//!   table files (which makes the load durable in every mode) and waits for background
//!   compaction to settle, so measurement starts from an empty memtable and a settled tree.
//!
//! Pipelined writes, unordered writes and two write queues are left at RocksDB's defaults (off):
//! unordered writes weaken snapshot consistency, two write queues serve the write-prepared
//! transaction policies (not the write-committed one used here), and pipelining the WAL and
//! memtable stages has little to overlap on two cores.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use ::rocksdb::{
    BlockBasedOptions, Cache, DBAccess, DBCompressionType, DBRawIteratorWithThreadMode, DataBlockIndexType, Error,
    ErrorKind, MultiThreaded, OptimisticTransactionDB, OptimisticTransactionOptions, Options, ReadOptions,
    SnapshotWithThreadMode, Transaction, TransactionDB, TransactionDBOptions, TransactionOptions,
    WriteBatchWithTransaction, WriteOptions,
};
use anyhow::Context;
use bytes::Bytes;

use super::{Ack, KvBackend, KvSession, KvTx, TxAbort};

/// Which RocksDB transaction database the peer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RocksMode {
    /// `OptimisticTransactionDB`: validation at commit.
    Optimistic,
    /// `TransactionDB`: point locks taken as the transaction runs.
    Pessimistic,
}

impl RocksMode {
    /// `"optimistic"` or `"pessimistic"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RocksMode::Optimistic => "optimistic",
            RocksMode::Pessimistic => "pessimistic",
        }
    }

    /// Parses `"optimistic"` (or `"occ"`) and `"pessimistic"` (or `"2pl"`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "optimistic" | "occ" => Some(RocksMode::Optimistic),
            "pessimistic" | "2pl" => Some(RocksMode::Pessimistic),
            _ => None,
        }
    }
}

/// When a commit is durable; the same three settings as Virga's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RocksDurability {
    /// WAL written to the operating system, never fsynced.
    None,
    /// Each commit fsyncs the WAL before returning.
    Every,
    /// Commits return at once with a ticket; a background thread fsyncs the WAL.
    Group,
}

impl RocksDurability {
    /// `"none"`, `"every"` or `"group"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RocksDurability::None => "none",
            RocksDurability::Every => "every",
            RocksDurability::Group => "group",
        }
    }

    /// Parses `"none"`, `"every"` and `"group"`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(RocksDurability::None),
            "every" => Some(RocksDurability::Every),
            "group" => Some(RocksDurability::Group),
            _ => None,
        }
    }
}

/// How to open a [`RocksPeer`]. [`RocksOptions::default`] gives optimistic transactions without
/// durability and the defaults described on each field.
#[derive(Clone, Debug)]
pub struct RocksOptions {
    /// Optimistic or pessimistic transactions. Default optimistic.
    pub mode: RocksMode,
    /// WAL sync policy. Default `None`.
    pub durability: RocksDurability,
    /// Pessimistic mode: how long a transaction waits for a lock, in milliseconds. 0 (the
    /// default) fails at once, like no-wait two-phase locking; a negative value uses RocksDB's
    /// default (1000 ms).
    pub lock_timeout_ms: i64,
    /// Pessimistic mode: lock keys that are only read in shared mode rather than exclusive.
    /// Default `false`, RocksDB's default for `get_for_update` (`SELECT ... FOR UPDATE`): it never
    /// has to upgrade a lock when a read key is written later, which with no-wait locking would
    /// abort both of two transactions that read and then write the same key.
    pub shared_read_locks: bool,
    /// Block cache capacity in bytes. Default 1 GiB.
    pub block_cache_bytes: usize,
    /// Size of one memtable in bytes. Default 64 MiB.
    pub write_buffer_bytes: usize,
}

impl Default for RocksOptions {
    fn default() -> Self {
        RocksOptions {
            mode: RocksMode::Optimistic,
            durability: RocksDurability::None,
            lock_timeout_ms: 0,
            shared_read_locks: false,
            block_cache_bytes: 1 << 30,
            write_buffer_bytes: 64 << 20,
        }
    }
}

/// Key-value pairs per batch in [`KvBackend::load`], and the byte size that also ends a batch.
const LOAD_BATCH_PAIRS: usize = 100_000;
const LOAD_BATCH_BYTES: usize = 32 << 20;
/// How long [`KvBackend::load`] waits at most for background compaction to settle.
const COMPACTION_SETTLE_LIMIT: Duration = Duration::from_secs(600);

enum Db {
    Optimistic(OptimisticTransactionDB),
    // `MultiThreaded` only because rust-rocksdb 0.25 offers `property_int_value` on no other
    // `TransactionDB`; the peer uses only the default column family either way.
    Pessimistic(TransactionDB<MultiThreaded>),
}

/// Calls the same method on either database.
macro_rules! with_db {
    ($db:expr, $d:ident => $body:expr) => {
        match $db {
            Db::Optimistic($d) => $body,
            Db::Pessimistic($d) => $body,
        }
    };
}

/// State shared by the peer, its sessions and the group-commit thread.
struct Shared {
    // Declared before `_tempdir` so the database closes before its directory is removed.
    db: Db,
    mode: RocksMode,
    durability: RocksDurability,
    shared_read_locks: bool,
    write_opts: WriteOptions,
    optimistic_opts: OptimisticTransactionOptions,
    pessimistic_opts: TransactionOptions,
    /// Group mode: tickets handed out (commits counted) so far.
    committed: AtomicU64,
    /// Group mode: every ticket up to this is durable.
    durable: AtomicU64,
    /// Group mode: tells the flusher thread to finish.
    stop: AtomicBool,
    /// Group mode: the flusher thread, woken by commits.
    flusher: OnceLock<Thread>,
    /// RocksDB errors that were not conflicts.
    unexpected: AtomicU64,
    path: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
}

impl Shared {
    /// Maps a RocksDB error to an abort, reporting unexpected ones.
    fn abort(&self, err: &Error) -> TxAbort {
        let reason = match err.kind() {
            ErrorKind::Busy => "conflict",
            ErrorKind::TimedOut => "lock-timeout",
            ErrorKind::TryAgain => "try-again",
            ErrorKind::Expired => "expired",
            _ => {
                self.report(err);
                "rocksdb-error"
            }
        };
        TxAbort { reason }
    }

    /// Counts an unexpected RocksDB error and prints the first one.
    fn report(&self, err: &Error) {
        if self.unexpected.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!("rocksdb peer at {}: unexpected RocksDB error (printed once): {err}", self.path.display());
        }
    }

    fn flush_wal_sync(&self) -> Result<(), Error> {
        with_db!(&self.db, d => d.flush_wal(true))
    }

    fn write_batch(&self, batch: WriteBatchWithTransaction<true>, opts: &WriteOptions) -> Result<(), Error> {
        with_db!(&self.db, d => d.write_opt(batch, opts))
    }

    fn property(&self, name: &str) -> u64 {
        with_db!(&self.db, d => d.property_int_value(name)).ok().flatten().unwrap_or(0)
    }

    /// Acknowledgement of a commit that wrote the WAL.
    fn ack(&self) -> Ack {
        match self.durability {
            RocksDurability::None | RocksDurability::Every => Ack::Now,
            RocksDurability::Group => {
                let ticket = self.committed.fetch_add(1, Ordering::AcqRel) + 1;
                if let Some(flusher) = self.flusher.get() {
                    flusher.unpark();
                }
                Ack::After(ticket)
            }
        }
    }
}

/// Group mode's background thread: fsync the WAL, then publish the tickets it covers.
fn flusher_loop(shared: Arc<Shared>) {
    loop {
        let stopping = shared.stop.load(Ordering::Acquire);
        // Every commit counted here has already written its WAL record.
        let target = shared.committed.load(Ordering::Acquire);
        if target == shared.durable.load(Ordering::Acquire) {
            if stopping {
                return;
            }
            thread::park_timeout(Duration::from_millis(10));
            continue;
        }
        match shared.flush_wal_sync() {
            Ok(()) => shared.durable.store(target, Ordering::Release),
            Err(err) => {
                shared.report(&err);
                if stopping {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// RocksDB under test; see the [module documentation](self).
pub struct RocksPeer {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

impl RocksPeer {
    /// Opens the database in `dir`, creating the directory and the database if needed.
    pub fn open(dir: &Path, options: RocksOptions) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Self::open_at(dir.to_path_buf(), None, options)
    }

    /// Opens a new database in a fresh temporary directory, removed when the peer and all its
    /// sessions are dropped.
    pub fn open_temp(options: RocksOptions) -> anyhow::Result<Self> {
        let tmp = tempfile::Builder::new().prefix("virga-rocksdb-").tempdir().context("creating a tempdir")?;
        Self::open_at(tmp.path().to_path_buf(), Some(tmp), options)
    }

    fn open_at(path: PathBuf, tempdir: Option<tempfile::TempDir>, config: RocksOptions) -> anyhow::Result<Self> {
        let opts = db_options(&config);
        let db = match config.mode {
            RocksMode::Optimistic => {
                let db = OptimisticTransactionDB::open(&opts, &path)
                    .with_context(|| format!("opening RocksDB OptimisticTransactionDB at {}", path.display()))?;
                Db::Optimistic(db)
            }
            RocksMode::Pessimistic => {
                let mut txn_db_opts = TransactionDBOptions::default();
                txn_db_opts.set_txn_lock_timeout(config.lock_timeout_ms);
                let db = TransactionDB::open(&opts, &txn_db_opts, &path)
                    .with_context(|| format!("opening RocksDB TransactionDB at {}", path.display()))?;
                Db::Pessimistic(db)
            }
        };

        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(config.durability == RocksDurability::Every);
        let mut optimistic_opts = OptimisticTransactionOptions::default();
        optimistic_opts.set_snapshot(true);
        let mut pessimistic_opts = TransactionOptions::default();
        pessimistic_opts.set_snapshot(true);
        pessimistic_opts.set_lock_timeout(config.lock_timeout_ms);
        pessimistic_opts.set_deadlock_detect(false);

        let shared = Arc::new(Shared {
            db,
            mode: config.mode,
            durability: config.durability,
            shared_read_locks: config.shared_read_locks,
            write_opts,
            optimistic_opts,
            pessimistic_opts,
            committed: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            flusher: OnceLock::new(),
            unexpected: AtomicU64::new(0),
            path,
            _tempdir: tempdir,
        });
        let flusher = if config.durability == RocksDurability::Group {
            let for_thread = Arc::clone(&shared);
            let handle = thread::Builder::new()
                .name("rocksdb-wal-sync".into())
                .spawn(move || flusher_loop(for_thread))
                .context("starting the WAL sync thread")?;
            let _ = shared.flusher.set(handle.thread().clone());
            Some(handle)
        } else {
            None
        };
        Ok(RocksPeer { shared, flusher })
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The transaction database in use.
    pub fn mode(&self) -> RocksMode {
        self.shared.mode
    }

    /// The WAL sync policy in use.
    pub fn durability(&self) -> RocksDurability {
        self.shared.durability
    }

    /// How many RocksDB errors were neither conflicts nor lock time-outs (see the module doc).
    pub fn unexpected_errors(&self) -> u64 {
        self.shared.unexpected.load(Ordering::Relaxed)
    }

    /// A RocksDB integer property of the default column family (for example
    /// `"rocksdb.estimate-num-keys"`), if RocksDB knows it.
    pub fn property(&self, name: &str) -> Option<u64> {
        with_db!(&self.shared.db, d => d.property_int_value(name)).ok().flatten()
    }

    /// Blocks until no flush or compaction is pending or running, or `limit` has passed.
    fn wait_for_background_work(&self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            let busy = self.shared.property("rocksdb.compaction-pending")
                + self.shared.property("rocksdb.num-running-compactions")
                + self.shared.property("rocksdb.num-running-flushes")
                + self.shared.property("rocksdb.mem-table-flush-pending");
            if busy == 0 {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RocksPeer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(handle) = self.flusher.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

/// The database options described in the module documentation.
fn db_options(config: &RocksOptions) -> Options {
    let mut table = BlockBasedOptions::default();
    // Estimated entry charge 0: the cache sizes its table itself (AutoHyperClockCache).
    let cache = Cache::new_hyper_clock_cache(config.block_cache_bytes, 0);
    table.set_block_cache(&cache);
    table.set_bloom_filter(10.0, false);
    table.set_data_block_index_type(DataBlockIndexType::BinaryAndHash);
    table.set_data_block_hash_ratio(0.75);

    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_block_based_table_factory(&table);
    opts.set_compression_type(DBCompressionType::None);
    opts.set_write_buffer_size(config.write_buffer_bytes);
    opts.set_max_write_buffer_number(4);
    opts.set_max_background_jobs(2);
    opts.set_max_open_files(-1);
    opts.set_level_compaction_dynamic_level_bytes(true);
    opts.set_memtable_whole_key_filtering(true);
    opts.set_memtable_prefix_bloom_ratio(0.02);
    if config.mode == RocksMode::Optimistic {
        // Validation reads only memtables; keep flushed ones long enough that a transaction
        // spanning a flush can still be validated (else `TryAgain`). -1: as many bytes as the
        // live write buffers (RocksDB's choice when it opens an OptimisticTransactionDB).
        opts.set_max_write_buffer_size_to_maintain(-1);
    }
    opts
}

impl KvBackend for RocksPeer {
    type Session = RocksSession;

    fn name(&self) -> String {
        format!("rocksdb-{}", self.shared.mode.as_str())
    }

    fn load(&self, pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        // The WAL is skipped: the flush below makes the loaded data durable in table files.
        let mut no_wal = WriteOptions::default();
        no_wal.disable_wal(true);
        let mut batch = WriteBatchWithTransaction::<true>::default();
        let mut bytes = 0usize;
        for (key, value) in pairs {
            bytes += key.len() + value.len();
            batch.put(&key, &value);
            if batch.len() >= LOAD_BATCH_PAIRS || bytes >= LOAD_BATCH_BYTES {
                let full = std::mem::take(&mut batch);
                self.shared.write_batch(full, &no_wal).context("RocksDB load: writing a batch")?;
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.shared.write_batch(batch, &no_wal).context("RocksDB load: writing a batch")?;
        }
        with_db!(&self.shared.db, d => d.flush()).context("RocksDB load: flushing memtables")?;
        if self.shared.durability != RocksDurability::None {
            self.shared.flush_wal_sync().context("RocksDB load: syncing the WAL")?;
        }
        self.wait_for_background_work(COMPACTION_SETTLE_LIMIT);
        Ok(())
    }

    fn session(&self, _client: usize) -> RocksSession {
        RocksSession { shared: Arc::clone(&self.shared) }
    }
}

/// One worker's connection to a [`RocksPeer`].
pub struct RocksSession {
    shared: Arc<Shared>,
}

impl KvSession for RocksSession {
    fn run(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort> {
        let shared = &*self.shared;
        match (&shared.db, read_only) {
            (Db::Optimistic(db), true) => run_read_only(shared, db, body),
            (Db::Pessimistic(db), true) => run_read_only(shared, db, body),
            (Db::Optimistic(db), false) => {
                let txn = db.transaction_opt(&shared.write_opts, &shared.optimistic_opts);
                run_read_write(shared, txn, body)
            }
            (Db::Pessimistic(db), false) => {
                let txn = db.transaction_opt(&shared.write_opts, &shared.pessimistic_opts);
                run_read_write(shared, txn, body)
            }
        }
    }

    fn durable_ticket(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }
}

/// Reads `iter` from `start`: up to `limit` pairs, in key order.
fn collect_scan<D: DBAccess>(
    shared: &Shared,
    mut iter: DBRawIteratorWithThreadMode<'_, D>,
    start: &[u8],
    limit: usize,
) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
    let mut out = Vec::with_capacity(limit.min(1024));
    if limit == 0 {
        return Ok(out);
    }
    iter.seek(start);
    while let Some((key, value)) = iter.item() {
        out.push((Bytes::copy_from_slice(key), Bytes::copy_from_slice(value)));
        if out.len() == limit {
            break;
        }
        iter.next();
    }
    iter.status().map_err(|err| shared.abort(&err))?;
    Ok(out)
}

/// A read-only transaction: reads of one snapshot, no locks, no validation.
fn run_read_only<D: DBAccess>(
    shared: &Shared,
    db: &D,
    body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
) -> Result<Ack, TxAbort> {
    let snapshot = SnapshotWithThreadMode::new(db);
    let mut read_opts = ReadOptions::default();
    read_opts.set_snapshot(&snapshot);
    let mut tx = SnapshotTx { shared, db, snapshot: &snapshot, read_opts };
    body(&mut tx)?;
    Ok(Ack::Now)
}

struct SnapshotTx<'a, D: DBAccess> {
    shared: &'a Shared,
    db: &'a D,
    snapshot: &'a SnapshotWithThreadMode<'a, D>,
    read_opts: ReadOptions,
}

impl<D: DBAccess> KvTx for SnapshotTx<'_, D> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        match self.db.get_pinned_opt(key, &self.read_opts) {
            Ok(value) => Ok(value.map(|v| Bytes::copy_from_slice(&v))),
            Err(err) => Err(self.shared.abort(&err)),
        }
    }

    fn put(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), TxAbort> {
        Err(TxAbort { reason: "write-in-read-only" })
    }

    fn delete(&mut self, _key: &[u8]) -> Result<(), TxAbort> {
        Err(TxAbort { reason: "write-in-read-only" })
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        let iter = self.snapshot.raw_iterator_opt(ReadOptions::default());
        collect_scan(self.shared, iter, start, limit)
    }
}

/// A read-write transaction: runs `body` in `txn`, then commits it.
fn run_read_write<DB>(
    shared: &Shared,
    txn: Transaction<'_, DB>,
    body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
) -> Result<Ack, TxAbort> {
    let outcome = {
        // The transaction's own snapshot, set when it began.
        let snapshot = txn.snapshot();
        let mut read_opts = ReadOptions::default();
        read_opts.set_snapshot(&snapshot);
        let exclusive = !shared.shared_read_locks;
        let mut tx = TxnTx { shared, txn: &txn, snapshot: &snapshot, read_opts, exclusive };
        body(&mut tx)
    };
    match outcome {
        Ok(()) => match txn.commit() {
            Ok(()) => Ok(shared.ack()),
            Err(err) => Err(shared.abort(&err)),
        },
        Err(abort) => {
            if let Err(err) = txn.rollback() {
                shared.report(&err);
            }
            Err(abort)
        }
    }
}

struct TxnTx<'a, 't, DB> {
    shared: &'a Shared,
    txn: &'a Transaction<'t, DB>,
    snapshot: &'a SnapshotWithThreadMode<'a, Transaction<'t, DB>>,
    read_opts: ReadOptions,
    exclusive: bool,
}

impl<DB> KvTx for TxnTx<'_, '_, DB> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        match self.txn.get_pinned_for_update_opt(key, self.exclusive, &self.read_opts) {
            Ok(value) => Ok(value.map(|v| Bytes::copy_from_slice(&v))),
            Err(err) => Err(self.shared.abort(&err)),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        self.txn.put(key, value).map_err(|err| self.shared.abort(&err))
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort> {
        self.txn.delete(key).map_err(|err| self.shared.abort(&err))
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        // The transaction's iterator merges its own buffered writes over the snapshot.
        let mut read_opts = ReadOptions::default();
        read_opts.set_snapshot(self.snapshot);
        let iter = self.txn.raw_iterator_opt(read_opts);
        let pairs = collect_scan(self.shared, iter, start, limit)?;
        // Validate (optimistic) or lock (pessimistic) every key returned; see the module doc.
        for (key, _) in &pairs {
            self.txn
                .get_pinned_for_update_opt(key, self.exclusive, &self.read_opts)
                .map_err(|err| self.shared.abort(&err))?;
        }
        Ok(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(mode: RocksMode, durability: RocksDurability) -> RocksOptions {
        RocksOptions { mode, durability, block_cache_bytes: 8 << 20, write_buffer_bytes: 4 << 20, ..Default::default() }
    }

    fn peer(mode: RocksMode, durability: RocksDurability) -> RocksPeer {
        RocksPeer::open_temp(small(mode, durability)).expect("open")
    }

    fn key(i: usize) -> Vec<u8> {
        format!("key{i:05}").into_bytes()
    }

    fn loaded(mode: RocksMode, durability: RocksDurability) -> RocksPeer {
        let peer = peer(mode, durability);
        let mut pairs = (0..100).map(|i| (key(i), format!("v{i}").into_bytes()));
        peer.load(&mut pairs).expect("load");
        peer
    }

    const MODES: [RocksMode; 2] = [RocksMode::Optimistic, RocksMode::Pessimistic];

    #[test]
    fn reads_writes_deletes_and_scans() {
        for mode in MODES {
            let peer = loaded(mode, RocksDurability::None);
            assert_eq!(peer.name(), format!("rocksdb-{}", mode.as_str()));
            let mut s = peer.session(0);
            let ack = s
                .run(false, &mut |tx| {
                    assert_eq!(tx.get(&key(7))?, Some(Bytes::from_static(b"v7")));
                    tx.put(&key(7), b"seven")?;
                    // A transaction reads its own writes.
                    assert_eq!(tx.get(&key(7))?, Some(Bytes::from_static(b"seven")));
                    tx.delete(&key(8))?;
                    assert_eq!(tx.get(&key(8))?, None);
                    let scan = tx.scan(&key(6), 3)?;
                    let keys: Vec<_> = scan.iter().map(|(k, _)| k.to_vec()).collect();
                    assert_eq!(keys, vec![key(6), key(7), key(9)]);
                    assert_eq!(scan[1].1, Bytes::from_static(b"seven"));
                    tx.put(b"new", b"n")
                })
                .expect("commit");
            assert_eq!(ack, Ack::Now);
            s.run(true, &mut |tx| {
                assert_eq!(tx.get(&key(7))?, Some(Bytes::from_static(b"seven")));
                assert_eq!(tx.get(&key(8))?, None);
                assert_eq!(tx.get(b"new")?, Some(Bytes::from_static(b"n")));
                assert_eq!(tx.scan(b"", 1000)?.len(), 100);
                assert_eq!(tx.put(b"x", b"y"), Err(TxAbort { reason: "write-in-read-only" }));
                Ok(())
            })
            .expect("read-only");
            // An aborted body leaves no effect.
            let err = s.run(false, &mut |tx| {
                tx.put(&key(1), b"gone")?;
                Err(TxAbort { reason: "business" })
            });
            assert_eq!(err, Err(TxAbort { reason: "business" }));
            s.run(true, &mut |tx| {
                assert_eq!(tx.get(&key(1))?, Some(Bytes::from_static(b"v1")));
                Ok(())
            })
            .expect("read-only");
            assert_eq!(peer.unexpected_errors(), 0);
        }
    }

    #[test]
    fn optimistic_read_write_conflict_aborts() {
        let peer = loaded(RocksMode::Optimistic, RocksDurability::None);
        let (mut a, mut b) = (peer.session(0), peer.session(1));
        let result = a.run(false, &mut |tx| {
            let v = tx.get(&key(1))?;
            // Another transaction commits a write to the key `a` read.
            b.run(false, &mut |tx2| tx2.put(&key(1), b"b")).expect("b commits");
            tx.put(&key(2), &v.unwrap_or_default())
        });
        assert_eq!(result, Err(TxAbort { reason: "conflict" }));
        // Write-write on a key `a` never read is caught too (it is validated against the
        // snapshot `a` began with).
        let result = a.run(false, &mut |tx| {
            b.run(false, &mut |tx2| tx2.put(&key(3), b"b")).expect("b commits");
            tx.put(&key(3), b"a")
        });
        assert_eq!(result, Err(TxAbort { reason: "conflict" }));
        a.run(true, &mut |tx| {
            assert_eq!(tx.get(&key(2))?, Some(Bytes::from_static(b"v2")));
            assert_eq!(tx.get(&key(3))?, Some(Bytes::from_static(b"b")));
            Ok(())
        })
        .expect("read-only");
    }

    #[test]
    fn pessimistic_lock_conflict_and_stale_snapshot_abort() {
        let peer = loaded(RocksMode::Pessimistic, RocksDurability::None);
        let (mut a, mut b) = (peer.session(0), peer.session(1));
        // `a` holds the lock on key 1; `b` fails at once (no-wait).
        a.run(false, &mut |tx| {
            tx.get(&key(1))?;
            let blocked = b.run(false, &mut |tx2| tx2.put(&key(1), b"b"));
            assert_eq!(blocked, Err(TxAbort { reason: "lock-timeout" }));
            let blocked = b.run(false, &mut |tx2| tx2.get(&key(1)).map(drop));
            assert_eq!(blocked, Err(TxAbort { reason: "lock-timeout" }));
            tx.put(&key(1), b"a")
        })
        .expect("a commits");
        // `b` commits key 2 after `a`'s snapshot: `a`'s read of key 2 is a conflict.
        let result = a.run(false, &mut |tx| {
            b.run(false, &mut |tx2| tx2.put(&key(2), b"b")).expect("b commits");
            tx.get(&key(2)).map(drop)
        });
        assert_eq!(result, Err(TxAbort { reason: "conflict" }));
        assert_eq!(peer.unexpected_errors(), 0);
    }

    #[test]
    fn pessimistic_shared_read_locks() {
        let options = RocksOptions { shared_read_locks: true, ..small(RocksMode::Pessimistic, RocksDurability::None) };
        let peer = RocksPeer::open_temp(options).expect("open");
        let (mut a, mut b) = (peer.session(0), peer.session(1));
        a.run(false, &mut |tx| {
            tx.get(b"k")?;
            // Two readers share the lock; a writer is refused.
            b.run(false, &mut |tx2| tx2.get(b"k").map(drop)).expect("shared read");
            let blocked = b.run(false, &mut |tx2| tx2.put(b"k", b"b"));
            assert_eq!(blocked, Err(TxAbort { reason: "lock-timeout" }));
            Ok(())
        })
        .expect("a commits");
    }

    #[test]
    fn group_commit_tickets_become_durable() {
        for mode in MODES {
            let peer = loaded(mode, RocksDurability::Group);
            let mut s = peer.session(0);
            let mut last = 0;
            for i in 0..50 {
                match s.run(false, &mut |tx| tx.put(&key(i), b"g")).expect("commit") {
                    Ack::After(ticket) => {
                        assert!(ticket > last, "tickets increase");
                        last = ticket;
                    }
                    Ack::Now => panic!("group mode acknowledges after a WAL sync"),
                }
            }
            assert_eq!(s.run(true, &mut |tx| tx.get(&key(0)).map(drop)), Ok(Ack::Now));
            let deadline = Instant::now() + Duration::from_secs(20);
            while s.durable_ticket() < last {
                assert!(Instant::now() < deadline, "ticket {last} never became durable");
                thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn reopen_sees_committed_data() {
        for mode in MODES {
            for durability in [RocksDurability::None, RocksDurability::Every, RocksDurability::Group] {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("db");
                {
                    let peer = RocksPeer::open(&path, small(mode, durability)).expect("open");
                    peer.load(&mut (0..10).map(|i| (key(i), b"loaded".to_vec()))).expect("load");
                    let mut s = peer.session(0);
                    s.run(false, &mut |tx| {
                        tx.put(&key(1), b"committed")?;
                        tx.delete(&key(2))
                    })
                    .expect("commit");
                }
                let peer = RocksPeer::open(&path, small(mode, durability)).expect("reopen");
                let mut s = peer.session(0);
                s.run(true, &mut |tx| {
                    assert_eq!(tx.get(&key(0))?, Some(Bytes::from_static(b"loaded")));
                    assert_eq!(tx.get(&key(1))?, Some(Bytes::from_static(b"committed")));
                    assert_eq!(tx.get(&key(2))?, None);
                    Ok(())
                })
                .expect("read-only");
            }
        }
    }

    #[test]
    fn runner_drives_the_transfer_workload() {
        use crate::kv::runner::{self, RunOptions};
        use crate::kv::transfer::{self, TransferConfig, TransferWorkload};
        for mode in MODES {
            let peer = peer(mode, RocksDurability::Group);
            let config = TransferConfig { accounts: 64, zipf: 0.9, ..TransferConfig::default() };
            let workload = TransferWorkload::new(config).expect("workload");
            runner::load(&workload, &peer).expect("load");
            let options = RunOptions {
                threads: 4,
                duration: Duration::from_millis(300),
                seed: 7,
                progress: false,
                durable_lines: false,
            };
            let report = runner::run(&workload, &peer, &options);
            eprintln!("{}", report.summary());
            assert!(report.committed > 0, "{}", report.summary());
            for reason in report.abort_reasons.keys() {
                assert!(["conflict", "lock-timeout", "try-again"].contains(&reason.as_str()), "{reason}");
            }
            let mut s = peer.session(0);
            s.run(true, &mut |tx| {
                let mut total = 0u128;
                for id in 0..64 {
                    let value = tx.get(&transfer::key(id))?.expect("account");
                    total += u128::from(transfer::decode_balance(&value).expect("balance"));
                }
                assert_eq!(total, workload.expected_total());
                Ok(())
            })
            .expect("audit");
            assert_eq!(peer.unexpected_errors(), 0);
        }
    }

    #[test]
    fn concurrent_transfers_conserve_the_total() {
        for mode in MODES {
            let peer = peer(mode, RocksDurability::None);
            let accounts = 8usize;
            peer.load(&mut (0..accounts).map(|i| (key(i), 100u64.to_le_bytes().to_vec()))).expect("load");
            let read = |v: Option<Bytes>| u64::from_le_bytes(v.expect("present")[..8].try_into().expect("8 bytes"));
            thread::scope(|scope| {
                for client in 0..4 {
                    let mut s = peer.session(client);
                    scope.spawn(move || {
                        let mut commits = 0;
                        let mut i = client;
                        while commits < 200 {
                            i += 1;
                            let (from, to) = (key(i % accounts), key((i * 7 + 3) % accounts));
                            if from == to {
                                continue;
                            }
                            let r = s.run(false, &mut |tx| {
                                let a = read(tx.get(&from)?);
                                let b = read(tx.get(&to)?);
                                if a == 0 {
                                    return Ok(());
                                }
                                tx.put(&from, &(a - 1).to_le_bytes())?;
                                tx.put(&to, &(b + 1).to_le_bytes())
                            });
                            match r {
                                Ok(_) => commits += 1,
                                Err(TxAbort { reason: "conflict" | "lock-timeout" | "try-again" }) => {}
                                Err(other) => panic!("unexpected abort {other:?}"),
                            }
                        }
                    });
                }
            });
            let mut s = peer.session(0);
            s.run(true, &mut |tx| {
                let total: u64 = tx.scan(b"", 100)?.into_iter().map(|(_, v)| read(Some(v))).sum();
                assert_eq!(total, 100 * accounts as u64);
                Ok(())
            })
            .expect("read-only");
            assert_eq!(peer.unexpected_errors(), 0);
        }
    }
}
