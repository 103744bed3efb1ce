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
    // 15% of the users' transactions call the token; they all commit too.
    let (calls, committed_calls) = outcome.contract_calls;
    assert!(calls > 0 && committed_calls == calls, "{outcome:#?}");
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
    assert!(problems.iter().any(|p| p.contains("miner-1 accepted a block that does not verify")), "{problems:#?}");
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

#[test]
fn a_lying_storage_replica_is_bypassed_and_everything_commits() {
    let faults = Faults { lying_storage: true, ..Faults::NONE };
    let outcomes: Vec<RunOutcome> = (0..4).map(|seed| run(seed, faults, None)).collect();
    for outcome in &outcomes {
        assert_passes(outcome, "lying-storage");
        assert_eq!(outcome.committed, outcome.offered, "{outcome:#?}");
        // 15% of the users' transactions call the token; they all commit too.
        let (calls, committed_calls) = outcome.contract_calls;
        assert!(calls > 0 && committed_calls == calls, "{outcome:#?}");
    }
    let refused: u64 = outcomes.iter().map(|o| o.effects.bad_witnesses).sum();
    assert!(refused > 0, "no lying witness was ever refused: {outcomes:#?}");
}

#[test]
fn a_lying_miner_has_its_blocks_refused_and_commits_everything_once_honest() {
    let faults = Faults { lying_miner: true, ..Faults::NONE };
    let outcomes: Vec<RunOutcome> = (0..4).map(|seed| run(seed, faults, None)).collect();
    for outcome in &outcomes {
        assert_passes(outcome, "lying-miner");
        assert_eq!(outcome.committed, outcome.offered, "{outcome:#?}");
        // 15% of the users' transactions call the token; they all commit too.
        let (calls, committed_calls) = outcome.contract_calls;
        assert!(calls > 0 && committed_calls == calls, "{outcome:#?}");
    }
    let abandoned: u64 = outcomes.iter().map(|o| o.effects.abandoned_blocks).sum();
    assert!(abandoned > 0, "no lying block was ever refused: {outcomes:#?}");
}

#[test]
fn crashes_and_a_lossy_network_meet_the_protocol_and_it_still_settles() {
    let faults = Faults { network: true, crashes: true, ..Faults::NONE };
    let outcomes: Vec<RunOutcome> = (0..6).map(|seed| run(seed, faults, None)).collect();
    for outcome in &outcomes {
        assert_passes(outcome, "network,crashes");
    }
    let sum = |f: fn(&RunOutcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    assert!(sum(|o| o.effects.crashes) > 0 && sum(|o| o.effects.dropped) > 0, "{outcomes:#?}");
    assert!(sum(|o| o.effects.deadlines_exceeded) > 0, "no call ever timed out: {outcomes:#?}");
}

/// `disk`: every fault, and the follower miner meets a media fault as it crashes (a latent
/// sector error, or writes lost or misdirected); the checks hold, a follower whose chain
/// store refuses to open stays down, and the producer commits on without it.
#[test]
fn short_seeds_with_media_faults_on_the_follower_pass_every_check() {
    let faults = Faults { disk: true, ..Faults::ALL };
    let (mut hit, mut unopened) = (0, 0);
    for seed in 0..12 {
        let outcome = run(seed, faults, None);
        assert_passes(&outcome, "all,disk");
        assert!(outcome.media_fault.is_some(), "seed {seed} plants a media fault");
        assert!(outcome.committed > 0, "{outcome:#?}");
        hit += u64::from(outcome.media_faults_fired > 0);
        unopened += outcome.unopened.len();
    }
    assert!(hit >= 3, "only {hit} of 12 seeds' media faults met a read or a write");
    assert!(unopened >= 1, "no follower of 12 seeds refused to open");
}
