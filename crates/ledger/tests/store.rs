//! The chain store through its public API: round trips across segments and reopen, the
//! indexes, torn tails, damaged records and a crash property test. Real crashes (a child
//! killed with SIGKILL while it appends) are in `crash.rs`, a binary of its own.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use alloy_primitives::{keccak256, B256};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_ledger::store::{scan, ChainStore, StoreError, StoreOptions, StoredBlock, SyncPolicy, SEGMENT_HEADER_LEN};

fn block_hash(number: u64, salt: u64) -> B256 {
    keccak256([number.to_le_bytes(), salt.to_le_bytes()].concat())
}

/// Deterministic bytes, different for every block and position, so a record read back from
/// the wrong place or half-written never matches.
fn block_bytes(number: u64, salt: u64, len: usize) -> Vec<u8> {
    let seed = block_hash(number, salt);
    (0..len).map(|i| seed[i % 32] ^ (i / 32) as u8).collect()
}

struct Expected {
    hash: B256,
    payload: Vec<u8>,
}

fn assert_store_holds(store: &ChainStore, expected: &[Expected]) {
    assert_eq!(store.len(), expected.len() as u64);
    assert_eq!(store.head(), expected.last().map(|e| (expected.len() as u64 - 1, e.hash)));
    for (n, e) in expected.iter().enumerate() {
        let n = n as u64;
        assert_eq!(store.get_by_number(n).unwrap().as_ref(), Some(&e.payload), "block {n} by number");
        assert_eq!(store.get_by_hash(&e.hash).unwrap().as_ref(), Some(&e.payload), "block {n} by hash");
        assert_eq!(store.number_of(&e.hash), Some(n));
        assert_eq!(store.hash_of(n), Some(e.hash));
    }
    let mut count = 0;
    for (n, block) in store.iter().enumerate() {
        let block = block.unwrap();
        assert_eq!((block.number, block.hash, &block.payload), (n as u64, expected[n].hash, &expected[n].payload));
        count += 1;
    }
    assert_eq!(count, expected.len());
    assert_eq!(store.get_by_number(expected.len() as u64).unwrap(), None);
}

fn append_random(store: &mut ChainStore, expected: &mut Vec<Expected>, rng: &mut StdRng, max_len: usize, salt: u64) {
    let n = expected.len() as u64;
    let len = rng.random_range(0..=max_len);
    let e = Expected { hash: block_hash(n, salt), payload: block_bytes(n, salt, len) };
    store.append(n, e.hash, &e.payload).unwrap();
    expected.push(e);
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

fn flip_byte(file: &Path, offset: u64, mask: u8) {
    let mut bytes = fs::read(file).unwrap();
    bytes[offset as usize] ^= mask;
    fs::write(file, bytes).unwrap();
}

/// The blocks a read-only scan yields, and the error it ended with.
fn scan_all(dir: &Path) -> (Vec<StoredBlock>, Option<StoreError>) {
    let mut blocks = Vec::new();
    for item in scan(dir) {
        match item {
            Ok(block) => blocks.push(block),
            Err(e) => return (blocks, Some(e)),
        }
    }
    (blocks, None)
}

#[test]
fn round_trip_across_segments_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { sync: SyncPolicy::None, segment_bytes: 1024 };
    let mut rng = StdRng::seed_from_u64(1);
    let mut expected = Vec::new();

    let (mut store, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
    assert_eq!((recovery.blocks, recovery.truncated_bytes, recovery.repair), (0, 0, None));
    for _ in 0..300 {
        append_random(&mut store, &mut expected, &mut rng, 600, 0);
    }
    // A block larger than a segment gets a segment of its own.
    append_random(&mut store, &mut expected, &mut rng, 0, 0);
    let n = expected.len() as u64;
    let big = Expected { hash: block_hash(n, 9), payload: block_bytes(n, 9, 5000) };
    store.append(n, big.hash, &big.payload).unwrap();
    expected.push(big);
    assert!(store.segment_count() >= 20, "{} segments", store.segment_count());
    assert_store_holds(&store, &expected);
    store.sync().unwrap();
    let segments = store.segment_count();

    // No segment outgrows `segment_bytes` unless a single block does.
    let mut per_file: Vec<(PathBuf, u64, u64)> = Vec::new();
    for n in 0..store.len() {
        let at = store.location(n).unwrap();
        match per_file.last_mut() {
            Some((file, blocks, bytes)) if *file == at.file => {
                *blocks += 1;
                *bytes += at.record_bytes;
            }
            _ => per_file.push((at.file, 1, SEGMENT_HEADER_LEN as u64 + at.record_bytes)),
        }
    }
    assert_eq!(per_file.len(), segments);
    for (file, blocks, bytes) in per_file {
        assert_eq!(fs::metadata(&file).unwrap().len(), bytes);
        assert!(bytes <= 1024 || blocks == 1, "{} holds {blocks} blocks in {bytes} bytes", file.display());
    }
    drop(store);

    let (mut store, recovery) =
        ChainStore::open(dir.path(), StoreOptions { sync: SyncPolicy::Every, ..options.clone() }).unwrap();
    assert_eq!((recovery.blocks, recovery.truncated_bytes, recovery.segments), (expected.len() as u64, 0, segments));
    assert_store_holds(&store, &expected);
    assert_eq!(store.durable_head(), store.head());

    for _ in 0..50 {
        append_random(&mut store, &mut expected, &mut rng, 600, 0);
    }
    drop(store);
    let (store, _) = ChainStore::open(dir.path(), options).unwrap();
    assert_store_holds(&store, &expected);
    let (scanned, error) = scan_all(dir.path());
    assert!(error.is_none(), "{error:?}");
    assert_eq!(scanned.len(), expected.len());
}

#[test]
fn index_by_number_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) =
        ChainStore::open(dir.path(), StoreOptions { sync: SyncPolicy::None, segment_bytes: 512 }).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let mut expected = Vec::new();
    for _ in 0..64 {
        append_random(&mut store, &mut expected, &mut rng, 200, 3);
    }
    // Look blocks up in an order unrelated to how they were written.
    for _ in 0..200 {
        let n = rng.random_range(0..expected.len());
        let by_hash = store.get_by_hash(&expected[n].hash).unwrap().unwrap();
        assert_eq!(by_hash, expected[n].payload);
        assert_eq!(store.number_of(&expected[n].hash), Some(n as u64));
        let block = store.read_block(n as u64).unwrap().unwrap();
        assert_eq!(block.hash, expected[n].hash);
    }
    assert_eq!(store.number_of(&block_hash(0, 4)), None);
    assert_eq!(store.get_by_hash(&block_hash(0, 4)).unwrap(), None);
    assert_eq!(store.hash_of(64), None);
}

/// Cutting a few bytes off the last segment at random drops exactly the last block, and the
/// recovery reports how many bytes were cut; the block can then be appended again.
#[test]
fn torn_tail_drops_only_the_last_block() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { sync: SyncPolicy::Every, segment_bytes: 4096 };
    let mut rng = StdRng::seed_from_u64(3);
    let mut expected = Vec::new();
    let (mut store, _) = ChainStore::open(dir.path(), options.clone()).unwrap();
    for _ in 0..20 {
        append_random(&mut store, &mut expected, &mut rng, 1500, 0);
    }
    for round in 0..40 {
        let n = expected.len() as u64;
        append_random(&mut store, &mut expected, &mut rng, 1500, 0);
        let at = store.location(n).unwrap();
        drop(store);

        let file_len = fs::metadata(&at.file).unwrap().len();
        assert_eq!(file_len, at.offset + at.record_bytes, "the block is last in its file");
        let cut = rng.random_range(1..at.record_bytes);
        OpenOptions::new().write(true).open(&at.file).unwrap().set_len(file_len - cut).unwrap();

        let (scanned, error) = scan_all(dir.path());
        assert_eq!(scanned.len() as u64, n, "round {round}");
        match error {
            Some(StoreError::TornTail { block, offset, bytes, file, .. }) => {
                assert_eq!((block, offset, bytes, &file), (n, at.offset, at.record_bytes - cut, &at.file));
            }
            other => panic!("round {round}: expected a torn tail, got {other:?}"),
        }

        let (reopened, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
        store = reopened;
        assert_eq!(recovery.blocks, n, "round {round}");
        assert_eq!(recovery.truncated_bytes, at.record_bytes - cut, "round {round}");
        let repair = recovery.repair.unwrap();
        assert_eq!((repair.first_dropped, repair.offset, &repair.file), (n, at.offset, &at.file));
        let dropped = expected.pop().unwrap();
        assert_eq!(store.number_of(&dropped.hash), None);
        if round % 10 == 0 {
            assert_store_holds(&store, &expected);
        }
        store.append(n, dropped.hash, &dropped.payload).unwrap();
        expected.push(dropped);
    }
    drop(store);
    let (store, recovery) = ChainStore::open(dir.path(), options).unwrap();
    assert_eq!(recovery.truncated_bytes, 0);
    assert_store_holds(&store, &expected);
}

/// Whether `virga-log` may take damage to the record at `damaged` in the last segment, with
/// an intact record at `next` after it, for a torn write: only if a 512-byte sector ending in
/// between ends in a zero byte, as a sector that never reached the disk would.
fn log_may_cut(bytes: &[u8], damaged: u64, next: u64) -> bool {
    ((damaged + 1)..=next).any(|end| end % 512 == 0 && bytes[end as usize - 1] == 0)
}

/// A flipped byte anywhere in a record that other records follow is damage, not a torn
/// write: `open` refuses and names the block, the files stay as they were, and the
/// read-only scan reports the same block after yielding every block before it. (In the
/// last segment the log takes it for a torn write when a sector in between ends in zeros;
/// then `open` cuts there and the scan says so.)
#[test]
fn flipped_byte_in_a_middle_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { sync: SyncPolicy::None, segment_bytes: 2048 };
    let mut rng = StdRng::seed_from_u64(4);
    let mut expected = Vec::new();
    let (mut store, _) = ChainStore::open(dir.path(), options.clone()).unwrap();
    for _ in 0..50 {
        append_random(&mut store, &mut expected, &mut rng, 300, 0);
    }
    let locations: Vec<_> = (0..50).map(|n| store.location(n).unwrap()).collect();
    drop(store);
    let files = segment_files(dir.path());
    let last_file = files.last().unwrap().clone();
    let (mut refused, mut cut) = (0, 0);

    for trial in 0..80 {
        let n = rng.random_range(0..49u64);
        let at = &locations[n as usize];
        let offset = at.offset + rng.random_range(0..at.record_bytes);
        let mask = rng.random_range(1..=255u8);
        let before: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
        flip_byte(&at.file, offset, mask);
        let flipped = fs::read(&at.file).unwrap();
        let next = &locations[n as usize + 1];
        let may_cut = at.file == last_file && log_may_cut(&flipped, at.offset, next.offset);
        let context = format!("trial {trial}: block {n} byte {offset} mask {mask:#x}");

        let (scanned, scan_error) = scan_all(dir.path());
        assert_eq!(scanned.len() as u64, n, "{context}");
        if may_cut {
            assert!(matches!(scan_error, Some(StoreError::TornTail { block, .. }) if block == n), "{context}");
            let (store, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
            assert_eq!((store.len(), recovery.repair.unwrap().offset), (n, at.offset), "{context}");
            cut += 1;
        } else {
            assert!(matches!(scan_error, Some(StoreError::Corrupt { block, .. }) if block == n), "{context}");
            let error = ChainStore::open(dir.path(), options.clone()).unwrap_err();
            let context = format!("{context}: {error}");
            match &error {
                StoreError::Corrupt { file, offset: where_, block, .. } => {
                    assert_eq!((*block, file, *where_), (n, &at.file, at.offset), "{context}");
                }
                _ => panic!("{context}"),
            }
            let message = error.to_string();
            assert!(message.contains(&format!("block {n}")), "{context}");
            assert!(message.contains(&at.file.display().to_string()), "{context}");
            assert!(message.contains(&format!("offset {}", at.offset)), "{context}");
            let mut after: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
            let index = files.iter().position(|f| *f == at.file).unwrap();
            after[index][offset as usize] ^= mask;
            assert_eq!(after, before, "{context}: refusal must not change the files");
            refused += 1;
        }
        for (file, bytes) in files.iter().zip(&before) {
            fs::write(file, bytes).unwrap();
        }
    }
    assert!(refused > 40, "{refused} refused, {cut} cut");
    let (store, recovery) = ChainStore::open(dir.path(), options).unwrap();
    assert_eq!(recovery.truncated_bytes, 0);
    assert_store_holds(&store, &expected);
}

/// The last record, damaged with nothing intact after it, looks exactly like an append torn
/// by a power cut: `open` cuts it and says so in the recovery, the read-only scan reports
/// it as a torn tail at that block, and every earlier block is kept.
#[test]
fn flipped_byte_in_the_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { sync: SyncPolicy::None, segment_bytes: 2048 };
    let mut rng = StdRng::seed_from_u64(5);
    let mut expected = Vec::new();
    let (mut store, _) = ChainStore::open(dir.path(), options.clone()).unwrap();
    for _ in 0..10 {
        append_random(&mut store, &mut expected, &mut rng, 300, 0);
    }
    let last = expected.len() as u64 - 1;
    let at = store.location(last).unwrap();
    drop(store);
    let original = fs::read(&at.file).unwrap();

    // A byte of the block's own bytes: a checksum mismatch.
    flip_byte(&at.file, at.offset + at.record_bytes - 1, 0x40);
    let (scanned, error) = scan_all(dir.path());
    assert_eq!(scanned.len() as u64, last);
    match error {
        Some(StoreError::TornTail { block, offset, bytes, damage, .. }) => {
            assert_eq!((block, offset, bytes), (last, at.offset, at.record_bytes));
            assert!(damage.to_string().contains("checksum"), "{damage}");
        }
        other => panic!("{other:?}"),
    }
    let (store, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
    assert_eq!((recovery.blocks, recovery.truncated_bytes), (last, at.record_bytes));
    let repair = recovery.repair.unwrap();
    assert_eq!(repair.first_dropped, last);
    assert!(repair.damage.to_string().contains("checksum"));
    assert_store_holds(&store, &expected[..last as usize]);
    drop(store);

    // Any byte of that record: scan names the block, open keeps every earlier block.
    for _ in 0..30 {
        let mut bytes = original.clone();
        let offset = rng.random_range(at.offset..at.offset + at.record_bytes) as usize;
        bytes[offset] ^= rng.random_range(1..=255u8);
        fs::write(&at.file, &bytes).unwrap();
        let (scanned, error) = scan_all(dir.path());
        assert_eq!(scanned.len() as u64, last);
        assert_eq!(error.and_then(|e| e.block()), Some(last), "byte {offset}");
        let (store, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
        assert_eq!((recovery.blocks, recovery.truncated_bytes), (last, at.record_bytes), "byte {offset}");
        assert_eq!(store.len(), last);
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append(usize),
    Sync,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(prop_oneof![5 => (0usize..400).prop_map(Op::Append), 1 => Just(Op::Sync)], 1..60)
}

fn policies() -> impl Strategy<Value = SyncPolicy> {
    prop_oneof![Just(SyncPolicy::None), (2u32..6).prop_map(SyncPolicy::EveryN), Just(SyncPolicy::Every)]
}

#[derive(Clone, Debug)]
enum Junk {
    None,
    Zeros(usize),
    Bytes(Vec<u8>),
}

fn junk() -> impl Strategy<Value = Junk> {
    prop_oneof![
        Just(Junk::None),
        (1usize..300).prop_map(Junk::Zeros),
        prop::collection::vec(any::<u8>(), 1..300).prop_map(Junk::Bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random appends and syncs, then a crash that keeps an arbitrary part of what was not
    /// yet durable (possibly followed by garbage): reopening yields exactly a prefix of the
    /// appended blocks, and that prefix holds every block that was durable.
    #[test]
    fn crash_keeps_a_prefix_with_every_synced_block(
        ops in ops(), sync in policies(), keep in 0.0f64..=1.0, junk in junk(), salt in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions { sync, segment_bytes: 700 };
        let (mut store, _) = ChainStore::open(dir.path(), options.clone()).unwrap();
        let mut appended = Vec::new();
        for op in &ops {
            match op {
                Op::Append(len) => {
                    let n = appended.len() as u64;
                    let e = Expected { hash: block_hash(n, salt), payload: block_bytes(n, salt, *len) };
                    store.append(n, e.hash, &e.payload).unwrap();
                    appended.push(e);
                }
                Op::Sync => store.sync().unwrap(),
            }
        }
        let durable = store.durable_head().map(|(n, _)| n);
        if let Some(d) = durable {
            prop_assert_eq!(store.durable_head(), Some((d, appended[d as usize].hash)));
        }
        let last_file = segment_files(dir.path()).pop().unwrap();
        // What a crash can lose: the last segment after its last durable record (segments
        // before it, and its header, were fsynced when it was created).
        let keep_from = match durable.and_then(|d| store.location(d)) {
            Some(at) if at.file == last_file => at.offset + at.record_bytes,
            _ => SEGMENT_HEADER_LEN as u64,
        };
        drop(store);

        let file_len = fs::metadata(&last_file).unwrap().len();
        let cut = keep_from + ((file_len - keep_from) as f64 * keep) as u64;
        let file = OpenOptions::new().write(true).open(&last_file).unwrap();
        file.set_len(cut.min(file_len)).unwrap();
        match &junk {
            Junk::None => {}
            Junk::Zeros(n) => file.set_len(cut.min(file_len) + *n as u64).unwrap(),
            Junk::Bytes(bytes) => {
                let mut file = OpenOptions::new().append(true).open(&last_file).unwrap();
                file.write_all(bytes).unwrap();
            }
        }
        drop(file);

        let (mut store, recovery) = ChainStore::open(dir.path(), options.clone()).unwrap();
        let kept = store.len();
        prop_assert_eq!(recovery.blocks, kept);
        prop_assert!(kept as usize <= appended.len());
        if let Some(d) = durable {
            prop_assert!(kept > d, "durable block {} lost; kept {}", d, kept);
        }
        for (n, block) in store.iter().enumerate() {
            let block = block.unwrap();
            prop_assert_eq!(block.number, n as u64);
            prop_assert_eq!(block.hash, appended[n].hash);
            prop_assert_eq!(&block.payload, &appended[n].payload);
        }
        // The repaired store is clean and keeps growing from where it ended.
        let (scanned, error) = scan_all(dir.path());
        prop_assert!(error.is_none(), "{:?}", error);
        prop_assert_eq!(scanned.len() as u64, kept);
        store.append(kept, block_hash(kept, !salt), b"after the crash").unwrap();
        drop(store);
        let (store, recovery) = ChainStore::open(dir.path(), options).unwrap();
        prop_assert_eq!((recovery.blocks, recovery.truncated_bytes), (kept + 1, 0));
        prop_assert_eq!(store.get_by_number(kept).unwrap(), Some(b"after the crash".to_vec()));
    }
}

/// A chain directory whose blocks were written by the older chain-store format (`.blk`
/// segments, magic `VIRGACHN`) is refused by `Chain::open` and by the audit with an error
/// that says so, and nothing is written into it.
#[test]
fn a_chain_of_the_older_store_format_is_refused_by_open_and_audit() {
    use alloy_primitives::{Address, U256};
    use virga_ledger::chain::{audit, genesis_json, Chain, ChainError, ChainOptions};
    use virga_ledger::verify::ExecMode;

    let dir = tempfile::tempdir().unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let genesis = genesis_json(1337, U256::from(16u64), 30_000_000, &[Address::repeat_byte(1)], U256::from(1u64));
    drop(Chain::create(dir.path(), &genesis, ChainOptions::default(), &pool).unwrap());
    let blocks = dir.path().join("blocks");
    for file in segment_files(&blocks) {
        fs::remove_file(file).unwrap();
    }
    let older = blocks.join("00000000000000000000.blk");
    fs::write(&older, virga_log::encode_segment_header_with(b"VIRGACHN", 0)).unwrap();

    let Err(error) = Chain::open(dir.path(), ChainOptions::default(), &pool) else { panic!("an older store opened") };
    assert!(matches!(&error, ChainError::Store(StoreError::OlderFormat { file }) if *file == older), "{error}");
    assert!(error.to_string().contains("older chain-store format"), "{error}");
    let error = audit(dir.path(), ExecMode::Serial, &pool, &mut |_| {}).unwrap_err();
    assert!(error.to_string().contains("older chain-store format"), "{error}");
    let names: Vec<_> = fs::read_dir(&blocks).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["00000000000000000000.blk"]);
}
