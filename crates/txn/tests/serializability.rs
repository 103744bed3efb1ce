//! Randomized multi-threaded histories on hot keys, under every concurrency control and
//! timestamp scheme, checked by the history checker; plus snapshot audits of a transfer
//! invariant, and proof that the checker catches a broken validator.

use std::ops::Bound;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use virga_txn::checker::{check, HistoryRecorder, Violation};
use virga_txn::{
    AbortReason, ConcurrencyControl, Engine, EngineConfig, MvStore, SideTable, SkewProfile, SkewedClocks,
    TimestampScheme, TxnStore, VersionedStore,
};

const THREADS: usize = 4;

fn key(i: u64) -> Vec<u8> {
    let mut k = b"k".to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn config(cc: ConcurrencyControl, timestamps: TimestampScheme, skew: SkewProfile) -> EngineConfig {
    EngineConfig { cc, timestamps, clock_skew: skew, seed: 7, ..EngineConfig::default() }
}

/// Transactions [`run_mix`] runs on one session before the threads start. Nothing runs
/// concurrently with them, and each reads a loaded key none of them writes and inserts a
/// key of its own, so they all commit whatever the scheduling and the clocks: the checked
/// history is never empty, however the concurrent part goes.
const SEQUENTIAL: u64 = 50;

/// Runs a random mix on `hot` keys (plus inserts and deletes) and returns commits and the
/// recorded history's verdict.
fn run_mix(config: EngineConfig, hot: u64, txns_per_thread: usize, seed: u64) -> (u64, Result<usize, Violation>) {
    run_mix_on(config, hot, txns_per_thread, seed, |config| Engine::open(config).unwrap().0)
}

/// [`run_mix`] on the engine `open` builds from the configuration.
fn run_mix_on<S: TxnStore + 'static>(
    mut config: EngineConfig,
    hot: u64,
    txns_per_thread: usize,
    seed: u64,
    open: impl FnOnce(EngineConfig) -> Arc<Engine<S>>,
) -> (u64, Result<usize, Violation>) {
    let history = Arc::new(HistoryRecorder::new());
    config.history = Some(Arc::clone(&history));
    let engine = open(config);
    engine.load((0..hot).map(|i| (key(i), i.to_le_bytes().to_vec()))).unwrap();
    let mut session = engine.session().unwrap();
    for n in 0..SEQUENTIAL {
        let mut txn = session.begin();
        let (from, to) = (key(n % hot), key(1_000_000 + n));
        let value = txn.get(&from).unwrap().unwrap();
        txn.put(&to, value).unwrap();
        txn.commit().unwrap_or_else(|abort| panic!("sequential transaction {n}: {abort}"));
    }
    drop(session);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || {
                let mut session = engine.session().unwrap();
                let mut rng = SmallRng::seed_from_u64(seed * 100 + t as u64);
                let mut commits = 0u64;
                for n in 0..txns_per_thread {
                    // Keys beyond `hot` start absent: writes to them are inserts.
                    let pick = |rng: &mut SmallRng| rng.random_range(0..hot + hot / 4);
                    if rng.random_bool(0.3) {
                        let mut txn = session.begin_read_only();
                        let ok = if rng.random_bool(0.2) {
                            let from = key(pick(&mut rng));
                            txn.scan(Bound::Included(&from), Bound::Unbounded, 4).is_ok()
                        } else {
                            (0..4).all(|_| txn.get(&key(pick(&mut rng))).is_ok())
                        };
                        if ok && txn.commit().is_ok() {
                            commits += 1;
                        }
                        continue;
                    }
                    let mut txn = session.begin();
                    let mut ok = true;
                    for _ in 0..rng.random_range(1..=3) {
                        ok &= txn.get(&key(pick(&mut rng))).is_ok();
                    }
                    if rng.random_bool(0.1) {
                        let from = key(pick(&mut rng));
                        ok &= txn.scan(Bound::Included(&from), Bound::Unbounded, 3).is_ok();
                    }
                    for _ in 0..rng.random_range(1..=2) {
                        let k = key(pick(&mut rng));
                        ok &= if rng.random_bool(0.1) {
                            txn.delete(&k).is_ok()
                        } else {
                            txn.put(&k, (n as u64).to_le_bytes().to_vec()).is_ok()
                        };
                    }
                    if ok && txn.commit().is_ok() {
                        commits += 1;
                    }
                }
                commits
            })
        })
        .collect();
    let commits = SEQUENTIAL + threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>();
    let verdict = check(&history.snapshot()).map(|report| report.transactions);
    (commits, verdict)
}

fn assert_serializable(cc: ConcurrencyControl, timestamps: TimestampScheme, skew: SkewProfile) {
    for seed in 0..3 {
        assert_verdict(cc, timestamps, skew, seed, run_mix(config(cc, timestamps, skew), 12, 2_000, seed));
    }
}

fn assert_verdict(
    cc: ConcurrencyControl,
    timestamps: TimestampScheme,
    skew: SkewProfile,
    seed: u64,
    (commits, verdict): (u64, Result<usize, Violation>),
) {
    match verdict {
        Ok(checked) => {
            // How many concurrent transactions commit depends on scheduling; that every
            // commit is in the history, and the history is serializable, does not.
            assert_eq!(checked as u64, commits, "every commit is in the history");
            assert!(commits >= SEQUENTIAL, "{cc}/{timestamps}: only {commits} commits");
        }
        Err(violation) => panic!("{cc}/{timestamps}/{skew} seed {seed}: {violation}"),
    }
}

/// Any `VersionedStore` runs under the engine through a side table of concurrency-control
/// state; the same mixes stay serializable on it.
#[test]
fn a_store_with_a_side_table_is_serializable() {
    for cc in [ConcurrencyControl::Occ, ConcurrencyControl::TwoPhaseLocking] {
        let (timestamps, skew) = (TimestampScheme::Clock, SkewProfile::Ntp);
        let open = |config: EngineConfig| {
            let clocks = Arc::new(SkewedClocks::system(config.clock_skew, config.seed));
            Engine::open_with(config, SideTable::new(MvStore::new()), clocks).unwrap().0
        };
        let outcome = run_mix_on(config(cc, timestamps, skew), 12, 2_000, 1, open);
        assert_verdict(cc, timestamps, skew, 1, outcome);
    }
}

#[test]
fn occ_with_skewed_clocks_is_serializable() {
    assert_serializable(ConcurrencyControl::Occ, TimestampScheme::Clock, SkewProfile::None);
    assert_serializable(ConcurrencyControl::Occ, TimestampScheme::Clock, SkewProfile::Ntp);
}

#[test]
fn occ_with_hybrid_clocks_is_serializable() {
    assert_serializable(ConcurrencyControl::Occ, TimestampScheme::Hlc, SkewProfile::Ptp);
}

#[test]
fn occ_with_dst_timestamps_is_serializable() {
    assert_serializable(ConcurrencyControl::Occ, TimestampScheme::Dst, SkewProfile::Ntp);
}

#[test]
fn two_phase_locking_is_serializable_under_every_scheme() {
    for scheme in [TimestampScheme::Clock, TimestampScheme::Hlc, TimestampScheme::Dst] {
        assert_serializable(ConcurrencyControl::TwoPhaseLocking, scheme, SkewProfile::Ntp);
    }
}

/// The checker is only worth something if it fails on a broken engine: skipping read
/// validation lets lost updates and write skew through, and the checker must find a cycle.
#[test]
fn the_checker_catches_an_engine_that_skips_read_validation() {
    let mut found = None;
    for seed in 0..20 {
        let mut broken = config(ConcurrencyControl::Occ, TimestampScheme::Clock, SkewProfile::None);
        broken.skip_read_validation = true;
        if let (_, Err(violation)) = run_mix(broken, 4, 2_000, seed) {
            found = Some(violation);
            break;
        }
    }
    match found {
        Some(Violation::Cycle { edges }) => {
            assert!(edges.len() >= 2);
            for pair in edges.windows(2) {
                assert_eq!(pair[0].to, pair[1].from, "edges form a path");
            }
            assert_eq!(edges.last().unwrap().to, edges[0].from, "the path closes");
        }
        other => panic!("expected a dependency cycle, got {other:?}"),
    }
}

/// Transfers between accounts with concurrent read-only audits of every account: a
/// committed audit must see the exact total (a torn snapshot would not).
fn transfers_keep_the_total(cc: ConcurrencyControl, timestamps: TimestampScheme) {
    const ACCOUNTS: u64 = 16;
    const INITIAL: u64 = 1_000;
    const AUDITS: u32 = 500;
    let (engine, _) = Engine::open(config(cc, timestamps, SkewProfile::Ptp)).unwrap();
    engine.load((0..ACCOUNTS).map(|i| (key(i), INITIAL.to_le_bytes().to_vec()))).unwrap();
    let balance = |v: Option<bytes::Bytes>| u64::from_le_bytes(v.unwrap().as_ref().try_into().unwrap());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || {
                let mut session = engine.session().unwrap();
                let mut rng = SmallRng::seed_from_u64(t as u64);
                let mut audits = 0;
                // The auditor runs until it has committed AUDITS audits: while the writers run
                // (how many then depends on thread timing), and after they stopped, when
                // nothing can abort it, so the count is guaranteed.
                if t == 0 {
                    while audits < AUDITS {
                        let mut txn = session.begin_read_only();
                        let mut total = 0;
                        let mut ok = true;
                        for i in 0..ACCOUNTS {
                            match txn.get(&key(i)) {
                                Ok(v) => total += balance(v),
                                Err(_) => ok = false,
                            }
                        }
                        if ok && txn.commit().is_ok() {
                            assert_eq!(total, ACCOUNTS * INITIAL, "a committed audit saw a torn snapshot");
                            audits += 1;
                        }
                    }
                    return audits;
                }
                for _ in 0..3_000 {
                    let (a, b) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
                    if a == b {
                        continue;
                    }
                    let mut txn = session.begin();
                    let (Ok(va), Ok(vb)) = (txn.get(&key(a)), txn.get(&key(b))) else { continue };
                    let (va, vb) = (balance(va), balance(vb));
                    let amount = rng.random_range(1..=10).min(va);
                    let _ = txn.put(&key(a), (va - amount).to_le_bytes().to_vec());
                    let _ = txn.put(&key(b), (vb + amount).to_le_bytes().to_vec());
                    let _ = txn.commit();
                }
                audits
            })
        })
        .collect();
    let audits: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(audits, AUDITS, "{cc}/{timestamps}");
    let mut session = engine.session().unwrap();
    let mut txn = session.begin_read_only();
    let total: u64 = (0..ACCOUNTS).map(|i| balance(txn.get(&key(i)).unwrap())).sum();
    assert_eq!(total, ACCOUNTS * INITIAL);
}

#[test]
fn read_only_audits_see_consistent_snapshots() {
    for cc in [ConcurrencyControl::Occ, ConcurrencyControl::TwoPhaseLocking] {
        for scheme in [TimestampScheme::Clock, TimestampScheme::Hlc, TimestampScheme::Dst] {
            transfers_keep_the_total(cc, scheme);
        }
    }
}

#[test]
fn aborts_say_why_and_leave_no_trace() {
    let (engine, _) = Engine::open(config(ConcurrencyControl::Occ, TimestampScheme::Clock, SkewProfile::None)).unwrap();
    engine.load([(key(1), b"v0".to_vec())].into_iter()).unwrap();
    let mut s1 = engine.session().unwrap();
    let mut s2 = engine.session().unwrap();
    // Lost update: both read k1, both write it; the second to commit aborts as stale.
    let mut t1 = s1.begin();
    let mut t2 = s2.begin();
    t1.get(&key(1)).unwrap();
    t2.get(&key(1)).unwrap();
    t1.put(&key(1), b"t1".to_vec()).unwrap();
    t2.put(&key(1), b"t2".to_vec()).unwrap();
    t1.commit().unwrap();
    let abort = t2.commit().unwrap_err();
    assert_eq!(abort.reason, AbortReason::ReadStale);
    assert_eq!(s2.stats().aborts_of(AbortReason::ReadStale), 1);
    let mut check = s2.begin_read_only();
    assert_eq!(check.get(&key(1)).unwrap().as_deref(), Some(&b"t1"[..]));
    drop(check);

    // Writes are invisible until commit and gone after abort.
    let mut t3 = s1.begin();
    t3.put(&key(2), b"x".to_vec()).unwrap();
    assert_eq!(t3.get(&key(2)).unwrap().as_deref(), Some(&b"x"[..]), "reads its own write");
    t3.abort();
    let mut check = s1.begin_read_only();
    assert_eq!(check.get(&key(2)).unwrap(), None);
    assert_eq!(check.put(&key(2), b"no".to_vec()).unwrap_err().reason, AbortReason::WriteInReadOnly);
}

#[test]
fn two_phase_locking_is_no_wait() {
    let (engine, _) =
        Engine::open(config(ConcurrencyControl::TwoPhaseLocking, TimestampScheme::Clock, SkewProfile::None)).unwrap();
    engine.load([(key(1), b"v0".to_vec())].into_iter()).unwrap();
    let mut s1 = engine.session().unwrap();
    let mut s2 = engine.session().unwrap();
    let mut t1 = s1.begin();
    t1.get(&key(1)).unwrap();
    let mut t2 = s2.begin();
    assert_eq!(t2.put(&key(1), b"x".to_vec()).unwrap_err().reason, AbortReason::LockConflict);
    drop(t2);
    let mut t3 = s2.begin();
    t3.get(&key(1)).unwrap();
    t3.commit().unwrap();
    t1.put(&key(1), b"t1".to_vec()).unwrap();
    t1.commit().unwrap();
    let mut t4 = s2.begin();
    assert_eq!(t4.get(&key(1)).unwrap().as_deref(), Some(&b"t1"[..]));
}

#[test]
fn garbage_collection_keeps_what_an_open_snapshot_reads() {
    let (engine, _) = Engine::open(config(ConcurrencyControl::Occ, TimestampScheme::Clock, SkewProfile::None)).unwrap();
    engine.load([(key(1), 0u64.to_le_bytes().to_vec())].into_iter()).unwrap();
    let mut reader = engine.session().unwrap();
    let mut writer = engine.session().unwrap();
    let mut snapshot = reader.begin_read_only();
    for n in 1..=2_000u64 {
        let mut txn = writer.begin();
        txn.put(&key(1), n.to_le_bytes().to_vec()).unwrap();
        txn.commit().unwrap();
    }
    engine.gc();
    assert_eq!(snapshot.get(&key(1)).unwrap().as_deref(), Some(&0u64.to_le_bytes()[..]));
    snapshot.commit().unwrap();
    drop(reader);
    // With the old snapshot gone, later passes drop the history down to what is readable.
    let mut txn = writer.begin();
    txn.put(&key(1), 9_999u64.to_le_bytes().to_vec()).unwrap();
    txn.commit().unwrap();
    engine.gc();
    let report = engine.store().report();
    assert_eq!(report.keys, 1);
    assert!(report.versions <= 2, "{} versions left", report.versions);
    assert!(report.versions_dropped > 0);
}

#[test]
fn a_transaction_may_rewrite_what_it_scanned_but_not_miss_an_insert() {
    for cc in [ConcurrencyControl::Occ, ConcurrencyControl::TwoPhaseLocking] {
        for scheme in [TimestampScheme::Clock, TimestampScheme::Hlc, TimestampScheme::Dst] {
            let (engine, _) = Engine::open(config(cc, scheme, SkewProfile::None)).unwrap();
            engine.load((0..10).map(|i| (key(i * 2), b"v".to_vec()))).unwrap();
            let mut session = engine.session().unwrap();
            let mut other = engine.session().unwrap();

            let mut txn = session.begin();
            let seen = txn.scan(Bound::Included(&key(0)), Bound::Unbounded, 5).unwrap();
            assert_eq!(seen.len(), 5);
            txn.put(&key(2), b"new".to_vec()).unwrap();
            txn.delete(&key(4)).unwrap();
            txn.put(&key(3), b"inserted".to_vec()).unwrap();
            txn.commit().unwrap_or_else(|a| panic!("{cc}/{scheme}: own writes in a scanned range: {a}"));

            // Someone else inserts into the range between the scan and the commit.
            let mut txn = session.begin();
            let seen = txn.scan(Bound::Included(&key(0)), Bound::Included(&key(8)), 100).unwrap();
            assert_eq!(seen.len(), 5, "{cc}/{scheme}: 0, 2, 3, 6, 8");
            txn.put(&key(100), b"x".to_vec()).unwrap();
            // A clock behind the scan's may need a retry (the insert must order after it).
            let inserted = (0..3).any(|_| {
                let mut insert = other.begin();
                insert.put(&key(5), b"phantom".to_vec()).unwrap();
                insert.commit().is_ok()
            });
            assert!(inserted, "{cc}/{scheme}: the insert never committed");
            let verdict = txn.commit().map(|_| ());
            assert_eq!(verdict.unwrap_err().reason, AbortReason::Phantom, "{cc}/{scheme}");
        }
    }
}
