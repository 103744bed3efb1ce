//! The trie algorithms on raw node pointers, shared by the full trie, its shards and
//! the partial top layer. Every function takes the nibble `depth` at which `node`
//! sits, so a shard (a subtree below a fixed prefix) runs the same code.
//!
//! Functions return `Err(Stopped)` when they reach a hash node: a subtree this trie
//! knows only by its hash. A full trie has none, so it never sees that error.

use std::borrow::Cow;

use alloy_primitives::B256;
use virga_core::nibbles::nibble_at;
use virga_core::Nibbles;

use crate::node::{Branch, Kind, Node};
use crate::path::{self, common_prefix, key_nibbles, nibble_count, packed_len, path_nibbles};
use crate::value;

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

pub(crate) fn get<'a>(mut node: &'a Node, key: &[u8], mut depth: usize) -> Result<Option<Cow<'a, [u8]>>, Stopped> {
    let key_len = key.len() * 2;
    loop {
        match node.kind() {
            Kind::Leaf(data) => {
                let n = nibble_count(data);
                let found = n == key_len - depth && common_prefix(data, key, depth) == n;
                return Ok(found.then(|| value::load(&data[packed_len(data)..])));
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
                    return Ok(branch.value().map(Cow::Borrowed));
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
                if !value::holds(&data[packed_len(data)..], value) {
                    *node = Node::leaf(key_nibbles(key, depth, key_len), value);
                }
                return Ok(());
            }
            let mut branch = Branch::empty();
            let old_stored = &data[packed_len(data)..];
            if common == n {
                branch.value = Some(Box::new(value::load(old_stored).into()));
            } else {
                let nibble = path::nibble(data, common);
                branch.set_child(nibble, Node::leaf_stored(path_nibbles(data, common + 1), old_stored));
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
                // Merging needs to know whether the sibling is a leaf, an extension or a
                // branch. Its path is the key's first `depth` nibbles and its own nibble
                // (the key itself may end here, at the branch's value).
                let mut path = Nibbles::new();
                (0..depth).for_each(|i| path.push(nibble_at(key, i)));
                path.push(nibble);
                return Err(Stopped { hash: only.cached_hash().unwrap_or_default(), path });
            }
            *node = merge_prefix(vec![nibble], &only).unwrap_or_else(|| Node::extension(std::iter::once(nibble), only));
            Ok(Removal::Removed)
        }
        Kind::Hash => Err(stopped(node, key, depth)),
    }
}

/// Puts `prefix` in front of a leaf's or extension's path; `None` for a branch
/// (which then needs an extension above it instead).
fn merge_prefix(prefix: Vec<u8>, child: &Node) -> Option<Node> {
    match child.kind() {
        Kind::Leaf(data) => {
            let nibbles: Vec<u8> = prefix.into_iter().chain(path_nibbles(data, 0)).collect();
            Some(Node::leaf_stored(nibbles.into_iter(), &data[packed_len(data)..]))
        }
        Kind::Extension(data, grandchild) => {
            let nibbles: Vec<u8> = prefix.into_iter().chain(path_nibbles(data, 0)).collect();
            Some(Node::extension(nibbles.into_iter(), grandchild.clone()))
        }
        Kind::Branch(_) | Kind::Hash => None,
    }
}

/// Hints that the memory at `ptr` will be read soon.
#[inline(always)]
fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect and never faults, whatever the
    // address; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr.cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Lookups advanced together by [`get_many`]: enough to keep the memory system busy
/// with independent misses.
const LOOKUP_GROUP: usize = 16;

/// One lookup of [`get_many`] in flight.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    node: Option<&'a Node>,
    depth: usize,
    /// Whether the out-of-line bytes this node needs (a leaf's data, an extension's
    /// path, a spilled children array) were already prefetched.
    ready: bool,
}

/// Gets of many keys from a complete trie, interleaved: each round advances every
/// lookup of a group by one node and prefetches what it will read next, so the cache
/// misses of independent lookups overlap instead of following one another.
pub(crate) fn get_many<'a, K: AsRef<[u8]>>(root: &'a Node, keys: &[K]) -> Vec<Option<Cow<'a, [u8]>>> {
    let mut found = vec![None; keys.len()];
    for (group_index, group) in keys.chunks(LOOKUP_GROUP).enumerate() {
        let base = group_index * LOOKUP_GROUP;
        let mut cursors = [Cursor { node: None, depth: 0, ready: false }; LOOKUP_GROUP];
        for cursor in cursors.iter_mut().take(group.len()) {
            cursor.node = Some(root);
        }
        let mut active = group.len();
        while active > 0 {
            for (index, key) in group.iter().enumerate() {
                let cursor = &mut cursors[index];
                let Some(node) = cursor.node else { continue };
                let key = key.as_ref();
                let key_len = key.len() * 2;
                let next = match node.kind() {
                    Kind::Leaf(data) => {
                        if data.spilled() && !cursor.ready {
                            prefetch(data.as_ptr());
                            cursor.ready = true;
                            continue;
                        }
                        let n = nibble_count(data);
                        let hit = n == key_len - cursor.depth && common_prefix(data, key, cursor.depth) == n;
                        found[base + index] = hit.then(|| value::load(&data[packed_len(data)..]));
                        None
                    }
                    Kind::Extension(data, child) => {
                        if !cursor.ready {
                            prefetch(data.as_ptr());
                            cursor.ready = true;
                            continue;
                        }
                        let n = nibble_count(data);
                        if key_len - cursor.depth >= n && common_prefix(data, key, cursor.depth) == n {
                            cursor.depth += n;
                            Some(child)
                        } else {
                            None
                        }
                    }
                    Kind::Branch(branch) => {
                        if branch.children.spilled() && !cursor.ready {
                            prefetch(branch.children.as_ptr());
                            cursor.ready = true;
                            continue;
                        }
                        if cursor.depth == key_len {
                            found[base + index] = branch.value().map(Cow::Borrowed);
                            None
                        } else {
                            cursor.depth += 1;
                            branch.child(nibble_at(key, cursor.depth - 1))
                        }
                    }
                    // A complete trie holds no hash nodes; `Trie::get_many` is only for those.
                    Kind::Hash => None,
                };
                cursor.ready = false;
                cursor.node = next;
                match next {
                    Some(child) => prefetch(child.as_ptr()),
                    None => active -= 1,
                }
            }
        }
    }
    found
}

/// Builds the subtree at nibble `depth` holding `entries`: sorted, unique keys with
/// non-empty values, all sharing their first `depth` nibbles.
pub(crate) fn build_sorted(entries: &[(&[u8], &[u8])], depth: usize) -> Option<Node> {
    let (first, rest) = entries.split_first()?;
    if rest.is_empty() {
        return Some(Node::leaf(key_nibbles(first.0, depth, first.0.len() * 2), first.1));
    }
    // Sorted keys share exactly the prefix their first and last share.
    let last = entries[entries.len() - 1].0;
    let limit = (first.0.len() * 2).min(last.len() * 2);
    let mut split = depth;
    while split < limit && nibble_at(first.0, split) == nibble_at(last, split) {
        split += 1;
    }
    let mut branch = Branch::empty();
    let mut children = entries;
    if first.0.len() * 2 == split {
        // The first key ends here (it prefixes all the others): the branch's value.
        branch.value = Some(Box::new(first.1.into()));
        children = rest;
    }
    while let Some((head, _)) = children.first() {
        let nibble = nibble_at(head, split);
        let run = children.iter().take_while(|(key, _)| nibble_at(key, split) == nibble).count();
        let (group, remaining) = children.split_at(run);
        if let Some(child) = build_sorted(group, split + 1) {
            branch.set_child(nibble, child);
        }
        children = remaining;
    }
    let node = Node::branch(branch);
    Some(if split > depth { Node::extension(key_nibbles(first.0, depth, split), node) } else { node })
}

/// Visits every (key nibbles, value) pair below `node` in key order.
pub(crate) fn for_each(node: &Node, prefix: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8], &[u8])) {
    match node.kind() {
        Kind::Leaf(data) => {
            let len = prefix.len();
            prefix.extend(path_nibbles(data, 0));
            visit(prefix, &value::load(&data[packed_len(data)..]));
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
