//! End-to-end: a whole cluster in one process, over the in-process transport and over gRPC
//! on loopback. Every offered transfer commits, the chain passes the audit (re-executed from
//! genesis), and the storage nodes' logs assemble to the chain's final root.

use std::time::Duration;
use virga_node::audit::audit_cluster;
use virga_node::cluster::{up, Quiet, TransportKind, UpConfig};

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
}

async fn run_and_audit(mut config: UpConfig) {
    config.duration = Duration::from_secs(120);
    let dir = config.dir.clone();
    let report = up(config.clone(), &Quiet).await.unwrap();
    assert_eq!(report.committed as usize, report.offered, "every offered transfer commits: {report:#?}");
    assert_eq!(report.succeeded, report.committed, "no generated transfer fails: {report:#?}");
    assert!(report.blocks >= 2, "{report:#?}");
    assert!(report.witness_bytes_compact_per_tx < report.witness_bytes_full_per_tx, "{report:#?}");
    assert!(report.messages_per_tx > 0.0);
    let audit = audit_cluster(&dir, &pool(), &mut |_| {}).unwrap();
    assert_eq!(format!("{}", audit.chain.state_root), report.state_root);
    assert_eq!(audit.chain.head_number, report.head_number);
    assert_eq!(audit.chain.transactions, report.committed);
    assert_eq!(audit.storage_nodes, config.storage_nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_cluster_commits_everything_and_passes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.miners = 2;
    run_and_audit(config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_grpc_commits_everything_and_passes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.transport = TransportKind::Grpc;
    config.storage_nodes = 4;
    run_and_audit(config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_top_layer_still_commits_everything() {
    // Pruning after every block down to r = 1: witnesses compacted at c = 2 must carry
    // everything below, and revision must cope with the miner's newer upper nodes.
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.retention = 1;
    config.compaction = 2;
    config.top_budget_bytes = 0;
    run_and_audit(config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_two_replicas_per_shard_commits_everything_and_its_replicas_agree() {
    // The audit replays both replicas' logs of every shard and refuses any disagreement.
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.storage_nodes = 8;
    config.replicas = 2;
    run_and_audit(config).await;
}
