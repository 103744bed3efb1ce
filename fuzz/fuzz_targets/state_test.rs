#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_evm::fuzzing::state_test(data));
