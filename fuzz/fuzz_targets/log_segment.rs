#![no_main]

//! A log segment whose body is the input: scanning and recovery report a torn tail or
//! corruption, or return records, never panic; they agree with each other; and a log that
//! recovery accepted reopens (strictly) to the same records, each readable through the index.

use virga_core::device::{MemStorage, Storage};
use virga_log::{encode_segment_header_with, LogOptions, RecordLog, SyncPolicy, Verdict};

fn options() -> LogOptions {
    LogOptions { sync: SyncPolicy::None, ..LogOptions::default() }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let storage = MemStorage::new();
    let mut file = encode_segment_header_with(b"VIRGALOG", 1).to_vec();
    file.extend_from_slice(data);
    let segment = storage.create(&virga_log::segment_file_name(1)).expect("create segment");
    segment.write_at(&file, 0).expect("write segment");
    let report = RecordLog::scan(&storage, &options()).expect("scanning memory cannot fail to read");
    match RecordLog::recover(&storage, options()) {
        Ok((log, recovered)) => {
            assert!(!matches!(report.verdict, Verdict::Damaged(_)), "recovery accepted what the scan refused");
            assert_eq!(recovered.next_lsn, report.next_lsn);
            assert_eq!(recovered.truncated_bytes > 0, matches!(report.verdict, Verdict::TornTail(_)));
            let records: Vec<_> = log.records(1).map(|r| r.expect("an indexed record reads back")).collect();
            drop(log);
            let (again, reopened) = RecordLog::open(&storage, options()).expect("a recovered log reopens");
            assert_eq!(reopened.record_count, records.len() as u64);
            assert!(again.records(1).map(|r| r.expect("readable")).eq(records));
        }
        Err(_) => assert!(matches!(report.verdict, Verdict::Damaged(_)), "recovery refused a clean or torn log"),
    }
});
