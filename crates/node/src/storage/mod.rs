//! RainBlock's storage node: serves shards of the bottom layer at every retained version.
//!
//! Each version is one block's state of the served shards (the other shards known only by
//! their subtree hashes, enough to prove through the global root). Versions share nodes:
//! a block copies only the paths its updates touch, so forks cost little and never lock.
//! A block is accepted only if its header is valid on its parent (number, parent hash,
//! timestamp, difficulty, work), its updates touch only served shards, the served shards'
//! new hashes are the announced ones, and the announced hashes assemble to the header's
//! state root. It is then logged (fsync) before the acknowledgement.

#[cfg(test)]
mod contract_tests;
mod contracts;
mod core;
mod disk;
mod node;
mod versions;

#[cfg(feature = "fault-injection")]
pub use self::core::StorageFault;
pub use self::core::{StorageCore, StorageIo, StorageIoDone};
pub use contracts::{ContractRefusal, Contracts};
pub use disk::StorageDisk;
pub use node::{open_core, NodeStorage, Opened, StorageNode};
pub use versions::{BlockRefusal, ReadRefusal, Served};

use crate::messages::BlockUpdates;
use crate::protocol::{refusal, Rainblock, Request, Response};
use alloy_consensus::Header;
use alloy_primitives::B256;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use virga_ledger::verify::ChainConfig;
use virga_net::role::{CallId, Command, Event, IoExecutor, Role};
use virga_net::{BoxFuture, Handler};
use virga_trie::account::StateTrie;
use virga_trie::shard::{Shard, ShardedTrie};
use virga_trie::Trie;

use crate::checkpoint::{self, CheckpointError};
use prost::Message;
use versions::Versions;
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
    let wire = crate::proto::BlockUpdates::decode(payload).map_err(|source| StorageError::LogRecord { lsn, source })?;
    crate::codec::block_updates_from_wire(wire)
        .map_err(|source| StorageError::LoggedBlock { lsn, source: BlockRefusal::Wire(source) })
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

/// How a node uses its log directory.
pub enum LogAccess<'a> {
    None,
    /// Recovers it, appends to it, writes checkpoints beside it and cuts it below them.
    Owned(&'a Path, LogOptions),
    /// Reads it and its checkpoints, changing nothing (the audit).
    ReadOnly(&'a Path),
}

/// Why a storage node cannot open, recover or checkpoint, or did not take a block.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("shard count {0} is not 1, 16 or 256")]
    ShardCount(usize),
    #[error("shard {0} does not exist")]
    NoShard(usize),
    #[error("splitting the state into shards: {0}")]
    Shard(#[from] virga_trie::shard::ShardError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("replaying the log: log record {lsn} is not a block's updates: {source}")]
    LogRecord {
        lsn: u64,
        #[source]
        source: prost::DecodeError,
    },
    #[error("replaying the log: record {lsn}: {source}")]
    LoggedBlock {
        lsn: u64,
        #[source]
        source: BlockRefusal,
    },
    #[error(
        "replaying the log: the log starts at record {first_lsn}: the blocks before it were cut below a \
         checkpoint, and no checkpoint beside the log is sound"
    )]
    CutBelowMissingCheckpoint { first_lsn: u64 },
    #[error("this node keeps no log, so no checkpoint")]
    NoLog,
    #[error("the head version is not held")]
    HeadNotHeld,
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Refused(#[from] BlockRefusal),
    /// A block the node took but did not acknowledge: its answer (its log failed).
    #[error("the storage node did not acknowledge the block: {reason}")]
    Unacknowledged { reason: String },
}

/// A whole state split for storage nodes: the account trie in shards, and the contracts'
/// storage and code (each contract with its account's shard).
#[derive(Clone)]
pub struct ShardedState {
    pub accounts: ShardedTrie,
    pub contracts: Contracts,
}

impl ShardedState {
    /// Accounts alone (no contract storage or code).
    pub fn of_accounts(accounts: ShardedTrie) -> ShardedState {
        ShardedState { accounts, contracts: Contracts::default() }
    }
}

/// Splits a genesis state (accounts, storage and code) into `shard_count` shards.
pub fn shard_genesis(state: &StateTrie, shard_count: usize) -> Result<ShardedState, StorageError> {
    let accounts = shard_state(state.accounts().as_trie(), shard_count)?;
    let prefix = prefix_nibbles(shard_count).ok_or(StorageError::ShardCount(shard_count))?;
    let every: Vec<usize> = (0..shard_count).collect();
    Ok(ShardedState { accounts, contracts: Contracts::of_state(state, &every, prefix) })
}

/// Splits a whole state trie into `shard_count` shards, building the shards in parallel.
pub fn shard_state(state: &Trie, shard_count: usize) -> Result<ShardedTrie, StorageError> {
    use rayon::prelude::*;
    let prefix = prefix_nibbles(shard_count).ok_or(StorageError::ShardCount(shard_count))?;
    let mut groups: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![Vec::new(); shard_count];
    for (key, value) in state.entries() {
        let index = virga_trie::shard::shard_of(&key, prefix)?;
        groups[index].push((key, value));
    }
    let shards = groups
        .into_par_iter()
        .enumerate()
        .map(|(index, pairs)| {
            let mut shard = Shard::new(index, prefix);
            for (key, value) in pairs {
                shard.insert(&key, &value)?;
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
