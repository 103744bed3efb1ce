//! The bottom layer split into vertical subtrees (RainBlock's storage-node shards).
//!
//! With `16^k` shards, shard `s` holds every key whose first `k` nibbles spell `s`, as
//! a subtree rooted at nibble depth `k`. Shards share nothing and can live in different
//! processes: the root over them is assembled from their root nodes alone, and equals
//! the root of one trie holding every key.

use alloy_primitives::B256;
use std::borrow::Cow;
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::node::{Branch, Kind, Node};
use crate::ops;
use crate::path::{packed_len, path_nibbles};
use crate::proof::{self, NodeBag};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard count must be 1, 16 or 256 (a power of 16), got {0}")]
    BadShardCount(usize),
    #[error("key of {key_nibbles} nibbles is shorter than the {prefix_nibbles}-nibble shard prefix")]
    KeyTooShort { key_nibbles: usize, prefix_nibbles: usize },
    #[error("key belongs to shard {expected}, not shard {actual}")]
    WrongShard { expected: usize, actual: usize },
}

/// One vertical subtree: the keys under one prefix of `prefix_nibbles` nibbles.
#[derive(Clone, Debug)]
pub struct Shard {
    index: usize,
    prefix_nibbles: usize,
    root: Option<Node>,
}

impl Shard {
    pub fn new(index: usize, prefix_nibbles: usize) -> Self {
        Self { index, prefix_nibbles, root: None }
    }

    pub fn index(&self) -> usize {
        self.index
    }

    fn check(&self, key: &[u8]) -> Result<(), ShardError> {
        let expected = shard_of(key, self.prefix_nibbles)?;
        if expected != self.index {
            return Err(ShardError::WrongShard { expected, actual: self.index });
        }
        Ok(())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, ShardError> {
        self.check(key)?;
        Ok(self.root.as_ref().and_then(|root| complete(ops::get(root, key, self.prefix_nibbles))))
    }

    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), ShardError> {
        self.check(key)?;
        if value.is_empty() {
            complete(ops::remove(&mut self.root, key, self.prefix_nibbles));
        } else {
            complete(ops::insert(&mut self.root, key, self.prefix_nibbles, value));
        }
        Ok(())
    }

    pub fn remove(&mut self, key: &[u8]) -> Result<bool, ShardError> {
        self.check(key)?;
        Ok(complete(ops::remove(&mut self.root, key, self.prefix_nibbles)))
    }

    /// Hash of the shard's subtree root node (as it would be referenced by a parent,
    /// hashed even when short); the empty root for an empty shard.
    pub fn subtree_hash(&self) -> B256 {
        self.root.as_ref().map_or(EMPTY_ROOT, |root| root.root_hash(&mut Vec::new()))
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }
}

fn complete<T>(result: Result<T, ops::Stopped>) -> T {
    match result {
        Ok(value) => value,
        Err(stopped) => unreachable!("a shard holds no hash nodes: {stopped}"),
    }
}

fn shard_of(key: &[u8], prefix_nibbles: usize) -> Result<usize, ShardError> {
    if key.len() * 2 < prefix_nibbles {
        return Err(ShardError::KeyTooShort { key_nibbles: key.len() * 2, prefix_nibbles });
    }
    Ok((0..prefix_nibbles).fold(0, |index, i| index * 16 + nibble_at(key, i) as usize))
}

/// All shards of one state, addressed by key.
#[derive(Clone, Debug)]
pub struct ShardedTrie {
    prefix_nibbles: usize,
    shards: Vec<Shard>,
}

impl ShardedTrie {
    /// `shard_count` must be 1, 16 (the default in RainBlock) or 256.
    pub fn new(shard_count: usize) -> Result<Self, ShardError> {
        let prefix_nibbles = match shard_count {
            1 => 0,
            16 => 1,
            256 => 2,
            other => return Err(ShardError::BadShardCount(other)),
        };
        Ok(Self { prefix_nibbles, shards: (0..shard_count).map(|i| Shard::new(i, prefix_nibbles)).collect() })
    }

    /// Reassembles a state from shards that lived apart (in any order).
    pub fn from_shards(mut shards: Vec<Shard>) -> Result<Self, ShardError> {
        let mut trie = Self::new(shards.len())?;
        shards.sort_by_key(Shard::index);
        for (position, shard) in shards.into_iter().enumerate() {
            if shard.index != position || shard.prefix_nibbles != trie.prefix_nibbles {
                return Err(ShardError::WrongShard { expected: position, actual: shard.index });
            }
            trie.shards[position] = shard;
        }
        Ok(trie)
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub fn shard_for(&self, key: &[u8]) -> Result<usize, ShardError> {
        shard_of(key, self.prefix_nibbles)
    }

    pub fn shard(&self, index: usize) -> Option<&Shard> {
        self.shards.get(index)
    }

    pub fn into_shards(self) -> Vec<Shard> {
        self.shards
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, ShardError> {
        self.shards[self.shard_for(key)?].get(key)
    }

    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), ShardError> {
        let index = self.shard_for(key)?;
        self.shards[index].insert(key, value)
    }

    pub fn remove(&mut self, key: &[u8]) -> Result<bool, ShardError> {
        let index = self.shard_for(key)?;
        self.shards[index].remove(key)
    }

    /// The root over all shards: the top `k` levels are rebuilt from the shards' root
    /// nodes (whose hashes each shard caches), so only a few small nodes are hashed.
    pub fn root_hash(&self) -> B256 {
        match self.assemble() {
            None => EMPTY_ROOT,
            Some(root) => root.root_hash(&mut Vec::with_capacity(1024)),
        }
    }

    /// A proof for `key` through the assembled top levels and its shard.
    pub fn prove(&self, key: &[u8]) -> Vec<Vec<u8>> {
        match self.assemble() {
            None => Vec::new(),
            Some(root) => complete(proof::prove(&root, key)),
        }
    }

    pub fn prove_many<K: AsRef<[u8]>>(&self, keys: &[K], compaction_level: usize) -> NodeBag {
        match self.assemble() {
            None => NodeBag::default(),
            Some(root) => complete(proof::prove_many(&root, keys, compaction_level)),
        }
    }

    fn assemble(&self) -> Option<Node> {
        let entries: Vec<(Vec<u8>, Node)> = self
            .shards
            .iter()
            .filter_map(|shard| {
                let prefix = (0..self.prefix_nibbles)
                    .map(|i| ((shard.index >> (4 * (self.prefix_nibbles - 1 - i))) & 15) as u8)
                    .collect();
                shard.root.clone().map(|root| (prefix, root))
            })
            .collect();
        assemble(entries, 0)
    }
}

/// Builds the trie levels above subtrees rooted after the given nibble prefixes (all of
/// one length), exactly as a single trie holding their keys would have them.
fn assemble(entries: Vec<(Vec<u8>, Node)>, depth: usize) -> Option<Node> {
    match entries.len() {
        0 => None,
        1 => {
            let (prefix, node) = entries.into_iter().next()?;
            Some(prepend(&prefix[depth..], node))
        }
        _ => {
            let prefix_len = entries[0].0.len();
            let mut common = 0;
            while depth + common < prefix_len
                && entries.iter().all(|(p, _)| p[depth + common] == entries[0].0[depth + common])
            {
                common += 1;
            }
            if common > 0 {
                let shared = entries[0].0[depth..depth + common].to_vec();
                let below = assemble(entries, depth + common)?;
                return Some(Node::extension(shared.into_iter(), below));
            }
            let mut branch = Branch::empty();
            let mut groups: Vec<Vec<(Vec<u8>, Node)>> = (0..16).map(|_| Vec::new()).collect();
            for entry in entries {
                let nibble = entry.0[depth];
                groups[nibble as usize].push(entry);
            }
            for (nibble, group) in (0u8..).zip(groups) {
                if let Some(child) = assemble(group, depth + 1) {
                    branch.set_child(nibble, child);
                }
            }
            Some(Node::branch(branch))
        }
    }
}

/// `node` as it appears one path segment higher: leaves and extensions absorb the
/// nibbles into their path, a branch gets an extension above it.
fn prepend(nibbles: &[u8], node: Node) -> Node {
    if nibbles.is_empty() {
        return node;
    }
    match node.kind() {
        Kind::Leaf(data) => {
            let path: Vec<u8> = nibbles.iter().copied().chain(path_nibbles(data, 0)).collect();
            Node::leaf_stored(path.into_iter(), &data[packed_len(data)..])
        }
        Kind::Extension(data, child) => {
            let path: Vec<u8> = nibbles.iter().copied().chain(path_nibbles(data, 0)).collect();
            Node::extension(path.into_iter(), child.clone())
        }
        Kind::Branch(_) | Kind::Hash => Node::extension(nibbles.iter().copied(), node),
    }
}
