//! A storage node's versions: one per accepted block, sharing trie nodes, with the checks a
//! block passes before it becomes one. Pure: no I/O.

use crate::messages::{BlockId, BlockUpdates, TopReply, TopRequest, WitnessReply, WitnessRequest};
use alloy_consensus::Header;
use alloy_primitives::B256;
use std::collections::{HashMap, HashSet};
use virga_ledger::verify::{check_header, ChainConfig, Problem};
use virga_log::LogError;
use virga_trie::shard::{Shard, ShardError, ShardedTrie};

use super::contracts::{ContractRefusal, Contracts};
use super::{prefix_nibbles, FORK_DEPTH};

/// Why a block's updates were refused. The miner hears it as text (its `Display`).
#[derive(Debug, thiserror::Error)]
pub enum BlockRefusal {
    #[error("{0}")]
    Wire(#[from] crate::codec::WireError),
    /// An update the shards cannot take (a key outside the shard it names, a shard known only by hash).
    #[error("{0}")]
    Shard(#[from] ShardError),
    #[error("no shard {0}")]
    NoShard(usize),
    #[error("block {number} builds on {parent}, a block this node does not hold")]
    UnknownParent { number: u64, parent: B256 },
    #[error("block {number}: {problem}")]
    BadHeader {
        number: u64,
        #[source]
        problem: Problem,
    },
    #[error("block {number} announces {announced} shard hashes for {shards} shards")]
    ShardHashCount { number: u64, announced: usize, shards: usize },
    #[error("update for key {key} of shard {shard}, not served here")]
    NotServed { key: String, shard: usize },
    #[error("block {number}: shard {shard} after the updates has hash {computed}, the block announces {announced}")]
    ShardHashMismatch { number: u64, shard: usize, computed: B256, announced: B256 },
    #[error("block {number}: the announced shard hashes give state root {computed}, the header says {header}")]
    RootMismatch { number: u64, computed: B256, header: B256 },
    #[error("block {number}: {source}")]
    Contract {
        number: u64,
        #[source]
        source: Box<ContractRefusal>,
    },
    #[error("logging block {number} failed: {source}")]
    LogFailed {
        number: u64,
        #[source]
        source: LogError,
    },
}

/// Why a storage node refused a read (witness, top) request. The peer hears it as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadRefusal {
    #[error("block {0} is not held here (collected, or never received)")]
    NotHeld(B256),
    #[error("cannot prove here: {0}")]
    Unprovable(#[source] ShardError),
    #[error("the contract of account {0} is not in a shard served here")]
    ContractNotServed(B256),
    #[error("no code with hash {0} is held here")]
    CodeNotHeld(B256),
    #[error("storage nodes serve witness, top, apply_block and head requests")]
    Unsupported,
}

pub(crate) struct Version {
    pub(crate) header: Header,
    pub(crate) shards: ShardedTrie,
    pub(crate) contracts: Contracts,
}

/// What the node serves, fixed at start.
#[derive(Clone, Debug)]
pub struct Served {
    pub shards: Vec<usize>,
    pub shard_count: usize,
    pub config: ChainConfig,
    /// Blocks below the head whose versions are kept.
    pub retained: u64,
}

/// A block accepted as a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Accepted {
    pub number: u64,
    pub hash: B256,
    /// False when the node held the block already.
    pub new: bool,
}

pub(crate) struct Versions {
    pub(crate) by_hash: HashMap<B256, Version>,
    pub(crate) head: B256,
    pub(crate) head_number: u64,
}

impl Versions {
    pub(crate) fn new(header: Header, shards: ShardedTrie, contracts: Contracts) -> Versions {
        let hash = header.hash_slow();
        let number = header.number;
        let genesis = Version { header, shards, contracts };
        Versions { by_hash: HashMap::from([(hash, genesis)]), head: hash, head_number: number }
    }

    /// Makes `header`'s version (a checkpoint's) the head.
    pub(crate) fn install(&mut self, hash: B256, header: Header, shards: ShardedTrie, contracts: Contracts) {
        self.head_number = header.number;
        self.head = hash;
        self.by_hash.insert(hash, Version { header, shards, contracts });
    }

    /// Forgets a version that never became durable; the head goes back to its parent.
    pub(crate) fn forget(&mut self, hash: &B256) {
        let Some(version) = self.by_hash.remove(hash) else { return };
        if self.head == *hash {
            self.head = version.header.parent_hash;
            self.head_number = version.header.number.saturating_sub(1);
        }
    }

    pub(crate) fn head(&self) -> (u64, B256, B256) {
        let root = self.by_hash.get(&self.head).map_or(B256::ZERO, |version| version.header.state_root);
        (self.head_number, self.head, root)
    }

    /// Checks a block's updates and applies them as a new version; returns how many old
    /// versions were collected with it.
    pub(crate) fn accept(&mut self, served: &Served, updates: &BlockUpdates) -> Result<(Accepted, u64), BlockRefusal> {
        let header = &updates.header;
        let hash = header.hash_slow();
        let number = header.number;
        if self.by_hash.contains_key(&hash) {
            return Ok((Accepted { number, hash, new: false }, 0));
        }
        let Some(parent) = self.by_hash.get(&header.parent_hash) else {
            return Err(BlockRefusal::UnknownParent { number, parent: header.parent_hash });
        };
        check_header(&served.config, &parent.header, header)
            .map_err(|problem| BlockRefusal::BadHeader { number, problem })?;
        let mut shards = parent.shards.clone();
        if updates.shard_hashes.len() != served.shard_count {
            return Err(BlockRefusal::ShardHashCount {
                number,
                announced: updates.shard_hashes.len(),
                shards: served.shard_count,
            });
        }
        let announced = &updates.shard_hashes;
        apply_updates(served, &mut shards, updates)?;
        let mut contracts = parent.contracts.clone();
        contracts
            .apply(updates, &shards, &served.shards)
            .map_err(|source| BlockRefusal::Contract { number, source: Box::new(source) })?;
        let prefix = prefix_nibbles(served.shard_count).unwrap_or(0);
        for (index, expected) in announced.iter().enumerate() {
            let Some(shard) = shards.shard(index) else { continue };
            if served.shards.contains(&index) {
                let computed = shard.subtree_hash();
                if computed != *expected {
                    return Err(BlockRefusal::ShardHashMismatch {
                        number,
                        shard: index,
                        computed,
                        announced: *expected,
                    });
                }
            } else {
                shards.set_shard(Shard::known_by_hash(index, prefix, *expected))?;
            }
        }
        let computed = shards.root_hash();
        if computed != header.state_root {
            return Err(BlockRefusal::RootMismatch { number, computed, header: header.state_root });
        }
        self.by_hash.insert(hash, Version { header: header.clone(), shards, contracts });
        if number > self.head_number {
            self.head = hash;
            self.head_number = number;
        }
        let collected = self.collect(served.retained);
        Ok((Accepted { number, hash, new: true }, collected))
    }

    fn version_for(&self, at: Option<BlockId>) -> Result<(B256, &Version), ReadRefusal> {
        let hash = at.map_or(self.head, |at| at.hash);
        match self.by_hash.get(&hash) {
            Some(version) => Ok((hash, version)),
            None => Err(ReadRefusal::NotHeld(hash)),
        }
    }

    /// A node bag for `keys` at block `at` (default: head), leaving out levels above
    /// `compaction`, proved from the version `prove_from` picks (the asked one, unless a
    /// test fault says otherwise).
    pub(crate) fn witness(
        &self,
        request: &WitnessRequest,
        served: &[usize],
        prove_from: impl FnOnce(&Versions, &Version) -> ShardedTrie,
    ) -> Result<WitnessReply, ReadRefusal> {
        let (hash, version) = self.version_for(request.at)?;
        let shards = prove_from(self, version);
        let bag = shards.try_prove_many(&request.keys, request.compaction as usize).map_err(ReadRefusal::Unprovable)?;
        let (storage, codes) =
            version.contracts.prove(&request.slots, &request.code_hashes, &version.shards, served)?;
        Ok(WitnessReply {
            at: BlockId::new(version.header.number, hash),
            state_root: version.header.state_root,
            bag,
            storage,
            codes,
        })
    }

    /// The served shards' nodes above level `levels` at block `at` (default: head).
    pub(crate) fn top(&self, request: &TopRequest) -> Result<TopReply, ReadRefusal> {
        let (hash, version) = self.version_for(request.at)?;
        let levels = request.levels as usize;
        let mut nodes = version.shards.top_nodes(levels);
        // The contracts' account paths, so that the miner can anchor their storage tops.
        let contracts: Vec<B256> = version.contracts.accounts_with_storage().copied().collect();
        if !contracts.is_empty() {
            nodes.extend(version.shards.try_prove_many(&contracts, 0).map_err(ReadRefusal::Unprovable)?.nodes);
        }
        Ok(TopReply {
            at: BlockId::new(version.header.number, hash),
            state_root: version.header.state_root,
            nodes,
            storage: version.contracts.tops(levels),
        })
    }

    /// The version a checkpoint is taken of: the head's ancestor `lag` blocks down (or the
    /// oldest canonical version held, if fewer).
    pub(crate) fn ancestor(&self, lag: u64) -> Option<(Header, ShardedTrie, Contracts)> {
        let mut version = self.by_hash.get(&self.head)?;
        for _ in 0..lag {
            match self.by_hash.get(&version.header.parent_hash) {
                Some(parent) => version = parent,
                None => break,
            }
        }
        Some((version.header.clone(), version.shards.clone(), version.contracts.clone()))
    }

    /// Drops versions more than `retained` blocks below the head, and versions of forks the
    /// head has left [`FORK_DEPTH`] blocks behind. Returns how many were dropped.
    fn collect(&mut self, retained: u64) -> u64 {
        let head_number = self.head_number;
        let mut canonical = HashSet::new();
        let mut cursor = Some(self.head);
        while let Some(hash) = cursor {
            canonical.insert(hash);
            cursor = self.by_hash.get(&hash).filter(|v| v.header.number > 0).map(|v| v.header.parent_hash);
        }
        let before = self.by_hash.len();
        self.by_hash.retain(|hash, version| {
            let number = version.header.number;
            let too_old = number + retained < head_number && number > 0;
            let abandoned = !canonical.contains(hash) && number + FORK_DEPTH <= head_number;
            !(too_old || abandoned)
        });
        (before - self.by_hash.len()) as u64
    }
}

/// Applies a block's logical updates to the served shards they touch.
fn apply_updates(served: &Served, shards: &mut ShardedTrie, updates: &BlockUpdates) -> Result<(), BlockRefusal> {
    let mut touched: Vec<Shard> = Vec::new();
    for update in &updates.updates {
        let index = shards.shard_for(update.key.as_slice())?;
        if !served.shards.contains(&index) {
            return Err(BlockRefusal::NotServed {
                key: virga_core::hex::encode_prefixed(update.key.as_slice()),
                shard: index,
            });
        }
        let position = match touched.iter().position(|shard| shard.index() == index) {
            Some(position) => position,
            None => {
                let shard = shards.shard(index).cloned().ok_or(BlockRefusal::NoShard(index))?;
                touched.push(shard);
                touched.len() - 1
            }
        };
        touched[position].insert(update.key.as_slice(), &update.value)?;
    }
    for shard in touched {
        shards.set_shard(shard)?;
    }
    Ok(())
}
