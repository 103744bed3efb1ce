#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_txn::wal::fuzz_decode(data));
