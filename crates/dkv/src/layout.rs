//! The shard map: how keys are partitioned into shards and which nodes replicate each shard.
//!
//! A map is valid when it passes [`ShardMap::check_invariants`]; a map that is also *full*
//! (every group at 2f backups, as [`ShardMap::new`] and [`ShardMap::place`] build it) may be
//! installed in a fresh configuration. Failovers and removals then leave groups degraded,
//! down to a majority (f+1 replicas) and never below.

use alloy_primitives::keccak256;

/// Most shards a map may have: bounds what a decoded map can make a process allocate.
pub const MAX_SHARDS: u32 = 1024;
/// Largest tolerated number of failures per group: at most 2·MAX_F+1 = 9 replicas.
pub const MAX_F: usize = 4;
/// Longest node id, in bytes.
pub const MAX_NODE_ID_BYTES: usize = 64;
/// Longest range split key, in bytes.
pub const MAX_SPLIT_KEY_BYTES: usize = 256;

/// A shard's number: its index in [`ShardMap::groups`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u32);

impl std::fmt::Display for ShardId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "shard {}", self.0)
    }
}

impl ShardId {
    fn index(self) -> usize {
        // u32 always fits the usize of the 32- and 64-bit targets Virga builds for.
        self.0 as usize
    }
}

/// How keys are assigned to shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioning {
    /// Shard = the first 8 bytes of the key's keccak-256, read big-endian as a u64, modulo
    /// `shards`. Keccak-256 and the byte order are fixed, so every process on every platform
    /// maps a key to the same shard; changing this function would move every key.
    Hash { shards: u32 },
    /// Shard i holds the keys in `[splits[i-1], splits[i])` in byte-wise lexicographic order;
    /// shard 0 starts at the empty key and the last shard is unbounded. `splits` is strictly
    /// increasing and holds no empty key (an empty first split would leave shard 0 empty);
    /// there are `splits.len() + 1` shards.
    Range { splits: Vec<Vec<u8>> },
}

impl Partitioning {
    /// The number of shards this partitioning makes (as u64 so a hostile split list cannot
    /// overflow it).
    fn shard_count(&self) -> u64 {
        match self {
            Partitioning::Hash { shards } => u64::from(*shards),
            Partitioning::Range { splits } => splits.len() as u64 + 1,
        }
    }

    fn validate(&self) -> Result<u32, LayoutError> {
        let count = self.shard_count();
        if count == 0 {
            return Err(LayoutError::NoShards);
        }
        if count > u64::from(MAX_SHARDS) {
            return Err(LayoutError::TooManyShards { shards: count, max: MAX_SHARDS });
        }
        if let Partitioning::Range { splits } = self {
            for (index, split) in splits.iter().enumerate() {
                if split.is_empty() {
                    return Err(LayoutError::EmptySplit { index });
                }
                if split.len() > MAX_SPLIT_KEY_BYTES {
                    return Err(LayoutError::SplitTooLong { index, length: split.len(), max: MAX_SPLIT_KEY_BYTES });
                }
                if index > 0 && splits[index - 1] >= *split {
                    return Err(LayoutError::SplitsNotIncreasing { index });
                }
            }
        }
        // Bounded by MAX_SHARDS above.
        Ok(count as u32)
    }

    fn shard_of(&self, key: &[u8]) -> ShardId {
        match self {
            Partitioning::Hash { shards } => ShardId((key_hash(key) % u64::from(*shards)) as u32),
            Partitioning::Range { splits } => {
                // The shard is the number of splits at or below the key.
                ShardId(splits.partition_point(|split| split.as_slice() <= key) as u32)
            }
        }
    }
}

/// The stable hash of [`Partitioning::Hash`]: keccak-256's first 8 bytes, big-endian.
pub fn key_hash(key: &[u8]) -> u64 {
    let digest = keccak256(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// One shard's replicas: a primary and its backups, and the epoch of this membership (raised
/// by every change to the group, so a message stamped with an older epoch is recognised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaGroup {
    pub primary: String,
    pub backups: Vec<String>,
    pub epoch: u64,
}

impl ReplicaGroup {
    /// Primary and backups.
    pub fn replicas(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.primary.as_str()).chain(self.backups.iter().map(String::as_str))
    }

    pub fn contains(&self, node: &str) -> bool {
        self.replicas().any(|replica| replica == node)
    }

    pub fn replica_count(&self) -> usize {
        1 + self.backups.len()
    }
}

/// What a node is in a shard's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaRole {
    Primary,
    Backup,
}

/// What is wrong with a node id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdProblem {
    #[error("the id is empty")]
    Empty,
    #[error("the id is {length} bytes long, more than {max}")]
    TooLong { length: usize, max: usize },
}

/// Checks a node id: non-empty and at most [`MAX_NODE_ID_BYTES`] long.
pub fn check_node_id(node: &str) -> Result<(), NodeIdProblem> {
    if node.is_empty() {
        return Err(NodeIdProblem::Empty);
    }
    if node.len() > MAX_NODE_ID_BYTES {
        return Err(NodeIdProblem::TooLong { length: node.len(), max: MAX_NODE_ID_BYTES });
    }
    Ok(())
}

/// Why a layout is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a layout needs at least one shard")]
    NoShards,
    #[error("{shards} shards, more than the {max} a layout may have")]
    TooManyShards { shards: u64, max: u32 },
    #[error("the partitioning makes {shards} shards but {groups} replica groups were given")]
    GroupCount { shards: u32, groups: usize },
    #[error("f = {f} is more than the {max} failures a group may be sized for")]
    FTooLarge { f: usize, max: usize },
    #[error("a replica count of 0 was asked for; a shard needs an odd number of replicas (2f+1)")]
    ZeroReplicas,
    #[error("a replica count of {replicas} was asked for; it must be odd (2f+1) so a majority survives f failures")]
    EvenReplicaCount { replicas: usize },
    #[error("{shard} has {backups} backups; between {min} and {max} are needed")]
    BackupCount { shard: ShardId, backups: usize, min: usize, max: usize },
    #[error("{shard} lists node {node:?} more than once")]
    DuplicateNode { shard: ShardId, node: String },
    #[error("{shard} has a bad node id: {problem}")]
    BadNodeId { shard: ShardId, problem: NodeIdProblem },
    #[error("node {position} of the node list has a bad id: {problem}")]
    BadNodeInList { position: usize, problem: NodeIdProblem },
    #[error("the node list holds {node:?} more than once")]
    DuplicateNodeInList { node: String },
    #[error("{nodes} nodes cannot hold {needed} distinct replicas per shard")]
    NotEnoughNodes { nodes: usize, needed: usize },
    #[error("range split {index} is the empty key")]
    EmptySplit { index: usize },
    #[error("range split {index} is {length} bytes long, more than {max}")]
    SplitTooLong { index: usize, length: usize, max: usize },
    #[error("range split {index} is not greater than the split before it")]
    SplitsNotIncreasing { index: usize },
}

/// Converts a replica count (2f+1) into f; refuses 0, even counts and counts beyond
/// 2·[`MAX_F`]+1.
pub fn replicas_to_f(replicas: usize) -> Result<usize, LayoutError> {
    if replicas == 0 {
        return Err(LayoutError::ZeroReplicas);
    }
    if replicas % 2 == 0 {
        return Err(LayoutError::EvenReplicaCount { replicas });
    }
    let f = replicas / 2;
    if f > MAX_F {
        return Err(LayoutError::FTooLarge { f, max: MAX_F });
    }
    Ok(f)
}

/// How many backups a group may have when a layout is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backups {
    /// Exactly 2f: a layout as built, before any failure.
    Full,
    /// From f (a majority of 2f+1 replicas left) to 2f: a layout after failovers.
    AtLeastMajority,
}

/// The cluster layout: partitioning, one replica group per shard, f, and a version raised by
/// every change applied to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    pub(crate) version: u64,
    pub(crate) f: usize,
    pub(crate) partitioning: Partitioning,
    pub(crate) groups: Vec<ReplicaGroup>,
}

impl ShardMap {
    /// A full layout at version 1: one group per shard, each of exactly 2f backups.
    pub fn new(partitioning: Partitioning, groups: Vec<ReplicaGroup>, f: usize) -> Result<ShardMap, LayoutError> {
        ShardMap::checked(1, partitioning, groups, f, Backups::Full)
    }

    pub(crate) fn checked(
        version: u64,
        partitioning: Partitioning,
        groups: Vec<ReplicaGroup>,
        f: usize,
        backups: Backups,
    ) -> Result<ShardMap, LayoutError> {
        let map = ShardMap { version, f, partitioning, groups };
        map.validate(backups)?;
        Ok(map)
    }

    /// Places 2f+1 distinct nodes on every shard, round robin: shard i's primary is node
    /// i mod n and its backups the 2f nodes after it (wrapping). Each node is primary of
    /// ⌊s/n⌋ or ⌈s/n⌉ of the s shards, and when s is a multiple of n every node holds the same
    /// number of replicas. Every group starts at epoch 1.
    pub fn place(nodes: &[String], partitioning: Partitioning, f: usize) -> Result<ShardMap, LayoutError> {
        if f > MAX_F {
            return Err(LayoutError::FTooLarge { f, max: MAX_F });
        }
        for (position, node) in nodes.iter().enumerate() {
            check_node_id(node).map_err(|problem| LayoutError::BadNodeInList { position, problem })?;
            if nodes[..position].contains(node) {
                return Err(LayoutError::DuplicateNodeInList { node: node.clone() });
            }
        }
        let needed = 2 * f + 1;
        if nodes.len() < needed {
            return Err(LayoutError::NotEnoughNodes { nodes: nodes.len(), needed });
        }
        let shards = partitioning.validate()? as usize;
        let groups = (0..shards)
            .map(|shard| ReplicaGroup {
                primary: nodes[shard % nodes.len()].clone(),
                backups: (1..needed).map(|offset| nodes[(shard + offset) % nodes.len()].clone()).collect(),
                epoch: 1,
            })
            .collect();
        ShardMap::new(partitioning, groups, f)
    }

    /// [`ShardMap::place`] with the replica count instead of f (odd, see [`replicas_to_f`]).
    pub fn place_replicas(
        nodes: &[String],
        partitioning: Partitioning,
        replicas: usize,
    ) -> Result<ShardMap, LayoutError> {
        ShardMap::place(nodes, partitioning, replicas_to_f(replicas)?)
    }

    pub(crate) fn validate(&self, backups: Backups) -> Result<(), LayoutError> {
        if self.f > MAX_F {
            return Err(LayoutError::FTooLarge { f: self.f, max: MAX_F });
        }
        let shards = self.partitioning.validate()?;
        if self.groups.len() != shards as usize {
            return Err(LayoutError::GroupCount { shards, groups: self.groups.len() });
        }
        let max = 2 * self.f;
        let min = match backups {
            Backups::Full => max,
            Backups::AtLeastMajority => self.f,
        };
        for (index, group) in self.groups.iter().enumerate() {
            let shard = ShardId(index as u32);
            if group.backups.len() < min || group.backups.len() > max {
                return Err(LayoutError::BackupCount { shard, backups: group.backups.len(), min, max });
            }
            for (position, node) in group.replicas().enumerate() {
                check_node_id(node).map_err(|problem| LayoutError::BadNodeId { shard, problem })?;
                if group.replicas().take(position).any(|earlier| earlier == node) {
                    return Err(LayoutError::DuplicateNode { shard, node: node.to_string() });
                }
            }
        }
        Ok(())
    }

    /// The invariants every map holds, installed or after any sequence of applied
    /// configuration commands: a valid partitioning, f within bounds, one group per shard,
    /// each with one primary and f to 2f backups (never less than a majority), no node twice
    /// in a group, every node id valid.
    pub fn check_invariants(&self) -> Result<(), LayoutError> {
        self.validate(Backups::AtLeastMajority)
    }

    /// Whether every group has all its 2f backups.
    pub fn is_full(&self) -> bool {
        self.groups.iter().all(|group| group.backups.len() == 2 * self.f)
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn f(&self) -> usize {
        self.f
    }

    pub fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    pub fn groups(&self) -> &[ReplicaGroup] {
        &self.groups
    }

    /// The shard holding `key` (see [`Partitioning`] for the functions).
    pub fn shard_of(&self, key: &[u8]) -> ShardId {
        self.partitioning.shard_of(key)
    }

    /// The shards holding keys in `[start, end)` (`end` None: unbounded), in order: every
    /// shard under hash partitioning, the overlapping ones under range partitioning.
    pub fn shards_overlapping(&self, start: &[u8], end: Option<&[u8]>) -> Vec<ShardId> {
        match &self.partitioning {
            Partitioning::Hash { .. } => (0..self.shard_count()).map(ShardId).collect(),
            Partitioning::Range { splits } => {
                if end.is_some_and(|end| end <= start) {
                    return Vec::new();
                }
                let first = splits.partition_point(|split| split.as_slice() <= start);
                let last = match end {
                    Some(end) => splits.partition_point(|split| split.as_slice() < end),
                    None => splits.len(),
                };
                (first..=last).map(|shard| ShardId(shard as u32)).collect()
            }
        }
    }

    pub fn group(&self, shard: ShardId) -> Option<&ReplicaGroup> {
        self.groups.get(shard.index())
    }

    pub(crate) fn group_mut(&mut self, shard: ShardId) -> Option<&mut ReplicaGroup> {
        self.groups.get_mut(shard.index())
    }

    pub fn shard_count(&self) -> u32 {
        // At most MAX_SHARDS, checked on construction.
        self.groups.len() as u32
    }

    /// The shards `node` replicates, in shard order, with its role in each.
    pub fn shards_of_node(&self, node: &str) -> Vec<(ShardId, ReplicaRole)> {
        let mut held = Vec::new();
        for (index, group) in self.groups.iter().enumerate() {
            let shard = ShardId(index as u32);
            if group.primary == node {
                held.push((shard, ReplicaRole::Primary));
            } else if group.backups.iter().any(|backup| backup == node) {
                held.push((shard, ReplicaRole::Backup));
            }
        }
        held
    }
}
