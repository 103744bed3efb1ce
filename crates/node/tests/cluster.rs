//! End-to-end with the real drivers: a whole cluster in one process over gRPC on loopback
//! (every offered transfer commits, the chain passes the audit, re-executed from genesis, and
//! the storage nodes' logs assemble to the chain's final root), and storage nodes reopened
//! from real checkpoint and log files left by an in-process run. What the protocol does under
//! faults, replicas and top-layer settings is checked under the simulator instead
//! (tests/scenarios.rs, tests/sim.rs; docs/testing.md maps each property to its test).

use std::sync::Arc;
use std::time::Duration;
use virga_node::audit::audit_cluster;
use virga_node::cluster::{up, Quiet, TransportKind, UpConfig};
use virga_node::storage::{BlockRefusal, LogAccess, StorageError, StorageNode};

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
}

async fn run_and_audit(mut config: UpConfig) -> virga_node::cluster::UpReport {
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
    assert_eq!(audit.storage_nodes, config.topology.storage_nodes);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_cluster_over_grpc_commits_everything_and_passes_the_audit() {
    // Two replicas of every shard: the audit replays both replicas' logs of each shard from
    // the files and refuses any disagreement.
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.transport = TransportKind::Grpc;
    config.topology.storage_nodes = 4;
    config.topology.replicas = 2;
    run_and_audit(config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_token_calls_commits_them_and_passes_the_audit() {
    // A third of the transactions call the ERC-20 token: clients pre-execute them and fetch
    // their slots, the miner sends the slot changes to the token's storage node, and the
    // audit replays every node's log (contract storage included) to the chain's root.
    let dir = tempfile::tempdir().unwrap();
    let mut config = UpConfig::small(dir.path());
    config.contracts = 0.3;
    config.topology.storage_nodes = 4;
    let report = run_and_audit(config).await;
    assert!(report.contract_calls > 400, "about 600 of 2,000 are token calls: {report:#?}");
    assert_eq!(report.contract_calls as f64 / report.run_seconds, report.contract_calls_per_sec);
}

/// A finished small run with 4 storage nodes: what reopening one of its nodes needs.
struct Ran {
    dir: tempfile::TempDir,
    config: UpConfig,
    genesis: virga_ledger::chain::ChainGenesis,
    sharded: virga_node::storage::ShardedState,
}

impl Ran {
    async fn new(max_block_transfers: usize) -> Ran {
        let dir = tempfile::tempdir().unwrap();
        let mut config = UpConfig::small(dir.path());
        config.topology.storage_nodes = 4;
        config.topology.max_block_transfers = max_block_transfers;
        run_and_audit(config.clone()).await;
        let genesis = virga_ledger::chain::read_genesis(dir.path()).unwrap();
        let sharded = virga_node::storage::shard_genesis(&genesis.state, config.topology.shards).unwrap();
        Ran { dir, config, genesis, sharded }
    }

    /// Storage node `index`: its id, shards and log directory in the run.
    fn node(&self, index: usize) -> (String, Vec<usize>, std::path::PathBuf) {
        let (id, served) =
            virga_node::cluster::storage_layout(self.config.topology.storage_nodes, self.config.topology.shards)
                .remove(index);
        let log = virga_node::storage::log_path(self.dir.path(), &id);
        (id, served, log)
    }

    /// Opens storage node `id` serving `served` on the log at `log`, used as `access` says.
    fn open(&self, id: &str, served: &[usize], access: LogAccess<'_>) -> Result<(Arc<StorageNode>, u64), String> {
        let genesis = &self.genesis;
        StorageNode::open_with(
            id,
            served.to_vec(),
            self.config.topology.shards,
            genesis.config,
            genesis.header.clone(),
            &self.sharded,
            access,
        )
        .map_err(|error| error.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_reopens_from_its_checkpoint_and_ignores_a_damaged_one() {
    use virga_node::storage::{log_options, CHECKPOINT_LAG};

    let ran = Ran::new(100).await;
    let (id, served, log) = ran.node(1);
    let open = || ran.open(&id, &served, LogAccess::Owned(&log, log_options())).unwrap();

    // Opened from genesis: every logged block applied (a checkpoint may exist already from
    // the run; remove it so this open is the baseline).
    let _ = std::fs::remove_file(virga_node::checkpoint::path_beside(&log));
    let (full, replayed_all) = open();
    let (head, head_hash, root) = full.head();
    assert!(head > CHECKPOINT_LAG + 2, "the run made {head} blocks");
    assert_eq!(replayed_all, head);
    let hashes = full.shard_hashes(&head_hash).unwrap();
    let base = full.checkpoint_now().unwrap();
    assert_eq!(base, head - CHECKPOINT_LAG);
    drop(full);

    // From the checkpoint: only the blocks after it are applied, to the same state.
    let (restored, replayed) = open();
    assert_eq!(restored.stats().opened_from_checkpoint, Some(base));
    assert_eq!(replayed, head - base);
    assert_eq!(restored.head(), (head, head_hash, root));
    assert_eq!(restored.shard_hashes(&head_hash).unwrap(), hashes);
    drop(restored);

    // A damaged checkpoint is refused (with a warning), set aside, and the previous one
    // used; with neither (here: the first checkpoint had none before it), the whole log.
    let path = virga_node::checkpoint::path_beside(&log);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let (fallback, replayed) = open();
    assert_eq!(fallback.stats().opened_from_checkpoint, None);
    assert_eq!(replayed, head);
    assert_eq!(fallback.head(), (head, head_hash, root));
    assert!(!path.exists() && path.with_file_name(virga_node::checkpoint::DAMAGED_FILE).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_log_is_cut_below_its_checkpoints_and_still_restarts_and_passes_the_audit() {
    use virga_node::storage::{decode_logged, log_options};

    // The run's blocks, fed again to a node with small log segments and frequent checkpoints
    // (written in the background, as in a run).
    let ran = Ran::new(60).await;
    let (id, served, run_log) = ran.node(2);
    let blocks: Vec<_> = virga_log::read_all(&run_log, log_options())
        .unwrap()
        .iter()
        .map(|record| decode_logged(record).unwrap())
        .collect();
    let copy = tempfile::tempdir().unwrap();
    let log = copy.path().join("updates");
    let options = virga_log::LogOptions { segment_bytes: 12 << 10, ..log_options() };
    let open = || ran.open(&id, &served, LogAccess::Owned(&log, options.clone()));
    let (node, _) = open().unwrap();
    node.set_checkpoint_interval(4);
    // A block before its parent is refused, the refusal typed.
    let early = node.apply_block(&blocks[1]).unwrap_err();
    assert!(matches!(early, StorageError::Refused(BlockRefusal::UnknownParent { number: 2, .. })), "{early:?}");
    for block in &blocks {
        node.apply_block(block).unwrap();
    }
    let newest = node.checkpoint_now().unwrap();
    let (head, head_hash, root) = node.head();
    assert!(head >= 24, "the run made {head} blocks");
    let stats = node.stats();
    assert!(stats.checkpoints_written >= 3, "{stats:?}");
    assert!(stats.log_segments_removed > 0, "{stats:?}");
    drop(node);
    let kept = virga_log::read_all(&log, log_options()).unwrap();
    assert!(kept[0].lsn > 1, "the log was cut");
    assert!(kept.len() < blocks.len());

    // Restarts from the newest checkpoint...
    let (restarted, replayed) = open().unwrap();
    assert_eq!(restarted.stats().opened_from_checkpoint, Some(newest));
    assert_eq!(replayed, head - newest);
    assert_eq!(restarted.head(), (head, head_hash, root));
    drop(restarted);

    // ...and the audit accepts the cut log in place of the run's.
    let node_dir = run_log.parent().unwrap();
    std::fs::remove_dir_all(node_dir).unwrap();
    copy_tree(copy.path(), node_dir);
    let audit = audit_cluster(ran.dir.path(), &pool(), &mut |_| {}).unwrap();
    // (The run's own nodes may have checkpointed too.)
    assert!(audit.from_checkpoints >= 1, "{audit:?}");
    assert_eq!(format!("{}", audit.chain.state_root), format!("{root}"));

    // A damaged newest checkpoint: the previous one, and the log kept from it, still reach
    // the same head.
    let newest_path = virga_node::checkpoint::path_beside(&log);
    std::fs::write(&newest_path, b"torn").unwrap();
    let (fallback, _) = open().unwrap();
    let previous = fallback.stats().opened_from_checkpoint.unwrap();
    assert!(previous < newest);
    assert_eq!(fallback.head(), (head, head_hash, root));
    drop(fallback);

    // With no sound checkpoint the cut log cannot be replayed: a clear error, not a wrong state.
    std::fs::write(virga_node::checkpoint::previous_of(&newest_path), b"torn").unwrap();
    let error = open().err().unwrap();
    assert!(error.contains("no checkpoint beside the log is sound"), "{error}");
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}
