//! The same seed replays the same run; another seed makes another one.

use std::time::Duration;

use virga_core::clock::SkewProfile;
use virga_sim::{SimConfig, Stats, Traffic};

use crate::common::{call, entries, sim_with, Do, Entry, MS};

/// Four nodes calling each other over a lossy, duplicating, reordering network, with
/// timers, device operations and a crash; what the run did.
/// What a run did: digest, counters, traffic, events per node, and every core's log.
type Outcome = (u64, Stats, Vec<(String, String, &'static str, Traffic)>, Vec<u64>, Vec<Entry>);

fn run(seed: u64) -> Outcome {
    let mut config = SimConfig { seed, clock_profile: SkewProfile::Ntp, ..SimConfig::default() };
    config.net.latency_min = Duration::from_micros(100);
    config.net.latency_max = Duration::from_millis(3);
    config.net.drop_probability = 0.1;
    config.net.duplicate_probability = 0.1;
    let ids = ["a", "b", "c", "d"];
    let (mut sim, log) = sim_with(config, &ids);
    for round in 0..50u64 {
        for (index, from) in ids.iter().enumerate() {
            let to = ids[(index + 1 + round as usize) % ids.len()];
            sim.input_at(round * MS, from, call(to, 5)).unwrap();
        }
        sim.input_at(round * MS, "a", Do::Timer(Duration::from_micros(round * 37))).unwrap();
        sim.input_at(round * MS, "b", Do::Io(round)).unwrap();
    }
    sim.crash_at(20 * MS, "c").unwrap();
    sim.restart_at(30 * MS, "c").unwrap();
    sim.run_until(200 * MS);
    let traffic = sim
        .traffic()
        .into_iter()
        .map(|(from, to, kind, traffic)| (from.to_string(), to.to_string(), kind, traffic))
        .collect();
    let per_node = ids.iter().map(|id| sim.events_of(id).unwrap()).collect();
    (sim.trace_digest(), sim.stats().clone(), traffic, per_node, entries(&log))
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let first = run(42);
    let second = run(42);
    assert_eq!(first, second);
    // The run exercised what it claims to.
    let stats = &first.1;
    assert!(stats.dropped > 0 && stats.duplicated > 0 && stats.deadlines_exceeded > 0, "{stats:?}");
    assert_eq!((stats.crashes, stats.restarts), (1, 1));
    assert_eq!(first.3.iter().sum::<u64>(), stats.events);
}

#[test]
fn another_seed_gives_another_run() {
    let runs: Vec<_> = (0..4).map(run).collect();
    for (index, one) in runs.iter().enumerate() {
        for other in &runs[index + 1..] {
            assert_ne!(one.0, other.0, "two seeds gave the same trace digest");
        }
    }
}
