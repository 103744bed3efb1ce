//! Witnesses: single-key proofs in EIP-1186 form, multi-key node bags with every node
//! once, compaction, and verification against a root.

use std::collections::{HashMap, HashSet};

use alloy_primitives::{keccak256, B256};
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::decode::{decode_node, ChildRef, DecodeError, DecodedNode};
use crate::node::{Kind, Node};
use crate::ops::Stopped;
use crate::path::{common_prefix, nibble_count};

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
            if level < compaction_level {
                return;
            }
            let hash = node.cached_hash().unwrap_or_else(|| keccak256(rlp));
            if seen.insert(hash) {
                bag.nodes.push(rlp.to_vec());
            }
        })?;
    }
    Ok(bag)
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
        if root == EMPTY_ROOT && self.nodes.is_empty() {
            return Ok(vec![None; self.keys.len()]);
        }
        let by_hash = self.by_hash();
        let mut used = HashSet::new();
        let mut values = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let lookup = |hash: &B256| by_hash.get(hash).copied();
            values.push(walk_proof(root, key, lookup, &mut |hash| {
                used.insert(hash);
            })?);
        }
        if used.len() != by_hash.len() {
            return Err(ProofError::UnusedNodes(by_hash.len() - used.len()));
        }
        Ok(values)
    }
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
        &mut |_| {},
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
    used: &mut dyn FnMut(B256),
) -> Result<Option<Vec<u8>>, ProofError> {
    let key_len = key.len() * 2;
    let mut expected = ChildRef::Hash(root);
    let mut depth = 0;
    let mut fetched: usize = 0;
    loop {
        let bytes: Vec<u8> = match &expected {
            ChildRef::Empty => return Ok(None),
            ChildRef::Inline(raw) => raw.clone(),
            ChildRef::Hash(hash) => {
                let node = lookup(hash).ok_or(ProofError::MissingNode { expected: *hash, depth })?;
                used(*hash);
                fetched += 1;
                node.to_vec()
            }
        };
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
