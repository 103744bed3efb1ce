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
