//! RainBlock's roles as separate processes over gRPC (`virga node`).
//!
//! `init` writes a cluster directory once: the genesis and a plan naming every storage
//! node (with its shards), every miner, and the gRPC address of each. Every role process
//! then reads the plan from the same directory and keeps its own data under it: storage
//! node `storage-i` its log in `storage-i/`, the first miner the chain in `blocks/` (so
//! `virga verify --dir` audits the directory as it does one of `virga up`), other miners
//! theirs in `miner-i/`. A restarted process picks up where its files end: a storage node
//! replays its log, a miner reopens its chain and refills its top layer from the storage
//! nodes at its head.

use crate::protocol::Rainblock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use virga_ledger::chain::read_genesis;
use virga_net::driver::Mailbox;
use virga_net::health::{self, Pong};
use virga_net::role::NoIo;
use virga_net::{Grpc, NetError, Transport};

use crate::client::{ClientConfig, ClientCore};
use crate::cluster::{
    check_cluster_format, cluster_format_v1, peer_host, run_clients, write_genesis_with_token, ClusterError,
    CLUSTER_FILE, CLUSTER_FORMAT,
};
use crate::miner::{open_store, Miner, MinerStats};
use crate::storage::{shard_genesis, StorageNode};
use crate::topology::Topology;
use crate::workload::{offer, sign_transfers, token_holdings, Accounts, Mix};

/// What every role process of a hand-started cluster reads from `dir/rainblock.json`.
/// A superset of what `virga up` writes there, so the audit reads both alike.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClusterPlan {
    /// [`crate::cluster::CLUSTER_FORMAT`].
    #[serde(default = "cluster_format_v1")]
    pub format: u32,
    pub shards: usize,
    /// Storage node ids with the shards each serves.
    pub storage_nodes: Vec<(String, Vec<usize>)>,
    pub miners: usize,
    /// `http://host:port` of every storage node and miner, by id.
    pub addresses: BTreeMap<String, String>,
    /// Accounts of the genesis state; key `i` is the workload's deterministic key `i`.
    pub accounts: usize,
    pub seed: u64,
    pub retention: usize,
    pub compaction: usize,
    pub max_block_transfers: usize,
    pub top_budget_bytes: usize,
    /// Share of the clients' transactions that call the workload's ERC-20 token (plans
    /// written before contracts: none).
    #[serde(default)]
    pub contracts: f64,
    /// Transactions the token's genesis holdings were sized for: clients that sign at most
    /// this many find every token caller funded.
    #[serde(default)]
    pub token_transfers: usize,
}

/// Why a role process (or `virga node init`) could not start or went down.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("{}: {source} (a directory made by `virga node init`, not by `virga up`?)", .path.display())]
    Plan {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding the plan: {0}")]
    EncodePlan(#[source] serde_json::Error),
    #[error("the plan's storage layout is not one this build makes; run `virga node init` afresh")]
    Layout,
    #[error("the plan has no address for {id}")]
    NoAddress { id: String },
    #[error("address {url} of {id}: {source}")]
    Address {
        id: String,
        url: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("port {port} for {id} is out of range")]
    Port { id: String, port: usize },
    #[error("the plan has no storage node {id}")]
    NoStorageNode { id: String },
    #[error("the plan has {miners} miner(s); there is no miner {index}")]
    NoMiner { index: usize, miners: usize },
    #[error("{id}: server failed: {source}")]
    Server {
        id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<virga_ledger::chain::ChainError> for ProcessError {
    fn from(error: virga_ledger::chain::ChainError) -> ProcessError {
        ProcessError::Cluster(error.into())
    }
}

impl From<crate::miner::MinerError> for ProcessError {
    fn from(error: crate::miner::MinerError) -> ProcessError {
        ProcessError::Cluster(error.into())
    }
}

#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// The cluster (its clients, batch and in-flight settings are each client process's own).
    pub topology: Topology,
    pub host: String,
    /// Storage node i listens on base_port + i, miner j on base_port + storage nodes + j.
    pub base_port: u16,
    /// Share of the workload's transactions that call the ERC-20 token (0: none, and no
    /// token in the genesis).
    pub contracts: f64,
    /// Transactions the clients will sign in all: the token's holdings are given to their
    /// callers.
    pub transfers: usize,
}

impl ClusterPlan {
    pub fn miner_id(index: usize) -> String {
        Topology::miner_id(index)
    }

    /// The topology the plan was made from; its layout must be the plan's.
    pub fn topology(&self) -> Result<Topology, ProcessError> {
        let replicas = self.storage_nodes.iter().filter(|(_, shards)| shards.contains(&0)).count();
        let topology = Topology {
            accounts: self.accounts,
            shards: self.shards,
            storage_nodes: self.storage_nodes.len(),
            replicas,
            miners: self.miners,
            clients: 1,
            retention: self.retention,
            compaction: self.compaction,
            batch: Topology::small().batch,
            in_flight: Topology::small().in_flight,
            max_block_transfers: self.max_block_transfers,
            top_budget_bytes: self.top_budget_bytes,
            seed: self.seed,
        };
        if topology.layout() != self.storage_nodes {
            return Err(ProcessError::Layout);
        }
        Ok(topology)
    }

    fn address_of(&self, id: &str) -> Result<SocketAddr, ProcessError> {
        let url = self.addresses.get(id).ok_or_else(|| ProcessError::NoAddress { id: id.to_string() })?;
        let hostport = url.strip_prefix("http://").unwrap_or(url);
        hostport.parse().map_err(|source| ProcessError::Address { id: id.to_string(), url: url.clone(), source })
    }

    fn transport(&self) -> Arc<dyn Transport<Rainblock>> {
        self.grpc()
    }

    fn grpc(&self) -> Arc<Grpc> {
        Grpc::new(self.addresses.iter().map(|(id, address)| (id.clone(), address.clone())).collect())
    }

    /// Pings every storage node and miner of the plan over gRPC (the health protocol), all at
    /// once, each given `deadline`: who answered and the version it runs, or why it did not.
    pub async fn ping(&self, deadline: Duration) -> Vec<(String, Result<Pong, NetError>)> {
        let grpc = self.grpc();
        let pings: Vec<_> = self
            .addresses
            .keys()
            .map(|peer| {
                let (grpc, to) = (Arc::clone(&grpc), peer.clone());
                let ping = tokio::spawn(async move {
                    match tokio::time::timeout(deadline, health::ping(&*grpc, "ping", &to)).await {
                        Ok(pinged) => pinged,
                        Err(_) => Err(NetError::DeadlineExceeded { peer: to, after: deadline }),
                    }
                });
                (peer.clone(), ping)
            })
            .collect();
        let mut answers = Vec::with_capacity(pings.len());
        for (peer, ping) in pings {
            let answer = ping.await.unwrap_or_else(|error| {
                Err(NetError::Unreachable { peer: peer.clone(), reason: format!("the ping task failed: {error}") })
            });
            answers.push((peer, answer));
        }
        answers
    }

    fn chain_dir(&self, dir: &Path, miner: usize) -> std::path::PathBuf {
        if miner == 0 {
            dir.to_path_buf()
        } else {
            dir.join(Self::miner_id(miner))
        }
    }
}

/// Writes a new cluster directory: `genesis.json` and the plan.
pub fn init(dir: &Path, options: &PlanOptions, progress: &(dyn Fn(u64) + Sync)) -> Result<ClusterPlan, ProcessError> {
    if dir.join(CLUSTER_FILE).exists() || dir.join("genesis.json").exists() {
        return Err(ClusterError::Occupied { dir: dir.to_path_buf(), holds: "cluster" }.into());
    }
    std::fs::create_dir_all(dir).map_err(|source| ClusterError::Io {
        op: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let topology = &options.topology;
    topology.validate().map_err(ClusterError::from)?;
    let storage_nodes = topology.layout();
    let miners = topology.miners;
    let mut addresses = BTreeMap::new();
    let ids = storage_nodes.iter().map(|(id, _)| id.clone()).chain((0..miners).map(ClusterPlan::miner_id));
    for (offset, id) in ids.enumerate() {
        let port = usize::from(options.base_port) + offset;
        let port = match u16::try_from(port) {
            Ok(port) => port,
            Err(_) => return Err(ProcessError::Port { id, port }),
        };
        addresses.insert(id, format!("http://{}:{port}", options.host));
    }
    let plan = ClusterPlan {
        format: CLUSTER_FORMAT,
        shards: topology.shards,
        storage_nodes,
        miners,
        addresses,
        accounts: topology.accounts,
        seed: topology.seed,
        retention: topology.retention,
        compaction: topology.compaction,
        max_block_transfers: topology.max_block_transfers,
        top_budget_bytes: topology.top_budget_bytes,
        contracts: options.contracts,
        token_transfers: if options.contracts > 0.0 { options.transfers } else { 0 },
    };
    let accounts = Accounts::generate(topology.accounts, progress);
    // The token's holders are the callers among the transactions the clients will sign (the
    // same deterministic workload, signed here once to find them).
    let holdings = (options.contracts > 0.0).then(|| {
        let chain_id = virga_ledger::exec::ExecConfig::default().chain_id;
        let mix = Mix::with_contracts(options.contracts);
        token_holdings(&sign_transfers(&accounts, options.transfers, chain_id, mix, topology.seed, &|_| {}))
    });
    write_genesis_with_token(dir, &accounts.addresses, topology.max_block_transfers, holdings.as_deref())?;
    let text = serde_json::to_string_pretty(&plan).map_err(ProcessError::EncodePlan)?;
    let path = dir.join(CLUSTER_FILE);
    std::fs::write(&path, text).map_err(|source| ClusterError::Io { op: "writing", path, source })?;
    Ok(plan)
}

pub fn read_plan(dir: &Path) -> Result<ClusterPlan, ProcessError> {
    let path = dir.join(CLUSTER_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| ClusterError::Io {
        op: "reading",
        path: path.clone(),
        source,
    })?;
    let plan: ClusterPlan =
        serde_json::from_str(&text).map_err(|source| ProcessError::Plan { path: path.clone(), source })?;
    check_cluster_format(&path, plan.format)?;
    Ok(plan)
}

/// Serves storage node `id` of the plan in `dir` until `shutdown` completes. Replays its
/// log first, so a restarted node holds every block it acknowledged.
pub async fn run_storage(
    dir: &Path,
    id: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ProcessError> {
    let plan = read_plan(dir)?;
    let served = plan
        .storage_nodes
        .iter()
        .find(|(node, _)| node == id)
        .map(|(_, shards)| shards.clone())
        .ok_or_else(|| ProcessError::NoStorageNode { id: id.to_string() })?;
    let address = plan.address_of(id)?;
    let genesis = read_genesis(dir)?;
    let sharded = shard_genesis(&genesis.state, plan.shards).map_err(|error| ClusterError::Storage(error.into()))?;
    drop(genesis.state);
    let log = crate::storage::log_path(dir, id);
    let (node, replayed) =
        StorageNode::open(id, served, plan.shards, genesis.config, genesis.header, &sharded, Some(&log))
            .map_err(|source| ClusterError::StorageNode { id: id.to_string(), source: source.into() })?;
    drop(sharded);
    let (head, _, _) = node.head();
    tracing::info!(node = %id, replayed, head, "storage node ready");
    let bind_failed = |source| ClusterError::Bind { what: address.to_string(), source };
    let listener = tokio::net::TcpListener::bind(address).await.map_err(bind_failed)?;
    let (bound, server) = virga_net::serve(listener, peer_host(id, node), shutdown).map_err(bind_failed)?;
    eprintln!("{id}: serving shards at {bound}, head block {head} ({replayed} blocks replayed from its log)");
    server.await.map_err(|source| ProcessError::Server { id: id.to_string(), source: source.into() })
}

/// Runs miner `index` of the plan in `dir` until `shutdown` fires: reopens its chain, fills
/// its top layer from the storage nodes (waiting for them to come up), then serves and mines.
pub async fn run_miner(
    dir: &Path,
    index: usize,
    mut shutdown: watch::Receiver<bool>,
) -> Result<MinerStats, ProcessError> {
    let plan = read_plan(dir)?;
    if index >= plan.miners {
        return Err(ProcessError::NoMiner { index, miners: plan.miners });
    }
    let id = ClusterPlan::miner_id(index);
    let address = plan.address_of(&id)?;
    let genesis = read_genesis(dir)?;
    drop(genesis.state);
    let (store, head) = open_store(&plan.chain_dir(dir, index), &genesis.header)?;
    let config = plan.topology()?.miner_config(index, genesis.config);
    let miner = Miner::new(config, head.clone(), Some(store))?;
    let transport = plan.transport();
    loop {
        match miner.warm_up(Arc::clone(&transport)).await {
            Ok(()) => break,
            Err(reason) => {
                tracing::info!(miner = %id, %reason, "storage nodes not ready; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = shutdown.changed() => return Ok(miner.stats()),
                }
            }
        }
    }
    let bind_failed = |source| ClusterError::Bind { what: address.to_string(), source };
    let listener = tokio::net::TcpListener::bind(address).await.map_err(bind_failed)?;
    let mut stopped = shutdown.clone();
    let server_shutdown = async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let (bound, server) =
        virga_net::serve(listener, peer_host(&id, Arc::clone(&miner) as _), server_shutdown).map_err(bind_failed)?;
    let server = tokio::spawn(server);
    eprintln!("{id}: mining at {bound} on block {} ({})", head.number, head.hash_slow());
    Arc::clone(&miner).run(transport, shutdown).await;
    let _ = server.await;
    Ok(miner.stats())
}

/// What one client process is to do.
#[derive(Clone, Debug)]
pub struct ClientJob {
    pub id: String,
    /// This process is client `index` of `clients`; it takes the transfers of the senders
    /// that fall to it, so clients never share a sender (and its nonce sequence).
    pub index: usize,
    pub clients: usize,
    /// Transfers signed for all clients together (this one takes its share).
    pub transfers: usize,
    pub rate: Option<f64>,
    pub duration: Duration,
    pub batch: usize,
    pub in_flight: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClientReport {
    pub id: String,
    pub offered: usize,
    pub committed: u64,
    pub succeeded: u64,
    pub seconds: f64,
    pub tps: f64,
    pub filtered: BTreeMap<String, u64>,
    pub retried: BTreeMap<String, u64>,
    pub bad_witnesses: usize,
    pub witness_bytes_full_per_tx: f64,
    pub witness_bytes_compact_per_tx: f64,
    /// Of `committed`: calls of the ERC-20 token.
    #[serde(default)]
    pub calls_committed: u64,
}

/// Signs this client's share of the workload and submits it through the plan's miner 0
/// until all of it commits or the job's duration ends. Transfers are signed from nonce 0,
/// so a cluster takes one run of each client.
pub async fn run_client(
    dir: &Path,
    job: &ClientJob,
    progress: &(dyn Fn(u64, usize) + Sync),
) -> Result<ClientReport, ProcessError> {
    let plan = read_plan(dir)?;
    let genesis = read_genesis(dir)?;
    drop(genesis.state);
    let exec = genesis.config.exec;
    let accounts = Accounts::generate(plan.accounts, &|_| {});
    let clients = job.clients.max(1);
    if plan.contracts > 0.0 && job.transfers > plan.token_transfers {
        // The workload is the same sequence whatever its length, so the first
        // `token_transfers` calls are funded and later new callers hold no tokens.
        tracing::warn!(
            client = %job.id,
            transfers = job.transfers,
            funded = plan.token_transfers,
            "more transactions than `virga node init --transfers` funded: token calls of senders first seen past it revert"
        );
    }
    let mix = Mix::with_contracts(plan.contracts);
    let transfers: Vec<_> = sign_transfers(&accounts, job.transfers, exec.chain_id, mix, plan.seed, &|_| {})
        .into_iter()
        .filter(|transfer| usize::from(transfer.sender.0[19]) % clients == job.index)
        .collect();
    drop(accounts);
    let offered = transfers.len();
    let topology = Topology { batch: job.batch, in_flight: job.in_flight, ..plan.topology()? };
    let config = ClientConfig { id: job.id.clone(), ..topology.client_config(job.index, exec) };
    let (stop, stopped) = watch::channel(false);
    let client = Mailbox::new().run(job.id.clone(), ClientCore::new(config), plan.transport(), NoIo, stopped);
    let clients = [client];
    let started = Instant::now();
    let feeding = offer(transfers, job.rate, 1, |_, share| clients[0].input(share));
    let watching = async {
        let mut ticks = tokio::time::interval(Duration::from_millis(200));
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let committed = clients[0].with_core(ClientCore::committed);
            progress(committed, offered);
            if committed as usize >= offered || started.elapsed() >= job.duration {
                return;
            }
        }
    };
    run_clients(&clients, feeding, watching).await;
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let [client] = clients;
    let stats = client.join().await.lock().stats();
    let per_submitted = |total: u64| if stats.submitted == 0 { 0.0 } else { total as f64 / stats.submitted as f64 };
    Ok(ClientReport {
        id: job.id.clone(),
        offered,
        committed: stats.committed,
        succeeded: stats.committed_ok,
        seconds,
        tps: stats.committed as f64 / seconds.max(1e-9),
        filtered: stats.filtered.iter().map(|(reason, count)| (reason.clone(), *count)).collect(),
        retried: stats.retried.iter().map(|(reason, count)| (reason.clone(), *count)).collect(),
        bad_witnesses: stats.bad_witnesses.len(),
        witness_bytes_full_per_tx: per_submitted(stats.witness_bytes_full),
        witness_bytes_compact_per_tx: per_submitted(stats.witness_bytes_compact),
        calls_committed: stats.calls_committed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_text(format: Option<u32>) -> String {
        let mut plan = serde_json::json!({
            "shards": 16, "storage_nodes": [["storage-0", [0]]], "miners": 1,
            "addresses": {}, "accounts": 10, "seed": 1, "retention": 4, "compaction": 5,
            "max_block_transfers": 100, "top_budget_bytes": 0,
        });
        if let Some(format) = format {
            plan["format"] = format.into();
        }
        plan.to_string()
    }

    #[test]
    fn a_plan_of_another_format_is_refused_and_one_without_the_field_reads_as_format_1() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CLUSTER_FILE), plan_text(None)).unwrap();
        assert_eq!(read_plan(dir.path()).unwrap().format, 1);
        std::fs::write(dir.path().join(CLUSTER_FILE), plan_text(Some(CLUSTER_FORMAT))).unwrap();
        assert!(read_plan(dir.path()).is_ok());
        std::fs::write(dir.path().join(CLUSTER_FILE), plan_text(Some(2))).unwrap();
        let error = read_plan(dir.path()).unwrap_err();
        assert!(
            matches!(&error, ProcessError::Cluster(ClusterError::Format { path, found: 2 }) if path == &dir.path().join(CLUSTER_FILE)),
            "{error:?}"
        );
        assert!(error.to_string().contains("format 2 was written by a newer Virga"), "{error}");
    }
}
