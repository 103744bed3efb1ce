#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_log::fuzzing::log_segment(data));
