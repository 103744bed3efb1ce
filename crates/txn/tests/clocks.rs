//! The engine reads time only from the clocks it is given.

use std::sync::Arc;

use virga_core::clock::ManualClock;
use virga_txn::{DefaultStore, Engine, EngineConfig, SkewProfile, SkewedClocks, TimestampScheme};

#[test]
fn timestamps_come_from_the_injected_clock() {
    let time = ManualClock::new(5_000);
    let clocks = Arc::new(SkewedClocks::with_base(time.clone(), SkewProfile::None, 0));
    let (engine, _) = Engine::open_with(EngineConfig::default(), DefaultStore::default(), clocks).unwrap();
    let mut session = engine.session().unwrap();

    let mut txn = session.begin();
    assert_eq!(txn.begin_ts().time, 5_000);
    txn.put(b"k", b"v".to_vec()).unwrap();
    // The clock stood still, so the commit is the smallest time above the snapshot.
    assert_eq!(txn.commit().unwrap().ts.time, 5_001);

    time.set(1_000_000);
    let txn = session.begin_read_only();
    assert_eq!(txn.begin_ts().time, 1_000_000);
}

#[test]
fn a_skew_profile_offsets_each_client_from_the_shared_base() {
    let time = ManualClock::new(1_000_000_000_000);
    let clocks = Arc::new(SkewedClocks::with_base(time.clone(), SkewProfile::Ntp, 3));
    let config = EngineConfig { timestamps: TimestampScheme::Clock, ..EngineConfig::default() };
    let (engine, _) = Engine::open_with(config, DefaultStore::default(), clocks).unwrap();
    let mut a = engine.session().unwrap();
    let mut b = engine.session().unwrap();
    let (ta, tb) = (a.begin().begin_ts().time, b.begin().begin_ts().time);
    assert_ne!(ta, tb, "two clients with drawn NTP offsets read the same base differently");
    let bound = SkewProfile::Ntp.max_offset_ns() + SkewProfile::Ntp.max_jitter_ns();
    for t in [ta, tb] {
        assert!(t.abs_diff(time.get()) <= bound, "{t} is more than {bound} ns off the base");
    }
}
