//! Black-box tests of `GroupLog`: concurrent appends, durability reporting in each sync mode,
//! fsync batching, recovery after torn or corrupt segments, and disk failures.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use virga_log::{
    segment_file_name, GroupLog, GroupLogOptions, LogError, OpenMode, Record, Recovered, SyncMode, TailRepair,
    RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};

fn options(sync: SyncMode) -> GroupLogOptions {
    GroupLogOptions { sync, ..GroupLogOptions::default() }
}

/// What opening found, with the records the visitor saw.
struct Opened {
    records: Vec<Record>,
    truncated_bytes: u64,
    repair: Option<TailRepair>,
    segments: usize,
}

/// Opens as a restarting process does (repairing a torn tail), collecting every record.
fn open(dir: &Path, options: GroupLogOptions) -> (GroupLog, Opened) {
    let mut records = Vec::new();
    let visit = |lsn, payload: &[u8]| records.push(Record { lsn, payload: payload.to_vec() });
    match GroupLog::open_with(dir, options, OpenMode::Repair, visit) {
        Ok((log, recovered)) => {
            let Recovered { truncated_bytes, repair, segments, .. } = recovered;
            (log, Opened { records, truncated_bytes, repair, segments })
        }
        Err(e) => panic!("open {}: {e}", dir.display()),
    }
}

/// A payload that names its writer and position; its length varies from 5 to 60 bytes.
fn payload(thread: usize, i: usize) -> Vec<u8> {
    let mut bytes = vec![thread as u8];
    bytes.extend_from_slice(&(i as u32).to_le_bytes());
    bytes.extend((0..(i * 7 + thread) % 56).map(|j| (i + j) as u8));
    bytes
}

/// `threads` threads append `per_thread` records each; with `wait`, every append waits for
/// durability before the next. Returns every record by LSN.
fn append_concurrently(log: &Arc<GroupLog>, threads: usize, per_thread: usize, wait: bool) -> BTreeMap<u64, Vec<u8>> {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = Arc::clone(log);
            thread::spawn(move || {
                let mut mine = Vec::with_capacity(per_thread);
                for i in 0..per_thread {
                    let bytes = payload(t, i);
                    let lsn = if wait { log.append_durable(&bytes).unwrap() } else { log.append(&bytes).unwrap() };
                    if let Some((previous, _)) = mine.last() {
                        assert!(lsn > *previous, "a thread's LSNs must follow its append order");
                    }
                    mine.push((lsn, bytes));
                }
                if let Some((last, _)) = mine.last() {
                    log.wait_durable(*last).unwrap();
                    assert!(log.durable_lsn() >= *last);
                }
                mine
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for handle in handles {
        for (lsn, bytes) in handle.join().unwrap() {
            assert!(all.insert(lsn, bytes).is_none(), "LSN {lsn} was given out twice");
        }
    }
    all
}

fn assert_recovered(recovered: &Opened, expected: &BTreeMap<u64, Vec<u8>>) {
    assert_eq!(recovered.records.len(), expected.len());
    for (record, (lsn, bytes)) in recovered.records.iter().zip(expected) {
        assert_eq!(record.lsn, *lsn);
        assert_eq!(&record.payload, bytes, "payload of LSN {lsn}");
    }
}

fn close(log: Arc<GroupLog>) -> u64 {
    match Arc::try_unwrap(log) {
        Ok(log) => log.close().unwrap(),
        Err(_) => panic!("log still shared"),
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    files
}

fn concurrent_round_trip(sync: SyncMode, threads: usize, per_thread: usize) {
    let dir = tempfile::tempdir().unwrap();
    // Small segments, so that rotation happens under concurrent appends.
    let options = GroupLogOptions { segment_bytes: 16 << 10, ..options(sync) };
    let (log, recovered) = open(dir.path(), options.clone());
    assert!(recovered.records.is_empty());
    let log = Arc::new(log);
    let records = append_concurrently(&log, threads, per_thread, false);
    let total = (threads * per_thread) as u64;
    assert_eq!(records.keys().copied().collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>());
    assert_eq!(log.last_lsn(), total);
    assert_eq!(log.sync().unwrap(), total);
    let stats = log.stats();
    assert_eq!(stats.appended, total);
    assert_eq!(stats.flushed, total);
    assert_eq!(close(log), total);

    let (log, recovered) = open(dir.path(), options);
    assert!(recovered.segments > 1, "the test should span several segments");
    assert_recovered(&recovered, &records);
    assert_eq!(recovered.truncated_bytes, 0);
    assert_eq!(log.durable_lsn(), total);
    assert_eq!(log.append(b"next").unwrap(), total + 1);
}

#[test]
fn group_mode_concurrent_appends_survive_reopen_in_lsn_order() {
    concurrent_round_trip(SyncMode::Group, 4, 10_000);
}

#[test]
fn none_mode_concurrent_appends_survive_reopen_in_lsn_order() {
    concurrent_round_trip(SyncMode::None, 4, 10_000);
}

#[test]
fn every_mode_concurrent_appends_survive_reopen_in_lsn_order() {
    concurrent_round_trip(SyncMode::Every, 4, 300);
}

#[test]
fn group_commit_shares_fsyncs_between_waiting_committers() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), options(SyncMode::Group)).0);
    // Each thread behaves like a committer: append, then wait before the next transaction.
    let records = append_concurrently(&log, 8, 250, true);
    let stats = log.stats();
    eprintln!("waiting committers: {stats:?}, {:.2} records per fsync", stats.records_per_fsync());
    assert_eq!(stats.flushed, records.len() as u64);
    // What group commit guarantees whatever the thread timing: every waited-for record is
    // durable, and no fsync was spent without a record to make durable. How many records
    // shared an fsync depends on scheduling; the group delay test below forces sharing.
    assert!(log.durable_lsn() >= *records.keys().last().unwrap());
    assert!(stats.fsyncs > 0);
    assert!(stats.fsyncs <= stats.flushed, "{stats:?}");
    close(log);
}

#[test]
fn group_commit_without_waiting_needs_few_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), options(SyncMode::Group)).0);
    let records = append_concurrently(&log, 4, 10_000, false);
    let stats = log.stats();
    eprintln!("pipelined appenders: {stats:?}, {:.2} records per fsync", stats.records_per_fsync());
    assert_eq!(stats.flushed, records.len() as u64);
    // Batching depends on scheduling; what is guaranteed is that no fsync went without a
    // record, and that closing makes every record durable.
    assert!(stats.fsyncs <= stats.flushed, "{stats:?}");
    let last = log.last_lsn();
    assert_eq!(close(log), last);
}

#[test]
fn group_delay_gathers_more_records_per_fsync() {
    let dir = tempfile::tempdir().unwrap();
    // The flusher sits out a long delay after noticing the first record, so every record
    // appended meanwhile is still staged when `sync` takes the batch: one fsync for all,
    // whatever the scheduling.
    let options = GroupLogOptions { group_delay: Duration::from_secs(60), ..options(SyncMode::Group) };
    let (log, _) = open(dir.path(), options);
    for i in 0..100 {
        log.append(&payload(0, i)).unwrap();
    }
    assert_eq!(log.sync().unwrap(), 100);
    let stats = log.stats();
    assert_eq!((stats.flushed, stats.fsyncs, stats.largest_batch), (100, 1, 100), "{stats:?}");
    // Closing cuts the delay short and spends no fsync on an empty batch.
    assert_eq!(log.close().unwrap(), 100);
}

#[test]
fn every_mode_is_durable_when_append_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), options(SyncMode::Every));
    for i in 0..50 {
        let lsn = log.append(&payload(0, i)).unwrap();
        assert_eq!(lsn, i as u64 + 1);
        assert_eq!(log.durable_lsn(), lsn);
        assert_eq!(log.last_lsn(), lsn);
    }
    let stats = log.stats();
    assert_eq!((stats.appended, stats.flushed, stats.fsyncs, stats.largest_batch), (50, 50, 50, 1));
    assert_eq!(log.sync().unwrap(), 50);
    assert_eq!(log.stats().fsyncs, 50, "nothing left to sync");
}

#[test]
fn none_mode_counts_records_durable_at_once_and_fsyncs_only_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), options(SyncMode::None));
    for i in 0..100 {
        let lsn = log.append(&payload(0, i)).unwrap();
        assert_eq!(log.durable_lsn(), lsn);
        log.wait_durable(lsn).unwrap();
    }
    assert_eq!(log.stats().fsyncs, 0);
    assert_eq!(log.sync().unwrap(), 100);
    assert_eq!(log.stats().fsyncs, 1);
    for i in 100..150 {
        log.append(&payload(0, i)).unwrap();
    }
    // Dropping writes the rest to the operating system, which a reopen reads back.
    drop(log);
    let (_, recovered) = open(dir.path(), options(SyncMode::None));
    let expected: BTreeMap<u64, Vec<u8>> = (0..150).map(|i| (i as u64 + 1, payload(0, i))).collect();
    assert_recovered(&recovered, &expected);
}

#[test]
fn wait_durable_blocks_until_the_record_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), options(SyncMode::Group));
    log.wait_durable(0).unwrap();
    let error = log.wait_durable(1).unwrap_err();
    match &error {
        LogError::Io { source, .. } => assert_eq!(source.kind(), ErrorKind::InvalidInput),
        other => panic!("unexpected error {other}"),
    }
    assert!(error.to_string().contains("LSN 1 has not been appended"), "{error}");

    let log = Arc::new(log);
    let watcher = {
        let log = Arc::clone(&log);
        thread::spawn(move || {
            let mut previous = 0;
            while previous < 2_000 {
                let durable = log.durable_lsn();
                assert!(durable >= previous, "the durable LSN went back");
                assert!(durable <= log.last_lsn(), "an LSN was durable before it was appended");
                previous = durable;
                thread::yield_now();
            }
        })
    };
    for i in 0..2_000 {
        let lsn = log.append(&payload(1, i)).unwrap();
        if i % 100 == 99 {
            log.wait_durable(lsn).unwrap();
            assert!(log.durable_lsn() >= lsn);
            // Earlier LSNs are covered too.
            log.wait_durable(lsn - 50).unwrap();
        }
    }
    watcher.join().unwrap();
    close(log);
}

#[test]
fn sync_makes_everything_appended_durable() {
    let dir = tempfile::tempdir().unwrap();
    let options = GroupLogOptions { group_delay: Duration::from_secs(3600), ..options(SyncMode::Group) };
    let (log, _) = open(dir.path(), options);
    for i in 0..10 {
        log.append(&payload(2, i)).unwrap();
    }
    // The flusher is asleep for an hour; `sync` does the work itself.
    assert_eq!(log.sync().unwrap(), 10);
    assert_eq!(log.durable_lsn(), 10);
    log.wait_durable(10).unwrap();
    let stats = log.stats();
    assert_eq!((stats.flushed, stats.fsyncs), (10, 1));
}

#[test]
fn dropping_a_group_log_flushes_what_was_staged() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), options(SyncMode::Group));
    for i in 0..500 {
        log.append(&payload(3, i)).unwrap();
    }
    drop(log);
    let (_, recovered) = open(dir.path(), options(SyncMode::Group));
    let expected: BTreeMap<u64, Vec<u8>> = (0..500).map(|i| (i as u64 + 1, payload(3, i))).collect();
    assert_recovered(&recovered, &expected);
}

#[test]
fn torn_tail_after_a_crash_is_truncated_and_earlier_records_survive() {
    let dir = tempfile::tempdir().unwrap();
    let options = GroupLogOptions { segment_bytes: 1 << 10, ..options(SyncMode::Group) };
    let (log, _) = open(dir.path(), options.clone());
    let payloads: Vec<Vec<u8>> = (0..60).map(|i| payload(4, i)).collect();
    for bytes in &payloads {
        log.append(bytes).unwrap();
    }
    assert_eq!(log.close().unwrap(), 60);

    // Cut the last record in half, as a crash during its write would.
    let last = segment_files(dir.path()).pop().unwrap();
    let len = fs::metadata(&last).unwrap().len();
    let last_record = (RECORD_HEADER_LEN + payloads[59].len()) as u64;
    let cut = len - last_record / 2;
    OpenOptions::new().write(true).open(&last).unwrap().set_len(cut).unwrap();

    let (log, recovered) = open(dir.path(), options.clone());
    assert_eq!(recovered.truncated_bytes, cut - (len - last_record));
    let repair = recovered.repair.as_ref().unwrap();
    assert_eq!(repair.segment, last);
    let expected: BTreeMap<u64, Vec<u8>> = (0..59).map(|i| (i as u64 + 1, payloads[i].clone())).collect();
    assert_recovered(&recovered, &expected);
    assert_eq!(log.durable_lsn(), 59);
    assert_eq!(log.append_durable(b"after the crash").unwrap(), 60);
    log.close().unwrap();

    let (_, recovered) = open(dir.path(), options);
    assert_eq!(recovered.truncated_bytes, 0);
    assert_eq!(recovered.records.len(), 60);
    assert_eq!(recovered.records[59].payload, b"after the crash");
}

#[test]
fn corrupt_byte_in_an_earlier_segment_is_reported_with_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let options = GroupLogOptions { segment_bytes: 512, ..options(SyncMode::Group) };
    let (log, _) = open(dir.path(), options.clone());
    for i in 0..100 {
        log.append(&payload(5, i)).unwrap();
    }
    log.close().unwrap();
    let segments = segment_files(dir.path());
    assert!(segments.len() > 3);
    let victim = &segments[1];
    let len = fs::metadata(victim).unwrap().len();
    assert!(len > SEGMENT_HEADER_LEN as u64 + 2);
    let offset = SEGMENT_HEADER_LEN as u64 + (len - SEGMENT_HEADER_LEN as u64) / 2;
    let mut file = OpenOptions::new().read(true).write(true).open(victim).unwrap();
    let mut byte = [0u8; 1];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&[byte[0] ^ 0x40]).unwrap();
    drop(file);

    let error = GroupLog::open(dir.path(), options).map(|_| ()).unwrap_err();
    match &error {
        LogError::Corrupt { segment, offset: at, .. } => {
            assert_eq!(segment, victim);
            assert!(*at <= offset);
        }
        other => panic!("expected corruption, got {other}"),
    }
    let name = victim.file_name().unwrap().to_str().unwrap();
    assert!(error.to_string().contains(name), "{error}");
}

/// Makes the log's creation of the segment starting at `base_lsn` fail, as a full or failing
/// disk would: a file of that name already exists.
fn block_segment_creation(dir: &Path, base_lsn: u64) -> PathBuf {
    let path = dir.join(segment_file_name(base_lsn));
    fs::write(&path, b"in the way").unwrap();
    path
}

/// Segments of exactly two 8-byte records each: LSN 3 starts the second segment.
fn two_records_per_segment(sync: SyncMode) -> GroupLogOptions {
    GroupLogOptions { segment_bytes: (SEGMENT_HEADER_LEN + 2 * (RECORD_HEADER_LEN + 8)) as u64, ..options(sync) }
}

#[test]
fn after_a_disk_failure_nothing_more_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let options = two_records_per_segment(SyncMode::Group);
    let (log, _) = open(dir.path(), options.clone());
    let blocker = block_segment_creation(dir.path(), 3);
    assert_eq!(log.append_durable(b"record 1").unwrap(), 1);
    assert_eq!(log.append_durable(b"record 2").unwrap(), 2);

    let lsn = log.append(b"record 3").unwrap();
    let error = log.wait_durable(lsn).unwrap_err();
    assert!(matches!(error, LogError::Poisoned { .. }), "{error}");
    assert!(error.to_string().contains(&segment_file_name(3)), "{error}");
    assert_eq!(log.durable_lsn(), 2);
    assert!(matches!(log.append(b"record 4"), Err(LogError::Poisoned { .. })));
    assert!(matches!(log.wait_durable(lsn), Err(LogError::Poisoned { .. })));
    assert!(matches!(log.sync(), Err(LogError::Poisoned { .. })));
    assert!(log.close().is_err());

    fs::remove_file(blocker).unwrap();
    let (log, recovered) = open(dir.path(), options);
    assert_eq!(recovered.records.len(), 2);
    assert_eq!(recovered.records[1].payload, b"record 2");
    assert_eq!(log.append_durable(b"record 3").unwrap(), 3);
}

#[test]
fn every_mode_reports_a_disk_failure_to_the_appender() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), two_records_per_segment(SyncMode::Every));
    block_segment_creation(dir.path(), 3);
    log.append(b"record 1").unwrap();
    log.append(b"record 2").unwrap();
    let error = log.append(b"record 3").unwrap_err();
    assert!(matches!(error, LogError::Io { op: "create", .. }), "{error}");
    assert_eq!(log.durable_lsn(), 2);
    let error = log.append(b"record 4").unwrap_err();
    assert!(matches!(error, LogError::Poisoned { .. }), "{error}");
}

#[test]
fn append_with_encodes_in_place_in_every_mode() {
    for sync in SyncMode::ALL {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path(), options(sync));
        for i in 0..20u32 {
            let lsn = log
                .append_with(16, |record| {
                    record.extend_from_slice(&[0; 4]); // length placeholder
                    record.extend_from_slice(format!("body {i}").as_bytes());
                    let body = (record.len() - 4) as u32;
                    record.as_mut_slice()[..4].copy_from_slice(&body.to_le_bytes());
                })
                .unwrap();
            assert_eq!(lsn, u64::from(i) + 1);
        }
        log.close().unwrap();
        let (_, recovered) = open(dir.path(), options(sync));
        assert_eq!(recovered.records.len(), 20, "{sync}");
        for (i, record) in recovered.records.iter().enumerate() {
            let body = format!("body {i}");
            assert_eq!(record.payload[..4], (body.len() as u32).to_le_bytes());
            assert_eq!(&record.payload[4..], body.as_bytes(), "{sync}");
        }
    }
}

#[test]
fn refused_and_panicking_appends_leave_no_trace() {
    for sync in SyncMode::ALL {
        let dir = tempfile::tempdir().unwrap();
        let options = GroupLogOptions { max_record_bytes: 16, ..options(sync) };
        let (log, _) = open(dir.path(), options.clone());
        assert_eq!(log.append(b"first").unwrap(), 1);
        assert!(matches!(log.append(&[7; 17]), Err(LogError::RecordTooLarge { len: 17, max: 16 })));
        let oversized = log.append_with(4, |record| record.extend_from_slice(&[9; 40]));
        assert!(matches!(oversized, Err(LogError::RecordTooLarge { len: 40, max: 16 })));
        let panicked = panic::catch_unwind(AssertUnwindSafe(|| {
            log.append_with(4, |record| {
                record.extend_from_slice(b"partial");
                panic!("encoder bug");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(log.append(&[1; 16]).unwrap(), 2, "{sync}: refused appends must not use up LSNs");
        assert_eq!(log.close().unwrap(), 2);

        let (_, recovered) = open(dir.path(), options);
        assert_eq!(recovered.records.len(), 2, "{sync}");
        assert_eq!(recovered.records[0].payload, b"first");
        assert_eq!(recovered.records[1].payload, [1; 16]);
    }
}

#[test]
fn a_full_staging_buffer_applies_back_pressure_without_losing_records() {
    let dir = tempfile::tempdir().unwrap();
    let options = GroupLogOptions { max_staged_bytes: 256, ..options(SyncMode::Group) };
    let log = Arc::new(open(dir.path(), options.clone()).0);
    let records = append_concurrently(&log, 4, 2_000, false);
    assert!(log.stats().largest_batch < 100, "the staging bound was not applied: {:?}", log.stats());
    close(log);
    let (_, recovered) = open(dir.path(), options);
    assert_recovered(&recovered, &records);
}

#[test]
fn truncate_prefix_keeps_later_records_and_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let options = GroupLogOptions { segment_bytes: 512, ..options(SyncMode::Group) };
    let (log, _) = open(dir.path(), options.clone());
    for i in 0..100 {
        log.append(&payload(6, i)).unwrap();
    }
    log.sync().unwrap();
    assert!(log.truncate_prefix(50).unwrap() > 0);
    assert_eq!(log.append_durable(b"after truncation").unwrap(), 101);
    log.close().unwrap();

    let (_, recovered) = open(dir.path(), options);
    let first = recovered.records[0].lsn;
    assert!(first > 1 && first <= 50, "first kept LSN {first}");
    for (record, lsn) in recovered.records.iter().zip(first..) {
        assert_eq!(record.lsn, lsn);
    }
    assert_eq!(recovered.records.last().unwrap().lsn, 101);
}

#[test]
fn sync_mode_names_round_trip_and_bad_names_are_explained() {
    for mode in SyncMode::ALL {
        assert_eq!(mode.to_string().parse::<SyncMode>(), Ok(mode));
    }
    assert_eq!("Group".parse::<SyncMode>(), Ok(SyncMode::Group));
    assert_eq!(SyncMode::default(), SyncMode::Group);
    let error = "fsync".parse::<SyncMode>().unwrap_err();
    assert_eq!(error.input, "fsync");
    let message = error.to_string();
    assert!(message.contains("\"fsync\"") && message.contains("group") && message.contains("every"), "{message}");
}

#[test]
fn group_log_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GroupLog>();
}
