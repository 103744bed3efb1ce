//! SEMEL/MILANA under the simulator: seeds with faults keep the history serializable and the
//! money conserved, runs replay exactly, and both weakened variants are caught.

use crate::sim::txn::{run_txn, TxnRunOptions, TxnRunReport, Weakening};

fn run(options: &TxnRunOptions) -> TxnRunReport {
    match run_txn(options) {
        Ok(report) => report,
        Err(error) => panic!("seed {} did not start: {error}", options.seed),
    }
}

#[test]
fn transfers_and_audits_stay_serializable_through_loss_partitions_skew_and_backup_crashes() {
    let (mut committed, mut read_only, mut aborted, mut crashes) = (0, 0, 0, 0);
    for seed in 0..24 {
        let options = TxnRunOptions::new(seed);
        let report = run(&options);
        assert!(report.passed(), "seed {seed}: {:?}\nreplay: {}", report.violations, options.replay_command());
        assert_eq!(report.programs, 3 * options.programs, "seed {seed}: every program finished");
        committed += report.committed;
        read_only += report.committed_read_only;
        aborted += report.aborted_attempts;
        crashes += report.crashes;
    }
    // The runs did what they claim: mostly committed, read-only audits among them, conflicts
    // that aborted attempts, and backups that crashed.
    assert!(committed >= 24 * 170, "{committed} committed");
    assert!(read_only >= 24 * 40, "{read_only} read-only commits");
    assert!(aborted > 100, "{aborted} aborted attempts");
    assert!(crashes > 10, "{crashes} backup crashes");
}

#[test]
fn without_faults_or_skew_every_program_commits() {
    let options = TxnRunOptions { faults: false, clock: virga_core::clock::SkewProfile::None, ..TxnRunOptions::new(3) };
    let report = run(&options);
    assert!(report.passed(), "{:?}", report.violations);
    assert_eq!((report.committed, report.gave_up), (180, 0));
}

#[test]
fn a_seed_replays_exactly() {
    let first = run(&TxnRunOptions::new(5));
    let again = run(&TxnRunOptions::new(5));
    assert_eq!(
        (first.trace_digest, first.events, first.committed),
        (again.trace_digest, again.events, again.committed)
    );
    assert_ne!(first.trace_digest, run(&TxnRunOptions::new(6)).trace_digest);
}

fn caught(weakening: Weakening, seeds: std::ops::Range<u64>) -> Vec<(u64, Vec<String>)> {
    seeds
        .filter_map(|seed| {
            let report = run(&TxnRunOptions { weakening, ..TxnRunOptions::new(seed) });
            (!report.passed()).then_some((seed, report.violations))
        })
        .collect()
}

#[test]
fn read_only_transactions_that_skip_local_validation_are_caught() {
    let caught = caught(Weakening { skip_local_validation: true, ..Weakening::default() }, 0..6);
    assert!(!caught.is_empty(), "no seed caught read-only transactions skipping local validation");
    assert!(caught.iter().flat_map(|(_, v)| v).any(|violation| violation.starts_with("money: audit")), "{caught:?}");
}

#[test]
fn primaries_that_skip_the_latest_read_check_are_caught() {
    let caught = caught(Weakening { skip_latest_read: true, ..Weakening::default() }, 0..40);
    assert!(!caught.is_empty(), "no seed of 40 caught primaries skipping the latestRead check");
    assert!(caught.iter().flat_map(|(_, v)| v).any(|violation| violation.starts_with("serializability")), "{caught:?}");
}
