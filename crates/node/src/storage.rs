//! RainBlock's storage node: serves shards of the bottom layer at every retained version.
//!
//! Each version is one block's state of the served shards (the other shards known only by
//! their subtree hashes, enough to prove through the global root). Versions share nodes:
//! a block copies only the paths its updates touch, so forks cost little and never lock.
//! A block is accepted only if its header is valid on its parent (number, parent hash,
//! timestamp, difficulty, work), its updates touch only served shards, the served shards'
//! new hashes are the announced ones, and the announced hashes assemble to the header's
//! state root. It is then logged (fsync) before the acknowledgement.

use alloy_consensus::Header;
use alloy_primitives::B256;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virga_ledger::verify::{check_header, ChainConfig};
use virga_net::proto::{self, BlockUpdates};
use virga_net::{refusal, response, BoxFuture, Handler, Request, RequestBody, Response, ResponseBody};
use virga_trie::shard::{Shard, ShardedTrie};
use virga_trie::Trie;

use crate::checkpoint;
use crate::codec::{b256, bag_to_wire, block_id, check_keys, decode_header, parse_block_id};
use prost::Message;
use virga_core::device::{FileStorage, SharedStorage, Storage};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, SyncPolicy};

/// A storage node's log directory (segments of virga-log) inside its own directory.
pub const LOG_DIR: &str = "updates";

/// The log of storage node `id` in a cluster directory.
pub fn log_path(cluster_dir: &Path, id: &str) -> PathBuf {
    cluster_dir.join(id).join(LOG_DIR)
}

/// Every accepted block's updates are fsynced before the node acknowledges the block.
/// Segments are small so that the log can be cut soon after a checkpoint covers it.
pub fn log_options() -> LogOptions {
    LogOptions { sync: SyncPolicy::Every, segment_bytes: LOG_SEGMENT_BYTES, ..LogOptions::default() }
}

/// Size of a storage log's segment files: the unit in which the log is cut.
pub const LOG_SEGMENT_BYTES: u64 = 4 << 20;

/// A logged record: the `BlockUpdates` as the node accepted it.
pub fn decode_logged(record: &virga_log::Record) -> Result<BlockUpdates, StorageError> {
    decode_logged_payload(record.lsn, &record.payload)
}

/// The payload of log record `lsn` as the `BlockUpdates` the node accepted.
pub fn decode_logged_payload(lsn: u64, payload: &[u8]) -> Result<BlockUpdates, StorageError> {
    BlockUpdates::decode(payload)
        .map_err(|error| StorageError::Replay(format!("log record {lsn} is not a block's updates: {error}")))
}

/// The storage holding a node's log at `path` and its checkpoints (the log's parent
/// directory), and the log's own storage. A node that owns the log creates what is missing;
/// a reader creates nothing.
fn storage_of_log(path: &Path, owned: bool) -> Result<(SharedStorage, SharedStorage), StorageError> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let failed = |source: std::io::Error| {
        StorageError::Log(LogError::Io { op: "open the storage of", path: path.to_path_buf(), source })
    };
    if owned {
        let node_storage = FileStorage::create_dir_all(parent).map_err(failed)?;
        let log_storage = FileStorage::create_dir_all(path).map_err(failed)?;
        Ok((Arc::new(node_storage), Arc::new(log_storage)))
    } else {
        Ok((Arc::new(FileStorage::new(parent)), Arc::new(FileStorage::new(path))))
    }
}

fn log_cut_below_missing_checkpoint(first_lsn: u64) -> StorageError {
    StorageError::Replay(format!(
        "the log starts at record {first_lsn}: the blocks before it were cut below a checkpoint, and no \
         checkpoint beside the log is sound"
    ))
}

/// How many blocks below the head a storage node keeps versions for.
pub const DEFAULT_RETAINED_VERSIONS: u64 = 64;
/// A fork is abandoned (and its versions collected) once the head is this many blocks past it.
pub const FORK_DEPTH: u64 = 2;
/// Blocks between checkpoints of a node with a log (0: none).
pub const DEFAULT_CHECKPOINT_INTERVAL: u64 = 64;
/// A checkpoint is of the head's ancestor this many blocks down: far below any fork a
/// restarted miner can start, so the checkpointed block stays canonical.
pub const CHECKPOINT_LAG: u64 = 8;

/// Nibbles of shard prefix for a shard count (1, 16 or 256).
pub fn prefix_nibbles(shard_count: usize) -> Option<usize> {
    match shard_count {
        1 => Some(0),
        16 => Some(1),
        256 => Some(2),
        _ => None,
    }
}

struct Version {
    header: Header,
    shards: ShardedTrie,
}

struct Versions {
    by_hash: HashMap<B256, Version>,
    head: B256,
    head_number: u64,
}

/// A storage node's deliberate misbehaviour, for the trust tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageFault {
    /// Honest.
    #[default]
    None,
    /// Every witness bag served has one byte flipped in one of its nodes.
    CorruptWitness,
    /// Every witness is proved from the parent of the version asked for (when held), while
    /// the reply claims the block and state root asked for.
    StaleWitness,
}

/// Counters for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageStats {
    pub blocks_applied: u64,
    pub blocks_rejected: u64,
    pub witnesses_served: u64,
    /// Checkpoints written; a restart from one applies only the blocks logged after it.
    pub checkpoints_written: u64,
    /// The block of the checkpoint this node was opened from, if any.
    pub opened_from_checkpoint: Option<u64>,
    /// Log segments deleted because a checkpoint older than the newest covers them.
    pub log_segments_removed: u64,
    pub fork_versions_collected: u64,
}

/// A node's log, with the block of each record it still holds (in log order), to know where
/// it may be cut.
struct NodeLog {
    log: RecordLog,
    blocks: VecDeque<(u64, u64)>,
}

/// The blocks of the newest checkpoint and the one before it, and the one being written.
#[derive(Default)]
struct Checkpoints {
    newest: Option<u64>,
    previous: Option<u64>,
    writing: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

/// How a node uses its log directory.
pub enum LogAccess<'a> {
    None,
    /// Recovers it, appends to it, writes checkpoints beside it and cuts it below them.
    Owned(&'a Path, LogOptions),
    /// Reads it and its checkpoints, changing nothing (the audit).
    ReadOnly(&'a Path),
}

pub struct StorageNode {
    id: String,
    served: Vec<usize>,
    shard_count: usize,
    config: ChainConfig,
    retained: u64,
    versions: RwLock<Versions>,
    log: Mutex<Option<NodeLog>>,
    /// Where checkpoints are written (None: never).
    /// Where checkpoints go: the storage holding the log (for files, its parent directory).
    checkpoint_storage: Option<Arc<dyn Storage>>,
    checkpoint_interval: AtomicU64,
    checkpoints: Mutex<Checkpoints>,
    stats: Mutex<StorageStats>,
    #[cfg(feature = "fault-injection")]
    fault: Mutex<StorageFault>,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("shard count {0} is not 1, 16 or 256")]
    ShardCount(usize),
    #[error("shard {0} does not exist")]
    NoShard(usize),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("replaying the log: {0}")]
    Replay(String),
}

impl StorageNode {
    /// A node serving `served` of `shard_count` shards of `genesis_state` (the node keeps its
    /// shards and only the others' hashes), logging to `log_path` and replaying what the log
    /// already holds: from the newest sound checkpoint beside the log (a damaged one is
    /// refused with a warning and set aside), applying only the blocks logged after it.
    /// Returns the node and the number of blocks applied from the log.
    pub fn open(
        id: impl Into<String>,
        served: Vec<usize>,
        shard_count: usize,
        config: ChainConfig,
        genesis: Header,
        genesis_state: &ShardedTrie,
        log_path: Option<&Path>,
    ) -> Result<(Arc<StorageNode>, u64), StorageError> {
        let access = log_path.map_or(LogAccess::None, |path| LogAccess::Owned(path, log_options()));
        Self::open_with(id, served, shard_count, config, genesis, genesis_state, access)
    }

    /// [`Self::open`] with the log used as `access` says: owned with other options (tests use
    /// small segments), or read only, changing nothing on disk and keeping no log
    /// afterwards (the audit of a log its node may still own).
    pub fn open_with(
        id: impl Into<String>,
        served: Vec<usize>,
        shard_count: usize,
        config: ChainConfig,
        genesis: Header,
        genesis_state: &ShardedTrie,
        access: LogAccess<'_>,
    ) -> Result<(Arc<StorageNode>, u64), StorageError> {
        let prefix = prefix_nibbles(shard_count).ok_or(StorageError::ShardCount(shard_count))?;
        if let Some(&bad) = served.iter().find(|&&index| index >= shard_count) {
            return Err(StorageError::NoShard(bad));
        }
        if genesis_state.shard_count() != shard_count {
            return Err(StorageError::ShardCount(genesis_state.shard_count()));
        }
        let shards = keep_served(genesis_state, &served, prefix)?;
        let genesis_hash = genesis.hash_slow();
        let versions = Versions {
            by_hash: HashMap::from([(genesis_hash, Version { header: genesis, shards })]),
            head: genesis_hash,
            head_number: 0,
        };
        let node = StorageNode {
            id: id.into(),
            served,
            shard_count,
            config,
            retained: DEFAULT_RETAINED_VERSIONS,
            versions: RwLock::new(versions),
            log: Mutex::new(None),
            checkpoint_storage: None,
            checkpoint_interval: AtomicU64::new(DEFAULT_CHECKPOINT_INTERVAL),
            checkpoints: Mutex::new(Checkpoints::default()),
            stats: Mutex::new(StorageStats::default()),
            #[cfg(feature = "fault-injection")]
            fault: Mutex::new(StorageFault::None),
        };
        let (path, options) = match access {
            LogAccess::None => return Ok((Arc::new(node), 0)),
            LogAccess::Owned(path, options) => (path, Some(options)),
            LogAccess::ReadOnly(path) => (path, None),
        };
        let owned = options.is_some();
        let (node_storage, log_storage) = storage_of_log(path, owned)?;
        let mut node = node;
        if owned {
            node.checkpoint_storage = Some(Arc::clone(&node_storage));
        }
        let base = node.load_checkpoint(&*node_storage, owned);
        let (options, mode) = match options {
            Some(options) => (options, OpenMode::Repair),
            None => (log_options(), OpenMode::ReadOnly),
        };
        // Blocks are replayed as the log's index is built, one record at a time.
        let mut blocks = VecDeque::new();
        let mut replayed = 0;
        let mut failure = None;
        let (log, recovered) = RecordLog::open_with(log_storage, options, mode, |lsn, payload| {
            if failure.is_some() {
                return;
            }
            if blocks.is_empty() && base.is_none() && lsn > 1 {
                failure = Some(log_cut_below_missing_checkpoint(lsn));
                return;
            }
            match node.replay_logged(base, lsn, payload) {
                Ok((number, applied)) => {
                    blocks.push_back((number, lsn));
                    replayed += u64::from(applied);
                }
                Err(error) => failure = Some(error),
            }
        })?;
        if let Some(error) = failure {
            return Err(error);
        }
        if base.is_none() && recovered.first_lsn > 1 {
            return Err(log_cut_below_missing_checkpoint(recovered.first_lsn));
        }
        let log = (mode == OpenMode::Repair).then_some(log);
        *node.log.lock() = log.map(|log| NodeLog { log, blocks });
        Ok((Arc::new(node), replayed))
    }

    /// Replays one logged block on top of the checkpoint at block `base` (if any); returns
    /// the block's number and whether it was applied (it is skipped when the checkpoint
    /// holds it already, or when it lies on a fork that left the chain below the checkpoint).
    fn replay_logged(&self, base: Option<u64>, lsn: u64, payload: &[u8]) -> Result<(u64, bool), StorageError> {
        let record = decode_logged_payload(lsn, payload)?;
        let header = decode_header(&record.header).map_err(StorageError::Replay)?;
        if let Some(base) = base {
            if header.number <= base || !self.versions.read().by_hash.contains_key(&header.parent_hash) {
                return Ok((header.number, false));
            }
        }
        self.accept(&record).map_err(StorageError::Replay)?;
        Ok((header.number, true))
    }

    /// Makes the newest sound checkpoint beside the log (at `newest`, else the previous one)
    /// the head version, and returns its block number. A node that owns the log sets a
    /// damaged newest checkpoint aside, so the next one does not push the sound one out.
    fn load_checkpoint(&self, storage: &dyn Storage, owned: bool) -> Option<u64> {
        for name in [checkpoint::CHECKPOINT_FILE, checkpoint::PREVIOUS_FILE] {
            match storage.exists(name) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => {
                    tracing::warn!(node = %self.id, path = %storage.path_of(name).display(), %error, "checkpoint unreadable");
                    continue;
                }
            }
            match checkpoint::read(storage, name, &self.served, self.shard_count) {
                Ok(loaded) => {
                    let number = loaded.header.number;
                    let mut versions = self.versions.write();
                    versions.by_hash.insert(loaded.hash, Version { header: loaded.header, shards: loaded.shards });
                    versions.head = loaded.hash;
                    versions.head_number = number;
                    self.checkpoints.lock().newest = Some(number);
                    self.stats.lock().opened_from_checkpoint = Some(number);
                    return Some(number);
                }
                Err(reason) => {
                    tracing::warn!(node = %self.id, path = %storage.path_of(name).display(), %reason, "checkpoint unusable");
                    if owned && name == checkpoint::CHECKPOINT_FILE {
                        if let Err(error) = storage.rename(name, checkpoint::DAMAGED_FILE) {
                            tracing::warn!(node = %self.id, %error, "setting the damaged checkpoint aside failed");
                        }
                    }
                }
            }
        }
        None
    }

    /// Blocks between checkpoints (0 turns them off).
    pub fn set_checkpoint_interval(&self, blocks: u64) {
        self.checkpoint_interval.store(blocks, Ordering::Relaxed);
    }

    /// The version a checkpoint is taken of: the head's ancestor [`CHECKPOINT_LAG`] blocks
    /// down (or the oldest canonical version held, if fewer).
    fn checkpoint_version(&self) -> Result<(Header, ShardedTrie), String> {
        let versions = self.versions.read();
        let mut version = versions.by_hash.get(&versions.head).ok_or("the head version is not held")?;
        for _ in 0..CHECKPOINT_LAG {
            match versions.by_hash.get(&version.header.parent_hash) {
                Some(parent) => version = parent,
                None => break,
            }
        }
        Ok((version.header.clone(), version.shards.clone()))
    }

    /// Writes a checkpoint now (after any being written in the background; none if the
    /// newest is of the same block), cuts the log below the previous one, and returns the
    /// newest checkpoint's block number.
    pub fn checkpoint_now(&self) -> Result<u64, String> {
        let storage = self.checkpoint_storage.as_ref().ok_or("this node keeps no log, so no checkpoint")?;
        let mut checkpoints = self.checkpoints.lock();
        if let Some(writing) = checkpoints.writing.take() {
            self.finish_checkpoint(&mut checkpoints, writing);
        }
        let (header, shards) = self.checkpoint_version()?;
        if checkpoints.newest == Some(header.number) {
            return Ok(header.number);
        }
        checkpoint::write(&**storage, &header, &shards, &self.served)?;
        self.checkpoint_written(&mut checkpoints, header.number);
        Ok(header.number)
    }

    /// Once the head is an interval past the newest checkpoint, starts writing the next one
    /// on a thread of its own (encoding and fsyncing a few MB stays off the block's
    /// acknowledgement); a finished one is taken up on a later block. A failure is logged
    /// and never refuses a block.
    fn maybe_checkpoint(&self) {
        let interval = self.checkpoint_interval.load(Ordering::Relaxed);
        let Some(storage) = self.checkpoint_storage.clone().filter(|_| interval > 0) else {
            return;
        };
        let mut checkpoints = self.checkpoints.lock();
        match checkpoints.writing.take() {
            Some(writing) if writing.is_finished() => self.finish_checkpoint(&mut checkpoints, writing),
            Some(writing) => {
                checkpoints.writing = Some(writing);
                return;
            }
            None => {}
        }
        let head = self.versions.read().head_number;
        let due = checkpoints.newest.unwrap_or(0).saturating_add(interval).saturating_add(CHECKPOINT_LAG);
        if head < due {
            return;
        }
        let (header, shards) = match self.checkpoint_version() {
            Ok(version) => version,
            Err(reason) => return tracing::warn!(node = %self.id, %reason, "checkpoint skipped"),
        };
        let served = self.served.clone();
        let spawned = std::thread::Builder::new().name(format!("{}-checkpoint", self.id)).spawn(move || {
            checkpoint::write(&*storage, &header, &shards, &served)?;
            Ok(header.number)
        });
        match spawned {
            Ok(handle) => checkpoints.writing = Some(handle),
            Err(error) => tracing::warn!(node = %self.id, %error, "starting the checkpoint writer failed"),
        }
    }

    /// Takes up a checkpoint written in the background.
    fn finish_checkpoint(&self, checkpoints: &mut Checkpoints, writing: std::thread::JoinHandle<Result<u64, String>>) {
        match writing.join() {
            Ok(Ok(number)) => self.checkpoint_written(checkpoints, number),
            Ok(Err(reason)) => tracing::warn!(node = %self.id, %reason, "checkpoint failed"),
            Err(_) => tracing::error!(node = %self.id, "the checkpoint writer panicked"),
        }
    }

    /// Checkpoint `number` is the newest: the log is cut below the one before it, which
    /// stays as the fallback should the newest be found damaged.
    fn checkpoint_written(&self, checkpoints: &mut Checkpoints, number: u64) {
        checkpoints.previous = checkpoints.newest.replace(number);
        self.stats.lock().checkpoints_written += 1;
        let Some(previous) = checkpoints.previous else { return };
        let mut guard = self.log.lock();
        let Some(node_log) = guard.as_mut() else { return };
        // Every record before the first one above the previous checkpoint is covered by it
        // (or is of a fork that left the chain below it).
        let cut = node_log
            .blocks
            .iter()
            .find(|(block, _)| *block > previous)
            .map_or(node_log.log.next_lsn(), |&(_, lsn)| lsn);
        match node_log.log.truncate_prefix(cut) {
            Ok(removed) => {
                let first = node_log.log.first_lsn();
                while node_log.blocks.front().is_some_and(|&(_, lsn)| lsn < first) {
                    node_log.blocks.pop_front();
                }
                self.stats.lock().log_segments_removed += removed as u64;
            }
            Err(error) => tracing::warn!(node = %self.id, %error, "cutting the log below a checkpoint failed"),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn served(&self) -> &[usize] {
        &self.served
    }

    pub fn stats(&self) -> StorageStats {
        *self.stats.lock()
    }

    /// Makes this node misbehave (or behave again) from its next reply on.
    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&self, fault: StorageFault) {
        tracing::info!(node = %self.id, ?fault, "fault injected");
        *self.fault.lock() = fault;
    }

    /// The shards a witness is proved from: the version asked for, or under
    /// [`StorageFault::StaleWitness`] its parent's when this node still holds it.
    fn shards_to_prove<'a>(&self, versions: &'a Versions, version: &'a Version) -> &'a ShardedTrie {
        #[cfg(feature = "fault-injection")]
        if *self.fault.lock() == StorageFault::StaleWitness && version.header.number > 0 {
            if let Some(parent) = versions.by_hash.get(&version.header.parent_hash) {
                return &parent.shards;
            }
        }
        let _ = versions; // read only by the stale-witness fault
        &version.shards
    }

    /// Under [`StorageFault::CorruptWitness`], flips the last byte of the bag's last node.
    #[cfg(feature = "fault-injection")]
    fn corrupt_if_faulty(&self, mut bag: virga_trie::proof::NodeBag) -> virga_trie::proof::NodeBag {
        if *self.fault.lock() == StorageFault::CorruptWitness {
            if let Some(byte) = bag.nodes.last_mut().and_then(|node| node.last_mut()) {
                *byte ^= 0x01;
            }
        }
        bag
    }

    /// The head block (highest number applied) and its state root.
    pub fn head(&self) -> (u64, B256, B256) {
        let versions = self.versions.read();
        let root = versions.by_hash.get(&versions.head).map_or(B256::ZERO, |version| version.header.state_root);
        (versions.head_number, versions.head, root)
    }

    /// Versions held (for tests of fork collection).
    pub fn version_count(&self) -> usize {
        self.versions.read().by_hash.len()
    }

    /// Subtree hashes of the served shards at block `hash`.
    pub fn shard_hashes(&self, hash: &B256) -> Option<Vec<(usize, B256)>> {
        let versions = self.versions.read();
        let version = versions.by_hash.get(hash)?;
        Some(
            self.served
                .iter()
                .filter_map(|&index| version.shards.shard(index).map(|shard| (index, shard.subtree_hash())))
                .collect(),
        )
    }

    /// Checks and applies a block's updates as a new version (without logging).
    fn accept(&self, updates: &BlockUpdates) -> Result<(u64, B256, bool), String> {
        let header = decode_header(&updates.header)?;
        let hash = header.hash_slow();
        let parent_shards = {
            let versions = self.versions.read();
            if versions.by_hash.contains_key(&hash) {
                return Ok((header.number, hash, false));
            }
            let Some(parent) = versions.by_hash.get(&header.parent_hash) else {
                return Err(format!(
                    "block {} builds on {}, a block this node does not hold",
                    header.number, header.parent_hash
                ));
            };
            check_header(&self.config, &parent.header, &header)
                .map_err(|problem| format!("block {}: {problem}", header.number))?;
            parent.shards.clone()
        };
        if updates.shard_hashes.len() != self.shard_count {
            return Err(format!(
                "block {} announces {} shard hashes for {} shards",
                header.number,
                updates.shard_hashes.len(),
                self.shard_count
            ));
        }
        let announced = updates
            .shard_hashes
            .iter()
            .enumerate()
            .map(|(index, bytes)| b256(bytes, &format!("shard hash {index}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut shards = parent_shards;
        let mut touched: Vec<Shard> = Vec::new();
        for update in &updates.updates {
            check_keys(std::slice::from_ref(&update.key))?;
            let index = shards.shard_for(&update.key).map_err(|error| error.to_string())?;
            if !self.served.contains(&index) {
                return Err(format!(
                    "update for key {} of shard {index}, not served here",
                    virga_core::hex::encode_prefixed(&update.key)
                ));
            }
            let position = match touched.iter().position(|shard| shard.index() == index) {
                Some(position) => position,
                None => {
                    let shard = shards.shard(index).cloned().ok_or_else(|| format!("no shard {index}"))?;
                    touched.push(shard);
                    touched.len() - 1
                }
            };
            touched[position].insert(&update.key, &update.value).map_err(|error| error.to_string())?;
        }
        for shard in touched {
            shards.set_shard(shard).map_err(|error| error.to_string())?;
        }
        for (index, expected) in announced.iter().enumerate() {
            let Some(shard) = shards.shard(index) else { continue };
            if self.served.contains(&index) {
                let computed = shard.subtree_hash();
                if computed != *expected {
                    return Err(format!(
                        "block {}: shard {index} after the updates has hash {computed}, the block announces {expected}",
                        header.number
                    ));
                }
            } else {
                let prefix = prefix_nibbles(self.shard_count).unwrap_or(0);
                shards.set_shard(Shard::known_by_hash(index, prefix, *expected)).map_err(|error| error.to_string())?;
            }
        }
        let computed = shards.root_hash();
        if computed != header.state_root {
            return Err(format!(
                "block {}: the announced shard hashes give state root {computed}, the header says {}",
                header.number, header.state_root
            ));
        }
        let number = header.number;
        let mut versions = self.versions.write();
        versions.by_hash.insert(hash, Version { header, shards });
        if number > versions.head_number {
            versions.head = hash;
            versions.head_number = number;
        }
        let collected = collect_versions(&mut versions, self.retained);
        self.stats.lock().fork_versions_collected += collected;
        Ok((number, hash, true))
    }

    /// Accepts a block from a miner: check, apply, log (fsync), then acknowledge.
    pub fn apply_block(&self, updates: &BlockUpdates) -> Result<(u64, B256), String> {
        let (number, hash, new) = match self.accept(updates) {
            Ok(accepted) => accepted,
            Err(reason) => {
                self.stats.lock().blocks_rejected += 1;
                return Err(reason);
            }
        };
        if new {
            if let Some(node_log) = self.log.lock().as_mut() {
                match node_log.log.append(&updates.encode_to_vec()) {
                    Ok(lsn) => node_log.blocks.push_back((number, lsn)),
                    Err(error) => {
                        // Not durable, so not acknowledged: forget the version. The log refuses
                        // further appends until the node is restarted (which recovers it).
                        self.versions.write().by_hash.remove(&hash);
                        return Err(format!("logging block {number} failed: {error}"));
                    }
                }
            }
            self.stats.lock().blocks_applied += 1;
            self.maybe_checkpoint();
        }
        Ok((number, hash))
    }

    fn version_for<'a>(&self, versions: &'a Versions, at: Option<(u64, B256)>) -> Result<(B256, &'a Version), String> {
        let hash = at.map_or(versions.head, |(_, hash)| hash);
        match versions.by_hash.get(&hash) {
            Some(version) => Ok((hash, version)),
            None => Err(format!("block {hash} is not held here (collected, or never received)")),
        }
    }

    /// A node bag for `keys` at block `at` (default: head), leaving out levels above `compaction`.
    pub fn witness(&self, request: &proto::WitnessRequest) -> Result<proto::WitnessReply, String> {
        check_keys(&request.keys)?;
        let at = parse_block_id(request.at.as_ref(), "at")?;
        let versions = self.versions.read();
        let (hash, version) = self.version_for(&versions, at)?;
        let shards = self.shards_to_prove(&versions, version);
        let bag = shards
            .try_prove_many(&request.keys, request.compaction as usize)
            .map_err(|error| format!("cannot prove here: {error}"))?;
        #[cfg(feature = "fault-injection")]
        let bag = self.corrupt_if_faulty(bag);
        self.stats.lock().witnesses_served += 1;
        let reply = proto::WitnessReply {
            at: Some(block_id(version.header.number, hash)),
            state_root: version.header.state_root.to_vec(),
            bag: Some(bag_to_wire(&bag)),
        };
        Ok(reply)
    }

    /// The served shards' nodes above level `levels` at block `at` (default: head).
    pub fn top(&self, request: &proto::TopRequest) -> Result<proto::TopReply, String> {
        let at = parse_block_id(request.at.as_ref(), "at")?;
        let versions = self.versions.read();
        let (hash, version) = self.version_for(&versions, at)?;
        Ok(proto::TopReply {
            at: Some(block_id(version.header.number, hash)),
            state_root: version.header.state_root.to_vec(),
            nodes: version.shards.top_nodes(request.levels as usize),
        })
    }
}

/// Drops versions more than `retained` blocks below the head, and versions of forks the
/// head has left [`FORK_DEPTH`] blocks behind. Returns how many were dropped.
fn collect_versions(versions: &mut Versions, retained: u64) -> u64 {
    let head_number = versions.head_number;
    let mut canonical = std::collections::HashSet::new();
    let mut cursor = Some(versions.head);
    while let Some(hash) = cursor {
        canonical.insert(hash);
        cursor = versions.by_hash.get(&hash).filter(|v| v.header.number > 0).map(|v| v.header.parent_hash);
    }
    let before = versions.by_hash.len();
    versions.by_hash.retain(|hash, version| {
        let number = version.header.number;
        let too_old = number + retained < head_number && number > 0;
        let abandoned = !canonical.contains(hash) && number + FORK_DEPTH <= head_number;
        !(too_old || abandoned)
    });
    (before - versions.by_hash.len()) as u64
}

/// Splits a whole state trie into `shard_count` shards, building the shards in parallel.
pub fn shard_state(state: &Trie, shard_count: usize) -> Result<ShardedTrie, StorageError> {
    use rayon::prelude::*;
    let prefix = prefix_nibbles(shard_count).ok_or(StorageError::ShardCount(shard_count))?;
    let mut groups: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![Vec::new(); shard_count];
    for (key, value) in state.entries() {
        let index =
            virga_trie::shard::shard_of(&key, prefix).map_err(|error| StorageError::Replay(error.to_string()))?;
        groups[index].push((key, value));
    }
    let shards = groups
        .into_par_iter()
        .enumerate()
        .map(|(index, pairs)| {
            let mut shard = Shard::new(index, prefix);
            for (key, value) in pairs {
                shard.insert(&key, &value).map_err(|error| StorageError::Replay(error.to_string()))?;
            }
            Ok(shard)
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    ShardedTrie::from_shards(shards).map_err(|_| StorageError::ShardCount(shard_count))
}

/// The served shards of a sharded state, and the others known by their subtree hashes.
fn keep_served(state: &ShardedTrie, served: &[usize], prefix: usize) -> Result<ShardedTrie, StorageError> {
    let shards = (0..state.shard_count())
        .map(|index| {
            let shard = state.shard(index).ok_or(StorageError::NoShard(index))?;
            Ok(if served.contains(&index) {
                shard.clone()
            } else {
                Shard::known_by_hash(index, prefix, shard.subtree_hash())
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    ShardedTrie::from_shards(shards).map_err(|_| StorageError::ShardCount(state.shard_count()))
}

impl Drop for StorageNode {
    /// A checkpoint being written is finished first, so that a node reopened on the same
    /// directory never races it.
    fn drop(&mut self) {
        if let Some(writing) = self.checkpoints.get_mut().writing.take() {
            let _ = writing.join();
        }
    }
}

impl Handler for StorageNode {
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
        let reply = match request.body {
            Some(RequestBody::Witness(request)) => self.witness(&request).map(ResponseBody::Witness),
            Some(RequestBody::Top(request)) => self.top(&request).map(ResponseBody::Top),
            Some(RequestBody::ApplyBlock(updates)) => self
                .apply_block(&updates)
                .map(|(number, hash)| ResponseBody::BlockAck(proto::BlockAck { block: Some(block_id(number, hash)) })),
            Some(RequestBody::Head(_)) => {
                let (number, hash, root) = self.head();
                Ok(ResponseBody::Head(proto::HeadReply {
                    head: Some(block_id(number, hash)),
                    state_root: root.to_vec(),
                }))
            }
            Some(_) | None => Err("storage nodes serve witness, top, apply_block and head requests".to_string()),
        };
        let reply = match reply {
            Ok(body) => response(body),
            Err(reason) => {
                tracing::warn!(node = %self.id, peer = %from, %reason, "refused");
                refusal(reason)
            }
        };
        Box::pin(std::future::ready(reply))
    }
}
