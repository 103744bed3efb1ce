//! KAIROS's caching under the simulator: every lease rule keeps the history serializable and
//! the money conserved through the same faults as MILANA alone, stale cached reads abort,
//! and a primary that lets a stale cached read through is caught. With sharded validators
//! (which crash and restart in the faulty seeds) the same holds, and each weakened validator
//! is caught.

use virga_core::clock::SkewProfile;

use crate::client::ReadOnlyValidation;
use crate::kairos::CacheMode;
use crate::sim::txn::{run_txn, TxnRunOptions, TxnRunReport, Weakening};

fn run(options: &TxnRunOptions) -> TxnRunReport {
    match run_txn(options) {
        Ok(report) => report,
        Err(error) => panic!("seed {} did not start: {error}", options.seed),
    }
}

fn check(options: &TxnRunOptions) -> TxnRunReport {
    let report = run(options);
    assert!(report.passed(), "seed {}: {:?}\nreplay: {}", options.seed, report.violations, options.replay_command());
    report
}

#[test]
fn every_lease_rule_stays_serializable_through_faults_and_both_skews() {
    let modes = [CacheMode::Lease, CacheMode::Naive, CacheMode::Static(0.1), CacheMode::Ei];
    let (mut hits, mut stale) = (0, 0);
    for (index, mode) in modes.into_iter().enumerate() {
        for (offset, skew) in [SkewProfile::Ntp, SkewProfile::Ptp].into_iter().enumerate() {
            for seed in 0..3 {
                let seed = 1_000 + 100 * index as u64 + 10 * offset as u64 + seed;
                let options = TxnRunOptions { cache: mode, clock: skew, ..TxnRunOptions::new(seed) };
                assert!(options.replay_command().contains(&format!("--cache {}", mode.name())));
                let report = check(&options);
                hits += report.cache_hits;
                stale += report.stale_hits;
            }
        }
    }
    assert!(hits > 1_000, "the caches served {hits} reads");
    // Stale hits happen (the hot accounts are written all the time) and every one aborted:
    // had one committed, an audit would be off or the history would have a cycle.
    assert!(stale > 0, "no stale hit in {hits} hits");
}

#[test]
fn caching_with_remote_validation_and_all_session_clients_passes() {
    for seed in 1_500..1_502 {
        let options = TxnRunOptions {
            cache: CacheMode::Lease,
            read_only_validation: ReadOnlyValidation::Remote,
            session_clients: 3,
            ..TxnRunOptions::new(seed)
        };
        let report = check(&options);
        assert!(report.cache_hits > 0, "{report:?}");
    }
}

/// Without faults nothing is lost or unavailable: every program commits, except that under
/// contention on the hot accounts one may run out of attempts (seeds 3 and 10 of the first
/// twelve, one program of 180 each).
#[test]
fn without_faults_every_program_commits_and_the_cache_serves_reads() {
    for seed in 0..4 {
        let options = TxnRunOptions {
            faults: false,
            clock: SkewProfile::None,
            cache: CacheMode::Naive,
            ..TxnRunOptions::new(seed)
        };
        let report = check(&options);
        assert_eq!(report.committed + report.gave_up as u64, 180, "{report:?}");
        assert!(report.gave_up <= 1, "{report:?}");
        assert_eq!(report.session_unavailable + report.session_outcome_unknown, 0, "{report:?}");
        assert!(report.cache_hits * 4 > report.cache_reads, "{report:?}");
    }
}

#[test]
fn a_primary_that_skips_the_check_of_cached_reads_is_caught() {
    let weakening = Weakening { skip_cached_latest_committed: true, ..Weakening::default() };
    for mode in [CacheMode::Naive, CacheMode::Lease] {
        let caught = (0..6).find_map(|seed| {
            let report = run(&TxnRunOptions { weakening, cache: mode, ..TxnRunOptions::new(seed) });
            (!report.passed()).then_some(report.violations)
        });
        let violations = caught.unwrap_or_else(|| panic!("no seed caught a stale cached read under {}", mode.name()));
        assert!(
            violations.iter().any(|violation| violation.starts_with("money") || violation.contains("serializ")),
            "{violations:?}"
        );
    }
}

#[test]
fn cache_mode_names_round_trip_and_bad_ones_are_refused() {
    for mode in [CacheMode::None, CacheMode::Lease, CacheMode::Naive, CacheMode::Static(0.25), CacheMode::Ei] {
        assert_eq!(CacheMode::from_name(&mode.name()), Ok(mode));
    }
    for bad in ["lru", "static:", "static:0", "static:1", "static:x", "static:-0.5"] {
        let error = CacheMode::from_name(bad).unwrap_err().to_string();
        assert!(error.contains(bad) && error.contains("static:X"), "{error}");
    }
}

#[test]
fn read_only_transactions_validated_in_one_round_pass_every_check() {
    for (seed, cache) in [(1_600, CacheMode::None), (1_601, CacheMode::None), (1_602, CacheMode::Lease)] {
        let options =
            TxnRunOptions { read_only_validation: ReadOnlyValidation::Validate, cache, ..TxnRunOptions::new(seed) };
        assert!(options.replay_command().contains(" --validation validate"));
        let report = check(&options);
        assert!(report.committed_read_only > 0, "{report:?}");
    }
}

/// A transaction that reads and writes nothing has nothing to validate: it commits at once
/// wherever read-only transactions validate (it used to wait for votes that never came).
#[test]
fn an_empty_transaction_commits_whatever_the_validation() {
    use virga_net::role::{Event, Role};

    use crate::client::{ClientInput, Program, ProgramOutcome, TxnClient, TxnClientConfig};
    use crate::layout::{Partitioning, ShardMap};

    let nodes: Vec<String> = (0..3).map(|index| format!("n{index}")).collect();
    let map = ShardMap::place(&nodes, Partitioning::Hash { shards: 3 }, 1).unwrap();
    for validation in [ReadOnlyValidation::Local, ReadOnlyValidation::Remote, ReadOnlyValidation::Validate] {
        let mut config = TxnClientConfig::new(1, map.clone());
        config.read_only_validation = validation;
        let mut client = TxnClient::new(config);
        let mut out = Vec::new();
        client.step(1_000, Event::Input(ClientInput::Programs(vec![Program::Ops(Vec::new())])), &mut out);
        let outcomes: Vec<&ProgramOutcome> = client.results().iter().map(|result| &result.outcome).collect();
        assert!(matches!(outcomes.as_slice(), [ProgramOutcome::Committed { .. }]), "{validation:?}: {outcomes:?}");
    }
}

#[test]
fn sharded_validators_keep_every_lease_rule_serializable_through_crashes_and_both_skews() {
    let modes = [CacheMode::None, CacheMode::Lease, CacheMode::Naive, CacheMode::Static(0.1), CacheMode::Ei];
    let (mut crashes, mut votes, mut taken_over, mut passed_over, mut stale) = (0, 0, 0, 0, 0);
    for (index, mode) in modes.into_iter().enumerate() {
        for (offset, skew) in [SkewProfile::Ntp, SkewProfile::Ptp].into_iter().enumerate() {
            let seed = 2_000 + 10 * index as u64 + offset as u64;
            let validators = 2 + offset;
            let options = TxnRunOptions { cache: mode, clock: skew, validators, ..TxnRunOptions::new(seed) };
            assert!(options.replay_command().contains(&format!("--validators {validators}")));
            let report = check(&options);
            crashes += report.validator_crashes;
            votes += report.validator_votes;
            taken_over += report.validator_fallbacks;
            passed_over += report.validator_takeovers;
            stale += report.stale_hits;
        }
    }
    assert!(crashes >= 3, "{crashes} validator crashes");
    assert!(votes > 1_000 && taken_over > 0 && stale > 0, "{votes} votes, {taken_over} taken over, {stale} stale hits");
    assert!(passed_over > 0, "no read-write transaction was validated in a validator's place");
}

#[test]
fn without_faults_the_validators_judge_every_remote_validation_and_every_program_commits() {
    let options = TxnRunOptions {
        faults: false,
        clock: SkewProfile::None,
        cache: CacheMode::Naive,
        validators: 2,
        ..TxnRunOptions::new(4)
    };
    let report = check(&options);
    assert_eq!((report.committed, report.gave_up), (180, 0), "{report:?}");
    assert!(report.cache_hits > 0 && report.validator_votes > 100, "{report:?}");
    // Every release arrived. (Some read-only validations move to the primaries even so: the
    // simulator's validators keep their floor at most 50 ms behind, below which a copy's
    // freshness cannot be judged there.)
    assert_eq!(report.validator_terminations, 0, "{report:?}");
    assert!(report.validator_fallbacks * 10 < report.validator_votes, "{report:?}");
}

#[test]
fn each_weakened_validator_is_caught() {
    for weakening in [
        Weakening { validator_skip_freshness: true, ..Weakening::default() },
        Weakening { validator_skip_cached_latest_committed: true, ..Weakening::default() },
    ] {
        let name = weakening.name().unwrap_or_default();
        assert_eq!(Weakening::from_name(name), Ok(weakening));
        let caught = (0..8).find_map(|seed| {
            let options =
                TxnRunOptions { weakening, cache: CacheMode::Naive, validators: 2, ..TxnRunOptions::new(seed) };
            let report = run(&options);
            (!report.passed()).then_some(report.violations)
        });
        let violations = caught.unwrap_or_else(|| panic!("no seed caught {name}"));
        assert!(
            violations.iter().any(|violation| violation.starts_with("money") || violation.contains("serializ")),
            "{violations:?}"
        );
    }
}

/// A primary that validates in a passed-over validator's place under the lease it granted
/// that validator lets a write land under a cached read the validator vouched for alone.
/// The seeds are the first four of seven in 10,000 where that shows (it takes a validator
/// alive but cut off from a client while that client writes a key the validator vouched for);
/// the same seeds pass unweakened. (A change to the protocol's timing moves them: find them
/// again with `virga sim dkv --seeds 10000 --validators 2 --cache naive --weaken
/// skip-validator-lease`.)
#[test]
fn a_primary_taking_over_under_the_validators_lease_is_caught() {
    let weakening = Weakening { skip_validator_lease: true, ..Weakening::default() };
    assert_eq!(Weakening::from_name("skip-validator-lease"), Ok(weakening));
    for seed in [991, 1890, 4324, 4416] {
        let honest = TxnRunOptions { cache: CacheMode::Naive, validators: 2, ..TxnRunOptions::new(seed) };
        let report = check(&honest);
        assert!(report.validator_takeovers > 0, "{report:?}");
        let weakened = TxnRunOptions { weakening, ..honest };
        let report = run(&weakened);
        assert!(!report.passed(), "seed {seed}: {}", weakened.replay_command());
        assert!(report.violations.iter().any(|violation| violation.starts_with("money")), "{:?}", report.violations);
    }
}
