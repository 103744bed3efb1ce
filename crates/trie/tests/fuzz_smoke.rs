//! The fuzz targets' bodies on random inputs, so every test run exercises them without
//! the nightly toolchain `cargo fuzz` needs (see fuzz/README.md for real fuzzing).

use proptest::prelude::*;
use virga_trie::fuzzing;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn node_decoder_never_panics(data in prop::collection::vec(any::<u8>(), 0..600)) {
        fuzzing::node_decoder(&data);
    }

    #[test]
    fn mutated_proofs_never_verify_to_a_wrong_value(data in prop::collection::vec(any::<u8>(), 0..200)) {
        fuzzing::proof_verifier(&data);
    }

    #[test]
    fn mutated_bags_never_change_the_root_or_a_value(data in prop::collection::vec(any::<u8>(), 0..200)) {
        fuzzing::bag_application(&data);
    }
}

#[test]
fn decoder_accepts_every_node_of_a_real_proof() {
    let mut trie = virga_trie::Trie::new();
    for i in 0u8..200 {
        trie.insert(&[i, i], &[i; 33]);
    }
    trie.root_hash();
    for node in trie.prove(&[7, 7]) {
        assert!(virga_trie::decode_node(&node).is_ok());
    }
}
