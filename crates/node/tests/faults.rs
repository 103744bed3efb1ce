#![cfg(feature = "fault-injection")]
//! Trust tests (feature `fault-injection`): a storage node serving corrupt or stale
//! witnesses, and a miner announcing blocks with a wrong state root. Each lie is detected,
//! refused and recorded with the peer that told it and why, and the honest path keeps
//! committing: every offered transfer commits and the chain passes the cluster audit.
//!
//! The roles run in process (`InProc`), built here rather than through `cluster::up` so a
//! test can make one of them misbehave and watch the others' counters while it runs.

use alloy_primitives::U256;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use virga_ledger::chain::{genesis_json, read_genesis};
use virga_ledger::exec::ExecConfig;
use virga_net::driver::{Mailbox, Running as RunningRole};
use virga_net::role::NoIo;
use virga_net::{InProc, Rainblock, Transport};
use virga_node::audit::audit_cluster;
use virga_node::client::{ClientCore, ClientStats, WitnessError};
use virga_node::cluster::CLUSTER_FILE;
use virga_node::miner::{open_store, Miner, MinerFault, BLOCK_REFUSED};
use virga_node::storage::{shard_state, StorageFault, StorageNode};
use virga_node::topology::Topology;
use virga_node::workload::{client_of, sign_transfers, Accounts, Skew, GENESIS_BALANCE};

const ACCOUNTS: usize = 2_000;
const SHARDS: usize = 16;
const MAX_BLOCK_TRANSFERS: usize = 2_000;

struct Plan {
    storage_nodes: usize,
    replicas: usize,
    miners: usize,
    transfers: usize,
}

/// A cluster whose roles are all reachable from the test.
struct Running {
    storage: Vec<Arc<StorageNode>>,
    miners: Vec<Arc<Miner>>,
    clients: Vec<RunningRole<ClientCore>>,
    offered: usize,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    fn client_stats(&self) -> Vec<ClientStats> {
        self.clients.iter().map(|client| client.with_core(ClientCore::stats)).collect()
    }

    fn committed(&self) -> u64 {
        self.client_stats().iter().map(|stats| stats.committed).sum()
    }

    /// Polls `done` until it holds, failing the test with `what` after `limit`.
    async fn wait_for(&self, what: &str, limit: Duration, done: impl Fn(&Running) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < limit,
                "timed out waiting for {what}: {} of {} committed, miner {:#?}, storage {:#?}",
                self.committed(),
                self.offered,
                self.miners.iter().map(|miner| miner.stats()).collect::<Vec<_>>(),
                self.storage.iter().map(|node| node.stats()).collect::<Vec<_>>(),
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) -> Vec<ClientStats> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await.expect("a role's task panicked");
        }
        let mut stats = Vec::new();
        for client in self.clients {
            stats.push(client.join().await.lock().stats());
        }
        stats
    }
}

/// Writes a cluster directory (genesis, layout) in `dir`, opens every role on one `InProc`
/// transport, lets `configure` make some of them misbehave, warms the miners up and starts
/// miner-0 and two clients, which are handed every signed transfer at once.
async fn start(dir: &Path, plan: &Plan, configure: impl FnOnce(&[Arc<StorageNode>], &[Arc<Miner>])) -> Running {
    let accounts = Accounts::generate(ACCOUNTS, &|_| {});
    let chain_id = ExecConfig::default().chain_id;
    let gas_limit = 21_000 * MAX_BLOCK_TRANSFERS as u64;
    let json = genesis_json(chain_id, U256::from(16u64), gas_limit, &accounts.addresses, U256::from(GENESIS_BALANCE));
    std::fs::write(dir.join("genesis.json"), json).unwrap();
    let topology = Topology {
        accounts: ACCOUNTS,
        shards: SHARDS,
        storage_nodes: plan.storage_nodes,
        replicas: plan.replicas,
        miners: plan.miners,
        max_block_transfers: MAX_BLOCK_TRANSFERS,
        ..Topology::small()
    };
    let layout = topology.layout();
    let cluster = serde_json::json!({ "shards": SHARDS, "storage_nodes": layout, "miners": plan.miners });
    std::fs::write(dir.join(CLUSTER_FILE), cluster.to_string()).unwrap();
    let genesis = read_genesis(dir).unwrap();
    let sharded = shard_state(genesis.state.accounts().as_trie(), SHARDS).unwrap();
    let transfers = sign_transfers(&accounts, plan.transfers, chain_id, Skew::default(), 11, &|_| {});

    let inproc = InProc::new();
    let mut storage = Vec::new();
    for (id, shards) in &layout {
        let log = virga_node::storage::log_path(dir, id);
        let (node, _) = StorageNode::open(
            id.clone(),
            shards.clone(),
            SHARDS,
            genesis.config,
            genesis.header.clone(),
            &sharded,
            Some(&log),
        )
        .unwrap();
        inproc.register(id.clone(), node.clone());
        storage.push(node);
    }
    let miner_ids = topology.miner_ids();
    let mut miners = Vec::new();
    for (index, id) in miner_ids.iter().enumerate() {
        let store_dir = if index == 0 { dir.to_path_buf() } else { dir.join(id) };
        let (store, head) = open_store(&store_dir, &genesis.header).unwrap();
        let config = topology.miner_config(index, genesis.config);
        let miner = Miner::new(config, head, Some(store)).unwrap();
        inproc.register(id.clone(), miner.clone());
        miners.push(miner);
    }
    configure(&storage, &miners);
    let transport: Arc<dyn Transport<Rainblock>> = inproc;
    for miner in &miners {
        miner.warm_up(Arc::clone(&transport)).await.unwrap();
    }

    let (stop, stopped) = watch::channel(false);
    let tasks = vec![tokio::spawn(Arc::clone(&miners[0]).run(Arc::clone(&transport), stopped.clone()))];
    let mut clients = Vec::new();
    for index in 0..2 {
        let config = topology.client_config(index, genesis.config.exec);
        let id = config.id.clone();
        clients.push(Mailbox::new().run(id, ClientCore::new(config), Arc::clone(&transport), NoIo, stopped.clone()));
    }
    let offered = transfers.len();
    // One client per sender keeps each sender's nonces in order.
    let mut shares = vec![Vec::new(); clients.len()];
    for transfer in transfers {
        shares[client_of(&transfer, clients.len())].push(transfer);
    }
    for (client, share) in clients.iter().zip(shares) {
        assert!(client.input(share));
    }
    Running { storage, miners, clients, offered, stop, tasks }
}

fn audit(dir: &Path, miner: &Miner, committed: u64) {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let audit = audit_cluster(dir, &pool, &mut |_| {}).unwrap();
    let (head_number, _, state_root) = miner.head();
    assert_eq!(audit.chain.head_number, head_number);
    assert_eq!(audit.chain.state_root, state_root);
    assert_eq!(audit.chain.transactions, committed);
}

/// One replica of every shard storage-0 serves lies about its witnesses; its partner
/// (storage-1 in this layout) does not.
async fn a_lying_replica_is_named_and_bypassed(fault: StorageFault) {
    let dir = tempfile::tempdir().unwrap();
    let plan = Plan { storage_nodes: 8, replicas: 2, miners: 1, transfers: 2_000 };
    let running = start(dir.path(), &plan, |storage, _| storage[0].set_fault(fault)).await;
    running
        .wait_for("every offered transfer to commit", Duration::from_secs(180), |running| {
            running.committed() as usize >= running.offered
        })
        .await;
    let miner = Arc::clone(&running.miners[0]);
    let served_by_liar = running.storage[0].stats().witnesses_served;
    let offered = running.offered as u64;
    let clients = running.stop().await;

    let committed: u64 = clients.iter().map(|stats| stats.committed).sum();
    let succeeded: u64 = clients.iter().map(|stats| stats.committed_ok).sum();
    assert_eq!(committed, offered, "{clients:#?}");
    assert_eq!(succeeded, committed, "{clients:#?}");
    let refused: Vec<&(String, WitnessError)> = clients.iter().flat_map(|stats| &stats.bad_witnesses).collect();
    assert!(served_by_liar > 0);
    assert!(!refused.is_empty(), "{fault:?}: no witness was refused ({clients:#?})");
    for (peer, reason) in &refused {
        assert_eq!(peer, "storage-0", "{fault:?}: an honest node's witness was refused: {reason}");
        assert!(matches!(reason, WitnessError::DoesNotVerify { .. }), "{fault:?}: {reason}");
    }
    // Every refused witness was fetched again from the other replica: no batch gave up.
    for stats in &clients {
        assert!(!stats.retried.contains_key("bad_witness"), "{fault:?}: {:#?}", stats.retried);
    }
    audit(dir.path(), &miner, committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_witnesses_from_one_replica_are_refused_and_fetched_from_another() {
    a_lying_replica_is_named_and_bypassed(StorageFault::CorruptWitness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_witnesses_from_one_replica_are_refused_and_fetched_from_another() {
    a_lying_replica_is_named_and_bypassed(StorageFault::StaleWitness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_with_a_wrong_root_are_refused_and_the_honest_miner_commits_again() {
    let dir = tempfile::tempdir().unwrap();
    let plan = Plan { storage_nodes: 4, replicas: 1, miners: 2, transfers: 1_000 };
    let running = start(dir.path(), &plan, |_, miners| miners[0].set_fault(MinerFault::WrongRoot)).await;
    let (producer, follower) = (Arc::clone(&running.miners[0]), Arc::clone(&running.miners[1]));

    // Every storage node and the follower refuse the lying miner's blocks; nothing commits.
    // The producer records the refusals when it abandons the block, after its peers have
    // counted them, so its own stats are waited for too.
    running
        .wait_for("the wrong blocks to be refused", Duration::from_secs(60), |running| {
            running.storage.iter().all(|node| node.stats().blocks_rejected > 0)
                && running.miners[1].stats().refused_blocks > 0
                && running.miners[0].stats().abandoned_blocks > 0
        })
        .await;
    producer.set_fault(MinerFault::None);
    let lying = producer.stats();
    assert!(lying.abandoned_blocks > 0, "{lying:#?}");
    for node in &running.storage {
        let reason = lying
            .block_refusals
            .iter()
            .find(|(peer, _)| peer == node.id())
            .map(|(_, reason)| reason)
            .unwrap_or_else(|| panic!("no refusal recorded from {}: {lying:#?}", node.id()));
        assert!(reason.contains("state root"), "{}: {reason}", node.id());
    }
    let (_, follower_reason) = lying
        .block_refusals
        .iter()
        .find(|(peer, _)| peer == "miner-1")
        .unwrap_or_else(|| panic!("no refusal recorded from miner-1: {lying:#?}"));
    assert!(follower_reason.contains("state root"), "{follower_reason}");

    // Honest again: the refused transfers are resubmitted and everything commits.
    running
        .wait_for("every offered transfer to commit", Duration::from_secs(180), |running| {
            running.committed() as usize >= running.offered
        })
        .await;
    let offered = running.offered as u64;
    let storage = running.storage.clone();
    let clients = running.stop().await;
    let committed: u64 = clients.iter().map(|stats| stats.committed).sum();
    assert_eq!(committed, offered, "{clients:#?}");
    let resubmitted: u64 = clients.iter().filter_map(|stats| stats.retried.get(BLOCK_REFUSED)).sum();
    assert!(resubmitted > 0, "{clients:#?}");

    let (mined, verified) = (producer.stats(), follower.stats());
    assert!(mined.blocks > 0);
    assert_eq!(verified.verified_blocks, mined.blocks, "the follower verified every committed block");
    assert_eq!(follower.head(), producer.head(), "the follower is on the committed chain");
    for node in &storage {
        let stats = node.stats();
        assert_eq!(stats.blocks_applied, mined.blocks, "{}: {stats:?}", node.id());
        assert!(stats.blocks_rejected > 0, "{}: {stats:?}", node.id());
    }
    audit(dir.path(), &producer, committed);
}
