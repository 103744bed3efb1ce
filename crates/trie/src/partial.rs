//! The top layer of the DSM-Tree (RainBlock's miners): a trie that holds only some of
//! the state and knows the rest by hash.
//!
//! It starts from a root hash (or a full trie), grows by accepting node bags whose
//! nodes are checked against the hashes they replace, executes gets and puts against
//! what it holds (naming the hash node that stops an operation), prunes back to a
//! retention level, and revises witnesses taken at an older root.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use alloy_primitives::{keccak256, B256};
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::decode::{decode_node, ChildRef, DecodeError, DecodedNode};
use crate::node::{Branch, Kind, Node};
use crate::ops::{self, Stopped};
use crate::path::{common_prefix, nibble_count};
use crate::proof::NodeBag;
use crate::Trie;

/// A Merkle Patricia trie in which any subtree may be replaced by its hash.
#[derive(Clone, Default)]
pub struct PartialTrie {
    root: Option<Node>,
}

/// What applying a node bag did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BagApplied {
    /// Hash nodes replaced by the nodes they stood for.
    pub attached: usize,
    /// Bag nodes that matched no hash node on the bag's key paths: nodes this trie
    /// already holds (or held when the witness was taken), stale upper nodes of a
    /// witness from an older root, or junk. They are ignored, never trusted.
    pub unused: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BagError {
    #[error("bag node {hash} matches a hash this trie needs but is malformed: {error}")]
    Malformed { hash: B256, error: DecodeError },
    #[error("bag node {hash} is not a valid trie node here: {what}")]
    Invalid { hash: B256, what: &'static str },
}

/// A witness that could not be revised onto the current root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevisionError {
    #[error("witness rejected: the subtree for key {key} changed since the witness was taken ({stopped})")]
    SubtreeChanged { key: String, stopped: Stopped },
    #[error(transparent)]
    Bag(#[from] BagError),
}

/// The outcome of a successful witness revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub applied: BagApplied,
    /// Whether the witness was taken at exactly this trie's root (no revision needed).
    pub root_matched: bool,
}

impl From<Trie> for PartialTrie {
    fn from(trie: Trie) -> Self {
        Self { root: trie.root }
    }
}

impl PartialTrie {
    /// A trie known only by its root hash.
    pub fn from_root_hash(root: B256) -> Self {
        if root == EMPTY_ROOT {
            Self { root: None }
        } else {
            Self { root: Some(Node::hash_node(root)) }
        }
    }

    pub fn root_hash(&self) -> B256 {
        match &self.root {
            None => EMPTY_ROOT,
            Some(root) => root.root_hash(&mut Vec::with_capacity(1024)),
        }
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, Stopped> {
        match &self.root {
            None => Ok(None),
            Some(root) => ops::get(root, key, 0),
        }
    }

    /// Inserts or overwrites (an empty value deletes). On `Err` the trie is unchanged.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), Stopped> {
        if value.is_empty() {
            return self.remove(key).map(|_| ());
        }
        let mut root = self.root.clone();
        ops::insert(&mut root, key, 0, value)?;
        self.root = root;
        Ok(())
    }

    /// Removes `key`. On `Err` (the path, or the sibling a collapsing branch would merge
    /// with, is only a hash) the trie is unchanged.
    pub fn remove(&mut self, key: &[u8]) -> Result<bool, Stopped> {
        let mut root = self.root.clone();
        let removed = ops::remove(&mut root, key, 0)?;
        self.root = root;
        Ok(removed)
    }

    /// Replaces hash nodes on the paths of the bag's keys with the bag's nodes whose
    /// keccak equals them. A node is trusted only through that equality, so a bag can
    /// add knowledge but never change the root.
    pub fn apply_bag(&mut self, bag: &NodeBag) -> Result<BagApplied, BagError> {
        let by_hash: HashMap<B256, &[u8]> = bag.nodes.iter().map(|n| (keccak256(n), n.as_slice())).collect();
        let mut attached = HashSet::new();
        let mut root = self.root.clone();
        if let Some(root) = root.as_mut() {
            for key in &bag.keys {
                resolve_path(root, key, 0, &by_hash, &mut attached)?;
            }
        }
        self.root = root;
        Ok(BagApplied { attached: attached.len(), unused: by_hash.len() - attached.len() })
    }

    /// Witness revision: accepts a bag taken at `witness_root`, possibly older than this
    /// trie's root. Nodes of unchanged subtrees attach by hash; upper nodes that changed
    /// since are replaced by this trie's own. Rejected, leaving the trie unchanged, if
    /// any key of the witness still cannot be read (its subtree changed).
    pub fn revise(&mut self, bag: &NodeBag, witness_root: B256) -> Result<Revision, RevisionError> {
        let before = self.clone();
        let applied = self.apply_bag(bag)?;
        for key in &bag.keys {
            if let Err(stopped) = self.get(key) {
                *self = before;
                return Err(RevisionError::SubtreeChanged { key: virga_core::to_hex(key), stopped });
            }
        }
        Ok(Revision { applied, root_matched: witness_root == self.root_hash() })
    }

    /// Keeps nodes down to `retention_level` (the root is level 0) and replaces each node
    /// below with a hash node. Nodes short enough to be inlined stay whole, since their
    /// parent embeds them rather than referring to them by hash.
    pub fn prune(&mut self, retention_level: usize) {
        if let Some(root) = self.root.as_mut() {
            root.root_hash(&mut Vec::new());
            prune_below(root, 0, retention_level);
        }
    }

    /// Nodes held (hash nodes included).
    pub fn node_count(&self) -> usize {
        let mut count = 0;
        if let Some(root) = &self.root {
            ops::visit_nodes(root, &mut |_| count += 1);
        }
        count
    }

    /// Hash nodes held: the subtrees this trie knows only by hash.
    pub fn hash_node_count(&self) -> usize {
        let mut count = 0;
        if let Some(root) = &self.root {
            ops::visit_nodes(root, &mut |node| count += usize::from(matches!(node.kind(), Kind::Hash)));
        }
        count
    }
}

fn resolve_path(
    node: &mut Node,
    key: &[u8],
    depth: usize,
    by_hash: &HashMap<B256, &[u8]>,
    attached: &mut HashSet<B256>,
) -> Result<(), BagError> {
    if let Kind::Hash = node.kind() {
        let hash = node.cached_hash().unwrap_or_default();
        let Some(bytes) = by_hash.get(&hash) else { return Ok(()) };
        *node = build(bytes, Some(hash))?;
        attached.insert(hash);
    }
    let key_len = key.len() * 2;
    // Descend only where the key's path continues, copying nodes (their hashes stay valid).
    match node.kind() {
        Kind::Leaf(_) | Kind::Hash => Ok(()),
        Kind::Extension(data, _) => {
            let n = nibble_count(data);
            if key_len - depth < n || common_prefix(data, key, depth) != n {
                return Ok(());
            }
            let Kind::Extension(_, child) = node.make_mut_keep_hash() else { return Ok(()) };
            resolve_path(child, key, depth + n, by_hash, attached)
        }
        Kind::Branch(branch) => {
            if depth == key_len || branch.child(nibble_at(key, depth)).is_none() {
                return Ok(());
            }
            let Kind::Branch(branch) = node.make_mut_keep_hash() else { return Ok(()) };
            match branch.child_mut(nibble_at(key, depth)) {
                Some(child) => resolve_path(child, key, depth + 1, by_hash, attached),
                None => Ok(()),
            }
        }
    }
}

/// Builds a node from RLP received from outside; `hash` is its already checked hash
/// (`None` for inline nodes).
fn build(bytes: &[u8], hash: Option<B256>) -> Result<Node, BagError> {
    let error_hash = hash.unwrap_or_else(|| keccak256(bytes));
    let decoded = decode_node(bytes).map_err(|error| BagError::Malformed { hash: error_hash, error })?;
    let path_len = match &decoded {
        DecodedNode::Leaf { path, .. } | DecodedNode::Extension { path, .. } => path.len(),
        DecodedNode::Branch { .. } => 0,
    };
    if path_len > crate::path::MAX_PATH_NIBBLES {
        return Err(BagError::Invalid { hash: error_hash, what: "a path longer than 65,535 nibbles" });
    }
    let node = match decoded {
        DecodedNode::Leaf { path, value } => {
            if value.is_empty() {
                return Err(BagError::Invalid { hash: error_hash, what: "a leaf with an empty value" });
            }
            Node::leaf(path.into_iter(), &value)
        }
        DecodedNode::Extension { path, child } => {
            let child = build_child(child, error_hash)?
                .ok_or(BagError::Invalid { hash: error_hash, what: "an extension without a child" })?;
            if !matches!(child.kind(), Kind::Branch(_) | Kind::Hash) {
                return Err(BagError::Invalid { hash: error_hash, what: "an extension whose child is not a branch" });
            }
            Node::extension(path.into_iter(), child)
        }
        DecodedNode::Branch { children, value } => {
            let mut branch = Branch::empty();
            for (nibble, child) in (0u8..).zip(*children) {
                if let Some(child) = build_child(child, error_hash)? {
                    branch.set_child(nibble, child);
                }
            }
            if !value.is_empty() {
                branch.value = Some(Box::new(value.into_boxed_slice()));
            }
            if branch.entry_count() < 2 {
                return Err(BagError::Invalid { hash: error_hash, what: "a branch with fewer than two entries" });
            }
            Node::branch(branch)
        }
    };
    if let Some(hash) = hash {
        node.set_known_hash(hash);
    }
    Ok(node)
}

fn build_child(child: ChildRef, parent: B256) -> Result<Option<Node>, BagError> {
    match child {
        ChildRef::Empty => Ok(None),
        ChildRef::Hash(hash) => Ok(Some(Node::hash_node(hash))),
        ChildRef::Inline(raw) => build(&raw, None).map(Some).map_err(|error| match error {
            BagError::Malformed { error, .. } => BagError::Malformed { hash: parent, error },
            BagError::Invalid { what, .. } => BagError::Invalid { hash: parent, what },
        }),
    }
}

fn prune_below(node: &mut Node, level: usize, retention_level: usize) {
    let prune_children = level >= retention_level;
    let replace = |child: &mut Node| {
        if let Some(hash) = child.cached_hash() {
            *child = Node::hash_node(hash);
        }
    };
    match node.kind() {
        Kind::Leaf(_) | Kind::Hash => {}
        Kind::Extension(_, _) => {
            let Kind::Extension(_, child) = node.make_mut_keep_hash() else { return };
            if prune_children {
                replace(child);
            } else {
                prune_below(child, level + 1, retention_level);
            }
        }
        Kind::Branch(_) => {
            let Kind::Branch(branch) = node.make_mut_keep_hash() else { return };
            for child in branch.children.iter_mut() {
                if prune_children {
                    replace(child);
                } else {
                    prune_below(child, level + 1, retention_level);
                }
            }
        }
    }
}

impl std::fmt::Debug for PartialTrie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PartialTrie({:?})", self.root)
    }
}
