//! Unit and property tests of the record log. They live inside the crate so that they can
//! simulate a crash (losing the user-space buffer) with [`RecordLog::crash`].

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tempfile::TempDir;

use super::*;

fn options(segment_bytes: u64, sync: SyncPolicy) -> LogOptions {
    LogOptions { segment_bytes, sync, ..LogOptions::default() }
}

fn buffered() -> LogOptions {
    options(DEFAULT_SEGMENT_BYTES, SyncPolicy::None)
}

/// A payload whose length and contents vary with `i`; every seventh one is empty.
fn payload(i: usize) -> Vec<u8> {
    let len = (i * 13) % 41;
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// What opening found, with the records the visitor saw.
struct Opened {
    records: Vec<Record>,
    truncated_bytes: u64,
    repair: Option<TailRepair>,
    next_lsn: u64,
    segments: usize,
}

/// Opens in [`OpenMode::Repair`], collecting the records through the visitor and checking
/// that reading them back through the index gives the same.
fn try_open(dir: &Path, options: LogOptions) -> Result<(RecordLog, Opened), LogError> {
    let mut records = Vec::new();
    let (log, recovered) = RecordLog::open_with(dir, options, OpenMode::Repair, |lsn, payload| {
        records.push(Record { lsn, payload: payload.to_vec() })
    })?;
    let read_back: Vec<Record> = log.records(0).collect::<Result<_, _>>().unwrap();
    assert_eq!(read_back, records, "the index reads back what the scan saw");
    assert_eq!(recovered.record_count, records.len() as u64);
    let Recovered { truncated_bytes, repair, next_lsn, segments, .. } = recovered;
    Ok((log, Opened { records, truncated_bytes, repair, next_lsn, segments }))
}

fn open(dir: &Path, options: LogOptions) -> (RecordLog, Opened) {
    match try_open(dir, options) {
        Ok(opened) => opened,
        Err(e) => panic!("open {}: {e}", dir.display()),
    }
}

/// Writes `count` records with [`payload`] and syncs; returns the payloads.
fn fill(dir: &Path, options: LogOptions, count: usize) -> Vec<Vec<u8>> {
    let (mut log, _) = open(dir, options);
    let payloads: Vec<Vec<u8>> = (0..count).map(payload).collect();
    for (i, p) in payloads.iter().enumerate() {
        assert_eq!(log.append(p).unwrap(), i as u64 + 1);
    }
    assert_eq!(log.sync().unwrap(), count as u64);
    payloads
}

fn payloads_of(recovered: &Opened) -> Vec<Vec<u8>> {
    recovered.records.iter().map(|r| r.payload.clone()).collect()
}

fn assert_consecutive(records: &[Record], first: u64) {
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.lsn, first + i as u64, "LSNs must be consecutive");
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

fn last_segment(dir: &Path) -> PathBuf {
    segment_files(dir).pop().expect("log has a segment")
}

/// Byte offsets at which each record of a segment starts, plus the end of the last one.
fn record_boundaries(segment: &Path) -> Vec<u64> {
    let bytes = fs::read(segment).unwrap();
    let mut at = SEGMENT_HEADER_LEN;
    let mut bounds = vec![at as u64];
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        at += RECORD_HEADER_LEN + len;
        bounds.push(at as u64);
    }
    assert_eq!(at, bytes.len(), "segment holds only whole records");
    bounds
}

fn copy_dir(from: &Path) -> TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), to.path().join(entry.file_name())).unwrap();
    }
    to
}

fn flip_byte(path: &Path, offset: u64, mask: u8) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize] ^= mask;
    fs::write(path, bytes).unwrap();
}

fn append_bytes(path: &Path, extra: &[u8]) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(extra).unwrap();
}

fn expect_corrupt(result: Result<(RecordLog, Opened), LogError>) -> (PathBuf, u64, String) {
    match result {
        Err(LogError::Corrupt { segment, offset, reason, .. }) => (segment, offset, reason),
        Err(other) => panic!("expected a Corrupt error, got: {other}"),
        Ok((_, recovered)) => panic!("expected a Corrupt error, recovery returned {} records", recovered.records.len()),
    }
}

#[test]
fn creates_missing_directory_and_starts_at_lsn_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a").join("wal");
    let (mut log, recovered) = open(&dir, buffered());
    assert!(recovered.records.is_empty());
    assert_eq!(recovered.truncated_bytes, 0);
    assert_eq!(recovered.next_lsn, 1);
    assert_eq!((log.next_lsn(), log.durable_lsn(), log.first_lsn()), (1, 0, 1));
    assert_eq!(log.sync().unwrap(), 0, "syncing an empty log makes nothing durable");
    assert_eq!(segment_files(&dir), vec![dir.join("00000000000000000001.seg")]);
}

#[test]
fn round_trip_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let written = fill(dir.path(), buffered(), 100);

    let (mut log, recovered) = open(dir.path(), buffered());
    assert_eq!(payloads_of(&recovered), written);
    assert_consecutive(&recovered.records, 1);
    assert_eq!(recovered.truncated_bytes, 0);
    assert_eq!(recovered.repair, None);
    assert_eq!(log.durable_lsn(), 100);
    assert_eq!(log.append(b"after reopen").unwrap(), 101);
    assert_eq!(log.durable_lsn(), 100, "SyncPolicy::None does not sync on append");
    drop(log); // flushes the buffer to the OS without fsync

    let (log, recovered) = open(dir.path(), buffered());
    assert_eq!(recovered.records.len(), 101);
    assert_eq!(recovered.records[100].payload, b"after reopen");
    assert_eq!(log.next_lsn(), 102);
}

#[test]
fn round_trip_across_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 200;
    let written = fill(dir.path(), options(segment_bytes, SyncPolicy::None), 150);

    let files = segment_files(dir.path());
    assert!(files.len() > 10, "expected many segments, got {}", files.len());
    let mut expected_base = 1;
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, segment_file_name(expected_base));
        let bounds = record_boundaries(file);
        let records = bounds.len() as u64 - 1;
        let len = fs::metadata(file).unwrap().len();
        assert!(len <= segment_bytes || records == 1, "{name} is {len} bytes with {records} records");
        expected_base += records;
    }
    assert_eq!(expected_base, 151);

    let (mut log, recovered) = open(dir.path(), options(segment_bytes, SyncPolicy::None));
    assert_eq!(payloads_of(&recovered), written);
    assert_consecutive(&recovered.records, 1);
    assert_eq!(recovered.segments, files.len());
    assert_eq!(log.segment_count(), files.len());
    assert_eq!(log.append(b"next").unwrap(), 151);
}

#[test]
fn every_policy_makes_each_append_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), options(128, SyncPolicy::Every));
    for i in 0..20 {
        let lsn = log.append(&payload(i)).unwrap();
        assert_eq!(log.durable_lsn(), lsn);
    }
    // Nothing is left in the buffer: a crash loses no record.
    log.crash();
    let (_, recovered) = open(dir.path(), options(128, SyncPolicy::Every));
    assert_eq!(recovered.records.len(), 20);
}

#[test]
fn crash_loses_only_unsynced_records() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), buffered());
    log.append(b"one").unwrap();
    log.append(b"two").unwrap();
    assert_eq!(log.sync().unwrap(), 2);
    log.append(b"three").unwrap();
    log.crash();
    let (mut log, recovered) = open(dir.path(), buffered());
    assert_eq!(payloads_of(&recovered), vec![b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(log.append(b"three again").unwrap(), 3);
}

#[test]
fn write_buffer_is_flushed_to_the_os_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions { write_buffer_bytes: 100, ..buffered() };
    let (mut log, _) = open(dir.path(), opts.clone());
    // Records are 50 bytes framed: every second append fills the buffer and writes it out.
    for i in 0..9 {
        log.append(&[i as u8; 30]).unwrap();
    }
    let on_disk = fs::metadata(last_segment(dir.path())).unwrap().len();
    assert!(on_disk > SEGMENT_HEADER_LEN as u64 + 100);
    assert_eq!(log.durable_lsn(), 0, "flushing to the OS is not an fsync");
    log.crash();
    let (_, recovered) = open(dir.path(), opts);
    assert_eq!(recovered.records.len(), 8, "only the record still buffered is lost");
    assert_eq!(recovered.truncated_bytes, 0, "only whole records are written out");
}

#[test]
fn torn_tail_at_every_cut_is_truncated_and_log_continues() {
    let source = tempfile::tempdir().unwrap();
    // Small segments, so the torn segment has full segments before it.
    let opts = options(120, SyncPolicy::None);
    let written = fill(source.path(), opts.clone(), 12);
    let files = segment_files(source.path());
    assert!(files.len() >= 3);
    let last_name = files.last().unwrap().file_name().unwrap().to_owned();
    let bounds = record_boundaries(files.last().unwrap());
    let first_lsn_in_last = written.len() as u64 + 2 - bounds.len() as u64;
    let full = fs::read(files.last().unwrap()).unwrap();

    for cut in SEGMENT_HEADER_LEN as u64..=full.len() as u64 {
        let dir = copy_dir(source.path());
        let torn = dir.path().join(&last_name);
        fs::write(&torn, &full[..cut as usize]).unwrap();

        let (mut log, recovered) = open(dir.path(), opts.clone());
        let whole_in_last = bounds.iter().filter(|&&b| b <= cut).count() as u64 - 1;
        let kept = (first_lsn_in_last - 1 + whole_in_last) as usize;
        let valid_end = bounds[whole_in_last as usize];
        assert_eq!(payloads_of(&recovered), written[..kept], "cut at {cut}");
        assert_consecutive(&recovered.records, 1);
        assert_eq!(recovered.truncated_bytes, cut - valid_end, "cut at {cut}");
        match &recovered.repair {
            None => assert_eq!(cut, valid_end),
            Some(repair) => {
                assert_eq!(repair.segment, torn);
                assert_eq!(repair.offset, valid_end);
            }
        }
        assert_eq!(fs::metadata(&torn).unwrap().len(), valid_end);

        let lsn = log.append(b"after the tear").unwrap();
        assert_eq!(lsn, kept as u64 + 1);
        log.sync().unwrap();
        drop(log);
        let (_, recovered) = open(dir.path(), opts.clone());
        assert_eq!(recovered.truncated_bytes, 0);
        assert_eq!(recovered.records.len(), kept + 1);
        assert_eq!(recovered.records[kept].payload, b"after the tear");
        assert_consecutive(&recovered.records, 1);
    }
}

#[test]
fn zero_filled_and_garbage_tails_are_truncated() {
    for tail in [vec![0u8; 4096], vec![0u8; 7], b"not a record at all".to_vec()] {
        let dir = tempfile::tempdir().unwrap();
        let written = fill(dir.path(), buffered(), 5);
        let segment = last_segment(dir.path());
        let len_before = fs::metadata(&segment).unwrap().len();
        append_bytes(&segment, &tail);

        let (_, recovered) = open(dir.path(), buffered());
        assert_eq!(payloads_of(&recovered), written);
        assert_eq!(recovered.truncated_bytes, tail.len() as u64);
        assert_eq!(recovered.repair.as_ref().unwrap().offset, len_before);
        assert_eq!(fs::metadata(&segment).unwrap().len(), len_before);
    }
}

#[test]
fn reading_reports_what_open_would_recover_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let written = fill(dir.path(), options(120, SyncPolicy::None), 12);
    assert!(segment_files(dir.path()).len() >= 3);
    let segment = last_segment(dir.path());
    let len_before = fs::metadata(&segment).unwrap().len();
    append_bytes(&segment, b"torn");

    let read = read_all(dir.path(), buffered()).unwrap();
    assert_eq!(read.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(), written);
    let report = RecordLog::scan(dir.path(), &buffered()).unwrap();
    assert!(matches!(&report.verdict, Verdict::TornTail(tail) if tail.bytes == 4 && tail.segment == segment));
    let (read_only, recovered) = RecordLog::open_with(dir.path(), buffered(), OpenMode::ReadOnly, |_, _| {}).unwrap();
    assert_eq!((recovered.truncated_bytes, recovered.repair.as_ref().map(|r| r.bytes)), (0, Some(4)));
    assert_eq!(read_only.read(12).unwrap(), written[11]);
    assert!(matches!(read_only.records(1).count(), 12));
    drop(read_only);
    assert_eq!(fs::metadata(&segment).unwrap().len(), len_before + 4, "reading cut nothing");
    let strict = RecordLog::open(dir.path(), buffered());
    assert!(matches!(&strict, Err(LogError::TornTail { tail }) if tail.offset == len_before), "{strict:?}");
    assert!(strict.unwrap_err().to_string().contains("repair"));
    assert_eq!(fs::metadata(&segment).unwrap().len(), len_before + 4, "a refused open cut nothing");
    let (_, opened) = open(dir.path(), buffered());
    assert_eq!((payloads_of(&opened), opened.truncated_bytes, opened.next_lsn), (written, 4, report.next_lsn));
    assert_eq!(fs::metadata(&segment).unwrap().len(), len_before, "opening cut the tail");
    assert_eq!(RecordLog::scan(dir.path(), &buffered()).unwrap().verdict, Verdict::Clean);

    // Damage that opening refuses is reported by scanning, and refused by reading.
    let first = segment_files(dir.path()).remove(0);
    flip_byte(&first, SEGMENT_HEADER_LEN as u64 + 2, 0xFF);
    assert!(matches!(read_all(dir.path(), buffered()), Err(LogError::Corrupt { .. })));
    match RecordLog::scan(dir.path(), &buffered()).unwrap().verdict {
        Verdict::Damaged(damage) => {
            assert_eq!((damage.segment, damage.offset, damage.lsn), (first, SEGMENT_HEADER_LEN as u64, Some(1)))
        }
        other => panic!("expected damage, got {other:?}"),
    }
    assert!(matches!(RecordLog::repair(dir.path(), &buffered()), Err(LogError::Corrupt { .. })));
    // An absent directory is an error, not an empty log; an empty one is an empty log.
    assert!(read_all(dir.path().join("missing"), buffered()).is_err());
    assert!(!dir.path().join("missing").exists(), "reading created nothing");
    let empty = tempfile::tempdir().unwrap();
    assert!(read_all(empty.path(), buffered()).unwrap().is_empty());
}

#[test]
fn flipped_byte_in_last_record_is_truncated() {
    let source = tempfile::tempdir().unwrap();
    let written = fill(source.path(), buffered(), 4);
    let segment_name = last_segment(source.path()).file_name().unwrap().to_owned();
    let bounds = record_boundaries(&last_segment(source.path()));
    let (start, end) = (bounds[bounds.len() - 2], bounds[bounds.len() - 1]);
    assert!(end - start > RECORD_HEADER_LEN as u64, "last record has a payload");

    for offset in start..end {
        for mask in [0x01, 0x80, 0xFF] {
            let dir = copy_dir(source.path());
            let segment = dir.path().join(&segment_name);
            flip_byte(&segment, offset, mask);
            let (mut log, recovered) = open(dir.path(), buffered());
            assert_eq!(payloads_of(&recovered), written[..3], "flip {mask:#x} at {offset}");
            assert_eq!(recovered.truncated_bytes, end - start);
            assert_eq!(log.append(b"x").unwrap(), 4);
        }
    }
}

/// Damage to a record that intact records follow, in the last segment, is not a torn write:
/// truncating there would silently drop acknowledged records.
#[test]
fn flipped_byte_before_intact_records_of_the_last_segment_is_corruption() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path(), buffered(), 6);
    let segment_name = last_segment(source.path()).file_name().unwrap().to_owned();
    let bounds = record_boundaries(&last_segment(source.path()));
    // Every byte of every record but the last one.
    for offset in bounds[0]..bounds[bounds.len() - 2] {
        let dir = copy_dir(source.path());
        let segment = dir.path().join(&segment_name);
        flip_byte(&segment, offset, 0xFF);
        let (path, _, reason) = expect_corrupt(try_open(dir.path(), buffered()));
        assert_eq!(path, segment, "flip at {offset}");
        assert!(reason.contains("not a torn write"), "flip at {offset}: {reason}");
        assert_eq!(fs::metadata(&segment).unwrap().len(), bounds[bounds.len() - 1], "nothing was cut");
    }
}

#[test]
fn flipped_byte_in_earlier_segment_is_corruption() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path(), options(120, SyncPolicy::None), 12);
    let files = segment_files(source.path());
    assert!(files.len() >= 3);

    for victim in [0, 1, files.len() - 2] {
        let name = files[victim].file_name().unwrap();
        let bounds = record_boundaries(&files[victim]);
        // A byte in the payload (or the header, if empty) of the segment's last record.
        let record_start = bounds[bounds.len() - 2];
        let target = bounds[bounds.len() - 1] - 1;
        let dir = copy_dir(source.path());
        let path = dir.path().join(name);
        flip_byte(&path, target, 0x20);

        let result = try_open(dir.path(), options(120, SyncPolicy::None));
        let (segment, offset, reason) = expect_corrupt(result);
        assert_eq!(segment, path);
        assert_eq!(offset, record_start);
        assert!(reason.contains("checksum"), "{reason}");
        // The file was left alone for inspection.
        assert_eq!(fs::read(&path).unwrap().len() as u64, bounds[bounds.len() - 1]);
    }
}

#[test]
fn corruption_error_names_file_and_offset() {
    let error = LogError::Corrupt {
        segment: PathBuf::from("/wal/00000000000000000007.seg"),
        offset: 4242,
        lsn: Some(77),
        reason: "record checksum mismatch".to_string(),
    };
    let message = error.to_string();
    assert!(message.contains("LSN 77"), "{message}");
    assert!(message.contains("/wal/00000000000000000007.seg"), "{message}");
    assert!(message.contains("4242"), "{message}");
    assert!(message.contains("checksum"), "{message}");
}

/// Rewrites the length field of the record at `offset` and recomputes its checksum over the
/// bytes that follow it in the file, so that only the length check can catch it.
fn forge_length(path: &Path, offset: u64, len: u32) {
    let mut bytes = fs::read(path).unwrap();
    let at = offset as usize;
    bytes[at + 4..at + 8].copy_from_slice(&len.to_le_bytes());
    let mut header = [0u8; RECORD_HEADER_LEN];
    header.copy_from_slice(&bytes[at..at + RECORD_HEADER_LEN]);
    let payload_end = (at + RECORD_HEADER_LEN + len as usize).min(bytes.len());
    let crc = format::record_checksum(&header, &bytes[at + RECORD_HEADER_LEN..payload_end]);
    bytes[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
    fs::write(path, bytes).unwrap();
}

#[test]
fn huge_length_is_corruption() {
    let source = tempfile::tempdir().unwrap();
    let opts = options(120, SyncPolicy::None);
    let written = fill(source.path(), opts.clone(), 12);
    let files = segment_files(source.path());

    // In the last segment: a torn tail.
    let last_name = files.last().unwrap().file_name().unwrap();
    let bounds = record_boundaries(files.last().unwrap());
    let start = bounds[bounds.len() - 2];
    for (len, max, expected) in [
        (u32::MAX, DEFAULT_MAX_RECORD_BYTES, "maximum"),
        (DEFAULT_MAX_RECORD_BYTES + 1, DEFAULT_MAX_RECORD_BYTES, "maximum"),
        (1 << 30, u32::MAX, "only"),
    ] {
        let dir = copy_dir(source.path());
        forge_length(&dir.path().join(last_name), start, len);
        let opts = LogOptions { max_record_bytes: max, ..opts.clone() };
        let (_, recovered) = open(dir.path(), opts);
        assert_eq!(payloads_of(&recovered), written[..11]);
        let repair = recovered.repair.unwrap();
        assert_eq!(repair.offset, start);
        assert!(repair.reason.contains(expected), "{}", repair.reason);
    }

    // In an earlier segment: corruption.
    let dir = copy_dir(source.path());
    let first = dir.path().join(files[0].file_name().unwrap());
    forge_length(&first, SEGMENT_HEADER_LEN as u64, u32::MAX);
    let (segment, offset, reason) = expect_corrupt(try_open(dir.path(), opts));
    assert_eq!((segment, offset), (first, SEGMENT_HEADER_LEN as u64));
    assert!(reason.contains("maximum"), "{reason}");
}

#[test]
fn checksummed_record_with_wrong_lsn_is_corruption_even_at_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), buffered(), 3);
    let segment = last_segment(dir.path());
    let offset = fs::metadata(&segment).unwrap().len();
    let mut forged = Vec::new();
    format::encode_record(&mut forged, 9, 2, b"hi");
    append_bytes(&segment, &forged);
    let (path, at, reason) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!((path, at), (segment, offset));
    assert!(reason.contains("LSN 9"), "{reason}");
}

#[test]
fn missing_middle_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), options(120, SyncPolicy::None), 12);
    let files = segment_files(dir.path());
    fs::remove_file(&files[1]).unwrap();
    let (segment, offset, reason) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!((segment, offset), (files[2].clone(), 0));
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn renamed_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), buffered(), 3);
    let from = last_segment(dir.path());
    let to = dir.path().join(segment_file_name(5));
    fs::rename(&from, &to).unwrap();
    let (segment, _, reason) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!(segment, to);
    assert!(reason.contains("file name"), "{reason}");
}

#[test]
fn interrupted_segment_creation_is_repaired() {
    let header = format::encode_segment_header(13);
    let torn_headers: [&[u8]; 4] = [&[], &header[..10], &[0u8; SEGMENT_HEADER_LEN], &{
        let mut bad = header;
        bad[15] ^= 1;
        bad
    }];
    for torn in torn_headers {
        let dir = tempfile::tempdir().unwrap();
        let written = fill(dir.path(), options(120, SyncPolicy::None), 12);
        let last_name = last_segment(dir.path());
        let next = dir.path().join(segment_file_name(13));
        assert!(next > last_name);
        fs::write(&next, torn).unwrap();

        let (mut log, recovered) = open(dir.path(), options(120, SyncPolicy::None));
        assert_eq!(payloads_of(&recovered), written);
        assert_eq!(recovered.truncated_bytes, torn.len() as u64);
        assert_eq!(recovered.repair.as_ref().unwrap().segment, next);
        assert_eq!(log.append(b"into the repaired segment").unwrap(), 13);
        log.sync().unwrap();
        drop(log);
        assert_eq!(fs::metadata(&next).unwrap().len(), (SEGMENT_HEADER_LEN + RECORD_HEADER_LEN + 25) as u64);
        let (_, recovered) = open(dir.path(), options(120, SyncPolicy::None));
        assert_eq!(recovered.records.len(), 13);
    }
}

#[test]
fn bad_segment_header_with_data_after_it_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), buffered(), 3);
    let segment = last_segment(dir.path());
    flip_byte(&segment, 2, 0x40);
    let (path, offset, reason) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!((path, offset), (segment, 0));
    assert!(reason.contains("magic"), "{reason}");
}

#[test]
fn unrelated_files_are_ignored_and_bad_segment_names_rejected() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), buffered(), 3);
    fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    fs::write(dir.path().join("1.seg"), b"too short a name").unwrap();
    fs::write(dir.path().join("0000000000000000000x.seg"), b"").unwrap();
    let (_, recovered) = open(dir.path(), buffered());
    assert_eq!(recovered.records.len(), 3);

    let overflow = dir.path().join("99999999999999999999.seg");
    fs::write(&overflow, b"").unwrap();
    let (segment, _, _) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!(segment, overflow);
}

#[test]
fn oversized_append_is_rejected_and_log_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions { max_record_bytes: 16, ..buffered() };
    let (mut log, _) = open(dir.path(), opts.clone());
    assert_eq!(log.append(&[7; 16]).unwrap(), 1);
    match log.append(&[7; 17]) {
        Err(LogError::RecordTooLarge { len: 17, max: 16 }) => {}
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    assert_eq!(log.append(b"").unwrap(), 2);
    assert_eq!(log.sync().unwrap(), 2);
}

#[test]
fn truncate_prefix_keeps_later_records_and_lsn_continuity() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(150, SyncPolicy::None);
    let written = fill(dir.path(), opts.clone(), 60);
    let (mut log, _) = open(dir.path(), opts.clone());
    let before = log.segment_count();

    assert_eq!(log.truncate_prefix(1).unwrap(), 0);
    let removed = log.truncate_prefix(30).unwrap();
    assert!(removed > 0);
    assert_eq!(log.segment_count(), before - removed);
    let first = log.first_lsn();
    assert!(first > 1 && first <= 30, "first LSN {first}");
    assert_eq!(log.append(b"sixty-one").unwrap(), 61);
    log.sync().unwrap();
    drop(log);

    let (log, recovered) = open(dir.path(), opts.clone());
    assert_eq!(recovered.records[0].lsn, first);
    assert_consecutive(&recovered.records, first);
    assert_eq!(payloads_of(&recovered)[..60 - first as usize + 1], written[first as usize - 1..]);
    assert_eq!(recovered.records.last().unwrap().payload, b"sixty-one");
    assert_eq!(log.first_lsn(), first);
    assert_eq!(log.next_lsn(), 62);
}

#[test]
fn truncate_prefix_of_everything_keeps_lsn_numbering() {
    for before in [61, 1000, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(150, SyncPolicy::None);
        fill(dir.path(), opts.clone(), 50);
        let (mut log, _) = open(dir.path(), opts.clone());
        for i in 50..60 {
            log.append(&payload(i)).unwrap(); // unsynced: truncation must still cope
        }
        log.truncate_prefix(before).unwrap();
        assert_eq!(log.segment_count(), 1);
        assert_eq!((log.first_lsn(), log.next_lsn()), (61, 61));
        assert_eq!(segment_files(dir.path()), vec![dir.path().join(segment_file_name(61))]);
        drop(log);

        let (mut log, recovered) = open(dir.path(), opts.clone());
        assert!(recovered.records.is_empty());
        assert_eq!(recovered.next_lsn, 61);
        assert_eq!(log.durable_lsn(), 60);
        assert_eq!(log.append(b"after checkpoint").unwrap(), 61);
        log.sync().unwrap();
        drop(log);
        let (_, recovered) = open(dir.path(), opts);
        assert_eq!(recovered.records.len(), 1);
        assert_eq!(recovered.records[0].lsn, 61);
    }
}

#[test]
fn truncate_prefix_of_empty_log_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), buffered());
    assert_eq!(log.truncate_prefix(u64::MAX).unwrap(), 0);
    assert_eq!(log.append(b"a").unwrap(), 1);
}

// ---------------------------------------------------------------------------------------
// Property test: random appends, syncs, reopens, crashes with torn tails, and prefix
// truncations, against a Vec oracle.

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<u8>),
    Sync,
    /// Clean close: the buffer reaches the OS, so nothing is lost.
    Reopen,
    /// Crash: the user-space buffer is lost, the last segment is cut somewhere after its
    /// durable part (`keep` picks where), then `junk` is appended to it.
    Crash {
        keep: u64,
        junk: Vec<u8>,
    },
    /// `truncate_prefix(first_lsn + ahead)`, which may reach past the end of the log.
    TruncatePrefix {
        ahead: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..48).prop_map(Op::Append),
        2 => Just(Op::Sync),
        1 => Just(Op::Reopen),
        2 => (
            any::<u64>(),
            prop_oneof![
                Just(Vec::new()),
                (1usize..64).prop_map(|n| vec![0u8; n]),
                prop::collection::vec(any::<u8>(), 1..64),
            ]
        )
            .prop_map(|(keep, junk)| Op::Crash { keep, junk }),
        1 => any::<u8>().prop_map(|ahead| Op::TruncatePrefix { ahead: ahead % 24 }),
    ]
}

/// What the log must hold: records `base..base + payloads.len()`.
struct Oracle {
    base: u64,
    payloads: Vec<Vec<u8>>,
    /// Every record up to this LSN was acknowledged as durable.
    synced: u64,
    /// Length of the last segment when it was last synced, by path.
    synced_tail: Option<(PathBuf, u64)>,
}

impl Oracle {
    fn next_lsn(&self) -> u64 {
        self.base + self.payloads.len() as u64
    }

    fn note_sync(&mut self, dir: &Path) {
        self.synced = self.next_lsn() - 1;
        let last = last_segment(dir);
        let len = fs::metadata(&last).unwrap().len();
        self.synced_tail = Some((last, len));
    }

    /// Checks what recovery returned and adopts it.
    fn check_recovered(&mut self, log: &RecordLog, recovered: &Opened, crashed: bool) {
        let dir = log.dir().to_path_buf();
        assert_eq!(log.first_lsn(), self.base);
        let got = &recovered.records;
        assert_consecutive(got, self.base);
        assert!(got.len() <= self.payloads.len(), "recovered a record never appended");
        for (record, expected) in got.iter().zip(&self.payloads) {
            assert_eq!(&record.payload, expected, "LSN {}", record.lsn);
        }
        let recovered_to = self.base + got.len() as u64 - 1;
        assert!(
            recovered_to >= self.synced || (got.is_empty() && self.synced < self.base),
            "synced up to LSN {} but recovered only up to {recovered_to}",
            self.synced
        );
        if !crashed {
            assert_eq!(got.len(), self.payloads.len(), "clean reopen loses nothing");
            assert_eq!(recovered.truncated_bytes, 0);
        }
        self.payloads.truncate(got.len());
        assert_eq!(log.next_lsn(), self.next_lsn());
        assert_eq!(recovered.next_lsn, self.next_lsn());
        // Recovery leaves everything it returned durable.
        self.note_sync(&dir);
    }
}

fn run_ops(segment_bytes: u64, sync: SyncPolicy, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions { segment_bytes, sync, max_record_bytes: 64, write_buffer_bytes: 100 };
    let (mut log, _) = open(dir.path(), opts.clone());
    let mut oracle = Oracle { base: 1, payloads: Vec::new(), synced: 0, synced_tail: None };
    for op in ops {
        match op {
            Op::Append(p) => {
                let lsn = log.append(&p).unwrap();
                assert_eq!(lsn, oracle.next_lsn());
                oracle.payloads.push(p);
                if sync == SyncPolicy::Every {
                    assert_eq!(log.durable_lsn(), lsn);
                    oracle.note_sync(dir.path());
                }
            }
            Op::Sync => {
                let durable = log.sync().unwrap();
                assert_eq!(durable, oracle.next_lsn() - 1);
                assert_eq!(log.durable_lsn(), durable);
                oracle.note_sync(dir.path());
            }
            Op::Reopen => {
                drop(log);
                let (reopened, recovered) = open(dir.path(), opts.clone());
                oracle.check_recovered(&reopened, &recovered, false);
                log = reopened;
            }
            Op::Crash { keep, junk } => {
                log.crash();
                let last = last_segment(dir.path());
                let len = fs::metadata(&last).unwrap().len();
                // Bytes that were fsynced survive; anything after may be lost.
                let durable = match &oracle.synced_tail {
                    Some((path, synced_len)) if *path == last => *synced_len,
                    // Rotation synced everything before the last segment's header.
                    _ => SEGMENT_HEADER_LEN as u64,
                };
                let cut = durable + keep % (len - durable + 1);
                OpenOptions::new().write(true).open(&last).unwrap().set_len(cut).unwrap();
                append_bytes(&last, &junk);
                let (reopened, recovered) = open(dir.path(), opts.clone());
                oracle.check_recovered(&reopened, &recovered, true);
                if junk.is_empty() && cut == len {
                    assert_eq!(recovered.truncated_bytes, 0);
                }
                log = reopened;
            }
            Op::TruncatePrefix { ahead } => {
                let before = log.first_lsn() + u64::from(ahead);
                log.truncate_prefix(before).unwrap();
                let first = log.first_lsn();
                assert!(first >= oracle.base);
                assert!(
                    first <= before.min(oracle.next_lsn()),
                    "truncate_prefix({before}) dropped records up to {first}"
                );
                oracle.payloads.drain(..(first - oracle.base) as usize);
                oracle.base = first;
                assert_eq!(log.next_lsn(), oracle.next_lsn());
                // Deleted segments were durable; a rotation synced everything.
                if oracle.synced_tail.as_ref().is_some_and(|(p, _)| !p.exists()) {
                    oracle.synced_tail = None;
                }
            }
        }
    }
    drop(log);
    let (log, recovered) = open(dir.path(), opts);
    oracle.check_recovered(&log, &recovered, false);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn recovery_matches_oracle(
        segment_bytes in prop_oneof![Just(100u64), Just(300), Just(1 << 20)],
        every in prop::bool::weighted(0.2),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let sync = if every { SyncPolicy::Every } else { SyncPolicy::None };
        run_ops(segment_bytes, sync, ops);
    }
}

#[test]
fn segments_and_records_of_another_format_version_are_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), buffered(), 3);
    let segment = last_segment(dir.path());
    let original = fs::read(&segment).unwrap();

    // A segment header of version 0, intact otherwise: an older format.
    let mut older = original.clone();
    older[8..10].copy_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&older[0..20]);
    older[20..24].copy_from_slice(&crc.to_le_bytes());
    fs::write(&segment, &older).unwrap();
    for result in
        [RecordLog::recover(dir.path(), buffered()).map(|_| ()), RecordLog::scan(dir.path(), &buffered()).map(|_| ())]
    {
        let error = result.unwrap_err();
        assert!(matches!(error, LogError::UnsupportedFormat { found: 0, supported: 1, .. }), "{error}");
        assert!(error.to_string().contains("older"), "{error}");
    }
    assert_eq!(fs::read(&segment).unwrap(), older, "nothing was repaired");

    // A record of version 0 with a valid checksum.
    let mut record = original;
    let at = SEGMENT_HEADER_LEN;
    record[at + 1] = 0;
    let mut header = [0u8; RECORD_HEADER_LEN];
    header.copy_from_slice(&record[at..at + RECORD_HEADER_LEN]);
    let len = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
    let crc = format::record_checksum(&header, &record[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + len]);
    record[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
    fs::write(&segment, &record).unwrap();
    let (_, offset, reason) = expect_corrupt(try_open(dir.path(), buffered()));
    assert_eq!(offset, SEGMENT_HEADER_LEN as u64);
    assert!(reason.contains("format version 0, older"), "{reason}");
}

#[test]
fn records_read_back_by_lsn_from_the_buffer_and_from_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), options(150, SyncPolicy::None));
    let payloads: Vec<Vec<u8>> = (0..30).map(payload).collect();
    for (i, p) in payloads.iter().enumerate() {
        let lsn = log.append(p).unwrap();
        // Still in the write buffer, or already in a closed segment: readable either way.
        assert_eq!(log.read(lsn).unwrap(), *p, "LSN {lsn} right after its append");
        assert_eq!(log.read(i as u64 / 2 + 1).unwrap(), payloads[i / 2]);
    }
    assert!(log.segment_count() > 3);
    let location = log.location(7).unwrap();
    assert_eq!(location.payload_len as usize, payloads[6].len());
    // LSN 7 lies in a closed segment, on disk where the location says.
    let bytes = fs::read(dir.path().join(&location.segment)).unwrap();
    let start = location.offset as usize + RECORD_HEADER_LEN;
    assert_eq!(&bytes[start..start + payloads[6].len()], &payloads[6][..]);
    assert_eq!(log.read_prefix(9, 3).unwrap(), payloads[8][..3.min(payloads[8].len())]);
    assert_eq!(log.read_prefix(9, 1000).unwrap(), payloads[8]);
    let tail: Vec<Record> = log.records(25).collect::<Result<_, _>>().unwrap();
    assert_eq!(tail.iter().map(|r| r.lsn).collect::<Vec<_>>(), (25..=30).collect::<Vec<_>>());
    assert!(matches!(log.read(31), Err(LogError::NoSuchRecord { lsn: 31, first: 1, next: 31, .. })));
    assert!(matches!(log.read(0), Err(LogError::NoSuchRecord { .. })));
    log.sync().unwrap();
    let removed = log.truncate_prefix(20).unwrap();
    assert!(removed > 0);
    assert!(log.location(1).is_none());
    assert_eq!(log.records(1).next().unwrap().unwrap().lsn, log.first_lsn());
    assert_eq!(log.read(30).unwrap(), payloads[29]);
}

#[test]
fn a_read_only_log_refuses_writes_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("never");
    assert!(RecordLog::open_with(&missing, buffered(), OpenMode::ReadOnly, |_, _| {}).is_err());
    assert!(!missing.exists());
    fill(dir.path(), buffered(), 4);
    let (mut log, recovered) = RecordLog::open_with(dir.path(), buffered(), OpenMode::ReadOnly, |_, _| {}).unwrap();
    assert_eq!(recovered.record_count, 4);
    assert!(matches!(log.append(b"x"), Err(LogError::ReadOnly { .. })));
    assert!(matches!(log.sync(), Err(LogError::ReadOnly { .. })));
    assert!(matches!(log.truncate_prefix(3), Err(LogError::ReadOnly { .. })));
    assert_eq!(log.read(4).unwrap(), payload(3));
}
