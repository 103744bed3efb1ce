//! The two layers of the DSM-Tree: shards of the bottom layer and the partial top layer
//! (node bags, compaction, pruning, witness revision), checked against a full trie.

use alloy_primitives::{keccak256, B256};
use proptest::prelude::*;
use virga_trie::partial::RevisionError;
use virga_trie::shard::ShardError;
use virga_trie::{verify_proof, PartialTrie, ShardedTrie, Trie};

fn key(i: u32) -> B256 {
    keccak256(i.to_be_bytes())
}

fn value(i: u32, version: u8) -> Vec<u8> {
    alloy_rlp::encode(vec![u64::from(i), u64::from(version), 1_000_000])
}

fn full_trie(count: u32) -> Trie {
    let mut trie = Trie::new();
    for i in 0..count {
        trie.insert(key(i).as_slice(), &value(i, 0));
    }
    trie
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sharded_root_and_proofs_equal_the_whole_trie(
        keys in prop::collection::btree_set(prop::collection::vec(any::<u8>(), 1..6), 0..150),
        shard_choice in 0usize..3,
        probe in prop::collection::vec(any::<u8>(), 1..6),
    ) {
        // Keys of one length (the sharded layer is for fixed-length, hashed keys).
        let keys: Vec<Vec<u8>> = keys.into_iter().map(|mut k| { k.resize(5, 0xaa); k }).collect();
        let mut probe = probe;
        probe.resize(5, 0x00);
        let shard_count = [1, 16, 256][shard_choice];
        let mut whole = Trie::new();
        let mut sharded = ShardedTrie::new(shard_count).unwrap();
        for (i, k) in keys.iter().enumerate() {
            whole.insert(k, &[i as u8 + 1; 3]);
            sharded.insert(k, &[i as u8 + 1; 3]).unwrap();
        }
        let root = whole.root_hash();
        prop_assert_eq!(sharded.root_hash(), root);
        for k in keys.iter().take(5).chain(std::iter::once(&probe)) {
            prop_assert_eq!(sharded.prove(k), whole.prove(k));
            let verified = verify_proof(root, k, &sharded.prove(k)).unwrap();
            let expected = whole.get(k);
            prop_assert_eq!(verified.as_deref(), expected.as_deref());
        }
        // Shards live apart and come back in any order.
        let mut shards = sharded.into_shards();
        shards.reverse();
        let rebuilt = ShardedTrie::from_shards(shards).unwrap();
        prop_assert_eq!(rebuilt.root_hash(), root);
        // Removing half the keys keeps the roots equal.
        let mut rebuilt = rebuilt;
        for k in keys.iter().step_by(2) {
            whole.remove(k);
            rebuilt.remove(k).unwrap();
        }
        prop_assert_eq!(rebuilt.root_hash(), whole.root_hash());
    }
}

#[test]
fn shard_configuration_errors_are_reported() {
    assert_eq!(ShardedTrie::new(10).unwrap_err(), ShardError::BadShardCount(10));
    let mut sharded = ShardedTrie::new(256).unwrap();
    assert!(matches!(sharded.insert(&[], b"x"), Err(ShardError::KeyTooShort { .. })));
    let shard = sharded.shard(3).unwrap().clone();
    let mut shard = shard;
    assert!(matches!(shard.insert(&[0xff, 1], b"x"), Err(ShardError::WrongShard { expected: 255, actual: 3 })));
}

#[test]
fn a_root_only_trie_names_the_hash_node_that_stops_it() {
    let trie = full_trie(100);
    let root = trie.root_hash();
    let partial = PartialTrie::from_root_hash(root);
    let stopped = partial.get(key(1).as_slice()).unwrap_err();
    assert_eq!(stopped.hash, root);
    assert!(stopped.path.is_empty());
}

#[test]
fn node_bags_fill_the_top_layer_and_updates_match_the_full_trie() {
    let mut trie = full_trie(3000);
    let root = trie.root_hash();
    let wanted: Vec<B256> = (0..40).map(key).chain((5000..5010).map(key)).collect();
    let bag = trie.prove_many(&wanted, 0);
    assert_eq!(bag.verify(root).unwrap().len(), wanted.len());

    let mut partial = PartialTrie::from_root_hash(root);
    let before = partial.memory_bytes();
    let applied = partial.apply_bag(&bag).unwrap();
    assert_eq!(applied.unused, 0);
    assert_eq!(applied.attached, bag.nodes.len());
    assert_eq!(partial.memory_bytes(), before + applied.grown_bytes);
    assert_eq!(partial.root_hash(), root);
    for k in &wanted {
        assert_eq!(partial.get(k.as_slice()).unwrap(), trie.get(k.as_slice()));
    }
    // A key outside the bag stops at a hash node holding the right subtree hash.
    let outside = key(2999);
    let stopped = partial.get(outside.as_slice()).unwrap_err();
    assert!(!stopped.path.is_empty());

    // Updates and deletes (with their branch collapses) match the full trie.
    for (n, k) in wanted.iter().enumerate().take(30) {
        let new_value = value(n as u32, 9);
        if n % 3 == 0 {
            match partial.remove(k.as_slice()) {
                Ok(removed) => {
                    assert_eq!(removed, trie.remove(k.as_slice()));
                }
                // A collapse needs the sibling; the trie is unchanged and says where.
                Err(stopped) => assert!(!stopped.path.is_empty()),
            }
        } else {
            partial.insert(k.as_slice(), &new_value).unwrap();
            trie.insert(k.as_slice(), &new_value);
        }
        assert_eq!(partial.root_hash(), trie.root_hash());
    }
}

#[test]
fn tampered_bag_nodes_are_never_attached() {
    let trie = full_trie(500);
    let root = trie.root_hash();
    let mut bag = trie.prove_many(&[key(7)], 0);
    let last = bag.nodes.len() - 1;
    let byte = bag.nodes[last].len() / 2;
    bag.nodes[last][byte] ^= 0x01;
    let mut partial = PartialTrie::from_root_hash(root);
    let applied = partial.apply_bag(&bag).unwrap();
    assert_eq!(applied.unused, 1);
    assert!(partial.get(key(7).as_slice()).is_err(), "the tampered leaf is not trusted");
    assert_eq!(partial.root_hash(), root);
    // Garbage bytes are ignored the same way, never decoded.
    bag.nodes.push(vec![0xff; 40]);
    assert!(partial.apply_bag(&bag).is_ok());
}

#[test]
fn pruning_keeps_the_root_and_compacted_bags_refill_it() {
    let trie = full_trie(4000);
    let root = trie.root_hash();
    // With 4,000 keys every leaf lies at level 3 or deeper, so retention 0..=2 prunes every path.
    for retention in [0usize, 1, 2] {
        let mut partial = PartialTrie::from(trie.clone());
        let before = partial.node_count();
        partial.prune(retention);
        assert_eq!(partial.root_hash(), root);
        assert!(partial.node_count() < before);
        assert!(partial.hash_node_count() > 0);
        assert!(partial.get(key(11).as_slice()).is_err());

        // The receiver holds levels 0..=retention: a bag compacted at retention+1 suffices.
        let bag = trie.prove_many(&[key(11), key(12)], retention + 1);
        assert!(bag.node_bytes() < trie.prove_many(&[key(11), key(12)], 0).node_bytes());
        partial.apply_bag(&bag).unwrap();
        assert_eq!(partial.get(key(11).as_slice()).unwrap(), trie.get(key(11).as_slice()));
        assert_eq!(partial.root_hash(), root);

        // Compacted one level too far, the bag cannot attach.
        let mut pruned_again = PartialTrie::from(trie.clone());
        pruned_again.prune(retention);
        pruned_again.apply_bag(&trie.prove_many(&[key(13)], retention + 2)).unwrap();
        assert!(pruned_again.get(key(13).as_slice()).is_err());
    }
}

#[test]
fn witness_revision_accepts_unchanged_subtrees_and_rejects_changed_ones() {
    let mut trie = full_trie(4000);
    let old_root = trie.root_hash();
    let proven = key(21);
    let witness = trie.prove_many(&[proven], 0);

    // An unrelated account changes: the old witness still proves `proven`.
    let unrelated = (0..4000).map(key).find(|k| k[0] >> 4 != proven[0] >> 4).unwrap();
    trie.insert(unrelated.as_slice(), &value(1, 5));
    let new_root = trie.root_hash();
    assert_ne!(new_root, old_root);
    let mut top = PartialTrie::from(trie.clone());
    top.prune(1);
    let revision = top.revise(&witness, old_root).unwrap();
    assert!(!revision.root_matched);
    assert!(revision.applied.unused >= 1, "the witness's stale root node is replaced by ours");
    assert_eq!(top.get(proven.as_slice()).unwrap(), trie.get(proven.as_slice()));
    top.insert(proven.as_slice(), &value(21, 6)).unwrap();
    trie.insert(proven.as_slice(), &value(21, 6));
    assert_eq!(top.root_hash(), trie.root_hash());

    // The proven account itself changes: the old witness must be rejected.
    let mut top = PartialTrie::from(trie.clone());
    top.prune(1);
    let before = top.root_hash();
    let old_witness = witness;
    match top.revise(&old_witness, old_root) {
        Err(RevisionError::SubtreeChanged { stopped, .. }) => assert!(!stopped.path.is_empty()),
        other => panic!("expected rejection, got {other:?}"),
    }
    assert_eq!(top.root_hash(), before);
    assert!(top.get(proven.as_slice()).is_err(), "nothing of the rejected witness was kept");
}

#[test]
fn removing_a_branch_value_beside_a_hash_node_stops_cleanly() {
    let mut trie = Trie::new();
    trie.insert(&[0x01], b"a");
    let mut long_key = vec![0x01, 0x50];
    long_key.extend_from_slice(&[7; 20]);
    trie.insert(&long_key, &[9; 40]);
    let root = trie.root_hash();
    let mut partial = PartialTrie::from(trie.clone());
    partial.prune(1);
    assert!(partial.hash_node_count() > 0);
    let stopped = partial.remove(&[0x01]).unwrap_err();
    assert_eq!(stopped.path.as_slice(), &[0, 1, 5]);
    assert_eq!(partial.root_hash(), root, "a stopped remove changes nothing");
    assert!(partial.insert(&[0x01], &[]).is_err());
}

#[test]
fn bags_for_an_empty_trie_prove_absence() {
    let bag = Trie::new().prove_many(&[[1u8; 32], [2u8; 32]], 0);
    assert_eq!(bag.keys.len(), 2);
    assert_eq!(bag.verify(virga_core::EMPTY_ROOT), Ok(vec![None, None]));
}

#[test]
fn bag_nodes_with_overlong_paths_are_rejected_not_trusted() {
    // A leaf whose path has more nibbles than a node can hold, under a root made for it.
    let mut path = vec![0x20];
    path.extend(std::iter::repeat_n(0x11, 40_000));
    let mut leaf = Vec::new();
    let value = [7u8];
    let payload_length = alloy_rlp::Encodable::length(&path[..]) + alloy_rlp::Encodable::length(&value[..]);
    alloy_rlp::Header { list: true, payload_length }.encode(&mut leaf);
    alloy_rlp::Encodable::encode(&path[..], &mut leaf);
    alloy_rlp::Encodable::encode(&value[..], &mut leaf);
    let root = keccak256(&leaf);
    let mut partial = PartialTrie::from_root_hash(root);
    let bag = virga_trie::NodeBag { keys: vec![vec![0x11; 40_000]], nodes: vec![leaf] };
    assert!(matches!(partial.apply_bag(&bag), Err(virga_trie::partial::BagError::Invalid { .. })));
    assert_eq!(partial.root_hash(), root);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// A miner prunes along the paths its bags and writes touched since the last prune: with
    /// writes of existing keys the result must be exactly the whole-trie prune; inserts of
    /// new keys may leave nodes a whole prune removes, never the reverse. The memory it
    /// reports freed is exact either way.
    #[test]
    fn pruning_along_touched_paths_equals_pruning_the_whole_layer(
        count in 50u32..1500,
        retention in 0usize..4,
        attached in prop::collection::btree_set(0u32..1500, 1..40),
        written in prop::collection::vec((0usize..40, any::<u8>()), 0..20),
        inserted in prop::collection::vec(1500u32..3000, 0..5),
        keep_choice in 0usize..40,
    ) {
        let trie = full_trie(count);
        let mut top = PartialTrie::from(trie.clone());
        top.prune(retention);
        let attached: Vec<B256> = attached.into_iter().filter(|&i| i < count).map(key).collect();
        prop_assume!(!attached.is_empty());
        top.apply_bag(&trie.prove_many(&attached, 0)).unwrap();
        let mut touched = attached.clone();
        for (index, byte) in written {
            let k = attached[index % attached.len()];
            top.insert(k.as_slice(), &[byte; 12]).unwrap();
        }
        let mut new_keys = false;
        for i in inserted {
            if top.insert(key(i).as_slice(), &value(i, 1)).is_ok() {
                touched.push(key(i));
                new_keys = true;
            }
        }
        let keep = [attached[keep_choice % attached.len()]];
        let (before_root, before_bytes) = (top.root_hash(), top.memory_bytes());

        let mut whole = top.clone();
        whole.prune_keeping(retention, &keep);
        let mut along = top.clone();
        let freed = along.prune_paths(retention, &touched, &keep);
        prop_assert_eq!(along.root_hash(), before_root);
        prop_assert_eq!(before_bytes - freed, along.memory_bytes());
        prop_assert!(along.get(keep[0].as_slice()).is_ok(), "the kept path stays readable");
        if new_keys {
            prop_assert!(along.node_count() >= whole.node_count());
            along.prune_keeping(retention, &keep);
        }
        prop_assert_eq!(along.node_count(), whole.node_count());
        prop_assert_eq!(along.hash_node_count(), whole.hash_node_count());
        prop_assert_eq!(along.memory_bytes(), whole.memory_bytes());
    }
}
