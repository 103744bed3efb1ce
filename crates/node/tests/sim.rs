//! RainBlock under the deterministic simulator: short seeds with every fault must pass all
//! checks, the same seed must replay exactly, and each deliberately broken variant must be
//! caught within the default seeds. (`virga sim rainblock --seeds N` runs full-length ones.)

use virga_node::sim::{replay_command, run_seed, Broken, Faults, Length, RunOptions, RunOutcome};

fn run(seed: u64, faults: Faults, broken: Option<Broken>) -> RunOutcome {
    run_seed(RunOptions { seed, faults, length: Length::Short, broken })
}

fn assert_passes(outcome: &RunOutcome, faults: &str) {
    assert!(
        outcome.problems.is_empty(),
        "seed {} failed ({}): {:#?}",
        outcome.seed,
        replay_command(outcome.seed, faults, Length::Short),
        outcome.problems
    );
}

#[test]
fn a_seed_without_faults_commits_everything_and_passes_every_check() {
    let outcome = run(1, Faults::NONE, None);
    assert_passes(&outcome, "none");
    assert_eq!(outcome.committed, outcome.offered, "{outcome:#?}");
    assert!(outcome.blocks >= 2, "{outcome:#?}");
}

#[test]
fn short_seeds_with_every_fault_pass_every_check() {
    for seed in 0..8 {
        let outcome = run(seed, Faults::ALL, None);
        assert_passes(&outcome, "all");
        assert!(outcome.committed > 0, "{outcome:#?}");
    }
}

#[test]
fn the_same_seed_replays_the_same_run_and_another_seed_does_not() {
    let first = run(11, Faults::ALL, None);
    let again = run(11, Faults::ALL, None);
    let other = run(12, Faults::ALL, None);
    assert_eq!(first.trace_digest, again.trace_digest);
    assert_eq!((first.events, first.virtual_ms, first.committed), (again.events, again.virtual_ms, again.committed));
    assert_ne!(first.trace_digest, other.trace_digest);
}

/// The problems of the first default seed that catches a broken variant (none: not caught).
fn caught(faults: Faults, broken: Broken) -> Vec<String> {
    (0..8)
        .map(|seed| run(seed, faults, Some(broken)).problems)
        .find(|problems| !problems.is_empty())
        .unwrap_or_default()
}

#[test]
fn a_follower_that_adopts_blocks_without_executing_them_is_caught() {
    let faults = Faults { lying_miner: true, ..Faults::NONE };
    let problems = caught(faults, Broken::MinerSkipsBlockCheck);
    assert!(problems.iter().any(|p| p.contains("miner-1 accepted block")), "{problems:#?}");
}

#[test]
fn a_storage_node_that_acknowledges_before_logging_is_caught() {
    let faults = Faults { crashes: true, ..Faults::NONE };
    let problems = caught(faults, Broken::StorageAcksBeforeLog);
    assert!(
        problems.iter().any(|p| p.contains("a block acknowledged to the miner was not durable")),
        "no seed caught the storage node that acknowledges before logging: {problems:#?}"
    );
}
