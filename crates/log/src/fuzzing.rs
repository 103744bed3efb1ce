//! The body of the `log_segment` fuzz target, here so the crate's tests run it on random and
//! mutated segments in every test run (`fuzz/run.sh` runs it coverage-guided).

use virga_core::device::{MemStorage, Storage};

use crate::{encode_segment_header_with, segment_file_name, LogOptions, RecordLog, SyncPolicy, Verdict};

fn options() -> LogOptions {
    LogOptions { sync: SyncPolicy::None, ..LogOptions::default() }
}

/// A log segment whose body is `data`: scanning and recovery report a torn tail or damage,
/// or return records, and never panic; they agree with each other; and a log that recovery
/// accepted reopens strictly to the same records, each readable through the index.
pub fn log_segment(data: &[u8]) {
    let storage = MemStorage::new();
    let mut file = encode_segment_header_with(b"VIRGALOG", 1).to_vec();
    file.extend_from_slice(data);
    let segment = storage.create(&segment_file_name(1)).expect("create segment");
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
}

/// The body (everything after the segment header) of a clean segment holding `payloads`.
pub fn sample_segment_body(payloads: &[&[u8]]) -> Vec<u8> {
    let storage = MemStorage::new();
    let (mut log, _) = RecordLog::open(&storage, options()).expect("a fresh log on memory opens");
    for payload in payloads {
        log.append(payload).expect("appending to memory");
    }
    log.flush().expect("flushing to memory");
    drop(log);
    let segment = storage.open(&segment_file_name(1)).expect("the first segment exists");
    let len = segment.len().expect("length of a memory file") as usize;
    let mut file = vec![0; len];
    segment.read_at(&mut file, 0).expect("reading a memory file");
    file.split_off(crate::SEGMENT_HEADER_LEN)
}
