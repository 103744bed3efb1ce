//! RainBlock situations set up on purpose under the deterministic simulator: each test runs
//! one fixed scenario (a lying replica, a lying miner, crashes of chosen nodes, a partition,
//! a tiny top layer) rather than waiting for a seed to draw it, and asserts what the
//! wall-clock cluster tests these replaced asserted. Every run also passes the simulator's
//! own checks (chain verifies from genesis, storage shards equal a serial replay live and
//! after a crash, acknowledged blocks in place, followers' chains verify, every transfer
//! committed or refused); docs/testing.md maps each property to its test.

use std::time::Duration;
use virga_node::client::ClientCore;
use virga_node::miner::MinerCore;
use virga_node::sim::{
    replay_command, run_scenario, Crash, Faults, Finished, Length, RunOptions, Scenario, Schedule, TopLayer,
};
use virga_node::storage::StorageCore;

const SEED: u64 = 3;

fn run(scenario: Scenario) -> Finished {
    let options = RunOptions { seed: SEED, faults: Faults::NONE, length: Length::Short, broken: None };
    let finished = run_scenario(options, &scenario).unwrap_or_else(|outcome| panic!("{outcome:#?}"));
    let outcome = &finished.outcome;
    assert!(
        outcome.problems.is_empty(),
        "{scenario:#?} failed (seed {}; the random schedule's replay: {}): {:#?}",
        outcome.seed,
        replay_command(outcome.seed, "none", Length::Short),
        outcome.problems
    );
    assert_eq!(outcome.committed, outcome.offered, "every offered transfer commits: {outcome:#?}");
    finished
}

fn with(schedule: Schedule) -> Scenario {
    Scenario { schedule: Some(schedule), ..Scenario::default() }
}

fn storage(finished: &Finished, id: &str) -> virga_node::storage::StorageStats {
    match finished.sim.core(id).and_then(|node| node.role::<StorageCore>()) {
        Some(core) => core.stats(),
        _ => panic!("{id} is not an up storage node"),
    }
}

fn miner(finished: &Finished, id: &str) -> (virga_node::miner::MinerStats, (u64, alloy_primitives::B256)) {
    match finished.sim.core(id).and_then(|node| node.role::<MinerCore>()) {
        Some(core) => {
            let (number, hash, _) = core.head();
            (core.stats(), (number, hash))
        }
        _ => panic!("{id} is not an up miner"),
    }
}

fn clients(finished: &Finished) -> Vec<virga_node::client::ClientStats> {
    ["client-0", "client-1"]
        .iter()
        .map(|id| match finished.sim.core(id).and_then(|node| node.role::<ClientCore>()) {
            Some(core) => core.stats(),
            _ => panic!("{id} is not an up client"),
        })
        .collect()
}

fn storage_ids(finished: &Finished) -> Vec<String> {
    let mut ids: Vec<String> =
        finished.sim.node_ids().filter(|id| id.starts_with("storage-")).map(String::from).collect();
    ids.sort();
    ids
}

/// One replica of each of its shards, storage-0, lies about its witnesses for the whole
/// fault phase; its partners do not.
#[cfg(feature = "fault-injection")]
fn a_lying_replica_is_named_and_bypassed(corrupt: bool) {
    use virga_node::client::WitnessError;

    let schedule = Schedule { lying_storage: Some(("storage-0".to_string(), corrupt)), ..Schedule::calm() };
    let finished = run(with(schedule));
    let clients = clients(&finished);
    let committed: u64 = clients.iter().map(|stats| stats.committed).sum();
    let succeeded: u64 = clients.iter().map(|stats| stats.committed_ok).sum();
    assert_eq!(committed as usize, finished.outcome.offered, "{clients:#?}");
    assert_eq!(succeeded, committed, "no generated transfer fails: {clients:#?}");
    assert!(storage(&finished, "storage-0").witnesses_served > 0);
    let refused: Vec<&(String, WitnessError)> = clients.iter().flat_map(|stats| &stats.bad_witnesses).collect();
    assert!(!refused.is_empty(), "corrupt={corrupt}: no witness was refused: {clients:#?}");
    for (peer, reason) in &refused {
        assert_eq!(peer, "storage-0", "corrupt={corrupt}: an honest node's witness was refused: {reason}");
        assert!(matches!(reason, WitnessError::DoesNotVerify { .. }), "corrupt={corrupt}: {reason}");
    }
    // Every refused witness was fetched again from the other replica: no batch gave up.
    for stats in &clients {
        assert!(!stats.retried.contains_key("bad_witness"), "corrupt={corrupt}: {:#?}", stats.retried);
    }
}

#[cfg(feature = "fault-injection")]
#[test]
fn corrupt_witnesses_from_one_replica_are_refused_and_fetched_from_another() {
    a_lying_replica_is_named_and_bypassed(true);
}

#[cfg(feature = "fault-injection")]
#[test]
fn stale_witnesses_from_one_replica_are_refused_and_fetched_from_another() {
    a_lying_replica_is_named_and_bypassed(false);
}

/// The producer announces blocks with a wrong state root for its first 800 ms: every
/// storage node and the follower refuse them, the producer records who refused and why,
/// and once honest again the refused transfers are resubmitted and everything commits.
#[cfg(feature = "fault-injection")]
#[test]
fn blocks_with_a_wrong_root_are_refused_and_the_honest_miner_commits_again() {
    let lying = (Duration::ZERO, Duration::from_millis(800));
    let finished = run(with(Schedule { lying_miner: Some(lying), ..Schedule::calm() }));
    let (mined, producer_head) = miner(&finished, "miner-0");
    let (verified, follower_head) = miner(&finished, "miner-1");
    assert!(mined.abandoned_blocks > 0, "{mined:#?}");
    let mut refusers = storage_ids(&finished);
    refusers.push("miner-1".to_string());
    for peer in &refusers {
        let reason = mined
            .block_refusals
            .iter()
            .find(|(refuser, _)| refuser == peer)
            .map(|(_, reason)| reason)
            .unwrap_or_else(|| panic!("no refusal recorded from {peer}: {mined:#?}"));
        assert!(reason.contains("state root"), "{peer}: {reason}");
    }
    assert!(verified.refused_blocks > 0, "{verified:#?}");

    let clients = clients(&finished);
    let resubmitted: u64 = clients.iter().filter_map(|stats| stats.retried.get(virga_node::miner::BLOCK_REFUSED)).sum();
    assert!(resubmitted > 0, "{clients:#?}");
    assert!(mined.blocks > 0);
    assert_eq!(verified.verified_blocks, mined.blocks, "the follower verified every committed block");
    assert_eq!(follower_head, producer_head, "the follower is on the committed chain");
    for id in storage_ids(&finished) {
        let stats = storage(&finished, &id);
        assert_eq!(stats.blocks_applied, mined.blocks, "{id}: {stats:?}");
        assert!(stats.blocks_rejected > 0, "{id}: {stats:?}");
    }
}

/// Pruning after every block down to one retained version, with witnesses compacted at
/// depth 2 and no top-layer budget: witnesses must carry everything below the cut, and
/// revision must cope with the miner's newer upper nodes.
#[test]
fn a_tiny_top_layer_still_commits_everything() {
    let top_layer = Some(TopLayer { retention: 1, compaction: 2, budget_bytes: 0 });
    let finished = run(Scenario { top_layer, ..Scenario::default() });
    let (mined, _) = miner(&finished, "miner-0");
    assert!(mined.blocks >= 2, "{mined:#?}");
    assert!(mined.prunes > 0, "the top layer was never pruned: {mined:#?}");
    let clients = clients(&finished);
    let (full, compact): (u64, u64) = clients.iter().fold((0, 0), |(full, compact), stats| {
        (full + stats.witness_bytes_full, compact + stats.witness_bytes_compact)
    });
    assert!(compact < full, "compaction saves witness bytes: {compact} of {full}");
}

/// With two replicas of every shard, each replica holds the same shard hashes at the head
/// (and, by the run's checks, the serial replay's).
#[test]
fn the_replicas_of_every_shard_agree_at_the_head() {
    let finished = run(Scenario::default());
    let (_, (_, head)) = miner(&finished, "miner-0");
    let mut holders: std::collections::BTreeMap<usize, Vec<(String, alloy_primitives::B256)>> = Default::default();
    for id in storage_ids(&finished) {
        let Some(core) = finished.sim.core(&id).and_then(|node| node.role::<StorageCore>()) else {
            panic!("{id} is down")
        };
        for (shard, hash) in core.shard_hashes(&head).unwrap_or_else(|| panic!("{id} lacks the head")) {
            holders.entry(shard).or_default().push((id.clone(), hash));
        }
    }
    assert_eq!(holders.len(), 16, "every shard is served: {holders:?}");
    for (shard, replicas) in &holders {
        assert_eq!(replicas.len(), 2, "shard {shard}: {replicas:?}");
        assert_eq!(replicas[0].1, replicas[1].1, "shard {shard}'s replicas disagree: {replicas:?}");
    }
}

/// A storage node crashes mid-run (once at a chosen time, once with a log write in flight)
/// and the producing miner crashes later; both come back from what their devices kept, the
/// miner's blocks wait for the storage node, and every transfer commits.
#[test]
fn a_storage_node_and_the_miner_crash_mid_run_and_every_transfer_still_commits() {
    let crash = |node: &str, at: u64, back: u64| Crash {
        node: node.to_string(),
        at: Duration::from_millis(at),
        back: Duration::from_millis(back),
    };
    let schedule = Schedule {
        crashes: vec![crash("storage-1", 500, 800), crash("miner-0", 1_300, 1_600)],
        write_crashes: vec![crash("storage-2", 900, 1_100)],
        ..Schedule::calm()
    };
    let finished = run(with(schedule));
    assert_eq!(finished.outcome.effects.crashes, 3, "{:#?}", finished.outcome);
    let (mined, _) = miner(&finished, "miner-0");
    // Blocks before the crash, and the restarted miner's own after it, on the chain it reopened.
    assert!(mined.blocks > 0 && finished.outcome.blocks > mined.blocks, "{mined:#?}");
}

/// A storage node cut from every other node for 1.2 s catches up once the partition heals:
/// the run's checks find it at the chain's head with the serial replay's shards.
#[test]
fn a_partitioned_storage_node_catches_up_after_healing() {
    let schedule = Schedule {
        partitions: vec![(Duration::from_millis(300), Duration::from_millis(1_500), "storage-3".to_string())],
        ..Schedule::calm()
    };
    let finished = run(with(schedule));
    assert!(finished.outcome.effects.cut > 0, "the partition cut no message: {:#?}", finished.outcome);
    let (mined, _) = miner(&finished, "miner-0");
    assert_eq!(storage(&finished, "storage-3").blocks_applied, mined.blocks);
}
