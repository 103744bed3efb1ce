//! The bottom layer split into vertical subtrees (RainBlock's storage-node shards).
//!
//! With `16^k` shards, shard `s` holds every key whose first `k` nibbles spell `s`, as
//! a subtree rooted at nibble depth `k`. Shards share nothing and can live in different
//! processes: the root over them is assembled from their root nodes alone, and equals
//! the root of one trie holding every key.
//!
//! A storage node serves only some shards but proves keys through the global root: it
//! holds the shards it does not serve as hash-only shards ([`Shard::known_by_hash`]),
//! whose subtree is just the hash of the real one. Levels (as in proofs, bags and
//! pruning) count the nodes on a path of the assembled trie: its root is level 0 and
//! every node below, inlined or not, is one level deeper than its parent.

use alloy_primitives::{keccak256, B256};
use std::borrow::Cow;
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::decode::ChildRef;
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
    #[error("shard {index} is known only by its hash here: its keys are served elsewhere")]
    OnlyHash { index: usize },
    #[error("no shard {index} among {shard_count} shards")]
    NoSuchShard { index: usize, shard_count: usize },
    #[error("shard has a {actual}-nibble prefix, this state uses {expected}")]
    PrefixMismatch { expected: usize, actual: usize },
}

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

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

    /// A shard served by another storage node, known only by its subtree hash (as
    /// [`Self::subtree_hash`] gives it there); `EMPTY_ROOT` gives an empty shard. Its
    /// keys cannot be read, written or proven here ([`ShardError::OnlyHash`]), but it
    /// takes part in the root and in the proofs of other shards' keys.
    ///
    /// The assembled trie refers to the hash node by hash, so this stands in for the real
    /// subtree only when the real one is referenced by hash too. That needs both:
    /// - the real subtree's RLP is at least 32 bytes (its [`Self::subtree_reference`] is
    ///   `ChildRef::Hash`); a shorter one is inlined in its parent, and nothing can be
    ///   rebuilt from its hash;
    /// - the subtree hangs directly below a branch of the assembled trie, i.e. another
    ///   non-empty shard shares all but the last prefix nibble (with 16 shards: any other
    ///   non-empty shard; with one shard: always). A lone leaf or extension would
    ///   otherwise absorb the prefix nibbles into its path, which a hash cannot do.
    ///
    /// Neither is checked (a storage node cannot see the real subtree); a violation gives
    /// a wrong root, never a panic.
    pub fn known_by_hash(index: usize, prefix_nibbles: usize, subtree_hash: B256) -> Self {
        let root = (subtree_hash != EMPTY_ROOT).then(|| Node::hash_node(subtree_hash));
        Self { index, prefix_nibbles, root }
    }

    /// Whether this shard is only a hash here (see [`Self::known_by_hash`]).
    pub fn is_known_by_hash(&self) -> bool {
        self.root.as_ref().is_some_and(|root| matches!(root.kind(), Kind::Hash))
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn prefix_nibbles(&self) -> usize {
        self.prefix_nibbles
    }

    fn check_held(&self) -> Result<(), ShardError> {
        if self.is_known_by_hash() {
            return Err(ShardError::OnlyHash { index: self.index });
        }
        Ok(())
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
        self.check_held()?;
        Ok(self.root.as_ref().and_then(|root| complete(ops::get(root, key, self.prefix_nibbles))))
    }

    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), ShardError> {
        self.check(key)?;
        self.check_held()?;
        if value.is_empty() {
            complete(ops::remove(&mut self.root, key, self.prefix_nibbles));
        } else {
            complete(ops::insert(&mut self.root, key, self.prefix_nibbles, value));
        }
        Ok(())
    }

    pub fn remove(&mut self, key: &[u8]) -> Result<bool, ShardError> {
        self.check(key)?;
        self.check_held()?;
        Ok(complete(ops::remove(&mut self.root, key, self.prefix_nibbles)))
    }

    /// Hash of the shard's subtree root node (as it would be referenced by a parent,
    /// hashed even when short); the empty root for an empty shard.
    pub fn subtree_hash(&self) -> B256 {
        self.root.as_ref().map_or(EMPTY_ROOT, |root| root.root_hash(&mut Vec::new()))
    }

    /// How a parent refers to this shard's subtree root: by hash, inlined (its RLP is
    /// shorter than 32 bytes), or not at all (empty). Only a subtree referenced by hash
    /// can be replaced elsewhere by [`Self::known_by_hash`].
    pub fn subtree_reference(&self) -> ChildRef {
        let Some(root) = &self.root else { return ChildRef::Empty };
        if let Some(hash) = root.cached_hash() {
            return ChildRef::Hash(hash);
        }
        let mut rlp = Vec::new();
        root.encode(&mut rlp);
        if rlp.len() >= 32 {
            let hash = keccak256(&rlp);
            root.set_known_hash(hash);
            ChildRef::Hash(hash)
        } else {
            ChildRef::Inline(rlp)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// Every (key, value) pair of the shard in key order (what a checkpoint of it holds).
    pub fn entries(&self) -> Result<Vec<KeyValue>, ShardError> {
        self.check_held()?;
        let mut out = Vec::new();
        if let Some(root) = &self.root {
            // The subtree's paths start below the shard's prefix.
            let mut nibbles: Vec<u8> = (0..self.prefix_nibbles)
                .map(|i| ((self.index >> (4 * (self.prefix_nibbles - 1 - i))) & 15) as u8)
                .collect();
            ops::for_each(root, &mut nibbles, &mut |nibbles, value| {
                let key = nibbles.chunks(2).map(|pair| pair[0] << 4 | pair.get(1).copied().unwrap_or(0)).collect();
                out.push((key, value.to_vec()));
            });
        }
        Ok(out)
    }
}

fn complete<T>(result: Result<T, ops::Stopped>) -> T {
    match result {
        Ok(value) => value,
        // Hash-only shards are refused before any operation reaches their hash node.
        Err(stopped) => unreachable!("a held shard holds no hash nodes: {stopped}"),
    }
}

/// The shard of `key` when shards are `prefix_nibbles` nibbles wide.
pub fn shard_of(key: &[u8], prefix_nibbles: usize) -> Result<usize, ShardError> {
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

    /// All shards, in index order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Replaces the shard with `shard`'s index, e.g. to take over serving a shard that
    /// was known only by hash, or to give one up.
    pub fn set_shard(&mut self, shard: Shard) -> Result<(), ShardError> {
        if shard.prefix_nibbles != self.prefix_nibbles {
            return Err(ShardError::PrefixMismatch { expected: self.prefix_nibbles, actual: shard.prefix_nibbles });
        }
        let shard_count = self.shards.len();
        let slot =
            self.shards.get_mut(shard.index).ok_or(ShardError::NoSuchShard { index: shard.index, shard_count })?;
        *slot = shard;
        Ok(())
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

    /// A proof for `key` through the assembled top levels and its shard. For a key in a
    /// hash-only shard the proof stops above that shard (it does not verify); use
    /// [`Self::try_prove_many`] to be told instead.
    pub fn prove(&self, key: &[u8]) -> Vec<Vec<u8>> {
        match self.assemble() {
            None => Vec::new(),
            Some(root) => proof::prove_above_hashes(&root, key),
        }
    }

    /// A node bag for `keys` (see `Trie::prove_many`). Keys in hash-only shards get only
    /// the nodes above their shard, so the bag does not verify for them; use
    /// [`Self::try_prove_many`] to be told instead.
    pub fn prove_many<K: AsRef<[u8]>>(&self, keys: &[K], compaction_level: usize) -> NodeBag {
        match self.assemble() {
            None => NodeBag { keys: keys.iter().map(|k| k.as_ref().to_vec()).collect(), nodes: Vec::new() },
            Some(root) => proof::prove_many_above_hashes(&root, keys, compaction_level),
        }
    }

    /// The node bag `Trie::prove_many` gives for the same keys over a trie holding every
    /// key, if every key falls in a shard held here; otherwise `OnlyHash` naming the
    /// first such shard (or `KeyTooShort`).
    pub fn try_prove_many<K: AsRef<[u8]>>(&self, keys: &[K], compaction_level: usize) -> Result<NodeBag, ShardError> {
        for key in keys {
            let index = self.shard_for(key.as_ref())?;
            if self.shards[index].is_known_by_hash() {
                return Err(ShardError::OnlyHash { index });
            }
        }
        match self.assemble() {
            None => Ok(NodeBag { keys: keys.iter().map(|k| k.as_ref().to_vec()).collect(), nodes: Vec::new() }),
            // Held shards have no hash nodes, so a stop would be in a hash-only shard.
            Some(root) => proof::prove_many(&root, keys, compaction_level).map_err(|stopped| {
                let index =
                    stopped.path.as_slice().iter().take(self.prefix_nibbles).fold(0, |i, &n| i * 16 + n as usize);
                ShardError::OnlyHash { index }
            }),
        }
    }

    /// The RLP of every node at level < `levels` of the assembled trie, parents before
    /// children: what a storage node sends a miner starting cold (from the root hash
    /// alone) so that it holds the top `levels` levels. Leaves out nodes inlined in their
    /// parent (they arrive inside it) except the root, and hash-only shards (their hash
    /// is already in their parent; the nodes come from the storage node serving them).
    pub fn top_nodes(&self, levels: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(root) = self.assemble() {
            collect_top(&root, 0, levels, &mut out);
        }
        out
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

pub(crate) fn collect_top(node: &Node, level: usize, levels: usize, out: &mut Vec<Vec<u8>>) {
    if level >= levels || matches!(node.kind(), Kind::Hash) {
        return;
    }
    let mut rlp = Vec::new();
    node.encode(&mut rlp);
    if level > 0 && rlp.len() < 32 {
        // Everything below an inlined node is inlined too: nothing further to send.
        return;
    }
    out.push(rlp);
    match node.kind() {
        Kind::Extension(_, child) => collect_top(child, level + 1, levels, out),
        Kind::Branch(branch) => {
            for (_, child) in branch.iter() {
                collect_top(child, level + 1, levels, out);
            }
        }
        Kind::Leaf(_) | Kind::Hash => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PartialTrie, Trie};

    fn key(i: u32) -> Vec<u8> {
        keccak256(i.to_be_bytes()).to_vec()
    }

    fn value(i: u32) -> Vec<u8> {
        vec![i as u8 | 1; 1 + (i as usize % 40)]
    }

    const KEYS: u32 = 3000;

    fn full() -> (Trie, ShardedTrie) {
        let mut trie = Trie::new();
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..KEYS {
            trie.insert(&key(i), &value(i));
            sharded.insert(&key(i), &value(i)).unwrap();
        }
        (trie, sharded)
    }

    /// What the storage node serving shard `held` holds: that shard, the others by hash.
    fn serving(sharded: &ShardedTrie, held: usize) -> ShardedTrie {
        let shards = sharded
            .shards()
            .iter()
            .map(|shard| {
                if shard.index() == held {
                    shard.clone()
                } else {
                    assert!(matches!(shard.subtree_reference(), ChildRef::Hash(_)));
                    Shard::known_by_hash(shard.index(), shard.prefix_nibbles(), shard.subtree_hash())
                }
            })
            .collect();
        ShardedTrie::from_shards(shards).unwrap()
    }

    #[test]
    fn hash_only_shards_keep_the_global_root_and_proofs() {
        let (trie, sharded) = full();
        let root = trie.root_hash();
        assert_eq!(sharded.root_hash(), root);
        for held in [0, 7, 15] {
            let mixed = serving(&sharded, held);
            assert_eq!(mixed.root_hash(), root);
            assert_eq!(mixed.shards().iter().filter(|s| s.is_known_by_hash()).count(), 15);
            let mine: Vec<Vec<u8>> = (0..KEYS)
                .map(key)
                .filter(|k| mixed.shard_for(k) == Ok(held))
                .take(20)
                .chain([vec![held as u8 * 16; 32]])
                .collect();
            for c in 0..4 {
                assert_eq!(mixed.try_prove_many(&mine, c).unwrap(), trie.prove_many(&mine, c));
                assert_eq!(mixed.prove_many(&mine, c), trie.prove_many(&mine, c));
            }
            for k in &mine {
                assert_eq!(mixed.get(k).unwrap(), trie.get(k));
                assert_eq!(mixed.prove(k), trie.prove(k));
            }

            let foreign = (0..KEYS).map(key).find(|k| mixed.shard_for(k) != Ok(held)).unwrap();
            let index = mixed.shard_for(&foreign).unwrap();
            let only_hash = ShardError::OnlyHash { index };
            assert_eq!(mixed.get(&foreign).unwrap_err(), only_hash);
            let mut writable = mixed.clone();
            assert_eq!(writable.insert(&foreign, b"x").unwrap_err(), only_hash);
            assert_eq!(writable.insert(&foreign, b"").unwrap_err(), only_hash);
            assert_eq!(writable.remove(&foreign).unwrap_err(), only_hash);
            assert_eq!(writable.root_hash(), root);
            let with_foreign = [mine[0].clone(), foreign.clone()];
            assert_eq!(mixed.try_prove_many(&with_foreign, 0).unwrap_err(), only_hash);
            assert!(matches!(mixed.try_prove_many(&[vec![]], 0), Err(ShardError::KeyTooShort { .. })));
            // Without `try_`, the foreign key's proof stops above its shard instead of panicking.
            let partial = mixed.prove(&foreign);
            assert_eq!(partial.len(), 1);
            assert!(mixed.prove_many(&with_foreign, 0).verify(root).is_err());

            // Taking over a shard by setting its real subtree restores everything.
            let mut taken = mixed.clone();
            let real = sharded.shard(index).unwrap().clone();
            taken.set_shard(real).unwrap();
            assert_eq!(taken.get(&foreign).unwrap(), trie.get(&foreign));
            assert_eq!(taken.try_prove_many(&with_foreign, 1).unwrap(), trie.prove_many(&with_foreign, 1));
        }
    }

    #[test]
    fn shard_entries_together_are_the_tries_entries_and_rebuild_each_shard() {
        let (trie, sharded) = full();
        let mut all = Vec::new();
        for shard in sharded.shards() {
            let entries = shard.entries().unwrap();
            let mut rebuilt = Shard::new(shard.index(), shard.prefix_nibbles());
            for (key, value) in &entries {
                rebuilt.insert(key, value).unwrap();
            }
            assert_eq!(rebuilt.subtree_hash(), shard.subtree_hash());
            all.extend(entries);
        }
        assert_eq!(all, trie.entries());
        let foreign = serving(&sharded, 3);
        assert_eq!(foreign.shard(4).unwrap().entries().unwrap_err(), ShardError::OnlyHash { index: 4 });
    }

    #[test]
    fn known_by_hash_edge_cases() {
        let empty = Shard::known_by_hash(3, 1, EMPTY_ROOT);
        assert!(empty.is_empty());
        assert!(!empty.is_known_by_hash());
        assert_eq!(empty.subtree_hash(), EMPTY_ROOT);
        assert_eq!(empty.subtree_reference(), ChildRef::Empty);
        assert_eq!(empty.get(&[0x30]), Ok(None));

        let hash = B256::repeat_byte(9);
        let shard = Shard::known_by_hash(3, 1, hash);
        assert!(shard.is_known_by_hash() && !shard.is_empty());
        assert_eq!(shard.subtree_hash(), hash);
        assert_eq!(shard.subtree_reference(), ChildRef::Hash(hash));
        // The key's own shard is checked before the shard's knowledge.
        assert_eq!(shard.get(&[0x40]), Err(ShardError::WrongShard { expected: 4, actual: 3 }));
        assert_eq!(shard.get(&[0x3f]), Err(ShardError::OnlyHash { index: 3 }));

        // A one-key shard's subtree is a short leaf: inlined, so it cannot be known by hash.
        let mut small = Shard::new(1, 1);
        small.insert(&[0x12], b"v").unwrap();
        assert!(matches!(small.subtree_reference(), ChildRef::Inline(_)));

        // With a single shard the hash-only shard is the root itself.
        let mut one = ShardedTrie::new(1).unwrap();
        one.insert(&[1, 2, 3], b"short").unwrap();
        let root = one.root_hash();
        let hashed = ShardedTrie::from_shards(vec![Shard::known_by_hash(0, 0, root)]).unwrap();
        assert_eq!(hashed.root_hash(), root);
        assert!(hashed.top_nodes(3).is_empty());
        assert_eq!(hashed.try_prove_many(&[[1u8, 2, 3]], 0), Err(ShardError::OnlyHash { index: 0 }));
    }

    #[test]
    fn set_shard_checks_index_and_prefix() {
        let mut sharded = ShardedTrie::new(16).unwrap();
        assert_eq!(sharded.set_shard(Shard::new(16, 1)), Err(ShardError::NoSuchShard { index: 16, shard_count: 16 }));
        assert_eq!(sharded.set_shard(Shard::new(2, 2)), Err(ShardError::PrefixMismatch { expected: 1, actual: 2 }));
        let mut shard = Shard::new(2, 1);
        shard.insert(&[0x21, 0x22], b"value").unwrap();
        sharded.set_shard(shard).unwrap();
        assert_eq!(sharded.get(&[0x21, 0x22]).unwrap().as_deref(), Some(&b"value"[..]));
        assert_eq!(sharded.shards().len(), 16);
    }

    #[test]
    fn empty_states_prove_absence_with_their_keys() {
        let sharded = ShardedTrie::new(16).unwrap();
        let keys = [[1u8; 32], [2; 32]];
        assert_eq!(sharded.prove_many(&keys, 0), Trie::new().prove_many(&keys, 0));
        assert_eq!(sharded.try_prove_many(&keys, 0).unwrap(), Trie::new().prove_many(&keys, 0));
        assert!(sharded.top_nodes(4).is_empty());
    }

    #[test]
    fn top_nodes_from_every_storage_node_fill_a_cold_miner() {
        let (trie, sharded) = full();
        let root = trie.root_hash();
        let servers: Vec<ShardedTrie> = (0..16).map(|held| serving(&sharded, held)).collect();
        for levels in 1..=4 {
            let mut miner = PartialTrie::from_root_hash(root);
            for server in &servers {
                let nodes = server.top_nodes(levels);
                assert!(nodes.iter().all(|n| n.len() >= 32));
                miner.attach_nodes(&nodes).unwrap();
            }
            let mut pruned = PartialTrie::from(trie.clone());
            pruned.prune(levels - 1);
            assert_eq!(miner.root_hash(), root);
            assert_eq!(miner.node_count(), pruned.node_count(), "levels {levels}");
            assert_eq!(miner.hash_node_count(), pruned.hash_node_count(), "levels {levels}");
            // One storage node alone fills the levels above the shards and its own shard.
            let mut single = PartialTrie::from_root_hash(root);
            let applied = single.attach_nodes(&servers[0].top_nodes(levels)).unwrap();
            assert_eq!(applied.unused, 0);
            assert!(single.node_count() <= miner.node_count());
        }
        // The whole state, level by level, is just as good.
        assert_eq!(sharded.top_nodes(usize::MAX).len(), trie.node_count());
    }
}
