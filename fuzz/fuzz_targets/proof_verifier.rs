#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_trie::fuzzing::proof_verifier(data));
