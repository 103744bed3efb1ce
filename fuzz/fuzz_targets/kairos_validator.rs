#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_dkv::fuzzing::kairos_validator(data));
