//! `virga up`: a whole RainBlock cluster in one process — storage nodes, miners and
//! prefetching clients as tasks — over the in-process transport or gRPC on loopback.

use crate::protocol::Rainblock;
use alloy_primitives::{Address, B256, U256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use virga_ledger::chain::{genesis_document, read_genesis};
use virga_net::driver::{Mailbox, Running};
use virga_net::health::{Health, Responder};
use virga_net::role::NoIo;
#[cfg(feature = "grpc")]
use virga_net::Grpc;
use virga_net::{Handler, Host, InProc, Transport};

use crate::client::{ClientCore, ClientStats};
use crate::miner::{open_store, Miner, MinerError, MinerStats};
use crate::storage::{shard_genesis, StorageError, StorageNode};
pub use crate::topology::{beneficiary, replicated_layout, storage_counts};
use crate::topology::{Topology, TopologyError};
use crate::workload::{offer, sign_transfers, token_holdings, Accounts, Mix, GENESIS_BALANCE};

/// Marks a directory as a RainBlock cluster's (`virga verify` audits it as one).
pub const CLUSTER_FILE: &str = "rainblock.json";

/// Format of [`CLUSTER_FILE`] this build writes and reads. Files written before the field
/// existed have this layout and no `format`, so a missing field reads as 1.
pub const CLUSTER_FORMAT: u32 = 1;

pub(crate) fn cluster_format_v1() -> u32 {
    1
}

/// Why a cluster could not be set up or run (`virga up`, and the steps `virga node` shares).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "{}: cluster file format {found} was written by {} Virga; this build reads format \
         {CLUSTER_FORMAT}. Start the cluster afresh in a new directory",
        .path.display(),
        if *.found < CLUSTER_FORMAT { "an older" } else { "a newer" }
    )]
    Format { path: PathBuf, found: u32 },
    #[error("{} already holds a {holds}; pick an empty directory", .dir.display())]
    Occupied { dir: PathBuf, holds: &'static str },
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done, e.g. "writing".
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Chain(#[from] virga_ledger::chain::ChainError),
    #[error(transparent)]
    Storage(Box<StorageError>),
    #[error("{id}: {source}")]
    StorageNode {
        id: String,
        #[source]
        source: Box<StorageError>,
    },
    #[error(transparent)]
    Miner(#[from] MinerError),
    #[error("this build of virga-node has no gRPC transport (feature `grpc`)")]
    NoGrpc,
    #[error("binding {what}: {source}")]
    Bind {
        /// The role (or address) the listener was for.
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Refuses a cluster file of a format this build does not read, naming both versions.
pub fn check_cluster_format(path: &Path, format: u32) -> Result<(), ClusterError> {
    if format == CLUSTER_FORMAT {
        return Ok(());
    }
    Err(ClusterError::Format { path: path.to_path_buf(), found: format })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TransportKind {
    InProc,
    Grpc,
}

/// A run of `virga up`: the cluster, and the run's own settings.
#[derive(Clone, Debug)]
pub struct UpConfig {
    pub topology: Topology,
    pub dir: PathBuf,
    pub duration: Duration,
    /// Transfers signed before the run (the users' backlog); the run ends when all commit.
    pub transfers: usize,
    /// Transfers offered per second (`None`: as fast as clients take them).
    pub rate: Option<f64>,
    /// Share of the transactions that are ERC-20 token transfers (contract calls).
    pub contracts: f64,
    pub transport: TransportKind,
}

impl UpConfig {
    pub fn small(dir: &Path) -> UpConfig {
        UpConfig {
            topology: Topology::small(),
            dir: dir.to_path_buf(),
            duration: Duration::from_secs(30),
            transfers: 2_000,
            rate: None,
            contracts: 0.0,
            transport: TransportKind::InProc,
        }
    }
}

/// What a phase of `virga up` reports as it goes.
pub trait Progress: Sync {
    fn phase(&self, name: &str, total: u64);
    fn advance(&self, done: u64);
    fn set(&self, done: u64, message: String);
    fn finish(&self);
}

/// A progress sink that shows nothing (tests).
pub struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn set(&self, _: u64, _: String) {}
    fn finish(&self) {}
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct UpReport {
    pub transport: String,
    pub accounts: usize,
    pub shards: usize,
    pub storage_nodes: usize,
    pub replicas: usize,
    pub clients: usize,
    pub miners: usize,
    pub retention: usize,
    pub compaction: usize,
    pub setup_seconds: f64,
    pub run_seconds: f64,
    /// CPU time the whole process used during the run (user and system, every thread;
    /// Linux only), and per committed transfer: throughput this machine could reach if
    /// every core were busy is about cores / this.
    pub run_cpu_seconds: Option<f64>,
    pub cpu_us_per_tx: Option<f64>,
    pub offered: usize,
    pub committed: u64,
    pub succeeded: u64,
    pub tps: f64,
    pub blocks: u64,
    pub head_number: u64,
    pub state_root: String,
    /// Transactions the miner left out (the clients retry them, unless invalid), by reason.
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Share of the signed transactions that are token transfers (contract calls).
    pub contract_share: f64,
    /// Contract calls committed, per second of the run.
    pub contract_calls: u64,
    pub contract_calls_per_sec: f64,
    /// Witness fetch rounds beyond a batch's first (contract calls reaching further state).
    pub extra_witness_rounds: u64,
    /// Slot bags and code sent per contract call submitted (within the compacted bytes).
    pub contract_witness_bytes_per_call: f64,
    pub failed: BTreeMap<String, u64>,
    pub filtered: BTreeMap<String, u64>,
    pub bad_witnesses: usize,
    pub witness_bytes_full_per_tx: f64,
    pub witness_bytes_compact_per_tx: f64,
    pub messages_per_tx: f64,
    pub network_bytes_per_tx: f64,
    pub round_trips: BTreeMap<String, u64>,
    pub top_layer_nodes: usize,
    pub top_layer_peak_bytes: usize,
    pub prunes: u64,
    pub revised_submissions: u64,
    pub follower_blocks_verified: u64,
    pub follower_blocks_refused: u64,
    pub fork_versions_collected: u64,
}

/// Shards served by storage node `node` of `nodes`.
pub fn shards_of(node: usize, nodes: usize, shards: usize) -> Vec<usize> {
    (0..shards).filter(|shard| shard % nodes == node).collect()
}

/// Storage node ids with their shards, each shard on one node ([`replicated_layout`] with
/// one replica).
pub fn storage_layout(nodes: usize, shards: usize) -> Vec<(String, Vec<usize>)> {
    replicated_layout(nodes, shards, 1)
}

/// Writes `dir/genesis.json`: every account funded with [`GENESIS_BALANCE`], a gas limit
/// for `max_block_transfers` transfers per block, and a low fixed difficulty.
/// What peer `id` serves: RainBlock by `handler`, and health (its id, role and version).
pub fn peer_host(id: &str, handler: Arc<dyn Handler<Rainblock>>) -> Host {
    Host::new().with::<Rainblock>(handler).with::<Health>(Arc::new(Responder::new(id)))
}

/// The gas limit of a chain whose blocks hold up to `max_block_transfers` transfers: twice
/// their gas, so a full block sits at the EIP-1559 target and the base fee never rises above
/// what the workload pays.
pub fn block_gas_limit(max_block_transfers: usize) -> u64 {
    2 * virga_ledger::exec::TRANSFER_GAS * max_block_transfers.max(1) as u64
}

pub fn write_genesis(dir: &Path, addresses: &[Address], max_block_transfers: usize) -> Result<(), ClusterError> {
    write_genesis_with_token(dir, addresses, max_block_transfers, None)
}

/// [`write_genesis`], with the workload's ERC-20 token deployed at
/// [`crate::workload::TOKEN_AT`] holding `token`'s balances when given. Its blocks then
/// have room for a full block of token calls: the gas limit is twice their gas limit.
pub fn write_genesis_with_token(
    dir: &Path,
    addresses: &[Address],
    max_block_transfers: usize,
    token: Option<&[(B256, U256)]>,
) -> Result<(), ClusterError> {
    let chain_id = virga_ledger::exec::ExecConfig::default().chain_id;
    let difficulty = U256::from(16u64);
    let gas_limit = match token {
        None => block_gas_limit(max_block_transfers),
        Some(_) => 2 * crate::workload::TOKEN_CALL_GAS * max_block_transfers.max(1) as u64,
    };
    let mut genesis = genesis_document(chain_id, difficulty, gas_limit, addresses, U256::from(GENESIS_BALANCE));
    if let Some(holdings) = token {
        add_token(&mut genesis, holdings);
    }
    let path = dir.join("genesis.json");
    std::fs::write(&path, genesis.to_string()).map_err(|source| ClusterError::Io { op: "writing", path, source })
}

/// Adds the token's account (code and storage) to a genesis document's `alloc`.
fn add_token(genesis: &mut serde_json::Value, holdings: &[(B256, U256)]) {
    let storage: serde_json::Map<String, serde_json::Value> = holdings
        .iter()
        .map(|(slot, value)| (slot.to_string(), serde_json::Value::String(B256::from(*value).to_string())))
        .collect();
    let code = virga_evm::contracts::TOKEN.runtime_code();
    let account = serde_json::json!({ "balance": "0x0", "nonce": "0x1", "code": code.to_string(), "storage": storage });
    if let Some(alloc) = genesis.get_mut("alloc").and_then(serde_json::Value::as_object_mut) {
        alloc.insert(crate::workload::TOKEN_AT.to_string(), account);
    }
}

/// Runs a cluster with a fresh state in `config.dir` (which must not hold one).
#[allow(clippy::too_many_lines)] // Predates the lint: a debt, to split.
pub async fn up(config: UpConfig, progress: &dyn Progress) -> Result<UpReport, ClusterError> {
    let started = Instant::now();
    // The workload draws a receiver other than the sender, and every client takes a share.
    config.topology.validate()?;
    if config.dir.join(CLUSTER_FILE).exists() || config.dir.join("genesis.json").exists() {
        return Err(ClusterError::Occupied { dir: config.dir.clone(), holds: "chain" });
    }
    std::fs::create_dir_all(&config.dir).map_err(|source| ClusterError::Io {
        op: "creating",
        path: config.dir.clone(),
        source,
    })?;
    let (nodes, replicas) = config.topology.storage_counts();
    let chain_id = virga_ledger::exec::ExecConfig::default().chain_id;

    progress.phase("deriving account keys", config.topology.accounts as u64);
    let accounts = Accounts::generate(config.topology.accounts, &|done| progress.advance(done));
    progress.finish();

    progress.phase("signing the users' transactions", config.transfers as u64);
    let mix = Mix::with_contracts(config.contracts);
    let transfers = sign_transfers(&accounts, config.transfers, chain_id, mix, config.topology.seed, &|done| {
        progress.advance(done)
    });
    progress.finish();

    progress.phase("building the genesis state", 1);
    let holdings = (config.contracts > 0.0).then(|| token_holdings(&transfers));
    write_genesis_with_token(
        &config.dir,
        &accounts.addresses,
        config.topology.max_block_transfers,
        holdings.as_deref(),
    )?;
    drop(accounts);
    let layout = config.topology.layout();
    let cluster = serde_json::json!({
        "format": CLUSTER_FORMAT,
        "shards": config.topology.shards,
        "replicas": replicas,
        "storage_nodes": layout,
        "miners": config.topology.miners,
    });
    let cluster_file = config.dir.join(CLUSTER_FILE);
    std::fs::write(&cluster_file, cluster.to_string()).map_err(|source| ClusterError::Io {
        op: "writing",
        path: cluster_file,
        source,
    })?;
    let genesis = read_genesis(&config.dir)?;
    let sharded =
        shard_genesis(&genesis.state, config.topology.shards).map_err(|error| ClusterError::Storage(error.into()))?;
    progress.finish();

    // The roles.
    let inproc = InProc::new();
    let mut handlers: Vec<(String, Arc<dyn Handler<Rainblock>>)> = Vec::new();
    let mut storage = Vec::new();
    for (id, shards) in &layout {
        let log = crate::storage::log_path(&config.dir, id);
        let (node, _) = StorageNode::open(
            id.clone(),
            shards.clone(),
            config.topology.shards,
            genesis.config,
            genesis.header.clone(),
            &sharded,
            Some(&log),
        )
        .map_err(|source| ClusterError::StorageNode { id: id.clone(), source: source.into() })?;
        handlers.push((id.clone(), node.clone()));
        storage.push(node);
    }
    drop(sharded);
    let miner_ids = config.topology.miner_ids();
    let mut miners = Vec::new();
    for (index, id) in miner_ids.iter().enumerate() {
        let dir = if index == 0 { config.dir.clone() } else { config.dir.join(id) };
        let (store, head) = open_store(&dir, &genesis.header)?;
        let miner_config = config.topology.miner_config(index, genesis.config);
        let miner = Miner::new(miner_config, head, Some(store))?;
        handlers.push((id.clone(), miner.clone()));
        miners.push(miner);
    }
    let (stop_servers, servers_stopped) = watch::channel(false);
    let transport: Arc<dyn Transport<Rainblock>> = match config.transport {
        TransportKind::InProc => {
            for (id, handler) in handlers {
                inproc.register_host(id.clone(), peer_host(&id, handler));
            }
            inproc
        }
        #[cfg(not(feature = "grpc"))]
        TransportKind::Grpc => {
            drop(servers_stopped);
            return Err(ClusterError::NoGrpc);
        }
        #[cfg(feature = "grpc")]
        TransportKind::Grpc => {
            let mut addresses = HashMap::new();
            for (id, handler) in handlers {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(|source| ClusterError::Bind { what: id.clone(), source })?;
                let mut stopped = servers_stopped.clone();
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                let (address, server) = virga_net::serve(listener, peer_host(&id, handler), shutdown)
                    .map_err(|source| ClusterError::Bind { what: id.clone(), source })?;
                tokio::spawn(server);
                addresses.insert(id, format!("http://{address}"));
            }
            Grpc::new(addresses)
        }
    };
    for miner in &miners {
        miner.warm_up(Arc::clone(&transport)).await?;
    }
    let setup_seconds = started.elapsed().as_secs_f64();

    // The run.
    let (stop, stopped) = watch::channel(false);
    let miner_task = tokio::spawn(Arc::clone(&miners[0]).run(Arc::clone(&transport), stopped.clone()));
    let mut clients = Vec::new();
    for index in 0..config.topology.clients.max(1) {
        let client_config = config.topology.client_config(index, genesis.config.exec);
        let id = client_config.id.clone();
        clients.push(Mailbox::new().run(
            id,
            ClientCore::new(client_config),
            Arc::clone(&transport),
            NoIo,
            stopped.clone(),
        ));
    }
    let offered = transfers.len();

    progress.phase("running the workload (transfers committed)", offered as u64);
    let run_started = Instant::now();
    let cpu_at_start = process_cpu_seconds();
    let feeding = offer(transfers, config.rate, clients.len(), |client, share| clients[client].input(share));
    let watching = async {
        let mut ticks = tokio::time::interval(Duration::from_millis(200));
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let committed: u64 = clients.iter().map(|client| client.with_core(ClientCore::committed)).sum();
            let elapsed = run_started.elapsed();
            let (head, _, _) = miners[0].head();
            progress.set(
                committed,
                format!("block {head}, {:.0} tx/s", committed as f64 / elapsed.as_secs_f64().max(1e-9)),
            );
            if committed as usize >= offered || elapsed >= config.duration {
                return;
            }
        }
    };
    run_clients(&clients, feeding, watching).await;
    let run_seconds = run_started.elapsed().as_secs_f64();
    let run_cpu_seconds = cpu_at_start.zip(process_cpu_seconds()).map(|(start, end)| end - start);
    progress.finish();
    let _ = stop.send(true);
    let mut client_stats = Vec::new();
    for client in clients {
        client_stats.push(client.join().await.lock().stats());
    }
    let _ = miner_task.await;
    let _ = stop_servers.send(true);

    let clients: Vec<ClientStats> = client_stats;
    let miner: MinerStats = miners[0].stats();
    let committed: u64 = clients.iter().map(|stats| stats.committed).sum();
    let succeeded: u64 = clients.iter().map(|stats| stats.committed_ok).sum();
    let contract_calls: u64 = clients.iter().map(|stats| stats.calls_committed).sum();
    let submitted: u64 = clients.iter().map(|stats| stats.submitted).sum();
    let per_submitted = |total: u64| if submitted == 0 { 0.0 } else { total as f64 / submitted as f64 };
    let per_committed = |total: u64| if committed == 0 { 0.0 } else { total as f64 / committed as f64 };
    let merge = |maps: Vec<&HashMap<String, u64>>| {
        let mut merged = BTreeMap::new();
        for map in maps {
            for (key, value) in map {
                *merged.entry(key.clone()).or_insert(0) += value;
            }
        }
        merged
    };
    let (head_number, _, state_root) = miners[0].head();
    let traffic = transport.stats().snapshot();
    let followers = &miners[1..];
    Ok(UpReport {
        transport: format!("{:?}", config.transport).to_lowercase(),
        accounts: config.topology.accounts,
        shards: config.topology.shards,
        storage_nodes: nodes,
        replicas,
        clients: clients.len(),
        miners: miners.len(),
        retention: config.topology.retention,
        compaction: config.topology.compaction,
        setup_seconds,
        run_seconds,
        run_cpu_seconds,
        cpu_us_per_tx: run_cpu_seconds.filter(|_| committed > 0).map(|cpu| cpu * 1e6 / committed as f64),
        offered,
        committed,
        succeeded,
        tps: committed as f64 / run_seconds.max(1e-9),
        blocks: miner.blocks,
        head_number,
        state_root: format!("{state_root}"),
        aborts_by_reason: merge(vec![&miner.aborted]),
        contract_share: config.contracts,
        contract_calls,
        contract_calls_per_sec: contract_calls as f64 / run_seconds.max(1e-9),
        extra_witness_rounds: clients.iter().map(|stats| stats.extra_rounds).sum(),
        contract_witness_bytes_per_call: {
            let calls: u64 = clients.iter().map(|stats| stats.calls_submitted).sum();
            let bytes: u64 = clients.iter().map(|stats| stats.contract_witness_bytes).sum();
            if calls == 0 {
                0.0
            } else {
                bytes as f64 / calls as f64
            }
        },
        failed: merge(vec![&miner.failed]),
        filtered: merge(clients.iter().map(|stats| &stats.filtered).collect()),
        bad_witnesses: clients.iter().map(|stats| stats.bad_witnesses.len()).sum(),
        witness_bytes_full_per_tx: per_submitted(clients.iter().map(|stats| stats.witness_bytes_full).sum()),
        witness_bytes_compact_per_tx: per_submitted(clients.iter().map(|stats| stats.witness_bytes_compact).sum()),
        messages_per_tx: per_committed(transport.stats().total_messages()),
        network_bytes_per_tx: per_committed(transport.stats().total_bytes()),
        round_trips: traffic.iter().map(|(role, traffic)| (role.clone(), traffic.round_trips)).collect(),
        top_layer_nodes: miner.top_nodes,
        top_layer_peak_bytes: miner.peak_top_bytes,
        prunes: miner.prunes,
        revised_submissions: miner.revised_submissions,
        follower_blocks_verified: followers.iter().map(|miner| miner.stats().verified_blocks).sum(),
        follower_blocks_refused: followers.iter().map(|miner| miner.stats().refused_blocks).sum(),
        fork_versions_collected: storage.iter().map(|node| node.stats().fork_versions_collected).sum(),
    })
}

/// Runs `clients` until `watching` ends (it decides when enough is done), all of them
/// stopped, or the feed has closed and every transfer handed over is taken and settled:
/// each client idle, having accepted all it was handed.
pub async fn run_clients(
    clients: &[Running<ClientCore>],
    feeding: impl std::future::Future<Output = usize>,
    watching: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(feeding, watching);
    let mut handed = None;
    let mut checks = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            () = &mut watching => return,
            count = &mut feeding, if handed.is_none() => handed = Some(count as u64),
            _ = checks.tick() => {}
        }
        if clients.iter().all(Running::is_finished) {
            return;
        }
        let settled = |handed: u64| {
            let accepted: u64 = clients.iter().map(|client| client.with_core(ClientCore::accepted)).sum();
            accepted == handed && clients.iter().all(|client| client.with_core(ClientCore::is_idle))
        };
        if handed.is_some_and(settled) {
            return;
        }
    }
}

/// User plus system CPU seconds of this process so far, from `/proc/self/stat` (fields 14
/// and 15, in the kernel's fixed user-visible 100 ticks per second).
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after it follow its ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_has_its_replicas_on_distinct_nodes_and_loads_stay_even() {
        for (nodes, shards, replicas) in [(16, 16, 1), (16, 16, 2), (4, 16, 3), (5, 16, 2), (2, 1, 2), (3, 256, 3)] {
            let layout = replicated_layout(nodes, shards, replicas);
            assert_eq!(layout.len(), nodes);
            for shard in 0..shards {
                let holders = layout.iter().filter(|(_, served)| served.contains(&shard)).count();
                assert_eq!(holders, replicas, "shard {shard} of {nodes}/{shards}/{replicas}");
            }
            let loads: Vec<usize> = layout.iter().map(|(_, served)| served.len()).collect();
            let (least, most) = (loads.iter().min().copied(), loads.iter().max().copied());
            assert!(most.zip(least).is_some_and(|(most, least)| most - least <= 1), "{loads:?}");
        }
    }

    #[test]
    fn one_replica_is_the_plain_layout_and_replicas_are_clamped() {
        let plain: Vec<Vec<usize>> = (0..5).map(|node| shards_of(node, 5, 16)).collect();
        let layout: Vec<Vec<usize>> = storage_layout(5, 16).into_iter().map(|(_, served)| served).collect();
        assert_eq!(layout, plain);
        let clamped = replicated_layout(2, 16, 9);
        assert!(clamped.iter().all(|(_, served)| served.len() == 16), "{clamped:?}");
        assert_eq!(replicated_layout(3, 16, 0), storage_layout(3, 16));
    }
}
