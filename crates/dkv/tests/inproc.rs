//! The configuration service embedded in one process: three replicas on files under the
//! tokio driver, talking through the in-process transport.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use virga_dkv::{ConfigCommand, ConfigState, ShardId};
use virga_net::InProc;

use crate::deploy::{
    agreed_leader, assert_all_applied, converged, layout_changes, peers, start_replica, wait_for, Client, Replica,
};

fn start_all(dir: &Path, inproc: &Arc<InProc>) -> Vec<Replica> {
    peers()
        .into_iter()
        .map(|(id, _)| start_replica(dir, id, Arc::clone(inproc) as _, |name, host| inproc.register_host(name, host)))
        .collect()
}

async fn stop_all(replicas: Vec<Replica>, inproc: &InProc) {
    for replica in replicas {
        inproc.unregister(&replica.name);
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_apply_on_every_replica_and_replay_from_their_logs_after_a_restart() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let inproc = InProc::new();
    let replicas = start_all(dir.path(), &inproc);
    let all: Vec<&Replica> = replicas.iter().collect();
    wait_for("a leader all replicas know", || agreed_leader(&all)).await;

    let client = Client::start("admin-0", Arc::clone(&inproc) as _);
    let (commands, expected) = layout_changes();
    client.propose(commands.clone());
    let outcomes = client.outcomes(commands.len()).await;
    assert_all_applied(&outcomes, &commands);
    let last = outcomes.last().unwrap().index;
    let (state, history) = wait_for("every replica applies the same entries", || converged(&all, last)).await;
    assert_eq!(state.map(), expected.map(), "the replicas' map is the oracle's");
    client.stop().await;
    stop_all(replicas, &inproc).await;
    // Read offline (as an audit does), each stopped replica's log holds the same committed
    // configuration.
    for (_, name) in peers() {
        let offline = virga_dkv::service::read_committed_state(dir.path().join(&name)).unwrap();
        assert_eq!(offline.map(), expected.map(), "{name}'s log, read offline");
    }

    // The same directories: each replica replays its records, the committed entries apply
    // again in the same order (the same hash chain), and a new leader commits its own entry
    // on top.
    let replicas = start_all(dir.path(), &inproc);
    let all: Vec<&Replica> = replicas.iter().collect();
    wait_for("a leader after the restart", || agreed_leader(&all)).await;
    let (again, replayed) = wait_for("the replicas reapply their logs", || converged(&all, last + 1)).await;
    assert_eq!(again.map(), expected.map());
    assert_eq!(replayed[..history.len()], history[..], "the applied entries replay exactly");
    stop_all(replicas, &inproc).await;
    eprintln!("in process, apply and restart: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_of_three_still_commit_once_the_leader_is_stopped() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let inproc = InProc::new();
    let mut replicas = start_all(dir.path(), &inproc);
    let all: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for("a leader", || agreed_leader(&all)).await;
    let client = Client::start("admin-0", Arc::clone(&inproc) as _);
    let (commands, _) = layout_changes();
    let mut expected = ConfigState::new();
    expected.apply(1, &commands[0]).unwrap();
    client.propose(commands[..1].to_vec());
    client.outcomes(1).await;

    // Stopping the leader's driver and taking it off the transport: its peers see calls fail
    // as they would against a crashed process.
    let position = replicas.iter().position(|replica| replica.id == leader).unwrap();
    let stopped = replicas.remove(position);
    inproc.unregister(&stopped.name);
    stopped.stop().await;

    let survivors: Vec<&Replica> = replicas.iter().collect();
    let new_leader = wait_for("a new leader among the two left", || agreed_leader(&survivors)).await;
    assert_ne!(new_leader, leader);
    let group = expected.map().unwrap().group(ShardId(3)).unwrap().clone();
    let failover =
        ConfigCommand::Failover { shard: ShardId(3), epoch: group.epoch, new_primary: group.backups[1].clone() };
    expected.apply(2, &failover).unwrap();
    client.propose(vec![failover.clone()]);
    let outcomes = client.outcomes(2).await;
    assert_all_applied(&outcomes, &[commands[0].clone(), failover]);
    let (state, _) = wait_for("both survivors apply it", || converged(&survivors, outcomes[1].index)).await;
    assert_eq!(state.map(), expected.map());
    assert!(!state.map().unwrap().group(ShardId(3)).unwrap().contains(&group.primary));
    client.stop().await;
    stop_all(replicas, &inproc).await;
    eprintln!("in process, a replica stopped: {:?}", started.elapsed());
}
