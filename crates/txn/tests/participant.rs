//! Commit as a two-phase-commit participant sees it: `prepare` votes and holds, `decide`
//! installs or releases, under every concurrency control and timestamp scheme.

use virga_txn::{
    AbortReason, ConcurrencyControl, Decision, Engine, EngineConfig, SkewProfile, Timestamp, TimestampScheme,
    VersionedStore, Vote,
};

fn configs() -> Vec<EngineConfig> {
    let mut out = Vec::new();
    for cc in [ConcurrencyControl::Occ, ConcurrencyControl::TwoPhaseLocking] {
        for timestamps in [TimestampScheme::Clock, TimestampScheme::Hlc, TimestampScheme::Dst] {
            out.push(EngineConfig { cc, timestamps, clock_skew: SkewProfile::None, ..EngineConfig::default() });
        }
    }
    out
}

fn label(config: &EngineConfig) -> String {
    format!("{}/{}", config.cc, config.timestamps)
}

#[test]
fn prepare_then_abort_leaves_no_trace_and_releases_the_keys() {
    for config in configs() {
        let name = label(&config);
        let (engine, _) = Engine::open(config).unwrap();
        engine.load([(b"a".to_vec(), b"a0".to_vec()), (b"c".to_vec(), b"c0".to_vec())].into_iter()).unwrap();
        let before = engine.store().report();
        let mut s1 = engine.session().unwrap();
        let mut s2 = engine.session().unwrap();

        // It reads `c` rather than `a`: a read raises `a`'s read timestamp, which a later
        // writer on another client's (hybrid) clock might not pass.
        let mut t1 = s1.begin();
        assert_eq!(t1.get(b"c").unwrap().as_deref(), Some(&b"c0"[..]));
        t1.put(b"a", b"a1".to_vec()).unwrap();
        t1.put(b"new", b"n1".to_vec()).unwrap();
        assert!(matches!(t1.prepare(), Vote::Commit { .. }), "{name}");
        let abort = t1.decide(Decision::Abort).unwrap_err();
        assert_eq!(abort.reason, AbortReason::Coordinator, "{name}");
        assert_eq!(s1.stats().aborts_of(AbortReason::Coordinator), 1, "{name}");

        // Nothing was installed...
        let after = engine.store().report();
        assert_eq!(after.versions, before.versions, "{name}: versions installed by an aborted transaction");
        assert_eq!(engine.store().get_at(b"a", Timestamp::MAX).as_deref(), Some(&b"a0"[..]), "{name}");
        assert_eq!(engine.store().get_at(b"new", Timestamp::MAX), None, "{name}");
        // ...and both keys are free again: another transaction writes them at once.
        let mut t2 = s2.begin();
        t2.put(b"a", b"a2".to_vec()).unwrap();
        t2.put(b"new", b"n2".to_vec()).unwrap();
        t2.commit().unwrap_or_else(|e| panic!("{name}: keys still held after abort: {e}"));
        let mut check = s1.begin_read_only();
        assert_eq!(check.get(b"a").unwrap().as_deref(), Some(&b"a2"[..]), "{name}");
        assert_eq!(check.get(b"new").unwrap().as_deref(), Some(&b"n2"[..]), "{name}");
    }
}

#[test]
fn prepare_then_commit_installs_at_the_voted_timestamp() {
    for config in configs() {
        let name = label(&config);
        let (engine, _) = Engine::open(config).unwrap();
        engine.load([(b"a".to_vec(), b"a0".to_vec())].into_iter()).unwrap();
        let mut session = engine.session().unwrap();

        let mut txn = session.begin();
        txn.get(b"a").unwrap();
        txn.put(b"a", b"a1".to_vec()).unwrap();
        let Vote::Commit { ts } = txn.prepare() else { panic!("{name}: a lone transaction voted no") };
        assert_eq!(txn.prepare(), Vote::Commit { ts }, "{name}: preparing again changes nothing");
        // Prepared is not installed.
        assert_eq!(engine.store().get_at(b"a", Timestamp::MAX).as_deref(), Some(&b"a0"[..]), "{name}");
        let info = txn.decide(Decision::Commit).unwrap();
        assert_eq!(info.ts, ts, "{name}");
        let store = engine.store();
        assert_eq!(store.get_at(b"a", ts).as_deref(), Some(&b"a1"[..]), "{name}");
        let just_before = Timestamp::new(ts.time - 1, u32::MAX);
        assert_eq!(store.get_at(b"a", just_before).as_deref(), Some(&b"a0"[..]), "{name}");
        assert_eq!(session.stats().commits, 1, "{name}");
    }
}

#[test]
fn a_transaction_conflicting_with_a_prepared_one_votes_no() {
    for config in configs() {
        let name = label(&config);
        let cc = config.cc;
        let (engine, _) = Engine::open(config).unwrap();
        engine.load([(b"a".to_vec(), b"a0".to_vec()), (b"b".to_vec(), b"b0".to_vec())].into_iter()).unwrap();
        let mut s1 = engine.session().unwrap();
        let mut s2 = engine.session().unwrap();
        let mut s3 = engine.session().unwrap();

        let mut holder = s1.begin();
        holder.put(b"a", b"a1".to_vec()).unwrap();
        assert!(matches!(holder.prepare(), Vote::Commit { .. }), "{name}");

        // A writer of the held key: 2PL refuses the lock at once, OCC votes no at prepare.
        let mut writer = s2.begin();
        let reason = match writer.put(b"a", b"x".to_vec()) {
            Err(abort) => abort.reason,
            Ok(()) => match writer.prepare() {
                Vote::Abort(reason) => reason,
                Vote::Commit { .. } => panic!("{name}: a writer of a prepared key voted yes"),
            },
        };
        let expected = if cc == ConcurrencyControl::TwoPhaseLocking {
            AbortReason::LockConflict
        } else {
            AbortReason::WritePrepared
        };
        assert_eq!(reason, expected, "{name}");
        // A no vote has already aborted: deciding commit cannot bring it back.
        assert_eq!(writer.decide(Decision::Commit).unwrap_err().reason, expected, "{name}");

        // A read-write reader of the held key cannot commit either.
        let mut reader = s3.begin();
        let outcome = match reader.get(b"a") {
            Err(abort) => Err(abort.reason),
            Ok(_) => {
                reader.put(b"b", b"b1".to_vec()).unwrap();
                match reader.prepare() {
                    Vote::Abort(reason) => Err(reason),
                    Vote::Commit { .. } => Ok(()),
                }
            }
        };
        let reason = outcome.expect_err(&format!("{name}: a reader of a prepared key voted yes"));
        assert!(
            matches!(reason, AbortReason::ReadPrepared | AbortReason::LockConflict),
            "{name}: reader aborted with {reason}"
        );
        drop(reader);

        // Once the holder commits, the key is free and holds its value. Hybrid clocks of
        // different clients are ordered only across milliseconds, so wait one out: every
        // clock is then past the holder's commit and the read timestamp the reader left.
        holder.decide(Decision::Commit).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut after = s2.begin();
        assert_eq!(after.get(b"a").unwrap().as_deref(), Some(&b"a1"[..]), "{name}");
        after.put(b"a", b"a2".to_vec()).unwrap();
        after.commit().unwrap_or_else(|e| panic!("{name}: key still held after commit: {e}"));
    }
}

#[test]
fn reads_and_writes_after_a_yes_vote_abort_the_transaction() {
    let (engine, _) = Engine::open(EngineConfig::default()).unwrap();
    let mut session = engine.session().unwrap();
    let mut txn = session.begin();
    txn.put(b"a", b"1".to_vec()).unwrap();
    assert!(matches!(txn.prepare(), Vote::Commit { .. }));
    assert!(txn.put(b"b", b"2".to_vec()).is_err());
    assert_eq!(txn.prepare(), Vote::Abort(AbortReason::User));
    drop(txn);
    let mut other = session.begin();
    other.put(b"a", b"3".to_vec()).unwrap();
    other.commit().expect("the aborted transaction released its key");
    assert_eq!(engine.store().get_at(b"b", Timestamp::MAX), None);
}
