use std::fs;
use std::path::{Path, PathBuf};

use alloy_primitives::{keccak256, B256};

use super::format::{encode_record, parse_segment_file_name, RECORD_MAGIC};
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
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
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

/// The block whose record covers `offset` in a segment starting at `first`, or the segment's
/// first block for a header byte.
fn block_at(bytes: &[u8], first: u64, offset: usize) -> u64 {
    let mut at = SEGMENT_HEADER_LEN;
    let mut number = first;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = at + RECORD_HEADER_LEN + len;
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

#[test]
fn segment_file_names_round_trip() {
    assert_eq!(segment_file_name(0), "00000000000000000000.blk");
    assert_eq!(parse_segment_file_name(&segment_file_name(1873)), Some(1873));
    assert_eq!(parse_segment_file_name(&segment_file_name(u64::MAX)), Some(u128::from(u64::MAX)));
    assert_eq!(parse_segment_file_name("99999999999999999999.blk"), Some(99_999_999_999_999_999_999));
    assert_eq!(parse_segment_file_name("0000000000000000000.blk"), None);
    assert_eq!(parse_segment_file_name("00000000000000000000.seg"), None);
    assert_eq!(parse_segment_file_name("0000000000000000000x.blk"), None);
}

#[test]
fn record_layout() {
    let hash = B256::repeat_byte(0xAB);
    let mut out = Vec::new();
    encode_record(&mut out, 0x0102_0304_0506_0708, &hash, b"xyz");
    assert_eq!(out.len(), RECORD_HEADER_LEN + 3);
    assert_eq!(out[0], RECORD_MAGIC);
    assert_eq!(out[1], 1);
    assert_eq!(&out[2..4], &[0, 0]);
    assert_eq!(&out[4..8], &3u32.to_le_bytes());
    assert_eq!(&out[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&out[16..48], hash.as_slice());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[..48]);
    crc.update(b"xyz");
    assert_eq!(&out[48..52], &crc.finalize().to_le_bytes());
    assert_eq!(&out[52..], b"xyz");
}

#[test]
fn segment_header_layout() {
    let dir = tempfile::tempdir().unwrap();
    let files = build(dir.path(), 3, 1 << 20);
    let bytes = fs::read(&files[0]).unwrap();
    assert_eq!(&bytes[0..8], b"VIRGACHN");
    assert_eq!(&bytes[8..10], &1u16.to_le_bytes());
    assert_eq!(&bytes[12..20], &0u64.to_le_bytes());
    assert_eq!(&bytes[20..24], &crc32fast::hash(&bytes[0..20]).to_le_bytes());
}

/// Every single byte of every segment, flipped: `scan` names the block holding it, and
/// `open` either refuses naming that block or, for the last record only, cuts it as a torn
/// tail. Nothing else is ever dropped.
#[test]
fn every_flipped_byte_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 7;
    let files = build(dir.path(), blocks, 200);
    assert!(files.len() >= 3, "want several segments, got {}", files.len());
    let original = snapshot(&files);
    let firsts: Vec<u64> = files
        .iter()
        .map(|f| parse_segment_file_name(f.file_name().unwrap().to_str().unwrap()).unwrap() as u64)
        .collect();
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
    assert!(matches!(scan_error(dir.path()), StoreError::TornTail { block: 3, damage: Damage::ZeroFilled, .. }));
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
        let mut header = format::encode_segment_header(4).to_vec();
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
        assert_eq!(fs::read(&created).unwrap(), format::encode_segment_header(4));
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
    let second_first = parse_segment_file_name(files[1].file_name().unwrap().to_str().unwrap()).unwrap() as u64;

    // Missing middle segment: the blocks it held are named.
    let saved = fs::read(&files[1]).unwrap();
    fs::remove_file(&files[1]).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert!(matches!(error.damage(), Some(Damage::SegmentOutOfSequence { .. })), "{error}");
    assert_eq!(error.block(), Some(second_first));
    assert_eq!(scan_error(dir.path()).block(), Some(second_first));

    // The third segment copied under the second one's name: its header disagrees.
    fs::write(&files[1], fs::read(&files[2]).unwrap()).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert!(matches!(error.damage(), Some(Damage::SegmentNameMismatch { .. })), "{error}");
    assert_eq!(error.block(), Some(second_first), "{error}");
    fs::write(&files[1], &saved).unwrap();
    assert_eq!(ChainStore::open(dir.path(), options(200)).unwrap().0.len(), 8);

    // A name whose digits exceed u64::MAX sorts last and is reported there.
    fs::write(dir.path().join("99999999999999999999.blk"), format::encode_segment_header(0)).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert_eq!(error.block(), Some(8), "{error}");
    fs::remove_file(dir.path().join("99999999999999999999.blk")).unwrap();

    // The first segment missing.
    fs::remove_file(&files[0]).unwrap();
    let error = ChainStore::open(dir.path(), options(200)).unwrap_err();
    assert_eq!(error.block(), Some(0), "{error}");
}

/// Records whose checksums verify but whose content breaks the chain's rules cannot come
/// from a torn write, so even at the very end they are refused rather than cut.
#[test]
fn forged_records_with_valid_checksums_are_refused() {
    type Case = (u64, B256, fn(&Damage) -> bool);
    let cases: [Case; 3] = [
        (7, hash_of_block(99), |d| matches!(d, Damage::WrongNumber { found: 7, expected: 3 })),
        (2, hash_of_block(99), |d| matches!(d, Damage::WrongNumber { found: 2, expected: 3 })),
        (3, hash_of_block(1), |d| matches!(d, Damage::DuplicateHash { first: 1, .. })),
    ];
    for (number, hash, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let files = build(dir.path(), 3, 1 << 20);
        let last = &files[files.len() - 1];
        let mut bytes = fs::read(last).unwrap();
        encode_record(&mut bytes, number, &hash, b"forged");
        fs::write(last, &bytes).unwrap();
        let error = ChainStore::open(dir.path(), options(1 << 20)).unwrap_err();
        assert_eq!(error.block(), Some(3));
        assert!(error.damage().is_some_and(expected), "{error}");
        assert_eq!(fs::read(last).unwrap(), bytes, "files are left as found");
        assert!(scan_error(dir.path()).damage().is_some_and(expected));
    }
}

#[test]
fn forged_lengths_are_bounded_before_allocating() {
    for len in [u32::MAX, MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES, 1 << 30] {
        let dir = tempfile::tempdir().unwrap();
        let files = build(dir.path(), 2, 1 << 20);
        let last = &files[files.len() - 1];
        let mut bytes = fs::read(last).unwrap();
        let start = bytes.len();
        encode_record(&mut bytes, 2, &hash_of_block(2), b"short");
        bytes[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
        fs::write(last, &bytes).unwrap();
        let error = scan_error(dir.path());
        assert!(
            matches!(error.damage(), Some(Damage::LengthTooLarge { .. } | Damage::LengthPastEnd { .. })),
            "{len}: {error}"
        );
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
}

#[test]
fn sync_policies_move_the_durable_head() {
    let dir = tempfile::tempdir().unwrap();
    let big = StoreOptions { sync: SyncPolicy::Every, segment_bytes: 1 << 20 };
    let (mut store, _) = ChainStore::open(&dir.path().join("every"), big.clone()).unwrap();
    assert_eq!(store.durable_head(), None);
    for n in 0..3 {
        store.append(n, hash_of_block(n), b"b").unwrap();
        assert_eq!(store.durable_head(), store.head());
    }

    let none = StoreOptions { sync: SyncPolicy::None, ..big.clone() };
    let (mut store, _) = ChainStore::open(&dir.path().join("none"), none).unwrap();
    for n in 0..3 {
        store.append(n, hash_of_block(n), b"b").unwrap();
    }
    assert_eq!(store.durable_head(), None);
    store.sync().unwrap();
    assert_eq!(store.durable_head(), Some((2, hash_of_block(2))));

    let every3 = StoreOptions { sync: SyncPolicy::EveryN(3), ..big };
    let (mut store, _) = ChainStore::open(&dir.path().join("every3"), every3).unwrap();
    let mut durable = Vec::new();
    for n in 0..7 {
        store.append(n, hash_of_block(n), b"b").unwrap();
        durable.push(store.durable_head().map(|(d, _)| d));
    }
    assert_eq!(durable, [None, None, Some(2), Some(2), Some(2), Some(5), Some(5)]);

    // Starting a segment fsyncs the one before, whatever the policy.
    let rotating = StoreOptions { sync: SyncPolicy::None, segment_bytes: 100 };
    let (mut store, _) = ChainStore::open(&dir.path().join("rotating"), rotating.clone()).unwrap();
    store.append(0, hash_of_block(0), &[1; 40]).unwrap();
    assert_eq!(store.durable_head(), None);
    store.append(1, hash_of_block(1), &[2; 40]).unwrap();
    assert_eq!(store.segment_count(), 2);
    assert_eq!(store.durable_head(), Some((0, hash_of_block(0))));
    drop(store);
    // Reopening makes everything recovered durable.
    let (store, _) = ChainStore::open(&dir.path().join("rotating"), rotating).unwrap();
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
    assert!(matches!(
        &error,
        StoreError::Corrupt { block: 4, damage: Damage::ChecksumMismatch { .. }, file, offset, .. }
            if *file == at.file && *offset == at.offset
    ));
    assert!(error.to_string().contains("block 4"), "{error}");
    assert_eq!(store.get_by_hash(&hash_of_block(3)).unwrap(), Some(payload_of(3)));
    let read: Vec<_> = store.iter().collect();
    assert_eq!(read.len(), 5, "the iterator stops after the error");
    assert!(read[..4].iter().all(|r| r.is_ok()));
    assert_eq!(read[4].as_ref().unwrap_err().block(), Some(4));

    // A truncated file is reported, not read past.
    fs::OpenOptions::new().write(true).open(&at.file).unwrap().set_len(at.offset + 10).unwrap();
    assert!(matches!(store.get_by_number(4), Err(StoreError::Corrupt { block: 4, damage: Damage::Missing, .. })));
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
