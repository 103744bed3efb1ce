//! Property tests of the DSM-Tree against simple oracles:
//! - contents against a `BTreeMap`;
//! - roots against alloy-trie's `HashBuilder` (fixed-length keys) and against a naive
//!   recursive root computation written here (keys that prefix other keys);
//! - proofs against alloy-trie's independent verifier, and tampered proofs rejected.

use std::collections::BTreeMap;

use alloy_primitives::{keccak256, Bytes, B256};
use alloy_trie::{HashBuilder, Nibbles as AlloyNibbles};
use proptest::prelude::*;
use virga_trie::{verify_proof, Trie};

type Oracle = BTreeMap<Vec<u8>, Vec<u8>>;

fn hash_builder_root(oracle: &Oracle) -> B256 {
    let mut builder = HashBuilder::default();
    for (key, value) in oracle {
        builder.add_leaf(AlloyNibbles::unpack(key), value);
    }
    builder.root()
}

// --- A naive reference root, straight from the yellow paper's definition. ---

fn hex_prefix(nibbles: &[u8], leaf: bool) -> Vec<u8> {
    let mut out = Vec::new();
    virga_core::nibbles::encode_hex_prefix(nibbles, leaf, &mut out);
    out
}

fn reference(rlp: Vec<u8>) -> Vec<u8> {
    if rlp.len() < 32 {
        rlp
    } else {
        alloy_rlp::encode(keccak256(&rlp).as_slice())
    }
}

fn list(items: &[Vec<u8>]) -> Vec<u8> {
    let payload: Vec<u8> = items.concat();
    let mut out = Vec::new();
    alloy_rlp::Header { list: true, payload_length: payload.len() }.encode(&mut out);
    out.extend(payload);
    out
}

fn naive_node(entries: &[(Vec<u8>, Vec<u8>)], depth: usize) -> Vec<u8> {
    if entries.len() == 1 && entries[0].0.len() >= depth {
        let (key, value) = &entries[0];
        return list(&[alloy_rlp::encode(&hex_prefix(&key[depth..], true)[..]), alloy_rlp::encode(&value[..])]);
    }
    let shortest = entries.iter().map(|(k, _)| k.len()).min().unwrap_or(depth);
    let mut common = 0;
    while depth + common < shortest && entries.iter().all(|(k, _)| k[depth + common] == entries[0].0[depth + common]) {
        common += 1;
    }
    if common > 0 {
        let child = reference(naive_node(entries, depth + common));
        return list(&[alloy_rlp::encode(&hex_prefix(&entries[0].0[depth..depth + common], false)[..]), child]);
    }
    let mut items = Vec::with_capacity(17);
    for nibble in 0..16u8 {
        let group: Vec<_> = entries.iter().filter(|(k, _)| k.len() > depth && k[depth] == nibble).cloned().collect();
        items.push(if group.is_empty() { vec![0x80] } else { reference(naive_node(&group, depth + 1)) });
    }
    let value = entries.iter().find(|(k, _)| k.len() == depth).map(|(_, v)| v.clone()).unwrap_or_default();
    items.push(alloy_rlp::encode(&value[..]));
    list(&items)
}

fn naive_root(oracle: &Oracle) -> B256 {
    if oracle.is_empty() {
        return virga_core::EMPTY_ROOT;
    }
    let entries: Vec<_> =
        oracle.iter().map(|(k, v)| (virga_core::Nibbles::from_bytes(k).as_slice().to_vec(), v.clone())).collect();
    keccak256(naive_node(&entries, 0))
}

// --- Operation sequences. ---

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Deletes the n-th existing key (modulo the count), so deletes hit often.
    DeleteExisting(usize),
    Snapshot,
    DropSnapshot(usize),
    CheckRoot,
}

fn ops(key_len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<Op>> {
    let key = prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0x10, 0x11, 0xab, 0xff]), key_len);
    let value = prop::collection::vec(any::<u8>(), 1..48);
    let op = prop_oneof![
        6 => (key.clone(), value).prop_map(|(k, v)| Op::Put(k, v)),
        1 => key.prop_map(Op::Delete),
        3 => any::<usize>().prop_map(Op::DeleteExisting),
        1 => Just(Op::Snapshot),
        1 => any::<usize>().prop_map(Op::DropSnapshot),
        1 => Just(Op::CheckRoot),
    ];
    prop::collection::vec(op, 1..120)
}

fn check(trie: &Trie, oracle: &Oracle, fixed_length: bool) -> Result<(), TestCaseError> {
    let expected = if fixed_length { hash_builder_root(oracle) } else { naive_root(oracle) };
    // Hashed in parallel first (nothing cached yet for the changed nodes), then serially.
    prop_assert_eq!(trie.root_hash_parallel(), expected);
    prop_assert_eq!(trie.root_hash(), expected);
    for (key, value) in oracle {
        let got = trie.get(key);
        prop_assert_eq!(got.as_deref(), Some(&value[..]));
    }
    let entries: Vec<_> = trie.entries();
    let expected_entries: Vec<_> = oracle.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(entries, expected_entries);
    Ok(())
}

fn run(ops: Vec<Op>, fixed_length: bool) -> Result<(), TestCaseError> {
    let mut trie = Trie::new();
    let mut oracle = Oracle::new();
    let mut snapshots: Vec<(Trie, Oracle, B256)> = Vec::new();
    for op in ops {
        match op {
            Op::Put(key, value) => {
                trie.insert(&key, &value);
                oracle.insert(key, value);
            }
            Op::Delete(key) => {
                prop_assert_eq!(trie.remove(&key), oracle.remove(&key).is_some());
            }
            Op::DeleteExisting(n) => {
                if let Some(key) = oracle.keys().nth(n % oracle.len().max(1)).cloned() {
                    prop_assert!(trie.remove(&key));
                    oracle.remove(&key);
                }
            }
            Op::Snapshot => {
                let root = trie.root_hash();
                snapshots.push((trie.snapshot(), oracle.clone(), root));
            }
            Op::DropSnapshot(n) => {
                if !snapshots.is_empty() {
                    let (old, old_oracle, old_root) = snapshots.remove(n % snapshots.len());
                    // The old version is still intact right up to its drop.
                    prop_assert_eq!(old.root_hash(), old_root);
                    check(&old, &old_oracle, fixed_length)?;
                }
            }
            Op::CheckRoot => check(&trie, &oracle, fixed_length)?,
        }
        for (key, value) in &oracle {
            let got = trie.get(key);
            prop_assert_eq!(got.as_deref(), Some(&value[..]));
        }
    }
    check(&trie, &oracle, fixed_length)?;
    for (old, old_oracle, old_root) in &snapshots {
        prop_assert_eq!(old.root_hash(), *old_root);
        check(old, old_oracle, fixed_length)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fixed_length_keys_match_btreemap_and_hash_builder(key_len in 1usize..=4, ops in ops(4..=4)) {
        let ops = ops.into_iter().map(|op| match op {
            Op::Put(k, v) => Op::Put(k[..key_len].to_vec(), v),
            Op::Delete(k) => Op::Delete(k[..key_len].to_vec()),
            other => other,
        }).collect();
        run(ops, true)?;
    }

    #[test]
    fn variable_length_keys_match_btreemap_and_naive_root(ops in ops(0..=4)) {
        run(ops, false)?;
    }

    #[test]
    fn proofs_verify_independently_and_tampering_is_caught(
        keys in prop::collection::btree_set(prop::collection::vec(any::<u8>(), 32), 1..200),
        probe in prop::collection::vec(any::<u8>(), 32),
        flip in any::<(usize, usize, u8)>(),
    ) {
        let mut trie = Trie::new();
        for (i, key) in keys.iter().enumerate() {
            trie.insert(key, &alloy_rlp::encode(vec![i as u64, 7, 9]));
        }
        let root = trie.root_hash();
        let present = keys.iter().next().cloned().unwrap_or_default();
        for (key, expected) in [(present.clone(), trie.get(&present).map(|v| v.to_vec())), (probe.clone(), trie.get(&probe).map(|v| v.to_vec()))] {
            let proof = trie.prove(&key);
            let as_bytes: Vec<Bytes> = proof.iter().cloned().map(Bytes::from).collect();
            prop_assert!(alloy_trie::proof::verify_proof(root, AlloyNibbles::unpack(&key), expected.clone(), &as_bytes).is_ok());
            prop_assert_eq!(verify_proof(root, &key, &proof), Ok(expected.clone()));

            // One byte changed anywhere.
            let mut tampered = proof.clone();
            let node = flip.0 % tampered.len();
            let byte = flip.1 % tampered[node].len();
            tampered[node][byte] ^= flip.2.max(1);
            prop_assert!(verify_proof(root, &key, &tampered).is_err());
            // A node removed.
            let mut shortened = proof.clone();
            shortened.remove(node);
            prop_assert!(verify_proof(root, &key, &shortened).is_err());
            // The wrong root.
            prop_assert!(verify_proof(keccak256(root), &key, &proof).is_err());
        }
    }
}

#[test]
fn snapshot_is_unchanged_by_later_writes_and_shares_nodes() {
    let mut trie = Trie::new();
    for i in 0u32..1000 {
        trie.insert(keccak256(i.to_be_bytes()).as_slice(), &[1; 40]);
    }
    let old_root = trie.root_hash();
    let old = trie.snapshot();
    for i in 0u32..10 {
        trie.insert(keccak256(i.to_be_bytes()).as_slice(), &[2; 40]);
    }
    assert_eq!(old.root_hash(), old_root);
    assert_ne!(trie.root_hash(), old_root);
    assert_eq!(old.get(keccak256(0u32.to_be_bytes()).as_slice()).as_deref(), Some(&[1u8; 40][..]));
    assert_eq!(trie.get(keccak256(0u32.to_be_bytes()).as_slice()).as_deref(), Some(&[2u8; 40][..]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The one-pass bulk build gives the same trie as inserting one by one, for keys that
    /// prefix each other, duplicates (last wins) and empty values (deletes).
    #[test]
    fn bulk_build_equals_one_by_one(pairs in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0x10, 0xab, 0xff]), 0..4),
         prop::collection::vec(any::<u8>(), 0..40)),
        0..80,
    )) {
        let mut one_by_one = Trie::new();
        for (key, value) in &pairs {
            one_by_one.insert(key, value);
        }
        let mut bulk = Trie::new();
        bulk.insert_many(pairs.clone());
        prop_assert_eq!(bulk.root_hash(), one_by_one.root_hash());
        prop_assert_eq!(bulk.entries(), one_by_one.entries());
        // Into a non-empty trie the batch is applied on top.
        let mut on_top = one_by_one.clone();
        on_top.insert_many(pairs.clone());
        prop_assert_eq!(on_top.root_hash(), one_by_one.root_hash());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Interleaved batch lookups answer exactly as one-by-one gets, present or absent,
    /// for keys that prefix each other (branch values) and inline nodes.
    #[test]
    fn get_many_equals_get(
        pairs in prop::collection::vec((prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0x10, 0xab]), 0..4), prop::collection::vec(any::<u8>(), 1..40)), 0..80),
        probes in prop::collection::vec(prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0x10, 0xab, 0xff]), 0..5), 0..60),
    ) {
        let mut trie = Trie::new();
        for (key, value) in &pairs {
            trie.insert(key, value);
        }
        let keys: Vec<Vec<u8>> = pairs.iter().map(|(k, _)| k.clone()).chain(probes).collect();
        let batch = trie.get_many(&keys);
        let single: Vec<_> = keys.iter().map(|k| trie.get(k)).collect();
        prop_assert_eq!(batch, single);
    }
}

/// Accounts without code or storage are stored compactly; contracts and other values
/// are not. Mixed together, through updates, deletes, proofs, sharding and node bags,
/// every read and every root stays exactly Ethereum's.
mod compact_accounts {
    use super::*;
    use alloy_primitives::U256;
    use virga_trie::account::Account;
    use virga_trie::{PartialTrie, ShardedTrie};

    fn value(kind: u8, nonce: u64, balance: u128) -> Vec<u8> {
        let mut account = Account::with_balance(nonce, U256::from(balance));
        match kind % 4 {
            0 | 1 => account.rlp(),
            2 => {
                account.code_hash = keccak256([kind]);
                account.rlp()
            }
            _ => vec![kind; (nonce % 50) as usize + 1],
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn mixed_values_keep_ethereum_roots_and_reads(
            ops in prop::collection::vec((any::<u16>(), any::<u8>(), any::<u64>(), any::<u128>(), any::<bool>()), 1..150),
        ) {
            let mut trie = Trie::new();
            let mut sharded = ShardedTrie::new(16).unwrap();
            let mut oracle = Oracle::new();
            for (slot, kind, nonce, balance, delete) in ops {
                let key = keccak256(slot.to_be_bytes()).to_vec();
                if delete {
                    trie.remove(&key);
                    sharded.remove(&key).unwrap();
                    oracle.remove(&key);
                } else {
                    let v = value(kind, nonce, balance);
                    trie.insert(&key, &v);
                    sharded.insert(&key, &v).unwrap();
                    oracle.insert(key, v);
                }
            }
            let root = trie.root_hash();
            prop_assert_eq!(root, hash_builder_root(&oracle));
            prop_assert_eq!(sharded.root_hash(), root);
            let keys: Vec<Vec<u8>> = oracle.keys().cloned().collect();
            let mut partial = PartialTrie::from_root_hash(root);
            partial.apply_bag(&trie.prove_many(&keys, 0)).unwrap();
            for (key, expected) in &oracle {
                let got = trie.get(key);
                prop_assert_eq!(got.as_deref(), Some(&expected[..]));
                let proof: Vec<Bytes> = trie.prove(key).into_iter().map(Bytes::from).collect();
                prop_assert!(alloy_trie::proof::verify_proof(root, AlloyNibbles::unpack(key), Some(expected.clone()), &proof).is_ok());
                let from_partial = partial.get(key).unwrap();
                prop_assert_eq!(from_partial.as_deref(), Some(&expected[..]));
            }
            prop_assert_eq!(trie.entries(), oracle.clone().into_iter().collect::<Vec<_>>());
        }
    }
}
