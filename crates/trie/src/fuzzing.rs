//! Bodies of the fuzz targets (`fuzz/fuzz_targets/*`), kept in the library so the
//! regular test suite also runs them on random inputs with the stable toolchain.
//!
//! Each panics only on a real bug: a decoder that panics, or a verifier that accepts a
//! proof for a value the trie does not hold.

use alloy_primitives::keccak256;

use crate::{decode_node, verify_proof, PartialTrie, Trie};

/// Any bytes through the node decoder: an error or a node, never a panic; decoding is
/// deterministic.
pub fn node_decoder(data: &[u8]) {
    let first = decode_node(data);
    assert_eq!(first, decode_node(data));
}

/// A small trie built from the input, with one of its proofs mutated by the rest of
/// the input: the verifier may reject, but anything it accepts must be the truth.
pub fn proof_verifier(data: &[u8]) {
    let (trie, keys, rest) = trie_from(data);
    let root = trie.root_hash();
    let key = keys.get(rest.first().copied().unwrap_or(0) as usize % keys.len().max(1)).cloned().unwrap_or_default();
    let mut proof = trie.prove(&key);
    mutate(&mut proof, rest);
    if let Ok(value) = verify_proof(root, &key, &proof) {
        assert_eq!(value.as_deref(), trie.get(&key).as_deref(), "a mutated proof verified to a wrong value");
    }
}

/// A node bag mutated by the input applied to a root-only partial trie: the root never
/// changes, and every key it can then read holds the true value.
pub fn bag_application(data: &[u8]) {
    let (trie, keys, rest) = trie_from(data);
    let root = trie.root_hash();
    let mut bag = trie.prove_many(&keys, 0);
    mutate(&mut bag.nodes, rest);
    let mut partial = PartialTrie::from_root_hash(root);
    let _ = partial.apply_bag(&bag);
    assert_eq!(partial.root_hash(), root, "a bag changed the root");
    for key in &keys {
        if let Ok(value) = partial.get(key) {
            assert_eq!(value, trie.get(key), "a bag made a wrong value readable");
        }
    }
}

/// Up to 64 keys from the first input bytes (hashed, plus a few short raw ones so
/// inline nodes appear), and the rest of the input.
fn trie_from(data: &[u8]) -> (Trie, Vec<Vec<u8>>, &[u8]) {
    let count = data.first().map_or(0, |c| (*c as usize % 64) + 1).min(data.len());
    let (seeds, rest) = data.split_at(count);
    let mut trie = Trie::new();
    let mut keys = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        let key = if seed % 4 == 0 { vec![*seed, i as u8] } else { keccak256([*seed, i as u8]).to_vec() };
        let value = vec![seed.wrapping_add(1) | 1; (*seed as usize % 40) + 1];
        trie.insert(&key, &value);
        keys.push(key);
    }
    (trie, keys, rest)
}

/// Applies edits from `script`: each 3-byte step flips, removes or duplicates a byte or node.
fn mutate(nodes: &mut Vec<Vec<u8>>, script: &[u8]) {
    for step in script.chunks_exact(3) {
        if nodes.is_empty() {
            return;
        }
        let node = step[1] as usize % nodes.len();
        match step[0] % 4 {
            0 => {
                if !nodes[node].is_empty() {
                    let byte = step[2] as usize % nodes[node].len();
                    nodes[node][byte] ^= step[2] | 1;
                }
            }
            1 => {
                nodes.remove(node);
            }
            2 => {
                let copy = nodes[node].clone();
                nodes.push(copy);
            }
            _ => nodes[node].truncate(step[2] as usize),
        }
    }
}
