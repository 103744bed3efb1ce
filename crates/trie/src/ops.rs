//! The trie algorithms on raw node pointers, shared by the full trie, its shards and
//! the partial top layer. Every function takes the nibble `depth` at which `node`
//! sits, so a shard (a subtree below a fixed prefix) runs the same code.
//!
//! Functions return `Err(Stopped)` when they reach a hash node: a subtree this trie
//! knows only by its hash. A full trie has none, so it never sees that error.

use alloy_primitives::B256;
use virga_core::nibbles::nibble_at;
use virga_core::Nibbles;

use crate::node::{Branch, Kind, Node};
use crate::path::{self, common_prefix, key_nibbles, nibble_count, packed_len, path_nibbles};

/// An operation reached a subtree known only by its hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stopped at hash node {hash} at path {path:?}")]
pub struct Stopped {
    /// The hash of the missing subtree.
    pub hash: B256,
    /// The nibble path from the root to the hash node.
    pub path: Nibbles,
}

fn stopped(node: &Node, key: &[u8], depth: usize) -> Stopped {
    let mut path = Nibbles::new();
    for i in 0..depth {
        path.push(nibble_at(key, i));
    }
    Stopped { hash: node.cached_hash().unwrap_or_default(), path }
}

pub(crate) fn get<'a>(mut node: &'a Node, key: &[u8], mut depth: usize) -> Result<Option<&'a [u8]>, Stopped> {
    let key_len = key.len() * 2;
    loop {
        match node.kind() {
            Kind::Leaf(data) => {
                let n = nibble_count(data);
                let found = n == key_len - depth && common_prefix(data, key, depth) == n;
                return Ok(found.then(|| &data[packed_len(data)..]));
            }
            Kind::Extension(data, child) => {
                let n = nibble_count(data);
                if key_len - depth < n || common_prefix(data, key, depth) != n {
                    return Ok(None);
                }
                depth += n;
                node = child;
            }
            Kind::Branch(branch) => {
                if depth == key_len {
                    return Ok(branch.value());
                }
                match branch.child(nibble_at(key, depth)) {
                    Some(child) => {
                        node = child;
                        depth += 1;
                    }
                    None => return Ok(None),
                }
            }
            Kind::Hash => return Err(stopped(node, key, depth)),
        }
    }
}

/// Inserts or overwrites; `value` must not be empty (empty means delete).
pub(crate) fn insert(slot: &mut Option<Node>, key: &[u8], depth: usize, value: &[u8]) -> Result<(), Stopped> {
    debug_assert!(!value.is_empty());
    match slot {
        None => {
            *slot = Some(Node::leaf(key_nibbles(key, depth, key.len() * 2), value));
            Ok(())
        }
        Some(node) => insert_into(node, key, depth, value),
    }
}

fn insert_into(node: &mut Node, key: &[u8], depth: usize, value: &[u8]) -> Result<(), Stopped> {
    let key_len = key.len() * 2;
    match node.kind() {
        Kind::Leaf(data) => {
            let n = nibble_count(data);
            let common = common_prefix(data, key, depth);
            if common == n && n == key_len - depth {
                if &data[packed_len(data)..] != value {
                    *node = Node::leaf(key_nibbles(key, depth, key_len), value);
                }
                return Ok(());
            }
            let mut branch = Branch::empty();
            let old_value = &data[packed_len(data)..];
            if common == n {
                branch.value = Some(Box::new(old_value.into()));
            } else {
                let nibble = path::nibble(data, common);
                branch.set_child(nibble, Node::leaf(path_nibbles(data, common + 1), old_value));
            }
            place_in_branch(&mut branch, key, depth + common, value);
            *node = wrap_in_extension(key, depth, common, Node::branch(branch));
            Ok(())
        }
        Kind::Extension(data, child) => {
            let n = nibble_count(data);
            let common = common_prefix(data, key, depth);
            if common == n {
                let Kind::Extension(_, child) = node.make_mut() else { unreachable!() };
                return insert_into(child, key, depth + n, value);
            }
            let mut branch = Branch::empty();
            let nibble = path::nibble(data, common);
            let rest = if common + 1 == n {
                child.clone()
            } else {
                Node::extension(path_nibbles(data, common + 1), child.clone())
            };
            branch.set_child(nibble, rest);
            place_in_branch(&mut branch, key, depth + common, value);
            *node = wrap_in_extension(key, depth, common, Node::branch(branch));
            Ok(())
        }
        Kind::Branch(branch) => {
            if depth == key_len {
                if branch.value() == Some(value) {
                    return Ok(());
                }
                let Kind::Branch(branch) = node.make_mut() else { unreachable!() };
                branch.value = Some(Box::new(value.into()));
                return Ok(());
            }
            let nibble = nibble_at(key, depth);
            if let Some(child) = branch.child(nibble).filter(|c| matches!(c.kind(), Kind::Hash)) {
                return Err(stopped(child, key, depth + 1));
            }
            let Kind::Branch(branch) = node.make_mut() else { unreachable!() };
            match branch.child_mut(nibble) {
                Some(child) => insert_into(child, key, depth + 1, value),
                None => {
                    branch.set_child(nibble, Node::leaf(key_nibbles(key, depth + 1, key_len), value));
                    Ok(())
                }
            }
        }
        Kind::Hash => Err(stopped(node, key, depth)),
    }
}

/// Puts the new key's value into a fresh branch that sits at nibble `depth`.
fn place_in_branch(branch: &mut Branch, key: &[u8], depth: usize, value: &[u8]) {
    let key_len = key.len() * 2;
    if depth == key_len {
        branch.value = Some(Box::new(value.into()));
    } else {
        let leaf = Node::leaf(key_nibbles(key, depth + 1, key_len), value);
        branch.set_child(nibble_at(key, depth), leaf);
    }
}

/// Prefixes `node` with the `common` nibbles of `key` after `depth`, if any.
fn wrap_in_extension(key: &[u8], depth: usize, common: usize, node: Node) -> Node {
    if common == 0 {
        node
    } else {
        Node::extension(key_nibbles(key, depth, depth + common), node)
    }
}

/// What a removal did to the subtree it was applied to.
enum Removal {
    NotFound,
    /// The key was removed and the node rewritten in place.
    Removed,
    /// The key was the only thing in this subtree.
    Emptied,
}

/// Removes `key`; `Ok(true)` if it was present. On `Err` the subtree may hold
/// copies of nodes on the path but is otherwise unchanged only if the caller
/// worked on a snapshot (the partial trie does).
pub(crate) fn remove(slot: &mut Option<Node>, key: &[u8], depth: usize) -> Result<bool, Stopped> {
    let Some(node) = slot.as_ref() else { return Ok(false) };
    // Checking first keeps a miss from copying shared nodes or dropping cached hashes.
    if get(node, key, depth)?.is_none() {
        return Ok(false);
    }
    let Some(node) = slot.as_mut() else { return Ok(false) };
    match remove_from(node, key, depth)? {
        Removal::NotFound => Ok(false),
        Removal::Removed => Ok(true),
        Removal::Emptied => {
            *slot = None;
            Ok(true)
        }
    }
}

fn remove_from(node: &mut Node, key: &[u8], depth: usize) -> Result<Removal, Stopped> {
    let key_len = key.len() * 2;
    match node.kind() {
        Kind::Leaf(data) => {
            let n = nibble_count(data);
            if n == key_len - depth && common_prefix(data, key, depth) == n {
                Ok(Removal::Emptied)
            } else {
                Ok(Removal::NotFound)
            }
        }
        Kind::Extension(data, _) => {
            let n = nibble_count(data);
            if key_len - depth < n || common_prefix(data, key, depth) != n {
                return Ok(Removal::NotFound);
            }
            let Kind::Extension(data, child) = node.make_mut() else { unreachable!() };
            match remove_from(child, key, depth + n)? {
                Removal::NotFound => return Ok(Removal::NotFound),
                // A branch below an extension keeps at least one entry.
                Removal::Emptied => return Ok(Removal::Emptied),
                Removal::Removed => {}
            }
            let merged = merge_prefix(path_nibbles(data, 0).collect(), child);
            if let Some(merged) = merged {
                *node = merged;
            }
            Ok(Removal::Removed)
        }
        Kind::Branch(_) => {
            let Kind::Branch(branch) = node.make_mut() else { unreachable!() };
            if depth == key_len {
                if branch.value.take().is_none() {
                    return Ok(Removal::NotFound);
                }
            } else {
                let nibble = nibble_at(key, depth);
                let Some(child) = branch.child_mut(nibble) else { return Ok(Removal::NotFound) };
                match remove_from(child, key, depth + 1)? {
                    Removal::NotFound => return Ok(Removal::NotFound),
                    Removal::Removed => return Ok(Removal::Removed),
                    Removal::Emptied => branch.remove_child(nibble),
                }
            }
            if branch.entry_count() >= 2 {
                return Ok(Removal::Removed);
            }
            // One entry left: the branch collapses into it.
            if branch.children.is_empty() {
                let value = branch.value.take().map(|v| *v).unwrap_or_default();
                *node = Node::leaf(std::iter::empty(), &value);
                return Ok(Removal::Removed);
            }
            let (nibble, only) = branch.iter().next().map(|(n, c)| (n, c.clone())).unwrap_or_else(|| unreachable!());
            if let Kind::Hash = only.kind() {
                // Merging needs to know whether the sibling is a leaf, an extension or a branch.
                return Err(stopped(&only, &with_nibble(key, depth, nibble), depth + 1));
            }
            *node = merge_prefix(vec![nibble], &only).unwrap_or_else(|| Node::extension(std::iter::once(nibble), only));
            Ok(Removal::Removed)
        }
        Kind::Hash => Err(stopped(node, key, depth)),
    }
}

/// A key whose nibble at `depth` is replaced, for reporting the path of a sibling.
fn with_nibble(key: &[u8], depth: usize, nibble: u8) -> Vec<u8> {
    let mut out = key.to_vec();
    let byte = &mut out[depth / 2];
    *byte = if depth.is_multiple_of(2) { (*byte & 0x0f) | nibble << 4 } else { (*byte & 0xf0) | nibble };
    out
}

/// Puts `prefix` in front of a leaf's or extension's path; `None` for a branch
/// (which then needs an extension above it instead).
fn merge_prefix(prefix: Vec<u8>, child: &Node) -> Option<Node> {
    match child.kind() {
        Kind::Leaf(data) => {
            let nibbles: Vec<u8> = prefix.into_iter().chain(path_nibbles(data, 0)).collect();
            Some(Node::leaf(nibbles.into_iter(), &data[packed_len(data)..]))
        }
        Kind::Extension(data, grandchild) => {
            let nibbles: Vec<u8> = prefix.into_iter().chain(path_nibbles(data, 0)).collect();
            Some(Node::extension(nibbles.into_iter(), grandchild.clone()))
        }
        Kind::Branch(_) | Kind::Hash => None,
    }
}

/// Visits every (key nibbles, value) pair below `node` in key order.
pub(crate) fn for_each(node: &Node, prefix: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8], &[u8])) {
    match node.kind() {
        Kind::Leaf(data) => {
            let len = prefix.len();
            prefix.extend(path_nibbles(data, 0));
            visit(prefix, &data[packed_len(data)..]);
            prefix.truncate(len);
        }
        Kind::Extension(data, child) => {
            let len = prefix.len();
            prefix.extend(path_nibbles(data, 0));
            for_each(child, prefix, visit);
            prefix.truncate(len);
        }
        Kind::Branch(branch) => {
            if let Some(value) = branch.value() {
                visit(prefix, value);
            }
            for (nibble, child) in branch.iter() {
                prefix.push(nibble);
                for_each(child, prefix, visit);
                prefix.pop();
            }
        }
        Kind::Hash => {}
    }
}

/// Visits each node below and including `node` once per path (shared nodes are seen
/// once per version that reaches them).
pub(crate) fn visit_nodes(node: &Node, visit: &mut dyn FnMut(&Node)) {
    visit(node);
    match node.kind() {
        Kind::Extension(_, child) => visit_nodes(child, visit),
        Kind::Branch(branch) => {
            for (_, child) in branch.iter() {
                visit_nodes(child, visit);
            }
        }
        Kind::Leaf(_) | Kind::Hash => {}
    }
}
