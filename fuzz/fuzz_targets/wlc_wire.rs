#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| virga_ledger::fuzzing::wlc_wire(data));
