use super::*;

fn run(options: &SimOptions) -> SimReport {
    run_seed(options).unwrap_or_else(|error| panic!("{}: {error}", options.replay_command()))
}

#[test]
fn the_fault_free_pipeline_answers_every_proposal_and_agrees_with_the_replay() {
    let report = run(&SimOptions { faults: false, ..SimOptions::new(1) });
    assert!(report.violations.is_empty(), "{:?}\nreplay: {}", report.violations, report.options.replay_command());
    assert_eq!(report.answered, 3 * 40, "{report:?}");
    assert_eq!(report.recoveries, 0);
    assert!(report.heights.values().all(|height| *height == report.ordered_blocks));
}

#[test]
fn a_seed_replays_exactly() {
    let first = run(&SimOptions::new(7));
    let second = run(&SimOptions::new(7));
    assert_eq!(first.trace_digest, second.trace_digest);
}

/// Seeds under every fault: lost and duplicated messages, a lagging organization, crashed
/// servers (orderer replicas among them, and the orderers' leader of the moment), and an organization that lies, is tampered with, or
/// both. The soak (`virga sim chainify --seeds 100000`) runs many more.
#[test]
fn seeds_under_faults_agree_with_the_serial_replay() {
    let (mut liars, mut tampers, mut crashes, mut recoveries, mut leader_crashes) = (0, 0, 0, 0, 0);
    for seed in 100..130 {
        let report = run(&SimOptions::new(seed));
        assert!(report.violations.is_empty(), "{:?}\nreplay: {}", report.violations, report.options.replay_command());
        liars += u64::from(report.faults.lies);
        tampers += u64::from(report.faults.tamper.is_some());
        crashes += report.faults.crashes.len();
        recoveries += report.recoveries;
        leader_crashes += usize::from(report.faults.leader_crash.is_some());
    }
    assert!(leader_crashes >= 3, "only {leader_crashes} seeds crashed the orderers' leader");
    assert!(liars >= 5 && tampers >= 5 && crashes >= 15, "the seeds drew too few faults: {liars} {tampers} {crashes}");
    assert!(recoveries > 0);
}

/// Commit servers that commit their own effects without the vote let a tampered
/// organization commit what the others never agreed to: the checks must see it.
#[test]
fn committing_without_the_vote_is_caught() {
    let caught = (0..16)
        .filter(|seed| {
            let options = SimOptions {
                weakening: Some(Weakening::CommitWithoutQuorum),
                force_tamper: true,
                ..SimOptions::new(*seed)
            };
            run(&options).violations.iter().any(|violation| matches!(violation, Violation::Safety(_)))
        })
        .count();
    assert!(caught >= 8, "only {caught} of 16 weakened seeds were caught");
}

/// The same seeds with every message crossing the wire encoding: the decoders take every
/// message the servers send, and the run is as checked.
#[test]
fn seeds_with_every_message_on_the_wire_agree_with_the_serial_replay() {
    for seed in 200..206 {
        let report = run(&SimOptions { wire: true, ..SimOptions::new(seed) });
        assert!(report.violations.is_empty(), "{:?}\nreplay: {}", report.violations, report.options.replay_command());
        assert!(report.answered > 0);
    }
}

/// `--faults disk`: every fault, and one orderer replica that crashes meets a latent sector
/// error or a misdirected write under its Raft log; every check holds, and a replica whose
/// log no longer opens stays down while the other two order.
#[test]
fn media_faults_on_an_orderer_replica_keep_every_check() {
    let (mut hit, mut unopened) = (0, 0);
    for seed in 300..320 {
        let report = run(&SimOptions { media_faults: true, ..SimOptions::new(seed) });
        assert!(report.violations.is_empty(), "{:?}\nreplay: {}", report.violations, report.options.replay_command());
        assert!(report.faults.media.is_some(), "seed {seed} plants a media fault");
        assert!(report.unopened.len() <= 1, "seed {seed}: {:?}", report.unopened);
        hit += u64::from(report.media_faults_fired > 0);
        unopened += report.unopened.len();
    }
    assert!(hit >= 5, "only {hit} of 20 seeds' media faults met a read or a write");
    assert!(unopened >= 1, "no orderer replica of 20 seeds refused to open");
}
