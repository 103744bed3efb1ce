//! A node under a cost model handles one event at a time.

use virga_net::role::{Event, IoId};
use virga_sim::{CostModel, RoleEvent, SimConfig};

use crate::common::{entries, sim_with, Do, Seen, TestCore, MS};

/// Inputs cost a millisecond each; a device operation costs its value in microseconds.
struct SlowInputs;

impl CostModel<TestCore> for SlowInputs {
    fn step_cost(&self, node: &str, event: &RoleEvent<TestCore>) -> u64 {
        match event {
            Event::Input(_) if node == "a" => MS,
            _ => 0,
        }
    }

    fn io_cost(&self, _node: &str, op: &u64) -> u64 {
        op * 1_000
    }
}

#[test]
fn a_busy_node_queues_events_until_it_is_free() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["a", "b"]);
    sim.set_cost_model(SlowInputs);
    for _ in 0..3 {
        sim.input_at(0, "a", Do::Io(0)).unwrap();
        sim.input_at(0, "b", Do::Io(0)).unwrap();
    }
    sim.run_until(10 * MS);
    let log = entries(&log);
    let times = |node: &str, wanted: fn(&Seen) -> bool| -> Vec<u64> {
        log.iter().filter(|entry| entry.node == node && wanted(&entry.seen)).map(|entry| entry.time).collect()
    };
    assert_eq!(times("a", |seen| *seen == Seen::Input), [0, MS, 2 * MS]);
    // Each completion was due 10 µs after its step ended, and waited for the node.
    assert_eq!(times("a", |seen| matches!(seen, Seen::IoDone(..))), [3 * MS, 3 * MS, 3 * MS + 10_000]);
    // b costs nothing: all at once.
    assert_eq!(times("b", |seen| *seen == Seen::Input), [0, 0, 0]);
    assert!(sim.stats().deferred >= 4);
}

#[test]
fn a_device_operation_takes_the_device_latency_plus_its_cost() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["b"]);
    sim.set_cost_model(SlowInputs);
    sim.input_at(MS, "b", Do::Io(25)).unwrap();
    sim.run_until(10 * MS);
    let done: Vec<_> = entries(&log).into_iter().filter(|entry| matches!(entry.seen, Seen::IoDone(..))).collect();
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].time, &done[0].seen), (MS + 10_000 + 25_000, &Seen::IoDone(IoId(0), 50)));
}

/// Every input costs a millisecond, on any node.
struct EveryInput;

impl CostModel<TestCore> for EveryInput {
    fn step_cost(&self, _node: &str, event: &RoleEvent<TestCore>) -> u64 {
        if matches!(event, Event::Input(_)) {
            MS
        } else {
            0
        }
    }
}

#[test]
fn nodes_on_one_machine_share_its_threads() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["a", "b", "c", "d"]);
    sim.set_cost_model(EveryInput);
    // a and b share a one-thread machine; c and d a two-thread one.
    sim.place("a", 0, 1).unwrap();
    sim.place("b", 0, 1).unwrap();
    sim.place("c", 1, 2).unwrap();
    sim.place("d", 1, 2).unwrap();
    for node in ["a", "b", "c", "d"] {
        sim.input_at(0, node, Do::Io(0)).unwrap();
        sim.input_at(0, node, Do::Io(0)).unwrap();
    }
    sim.run_until(10 * MS);
    let log = entries(&log);
    let inputs = |nodes: [&str; 2]| -> Vec<u64> {
        let mut times: Vec<u64> = log
            .iter()
            .filter(|entry| nodes.contains(&entry.node.as_str()) && entry.seen == Seen::Input)
            .map(|entry| entry.time)
            .collect();
        times.sort_unstable();
        times
    };
    assert_eq!(inputs(["a", "b"]), [0, MS, 2 * MS, 3 * MS], "one thread: one step at a time");
    assert_eq!(inputs(["c", "d"]), [0, 0, MS, MS], "two threads: two at a time");
    assert!(sim.place("nobody", 0, 1).is_err());
    assert!(sim.place("a", 2, 0).is_err());
}
