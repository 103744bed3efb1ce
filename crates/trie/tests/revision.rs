//! Witness revision against an oracle built from the full tries alone.
//!
//! A client takes a full witness `W` for keys `K` at root `R0`; the state moves on to
//! `R1`; the miner holds `R1`'s top layer pruned at retention `r` and revises `W`. The
//! oracle says, per key, whether revision can make the key readable: walk the key's path
//! in `R1`'s trie down to level `r + 1`, where the pruned top layer puts a hash node. If
//! the path ends above that level, the key is readable without the witness. Otherwise,
//! at the nibble path `p` of that hash node, the witness can only help if `T0` holds the
//! same subtree at `p` as `T1` (`Trie::subtree_hash_at`), since revision trusts a witness
//! node only where its hash equals a hash node's.
//!
//! Inlined subtrees: `subtree_hash_at` hashes the node at `p` even when it is shorter
//! than 32 bytes. The hash node of the top layer is always a node of at least 32 bytes
//! (shorter ones stay inlined in their parent when pruning), so a match means `T0` has
//! that very node at `p`, long enough to be its own witness entry; a subtree that was
//! inlined in `T0` and grew past 31 bytes in `T1` (or the reverse) never matches, and
//! the witness's copy of it, embedded in its parent, is rightly of no use. The random
//! updates include keys sharing 60 to 63 nibbles with a proven key, with short values,
//! so such subtrees occur.
//!
//! A witness compacted at `r + 1` leaves out `T0`'s nodes of levels `0..=r`. It serves
//! the same keys as the full witness except where the update changed the number of
//! nodes above `p` (say an extension split into a branch and a shorter extension): the
//! unchanged subtree at `p` then sits at a lower level in `T0` than the `r + 1` of the
//! top layer and was compacted away. The oracle for compacted witnesses adds that
//! condition.

use alloy_primitives::{keccak256, B256};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_core::nibbles::nibble_at as nibble;
use virga_trie::partial::RevisionError;
use virga_trie::{decode_node, DecodedNode, NodeBag, PartialTrie, Trie};

fn random_key(rng: &mut StdRng) -> Vec<u8> {
    rng.random::<[u8; 32]>().to_vec()
}

/// Mostly short values, so deep subtrees are inlined in their parents.
fn random_value(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.random_bool(0.5) { rng.random_range(1..4) } else { rng.random_range(1..=40) };
    (0..len).map(|_| rng.random()).collect()
}

/// A key sharing exactly its first `shared` nibbles with `key` (`shared < 64`).
fn near(rng: &mut StdRng, key: &[u8], shared: usize) -> Vec<u8> {
    let mut out = random_key(rng);
    for i in 0..64 {
        let n = if i < shared {
            nibble(key, i)
        } else if i == shared {
            (nibble(key, i) + rng.random_range(1..16)) % 16
        } else {
            nibble(&out, i)
        };
        let shift = if i.is_multiple_of(2) { 4 } else { 0 };
        out[i / 2] = (out[i / 2] & !(0x0f << shift)) | (n << shift);
    }
    out
}

/// Mostly deep neighbours (inlined leaves and branches), some anywhere.
fn near_depth(rng: &mut StdRng) -> usize {
    if rng.random_bool(0.5) {
        rng.random_range(60..64)
    } else {
        rng.random_range(0..64)
    }
}

/// Where `key`'s path in `trie` pruned at retention `r` meets a hash node: its nibble path
/// and hash, or `None` if the path ends above it. Read off the full trie's proof: every
/// ancestor of a node referenced by hash is referenced by hash too, so the proof's entry
/// `n` is the node at level `n`, and the pruned top layer keeps levels `0..=r`.
fn hash_node_on_path(trie: &Trie, key: &[u8], r: usize) -> Option<(Vec<u8>, B256)> {
    let proof = trie.prove(key);
    let below = proof.get(r + 1)?;
    let mut depth = 0;
    for node in &proof[..=r] {
        depth += match decode_node(node).unwrap() {
            DecodedNode::Extension { path, .. } => path.len(),
            DecodedNode::Branch { .. } => 1,
            DecodedNode::Leaf { .. } => unreachable!("a leaf ends the proof"),
        };
    }
    Some(((0..depth).map(|i| nibble(key, i)).collect(), keccak256(below)))
}

/// Per key: (readable with the full witness, readable with the witness compacted at r + 1).
fn oracle(t0: &Trie, t1: &Trie, key: &[u8], r: usize) -> (bool, bool) {
    let Some((path, hash)) = hash_node_on_path(t1, key, r) else { return (true, true) };
    assert_eq!(t1.subtree_hash_at(&path), Some(hash));
    if t0.subtree_hash_at(&path) != Some(hash) {
        return (false, false);
    }
    let level_in_t0 = t0.prove(key).iter().position(|node| keccak256(node) == hash);
    assert!(level_in_t0.is_some(), "the node at a prefix of the key's path is in its proof");
    (true, level_in_t0.is_some_and(|level| level > r))
}

struct Case {
    t0: Trie,
    t1: Trie,
    proven: Vec<Vec<u8>>,
}

fn make_case(seed: u64, size: usize, updates: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let existing: Vec<Vec<u8>> = (0..size).map(|_| random_key(&mut rng)).collect();
    let mut t0 = Trie::new();
    t0.insert_many(existing.iter().map(|k| (k.clone(), random_value(&mut rng))).collect());

    let mut proven: Vec<Vec<u8>> = Vec::new();
    for _ in 0..rng.random_range(1..=6) {
        let choice = rng.random_range(0..10);
        let key = match choice {
            0..=4 => existing[rng.random_range(0..size)].clone(),
            5..=6 => random_key(&mut rng),
            _ => {
                let base = existing[rng.random_range(0..size)].clone();
                let shared = near_depth(&mut rng);
                near(&mut rng, &base, shared)
            }
        };
        // Some proven keys get deep neighbours already in T0.
        if rng.random_bool(0.3) {
            let shared = near_depth(&mut rng);
            let neighbour = near(&mut rng, &key, shared);
            t0.insert(&neighbour, &random_value(&mut rng));
        }
        if !proven.contains(&key) {
            proven.push(key);
        }
    }

    // How many updates touch the proven keys' neighbourhood varies from case to case, so
    // that both verdicts are common.
    let focus = rng.random_range(0.0..1.0);
    let mut t1 = t0.clone();
    for _ in 0..updates {
        let target = proven[rng.random_range(0..proven.len())].clone();
        let kind = if rng.random_bool(focus) { rng.random_range(0..4) } else { rng.random_range(4..8) };
        match kind {
            0 => t1.insert(&target, &random_value(&mut rng)),
            1 => {
                t1.remove(&target);
            }
            2 | 3 => {
                let shared = near_depth(&mut rng);
                let neighbour = near(&mut rng, &target, shared);
                t1.insert(&neighbour, &random_value(&mut rng));
            }
            4 => t1.insert(&random_key(&mut rng), &random_value(&mut rng)),
            5 => {
                t1.remove(&existing[rng.random_range(0..size)]);
            }
            6 => t1.insert(&existing[rng.random_range(0..size)], &random_value(&mut rng)),
            _ => {
                // Rewriting a value as it is changes nothing.
                let key = &existing[rng.random_range(0..size)];
                if let Some(value) = t1.get(key).map(|v| v.to_vec()) {
                    t1.insert(key, &value);
                }
            }
        }
    }
    Case { t0, t1, proven }
}

/// Revises `witness` on `t1`'s top layer pruned at `r` and checks the outcome against
/// `readable` (the oracle's verdict per proven key).
fn check_revision(case: &Case, witness: &NodeBag, r: usize, readable: &[bool]) -> Result<(), TestCaseError> {
    let (r0, r1) = (case.t0.root_hash(), case.t1.root_hash());
    let mut top = PartialTrie::from(case.t1.clone());
    top.prune(r);
    let nodes_before = top.node_count();
    for key in &case.proven {
        // The oracle's walk and the top layer agree on where the path stops.
        let stop = hash_node_on_path(&case.t1, key, r);
        match top.get(key) {
            Ok(value) => {
                prop_assert!(stop.is_none());
                prop_assert_eq!(value, case.t1.get(key));
            }
            Err(stopped) => {
                let (path, hash) = stop.unwrap();
                prop_assert_eq!(stopped.path.as_slice(), &path[..]);
                prop_assert_eq!(stopped.hash, hash);
            }
        }
    }
    let accept = readable.iter().all(|&r| r);
    match top.revise(witness, r0) {
        Ok(revision) => {
            prop_assert!(accept, "accepted, but the oracle says {:?}", readable);
            prop_assert_eq!(revision.root_matched, r0 == r1);
            for key in &case.proven {
                prop_assert_eq!(top.get(key).unwrap(), case.t1.get(key));
            }
            prop_assert_eq!(top.root_hash(), r1);
        }
        Err(RevisionError::SubtreeChanged { key, .. }) => {
            prop_assert!(!accept, "rejected for {}, but the oracle says every key is readable", key);
            let first = readable.iter().position(|&r| !r).unwrap();
            prop_assert_eq!(key, virga_core::hex::encode_prefixed(&case.proven[first]));
            prop_assert_eq!(top.root_hash(), r1);
            prop_assert_eq!(top.node_count(), nodes_before);
        }
        Err(other) => prop_assert!(false, "a genuine witness is never malformed: {}", other),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn revision_is_accepted_exactly_when_every_proven_subtree_is_unchanged(
        seed in any::<u64>(),
        size in 200usize..2000,
        updates in 0usize..6,
        r in 0usize..4,
    ) {
        let case = make_case(seed, size, updates);
        let r0 = case.t0.root_hash();
        let witness = case.t0.prove_many(&case.proven, 0);
        let values: Vec<Option<Vec<u8>>> = case.proven.iter().map(|k| case.t0.get(k).map(|v| v.to_vec())).collect();
        prop_assert_eq!(witness.verify(r0).unwrap(), values);

        let verdicts: Vec<(bool, bool)> = case.proven.iter().map(|k| oracle(&case.t0, &case.t1, k, r)).collect();
        let full: Vec<bool> = verdicts.iter().map(|v| v.0).collect();
        let compacted: Vec<bool> = verdicts.iter().map(|v| v.1).collect();
        check_revision(&case, &witness, r, &full)?;

        let compact = witness.compact(r0, r + 1).unwrap();
        prop_assert_eq!(&compact, &case.t0.prove_many(&case.proven, r + 1));
        check_revision(&case, &compact, r, &compacted)?;
    }
}

/// The exception for compacted witnesses, made to happen: an extension above the proven
/// subtree splits, so the subtree moves one level down while its hash stays.
#[test]
fn a_compacted_witness_misses_a_subtree_that_moved_down() {
    let mut t0 = Trie::new();
    // Two keys under 0xab: the root is an extension 'a b' to a branch at path [a, b].
    let x = [vec![0xab, 0x10], vec![0; 30]].concat();
    let y = [vec![0xab, 0x20], vec![0; 30]].concat();
    t0.insert(&x, &[1; 40]);
    t0.insert(&y, &[2; 40]);
    let r0 = t0.root_hash();
    let witness = t0.prove_many(std::slice::from_ref(&x), 0);
    let mut t1 = t0.clone();
    // A key under 0xa0 splits the extension: branch at [a], then the old branch at [a, b].
    t1.insert(&[vec![0xa0], vec![0; 31]].concat(), &[3; 40]);
    let subtree = t0.subtree_hash_at(&[0xa, 0xb]).unwrap();
    assert_eq!(t1.subtree_hash_at(&[0xa, 0xb]), Some(subtree));
    // In T0 that subtree is level 1, in T1 level 2: retention 1 makes it the hash node.
    let r = 1;
    assert_eq!(oracle(&t0, &t1, &x, r), (true, false));
    let case = Case { t0, t1, proven: vec![x] };
    check_revision(&case, &witness, r, &[true]).unwrap();
    check_revision(&case, &witness.compact(r0, r + 1).unwrap(), r, &[false]).unwrap();
}

/// A subtree inlined in `T0` that outgrew 31 bytes in `T1`: the top layer has a hash node
/// where the witness only has bytes embedded in a parent, and the hashes differ, so the
/// key is unreadable. One level deeper the grown subtree is kept, and the sibling that is
/// still inlined is readable without any witness.
#[test]
fn a_subtree_that_outgrew_inlining_is_not_proven_by_the_old_witness() {
    let mut t0 = Trie::new();
    let a = [vec![0x55; 31], vec![0x00]].concat();
    let b = [vec![0x55; 31], vec![0x01]].concat();
    t0.insert(&a, &[1]);
    t0.insert(&b, &[2]);
    t0.insert(&[0x99; 32], &[3; 40]);
    let r0 = t0.root_hash();
    let witness = t0.prove_many(std::slice::from_ref(&a), 0);
    // Root branch, extension of 62 nibbles, then the branch at nibble 63 with its two
    // one-byte leaves: 22 bytes, inlined in the extension.
    let p: Vec<u8> = (0..63).map(|i| nibble(&a, i)).collect();
    assert_eq!(witness.nodes.len(), 2);
    let mut t1 = t0.clone();
    t1.insert(&b, &[2; 40]);
    assert_ne!(t0.subtree_hash_at(&p), t1.subtree_hash_at(&p));
    assert_eq!(hash_node_on_path(&t1, &a, 1).map(|stop| stop.0), Some(p));
    let case = Case { t0, t1, proven: vec![a.clone()] };
    assert_eq!(oracle(&case.t0, &case.t1, &a, 1), (false, false));
    check_revision(&case, &witness, 1, &[false]).unwrap();
    assert_eq!(oracle(&case.t0, &case.t1, &a, 2), (true, true));
    check_revision(&case, &witness, 2, &[true]).unwrap();
    check_revision(&case, &witness.compact(r0, 3).unwrap(), 2, &[true]).unwrap();
}
