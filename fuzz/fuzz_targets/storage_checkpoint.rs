#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_node::fuzzing::storage_checkpoint(data));
