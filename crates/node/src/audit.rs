//! Audits a cluster directory written by `virga up`: the miner's chain is verified from
//! genesis (every header, work, signature and re-executed root), then every storage node is
//! rebuilt as it would restart — from its newest sound checkpoint, or the genesis state, and
//! the blocks logged after it, each checked against its header's root — and the nodes'
//! shards at the chain's head must assemble, together, into the head's state root (replicas
//! of a shard must agree on it).

use alloy_primitives::B256;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use virga_ledger::chain::{read_genesis, stored_blocks, verify_blocks, AuditSummary};
use virga_ledger::verify::ExecMode;
use virga_trie::shard::{Shard, ShardedTrie};

use crate::cluster::{check_cluster_format, cluster_format_v1, ClusterError, CLUSTER_FILE};
use crate::storage::{log_path, prefix_nibbles, shard_genesis, LogAccess, StorageError, StorageNode};

/// What an audit found wrong with a cluster directory, or could not read in it.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    ClusterFile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Format(#[from] ClusterError),
    #[error("{}: shard count {shards} is not 1, 16 or 256", .path.display())]
    ShardCount { path: PathBuf, shards: usize },
    /// The genesis, or the chain verified from it.
    #[error(transparent)]
    Chain(#[from] virga_ledger::chain::ChainError),
    #[error(transparent)]
    Storage(Box<StorageError>),
    #[error("{id}: no log at {}", .log.display())]
    NoLog { id: String, log: PathBuf },
    #[error("{id}: {source}")]
    StorageNode {
        id: String,
        #[source]
        source: Box<StorageError>,
    },
    #[error("{id}: its log does not reach the chain's head, block {number} ({hash})")]
    BehindHead { id: String, number: u64, hash: B256 },
    #[error("{id} and {other} disagree on shard {shard} at block {number}: {} and {}", .hashes.0, .hashes.1)]
    ReplicasDisagree {
        id: String,
        other: String,
        shard: usize,
        number: u64,
        /// `id`'s hash of the shard, then `other`'s.
        hashes: Box<(B256, B256)>,
    },
    #[error("{id}: shard {shard} does not exist")]
    NoShard { id: String, shard: usize },
    #[error("no storage node serves shard {0}")]
    Unserved(usize),
    #[error("{0}")]
    Shards(#[source] virga_trie::shard::ShardError),
    #[error("the storage nodes' shards at block {number} give state root {assembled}, the chain's is {chain}")]
    StateRoot { number: u64, assembled: B256, chain: B256 },
}

#[derive(Deserialize)]
struct ClusterFile {
    #[serde(default = "cluster_format_v1")]
    format: u32,
    shards: usize,
    storage_nodes: Vec<(String, Vec<usize>)>,
}

/// What a cluster audit checked.
#[derive(Debug)]
pub struct ClusterAudit {
    pub chain: AuditSummary,
    pub storage_nodes: usize,
    /// Blocks replayed from the storage nodes' logs, all nodes together.
    pub logged_blocks: u64,
    /// Storage nodes rebuilt from a checkpoint (the others from the genesis state).
    pub from_checkpoints: usize,
}

/// Whether `dir` is a cluster directory.
pub fn is_cluster_dir(dir: &Path) -> bool {
    dir.join(CLUSTER_FILE).exists()
}

pub fn audit_cluster(
    dir: &Path,
    pool: &rayon::ThreadPool,
    progress: &mut dyn FnMut(u64),
) -> Result<ClusterAudit, AuditError> {
    let path = dir.join(CLUSTER_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| AuditError::Read { path: path.clone(), source })?;
    let cluster: ClusterFile =
        serde_json::from_str(&text).map_err(|source| AuditError::ClusterFile { path: path.clone(), source })?;
    check_cluster_format(&path, cluster.format)?;
    let prefix = prefix_nibbles(cluster.shards).ok_or(AuditError::ShardCount { path, shards: cluster.shards })?;
    let genesis = read_genesis(dir)?;
    let sharded = shard_genesis(&genesis.state, cluster.shards).map_err(|error| AuditError::Storage(error.into()))?;
    let verified = verify_blocks(&genesis, stored_blocks(dir), ExecMode::Parallel, pool, progress)?;
    let head = verified.summary.head_hash;
    let head_number = verified.summary.head_number;

    let mut shard_hashes: Vec<Option<(String, B256)>> = vec![None; cluster.shards];
    let mut logged_blocks = 0;
    let mut from_checkpoints = 0;
    for (id, served) in &cluster.storage_nodes {
        let log = log_path(dir, id);
        if !log.is_dir() {
            return Err(AuditError::NoLog { id: id.clone(), log });
        }
        // Read only: a torn tail is left for the node itself to cut when it restarts.
        let (node, replayed) = StorageNode::open_with(
            id.clone(),
            served.clone(),
            cluster.shards,
            genesis.config,
            genesis.header.clone(),
            &sharded,
            LogAccess::ReadOnly(&log),
        )
        .map_err(|source| AuditError::StorageNode { id: id.clone(), source: source.into() })?;
        logged_blocks += replayed;
        from_checkpoints += usize::from(node.stats().opened_from_checkpoint.is_some());
        let hashes = node.shard_hashes(&head).ok_or_else(|| AuditError::BehindHead {
            id: id.clone(),
            number: head_number,
            hash: head,
        })?;
        for (index, hash) in hashes {
            // Replicas of a shard must agree on it.
            match shard_hashes.get_mut(index) {
                Some(Some((other, held))) if *held != hash => {
                    return Err(AuditError::ReplicasDisagree {
                        id: id.clone(),
                        other: other.clone(),
                        shard: index,
                        number: head_number,
                        hashes: Box::new((hash, *held)),
                    })
                }
                Some(slot) => *slot = Some((id.clone(), hash)),
                None => return Err(AuditError::NoShard { id: id.clone(), shard: index }),
            }
        }
    }
    let shards = shard_hashes
        .into_iter()
        .enumerate()
        .map(|(index, hash)| {
            hash.map(|(_, hash)| Shard::known_by_hash(index, prefix, hash)).ok_or(AuditError::Unserved(index))
        })
        .collect::<Result<Vec<_>, AuditError>>()?;
    let assembled = ShardedTrie::from_shards(shards).map_err(AuditError::Shards)?.root_hash();
    if assembled != verified.summary.state_root {
        return Err(AuditError::StateRoot { number: head_number, assembled, chain: verified.summary.state_root });
    }
    Ok(ClusterAudit {
        chain: verified.summary,
        storage_nodes: cluster.storage_nodes.len(),
        logged_blocks,
        from_checkpoints,
    })
}
