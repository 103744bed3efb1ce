//! `Trie`: one version of a complete Merkle Patricia trie, and `SecureTrie`, the
//! variant keyed by keccak-256 of the key, as Ethereum's state and storage tries are.

use alloy_primitives::{keccak256, B256};
use std::borrow::Cow;
use virga_core::EMPTY_ROOT;

use crate::node::Node;
use crate::ops;
use crate::proof::{self, NodeBag};

/// A complete Merkle Patricia trie (no hash nodes).
///
/// `Clone` is the O(1) snapshot: both copies share every node, and an update to
/// either copies only the nodes on its path. Dropping a version frees exactly the
/// nodes that no other version still reaches (reference counting).
#[derive(Clone, Default)]
pub struct Trie {
    pub(crate) root: Option<Node>,
}

/// `Trie` never stores hash nodes, so the shared algorithms never stop.
fn complete<T>(result: Result<T, ops::Stopped>) -> T {
    match result {
        Ok(value) => value,
        Err(stopped) => unreachable!("a complete trie reached a hash node: {stopped}"),
    }
}

impl Trie {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    pub fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.root.as_ref().and_then(|root| complete(ops::get(root, key, 0)))
    }

    /// Looks up many keys at once, in order. Faster per key than [`Self::get`] for
    /// large batches: the lookups are interleaved so their cache misses overlap.
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Option<Cow<'_, [u8]>>> {
        match &self.root {
            None => vec![None; keys.len()],
            Some(root) => ops::get_many(root, keys),
        }
    }

    /// Inserts or overwrites. As in Ethereum, an empty value deletes the key.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        if value.is_empty() {
            self.remove(key);
        } else {
            complete(ops::insert(&mut self.root, key, 0, value));
        }
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        complete(ops::remove(&mut self.root, key, 0))
    }

    /// Inserts many pairs at once (later duplicates win; empty values delete). Into an
    /// empty trie this sorts the pairs and builds the trie bottom-up in one pass, with
    /// no path walked twice; otherwise it inserts them one by one.
    pub fn insert_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, mut pairs: Vec<(K, V)>) {
        if self.root.is_some() {
            for (key, value) in &pairs {
                self.insert(key.as_ref(), value.as_ref());
            }
            return;
        }
        // Stable sort keeps arrival order among equal keys, so the last one wins below.
        pairs.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        let mut unique: Vec<(&[u8], &[u8])> = Vec::with_capacity(pairs.len());
        for (key, value) in &pairs {
            match unique.last_mut() {
                Some(last) if last.0 == key.as_ref() => last.1 = value.as_ref(),
                _ => unique.push((key.as_ref(), value.as_ref())),
            }
        }
        unique.retain(|(_, value)| !value.is_empty());
        self.root = ops::build_sorted(&unique, 0);
    }

    /// The root hash; computes and caches the hashes of nodes changed since the last call.
    pub fn root_hash(&self) -> B256 {
        match &self.root {
            None => EMPTY_ROOT,
            Some(root) => root.root_hash(&mut Vec::with_capacity(1024)),
        }
    }

    /// The root hash, with the subtrees under the top branch hashed in parallel on rayon's
    /// current pool (call inside `ThreadPool::install` to choose the pool).
    pub fn root_hash_parallel(&self) -> B256 {
        if let Some(root) = &self.root {
            root.prehash_parallel();
        }
        self.root_hash()
    }

    /// The RLP of every node at level < `levels`, parents before children (nodes inlined
    /// in their parent arrive inside it): what a receiver starting from the root hash needs
    /// to hold the top `levels` levels, and so to take bags compacted below them.
    pub fn top_nodes(&self, levels: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(root) = &self.root {
            root.root_hash(&mut Vec::with_capacity(1024));
            crate::shard::collect_top(root, 0, levels, &mut out);
        }
        out
    }

    /// An O(1) copy that shares all nodes with `self`.
    pub fn snapshot(&self) -> Trie {
        self.clone()
    }

    /// EIP-1186-style proof for `key`: the RLP of every node on its path from the root,
    /// leaving out nodes short enough to be inlined in their parent. Proves absence too.
    pub fn prove(&self, key: &[u8]) -> Vec<Vec<u8>> {
        match &self.root {
            None => Vec::new(),
            Some(root) => complete(proof::prove(root, key)),
        }
    }

    /// One node bag proving all `keys`: every node of their proofs, each once, omitting
    /// the nodes above `compaction_level` (level 0 is the root), which the receiver holds.
    pub fn prove_many<K: AsRef<[u8]>>(&self, keys: &[K], compaction_level: usize) -> NodeBag {
        match &self.root {
            None => NodeBag { keys: keys.iter().map(|k| k.as_ref().to_vec()).collect(), nodes: Vec::new() },
            Some(root) => complete(proof::prove_many(root, keys, compaction_level)),
        }
    }

    /// Every (key, value) pair in key order. Keys are bytes (every key inserted through
    /// this API has an even number of nibbles).
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        if let Some(root) = &self.root {
            ops::for_each(root, &mut Vec::new(), &mut |nibbles, value| {
                let key = nibbles.chunks(2).map(|p| p[0] << 4 | p.get(1).copied().unwrap_or(0)).collect();
                out.push((key, value.to_vec()));
            });
        }
        out
    }

    /// Number of key-value pairs (walks the trie).
    pub fn len(&self) -> usize {
        let mut count = 0;
        if let Some(root) = &self.root {
            ops::for_each(root, &mut Vec::new(), &mut |_, _| count += 1);
        }
        count
    }

    /// Counts nodes reachable from this version (a node shared by two paths counts twice;
    /// tries have no such sharing within one version).
    pub fn node_count(&self) -> usize {
        let mut count = 0;
        if let Some(root) = &self.root {
            ops::visit_nodes(root, &mut |_| count += 1);
        }
        count
    }

    pub(crate) fn root_node(&self) -> Option<&Node> {
        self.root.as_ref()
    }
}

impl std::fmt::Debug for Trie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trie({:?})", self.root)
    }
}

/// A trie whose paths are keccak-256 of the keys (Ethereum's "secure" trie), so every
/// path is 64 nibbles and the tree stays balanced whatever the keys.
#[derive(Clone, Default, Debug)]
pub struct SecureTrie {
    inner: Trie,
}

impl SecureTrie {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.inner.get(keccak256(key).as_slice())
    }

    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.inner.insert(keccak256(key).as_slice(), value)
    }

    /// Looks up many keys at once; see [`Trie::get_many`].
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Option<Cow<'_, [u8]>>> {
        let hashed: Vec<B256> = keys.iter().map(|k| keccak256(k.as_ref())).collect();
        self.inner.get_many(&hashed)
    }

    pub fn remove(&mut self, key: &[u8]) -> bool {
        self.inner.remove(keccak256(key).as_slice())
    }

    /// Inserts many pairs at once; see [`Trie::insert_many`].
    pub fn insert_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, pairs: Vec<(K, V)>) {
        let hashed: Vec<(B256, V)> = pairs.into_iter().map(|(k, v)| (keccak256(k.as_ref()), v)).collect();
        self.inner.insert_many(hashed);
    }

    /// Access by an already hashed key (what proofs and witnesses are about).
    pub fn get_hashed(&self, hashed_key: &B256) -> Option<Cow<'_, [u8]>> {
        self.inner.get(hashed_key.as_slice())
    }

    pub fn insert_hashed(&mut self, hashed_key: &B256, value: &[u8]) {
        self.inner.insert(hashed_key.as_slice(), value)
    }

    pub fn root_hash(&self) -> B256 {
        self.inner.root_hash()
    }

    pub fn snapshot(&self) -> SecureTrie {
        self.clone()
    }

    /// Proof for `key` (its path is keccak-256 of the key).
    pub fn prove(&self, key: &[u8]) -> Vec<Vec<u8>> {
        self.inner.prove(keccak256(key).as_slice())
    }

    pub fn prove_many<K: AsRef<[u8]>>(&self, keys: &[K], compaction_level: usize) -> NodeBag {
        let hashed: Vec<B256> = keys.iter().map(|k| keccak256(k.as_ref())).collect();
        self.inner.prove_many(&hashed, compaction_level)
    }

    /// The underlying trie, keyed by hashed keys.
    pub fn as_trie(&self) -> &Trie {
        &self.inner
    }

    pub fn into_trie(self) -> Trie {
        self.inner
    }

    pub fn from_trie(inner: Trie) -> Self {
        Self { inner }
    }
}
