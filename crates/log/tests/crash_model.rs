//! The log on the memory device, crashed at any storage operation under the crash model of
//! `virga_core::device::MemStorage` (any subset of unsynced sectors, one possibly torn,
//! unsynced directory operations lost or kept), recovers exactly a prefix of what was
//! appended that holds everything acknowledged as durable; and the faulty device's errors
//! surface as named errors, never as silent loss.

use std::io;
use std::sync::Arc;

use proptest::prelude::*;
use virga_core::device::{CrashPoint, FaultPlan, FaultyStorage, MemStorage, Storage};
use virga_log::{
    GroupLog, GroupLogOptions, LogError, LogOptions, OpenMode, Record, RecordLog, SyncMode, SyncPolicy, Verdict,
};

/// What the test knew before each step of a run: how many storage operations had happened,
/// and (for the step starting then) what was acknowledged and below which LSN records may
/// be removed. A crash inside a step must keep what was known before it.
#[derive(Default)]
struct Steps(Vec<(u64, u64, u64)>);

impl Steps {
    fn note(&mut self, operations: u64, acknowledged: u64, removable_below: u64) {
        self.0.push((operations, acknowledged, removable_below));
    }

    /// Acknowledged and removable-below at a crash just before operation `crash_at`.
    fn at(&self, crash_at: u64) -> (u64, u64) {
        let step = self.0.iter().rev().find(|(operations, _, _)| *operations < crash_at);
        step.map_or((0, 1), |&(_, acknowledged, removable)| (acknowledged, removable))
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<u8>),
    Sync,
    /// `truncate_prefix(first_lsn + ahead)`.
    TruncatePrefix(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Op::Append),
        3 => Just(Op::Sync),
        1 => (0u8..12).prop_map(Op::TruncatePrefix),
    ]
}

/// Recovers the crashed storage and checks it against what was appended.
fn check_recovery(crashed: &MemStorage, appended: &[Vec<u8>], acknowledged: u64, removable_below: u64) {
    let mut records = Vec::new();
    let opened = RecordLog::open_with(crashed, options(SyncPolicy::None), OpenMode::Repair, |lsn, payload| {
        records.push(Record { lsn, payload: payload.to_vec() })
    });
    let (mut log, recovered) = match opened {
        Ok(opened) => opened,
        Err(error) => panic!("recovery after a crash failed: {error}"),
    };
    for (index, record) in records.iter().enumerate() {
        assert_eq!(record.lsn, recovered.first_lsn + index as u64, "LSNs are consecutive");
        let expected = appended.get(record.lsn as usize - 1).expect("recovered a record never appended");
        assert_eq!(&record.payload, expected, "LSN {}", record.lsn);
    }
    let last = recovered.next_lsn - 1;
    assert!(last >= acknowledged, "acknowledged up to LSN {acknowledged}, recovered up to {last}");
    assert!(
        recovered.first_lsn <= removable_below.max(1),
        "records from LSN {} were removed, only those below {removable_below} could be",
        recovered.first_lsn
    );
    // The log goes on from where recovery left it, and a second recovery changes nothing.
    assert_eq!(log.append(b"after").unwrap(), recovered.next_lsn);
    log.sync().unwrap();
    drop(log);
    let report = RecordLog::scan(crashed, &options(SyncPolicy::None)).unwrap();
    assert_eq!((report.verdict, report.next_lsn), (Verdict::Clean, recovered.next_lsn + 1));
}

fn options(sync: SyncPolicy) -> LogOptions {
    LogOptions { segment_bytes: 3000, max_record_bytes: 4096, sync, write_buffer_bytes: 300 }
}

/// Segments of several crash blocks (so that a crash can keep a later sector of the tail and
/// lose an earlier one) or of about one (so that rotations and removals are frequent).
fn segment_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![Just(3000u64), Just(700)]
}

fn run_record_log(sync: SyncPolicy, segment_bytes: u64, ops: &[Op], pick: u64, seed: u64) {
    let total = run_record_log_at(sync, segment_bytes, ops, 0, None);
    run_record_log_at(sync, segment_bytes, ops, 1 + pick % total.max(1), Some(seed));
}

fn run_group_log(mode: SyncMode, segment_bytes: u64, ops: &[Op], pick: u64, seed: u64) {
    // The flusher makes the count vary a little from run to run; any point is a valid one.
    let total = run_group_log_at(mode, segment_bytes, ops, 0, None);
    run_group_log_at(mode, segment_bytes, ops, 1 + pick % total.max(1), Some(seed));
}

/// Runs `ops`, crashing just before storage operation `crash_at` (0: after the last one),
/// and checks recovery when `seed` is given. Returns how many operations the run made.
fn run_record_log_at(sync: SyncPolicy, segment_bytes: u64, ops: &[Op], crash_at: u64, seed: Option<u64>) -> u64 {
    let memory = MemStorage::new();
    let crash_point = CrashPoint::new(memory.clone(), crash_at);
    let (mut log, _) = RecordLog::recover(&crash_point, LogOptions { segment_bytes, ..options(sync) }).unwrap();
    let mut appended = Vec::new();
    let mut steps = Steps::default();
    let mut removable = 1;
    for op in ops {
        if let Op::TruncatePrefix(ahead) = op {
            removable = removable.max(log.first_lsn() + u64::from(*ahead));
        }
        steps.note(crash_point.operations(), log.durable_lsn(), removable);
        match op {
            Op::Append(payload) => {
                appended.push(payload.clone());
                assert_eq!(log.append(payload).unwrap(), appended.len() as u64);
            }
            Op::Sync => assert_eq!(log.sync().unwrap(), appended.len() as u64),
            Op::TruncatePrefix(ahead) => {
                log.truncate_prefix(log.first_lsn() + u64::from(*ahead)).unwrap();
            }
        }
    }
    let operations = crash_point.operations();
    steps.note(operations, log.durable_lsn(), removable);
    // The process dies: nothing more reaches the storage.
    std::mem::forget(log);
    if let Some(seed) = seed {
        let state = crash_point.state_at_crash().unwrap_or_else(|| memory.snapshot());
        let (acknowledged, removable) =
            steps.at(if crash_point.state_at_crash().is_some() { crash_at } else { u64::MAX });
        check_recovery(&state.crash(seed), &appended, acknowledged, removable);
        check_recovery(&state.crash_losing_unsynced(), &appended, acknowledged, removable);
    }
    operations
}

fn run_group_log_at(mode: SyncMode, segment_bytes: u64, ops: &[Op], crash_at: u64, seed: Option<u64>) -> u64 {
    let memory = MemStorage::new();
    let crash_point = CrashPoint::new(memory.clone(), crash_at);
    let group_options = GroupLogOptions {
        sync: mode,
        segment_bytes,
        max_record_bytes: 4096,
        write_buffer_bytes: 300,
        ..GroupLogOptions::default()
    };
    let (log, _) = GroupLog::recover(&crash_point, group_options).unwrap();
    let mut appended = Vec::new();
    // In `None` mode durability is off and `durable_lsn` says nothing: only `sync` counts.
    // The flusher makes records durable behind the test's back; what it had reported before
    // a step is acknowledged during it.
    let durable = |log: &GroupLog, synced: u64| if mode == SyncMode::None { synced } else { log.durable_lsn() };
    let mut synced = 0;
    let mut steps = Steps::default();
    let mut removable = 1;
    for op in ops {
        if let Op::TruncatePrefix(ahead) = op {
            removable = removable.max(log.first_lsn().unwrap() + u64::from(*ahead));
        }
        steps.note(crash_point.operations(), durable(&log, synced), removable);
        match op {
            Op::Append(payload) => {
                appended.push(payload.clone());
                assert_eq!(log.append(payload).unwrap(), appended.len() as u64);
            }
            Op::Sync => {
                synced = log.sync().unwrap();
                assert_eq!(synced, appended.len() as u64);
            }
            Op::TruncatePrefix(ahead) => {
                log.truncate_prefix(log.first_lsn().unwrap() + u64::from(*ahead)).unwrap();
            }
        }
    }
    let acknowledged_at_end = durable(&log, synced);
    let at_end = memory.snapshot();
    let operations = crash_point.operations();
    drop(log);
    if let Some(seed) = seed {
        let (state, (acknowledged, removable)) = match crash_point.state_at_crash() {
            // A crash point the flusher reached after the test's last step counts as the end.
            Some(state) if crash_at <= operations => (state, steps.at(crash_at)),
            _ => (at_end, (acknowledged_at_end, removable)),
        };
        check_recovery(&state.crash(seed), &appended, acknowledged, removable);
    }
    operations
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn record_log_recovers_a_prefix_holding_everything_synced(
        every in prop::bool::weighted(0.3),
        segment_bytes in segment_bytes(),
        ops in prop::collection::vec(op(), 1..50),
        pick in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let sync = if every { SyncPolicy::Every } else { SyncPolicy::None };
        run_record_log(sync, segment_bytes, &ops, pick, seed);
    }

    #[test]
    fn group_log_recovers_a_prefix_holding_everything_synced(
        mode in prop_oneof![Just(SyncMode::Group), Just(SyncMode::Every), Just(SyncMode::None)],
        segment_bytes in segment_bytes(),
        ops in prop::collection::vec(op(), 1..40),
        pick in any::<u64>(),
        seed in any::<u64>(),
    ) {
        run_group_log(mode, segment_bytes, &ops, pick, seed);
    }
}

// ---------------------------------------------------------------------------------------
// The checker above, fed a log that lost acknowledged data or changed a record, must fail.

fn synced_log(memory: &MemStorage, payloads: &[&[u8]]) {
    let (mut log, _) = RecordLog::recover(memory, options(SyncPolicy::None)).unwrap();
    for payload in payloads {
        log.append(payload).unwrap();
    }
    log.sync().unwrap();
}

#[test]
#[should_panic(expected = "acknowledged up to LSN 3")]
fn checker_catches_a_lost_acknowledged_record() {
    let memory = MemStorage::new();
    synced_log(&memory, &[b"one", b"two", b"three"]);
    // A broken "crash" that drops the last synced record.
    let segment = memory.open(&virga_log::segment_file_name(1)).unwrap();
    segment.truncate(segment.len().unwrap() - 10).unwrap();
    segment.sync().unwrap();
    check_recovery(&memory, &[b"one".to_vec(), b"two".to_vec(), b"three".to_vec()], 3, 1);
}

#[test]
#[should_panic(expected = "LSN 2")]
fn checker_catches_a_changed_record() {
    let memory = MemStorage::new();
    synced_log(&memory, &[b"one", b"two"]);
    check_recovery(&memory, &[b"one".to_vec(), b"TWO".to_vec()], 2, 1);
}

// ---------------------------------------------------------------------------------------
// Faults surface as named errors, never as silent loss.

fn faulty() -> (MemStorage, Arc<FaultPlan>, Arc<dyn Storage>) {
    let memory = MemStorage::new();
    let plan = FaultPlan::new();
    let storage: Arc<dyn Storage> = Arc::new(FaultyStorage::new(Arc::new(memory.clone()), Arc::clone(&plan)));
    (memory, plan, storage)
}

fn recovered_payloads(memory: &MemStorage) -> Vec<Vec<u8>> {
    let mut payloads = Vec::new();
    RecordLog::open_with(memory, options(SyncPolicy::None), OpenMode::Repair, |_, payload| {
        payloads.push(payload.to_vec())
    })
    .unwrap();
    payloads
}

#[test]
fn a_failed_fsync_poisons_the_log_and_loses_nothing_acknowledged() {
    let (memory, plan, storage) = faulty();
    let (mut log, _) = RecordLog::recover(&storage, options(SyncPolicy::None)).unwrap();
    for i in 0..5u8 {
        log.append(&[i; 40]).unwrap();
    }
    assert_eq!(log.sync().unwrap(), 5);
    log.append(b"never acknowledged").unwrap();
    plan.fail_syncs_after(0);
    let error = log.sync().unwrap_err();
    assert!(matches!(&error, LogError::Io { op: "fsync", .. }), "{error}");
    assert!(error.to_string().contains("mem:/00000000000000000001.seg"), "{error}");
    assert_eq!(log.durable_lsn(), 5);
    assert!(matches!(log.append(b"more"), Err(LogError::Poisoned { .. })));
    assert!(matches!(log.sync(), Err(LogError::Poisoned { .. })));
    drop(log);
    for seed in 0..20 {
        let payloads = recovered_payloads(&memory.crash(seed));
        assert!(payloads.len() >= 5, "seed {seed}: {} records", payloads.len());
        assert_eq!(payloads[4], [4u8; 40]);
    }
}

#[test]
fn a_failed_fsync_fails_group_commit_waiters() {
    let (_, plan, storage) = faulty();
    let group = GroupLogOptions { sync: SyncMode::Group, ..GroupLogOptions::default() };
    let (log, _) = GroupLog::recover(&storage, group).unwrap();
    assert_eq!(log.append_durable(b"acknowledged").unwrap(), 1);
    plan.fail_syncs_after(0);
    let lsn = log.append(b"not acknowledged").unwrap();
    let error = log.wait_durable(lsn).unwrap_err();
    assert!(matches!(&error, LogError::Poisoned { cause, .. } if cause.contains("injected fsync failure")), "{error}");
    assert_eq!(log.durable_lsn(), 1);
    assert!(log.close().is_err());
}

#[test]
fn a_flipped_bit_is_named_as_corruption_with_its_record() {
    let (memory, plan, storage) = faulty();
    let small = LogOptions { segment_bytes: 300, ..options(SyncPolicy::None) };
    let (mut log, _) = RecordLog::recover(&storage, small.clone()).unwrap();
    for i in 0..20u8 {
        log.append(&[i; 40]).unwrap();
    }
    log.sync().unwrap();
    // After opening: a read of the damaged record names it.
    let location = log.location(2).unwrap();
    let segment = storage.path_of(&location.segment);
    let payload_byte = location.offset + virga_log::RECORD_HEADER_LEN as u64 + 7;
    plan.flip_bits_on_read(&segment, payload_byte, 0x01);
    match log.read(2) {
        Err(LogError::Corrupt { segment: named, offset, lsn, .. }) => {
            assert_eq!((named, offset, lsn), (segment.clone(), location.offset, Some(2)))
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    assert_eq!(log.read(3).unwrap(), [2u8; 40], "other records read fine");
    assert_eq!(log.read_prefix(2, 4).unwrap(), [1u8; 4], "the damage lies past the prefix");
    drop(log);
    // When opening: the first segment is not the last, so this is damage, not a torn tail.
    let error = RecordLog::recover(&storage, small.clone()).unwrap_err();
    assert!(matches!(&error, LogError::Corrupt { lsn: Some(2), .. }), "{error}");
    assert!(error.to_string().contains("00000000000000000001.seg"), "{error}");
    match RecordLog::scan(&storage, &small).unwrap().verdict {
        Verdict::Damaged(damage) => assert_eq!((damage.segment, damage.lsn), (segment, Some(2))),
        other => panic!("expected damage, got {other:?}"),
    }
    plan.heal();
    assert_eq!(recovered_payloads(&memory).len(), 20, "the data itself was intact");
}

#[test]
fn a_full_disk_is_an_error_and_acknowledged_records_survive() {
    let (memory, plan, storage) = faulty();
    let (mut log, _) = RecordLog::recover(&storage, options(SyncPolicy::Every)).unwrap();
    plan.fill_disk_after(5_000);
    let mut acknowledged = 0;
    let error = loop {
        match log.append(&[7; 100]) {
            Ok(lsn) => acknowledged = lsn,
            Err(error) => break error,
        }
    };
    match &error {
        LogError::Io { source, path, .. } => {
            assert_eq!(source.kind(), io::ErrorKind::StorageFull);
            assert!(path.starts_with("mem:/"), "{error}");
        }
        other => panic!("expected a full disk, got {other}"),
    }
    assert!(acknowledged > 10);
    assert!(matches!(log.append(b"x"), Err(LogError::Poisoned { .. })));
    drop(log);
    plan.heal();
    for seed in 0..20 {
        let crashed = memory.crash(seed);
        assert!(recovered_payloads(&crashed).len() as u64 >= acknowledged, "seed {seed}");
        let (mut log, _) = RecordLog::recover(&crashed, options(SyncPolicy::Every)).unwrap();
        log.append(b"room again").unwrap();
    }
}

#[test]
fn short_reads_change_nothing_read() {
    let (memory, plan, storage) = faulty();
    synced_log(&memory, &[&[1; 300], &[2; 4000], b"three"]);
    plan.short_reads(true);
    let (log, recovered) = RecordLog::recover(&storage, options(SyncPolicy::None)).unwrap();
    assert_eq!(recovered.record_count, 3);
    assert_eq!(log.read(2).unwrap(), vec![2; 4000]);
}

#[derive(Clone, Debug)]
enum FaultyOp {
    Append(Vec<u8>),
    Sync,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// With the disk filling up and fsyncs failing at random points, every error is a named
    /// I/O error or the poisoned log refusing work, and everything acknowledged survives a
    /// crash.
    #[test]
    fn faults_never_lose_acknowledged_records(
        ops in prop::collection::vec(prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..300).prop_map(FaultyOp::Append),
            1 => Just(FaultyOp::Sync),
        ], 1..60),
        budget in 0u64..8000,
        syncs_allowed in 0u64..20,
        seed in any::<u64>(),
    ) {
        let (memory, plan, storage) = faulty();
        let (mut log, _) = RecordLog::recover(&storage, options(SyncPolicy::None)).unwrap();
        plan.fill_disk_after(budget);
        plan.fail_syncs_after(syncs_allowed);
        let mut appended = Vec::new();
        let mut acknowledged = 0;
        let mut failed = false;
        for op in ops {
            let result = match op {
                FaultyOp::Append(payload) => log.append(&payload).map(|lsn| {
                    appended.push(payload);
                    prop_assert_eq!(lsn, appended.len() as u64);
                    Ok(())
                }),
                FaultyOp::Sync => log.sync().map(|durable| {
                    acknowledged = durable;
                    Ok(())
                }),
            };
            match result {
                Ok(check) => check?,
                Err(LogError::Poisoned { .. }) => prop_assert!(failed, "poisoned without a failure"),
                Err(LogError::Io { path, source, .. }) => {
                    prop_assert!(path.starts_with("mem:/"));
                    prop_assert!(source.to_string().contains("injected"), "{}", source);
                    failed = true;
                }
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }
        std::mem::forget(log);
        plan.heal();
        check_recovery(&memory.crash(seed), &appended, acknowledged, 1);
    }
}
