//! The configuration service under the simulator: seeds with faults pass every check, runs
//! replay exactly, and the broken variant is caught.

use crate::sim::{run_service, ServiceRunOptions, ServiceRunReport};

fn run(options: &ServiceRunOptions) -> ServiceRunReport {
    match run_service(options) {
        Ok(report) => report,
        Err(error) => panic!("seed {} did not start: {error}", options.seed),
    }
}

fn assert_passes(options: &ServiceRunOptions) -> ServiceRunReport {
    let report = run(options);
    assert!(
        report.passed(),
        "seed {} failed: {:?}\nreplay: {}",
        options.seed,
        report.violations,
        options.replay_command()
    );
    report
}

#[test]
fn three_replicas_pass_every_check_through_loss_partitions_crashes_and_power_failures() {
    let (mut elections, mut crashes, mut power_failures, mut applied) = (0, 0, 0, 0);
    let (mut compactions, mut installed) = (0, 0);
    for seed in 0..40 {
        let report = assert_passes(&ServiceRunOptions::new(seed));
        assert_eq!(report.answered, report.commands, "seed {seed}: every command is answered");
        compactions += report.compactions;
        installed += report.snapshots_installed;
        elections += report.elections;
        crashes += report.crashes;
        power_failures += report.power_failures;
        applied += report.applied_index;
    }
    // The seeds really exercised the faults: re-elections, crashes and power failures.
    assert!(elections > 40, "{elections} elections in 40 seeds");
    assert!(crashes > 20 && power_failures > 20, "{crashes} crashes and {power_failures} power failures");
    assert!(applied >= 40 * 24, "every seed applied at least its 24 commands ({applied} entries in all)");
    // The logs were compacted, and replicas left behind caught up from a leader's snapshot.
    assert!(compactions >= 40 * 3, "{compactions} compactions");
    assert!(installed > 0, "no replica installed a leader's snapshot");
}

#[test]
fn five_replicas_pass_every_check() {
    for seed in 1000..1020 {
        assert_passes(&ServiceRunOptions { replicas: 5, ..ServiceRunOptions::new(seed) });
    }
}

#[test]
fn without_faults_one_leader_serves_the_whole_run() {
    let report = assert_passes(&ServiceRunOptions { faults: false, ..ServiceRunOptions::new(7) });
    assert_eq!(report.elections, 1);
    assert_eq!(report.answered, 24);
}

#[test]
fn a_seed_replays_exactly_and_another_seed_differs() {
    let first = run(&ServiceRunOptions::new(11));
    let again = run(&ServiceRunOptions::new(11));
    let other = run(&ServiceRunOptions::new(12));
    assert_eq!(first.trace_digest, again.trace_digest);
    assert_eq!(
        (first.events, first.elections, first.applied_index),
        (again.events, again.elections, again.applied_index)
    );
    assert_ne!(first.trace_digest, other.trace_digest);
}

#[test]
fn acknowledging_before_the_log_write_is_durable_is_caught() {
    let caught: Vec<(u64, Vec<String>)> = (0..60)
        .filter_map(|seed| {
            let report = run(&ServiceRunOptions { unsafe_ack_before_write: true, ..ServiceRunOptions::new(seed) });
            (!report.passed()).then_some((seed, report.violations))
        })
        .collect();
    assert!(!caught.is_empty(), "no seed of 60 caught replicas that acknowledge before their writes are durable");
    // What the checks see: committed entries lost or replaced after a power failure.
    assert!(
        caught
            .iter()
            .flat_map(|(_, violations)| violations)
            .any(|violation| violation.starts_with("state-machine safety")),
        "{caught:?}"
    );
}

/// `--faults disk`: the same faults, and one replica that crashes meets a latent sector
/// error or misdirected writes; every check holds, and a replica whose log no longer opens
/// stays down while the other two serve.
#[test]
fn media_faults_on_a_crashing_replica_keep_every_check() {
    let (mut hit, mut unopened) = (0, 0);
    for seed in 0..30 {
        let report = assert_passes(&ServiceRunOptions { media_faults: true, ..ServiceRunOptions::new(seed) });
        assert!(report.media_fault.is_some(), "seed {seed} plants a media fault");
        assert!(report.unopened.len() <= 1, "seed {seed}: {:?}", report.unopened);
        assert_eq!(report.answered, report.commands, "seed {seed}: every command is answered");
        hit += u64::from(report.media_faults_fired > 0);
        unopened += report.unopened.len();
    }
    assert!(hit >= 10, "only {hit} of 30 seeds' media faults met a read or a write");
    assert!(unopened >= 3, "only {unopened} replicas of 30 seeds refused to open");
}

/// Seeds of `--faults disk --broken rejoin-empty` that the checks fail (found by running
/// seeds 0 to N; see docs/testing.md).
const CAUGHT_REJOINING_EMPTY: &[u64] = &[9, 14, 45];

/// The broken variant of disk faults: a replica whose log refuses to open starts over on
/// an empty disk, forgetting the votes and entries it acknowledged. The checks must see it.
#[test]
fn a_damaged_replica_that_rejoins_with_an_empty_log_is_caught() {
    let broken =
        |seed| ServiceRunOptions { media_faults: true, unsafe_rejoin_empty: true, ..ServiceRunOptions::new(seed) };
    let caught = CAUGHT_REJOINING_EMPTY.iter().filter(|seed| !run(&broken(**seed)).passed()).count();
    assert_eq!(caught, CAUGHT_REJOINING_EMPTY.len(), "seeds {CAUGHT_REJOINING_EMPTY:?} no longer catch it");
    let seed = CAUGHT_REJOINING_EMPTY[0];
    assert!(
        run(&ServiceRunOptions { media_faults: true, ..ServiceRunOptions::new(seed) }).passed(),
        "seed {seed} passes unbroken"
    );
}
