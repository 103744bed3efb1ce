#![no_main]

//! A log segment whose body is the input: recovery reports a torn tail or corruption, or
//! returns records, never panics; and a log it accepted reopens to the same records.

use std::sync::OnceLock;

use virga_log::{LogOptions, RecordLog, SyncPolicy, SEGMENT_HEADER_LEN};

/// The 24-byte header of a valid first segment, taken from a real log once.
fn header() -> &'static [u8] {
    static HEADER: OnceLock<Vec<u8>> = OnceLock::new();
    HEADER.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = RecordLog::open(dir.path(), options()).expect("new log");
        drop(log);
        let segment = std::fs::read_dir(dir.path()).expect("list").next().expect("one segment").expect("entry").path();
        std::fs::read(segment).expect("read segment")[..SEGMENT_HEADER_LEN].to_vec()
    })
}

fn options() -> LogOptions {
    LogOptions { sync: SyncPolicy::None, ..LogOptions::default() }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(virga_log::segment_file_name(1));
    let mut file = header().to_vec();
    file.extend_from_slice(data);
    std::fs::write(&path, &file).expect("write segment");
    if let Ok((log, recovered)) = RecordLog::open(dir.path(), options()) {
        drop(log);
        let (_, again) = RecordLog::open(dir.path(), options()).expect("a recovered log reopens");
        assert_eq!(again.records.len(), recovered.records.len());
    }
});
