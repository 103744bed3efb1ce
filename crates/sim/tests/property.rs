//! For any network and crash schedule, every call gets exactly one response.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proptest::prelude::*;
use virga_net::role::CallId;
use virga_sim::{Partition, SimConfig};

use crate::common::{call, check_one_response_per_call, entries, sim_with, Entry, Seen, MS};

const IDS: [&str; 4] = ["n0", "n1", "n2", "n3"];

#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    latency_min_us: u64,
    latency_spread_us: u64,
    drop: f64,
    duplicate: f64,
    partition: Option<(u64, u64, usize)>,
    calls: Vec<(u64, usize, usize, u64)>,
    crashes: Vec<(u64, usize, u64)>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        any::<u64>(),
        0..2_000u64,
        0..3_000u64,
        prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64],
        prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64],
        proptest::option::of((0..30u64, 1..30u64, 1..4usize)),
        proptest::collection::vec((0..40u64, 0..4usize, 0..5usize, 1..10u64), 0..40),
        proptest::collection::vec((0..40u64, 0..4usize, 0..10u64), 0..4),
    )
        .prop_map(|(seed, latency_min_us, latency_spread_us, drop, duplicate, partition, calls, crashes)| {
            Scenario { seed, latency_min_us, latency_spread_us, drop, duplicate, partition, calls, crashes }
        })
}

fn run(scenario: &Scenario) -> (Vec<Entry>, HashMap<String, u32>) {
    let mut config = SimConfig { seed: scenario.seed, ..SimConfig::default() };
    config.net.latency_min = Duration::from_micros(scenario.latency_min_us);
    config.net.latency_max = Duration::from_micros(scenario.latency_min_us + scenario.latency_spread_us);
    config.net.drop_probability = scenario.drop;
    config.net.duplicate_probability = scenario.duplicate;
    if let Some((start, length, split)) = scenario.partition {
        config.net.partitions = vec![Partition {
            start_ns: start * MS,
            end_ns: (start + length) * MS,
            side_a: IDS[..split].iter().map(|id| id.to_string()).collect(),
            side_b: IDS[split..].iter().map(|id| id.to_string()).collect(),
        }];
    }
    let (mut sim, log) = sim_with(config, &IDS);
    let crashes = Rc::new(RefCell::new(HashMap::new()));
    let counted = Rc::clone(&crashes);
    sim.set_on_crash(move |node, _| *counted.borrow_mut().entry(node.to_string()).or_insert(0) += 1);
    for &(at, from, to, deadline) in &scenario.calls {
        // Index 4 names a node that does not exist.
        let to = IDS.get(to).copied().unwrap_or("ghost");
        sim.input_at(at * MS, IDS[from], call(to, deadline)).unwrap();
    }
    for &(at, node, down_for) in &scenario.crashes {
        sim.crash_at(at * MS, IDS[node]).unwrap();
        sim.restart_at((at + down_for) * MS, IDS[node]).unwrap();
    }
    sim.run_until(200 * MS);
    let crashes = crashes.borrow().clone();
    (entries(&log), crashes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_call_gets_exactly_one_response(scenario in scenario()) {
        let (log, crashes) = run(&scenario);
        // Incarnation k of a node crashed if the node crashed more than k times.
        let crashed = |node: &str, incarnation: u32| crashes.get(node).is_some_and(|count| *count > incarnation);
        check_one_response_per_call(&log, &crashed).map_err(TestCaseError::fail)?;
        // A node whose life was not cut short answered every call it made.
        if scenario.crashes.is_empty() {
            let made = log.iter().filter(|entry| matches!(entry.seen, Seen::Called(..))).count();
            let answered = log.iter().filter(|entry| matches!(entry.seen, Seen::Response { .. })).count();
            prop_assert_eq!(made, answered);
        }
    }
}

fn entry(node: &str, seen: Seen) -> Entry {
    Entry { node: node.to_string(), incarnation: 0, time: 0, seen }
}

#[test]
fn the_checker_catches_a_missing_and_a_second_response() {
    let called = entry("a", Seen::Called(CallId(0), "b".into()));
    let answered = entry("a", Seen::Response { call: CallId(0), result: Ok(crate::common::Answer::Pong(0)) });
    let never = |_: &str, _: u32| false;
    assert_eq!(check_one_response_per_call(&[called.clone(), answered.clone()], &never), Ok(1));
    assert!(check_one_response_per_call(std::slice::from_ref(&called), &never).is_err());
    assert!(check_one_response_per_call(&[called.clone(), answered.clone(), answered.clone()], &never).is_err());
    assert!(check_one_response_per_call(std::slice::from_ref(&answered), &never).is_err());
    // A crashed caller may go without, never with two.
    let always = |_: &str, _: u32| true;
    assert_eq!(check_one_response_per_call(std::slice::from_ref(&called), &always), Ok(1));
    assert!(check_one_response_per_call(&[called, answered.clone(), answered], &always).is_err());
}
