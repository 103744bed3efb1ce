//! `virga bench dkv`: the distributed transactional store (virga-dkv) embedded in one
//! process, every role under the tokio driver on the in-process transport with its log on
//! files, against the single-node engine on the same transactions and durability in the
//! same run.
//!
//! The store: a configuration service of 3 replicas, `shards` shards of `replicas` replicas
//! placed round robin over `max(shards, replicas)` data nodes, and `clients` MILANA clients,
//! each kept `window` transactions ahead (closed loop). After a warm-up, the committed
//! transactions and the aborted attempts are counted over the measured time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use tokio::sync::watch;
use virga_core::device::{FileStorage, Storage};
use virga_dkv::client::{ClientInput, Program, TxnClient, TxnClientConfig, TxnOp};
use virga_dkv::service::{open_replica, ConfigClient, ConfigClientConfig, ConfigCore, ReplicaConfig};
use virga_dkv::shard::{open_data_node, DataConfig, DataCore};
use virga_dkv::{ConfigCommand, Partitioning, ShardMap};
use virga_net::driver::{Mailbox, Running};
use virga_net::role::NoIo;
use virga_net::{Dkv, Grpc, Host, InProc, Transport};

use crate::kv::ycsb_t::{key, value, YcsbT, YcsbTTxn};

/// How the store's roles reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DkvNet {
    /// Calls between tasks of this process.
    InProc,
    /// Every configuration replica and data node behind a gRPC server of its own on
    /// loopback, every call over TCP and HTTP/2 (as separate processes would talk).
    Grpc,
}

/// The transport the roles run on, and how a role is made reachable on it.
enum Net {
    InProc(Arc<InProc>),
    Grpc { grpc: Arc<Grpc>, stop: watch::Receiver<bool> },
}

impl Net {
    fn transport(&self) -> Arc<dyn Transport<Dkv>> {
        match self {
            Net::InProc(inproc) => Arc::clone(inproc) as _,
            Net::Grpc { grpc, .. } => Arc::clone(grpc) as _,
        }
    }

    /// Makes `name`'s host reachable (a gRPC server on a loopback port of its own).
    fn publish(&self, name: &str, host: Host) -> Result<()> {
        match self {
            Net::InProc(inproc) => inproc.register_host(name, host),
            Net::Grpc { grpc, stop } => {
                let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
                listener.set_nonblocking(true)?;
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let mut stop = stop.clone();
                let shutdown = async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                };
                let (address, server) = virga_net::serve(listener, host, shutdown)?;
                tokio::spawn(server);
                grpc.set_address(name, format!("http://{address}"));
            }
        }
        Ok(())
    }
}

/// How the store runs.
#[derive(Clone, Debug)]
pub struct DkvBenchConfig {
    pub net: DkvNet,
    pub shards: u32,
    /// Replicas per shard (odd).
    pub replicas: usize,
    pub clients: usize,
    /// Transactions each client is kept ahead.
    pub window: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Fsync each group of log records (`--sync group`) or not (`none`).
    pub sync: bool,
    pub seed: u64,
}

/// What one run of the store measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DkvBenchReport {
    pub shards: u32,
    pub replicas: usize,
    pub data_nodes: usize,
    pub clients: usize,
    pub sync: &'static str,
    pub duration_s: f64,
    pub committed: u64,
    pub committed_read_only: u64,
    pub committed_per_sec: f64,
    /// Aborted attempts, and their share of all attempts.
    pub aborts: u64,
    pub abort_rate: f64,
    pub abort_reasons: BTreeMap<String, u64>,
}

/// A generated transaction as a client program: its gets, then (read-write) its puts.
pub fn program(txn: &YcsbTTxn, value_size: usize) -> Program {
    let mut ops: Vec<TxnOp> = txn.ids.iter().map(|id| TxnOp::Get(Bytes::from(key(*id)))).collect();
    if txn.writes {
        for (position, id) in txn.ids.iter().enumerate() {
            let bytes = value(txn.seed.wrapping_add(position as u64), value_size);
            ops.push(TxnOp::Put(Bytes::from(key(*id)), Bytes::from(bytes)));
        }
    }
    Program::Ops(ops)
}

struct Roles {
    config: Vec<(Running<ConfigCore>, watch::Sender<bool>)>,
    data: Vec<(Running<DataCore>, watch::Sender<bool>)>,
    clients: Vec<(Running<TxnClient>, watch::Sender<bool>)>,
}

impl Roles {
    fn stop(&self) {
        for (_, stop) in &self.config {
            let _ = stop.send(true);
        }
        for (_, stop) in &self.data {
            let _ = stop.send(true);
        }
        for (_, stop) in &self.clients {
            let _ = stop.send(true);
        }
    }
}

fn config_names() -> Vec<String> {
    (1..=3).map(|id| format!("config-{id}")).collect()
}

fn start_config(dir: &Path, net: &Net, sync: bool) -> Result<Vec<(Running<ConfigCore>, watch::Sender<bool>)>> {
    let peers: Vec<(u64, String)> =
        config_names().into_iter().enumerate().map(|(i, name)| (i as u64 + 1, name)).collect();
    let mut running = Vec::new();
    for (id, name) in &peers {
        let mut config = ReplicaConfig::new(*id, peers.clone(), *id);
        config.sync = sync;
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::create_dir_all(dir.join(name))?);
        let (core, disk) = open_replica(config, storage).map_err(|error| anyhow!("{name}: {error}"))?;
        let mailbox = Mailbox::<ConfigCore>::new();
        net.publish(name, Host::new().with::<Dkv>(mailbox.handler()))?;
        let (stop, stopped) = watch::channel(false);
        running.push((mailbox.run(name.clone(), core, net.transport(), disk, stopped), stop));
    }
    Ok(running)
}

/// Installs `map` through the configuration service (retried until a leader applies it).
async fn install(map: &ShardMap, net: &Net) -> Result<()> {
    let (stop, stopped) = watch::channel(false);
    let admin = ConfigClient::new(ConfigClientConfig::new("bench-admin", config_names()));
    let running = Mailbox::<ConfigClient>::new().run("bench-admin", admin, net.transport(), NoIo, stopped);
    running.input(vec![ConfigCommand::Install(map.clone())]);
    let started = Instant::now();
    while running.with_core(|admin| admin.outcomes().is_empty()) {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(anyhow!("the configuration service did not install the layout within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(true);
    Ok(())
}

fn start_data(
    dir: &Path,
    net: &Net,
    map: &ShardMap,
    nodes: &[String],
    workload: &YcsbT,
    sync: bool,
) -> Result<Vec<(Running<DataCore>, watch::Sender<bool>)>> {
    let mut running = Vec::new();
    for name in nodes {
        let mut config = DataConfig::new(name, map.clone());
        config.config_replicas = config_names();
        config.session = format!("{name}@bench");
        config.sync = sync;
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::create_dir_all(dir.join(name))?);
        let (mut core, disk) = open_data_node(config, storage).map_err(|error| anyhow!("{name}: {error}"))?;
        crate::kv::KvWorkload::load(workload, &mut |k, v| {
            core.load(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v))
        });
        let mailbox = Mailbox::<DataCore>::new();
        net.publish(name, Host::new().with::<Dkv>(mailbox.handler()))?;
        let (stop, stopped) = watch::channel(false);
        running.push((mailbox.run(name.clone(), core, net.transport(), disk, stopped), stop));
    }
    Ok(running)
}

fn start_clients(net: &Net, map: &ShardMap, clients: usize) -> Vec<(Running<TxnClient>, watch::Sender<bool>)> {
    (0..clients)
        .map(|index| {
            let mut config = TxnClientConfig::new(index as u32 + 1, map.clone());
            config.keep_results = false;
            config.config_replicas = config_names();
            // One transaction in flight per client (the default), as each engine thread has:
            // abort rates compare at the same concurrency. The window is the client's queue.
            // Clients serve nothing: no server of their own.
            let name = format!("client-{index}");
            let (stop, stopped) = watch::channel(false);
            (Mailbox::<TxnClient>::new().run(name, TxnClient::new(config), net.transport(), NoIo, stopped), stop)
        })
        .collect()
}

/// Committed, committed read-only, and aborts by reason, summed over the clients.
fn tally(clients: &[(Running<TxnClient>, watch::Sender<bool>)]) -> (u64, u64, BTreeMap<String, u64>) {
    let (mut committed, mut read_only, mut aborts) = (0, 0, BTreeMap::new());
    for (client, _) in clients {
        client.with_core(|client| {
            committed += client.stats().committed;
            read_only += client.stats().committed_read_only;
            for (reason, count) in &client.stats().aborts {
                *aborts.entry(reason.clone()).or_insert(0) += count;
            }
        });
    }
    (committed, read_only, aborts)
}

/// Keeps every client `window` programs ahead until `until`.
async fn feed(
    clients: &[(Running<TxnClient>, watch::Sender<bool>)],
    workload: &YcsbT,
    rngs: &mut [SmallRng],
    window: usize,
    until: Instant,
) {
    let value_size = workload.config().value_size;
    while Instant::now() < until {
        for ((client, _), rng) in clients.iter().zip(rngs.iter_mut()) {
            let missing = window.saturating_sub(client.with_core(TxnClient::outstanding));
            if missing > 0 {
                let programs = (0..missing).map(|_| program(&workload.draw(rng), value_size)).collect();
                client.input(ClientInput::Programs(programs));
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs the store embedded in this process on `workload` and reports.
pub fn run_store(config: &DkvBenchConfig, workload: &YcsbT) -> Result<DkvBenchReport> {
    anyhow::ensure!(config.replicas % 2 == 1, "replicas per shard must be odd, not {}", config.replicas);
    let dir = tempfile::tempdir().context("a scratch directory for the store's logs")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let (stop_servers, servers_stopped) = watch::channel(false);
        let net = match config.net {
            DkvNet::InProc => Net::InProc(InProc::new()),
            DkvNet::Grpc => Net::Grpc { grpc: Grpc::new(Default::default()), stop: servers_stopped },
        };
        let node_count = (config.shards as usize).max(config.replicas);
        let nodes: Vec<String> = (0..node_count).map(|index| format!("data-{index}")).collect();
        let f = (config.replicas - 1) / 2;
        let map = ShardMap::place(&nodes, Partitioning::Hash { shards: config.shards }, f)?;
        let config_roles = start_config(dir.path(), &net, config.sync)?;
        install(&map, &net).await?;
        let data = start_data(dir.path(), &net, &map, &nodes, workload, config.sync)?;
        let clients = start_clients(&net, &map, config.clients);
        let roles = Roles { config: config_roles, data, clients };
        let mut rngs: Vec<SmallRng> =
            (0..config.clients).map(|index| SmallRng::seed_from_u64(config.seed ^ (index as u64 + 1) << 32)).collect();
        let warm_until = Instant::now() + config.warmup;
        feed(&roles.clients, workload, &mut rngs, config.window, warm_until).await;
        let (committed_before, read_only_before, aborts_before) = tally(&roles.clients);
        let started = Instant::now();
        feed(&roles.clients, workload, &mut rngs, config.window, started + config.duration).await;
        let (committed, read_only, aborts) = tally(&roles.clients);
        let duration_s = started.elapsed().as_secs_f64();
        roles.stop();
        let _ = stop_servers.send(true);
        let mut reasons = aborts;
        for (reason, before) in aborts_before {
            if let Some(count) = reasons.get_mut(&reason) {
                *count -= before.min(*count);
            }
        }
        reasons.retain(|_, count| *count > 0);
        let committed = committed - committed_before;
        let aborted: u64 = reasons.values().sum();
        Ok(DkvBenchReport {
            shards: config.shards,
            replicas: config.replicas,
            data_nodes: node_count,
            clients: config.clients,
            sync: if config.sync { "group" } else { "none" },
            duration_s,
            committed,
            committed_read_only: read_only - read_only_before,
            committed_per_sec: committed as f64 / duration_s.max(1e-9),
            aborts: aborted,
            abort_rate: if committed + aborted == 0 { 0.0 } else { aborted as f64 / (committed + aborted) as f64 },
            abort_reasons: reasons,
        })
    })
}
