#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_trie::fuzzing::node_decoder(data));
