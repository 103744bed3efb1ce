use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;

const B: usize = CRASH_BLOCK_BYTES as usize;

/// The behaviour every storage must share, checked on `storage`.
fn storage_semantics(storage: &dyn Storage) {
    let device = storage.create("a").unwrap();
    assert_eq!(storage.create("a").unwrap_err().kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(device.append(b"hello").unwrap(), 0);
    assert_eq!(device.append(b" world").unwrap(), 5);
    device.write_at(b"J", 0).unwrap();
    assert_eq!(device.len().unwrap(), 11);
    let mut buf = [0u8; 5];
    device.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world");
    assert_eq!(device.read_at(&mut buf, 11).unwrap(), 0);
    assert_eq!(device.read_exact_at(&mut buf, 8).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    device.truncate(5).unwrap();
    assert_eq!(device.read_all().unwrap(), b"Jello");
    device.write_at(b"!", 7).unwrap();
    assert_eq!(device.read_all().unwrap(), b"Jello\0\0!", "a write past the end leaves a zero hole");
    device.sync().unwrap();
    // A second handle sees the same object.
    assert_eq!(storage.open("a").unwrap().read_all().unwrap(), b"Jello\0\0!");
    assert_eq!(storage.open("b").unwrap_err().kind(), io::ErrorKind::NotFound);

    storage.create("b").unwrap().append(b"bee").unwrap();
    storage.rename("b", "a").unwrap();
    assert_eq!(storage.open("a").unwrap().read_all().unwrap(), b"bee", "rename replaces");
    assert!(!storage.exists("b").unwrap());
    assert_eq!(storage.open_sub("nested").unwrap_err().kind(), io::ErrorKind::NotFound);
    let sub = storage.sub("nested").unwrap();
    sub.create("inner").unwrap();
    assert_eq!(storage.sub("nested").unwrap().list().unwrap(), vec!["inner".to_string()]);
    assert_eq!(storage.open_sub("nested").unwrap().list().unwrap(), vec!["inner".to_string()]);
    let mut writer = DeviceWriter::new(storage.create("streamed").unwrap(), 4);
    for piece in [&b"ab"[..], b"cde", b"fghijk", b"l"] {
        io::Write::write_all(&mut writer, piece).unwrap();
    }
    assert_eq!(writer.finish().unwrap().read_all().unwrap(), b"abcdefghijkl");
    storage.remove("streamed").unwrap();
    let mut names = storage.list().unwrap();
    names.sort();
    assert_eq!(names, vec!["a".to_string()], "nested namespaces are not objects");
    storage.remove("a").unwrap();
    assert_eq!(storage.remove("a").unwrap_err().kind(), io::ErrorKind::NotFound);
    storage.sync_dir().unwrap();
    assert!(storage.list().unwrap().is_empty());
    assert_eq!(storage.create("../x").unwrap_err().kind(), io::ErrorKind::InvalidInput);
    storage.replace_atomically("config", b"v1").unwrap();
    storage.replace_atomically("config", b"v2").unwrap();
    assert_eq!(storage.open("config").unwrap().read_all().unwrap(), b"v2");
    assert!(!storage.exists("config.tmp").unwrap());

    // A namespace goes with everything in it, nested ones too; its neighbours stay.
    let doomed = storage.sub("doomed").unwrap();
    doomed.create("record").unwrap().append(b"r").unwrap();
    doomed.sub("log").unwrap().create("segment").unwrap().append(b"s").unwrap();
    storage.sub("doomed-not").unwrap().create("kept").unwrap();
    storage.remove_sub("doomed").unwrap();
    assert_eq!(storage.open_sub("doomed").unwrap_err().kind(), io::ErrorKind::NotFound);
    assert_eq!(storage.remove_sub("doomed").unwrap_err().kind(), io::ErrorKind::NotFound);
    assert!(storage.sub("doomed").unwrap().list().unwrap().is_empty(), "a new namespace starts empty");
    assert!(storage.sub("doomed").unwrap().open_sub("log").is_err());
    assert_eq!(storage.open_sub("doomed-not").unwrap().list().unwrap(), vec!["kept".to_string()]);
    assert_eq!(storage.remove_sub("../up").unwrap_err().kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn file_storage_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FileStorage::create_dir_all(dir.path().join("store")).unwrap();
    storage_semantics(&storage);
    assert_eq!(storage.path_of("x"), dir.path().join("store").join("x"));
    assert!(dir.path().join("store").join("nested").join("inner").is_file());
}

#[test]
fn mem_storage_semantics() {
    let storage = MemStorage::new();
    storage_semantics(&storage);
    assert_eq!(storage.sub("wal").unwrap().path_of("x"), std::path::PathBuf::from("mem:/wal/x"));
}

#[test]
fn faulty_storage_without_faults_behaves_like_its_inner_storage() {
    storage_semantics(&FaultyStorage::new(Arc::new(MemStorage::new()), FaultPlan::new()));
}

#[test]
fn crash_keeps_synced_data_and_directory_entries() {
    let storage = MemStorage::new();
    let device = storage.create("log").unwrap();
    device.append(&[7u8; 3 * B + 10]).unwrap();
    device.sync().unwrap();
    storage.sync_dir().unwrap();
    device.append(&[9u8; 2 * B]).unwrap();
    for seed in 0..200 {
        let after = storage.crash(seed);
        let bytes = after.open("log").unwrap().read_all().unwrap();
        assert!(bytes.len() == 3 * B + 10 || bytes.len() == 5 * B + 10, "seed {seed}: length {}", bytes.len());
        assert_eq!(&bytes[..3 * B + 10], &[7u8; 3 * B + 10][..], "seed {seed}");
    }
    let worst = storage.crash_losing_unsynced();
    assert_eq!(worst.open("log").unwrap().read_all().unwrap(), vec![7u8; 3 * B + 10]);
}

#[test]
fn crash_is_deterministic_per_seed_and_varies_across_seeds() {
    let storage = MemStorage::new();
    let device = storage.create("f").unwrap();
    storage.sync_dir().unwrap();
    for i in 0..16u8 {
        device.append(&[i + 1; B]).unwrap();
    }
    let outcome = |seed| storage.crash(seed).open("f").unwrap().read_all().unwrap();
    assert_eq!(outcome(5), outcome(5));
    let distinct: BTreeSet<Vec<u8>> = (0..50).map(outcome).collect();
    assert!(distinct.len() > 10, "only {} distinct outcomes", distinct.len());
    // Some crash keeps a later block while losing an earlier one: any subset, not a prefix.
    let holes = (0..200)
        .map(outcome)
        .any(|bytes| bytes.len() == 16 * B && bytes[..B].iter().all(|&b| b == 0) && bytes[15 * B] == 16);
    assert!(holes, "no crash left a hole before a surviving block");
}

#[test]
fn crash_may_tear_one_block() {
    let storage = MemStorage::new();
    let device = storage.create("f").unwrap();
    storage.sync_dir().unwrap();
    device.append(&[1u8; B]).unwrap();
    let torn = (0..400).any(|seed| {
        let bytes = storage.crash(seed).open("f").unwrap().read_all().unwrap();
        bytes.len() == B && bytes[0] == 1 && bytes[B - 1] == 0
    });
    assert!(torn, "no seed tore the block");
}

#[test]
fn crash_may_lose_unsynced_directory_operations() {
    let storage = MemStorage::new();
    storage.create("kept").unwrap().sync().unwrap();
    storage.sync_dir().unwrap();
    storage.create("new").unwrap().sync().unwrap();
    storage.remove("kept").unwrap();
    let outcomes: BTreeSet<(bool, bool)> = (0..100)
        .map(|seed| {
            let after = storage.crash(seed);
            (after.exists("kept").unwrap(), after.exists("new").unwrap())
        })
        .collect();
    assert_eq!(outcomes.len(), 4, "each operation survives or not on its own: {outcomes:?}");
    storage.sync_dir().unwrap();
    for seed in 0..20 {
        let after = storage.crash(seed);
        assert!(!after.exists("kept").unwrap() && after.exists("new").unwrap());
    }
}

#[test]
fn snapshot_is_independent() {
    let storage = MemStorage::new();
    let device = storage.create("f").unwrap();
    device.append(b"one").unwrap();
    let copy = storage.snapshot();
    device.append(b"two").unwrap();
    assert_eq!(copy.open("f").unwrap().read_all().unwrap(), b"one");
    assert_eq!(storage.unsynced_blocks(), 1);
    assert_eq!(storage.unsynced_dir_ops(), 1);
}

/// Checks a crashed object against the model: every block is the durable or the volatile
/// version, except at most one torn block (volatile prefix, durable rest).
fn check_crash_outcome(durable: &[u8], volatile: &[u8], crashed: &[u8]) -> Result<(), String> {
    if crashed.len() != durable.len() && crashed.len() != volatile.len() {
        return Err(format!("length {} is neither {} nor {}", crashed.len(), durable.len(), volatile.len()));
    }
    let byte = |bytes: &[u8], i: usize| bytes.get(i).copied().unwrap_or(0);
    // Past the volatile end (a truncation whose new size was lost) the old bytes remain.
    let new_byte = |i: usize| volatile.get(i).copied().unwrap_or_else(|| byte(durable, i));
    let mut torn = 0;
    for start in (0..crashed.len()).step_by(B) {
        let end = (start + B).min(crashed.len());
        let block = &crashed[start..end];
        let old = (start..end).map(|i| byte(durable, i));
        let new = (start..end).map(new_byte);
        if block.iter().copied().eq(old.clone()) || block.iter().copied().eq(new.clone()) {
            continue;
        }
        let prefix = (start..end).take_while(|&i| crashed[i] == new_byte(i)).count();
        if (start + prefix..end).all(|i| crashed[i] == byte(durable, i)) {
            torn += 1;
            continue;
        }
        return Err(format!("block at {start} is neither old, new nor torn"));
    }
    if torn > 1 {
        return Err(format!("{torn} torn blocks"));
    }
    Ok(())
}

#[test]
fn crash_checker_catches_a_broken_crash() {
    let durable = vec![1u8; 2 * B];
    let volatile = vec![2u8; 2 * B];
    assert!(check_crash_outcome(&durable, &volatile, &volatile).is_ok());
    let mut mixed = durable.clone();
    mixed[10] = 2;
    mixed[B + 10] = 2;
    assert!(check_crash_outcome(&durable, &volatile, &mixed).is_err(), "a block with a stray byte");
    let mut two_torn = volatile.clone();
    two_torn[B - 1] = 1;
    two_torn[2 * B - 1] = 1;
    assert!(check_crash_outcome(&durable, &volatile, &two_torn).is_err(), "two torn blocks");
    assert!(check_crash_outcome(&durable, &volatile, &durable[..B]).is_err(), "a length nobody wrote");
}

#[derive(Clone, Debug)]
enum Op {
    Append(usize, u8),
    Write(usize, usize, u8),
    Truncate(usize),
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..3 * B, any::<u8>()).prop_map(|(len, byte)| Op::Append(len, byte)),
        2 => (0..6 * B, 1..2 * B, any::<u8>()).prop_map(|(at, len, byte)| Op::Write(at, len, byte)),
        1 => (0..6 * B).prop_map(Op::Truncate),
        2 => Just(Op::Sync),
    ]
}

proptest! {
    #[test]
    fn crash_follows_the_model(ops in prop::collection::vec(op(), 1..30), seeds in prop::collection::vec(any::<u64>(), 8)) {
        let storage = MemStorage::new();
        let device = storage.create("f").unwrap();
        storage.sync_dir().unwrap();
        let mut durable = Vec::new();
        for op in ops {
            match op {
                Op::Append(len, byte) => { device.append(&vec![byte; len]).unwrap(); }
                Op::Write(at, len, byte) => device.write_at(&vec![byte; len], at as u64).unwrap(),
                Op::Truncate(len) => device.truncate(len as u64).unwrap(),
                Op::Sync => { device.sync().unwrap(); durable = device.read_all().unwrap(); }
            }
        }
        let volatile = device.read_all().unwrap();
        for seed in seeds {
            let crashed = storage.crash(seed).open("f").unwrap().read_all().unwrap();
            prop_assert!(check_crash_outcome(&durable, &volatile, &crashed).is_ok(),
                "seed {seed}: {:?}", check_crash_outcome(&durable, &volatile, &crashed));
        }
    }
}

#[test]
fn injected_fsync_failure_fires_after_the_allowed_count() {
    let plan = FaultPlan::new();
    let storage = FaultyStorage::new(Arc::new(MemStorage::new()), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    plan.fail_syncs_after(2);
    device.sync().unwrap();
    storage.sync_dir().unwrap();
    let error = device.sync().unwrap_err();
    assert!(error.to_string().contains("mem:/f"), "{error}");
    assert!(storage.sync_dir().is_err());
    assert_eq!(plan.sync_counts(), (4, 2));
    plan.heal();
    device.sync().unwrap();
}

#[test]
fn full_disk_writes_what_fits_then_fails() {
    let plan = FaultPlan::new();
    let inner = Arc::new(MemStorage::new());
    let storage = FaultyStorage::new(inner.clone(), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    plan.fill_disk_after(10);
    device.append(b"012345").unwrap();
    let error = device.append(b"6789abcdef").unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::StorageFull);
    assert_eq!(inner.open("f").unwrap().read_all().unwrap(), b"0123456789");
    assert_eq!(device.write_at(b"x", 0).unwrap_err().kind(), io::ErrorKind::StorageFull);
}

#[test]
fn bit_flips_hit_the_named_byte_only() {
    let plan = FaultPlan::new();
    let storage = FaultyStorage::new(Arc::new(MemStorage::new()), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    storage.create("g").unwrap().append(&[0u8; 8]).unwrap();
    device.append(&[0u8; 8]).unwrap();
    plan.flip_bits_on_read(storage.path_of("f"), 5, 0x10);
    assert_eq!(device.read_all().unwrap(), [0, 0, 0, 0, 0, 0x10, 0, 0]);
    let mut two = [0u8; 2];
    device.read_exact_at(&mut two, 4).unwrap();
    assert_eq!(two, [0, 0x10]);
    assert_eq!(storage.open("g").unwrap().read_all().unwrap(), [0u8; 8]);
}

#[test]
fn a_latent_sector_error_fails_reads_that_touch_it_until_a_write_remaps_it() {
    let plan = FaultPlan::new();
    let storage = FaultyStorage::new(Arc::new(MemStorage::new()), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    device.append(b"0123456789").unwrap();
    plan.latent_sector_error(storage.path_of("f"), 4, 2);
    let mut buf = [0u8; 4];
    device.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"0123");
    let error = device.read_all().unwrap_err();
    assert!(error.to_string().contains("latent sector error"), "{error}");
    assert!(device.read_exact_at(&mut buf, 5).is_err(), "a read that starts inside the sector fails too");
    device.write_at(b"ab", 3).unwrap();
    assert!(device.read_all().is_err(), "a write that covers part of the sector does not remap it");
    device.write_at(b"xy", 4).unwrap();
    assert_eq!(device.read_all().unwrap(), b"012axy6789");
    assert_eq!(plan.media_faults(), 3);
}

#[test]
fn a_lost_write_is_acknowledged_and_leaves_the_medium_as_it_was() {
    let plan = FaultPlan::new();
    let inner = Arc::new(MemStorage::new());
    let storage = FaultyStorage::new(inner.clone(), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    device.append(b"abcd").unwrap();
    plan.lose_writes(2);
    device.write_at(b"XY", 1).unwrap();
    assert_eq!(device.append(b"efgh").unwrap(), 4);
    device.sync().unwrap();
    assert_eq!(device.append(b"ijkl").unwrap(), 8, "the lost append still grew the object");
    assert_eq!(inner.open("f").unwrap().read_all().unwrap(), b"abcd\0\0\0\0ijkl");
    assert_eq!(plan.media_faults(), 2);
}

#[test]
fn a_misdirected_write_lands_over_older_bytes_and_leaves_its_own_range_as_it_was() {
    let plan = FaultPlan::new();
    let inner = Arc::new(MemStorage::new());
    let storage = FaultyStorage::new(inner.clone(), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    device.append(b"abcdefgh").unwrap();
    plan.misdirect_writes(1, 6);
    assert_eq!(device.append(b"XYZ").unwrap(), 8);
    device.append(b"!").unwrap();
    assert_eq!(inner.open("f").unwrap().read_all().unwrap(), b"abXYZfgh\0\0\0!");
    plan.misdirect_writes(1, 100);
    device.write_at(b"Q", 11).unwrap();
    assert_eq!(inner.open("f").unwrap().read_all().unwrap(), b"QbXYZfgh\0\0\0!", "clamped at the start");
    plan.heal();
    device.write_at(b"W", 11).unwrap();
    assert_eq!(inner.open("f").unwrap().read_all().unwrap(), b"QbXYZfgh\0\0\0W");
}

#[test]
fn short_reads_are_completed_by_read_exact_at() {
    let plan = FaultPlan::new();
    let storage = FaultyStorage::new(Arc::new(MemStorage::new()), Arc::clone(&plan));
    let device = storage.create("f").unwrap();
    device.append(b"abcdefgh").unwrap();
    plan.short_reads(true);
    let mut buf = [0u8; 8];
    assert_eq!(device.read_at(&mut buf, 0).unwrap(), 4);
    device.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"abcdefgh");
}

#[test]
fn a_file_without_write_permission_still_opens_for_reading() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let storage = FileStorage::create_dir_all(dir.path()).unwrap();
    storage.create("sealed").unwrap().append(b"kept").unwrap();
    let path = storage.path_of("sealed");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(storage.open("sealed").unwrap().read_all().unwrap(), b"kept");
}

#[test]
fn crash_point_snapshots_just_before_the_chosen_operation() {
    let memory = MemStorage::new();
    let storage = CrashPoint::new(memory.clone(), 4);
    let device = storage.create("f").unwrap(); // 1
    device.append(b"one").unwrap(); // 2
    device.sync().unwrap(); // 3
    let nested = storage.sub("inner").unwrap();
    assert!(storage.state_at_crash().is_none());
    nested.create("g").unwrap(); // 4: the snapshot is taken before it
    device.append(b"two").unwrap(); // 5
    assert_eq!(storage.operations(), 5);
    let state = storage.state_at_crash().unwrap();
    assert_eq!(state.open("f").unwrap().read_all().unwrap(), b"one");
    assert!(!state.sub("inner").unwrap().exists("g").unwrap());
    assert_eq!(memory.open("f").unwrap().read_all().unwrap(), b"onetwo", "the run itself goes on");
    // Its creation was never made durable by a directory sync.
    assert!(!state.crash_losing_unsynced().exists("f").unwrap());
    assert!(CrashPoint::new(MemStorage::new(), 0).state_at_crash().is_none());
}
