//! The chain store on the memory and faulty devices of `virga_core::device`: crashed at any
//! storage operation under the memory device's crash model (any subset of unsynced sectors,
//! one possibly torn; unsynced directory operations lost or kept), it recovers exactly a
//! prefix of the appended blocks holding every block acknowledged as durable; failed fsyncs,
//! a full disk and flipped bits surface as named errors and lose nothing acknowledged.

use std::io;
use std::sync::Arc;

use alloy_primitives::{keccak256, B256};
use proptest::prelude::*;
use virga_core::device::{CrashPoint, FaultPlan, FaultyStorage, MemStorage, Storage};
use virga_ledger::store::{scan, ChainStore, StoreError, StoreOptions, SyncPolicy, RECORD_HEADER_LEN};

fn block_hash(number: u64) -> B256 {
    keccak256(number.to_le_bytes())
}

fn block_bytes(number: u64, len: usize) -> Vec<u8> {
    let seed = block_hash(number);
    (0..len).map(|i| seed[i % 32] ^ (i / 32) as u8).collect()
}

/// Blocks the store reports durable: its durable head's number plus one.
fn durable_blocks(store: &ChainStore) -> u64 {
    store.durable_head().map_or(0, |(n, _)| n + 1)
}

#[derive(Clone, Debug)]
enum Op {
    Append(usize),
    Sync,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(prop_oneof![5 => (0usize..700).prop_map(Op::Append), 1 => Just(Op::Sync)], 1..40)
}

fn policies() -> impl Strategy<Value = SyncPolicy> {
    prop_oneof![Just(SyncPolicy::None), (2u32..5).prop_map(SyncPolicy::EveryN), Just(SyncPolicy::Every)]
}

/// Runs `ops` on a store on the memory device and returns the storage as it was just before
/// the `crash_at`-th mutating storage operation (or at the end), the blocks acknowledged
/// durable then, the lengths of the blocks appended, and how many operations the run made.
fn run(options: &StoreOptions, ops: &[Op], crash_at: u64) -> (MemStorage, u64, Vec<usize>, u64) {
    let memory = MemStorage::new();
    let point = CrashPoint::new(memory.clone(), crash_at);
    let storage: Arc<dyn Storage> = Arc::new(point.clone());
    let (mut store, _) = ChainStore::open(&storage, options.clone()).unwrap();
    let mut appended = Vec::new();
    // After each step: the storage operations made so far and the blocks acknowledged durable.
    let mut acknowledged_after = vec![(point.operations(), 0)];
    for op in ops {
        match op {
            Op::Append(len) => {
                let n = appended.len() as u64;
                store.append(n, block_hash(n), &block_bytes(n, *len)).unwrap();
                appended.push(*len);
            }
            Op::Sync => store.sync().unwrap(),
        }
        acknowledged_after.push((point.operations(), durable_blocks(&store)));
    }
    drop(store);
    let operations = point.operations();
    let (state, acknowledged) = match point.state_at_crash() {
        // The crash came just before operation `crash_at`: a step acknowledged what it did
        // only if all of its operations came before that.
        Some(state) => {
            let before = acknowledged_after.iter().filter(|(ops, _)| *ops < crash_at);
            (state, before.map(|(_, acked)| *acked).max().unwrap_or(0))
        }
        None => (memory.snapshot(), acknowledged_after.last().map_or(0, |(_, acked)| *acked)),
    };
    (state, acknowledged, appended, operations)
}

/// Opens the crashed storage as a restarting node does and checks it holds exactly a prefix
/// of the `appended` blocks with at least the `acknowledged` ones, then goes on from there.
fn check_recovery(crashed: &MemStorage, options: &StoreOptions, appended: &[usize], acknowledged: u64) {
    let (mut store, recovery) = match ChainStore::open(crashed, options.clone()) {
        Ok(opened) => opened,
        Err(error) => panic!("recovery after a crash failed: {error}"),
    };
    let kept = store.len();
    assert_eq!(recovery.blocks, kept);
    assert!(kept >= acknowledged, "{acknowledged} blocks acknowledged durable, {kept} recovered");
    assert!(kept as usize <= appended.len(), "recovered {kept} blocks, {} appended", appended.len());
    for block in store.iter() {
        let block = block.unwrap();
        let n = block.number;
        assert_eq!(block.hash, block_hash(n), "block {n}");
        assert_eq!(block.payload, block_bytes(n, appended[n as usize]), "block {n}");
    }
    store.append(kept, block_hash(kept), b"after the crash").unwrap();
    drop(store);
    let scanned: Vec<_> = scan(crashed).collect();
    assert!(scanned.iter().all(|b| b.is_ok()), "{:?}", scanned.last());
    assert_eq!(scanned.len() as u64, kept + 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn crashed_anywhere_recovers_a_prefix_holding_every_synced_block(
        ops in ops(),
        sync in policies(),
        segment_bytes in prop_oneof![Just(700u64), Just(3000)],
        pick in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let options = StoreOptions { sync, segment_bytes };
        let (_, _, _, total) = run(&options, &ops, 0);
        let (state, acknowledged, appended, _) = run(&options, &ops, 1 + pick % total);
        check_recovery(&state.crash(seed), &options, &appended, acknowledged);
        check_recovery(&state.crash_losing_unsynced(), &options, &appended, acknowledged);
    }
}

// The checker above must catch a store that lost an acknowledged block or changed one.

fn synced_store(memory: &MemStorage, lens: &[usize]) {
    let (mut store, _) = ChainStore::open(memory, StoreOptions::default()).unwrap();
    for (n, len) in lens.iter().enumerate() {
        store.append(n as u64, block_hash(n as u64), &block_bytes(n as u64, *len)).unwrap();
    }
}

#[test]
#[should_panic(expected = "3 blocks acknowledged durable, 2 recovered")]
fn checker_catches_a_lost_acknowledged_block() {
    let memory = MemStorage::new();
    synced_store(&memory, &[10, 20, 30]);
    // A broken "crash" that drops the last synced block.
    let segment = memory.open(&virga_ledger::store::segment_file_name(0)).unwrap();
    segment.truncate(segment.len().unwrap() - 10).unwrap();
    segment.sync().unwrap();
    check_recovery(&memory, &StoreOptions::default(), &[10, 20, 30], 3);
}

#[test]
#[should_panic(expected = "block 1")]
fn checker_catches_a_changed_block() {
    let memory = MemStorage::new();
    synced_store(&memory, &[10, 20]);
    check_recovery(&memory, &StoreOptions::default(), &[10, 21], 2);
}

// ---------------------------------------------------------------------------------------
// Faults surface as named errors, never as silent loss.

fn faulty() -> (MemStorage, Arc<FaultPlan>, Arc<dyn Storage>) {
    let memory = MemStorage::new();
    let plan = FaultPlan::new();
    let storage: Arc<dyn Storage> = Arc::new(FaultyStorage::new(Arc::new(memory.clone()), Arc::clone(&plan)));
    (memory, plan, storage)
}

/// Every block of the store on `memory` after a crash drawn from `seed`, checked.
fn recovered_blocks(memory: &MemStorage, seed: u64, lens: &[usize]) -> u64 {
    let (store, _) = ChainStore::open(&memory.crash(seed), StoreOptions::default()).unwrap();
    for block in store.iter() {
        let block = block.unwrap();
        assert_eq!(block.payload, block_bytes(block.number, lens[block.number as usize]));
    }
    store.len()
}

#[test]
fn a_failed_fsync_is_named_and_loses_nothing_acknowledged() {
    let (memory, plan, storage) = faulty();
    let options = StoreOptions { sync: SyncPolicy::EveryN(2), segment_bytes: 4096 };
    let (mut store, _) = ChainStore::open(&storage, options).unwrap();
    let lens = [100usize; 8];
    for n in 0..6u64 {
        store.append(n, block_hash(n), &block_bytes(n, lens[n as usize])).unwrap();
    }
    assert_eq!(durable_blocks(&store), 6);
    store.append(6, block_hash(6), &block_bytes(6, lens[6])).unwrap();
    plan.fail_syncs_after(0);
    let error = store.append(7, block_hash(7), &block_bytes(7, lens[7])).unwrap_err();
    assert!(matches!(&error, StoreError::Io { op: "fsync", .. }), "{error}");
    assert!(error.to_string().contains("mem:/00000000000000000001.seg"), "{error}");
    assert_eq!(durable_blocks(&store), 6, "nothing more is acknowledged");
    assert!(matches!(store.sync(), Err(StoreError::Poisoned { .. })));
    let error = store.append(8, block_hash(8), b"more").unwrap_err();
    assert!(matches!(&error, StoreError::Poisoned { .. } | StoreError::NotNext { .. }), "{error}");
    // Reads still work.
    assert_eq!(store.get_by_number(3).unwrap(), Some(block_bytes(3, lens[3])));
    drop(store);
    plan.heal();
    for seed in 0..20 {
        assert!(recovered_blocks(&memory, seed, &lens) >= 6, "seed {seed}");
    }
}

#[test]
fn a_full_disk_is_named_and_acknowledged_blocks_survive() {
    let (memory, plan, storage) = faulty();
    let options = StoreOptions { sync: SyncPolicy::Every, segment_bytes: 2000 };
    let (mut store, _) = ChainStore::open(&storage, options.clone()).unwrap();
    plan.fill_disk_after(6_000);
    let lens = vec![150usize; 100];
    let error = loop {
        let n = store.len();
        match store.append(n, block_hash(n), &block_bytes(n, lens[n as usize])) {
            Ok(()) => {}
            Err(error) => break error,
        }
    };
    match &error {
        StoreError::Io { source, path, .. } => {
            assert_eq!(source.kind(), io::ErrorKind::StorageFull, "{error}");
            assert!(path.starts_with("mem:/"), "{error}");
        }
        other => panic!("expected a full disk, got {other}"),
    }
    let acknowledged = durable_blocks(&store);
    assert!(acknowledged > 10, "{acknowledged}");
    let n = store.len();
    assert!(matches!(store.append(n, block_hash(n), b"x"), Err(StoreError::Poisoned { .. })));
    drop(store);
    plan.heal();
    for seed in 0..20 {
        assert!(recovered_blocks(&memory, seed, &lens) >= acknowledged, "seed {seed}");
    }
    let (mut store, _) = ChainStore::open(&storage, options).unwrap();
    let n = store.len();
    store.append(n, block_hash(n), b"room again").unwrap();
}

#[test]
fn a_flipped_bit_on_read_names_the_block() {
    let (memory, plan, storage) = faulty();
    let options = StoreOptions { sync: SyncPolicy::None, segment_bytes: 600 };
    let (mut store, _) = ChainStore::open(&storage, options.clone()).unwrap();
    for n in 0..20u64 {
        store.append(n, block_hash(n), &block_bytes(n, 100)).unwrap();
    }
    store.sync().unwrap();
    let at = store.location(3).unwrap();
    plan.flip_bits_on_read(&at.file, at.offset + RECORD_HEADER_LEN as u64 + 9, 0x10);
    match store.get_by_number(3) {
        Err(StoreError::Corrupt { file, offset, block: 3, .. }) => {
            assert_eq!((file, offset), (at.file.clone(), at.offset))
        }
        other => panic!("expected damage to block 3, got {other:?}"),
    }
    assert_eq!(store.get_by_number(4).unwrap(), Some(block_bytes(4, 100)), "other blocks read fine");
    drop(store);
    // Opening: the segment is not the last one, so this is damage, not a torn tail.
    let error = ChainStore::open(&storage, options.clone()).unwrap_err();
    assert_eq!(error.block(), Some(3), "{error}");
    assert!(error.to_string().contains(&at.file.display().to_string()), "{error}");
    let scanned: Vec<_> = scan(&storage).collect();
    assert_eq!(scanned.len(), 4);
    assert_eq!(scanned[3].as_ref().unwrap_err().block(), Some(3));
    plan.heal();
    assert_eq!(ChainStore::open(&memory, options).unwrap().0.len(), 20, "the data itself was intact");
}
