//! Witnesses: single-key proofs in EIP-1186 form, multi-key node bags with every node
//! once, compaction, and verification against a root.

// Keys here are keccak hashes or node bytes; a seeded fast hasher is plenty and SipHash
// showed up in witness checking.
use foldhash::{HashMap, HashSet, HashSetExt};

use alloy_primitives::{keccak256, B256};
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::decode::{decode_node, ChildRef, DecodeError, DecodedNode};
use crate::node::{Kind, Node};
use crate::ops::Stopped;
use crate::path::{self, common_prefix, nibble_count};
use crate::Trie;

/// The nodes on the path of `key`, root first, as a visitor sees them: the node, its
/// level (root = 0) and whether its parent references it by hash (or it is the root),
/// i.e. whether it appears as a separate proof entry.
fn walk_path(root: &Node, key: &[u8], visit: &mut dyn FnMut(&Node, usize, &[u8])) -> Result<(), Stopped> {
    let key_len = key.len() * 2;
    let mut node = root;
    let mut depth = 0;
    let mut level = 0;
    let mut rlp = Vec::with_capacity(600);
    loop {
        if let Kind::Hash = node.kind() {
            let mut path = virga_core::Nibbles::new();
            (0..depth).for_each(|i| path.push(nibble_at(key, i)));
            return Err(Stopped { hash: node.cached_hash().unwrap_or_default(), path });
        }
        rlp.clear();
        node.encode(&mut rlp);
        if level == 0 || rlp.len() >= 32 {
            visit(node, level, &rlp);
        }
        level += 1;
        match node.kind() {
            Kind::Leaf(_) | Kind::Hash => return Ok(()),
            Kind::Extension(data, child) => {
                let n = nibble_count(data);
                if key_len - depth < n || common_prefix(data, key, depth) != n {
                    return Ok(());
                }
                depth += n;
                node = child;
            }
            Kind::Branch(branch) => {
                if depth == key_len {
                    return Ok(());
                }
                match branch.child(nibble_at(key, depth)) {
                    Some(child) => {
                        node = child;
                        depth += 1;
                    }
                    None => return Ok(()),
                }
            }
        }
    }
}

impl Trie {
    /// keccak-256 of the RLP of the node that begins exactly at the nibble path `path`
    /// (one nibble per byte, root first), hashed even when the node is short enough to be
    /// inlined in its parent; `None` if no node begins there (the path ends inside a
    /// leaf's or an extension's path, or leaves the trie). Two versions with the same
    /// hash at `path` hold the same subtree there, which is what decides whether a
    /// witness taken at one still proves keys under `path` at the other.
    pub fn subtree_hash_at(&self, path: &[u8]) -> Option<B256> {
        let mut node = self.root.as_ref()?;
        let mut depth = 0;
        loop {
            if depth == path.len() {
                return Some(node.root_hash(&mut Vec::new()));
            }
            match node.kind() {
                Kind::Leaf(_) | Kind::Hash => return None,
                Kind::Extension(data, child) => {
                    let n = nibble_count(data);
                    if path.len() - depth < n || (0..n).any(|i| path::nibble(data, i) != path[depth + i]) {
                        return None;
                    }
                    depth += n;
                    node = child;
                }
                Kind::Branch(branch) => {
                    // A caller's "nibble" above 15 names no child (and must not reach the mask shift).
                    let nibble = path[depth];
                    if nibble > 15 {
                        return None;
                    }
                    node = branch.child(nibble)?;
                    depth += 1;
                }
            }
        }
    }
}

pub(crate) fn prove(root: &Node, key: &[u8]) -> Result<Vec<Vec<u8>>, Stopped> {
    let mut proof = Vec::with_capacity(8);
    walk_path(root, key, &mut |_, _, rlp| proof.push(rlp.to_vec()))?;
    Ok(proof)
}

pub(crate) fn prove_many<K: AsRef<[u8]>>(root: &Node, keys: &[K], compaction_level: usize) -> Result<NodeBag, Stopped> {
    let mut bag = NodeBag::default();
    let mut seen = HashSet::new();
    for key in keys {
        bag.keys.push(key.as_ref().to_vec());
        walk_path(root, key.as_ref(), &mut |node, level, rlp| {
            add_to_bag(&mut bag, &mut seen, compaction_level, node, level, rlp)
        })?;
    }
    Ok(bag)
}

/// As [`prove`], but a path that reaches a hash node yields the nodes above it instead
/// of an error: the proof stops where this trie's knowledge stops.
pub(crate) fn prove_above_hashes(root: &Node, key: &[u8]) -> Vec<Vec<u8>> {
    let mut proof = Vec::with_capacity(8);
    // The nodes above the hash node are already collected when the walk stops.
    let _ = walk_path(root, key, &mut |_, _, rlp| proof.push(rlp.to_vec()));
    proof
}

/// As [`prove_many`], but keys whose paths reach a hash node contribute only the nodes
/// above it.
pub(crate) fn prove_many_above_hashes<K: AsRef<[u8]>>(root: &Node, keys: &[K], compaction_level: usize) -> NodeBag {
    let mut bag = NodeBag::default();
    let mut seen = HashSet::new();
    for key in keys {
        bag.keys.push(key.as_ref().to_vec());
        let _ = walk_path(root, key.as_ref(), &mut |node, level, rlp| {
            add_to_bag(&mut bag, &mut seen, compaction_level, node, level, rlp)
        });
    }
    bag
}

fn add_to_bag(
    bag: &mut NodeBag,
    seen: &mut HashSet<B256>,
    compaction_level: usize,
    node: &Node,
    level: usize,
    rlp: &[u8],
) {
    if level < compaction_level {
        return;
    }
    let hash = node.cached_hash().unwrap_or_else(|| keccak256(rlp));
    if seen.insert(hash) {
        bag.nodes.push(rlp.to_vec());
    }
}

/// A multi-key witness: the keys (trie paths) it is about and the RLP nodes proving
/// them, each node once. A compacted bag leaves out the nodes above its compaction
/// level, which only a receiver already holding them can use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeBag {
    pub keys: Vec<Vec<u8>>,
    pub nodes: Vec<Vec<u8>>,
}

impl NodeBag {
    /// Bytes of node data carried (what crosses the network besides the keys).
    pub fn node_bytes(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum()
    }

    /// The nodes indexed by their hash.
    pub fn by_hash(&self) -> HashMap<B256, &[u8]> {
        self.nodes.iter().map(|n| (keccak256(n), n.as_slice())).collect()
    }

    /// Verifies a complete (uncompacted) bag against `root`; returns each key's value.
    pub fn verify(&self, root: B256) -> Result<Vec<Option<Vec<u8>>>, ProofError> {
        self.verify_sized(root).map(|(values, _)| values)
    }

    /// As [`Self::verify`], and also returns for each key the bytes of its own witness:
    /// the RLP lengths of the proof nodes on its path, summed without sharing any node
    /// with other keys (what `Trie::prove` for that key alone would carry). Comparing
    /// their total with [`Self::node_bytes`] measures what bagging saves.
    pub fn verify_sized(&self, root: B256) -> Result<(ProvenValues, Vec<usize>), ProofError> {
        let mut sizes = vec![0usize; self.keys.len()];
        let values = self.walk_all(root, true, &mut |key_index, _, _, node| {
            if let Some(size) = sizes.get_mut(key_index) {
                *size += node.len();
            }
        })?;
        Ok((values, sizes))
    }

    /// [`Self::verify_sized`] and [`Self::compact`] in one walk (each node hashed once): a
    /// client checking full witnesses gets the values, each key's witness size and the bag
    /// to send.
    pub fn verify_compact(
        &self,
        root: B256,
        compaction_level: usize,
    ) -> Result<(ProvenValues, Vec<usize>, NodeBag), ProofError> {
        let mut sizes = vec![0usize; self.keys.len()];
        let mut seen = HashSet::new();
        let mut nodes = Vec::new();
        let values = self.walk_all(root, true, &mut |key_index, hash, level, node| {
            if let Some(size) = sizes.get_mut(key_index) {
                *size += node.len();
            }
            if level >= compaction_level && seen.insert(hash) {
                nodes.push(node.to_vec());
            }
        })?;
        Ok((values, sizes, NodeBag { keys: self.keys.clone(), nodes }))
    }

    /// Compacts a complete bag that verifies against `root` to `compaction_level`: the
    /// bag `prove_many` would have produced at that level, for the same keys in the same
    /// order, with the nodes in the same order. Lets a client that fetched full
    /// witnesses (to check them) send the miner only what its top layer lacks.
    ///
    /// Nodes on no key's path are dropped rather than refused, so a client can narrow a
    /// verified bag to some of its keys and compact it in one step; every node kept is
    /// still one the walk from `root` reached by hash.
    pub fn compact(&self, root: B256, compaction_level: usize) -> Result<NodeBag, ProofError> {
        let mut seen = HashSet::new();
        let mut nodes = Vec::new();
        // Mirrors `prove_many`: a node is skipped (and not yet marked seen) wherever it sits
        // above the compaction level, so the order and the set of nodes match exactly.
        self.walk_all(root, false, &mut |_, hash, level, node| {
            if level >= compaction_level && seen.insert(hash) {
                nodes.push(node.to_vec());
            }
        })?;
        Ok(NodeBag { keys: self.keys.clone(), nodes })
    }

    /// Node bagging: one bag holding the keys and nodes of all `bags`. Keys keep the
    /// order of their first occurrence and lose exact duplicates; nodes likewise, compared
    /// by content, so the result depends only on the order of the input. Bags meant to be
    /// verified together must have been taken at the same root.
    pub fn merge(bags: impl IntoIterator<Item = NodeBag>) -> NodeBag {
        let mut keys = Vec::new();
        let mut nodes = Vec::new();
        for bag in bags {
            keys.extend(bag.keys);
            nodes.extend(bag.nodes);
        }
        NodeBag { keys: first_occurrences(keys), nodes: first_occurrences(nodes) }
    }

    /// Follows every key through the bag from `root`, as a verifier must, reporting each
    /// fetched node with the key's index, the node's hash and its level (the root is 0;
    /// inlined nodes count as levels too, as in `walk_path`). Fails unless every key
    /// resolves and, if `strict`, every node is used.
    fn walk_all(&self, root: B256, strict: bool, visit: &mut BagVisitor<'_>) -> Result<ProvenValues, ProofError> {
        if root == EMPTY_ROOT && self.nodes.is_empty() {
            return Ok(vec![None; self.keys.len()]);
        }
        let by_hash = self.by_hash();
        let mut used = HashSet::new();
        let mut values = Vec::with_capacity(self.keys.len());
        for (key_index, key) in self.keys.iter().enumerate() {
            let lookup = |hash: &B256| by_hash.get(hash).copied();
            values.push(walk_proof(root, key, lookup, &mut |hash, level, node| {
                used.insert(hash);
                visit(key_index, hash, level, node);
            })?);
        }
        if strict && used.len() != by_hash.len() {
            return Err(ProofError::UnusedNodes(by_hash.len() - used.len()));
        }
        Ok(values)
    }
}

/// Each proven key's value (`None` proves absence), in the order of the bag's keys.
pub type ProvenValues = Vec<Option<Vec<u8>>>;

/// Called for each node a verifying walk fetches: key index, node hash, level, node RLP.
type BagVisitor<'a> = dyn FnMut(usize, B256, usize, &[u8]) + 'a;

/// The items in order of first occurrence, without repeats.
fn first_occurrences(items: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    // Decide what to keep first, borrowing, so no item is copied.
    let keep: Vec<bool> = {
        let mut seen = HashSet::with_capacity(items.len());
        items.iter().map(|item| seen.insert(item.as_slice())).collect()
    };
    items.into_iter().zip(keep).filter_map(|(item, keep)| keep.then_some(item)).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the proof has no node with hash {expected} (needed at nibble {depth} of the key)")]
    MissingNode { expected: B256, depth: usize },
    #[error("proof node {index} hashes to {actual}, expected {expected}")]
    HashMismatch { index: usize, expected: B256, actual: B256 },
    #[error("proof node {index} is malformed: {error}")]
    Decode { index: usize, error: DecodeError },
    #[error("{0} proof nodes are not on the proven path")]
    UnusedNodes(usize),
}

/// Verifies an EIP-1186-style proof of `key` (trie path bytes) against `root`.
/// `Ok(Some(value))` proves presence, `Ok(None)` proves absence.
pub fn verify_proof<N: AsRef<[u8]>>(root: B256, key: &[u8], proof: &[N]) -> Result<Option<Vec<u8>>, ProofError> {
    if root == EMPTY_ROOT && (proof.is_empty() || (proof.len() == 1 && proof[0].as_ref() == [0x80])) {
        return Ok(None);
    }
    let mut index = 0;
    let mut failure = None;
    let result = walk_proof(
        root,
        key,
        |expected| {
            let node = proof.get(index)?.as_ref();
            let actual = keccak256(node);
            if actual != *expected {
                failure.get_or_insert(ProofError::HashMismatch { index, expected: *expected, actual });
                return None;
            }
            index += 1;
            Some(node)
        },
        &mut |_, _, _| {},
    );
    if let Some(error) = failure {
        return Err(error);
    }
    let value = result?;
    if index != proof.len() {
        return Err(ProofError::UnusedNodes(proof.len() - index));
    }
    Ok(value)
}

/// Follows `key` from `root`, fetching hashed nodes through `lookup`.
fn walk_proof<'a>(
    root: B256,
    key: &[u8],
    mut lookup: impl FnMut(&B256) -> Option<&'a [u8]>,
    used: &mut dyn FnMut(B256, usize, &[u8]),
) -> Result<Option<Vec<u8>>, ProofError> {
    let key_len = key.len() * 2;
    let mut expected = ChildRef::Hash(root);
    let mut depth = 0;
    let mut fetched: usize = 0;
    let mut level = 0;
    loop {
        let bytes: Vec<u8> = match &expected {
            ChildRef::Empty => return Ok(None),
            ChildRef::Inline(raw) => raw.clone(),
            ChildRef::Hash(hash) => {
                let node = lookup(hash).ok_or(ProofError::MissingNode { expected: *hash, depth })?;
                used(*hash, level, node);
                fetched += 1;
                node.to_vec()
            }
        };
        level += 1;
        let node =
            decode_node(&bytes).map_err(|error| ProofError::Decode { index: fetched.saturating_sub(1), error })?;
        match node {
            DecodedNode::Leaf { path, value } => {
                let matches = path.len() == key_len - depth
                    && path.iter().enumerate().all(|(i, n)| nibble_at(key, depth + i) == *n);
                return Ok((matches && !value.is_empty()).then_some(value));
            }
            DecodedNode::Extension { path, child } => {
                if key_len - depth < path.len()
                    || !path.iter().enumerate().all(|(i, n)| nibble_at(key, depth + i) == *n)
                {
                    return Ok(None);
                }
                depth += path.len();
                expected = child;
            }
            DecodedNode::Branch { children, value } => {
                if depth == key_len {
                    return Ok((!value.is_empty()).then_some(value));
                }
                expected = children[nibble_at(key, depth) as usize].clone();
                depth += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sorted(mut nodes: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        nodes.sort();
        nodes
    }

    fn trie_of(pairs: &[(Vec<u8>, Vec<u8>)]) -> Trie {
        let mut trie = Trie::new();
        for (key, value) in pairs {
            trie.insert(key, value);
        }
        trie
    }

    /// Short keys and values give inlined nodes and branch values; 32-byte keys give the
    /// shape of the state trie.
    fn pairs() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
        prop_oneof![
            prop::collection::vec(
                (prop::collection::vec(0u8..4, 0..4), prop::collection::vec(any::<u8>(), 1..4)),
                0..60
            ),
            prop::collection::vec(
                (prop::collection::vec(any::<u8>(), 32), prop::collection::vec(any::<u8>(), 1..40)),
                0..300
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn compacting_a_full_bag_equals_proving_compacted(
            pairs in pairs(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
            absent in prop::collection::vec(prop::collection::vec(0u8..4, 0..4), 0..3),
        ) {
            let trie = trie_of(&pairs);
            let root = trie.root_hash();
            let mut keys: Vec<Vec<u8>> = if pairs.is_empty() {
                Vec::new()
            } else {
                picks.iter().map(|i| pairs[i.index(pairs.len())].0.clone()).collect()
            };
            keys.extend(absent);
            let full = trie.prove_many(&keys, 0);
            for c in 0..6 {
                let compacted = full.compact(root, c).unwrap();
                let proven = trie.prove_many(&keys, c);
                prop_assert_eq!(&compacted.keys, &proven.keys);
                prop_assert_eq!(sorted(compacted.nodes.clone()), sorted(proven.nodes.clone()));
                // The walk mirrors `prove_many`, so even the order agrees.
                prop_assert_eq!(&compacted, &proven);
                // Verifying and compacting in one walk gives both results unchanged.
                let (values, sizes, together) = full.verify_compact(root, c).unwrap();
                prop_assert_eq!((values, sizes), full.verify_sized(root).unwrap());
                prop_assert_eq!(together, proven);
            }
        }

        #[test]
        fn verified_sizes_are_the_single_key_proof_sizes(
            pairs in pairs(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 1..6),
        ) {
            prop_assume!(!pairs.is_empty());
            let trie = trie_of(&pairs);
            let keys: Vec<Vec<u8>> = picks.iter().map(|i| pairs[i.index(pairs.len())].0.clone()).collect();
            let bag = trie.prove_many(&keys, 0);
            let (values, sizes) = bag.verify_sized(trie.root_hash()).unwrap();
            prop_assert_eq!(values, bag.verify(trie.root_hash()).unwrap());
            for (key, size) in keys.iter().zip(&sizes) {
                prop_assert_eq!(*size, trie.prove(key).iter().map(Vec::len).sum::<usize>());
            }
            prop_assert!(bag.node_bytes() <= sizes.iter().sum::<usize>());
        }
    }

    fn state_trie(count: u32) -> Trie {
        let mut trie = Trie::new();
        for i in 0..count {
            trie.insert(keccak256(i.to_be_bytes()).as_slice(), &[i as u8 | 1; 20]);
        }
        trie
    }

    fn key(i: u32) -> Vec<u8> {
        keccak256(i.to_be_bytes()).to_vec()
    }

    #[test]
    fn merged_bags_prove_every_key_with_each_node_once() {
        let trie = state_trie(2000);
        let root = trie.root_hash();
        let first = trie.prove_many(&[key(1), key(2), key(3)], 0);
        let second = trie.prove_many(&[key(3), key(4), key(9999)], 0);
        let merged = NodeBag::merge([first.clone(), second.clone()]);
        assert_eq!(merged.keys, vec![key(1), key(2), key(3), key(4), key(9999)]);
        let together = trie.prove_many(&merged.keys, 0);
        assert_eq!(sorted(merged.nodes.clone()), sorted(together.nodes.clone()));
        assert_eq!(merged.verify(root).unwrap(), together.verify(root).unwrap());
        // Deterministic: the same input order gives the same bag.
        assert_eq!(NodeBag::merge([first.clone(), second.clone()]), merged);
        assert_eq!(NodeBag::merge([merged.clone(), first, second]), merged);
        assert_eq!(NodeBag::merge(Vec::new()), NodeBag::default());
    }

    #[test]
    fn compact_refuses_incomplete_bags_and_drops_stray_nodes() {
        let trie = state_trie(500);
        let root = trie.root_hash();
        let mut bag = trie.prove_many(&[key(5), key(6)], 0);
        assert!(matches!(bag.compact(B256::repeat_byte(7), 1), Err(ProofError::MissingNode { .. })));
        // An already compacted bag lacks the root.
        assert!(matches!(trie.prove_many(&[key(5)], 1).compact(root, 2), Err(ProofError::MissingNode { .. })));
        // Nodes off every key's path are dropped: junk, and the nodes of keys left out.
        bag.nodes.push(vec![0xc0]);
        assert_eq!(bag.verify(root), Err(ProofError::UnusedNodes(1)));
        assert_eq!(bag.compact(root, 1).unwrap(), trie.prove_many(&[key(5), key(6)], 1));
        bag.keys.truncate(1);
        assert_eq!(bag.compact(root, 0).unwrap(), trie.prove_many(&[key(5)], 0));
        let empty = NodeBag { keys: vec![key(1)], nodes: Vec::new() };
        assert_eq!(empty.compact(EMPTY_ROOT, 3), Ok(empty.clone()));
    }

    #[test]
    fn subtree_hashes_are_found_at_node_boundaries_only() {
        let mut trie = Trie::new();
        trie.insert(&[0x12, 0x34], b"a");
        trie.insert(&[0x12, 0x56], b"b");
        // Root: extension [1, 2] to a branch at nibble path [1, 2] with leaves at 3 and 5.
        assert_eq!(trie.subtree_hash_at(&[]), Some(trie.root_hash()));
        assert_eq!(trie.subtree_hash_at(&[1]), None, "inside the extension's path");
        let branch = trie.subtree_hash_at(&[1, 2]).unwrap();
        let leaf = trie.subtree_hash_at(&[1, 2, 3]).unwrap();
        assert_ne!(branch, leaf);
        assert_eq!(trie.subtree_hash_at(&[1, 2, 3, 4]), None, "inside the leaf's path");
        assert_eq!(trie.subtree_hash_at(&[1, 2, 7]), None, "no such child");
        assert_eq!(trie.subtree_hash_at(&[1, 2, 16]), None, "not a nibble");
        // An update below changes the hashes on its path only.
        let before = trie.clone();
        trie.insert(&[0x12, 0x56], b"c");
        assert_eq!(trie.subtree_hash_at(&[1, 2, 3]), Some(leaf));
        assert_ne!(trie.subtree_hash_at(&[1, 2]), before.subtree_hash_at(&[1, 2]));
        assert_eq!(Trie::new().subtree_hash_at(&[]), None);
    }
}
