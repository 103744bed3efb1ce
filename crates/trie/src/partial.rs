//! The top layer of the DSM-Tree (RainBlock's miners): a trie that holds only some of
//! the state and knows the rest by hash.
//!
//! It starts from a root hash (or a full trie), grows by accepting node bags whose
//! nodes are checked against the hashes they replace, executes gets and puts against
//! what it holds (naming the hash node that stops an operation), prunes back to a
//! retention level, and revises witnesses taken at an older root.

use foldhash::{HashMap, HashSet};
use std::borrow::Cow;

use alloy_primitives::{keccak256, B256};
use virga_core::nibbles::nibble_at;
use virga_core::EMPTY_ROOT;

use crate::decode::{decode_node, ChildRef, DecodeError, DecodedNode};
use crate::node::{Branch, Kind, Node, NodeInner};
use crate::ops::{self, Stopped};
use crate::path::{common_prefix, nibble_count};
use crate::proof::NodeBag;
use crate::Trie;

/// What [`PartialTrie::memory_bytes`] charges per node beside its RLP: the in-memory node
/// struct plus the reference count its shared pointer keeps next to it. The RLP length
/// stands for the node's out-of-line data (paths, values, child slots).
pub const NODE_OVERHEAD_BYTES: usize = std::mem::size_of::<NodeInner>() + std::mem::size_of::<usize>();

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
    /// How much [`PartialTrie::memory_bytes`] grew by the attached nodes.
    pub grown_bytes: usize,
}

/// Hash nodes replaced so far by one bag, and the memory they added.
#[derive(Default)]
struct Attached {
    hashes: HashSet<B256>,
    grown_bytes: usize,
}

impl Attached {
    fn record(&mut self, hash: B256, built: &Node) {
        self.hashes.insert(hash);
        // The hash node it replaces was charged its overhead already.
        self.grown_bytes += subtree_memory(built).saturating_sub(NODE_OVERHEAD_BYTES);
    }

    fn outcome(self, offered: usize) -> BagApplied {
        let attached = self.hashes.len();
        BagApplied { attached, unused: offered - attached, grown_bytes: self.grown_bytes }
    }
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

/// Why a partial trie has no subtree hash at a nibble path: what stands at the nibble
/// where the walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubtreeError {
    #[error("the trie is empty")]
    Empty,
    #[error("a leaf covers nibble {0} of the path")]
    InsideLeaf(usize),
    #[error("only a hash is held at nibble {0} of the path")]
    OnlyHash(usize),
    #[error("an extension covers nibble {0} of the path")]
    InsideExtension(usize),
    #[error("no child at nibble {0} of the path")]
    NoChild(usize),
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
    /// add knowledge but never change the root. Works in place (nodes shared with a clone
    /// are copied once, not per bag); on `Err` the nodes attached before the malformed one
    /// stay, which changes no hash and no value the trie could already read.
    pub fn apply_bag(&mut self, bag: &NodeBag) -> Result<BagApplied, BagError> {
        let by_hash: HashMap<B256, &[u8]> = bag.nodes.iter().map(|n| (keccak256(n), n.as_slice())).collect();
        let mut attached = Attached::default();
        if let Some(root) = self.root.as_mut() {
            for key in &bag.keys {
                resolve_path(root, key, 0, &by_hash, &mut attached)?;
            }
        }
        Ok(attached.outcome(by_hash.len()))
    }

    /// Attaches `nodes` wherever a hash node equal to a node's keccak appears in the trie,
    /// on any path, including below nodes attached by the same call: a storage node can
    /// fill a cold miner's top levels with a plain set of nodes in any order (see
    /// `ShardedTrie::top_nodes`). As for [`Self::apply_bag`], a node is trusted only
    /// through that equality, so the root never changes; nodes matching no hash node
    /// count as `unused`; on `Err` the trie is unchanged. Walks every node held.
    pub fn attach_nodes(&mut self, nodes: &[Vec<u8>]) -> Result<BagApplied, BagError> {
        let by_hash: HashMap<B256, &[u8]> = nodes.iter().map(|n| (keccak256(n), n.as_slice())).collect();
        let mut attached = Attached::default();
        if let Some(root) = &self.root {
            if let Some(root) = attach_below(root, &by_hash, &mut attached)? {
                self.root = Some(root);
            }
        }
        Ok(attached.outcome(by_hash.len()))
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
                return Err(RevisionError::SubtreeChanged { key: virga_core::hex::encode_prefixed(key), stopped });
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

    /// [`PartialTrie::prune`], except that the paths of `keep` stay whole (a miner keeps the
    /// account every block writes, its beneficiary, so pruning never costs it a witness).
    pub fn prune_keeping(&mut self, retention_level: usize, keep: &[B256]) {
        let keep: Vec<Vec<u8>> =
            keep.iter().map(|key| (0..64).map(|i| nibble_at(key.as_slice(), i)).collect()).collect();
        if let Some(root) = self.root.as_mut() {
            root.root_hash(&mut Vec::new());
            prune_keeping_below(root, 0, retention_level, &mut Vec::new(), &keep);
        }
    }

    /// [`PartialTrie::prune_keeping`] along the paths of `paths` (and `keep`) only, and the
    /// memory it freed (as [`Self::memory_bytes`] counts it). Walks and copies only the nodes
    /// on those paths and their children, not the whole top layer. When a trie was pruned
    /// and has since changed only along `paths` (bags attach on their keys' paths, writes of
    /// existing keys change their paths), the result is exactly that of `prune_keeping`. An
    /// insert that splits an extension above level r moves the subtree below it deeper,
    /// beside the path; that subtree's newly deep nodes are left for a whole prune.
    pub fn prune_paths(&mut self, retention_level: usize, paths: &[B256], keep: &[B256]) -> usize {
        let nibbles = |key: &B256| -> Vec<u8> { (0..64).map(|i| nibble_at(key.as_slice(), i)).collect() };
        // The kept paths are walked too: writes on them push nodes beside them.
        let mut paths: Vec<Vec<u8>> = paths.iter().chain(keep).map(nibbles).collect();
        paths.sort_unstable();
        paths.dedup();
        let keep: Vec<Vec<u8>> = keep.iter().map(nibbles).collect();
        let mut freed = 0;
        if let Some(root) = self.root.as_mut() {
            root.root_hash(&mut Vec::new());
            let paths: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
            prune_along(root, 0, retention_level, 0, &paths, &keep, &mut freed);
        }
        freed
    }

    /// The hash of the subtree that begins exactly at nibble path `path` (a hash node's own
    /// hash if only that is held), as [`Trie::subtree_hash_at`]; an error names why there is
    /// none ([`SubtreeError`]: the path ends inside a node's path, leaves the trie, or is only
    /// a hash above it).
    pub fn subtree_hash_at(&self, path: &[u8]) -> Result<B256, SubtreeError> {
        let mut node = self.root.as_ref().ok_or(SubtreeError::Empty)?;
        let mut depth = 0;
        loop {
            if depth == path.len() {
                return Ok(node.root_hash(&mut Vec::new()));
            }
            match node.kind() {
                Kind::Leaf(_) => return Err(SubtreeError::InsideLeaf(depth)),
                Kind::Hash => return Err(SubtreeError::OnlyHash(depth)),
                Kind::Extension(data, child) => {
                    let n = nibble_count(data);
                    if path.len() - depth < n || (0..n).any(|i| crate::path::nibble(data, i) != path[depth + i]) {
                        return Err(SubtreeError::InsideExtension(depth));
                    }
                    depth += n;
                    node = child;
                }
                Kind::Branch(branch) => {
                    let nibble = path[depth];
                    node = if nibble > 15 { None } else { branch.child(nibble) }.ok_or(SubtreeError::NoChild(depth))?;
                    depth += 1;
                }
            }
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

    /// An estimate of the memory the nodes held take: for each node (hash nodes and
    /// inlined nodes included) its RLP length plus [`NODE_OVERHEAD_BYTES`]. A hash node
    /// has no RLP of its own; its hash lives in the node struct. Nodes shared with other
    /// versions are charged to each, as they would be if this were the only version.
    pub fn memory_bytes(&self) -> usize {
        self.root.as_ref().map_or(0, subtree_memory)
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

fn subtree_memory(root: &Node) -> usize {
    let mut total = 0;
    let mut rlp = Vec::with_capacity(600);
    ops::visit_nodes(root, &mut |node| {
        total += NODE_OVERHEAD_BYTES;
        if !matches!(node.kind(), Kind::Hash) {
            rlp.clear();
            node.encode(&mut rlp);
            total += rlp.len();
        }
    });
    total
}

fn resolve_path(
    node: &mut Node,
    key: &[u8],
    depth: usize,
    by_hash: &HashMap<B256, &[u8]>,
    attached: &mut Attached,
) -> Result<(), BagError> {
    if let Kind::Hash = node.kind() {
        let hash = node.cached_hash().unwrap_or_default();
        let Some(bytes) = by_hash.get(&hash) else { return Ok(()) };
        *node = build(bytes, Some(hash))?;
        attached.record(hash, node);
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

/// `node` with every hash node below it that `by_hash` resolves replaced (recursively),
/// or `None` if there is none: untouched subtrees stay shared, never copied.
fn attach_below(
    node: &Node,
    by_hash: &HashMap<B256, &[u8]>,
    attached: &mut Attached,
) -> Result<Option<Node>, BagError> {
    match node.kind() {
        Kind::Hash => {
            let hash = node.cached_hash().unwrap_or_default();
            let Some(bytes) = by_hash.get(&hash) else { return Ok(None) };
            let built = build(bytes, Some(hash))?;
            attached.record(hash, &built);
            Ok(Some(attach_below(&built, by_hash, attached)?.unwrap_or(built)))
        }
        Kind::Leaf(_) => Ok(None),
        Kind::Extension(_, child) => {
            let Some(child) = attach_below(child, by_hash, attached)? else { return Ok(None) };
            let mut copy = node.clone();
            if let Kind::Extension(_, slot) = copy.make_mut_keep_hash() {
                *slot = child;
            }
            Ok(Some(copy))
        }
        Kind::Branch(branch) => {
            let mut copy: Option<Node> = None;
            for (nibble, child) in branch.iter() {
                if let Some(child) = attach_below(child, by_hash, attached)? {
                    if let Kind::Branch(copied) = copy.get_or_insert_with(|| node.clone()).make_mut_keep_hash() {
                        copied.set_child(nibble, child);
                    }
                }
            }
            Ok(copy)
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

fn prune_keeping_below(node: &mut Node, level: usize, retention_level: usize, path: &mut Vec<u8>, keep: &[Vec<u8>]) {
    let kept = |path: &[u8]| keep.iter().any(|key| key.starts_with(path));
    let prune_children = level >= retention_level;
    match node.kind() {
        Kind::Leaf(_) | Kind::Hash => {}
        Kind::Extension(data, _) => {
            let extension: Vec<u8> = (0..nibble_count(data)).map(|i| crate::path::nibble(data, i)).collect();
            let Kind::Extension(_, child) = node.make_mut_keep_hash() else { return };
            let before = path.len();
            path.extend_from_slice(&extension);
            if prune_children && !kept(path) {
                if let Some(hash) = child.cached_hash() {
                    *child = Node::hash_node(hash);
                }
            } else {
                prune_keeping_below(child, level + 1, retention_level, path, keep);
            }
            path.truncate(before);
        }
        Kind::Branch(_) => {
            let Kind::Branch(branch) = node.make_mut_keep_hash() else { return };
            for nibble in 0u8..16 {
                let Some(child) = branch.child_mut(nibble) else { continue };
                path.push(nibble);
                if prune_children && !kept(path) {
                    if let Some(hash) = child.cached_hash() {
                        *child = Node::hash_node(hash);
                    }
                } else {
                    prune_keeping_below(child, level + 1, retention_level, path, keep);
                }
                path.pop();
            }
        }
    }
}

/// `prune_keeping_below` restricted to the paths of `paths` (sorted nibble paths that all
/// agree with the path to `node`, which is `depth` nibbles long). At a node whose children
/// are pruned every child is, on a path or not: an insert on a path pushes the node it
/// splits from down beside the path.
fn prune_along(
    node: &mut Node,
    level: usize,
    retention_level: usize,
    depth: usize,
    paths: &[&[u8]],
    keep: &[Vec<u8>],
    freed: &mut usize,
) {
    let prune_children = level >= retention_level;
    // The child at nibble path `prefix`, reached by `paths` (maybe none).
    let mut visit = |child: &mut Node, prefix: &[u8], paths: &[&[u8]]| {
        if prune_children && !keep.iter().any(|key| key.starts_with(prefix)) {
            if let (false, Some(hash)) = (matches!(child.kind(), Kind::Hash), child.cached_hash()) {
                *freed += subtree_memory(child).saturating_sub(NODE_OVERHEAD_BYTES);
                *child = Node::hash_node(hash);
            }
        } else if !paths.is_empty() {
            prune_along(child, level + 1, retention_level, prefix.len(), paths, keep, freed);
        }
    };
    let Some(first) = paths.first() else { return };
    let mut prefix = first[..depth.min(first.len())].to_vec();
    match node.kind() {
        Kind::Leaf(_) | Kind::Hash => {}
        Kind::Extension(data, _) => {
            prefix.extend((0..nibble_count(data)).map(|i| crate::path::nibble(data, i)));
            let through: Vec<&[u8]> = paths.iter().copied().filter(|path| path.starts_with(&prefix)).collect();
            if through.is_empty() && !prune_children {
                return;
            }
            let Kind::Extension(_, child) = node.make_mut_keep_hash() else { return };
            visit(child, &prefix, &through);
        }
        Kind::Branch(_) => {
            let Kind::Branch(branch) = node.make_mut_keep_hash() else { return };
            let mut rest = paths;
            for nibble in 0u8..16 {
                // Sorted, so the paths through this child are the next run.
                let skipped = rest.iter().take_while(|path| path.get(depth).is_none_or(|&n| n < nibble)).count();
                rest = &rest[skipped..];
                let run = rest.iter().take_while(|path| path.get(depth) == Some(&nibble)).count();
                let (through, after) = rest.split_at(run);
                rest = after;
                if through.is_empty() && !prune_children {
                    continue;
                }
                let Some(child) = branch.child_mut(nibble) else { continue };
                prefix.push(nibble);
                visit(child, &prefix, through);
                prefix.pop();
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    fn key(i: u32) -> Vec<u8> {
        keccak256(i.to_be_bytes()).to_vec()
    }

    fn full_trie(count: u32) -> Trie {
        let mut trie = Trie::new();
        for i in 0..count {
            trie.insert(&key(i), &[i as u8 | 1; 24]);
        }
        trie
    }

    /// The nodes of levels `0..levels`. Every ancestor of a node referenced by hash is
    /// itself referenced by hash, so a proof's n-th entry is the node at level n.
    fn nodes_above(trie: &Trie, count: u32, levels: usize) -> Vec<Vec<u8>> {
        let mut nodes: Vec<Vec<u8>> = (0..count).flat_map(|i| trie.prove(&key(i)).into_iter().take(levels)).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    #[test]
    fn a_subtree_hash_agrees_with_the_full_trie_or_names_what_stands_in_the_way() {
        let trie = full_trie(3000);
        let mut top = PartialTrie::from_root_hash(trie.root_hash());
        top.attach_nodes(&nodes_above(&trie, 3000, 2)).unwrap();
        // Held levels give the full trie's hashes; a path below them reaches only a hash.
        for path in [vec![], vec![3], vec![0xa, 0xf]] {
            assert_eq!(top.subtree_hash_at(&path).ok(), trie.subtree_hash_at(&path), "{path:?}");
        }
        assert_eq!(top.subtree_hash_at(&[3, 4, 5]), Err(SubtreeError::OnlyHash(2)));
        assert_eq!(top.subtree_hash_at(&[3, 16]), Err(SubtreeError::NoChild(1)));
        assert_eq!(PartialTrie::from(Trie::new()).subtree_hash_at(&[1]), Err(SubtreeError::Empty));
        let mut one = Trie::new();
        one.insert(&key(1), b"value");
        let leaf = PartialTrie::from(one);
        assert_eq!(leaf.subtree_hash_at(&[key(1)[0] >> 4, 0]), Err(SubtreeError::InsideLeaf(0)));
    }

    #[test]
    fn attached_nodes_fill_the_top_levels_in_any_order() {
        let trie = full_trie(3000);
        let root = trie.root_hash();
        let mut nodes = nodes_above(&trie, 3000, 4);
        let genuine = nodes.len();
        // Tampered copies of real nodes: they hash to nothing the trie needs.
        let tampered: Vec<Vec<u8>> = nodes
            .iter()
            .step_by(7)
            .map(|n| {
                let mut n = n.clone();
                let middle = n.len() / 2;
                n[middle] ^= 0x10;
                n
            })
            .collect();
        nodes.extend(tampered.iter().cloned());
        nodes.shuffle(&mut StdRng::seed_from_u64(7));

        let mut top = PartialTrie::from_root_hash(root);
        let before = top.memory_bytes();
        let applied = top.attach_nodes(&nodes).unwrap();
        assert_eq!(applied, BagApplied { attached: genuine, unused: tampered.len(), ..applied });
        assert_eq!(top.memory_bytes(), before + applied.grown_bytes);
        assert_eq!(top.root_hash(), root);
        let mut pruned = PartialTrie::from(trie.clone());
        pruned.prune(3);
        assert_eq!(top.node_count(), pruned.node_count());
        assert_eq!(top.hash_node_count(), pruned.hash_node_count());
        assert!(top.hash_node_count() > 0);
        for i in 0..3000 {
            let k = key(i);
            match trie.prove(&k).len() {
                0..=4 => assert_eq!(top.get(&k).unwrap(), trie.get(&k), "path of key {i} ends above level 4"),
                _ => assert!(top.get(&k).is_err()),
            }
        }
        // Attaching again finds no hash node to fill with the same nodes.
        let again = top.attach_nodes(&nodes).unwrap();
        assert_eq!(again, BagApplied { attached: 0, unused: genuine + tampered.len(), grown_bytes: 0 });
        // A deeper level attaches below what is there.
        let before = top.memory_bytes();
        let deeper = top.attach_nodes(&nodes_above(&trie, 3000, 5)).unwrap();
        assert!(deeper.attached > 0);
        assert_eq!(top.memory_bytes(), before + deeper.grown_bytes);
        assert_eq!(top.root_hash(), root);
    }

    /// RLP of a branch whose first two children are the given hashes.
    fn branch_of(first: B256, second: B256) -> Vec<u8> {
        let mut payload = Vec::new();
        for hash in [first, second] {
            payload.push(0xa0);
            payload.extend_from_slice(hash.as_slice());
        }
        payload.extend_from_slice(&[0x80; 15]);
        let mut out = Vec::new();
        alloy_rlp::Header { list: true, payload_length: payload.len() }.encode(&mut out);
        out.extend_from_slice(&payload);
        out
    }

    #[test]
    fn a_malformed_match_is_an_error_and_changes_nothing() {
        let garbage = vec![0xff; 40];
        let mut leaf_trie = Trie::new();
        leaf_trie.insert(&[0x10; 32], &[5; 32]);
        let leaf = leaf_trie.prove(&[0x10; 32]).remove(0);
        // The branch sits at nibble depth 0 and names children 0 and 1.
        let branch = branch_of(keccak256(&garbage), keccak256(&leaf));
        let root = keccak256(&branch);
        let mut top = PartialTrie::from_root_hash(root);
        let error = top.attach_nodes(&[leaf.clone(), garbage.clone(), branch.clone()]).unwrap_err();
        assert!(matches!(error, BagError::Malformed { hash, .. } if hash == keccak256(&garbage)));
        assert_eq!((top.node_count(), top.hash_node_count()), (1, 1));
        assert_eq!(top.root_hash(), root);
        // Without the bad node the rest attaches, and the bad one's hash stays a hash.
        let applied = top.attach_nodes(&[branch, leaf]).unwrap();
        assert_eq!(applied, BagApplied { attached: 2, unused: 0, ..applied });
        assert_eq!((top.node_count(), top.hash_node_count()), (3, 1));
        assert_eq!(top.root_hash(), root);
        assert!(top.attach_nodes(&[garbage]).is_err());
        assert_eq!((top.node_count(), top.hash_node_count()), (3, 1));
    }

    #[test]
    fn memory_grows_with_the_retention_level() {
        assert_eq!(PartialTrie::default().memory_bytes(), 0);
        assert_eq!(PartialTrie::from_root_hash(B256::repeat_byte(1)).memory_bytes(), NODE_OVERHEAD_BYTES);
        let mut one = Trie::new();
        one.insert(&[1; 32], &[2; 32]);
        let rlp: usize = one.prove(&[1; 32]).iter().map(Vec::len).sum();
        assert_eq!(PartialTrie::from(one).memory_bytes(), rlp + NODE_OVERHEAD_BYTES);

        let trie = full_trie(3000);
        let whole = PartialTrie::from(trie.clone()).memory_bytes();
        let mut previous = 0;
        for retention in 0..5 {
            let mut top = PartialTrie::from(trie.clone());
            top.prune(retention);
            let bytes = top.memory_bytes();
            assert!(bytes > previous && bytes <= whole, "retention {retention}: {bytes} bytes");
            assert!(bytes >= top.node_count() * NODE_OVERHEAD_BYTES);
            previous = bytes;
        }
        assert!(NODE_OVERHEAD_BYTES >= std::mem::size_of::<B256>());
    }
}
