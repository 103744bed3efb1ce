use std::fs;
use std::path::{Path, PathBuf};

use alloy_primitives::{keccak256, B256};
use virga_log::{LogOptions, RecordLog};

use super::format::{decode_prefix, encode_payload, first_block_of, is_older_format_segment};
use super::*;

fn hash_of_block(number: u64) -> B256 {
    keccak256(number.to_le_bytes())
}

fn payload_of(number: u64) -> Vec<u8> {
    let len = 5 + (number * 7 % 23) as usize;
    (0..len).map(|i| (number as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

fn options(segment_bytes: u64) -> StoreOptions {
    StoreOptions { sync: SyncPolicy::None, segment_bytes }
}

/// A store of `blocks` blocks in small segments; returns its segment files in order.
fn build(dir: &Path, blocks: u64, segment_bytes: u64) -> Vec<PathBuf> {
    let (mut store, _) = ChainStore::open(dir, options(segment_bytes)).unwrap();
    for n in 0..blocks {
        store.append(n, hash_of_block(n), &payload_of(n)).unwrap();
    }
    store.sync().unwrap();
    segment_files(dir)
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

fn snapshot(files: &[PathBuf]) -> Vec<Vec<u8>> {
    files.iter().map(|f| fs::read(f).unwrap()).collect()
}

fn restore(files: &[PathBuf], contents: &[Vec<u8>]) {
    for (file, bytes) in files.iter().zip(contents) {
        fs::write(file, bytes).unwrap();
    }
}

/// The block whose record covers `offset` in a segment starting at block `first`, or the
/// segment's first block for a header byte.
fn block_at(bytes: &[u8], first: u64, offset: usize) -> u64 {
    let mut at = SEGMENT_HEADER_LEN;
    let mut number = first;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = at + virga_log::RECORD_HEADER_LEN + len;
        if offset < end {
            return number;
        }
        at = end;
        number += 1;
    }
    number
}

fn scan_error(dir: &Path) -> StoreError {
    let mut last = None;
    for item in scan(dir) {
        last = Some(item);
    }
    match last {
        Some(Err(e)) => e,
        other => panic!("scan found no damage: {other:?}"),
    }
}

/// Appends a record through the log itself, as a buggy or hostile writer could: the log's
/// framing is valid, the chain's rules need not be.
fn append_raw_record(dir: &Path, payload: &[u8]) {
    let (mut log, _) = RecordLog::open(dir, LogOptions::default()).unwrap();
    log.append(payload).unwrap();
    log.sync().unwrap();
}

#[test]
fn segment_names_and_prefix_layout() {
    assert_eq!(segment_file_name(0), "00000000000000000001.seg");
    assert_eq!(first_block_of(Path::new("/x/00000000000000001874.seg")), Some(1873));
    assert_eq!(first_block_of(Path::new("00000000000000000000.seg")), None);
    assert_eq!(first_block_of(Path::new("00000000000000000001.blk")), None);
    assert!(is_older_format_segment("00000000000000000000.blk"));
    assert!(!is_older_format_segment("0000000000000000000.blk"));
    assert!(!is_older_format_segment("00000000000000000001.seg"));

    let hash = B256::repeat_byte(0xAB);
    let mut out = Vec::new();
    encode_payload(&mut out, 0x0102_0304_0506_0708, &hash, b"xyz");
    assert_eq!(out.len(), PREFIX_LEN + 3);
    assert_eq!(&out[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&out[8..40], hash.as_slice());
    assert_eq!(&out[40..], b"xyz");
    assert_eq!(decode_prefix(&out), Ok((0x0102_0304_0506_0708, hash)));
    assert_eq!(decode_prefix(&out[..39]), Err(Damage::ShortPrefix { len: 39 }));
}

/// On disk the store is a `virga-log` log: block `n` is the record with LSN `n + 1`, whose
/// payload is the prefix and the block's bytes.
#[test]
fn blocks_are_log_records_with_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let files = build(dir.path(), 3, 1 << 20);
    assert_eq!(files, [dir.path().join("00000000000000000001.seg")]);
    let bytes = fs::read(&files[0]).unwrap();
    assert_eq!(&bytes[0..8], b"VIRGALOG");
    let record = SEGMENT_HEADER_LEN;
    assert_eq!(bytes[record], 0xB5, "log record magic");
    assert_eq!(&bytes[record + 4..record + 8], &((PREFIX_LEN + payload_of(0).len()) as u32).to_le_bytes());
    assert_eq!(&bytes[record + 8..record + 16], &1u64.to_le_bytes(), "LSN 1");
    let payload = record + virga_log::RECORD_HEADER_LEN;
    assert_eq!(&bytes[payload..payload + 8], &0u64.to_le_bytes(), "block number 0");
    assert_eq!(&bytes[payload + 8..payload + 40], hash_of_block(0).as_slice());
    assert_eq!(&bytes[payload + 40..payload + 40 + payload_of(0).len()], payload_of(0));

    let records = virga_log::read_all(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(records.len(), 3);
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record.lsn, n as u64 + 1);
        assert_eq!(decode_prefix(&record.payload), Ok((n as u64, hash_of_block(n as u64))));
    }
}

/// Every single byte of every segment, flipped: `scan` names the block holding it, and
/// `open` either refuses naming that block or, for the last record only, cuts it as a torn
/// tail. Nothing else is ever dropped. (Segments stay below one 512-byte sector, so the
/// log's rule for sectors ending in zeros never applies here.)
#[test]
fn every_flipped_byte_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 7;
    let files = build(dir.path(), blocks, 200);
    assert!(files.len() >= 3, "want several segments, got {}", files.len());
    let original = snapshot(&files);
    assert!(original.iter().all(|bytes| bytes.len() < 512));
    let firsts: Vec<u64> = files.iter().map(|f| first_block_of(f).unwrap()).collect();
    let last_record_start = {
        let (store, _) = ChainStore::open(dir.path(), options(200)).unwrap();
        store.location(blocks - 1).unwrap().offset as usize
    };

    for (index, file) in files.iter().enumerate() {
        for offset in 0..original[index].len() {
            for mask in [0x01u8, 0xFF] {
                restore(&files, &original);
                let mut bytes = original[index].clone();
                bytes[offset] ^= mask;
                fs::write(file, &bytes).unwrap();
                let block = block_at(&original[index], firsts[index], offset);
                let context = format!("{} offset {offset} mask {mask:#x}", file.display());

                let scanned = scan_error(dir.path());
                assert_eq!(scanned.block(), Some(block), "{context}: {scanned}");

                let in_last_record = index == files.len() - 1 && offset >= last_record_start;
                match ChainStore::open(dir.path(), options(200)) {
                    Ok((store, recovery)) => {
                        assert!(in_last_record, "{context}: damage accepted: {recovery:?}");
                        assert_eq!(store.len(), blocks - 1, "{context}");
                        let repair = recovery.repair.expect("a repair");
                        assert_eq!(repair.first_dropped, blocks - 1, "{context}");
                        assert_eq!(repair.offset as usize, last_record_start, "{context}");
                        for n in 0..blocks - 1 {
                            assert_eq!(store.get_by_number(n).unwrap().unwrap(), payload_of(n), "{context}");
                        }
                    }
                    Err(error) => {
                        assert!(!in_last_record, "{context}: last record refused: {error}");
                        assert_eq!(error.block(), Some(block), "{context}: {error}");
                        assert!(matches!(error, StoreError::Corrupt { .. }), "{context}: {error}");
                        // Refusal changes nothing on disk.
                        assert_eq!(fs::read(file).unwrap(), bytes, "{context}");
                    }
                }
            }
        }
    }
}

#[test]
fn torn_tail_at_every_byte_of_the_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 5;
    let files = build(dir.path(), blocks, 1 << 20);
    let original = snapshot(&files);
    let last = &files[files.len() - 1];
    let full = original[original.len() - 1].len();
    let record_bytes = RECORD_HEADER_LEN + payload_of(blocks - 1).len();
    let start = full - record_bytes;
    for cut in start..full {
        restore(&files, &original);
        fs::OpenOptions::new().write(true).open(last).unwrap().set_len(cut as u64).unwrap();

        let scanned: Vec<_> = scan(dir.path()).collect();
        assert_eq!(scanned.iter().filter(|r| r.is_ok()).count() as u64, blocks - 1);
        match scanned.last() {
            Some(Err(StoreError::TornTail { block, offset, bytes, .. })) => {
                assert_eq!((*block, *offset as usize, *bytes as usize), (blocks - 1, start, cut - start));
            }
            Some(Ok(_)) if cut == start => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
        // The read-only open sees the same and changes nothing.
        let (store, recovery) = ChainStore::open_read_only(dir.path(), options(1 << 20)).unwrap();
        assert_eq!((store.len(), recovery.truncated_bytes), (blocks - 1, 0));
        assert_eq!(recovery.repair.is_some(), cut > start);
        assert_eq!(fs::metadata(last).unwrap().len() as usize, cut);
        drop(store);

        let (mut store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
        assert_eq!(recovery.blocks, blocks - 1);
        assert_eq!(recovery.truncated_bytes as usize, cut - start);
        assert_eq!(fs::metadata(last).unwrap().len() as usize, start);
        // The dropped block can be appended again and survives a reopen.
        store.append(blocks - 1, hash_of_block(blocks - 1), &payload_of(blocks - 1)).unwrap();
        drop(store);
        let (store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
        assert_eq!((recovery.blocks, recovery.truncated_bytes), (blocks, 0));
        assert_eq!(store.get_by_number(blocks - 1).unwrap().unwrap(), payload_of(blocks - 1));
    }
}

#[test]
fn zero_filled_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let files = build(dir.path(), 3, 1 << 20);
    let last = &files[files.len() - 1];
    let len = fs::metadata(last).unwrap().len();
    fs::OpenOptions::new().write(true).open(last).unwrap().set_len(len + 4096).unwrap();
    let error = scan_error(dir.path());
    assert!(matches!(&error, StoreError::TornTail { block: 3, bytes: 4096, .. }), "{error}");
    assert!(error.to_string().contains("zero"), "{error}");
    let (store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
    assert_eq!((store.len(), recovery.truncated_bytes), (3, 4096));
}

#[test]
fn interrupted_segment_creation_is_repaired() {
    for partial in [0usize, 1, 10, 23, 24] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), 4, 1 << 20);
        // A rotation to block 4 that crashed after creating the file: a partial header, or a
        // header-sized file whose bytes never arrived.
        let created = dir.path().join(segment_file_name(4));
        let fresh = virga_log::encode_segment_header_with(b"VIRGALOG", 5);
        let mut header = fresh.to_vec();
        header.truncate(partial);
        if partial == SEGMENT_HEADER_LEN {
            header.fill(0);
        }
        fs::write(&created, &header).unwrap();

        let error = scan_error(dir.path());
        assert!(matches!(error, StoreError::TornTail { block: 4, .. }), "{partial}: {error}");
        let (mut store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
        assert_eq!(recovery.blocks, 4);
        assert_eq!(recovery.repair.as_ref().map(|r| r.first_dropped), Some(4));
        assert_eq!(fs::read(&created).unwrap(), fresh);
        store.append(4, hash_of_block(4), &payload_of(4)).unwrap();
        assert_eq!(store.location(4).unwrap().file, created);
        drop(store);
        let (store, _) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
        assert_eq!(store.len(), 5);
        assert_eq!(scan(dir.path()).filter(|r| r.is_ok()).count(), 5);
    }
}

#[test]
fn missing_or_renamed_segments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = build(dir.path(), 8, 200);
    assert!(files.len() >= 3);
    let second_first = first_block_of(&files[1]).unwrap();

    // Missing middle segment: the blocks it held are named.
    let saved = fs::read(&files[1]).unwrap();
    fs::remove_file(&files[1]).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert_eq!(error.block(), Some(second_first), "{error}");
    assert!(error.to_string().contains("missing or duplicated"), "{error}");
    assert_eq!(scan_error(dir.path()).block(), Some(second_first));
    // The scan yields the blocks before the gap first.
    assert_eq!(scan(dir.path()).filter(|r| r.is_ok()).count() as u64, second_first);

    // The third segment copied under the second one's name: its header disagrees.
    fs::write(&files[1], fs::read(&files[2]).unwrap()).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert_eq!(error.block(), Some(second_first), "{error}");
    fs::write(&files[1], &saved).unwrap();
    assert_eq!(ChainStore::open(dir.path(), options(200)).unwrap().0.len(), 8);

    // A name whose digits exceed u64::MAX is refused, named.
    let bogus = dir.path().join("99999999999999999999.seg");
    fs::write(&bogus, virga_log::encode_segment_header_with(b"VIRGALOG", 1)).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert!(error.to_string().contains("99999999999999999999.seg"), "{error}");
    fs::remove_file(&bogus).unwrap();

    // The first segment missing: the chain no longer starts at genesis.
    fs::remove_file(&files[0]).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert!(matches!(error.damage(), Some(Damage::MissingBlocks { first }) if *first == second_first), "{error}");
    assert_eq!(error.block(), Some(0), "{error}");
    assert_eq!(scan_error(dir.path()).block(), Some(0));
    assert!(ChainStore::open_read_only(dir.path(), options(200)).is_err());
}

/// Records whose checksums verify but whose content breaks the chain's rules cannot come
/// from a torn write, so even at the very end they are refused rather than cut.
#[test]
fn records_breaking_the_chain_rules_are_refused() {
    type Case = (Vec<u8>, fn(&Damage) -> bool);
    let forged = |number: u64, hash: B256| {
        let mut payload = Vec::new();
        encode_payload(&mut payload, number, &hash, b"forged");
        payload
    };
    let cases: [Case; 4] = [
        (forged(7, hash_of_block(99)), |d| matches!(d, Damage::WrongNumber { found: 7, expected: 3 })),
        (forged(2, hash_of_block(99)), |d| matches!(d, Damage::WrongNumber { found: 2, expected: 3 })),
        (forged(3, hash_of_block(1)), |d| matches!(d, Damage::DuplicateHash { first: 1, .. })),
        (b"short".to_vec(), |d| matches!(d, Damage::ShortPrefix { len: 5 })),
    ];
    for (payload, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let files = build(dir.path(), 3, 1 << 20);
        let last = &files[files.len() - 1];
        let before = fs::read(last).unwrap();
        append_raw_record(dir.path(), &payload);
        let bytes = fs::read(last).unwrap();
        let error = ChainStore::open(dir.path(), options(1 << 20)).unwrap_err();
        assert_eq!(error.block(), Some(3));
        assert!(error.damage().is_some_and(expected), "{error}");
        assert!(
            matches!(&error, StoreError::Corrupt { file, offset, .. } if file == last && *offset == before.len() as u64),
            "{error}"
        );
        assert_eq!(fs::read(last).unwrap(), bytes, "files are left as found");
        assert!(scan_error(dir.path()).damage().is_some_and(expected));
        assert!(ChainStore::open_read_only(dir.path(), options(1 << 20)).is_err());
    }
}

/// A chain-rule violation before a torn tail is refused, and the tail is not cut.
#[test]
fn a_violation_before_a_torn_tail_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let files = build(dir.path(), 3, 1 << 20);
    let mut payload = Vec::new();
    encode_payload(&mut payload, 9, &hash_of_block(9), b"forged");
    append_raw_record(dir.path(), &payload);
    let last = &files[files.len() - 1];
    let mut bytes = fs::read(last).unwrap();
    bytes.extend_from_slice(&[0xB5, 1, 0, 0, 9, 0]);
    fs::write(last, &bytes).unwrap();
    let error = ChainStore::open(dir.path(), options(1 << 20)).unwrap_err();
    assert!(matches!(error.damage(), Some(Damage::WrongNumber { found: 9, expected: 3 })), "{error}");
    assert_eq!(fs::read(last).unwrap(), bytes);
}

#[test]
fn forged_lengths_are_bounded_before_allocating() {
    for len in [u32::MAX, MAX_PAYLOAD_BYTES + PREFIX_LEN as u32 + 1, MAX_PAYLOAD_BYTES, 1 << 30] {
        let dir = tempfile::tempdir().unwrap();
        let files = build(dir.path(), 2, 1 << 20);
        let last = &files[files.len() - 1];
        let mut bytes = fs::read(last).unwrap();
        let start = bytes.len();
        // A log record header announcing `len` bytes, with a few bytes after it.
        bytes.extend_from_slice(&[0xB5, 1, 0, 0]);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(b"short");
        fs::write(last, &bytes).unwrap();
        let error = scan_error(dir.path());
        assert!(matches!(error, StoreError::TornTail { block: 2, .. }), "{len}: {error}");
        let (store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
        assert_eq!((store.len(), recovery.truncated_bytes as usize), (2, bytes.len() - start));
    }
}

#[test]
fn appends_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
    assert!(matches!(store.append(1, hash_of_block(1), b"x"), Err(StoreError::NotNext { number: 1, expected: 0 })));
    store.append(0, hash_of_block(0), b"genesis").unwrap();
    store.append(1, hash_of_block(1), b"one").unwrap();
    assert!(matches!(store.append(1, hash_of_block(7), b"x"), Err(StoreError::NotNext { number: 1, expected: 2 })));
    assert!(matches!(store.append(3, hash_of_block(7), b"x"), Err(StoreError::NotNext { number: 3, expected: 2 })));
    let error = store.append(2, hash_of_block(0), b"x").unwrap_err();
    assert!(matches!(error, StoreError::DuplicateHash { number: 2, existing: 0, .. }), "{error}");
    let huge = vec![0u8; MAX_PAYLOAD_BYTES as usize + 1];
    assert!(matches!(store.append(2, hash_of_block(2), &huge), Err(StoreError::TooLarge { number: 2, .. })));
    // Refused appends change nothing.
    assert_eq!(store.head(), Some((1, hash_of_block(1))));
    store.append(2, hash_of_block(2), b"").unwrap();
    drop(store);
    let (store, recovery) = ChainStore::open(dir.path(), options(1 << 20)).unwrap();
    assert_eq!((recovery.blocks, recovery.truncated_bytes), (3, 0));
    assert_eq!(store.get_by_number(2).unwrap(), Some(Vec::new()));

    // A read-only store refuses to write.
    let (mut store, _) = ChainStore::open_read_only(dir.path(), options(1 << 20)).unwrap();
    assert!(matches!(store.append(3, hash_of_block(3), b"x"), Err(StoreError::ReadOnly { .. })));
    assert!(matches!(store.sync(), Err(StoreError::ReadOnly { .. })));
    assert_eq!(store.get_by_number(1).unwrap(), Some(b"one".to_vec()));
}

#[test]
fn sync_policies_move_the_durable_head() {
    let dir = tempfile::tempdir().unwrap();
    let big = StoreOptions { sync: SyncPolicy::Every, segment_bytes: 1 << 20 };
    let (mut store, _) = ChainStore::open(dir.path().join("every"), big.clone()).unwrap();
    assert_eq!(store.durable_head(), None);
    for n in 0..3 {
        store.append(n, hash_of_block(n), b"b").unwrap();
        assert_eq!(store.durable_head(), store.head());
    }

    let none = StoreOptions { sync: SyncPolicy::None, ..big.clone() };
    let (mut store, _) = ChainStore::open(dir.path().join("none"), none).unwrap();
    for n in 0..3 {
        store.append(n, hash_of_block(n), b"b").unwrap();
    }
    assert_eq!(store.durable_head(), None);
    store.sync().unwrap();
    assert_eq!(store.durable_head(), Some((2, hash_of_block(2))));

    let every3 = StoreOptions { sync: SyncPolicy::EveryN(3), ..big };
    let (mut store, _) = ChainStore::open(dir.path().join("every3"), every3).unwrap();
    let mut durable = Vec::new();
    for n in 0..7 {
        store.append(n, hash_of_block(n), b"b").unwrap();
        durable.push(store.durable_head().map(|(d, _)| d));
    }
    assert_eq!(durable, [None, None, Some(2), Some(2), Some(2), Some(5), Some(5)]);

    // Starting a segment fsyncs the one before, whatever the policy.
    let rotating = StoreOptions { sync: SyncPolicy::None, segment_bytes: 100 };
    let (mut store, _) = ChainStore::open(dir.path().join("rotating"), rotating.clone()).unwrap();
    store.append(0, hash_of_block(0), &[1; 40]).unwrap();
    assert_eq!(store.durable_head(), None);
    store.append(1, hash_of_block(1), &[2; 40]).unwrap();
    assert_eq!(store.segment_count(), 2);
    assert_eq!(store.durable_head(), Some((0, hash_of_block(0))));
    drop(store);
    // Reopening makes everything recovered durable.
    let (store, _) = ChainStore::open(dir.path().join("rotating"), rotating).unwrap();
    assert_eq!(store.durable_head(), store.head());
}

#[test]
fn reads_check_the_bytes_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = ChainStore::open(dir.path(), options(300)).unwrap();
    for n in 0..10 {
        store.append(n, hash_of_block(n), &payload_of(n)).unwrap();
    }
    let at = store.location(4).unwrap();
    let mut bytes = fs::read(&at.file).unwrap();
    bytes[at.offset as usize + RECORD_HEADER_LEN + 2] ^= 0x20;
    fs::write(&at.file, &bytes).unwrap();

    let error = store.get_by_number(4).unwrap_err();
    assert!(
        matches!(
            &error,
            StoreError::Corrupt { block: 4, damage: Damage::Record { reason }, file, offset }
                if *file == at.file && *offset == at.offset && reason.contains("checksum")
        ),
        "{error}"
    );
    assert!(error.to_string().contains("block 4"), "{error}");
    assert_eq!(store.get_by_hash(&hash_of_block(3)).unwrap(), Some(payload_of(3)));
    let read: Vec<_> = store.iter().collect();
    assert_eq!(read.len(), 5, "the iterator stops after the error");
    assert!(read[..4].iter().all(|r| r.is_ok()));
    assert_eq!(read[4].as_ref().unwrap_err().block(), Some(4));

    // A truncated file is reported, not read past.
    fs::OpenOptions::new().write(true).open(&at.file).unwrap().set_len(at.offset + 10).unwrap();
    let error = store.get_by_number(4).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { block: 4, damage: Damage::Missing, .. }), "{error}");
}

#[test]
fn index_lookups() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = ChainStore::open(dir.path(), options(250)).unwrap();
    assert!(store.is_empty());
    assert_eq!(store.get_by_number(0).unwrap(), None);
    for n in 0..12 {
        store.append(n, hash_of_block(n), &payload_of(n)).unwrap();
    }
    for n in 0..12 {
        assert_eq!(store.hash_of(n), Some(hash_of_block(n)));
        assert_eq!(store.number_of(&hash_of_block(n)), Some(n));
        assert!(store.contains_hash(&hash_of_block(n)));
        let block = store.read_block(n).unwrap().unwrap();
        assert_eq!((block.number, block.hash, block.payload), (n, hash_of_block(n), payload_of(n)));
        let at = store.location(n).unwrap();
        assert_eq!(at.record_bytes as usize, RECORD_HEADER_LEN + payload_of(n).len());
        assert!(at.file.starts_with(dir.path()));
    }
    assert_eq!(store.hash_of(12), None);
    assert_eq!(store.location(12), None);
    assert_eq!(store.number_of(&B256::ZERO), None);
    assert_eq!(store.get_by_hash(&B256::ZERO).unwrap(), None);
    assert_eq!(store.get_by_number(u64::MAX).unwrap(), None);
}

/// A directory written by chain-store format 1 (`.blk` segments, magic `VIRGACHN`) is
/// refused by every entry point with an error that says so and what to do, and is left as
/// it was: no log segment is created beside it.
#[test]
fn a_directory_of_the_older_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let older = dir.path().join("00000000000000000000.blk");
    let mut bytes = virga_log::encode_segment_header_with(b"VIRGACHN", 0).to_vec();
    bytes.extend_from_slice(&[0xC4, 1, 0, 0, 3, 0, 0, 0]);
    fs::write(&older, &bytes).unwrap();

    let check = |error: StoreError| {
        assert!(matches!(&error, StoreError::OlderFormat { file } if *file == older), "{error}");
        let message = error.to_string();
        assert!(message.contains("older chain-store format"), "{message}");
        assert!(message.contains("virga bench ledger --dir"), "{message}");
        assert!(message.contains(&older.display().to_string()), "{message}");
    };
    check(ChainStore::open(dir.path(), StoreOptions::default()).unwrap_err());
    check(ChainStore::open_read_only(dir.path(), StoreOptions::default()).unwrap_err());
    check(scan_error(dir.path()));
    let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["00000000000000000000.blk"]);
    assert_eq!(fs::read(&older).unwrap(), bytes);
}

/// A store on the memory device works as on files, and names its objects `mem:/...`.
#[test]
fn a_store_on_memory() {
    let memory = virga_core::device::MemStorage::new();
    let (mut store, _) = ChainStore::open(&memory, options(300)).unwrap();
    for n in 0..20 {
        store.append(n, hash_of_block(n), &payload_of(n)).unwrap();
    }
    assert!(store.location(19).unwrap().file.starts_with("mem:/"));
    drop(store);
    let (store, recovery) = ChainStore::open(&memory, options(300)).unwrap();
    assert_eq!(recovery.blocks, 20);
    assert_eq!(store.get_by_number(13).unwrap(), Some(payload_of(13)));
    assert_eq!(scan(&memory).filter(|b| b.is_ok()).count(), 20);
}
