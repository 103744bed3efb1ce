//! Start, timers, device operations, deadlines, crashes and restarts, and the run bounds.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use virga_core::clock::Skew;
use virga_net::NetError;
use virga_sim::{SimConfig, SimError, Stop, EPOCH_BASE_NS};

use crate::common::{call, entries, fixed_latency, sim_with, Do, Doubler, Entry, Log, Seen, TestCore, MS};

fn seen_by(log: &[Entry], node: &str) -> Vec<(u32, u64, Seen)> {
    log.iter()
        .filter(|entry| entry.node == node)
        .map(|entry| (entry.incarnation, entry.time, entry.seen.clone()))
        .collect()
}

#[test]
fn a_deadline_fires_exactly_at_call_time_plus_deadline_when_the_callee_never_answers() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["a", "b"]);
    sim.core_mut("b").unwrap().answers = false;
    sim.input_at(1_234_567, "a", call("b", 7)).unwrap();
    sim.run_until(100 * MS);
    let seen = seen_by(&entries(&log), "a");
    let response = seen.iter().find(|(_, _, seen)| matches!(seen, Seen::Response { .. })).unwrap();
    assert_eq!(response.1, 1_234_567 + 7 * MS);
    assert!(
        matches!(&response.2, Seen::Response { result: Err(NetError::DeadlineExceeded { peer, .. }), .. } if peer == "b")
    );
}

#[test]
fn timers_and_device_operations_come_back_after_their_delays() {
    let config = SimConfig { device_latency: Duration::from_micros(30), ..SimConfig::default() };
    let (mut sim, log) = sim_with(config, &["a"]);
    sim.input_at(MS, "a", Do::Timer(Duration::from_millis(4))).unwrap();
    sim.input_at(MS, "a", Do::Io(21)).unwrap();
    sim.run_until(10 * MS);
    let seen = seen_by(&entries(&log), "a");
    assert!(seen.contains(&(0, 5 * MS, Seen::Timer(virga_net::role::TimerId(0)))));
    assert!(seen.contains(&(0, MS + 30_000, Seen::IoDone(virga_net::role::IoId(0), 42))));
    assert_eq!(seen[0], (0, 0, Seen::Start));
}

#[test]
fn a_crash_drops_pending_work_and_the_restarted_node_starts_from_start() {
    let (mut sim, log) = sim_with(fixed_latency(Duration::from_millis(1)), &["a", "b"]);
    let crashed = Rc::new(RefCell::new(Vec::new()));
    let hook_sees = Rc::clone(&crashed);
    sim.set_on_crash(move |node, _rng| hook_sees.borrow_mut().push(node.to_string()));
    // b arms a timer for 5 ms and starts a device operation and a call; it crashes at 2 ms.
    sim.input_at(MS, "b", Do::Timer(Duration::from_millis(4))).unwrap();
    sim.input_at(MS, "b", Do::Io(1)).unwrap();
    sim.core_mut("a").unwrap().answers = false;
    sim.input_at(MS + MS / 2, "b", call("a", 3)).unwrap();
    // a's call reaches b at 2.5 ms, while b is down: a sees its deadline.
    sim.input_at(MS + MS / 2, "a", call("b", 4)).unwrap();
    sim.crash_at(2 * MS, "b").unwrap();
    sim.restart_at(3 * MS, "b").unwrap();
    sim.input_at(2 * MS + 1, "b", Do::Timer(Duration::from_millis(1))).unwrap();
    sim.run_until(20 * MS);
    let seen = seen_by(&entries(&log), "b");
    let first_life: Vec<_> = seen.iter().filter(|(incarnation, ..)| *incarnation == 0).collect();
    assert!(first_life.iter().all(|(_, time, _)| *time < 2 * MS));
    assert!(first_life.iter().all(|(_, _, seen)| !matches!(seen, Seen::Timer(_) | Seen::Response { .. })));
    // The device completion at 1.01 ms came before the crash.
    assert!(first_life.iter().any(|(_, _, seen)| matches!(seen, Seen::IoDone(..))));
    let second_life: Vec<_> = seen.iter().filter(|(incarnation, ..)| *incarnation == 1).collect();
    assert_eq!(second_life.first().map(|(_, time, seen)| (*time, seen.clone())), Some((3 * MS, Seen::Start)));
    assert_eq!(second_life.len(), 1, "the input at 2 ms came while b was down: {second_life:?}");
    let a_seen = seen_by(&entries(&log), "a");
    assert!(a_seen.iter().any(|(_, time, seen)| *time == MS + MS / 2 + 4 * MS
        && matches!(seen, Seen::Response { result: Err(NetError::DeadlineExceeded { .. }), .. })));
    assert_eq!(*crashed.borrow(), vec!["b".to_string()]);
    let stats = sim.stats();
    assert_eq!((stats.crashes, stats.restarts, stats.inputs_lost), (1, 1, 1));
    assert_eq!(stats.stale_events, 1, "the timer of the first life");
    assert_eq!(stats.lost_to_crash, 1, "a's request, in flight to b when it crashed");
}

#[test]
fn immediate_crash_and_restart_check_the_node_state() {
    let (mut sim, _log) = sim_with(SimConfig::default(), &["a"]);
    assert_eq!(sim.restart("a"), Err(SimError::NodeUp("a".into())));
    sim.crash("a").unwrap();
    assert!(sim.core("a").is_none());
    assert_eq!(sim.is_up("a"), Some(false));
    assert_eq!(sim.crash("a"), Err(SimError::NodeDown("a".into())));
    sim.restart("a").unwrap();
    assert!(sim.core("a").is_some());
    assert_eq!(sim.crash("zed"), Err(SimError::UnknownNode("zed".into())));
    assert!(matches!(sim.input_at(0, "a", Do::Io(1)), Ok(())));
    sim.run_until(5 * MS);
    assert_eq!(sim.input_at(MS, "a", Do::Io(1)), Err(SimError::InPast { at: MS, now: 5 * MS }));
}

#[test]
fn a_restart_needs_a_factory() {
    let log = Log::default();
    let mut sim = virga_sim::Sim::new(SimConfig::default()).unwrap();
    sim.add_node("a", TestCore::new("a", 0, &log), Box::new(Doubler)).unwrap();
    assert_eq!(sim.restart_at(MS, "a"), Err(SimError::NoFactory("a".into())));
    sim.crash("a").unwrap();
    assert_eq!(sim.restart("a"), Err(SimError::NoFactory("a".into())));
    let again = sim.add_node("a", TestCore::new("a", 0, &log), Box::new(Doubler));
    assert_eq!(again, Err(SimError::DuplicateNode("a".into())));
}

#[test]
fn a_node_reads_its_own_skewed_clock() {
    let log = Log::default();
    let mut sim = virga_sim::Sim::new(SimConfig::default()).unwrap();
    let skew = Skew { offset_ns: 5_000, drift_ppm: 100.0, jitter_ns: 0 };
    sim.add_node_with_skew("a", TestCore::new("a", 0, &log), Box::new(Doubler), skew).unwrap();
    sim.input_at(10 * MS, "a", Do::Io(0)).unwrap();
    sim.run_until(20 * MS);
    let times: Vec<_> = entries(&log).iter().map(|entry| entry.time).collect();
    // 100 ppm of 10 ms is 1 µs.
    assert_eq!(times[..2], [5_000, 10 * MS + 5_000 + 1_000]);
    let wild = Skew { offset_ns: 0, drift_ppm: f64::INFINITY, jitter_ns: 0 };
    let refused = sim.add_node_with_skew("b", TestCore::new("b", 0, &log), Box::new(Doubler), wild);
    assert!(matches!(refused, Err(SimError::InvalidSkew { node, .. }) if node == "b"));
    assert_eq!(EPOCH_BASE_NS / 1_000_000_000 / 86_400 / 365, 53, "the epoch base is in 2023");
}

#[test]
fn the_run_bounds_stop_where_they_say() {
    let (mut sim, _log) = sim_with(SimConfig { max_events: Some(5), ..SimConfig::default() }, &["a", "b"]);
    for round in 0..10 {
        sim.input_at(round * MS, "a", call("b", 5)).unwrap();
    }
    assert_eq!(sim.run_until(100 * MS), Stop::MaxEvents);
    assert_eq!(sim.stats().events, 5);
    assert!(!sim.step_one());

    let (mut sim, _log) = sim_with(SimConfig::default(), &["a", "b"]);
    sim.input_at(MS, "a", call("b", 5)).unwrap();
    sim.input_at(MS, "a", Do::Timer(Duration::from_secs(100))).unwrap();
    assert_eq!(sim.run_until_quiet(u64::MAX), Stop::Quiet);
    // Quiet as soon as the call is answered: its deadline and the timer are all that is left.
    assert_eq!(sim.pending(), 2);
    assert!(sim.now() < 2 * MS);
    sim.input_at(sim.now() + MS, "a", call("b", 5)).unwrap();
    assert_eq!(sim.run_until_quiet(sim.now()), Stop::TimeLimit);
    let handled = sim.stats().events;
    assert_eq!(sim.run_while(u64::MAX, |sim| sim.stats().events < handled + 1), Stop::Predicate);
    assert_eq!(sim.stats().events, handled + 1);
}

#[test]
fn a_crashed_callers_calls_close_with_it() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["a", "b"]);
    sim.core_mut("b").unwrap().answers = false;
    sim.input_at(MS, "a", call("b", 50)).unwrap();
    sim.crash_at(2 * MS, "a").unwrap();
    // Nothing waits for the call any more: the run is quiet long before its deadline.
    assert_eq!(sim.run_until_quiet(u64::MAX), Stop::Quiet);
    assert_eq!(sim.now(), 2 * MS);
    sim.restart("a").unwrap();
    sim.run_until(100 * MS);
    let a_seen = seen_by(&entries(&log), "a");
    assert!(a_seen.iter().all(|(_, _, seen)| !matches!(seen, Seen::Response { .. })), "{a_seen:?}");
    assert_eq!(sim.stats().deadlines_exceeded, 0);
}
