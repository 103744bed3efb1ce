//! A shard replica: Algorithm 1's checks one by one, gets against a model, and the rebuild a
//! primary does when it takes over from records that arrived in any order.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use virga_storage::{Timestamp, TxnId, VersionedStore};
use virga_txn::AbortReason;

use crate::shard::replica::CcRule;
use crate::shard::{ReadOp, ShardRecord, ShardReplica, TxnStatus, WriteOp};

fn key(name: &str) -> Bytes {
    Bytes::copy_from_slice(name.as_bytes())
}

fn ts(time: u64) -> Timestamp {
    Timestamp::new(time, 1)
}

fn put(name: &str, value: &str) -> WriteOp {
    WriteOp { key: key(name), value: Some(Bytes::copy_from_slice(value.as_bytes())) }
}

fn read(name: &str, version: Timestamp) -> ReadOp {
    ReadOp { key: key(name), version, cached: false }
}

/// The prepare of a transaction of shard 0 alone.
fn prepared_alone(txn: TxnId, commit_ts: Timestamp, writes: Vec<WriteOp>) -> ShardRecord {
    ShardRecord::Prepared { txn, commit_ts, writes, participants: vec![0], takeover_of: vec![] }
}

/// A replica where transaction 1 committed `x` at 10.
fn with_x_at_10() -> ShardReplica {
    let mut replica = ShardReplica::new();
    replica.apply(&prepared_alone(1, ts(10), vec![put("x", "a")]));
    replica.apply(&ShardRecord::Decided { txn: 1, commit: true });
    replica
}

#[test]
fn algorithm_one_refuses_each_conflict_and_accepts_the_rest() {
    let mut replica = with_x_at_10();
    // A read of the version that is still the newest, and a write above everything: fine.
    assert_eq!(replica.validate(2, ts(20), &[read("x", ts(10))], &[], &[put("y", "b")]), Ok(()));
    // The read version is no longer the newest.
    assert_eq!(replica.validate(2, ts(20), &[read("x", ts(5))], &[], &[]), Err(AbortReason::ReadStale));
    // A write at or below the newest version.
    assert_eq!(replica.validate(2, ts(10), &[], &[], &[put("x", "b")]), Err(AbortReason::WriteStale));
    // A read at 30 raised x's latest read: a write at 25 would change what it saw.
    replica.get(&key("x"), ts(30));
    assert_eq!(replica.validate(2, ts(25), &[], &[], &[put("x", "b")]), Err(AbortReason::WriteAfterRead));
    assert_eq!(replica.validate(2, ts(31), &[], &[], &[put("x", "b")]), Ok(()));
    // Transaction 3 holds x: others may neither read nor write it; 3 itself may.
    replica.apply(&prepared_alone(3, ts(40), vec![put("x", "c")]));
    assert_eq!(replica.validate(2, ts(50), &[read("x", ts(10))], &[], &[]), Err(AbortReason::ReadPrepared));
    assert_eq!(replica.validate(2, ts(50), &[], &[], &[put("x", "d")]), Err(AbortReason::WritePrepared));
    assert_eq!(replica.validate(3, ts(40), &[read("x", ts(10))], &[], &[put("x", "c")]), Ok(()));
    // A get at or above a prepared writer says so; below it does not.
    assert!(replica.get(&key("x"), ts(40)).prepared_below);
    assert!(!replica.get(&key("x"), ts(39)).prepared_below);
    // Aborting releases x and installs nothing.
    replica.apply(&ShardRecord::Decided { txn: 3, commit: false });
    assert_eq!(replica.txn(3).map(|entry| entry.status), Some(TxnStatus::Aborted));
    assert_eq!(replica.get(&key("x"), ts(100)).version, ts(10));
    assert_eq!(replica.validate(2, ts(101), &[], &[], &[put("x", "d")]), Ok(()));
}

#[test]
fn a_primary_that_took_over_refuses_commits_at_or_below_the_leases_granted() {
    let mut replica = with_x_at_10();
    replica.take_over(ts(50));
    assert_eq!(replica.validate(2, ts(50), &[], &[], &[put("y", "b")]), Err(AbortReason::BelowCommitFloor));
    assert_eq!(replica.validate(2, ts(51), &[], &[], &[put("y", "b")]), Ok(()));
    // A read-only part has nothing to refuse.
    assert_eq!(replica.validate(2, ts(40), &[read("x", ts(10))], &[], &[]), Ok(()));
}

/// A node loads its data after its log replayed: the loaded version goes below what the
/// replay installed (a load that replaced the key's history lost those versions once a
/// takeover stopped rebuilding the store from the transaction table).
#[test]
fn data_loaded_after_a_replay_goes_below_the_replayed_versions() {
    let mut replica = with_x_at_10();
    replica.load(key("x"), Bytes::from_static(b"loaded"));
    replica.load(key("y"), Bytes::from_static(b"fresh"));
    assert_eq!(replica.get(&key("x"), ts(20)).value, Some(Bytes::from_static(b"a")));
    assert_eq!(replica.get(&key("x"), ts(5)).value, Some(Bytes::from_static(b"loaded")));
    assert_eq!(replica.get(&key("y"), ts(5)).value, Some(Bytes::from_static(b"fresh")));
    replica.take_over(Timestamp::ZERO);
    assert_eq!(replica.get(&key("x"), ts(20)).value, Some(Bytes::from_static(b"a")), "a takeover keeps the versions");
}

#[test]
fn records_are_idempotent_and_a_decision_may_come_before_its_prepare() {
    let mut replica = ShardReplica::new();
    let decided = ShardRecord::Decided { txn: 7, commit: true };
    let prepared = ShardRecord::Prepared {
        txn: 7,
        commit_ts: ts(5),
        writes: vec![put("k", "v")],
        participants: vec![0],
        takeover_of: vec![],
    };
    replica.apply(&decided);
    assert_eq!(replica.decided_early(7), Some(true));
    replica.apply(&prepared);
    replica.apply(&prepared);
    replica.apply(&decided);
    assert_eq!(replica.txn(7).map(|entry| entry.status), Some(TxnStatus::Committed));
    assert_eq!(replica.get(&key("k"), ts(6)).value, Some(Bytes::from_static(b"v")));
}

/// Committed transactions writing random keys at increasing timestamps.
fn history() -> impl Strategy<Value = Vec<(u64, Vec<WriteOp>)>> {
    proptest::collection::vec(proptest::collection::btree_set(0u8..6, 1..4), 1..25).prop_map(|txns| {
        txns.into_iter()
            .enumerate()
            .map(|(index, keys)| {
                let writes = keys.into_iter().map(|k| put(&format!("k{k}"), &format!("v{index}"))).collect();
                (index as u64 + 1, writes)
            })
            .collect()
    })
}

proptest! {
    /// SEMEL's backups take records in any order; a primary taking over rebuilds versions
    /// in commit order, so every read at every timestamp matches a model of the history.
    /// Some decisions come only after the takeover (the new primary's termination decides
    /// them), older than versions already installed: they go below those.
    #[test]
    fn a_takeover_rebuilds_the_same_versions_from_records_in_any_order(
        txns in history(),
        order in proptest::collection::vec(any::<u64>(), 50),
        late in 0usize..50,
    ) {
        let mut records = Vec::new();
        for (txn, writes) in &txns {
            records.push(ShardRecord::Prepared { txn: *txn, commit_ts: ts(*txn * 10), writes: writes.clone(), participants: vec![0], takeover_of: vec![] });
            records.push(ShardRecord::Decided { txn: *txn, commit: true });
        }
        // A deterministic shuffle driven by `order`.
        let count = records.len();
        for (position, draw) in order.iter().enumerate().take(count) {
            records.swap(position, (*draw as usize) % count);
        }
        let (early, late) = records.split_at(count - late % (count + 1));
        let is_decision = |record: &&ShardRecord| matches!(record, ShardRecord::Decided { .. });
        let mut backup = ShardReplica::new();
        for record in early.iter().chain(late.iter().filter(|record| !is_decision(record))) {
            backup.apply(record);
        }
        backup.take_over(Timestamp::ZERO);
        for record in late.iter().filter(is_decision) {
            backup.apply(record);
        }
        // The model: per key, the value of the newest write at or below each timestamp.
        let mut model: BTreeMap<Bytes, BTreeMap<u64, Bytes>> = BTreeMap::new();
        for (txn, writes) in &txns {
            for write in writes {
                model.entry(write.key.clone()).or_default().insert(*txn * 10, write.value.clone().unwrap_or_default());
            }
        }
        for (name, versions) in &model {
            for at in 0..=(txns.len() as u64 * 10 + 5) {
                let expected = versions.range(..=at).next_back().map(|(_, value)| value.clone());
                let entry = backup.store().find(name);
                let got = entry.and_then(|entry| backup.store().read_at(&entry, ts(at)).visible).and_then(|version| version.value);
                prop_assert_eq!(got, expected, "key {:?} at {}", name, at);
            }
        }
    }
}

fn range(start: &str, end: &str, at: u64) -> crate::shard::ScanRange {
    crate::shard::ScanRange { start: key(start), end: Some(key(end)), ts: ts(at) }
}

#[test]
fn scans_read_a_snapshot_and_keep_it_free_of_phantoms() {
    let mut replica = with_x_at_10();
    replica.apply(&prepared_alone(2, ts(20), vec![put("y", "b")]));
    replica.apply(&ShardRecord::Decided { txn: 2, commit: true });
    // At 15, y does not exist yet; at 25 both do; z is outside the range.
    let keys = |found: crate::shard::ScanResult| found.rows.into_iter().map(|(key, _)| key).collect::<Vec<_>>();
    assert_eq!(keys(replica.scan(range("a", "z", 15), 10)), vec![key("x")]);
    assert_eq!(keys(replica.scan(range("a", "z", 25), 10)), vec![key("x"), key("y")]);
    assert_eq!(keys(replica.scan(range("a", "z", 25), 1)), vec![key("x")]);
    // The range was read at 25: a new key inside it at or below 25 is a phantom for that
    // scan; above 25, or outside the range, it is fine.
    assert_eq!(replica.validate(3, ts(25), &[], &[], &[put("q", "c")]), Err(AbortReason::Phantom));
    assert_eq!(replica.validate(3, ts(26), &[], &[], &[put("q", "c")]), Ok(()));
    assert_eq!(replica.validate(3, ts(25), &[], &[], &[put("zz", "c")]), Ok(()));
    // A scanning transaction whose range gained a key after its scan aborts at prepare.
    replica.apply(&prepared_alone(4, ts(30), vec![put("m", "d")]));
    assert_eq!(replica.validate(5, ts(40), &[], &[range("a", "z", 25)], &[]), Err(AbortReason::ReadPrepared));
    replica.apply(&ShardRecord::Decided { txn: 4, commit: true });
    assert_eq!(replica.validate(5, ts(40), &[], &[range("a", "z", 25)], &[]), Err(AbortReason::Phantom));
    assert_eq!(replica.validate(5, ts(40), &[], &[range("a", "z", 30)], &[]), Ok(()));
}

/// Found by seed 397352 of session 8's soak: the old primary decided T1 (x at 10) and then
/// let T2 prepare x at 20; the backups had both prepares and neither decision. A replica
/// rebuilt from them holds both writers prepared on x: a read at 15 must see a prepared
/// writer below it (T1's, which the termination later commits), and T2's decision must not
/// release T1's hold.
#[test]
fn a_rebuilt_replica_holding_two_prepared_writers_of_a_key_reports_both() {
    let mut replica = ShardReplica::new();
    let prepared = |txn, at, value| ShardRecord::Prepared {
        txn,
        commit_ts: ts(at),
        writes: vec![put("x", value)],
        participants: vec![0, 1],
        takeover_of: vec![],
    };
    // T2's prepare arrives first at this backup: the records come in any order.
    replica.apply(&prepared(2, 20, "b"));
    replica.apply(&prepared(1, 10, "a"));
    replica.take_over(Timestamp::ZERO);
    assert!(replica.get(&key("x"), ts(15)).prepared_below, "T1 is prepared below 15");
    assert!(!replica.get(&key("x"), ts(5)).prepared_below);
    // A new writer is refused while either holds x.
    assert_eq!(replica.validate(3, ts(30), &[], &[], &[put("x", "c")]), Err(AbortReason::WritePrepared));
    replica.apply(&ShardRecord::Decided { txn: 2, commit: false });
    assert!(replica.get(&key("x"), ts(15)).prepared_below, "T2's abort leaves T1 holding x");
    replica.apply(&ShardRecord::Decided { txn: 1, commit: true });
    let read = replica.get(&key("x"), ts(15));
    assert!(!read.prepared_below);
    assert_eq!((read.writer, read.value), (1, Some(Bytes::from_static(b"a"))));
}

/// One step of a primary's life, for the pruning oracle: gets, scans, prepares (validated
/// first, as the primary does), decisions, and the watermark rising with a collection.
#[derive(Debug, Clone)]
enum Step {
    Get {
        key: u8,
        at: u64,
    },
    Scan {
        at: u64,
    },
    Prepare {
        read: Option<u8>,
        write: u8,
        at: u64,
    },
    Decide {
        which: usize,
        commit: bool,
    },
    Collect {
        watermark: u64,
    },
    /// The primary settles what is decided below its watermark (every backup holds it).
    Settle,
    /// A record of a transaction already seen arrives again, late.
    Late {
        which: usize,
        decision: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..8, 0u64..60).prop_map(|(key, at)| Step::Get { key, at }),
        (0u64..60).prop_map(|at| Step::Scan { at }),
        (proptest::option::of(0u8..8), 0u8..8, 0u64..60).prop_map(|(read, write, at)| Step::Prepare {
            read,
            write,
            at
        }),
        (any::<usize>(), any::<bool>()).prop_map(|(which, commit)| Step::Decide { which, commit }),
        (0u64..60).prop_map(|watermark| Step::Collect { watermark }),
        Just(Step::Settle),
        (any::<usize>(), any::<bool>()).prop_map(|(which, decision)| Step::Late { which, decision }),
    ]
}

/// How the pruned replica of the oracle test is pruned.
#[derive(Debug, Clone, Copy)]
struct Pruning {
    cc: CcRule,
    /// Broken: settling forgets the transaction's id too.
    forget_settled_ids: bool,
}

impl Pruning {
    const RULES: Pruning = Pruning { cc: CcRule::Idle, forget_settled_ids: false };
}

fn key_of(index: u8) -> Bytes {
    key(&format!("k{index}"))
}

/// Runs `steps` on a replica collecting by `rule` and on one keeping all its
/// concurrency-control state: every get, scan and validation at or above the watermark (the
/// only ones a primary serves) must get the same answer from both.
fn same_answers_as_the_unpruned(steps: Vec<Step>, pruning: Pruning) -> Result<(), TestCaseError> {
    let mut pruned = ShardReplica::new();
    pruned.cc_rule = pruning.cc;
    pruned.forget_settled_ids = pruning.forget_settled_ids;
    let mut oracle = ShardReplica::new();
    oracle.cc_rule = CcRule::Keep;
    let mut prepared: Vec<TxnId> = Vec::new();
    // Every record sent so far, for late deliveries.
    let mut sent: Vec<ShardRecord> = Vec::new();
    let mut next_txn: TxnId = 1;
    // Time moves on: each step's timestamps are offsets above the watermark.
    let mut floor = 0u64;
    for step in steps {
        match step {
            Step::Get { key, at } => {
                let at = ts(floor + at);
                prop_assert_eq!(pruned.get(&key_of(key), at), oracle.get(&key_of(key), at));
            }
            Step::Scan { at } => {
                let range = range("k", "l", floor + at);
                prop_assert_eq!(pruned.scan(range.clone(), 100), oracle.scan(range, 100));
            }
            Step::Prepare { read, write, at } => {
                let (txn, commit_ts) = (next_txn, ts(floor + at + 1));
                next_txn += 1;
                let mut reads = Vec::new();
                if let Some(key) = read {
                    let version = oracle.get(&key_of(key), commit_ts).version;
                    prop_assert_eq!(pruned.get(&key_of(key), commit_ts).version, version);
                    reads.push(ReadOp { key: key_of(key), version, cached: false });
                }
                let writes = vec![WriteOp { key: key_of(write), value: Some(Bytes::from(format!("v{txn}"))) }];
                let verdict = oracle.validate(txn, commit_ts, &reads, &[], &writes);
                prop_assert_eq!(pruned.validate(txn, commit_ts, &reads, &[], &writes), verdict);
                if verdict.is_ok() {
                    let record = prepared_alone(txn, commit_ts, writes);
                    pruned.prepare(record.clone(), &reads, &[]);
                    oracle.prepare(record.clone(), &reads, &[]);
                    sent.push(record);
                    prepared.push(txn);
                }
            }
            Step::Decide { which, commit } if !prepared.is_empty() => {
                let record = ShardRecord::Decided { txn: prepared.remove(which % prepared.len()), commit };
                pruned.apply(&record);
                oracle.apply(&record);
                sent.push(record);
            }
            Step::Decide { .. } => {}
            Step::Settle => {
                pruned.settle(1, |_| false);
            }
            Step::Late { which, decision } if !sent.is_empty() => {
                let wanted = |record: &&ShardRecord| matches!(record, ShardRecord::Decided { .. }) == decision;
                let candidates: Vec<&ShardRecord> = sent.iter().filter(wanted).collect();
                if let Some(record) = candidates.get(which % candidates.len().max(1)) {
                    pruned.apply(record);
                    oracle.apply(record);
                }
            }
            Step::Late { .. } => {}
            Step::Collect { watermark } => {
                floor += watermark;
                for replica in [&mut pruned, &mut oracle] {
                    replica.raise_watermark(ts(floor));
                    replica.collect();
                }
            }
        }
    }
    for txn in 1..next_txn {
        prop_assert_eq!(pruned.status(txn), oracle.status(txn), "transaction {}", txn);
    }
    prop_assert_eq!(pruned.prepared_count(), oracle.prepared_count());
    prop_assert!(pruned.cc_entries() <= oracle.cc_entries());
    prop_assert!(pruned.txn_entries() <= oracle.txn_entries());
    Ok(())
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Collecting idle keys' concurrency-control state, and settling decided transactions
    /// below the watermark, change no answer, late records included.
    #[test]
    fn pruned_state_gives_the_answers_of_the_unpruned(steps in steps()) {
        same_answers_as_the_unpruned(steps, Pruning::RULES)?;
    }
}

#[test]
fn the_oracle_catches_state_collected_while_a_read_above_the_watermark_needs_it() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let eager = Pruning { cc: CcRule::Eager, ..Pruning::RULES };
    let caught = runner.run(&steps(), |steps| same_answers_as_the_unpruned(steps, eager));
    assert!(caught.is_err(), "dropping every idle key's latest read went unnoticed");
}

#[test]
fn the_oracle_catches_settling_that_forgets_the_transactions_it_settled() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let forgetful = Pruning { forget_settled_ids: true, ..Pruning::RULES };
    let caught = runner.run(&steps(), |steps| same_answers_as_the_unpruned(steps, forgetful));
    assert!(caught.is_err(), "a late prepare of a forgotten transaction went unnoticed");
}

#[test]
fn idle_keys_read_below_the_watermark_keep_no_state_and_writes_below_it_are_refused() {
    let mut replica = with_x_at_10();
    for index in 0..100 {
        replica.get(&key(&format!("missing-{index}")), ts(20));
    }
    replica.apply(&prepared_alone(2, ts(40), vec![put("held", "v")]));
    assert_eq!(replica.cc_entries(), 101, "a read of a key that never existed keeps its latest read");
    replica.raise_watermark(ts(30));
    replica.collect();
    assert_eq!(replica.cc_entries(), 1, "only the held key keeps its state");
    // A write at 25 could pass a read at 20 whose state is gone: below the watermark, no
    // write commits (the vote names the floor to pass).
    let write = [put("missing-7", "late")];
    assert_eq!(replica.validate(3, ts(25), &[], &[], &write), Err(AbortReason::BelowCommitFloor));
    assert_eq!(replica.write_floor(), ts(30));
    assert_eq!(replica.validate(3, ts(31), &[], &[], &write), Ok(()));
    replica.apply(&ShardRecord::Decided { txn: 2, commit: false });
    assert_eq!(replica.cc_entries(), 0, "a released key read last below the watermark keeps nothing");
}

#[test]
fn a_scan_whose_end_is_before_its_start_finds_nothing() {
    let mut replica = with_x_at_10();
    replica.apply(&prepared_alone(2, ts(40), vec![put("m", "v")]));
    let backwards = range("z", "a", 50);
    assert_eq!(replica.scan(backwards.clone(), 10), crate::shard::ScanResult::default());
    assert_eq!(replica.validate(3, ts(60), &[], &[backwards], &[]), Ok(()));
}

/// A backup that lost a transaction's decision (or all of it) merges its primary's settled
/// state: the versions it lacks go in where they belong, what it held prepared is decided
/// from the outcome, and merging twice changes nothing.
#[test]
fn a_settled_state_fills_in_what_a_replica_lost() {
    let mut primary = with_x_at_10();
    primary.apply(&prepared_alone(2, ts(20), vec![put("y", "b")]));
    primary.apply(&ShardRecord::Decided { txn: 2, commit: true });
    primary.apply(&prepared_alone(3, ts(30), vec![put("x", "c")]));
    primary.apply(&ShardRecord::Decided { txn: 3, commit: true });
    primary.raise_watermark(ts(40));
    primary.settle(1, |_| false);
    assert_eq!((primary.txn_entries(), primary.settled_entries()), (0, 3), "all three settled");
    // The backup holds T2 prepared (its decision lost) and lost T1 and T3 altogether.
    let mut backup = ShardReplica::new();
    backup.apply(&prepared_alone(2, ts(20), vec![put("y", "b")]));
    let parts = primary.settled_parts(16);
    assert!(parts.len() > 1, "small parts: {parts:?}");
    for _ in 0..2 {
        for part in &parts {
            backup.apply(&ShardRecord::Settled(part.clone()));
        }
    }
    for (txn, status) in [(1, TxnStatus::Committed), (2, TxnStatus::Committed), (3, TxnStatus::Committed)] {
        assert_eq!(backup.status(txn), Some(status), "transaction {txn}");
    }
    assert_eq!(backup.prepared_count(), 0, "T2 is decided");
    for (name, at, value) in [("x", 15, "a"), ("x", 35, "c"), ("y", 25, "b")] {
        assert_eq!(backup.get(&key(name), ts(at)).value, Some(Bytes::copy_from_slice(value.as_bytes())));
    }
    // A late prepare of a settled transaction holds nothing.
    backup.apply(&prepared_alone(3, ts(30), vec![put("x", "c")]));
    assert_eq!(backup.prepared_count(), 0);
    assert_eq!(backup.validate(9, ts(50), &[], &[], &[put("x", "d")]), Ok(()));
}

/// A backup drops decided entries below the settled point of its primary's epoch; a point
/// from an older epoch is ignored, and a new epoch's point replaces a higher old one.
#[test]
fn a_backup_settles_by_the_newest_epochs_point() {
    let mut backup = ShardReplica::new();
    for (txn, at) in [(1, 10), (2, 20), (3, 30)] {
        backup.apply(&prepared_alone(txn, ts(at), vec![put(&format!("k{txn}"), "v")]));
    }
    backup.apply(&ShardRecord::Decided { txn: 1, commit: true });
    backup.apply(&ShardRecord::Decided { txn: 3, commit: false });
    assert_eq!(backup.learn_settled(1, ts(35)), 2, "T1 and T3 are decided below 35; T2 stays prepared");
    assert_eq!(backup.status(3), Some(TxnStatus::Aborted));
    assert_eq!(backup.prepared_count(), 1);
    assert_eq!(backup.learn_settled(0, ts(100)), 0, "an older epoch's point");
    assert_eq!(backup.settled_point(), (1, ts(35)));
    assert_eq!(backup.learn_settled(2, ts(5)), 0);
    assert_eq!(backup.settled_point(), (2, ts(5)), "a new primary's point replaces the old one");
    backup.apply(&ShardRecord::Decided { txn: 2, commit: true });
    assert_eq!(backup.learn_settled(2, ts(15)), 0, "T2 at 20 is above 15");
    assert_eq!(backup.learn_settled(2, ts(21)), 1);
    assert_eq!(backup.txn_entries(), 0);
}
