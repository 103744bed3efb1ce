//! Versions of the state that share structure: each committed version is a snapshot
//! of its parent plus a set of updates. Concurrent blocks on the same parent become
//! sibling versions (forks) without any locking; dropping a version drops its
//! descendants too (a discarded fork) and frees exactly the nodes no retained version
//! still reaches.

use std::collections::BTreeMap;

use alloy_primitives::B256;

use crate::Trie;

pub type VersionId = u64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("version {0} is not retained")]
    Unknown(VersionId),
}

struct Entry {
    parent: Option<VersionId>,
    trie: Trie,
}

/// A tree of retained versions of one trie.
pub struct VersionedTrie {
    versions: BTreeMap<VersionId, Entry>,
    next_id: VersionId,
}

/// One logical update: `None` deletes the key.
pub type Update = (Vec<u8>, Option<Vec<u8>>);

impl VersionedTrie {
    /// Starts with `genesis` as version 0.
    pub fn new(genesis: Trie) -> Self {
        let mut versions = BTreeMap::new();
        versions.insert(0, Entry { parent: None, trie: genesis });
        Self { versions, next_id: 1 }
    }

    pub fn get(&self, version: VersionId) -> Option<&Trie> {
        self.versions.get(&version).map(|entry| &entry.trie)
    }

    pub fn parent(&self, version: VersionId) -> Option<VersionId> {
        self.versions.get(&version).and_then(|entry| entry.parent)
    }

    /// Creates a new version from `parent` with `updates` applied; returns its id and root.
    pub fn commit(&mut self, parent: VersionId, updates: &[Update]) -> Result<(VersionId, B256), VersionError> {
        let mut trie = self.get(parent).ok_or(VersionError::Unknown(parent))?.snapshot();
        for (key, value) in updates {
            match value {
                Some(value) => trie.insert(key, value),
                None => {
                    trie.remove(key);
                }
            }
        }
        let root = trie.root_hash();
        let id = self.next_id;
        self.next_id += 1;
        self.versions.insert(id, Entry { parent: Some(parent), trie });
        Ok((id, root))
    }

    /// Drops `version` and every version descending from it; returns how many.
    pub fn drop_fork(&mut self, version: VersionId) -> Result<usize, VersionError> {
        if !self.versions.contains_key(&version) {
            return Err(VersionError::Unknown(version));
        }
        let mut doomed = vec![version];
        let mut index = 0;
        while index < doomed.len() {
            let current = doomed[index];
            doomed.extend(self.versions.iter().filter(|(_, e)| e.parent == Some(current)).map(|(id, _)| *id));
            index += 1;
        }
        for id in &doomed {
            self.versions.remove(id);
        }
        Ok(doomed.len())
    }

    /// Drops every version with an id below `version`, which becomes the oldest retained
    /// one (garbage collection of history once a block is final).
    pub fn retain_from(&mut self, version: VersionId) {
        self.versions.retain(|id, _| *id >= version);
        for entry in self.versions.values_mut() {
            if entry.parent.is_some_and(|parent| parent < version) {
                entry.parent = None;
            }
        }
    }

    pub fn retained(&self) -> Vec<VersionId> {
        self.versions.keys().copied().collect()
    }

    /// Distinct nodes reachable from all retained versions (shared nodes counted once).
    pub fn distinct_nodes(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        for entry in self.versions.values() {
            if let Some(root) = entry.trie.root_node() {
                crate::ops::visit_nodes(root, &mut |node| {
                    seen.insert(node.addr());
                });
            }
        }
        seen.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use alloy_primitives::keccak256;

    use super::*;
    use crate::node::{live, Node};

    fn nodes_of(trie: &Trie) -> Vec<Node> {
        let mut out = Vec::new();
        if let Some(root) = trie.root_node() {
            crate::ops::visit_nodes(root, &mut |node| out.push(node.clone()));
        }
        out
    }

    fn addresses(versions: &VersionedTrie, ids: &[VersionId]) -> HashSet<usize> {
        ids.iter().flat_map(|v| nodes_of(versions.get(*v).unwrap())).map(|n| n.addr()).collect()
    }

    #[test]
    fn dropping_a_fork_frees_exactly_its_own_nodes() {
        let mut genesis = Trie::new();
        for i in 0u32..2000 {
            genesis.insert(keccak256(i.to_be_bytes()).as_slice(), &[7; 40]);
        }
        let mut versions = VersionedTrie::new(genesis);
        let update = |i: u32, byte: u8| (keccak256(i.to_be_bytes()).to_vec(), Some(vec![byte; 40]));
        let (main, _) = versions.commit(0, &[update(1, 1), update(2, 1)]).unwrap();
        let (fork, _) = versions.commit(0, &[update(1, 2), update(3, 2)]).unwrap();
        let (fork_child, _) = versions.commit(fork, &[update(4, 3)]).unwrap();

        let kept = addresses(&versions, &[0, main]);
        let doomed = addresses(&versions, &[fork, fork_child]);
        let exclusive = doomed.difference(&kept).count();
        assert!(exclusive > 0, "the fork has nodes of its own");
        let before = versions.distinct_nodes();
        assert_eq!(before, kept.union(&doomed).count());
        let live_before = live::count();

        assert_eq!(versions.drop_fork(fork), Ok(2));
        assert_eq!(versions.retained(), vec![0, main]);
        // Every node only the fork reached was freed, and no other.
        assert_eq!(live_before - live::count(), exclusive as isize);
        assert_eq!(versions.distinct_nodes(), before - exclusive);
        assert_eq!(addresses(&versions, &[0, main]), kept);
    }

    #[test]
    fn retaining_from_a_version_drops_older_history_only() {
        let mut versions = VersionedTrie::new(Trie::new());
        let update = |byte: u8| vec![(vec![byte; 32], Some(vec![byte; 40]))];
        let (v1, _) = versions.commit(0, &update(1)).unwrap();
        let (v2, root2) = versions.commit(v1, &update(2)).unwrap();
        let (v3, _) = versions.commit(v2, &update(3)).unwrap();
        versions.retain_from(v2);
        assert_eq!(versions.retained(), vec![v2, v3]);
        assert_eq!(versions.parent(v2), None, "the oldest retained version has no parent left");
        assert_eq!(versions.parent(v3), Some(v2));
        assert_eq!(versions.get(v2).unwrap().root_hash(), root2);
        assert_eq!(versions.commit(v1, &[]), Err(VersionError::Unknown(v1)));
    }

    #[test]
    fn versions_share_all_but_their_paths() {
        let mut genesis = Trie::new();
        for i in 0u32..5000 {
            genesis.insert(keccak256(i.to_be_bytes()).as_slice(), &[7; 40]);
        }
        let base = genesis.node_count();
        let mut versions = VersionedTrie::new(genesis);
        let (v1, root1) = versions.commit(0, &[(keccak256(1u32.to_be_bytes()).to_vec(), Some(vec![9; 40]))]).unwrap();
        // One update copies one path (a handful of nodes), not the trie.
        let added = versions.distinct_nodes() - base;
        assert!(added > 0 && added <= 8, "one update added {added} nodes");
        assert_eq!(versions.get(v1).unwrap().root_hash(), root1);
        assert_eq!(versions.commit(99, &[]), Err(VersionError::Unknown(99)));
    }
}
