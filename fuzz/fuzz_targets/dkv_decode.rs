#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_node::fuzzing::dkv_decode(data));
