//! `virga bench dkv`: the distributed transactional store (virga-dkv) embedded in one
//! process, every role under the tokio driver with its log on files, against the
//! single-node engine on the same transactions and durability in the same run.
//!
//! The store: a configuration service of 3 replicas, `shards` shards of `replicas` replicas
//! placed round robin over `max(shards, replicas)` data nodes, and `clients` MILANA client
//! cores. Two ways to drive them:
//!
//! - [`run_store`] ([`programs`]): ycsb-t as client programs, each client kept `window`
//!   programs ahead with `in_flight` of them running at once (closed loop); a program's
//!   gets of one shard go out together.
//! - [`run_store_sessions`] ([`sessions`]): any [`KvWorkload`] (SmallBank, Retwis,
//!   transfers) through the client library's interactive transactions, one operation at a
//!   time, by the same runner (threads, retries, latency) as the single-node engine's.
//!
//! After a warm-up, the committed transactions and the aborted attempts are counted over the
//! measured time.

pub mod figures;
pub mod kairos;
pub mod kairos_scale;
mod programs;
pub mod scale;
mod sessions;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use bytes::Bytes;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::watch;
use virga_core::clock::SkewProfile;
use virga_core::device::{FileStorage, Storage};
use virga_dkv::client::{ReadOnlyValidation, TxnClient, TxnClientConfig};
use virga_dkv::kairos::{CacheConfig, CacheMode, CacheStats, ValidatorConfig, ValidatorCore};
use virga_dkv::service::{open_replica, ConfigClient, ConfigClientConfig, ConfigCore, ReplicaConfig};
use virga_dkv::shard::{open_data_node, DataConfig, DataCore};
use virga_dkv::Dkv;
use virga_dkv::{ConfigCommand, Partitioning, ShardMap};
use virga_net::driver::{Mailbox, Running};
use virga_net::role::NoIo;
use virga_net::{Grpc, Host, InProc, Transport};

use crate::kv::KvWorkload;

pub use self::programs::{program, run_store};
pub use self::sessions::{run_store_sessions, SessionRun};

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

/// Where the roles run on the machine's cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every role on one runtime over every core: servers and clients compete for them.
    #[default]
    Shared,
    /// The seed's topology scaled down: the servers (configuration replicas and data nodes)
    /// on a runtime of one thread, the clients and the validators (co-located with them, as
    /// the seed's) on another, so the servers saturate as machines of their own would.
    Split,
}

/// How the store runs.
#[derive(Clone, Debug)]
pub struct DkvBenchConfig {
    pub net: DkvNet,
    pub shards: u32,
    /// Replicas per shard (odd).
    pub replicas: usize,
    pub clients: usize,
    /// Programs each client is kept ahead (programs runs).
    pub window: usize,
    /// Programs each client runs at once (programs runs).
    pub in_flight: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Fsync each group of log records (`--sync group`) or not (`none`).
    pub sync: bool,
    pub seed: u64,
    /// Each client's clock is off by an offset drawn from this profile.
    pub skew: SkewProfile,
    pub validation: ReadOnlyValidation,
    /// KAIROS: the keys clients cache across transactions and the lease rule (clients and
    /// primaries alike); none by default.
    pub cache: CacheConfig,
    /// KAIROS: this many sharded validators (0: validation at the primaries).
    pub validators: usize,
    pub placement: Placement,
    /// How long versions stay readable behind the newest commit (`--snapshot-window`).
    pub snapshot_window: Duration,
}

impl DkvBenchConfig {
    /// The seed's store: 3 shards × 3 replicas, group commit, in process, local validation.
    pub fn new(clients: usize, duration: Duration, seed: u64) -> DkvBenchConfig {
        DkvBenchConfig {
            net: DkvNet::InProc,
            shards: 3,
            replicas: 3,
            clients,
            window: 4,
            in_flight: 1,
            warmup: Duration::from_secs(1),
            duration,
            sync: true,
            seed,
            skew: SkewProfile::None,
            validation: ReadOnlyValidation::Local,
            cache: CacheConfig::default(),
            validators: 0,
            placement: Placement::Shared,
            snapshot_window: virga_dkv::shard::DEFAULT_SNAPSHOT_WINDOW,
        }
    }
}

/// What one run of the store measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DkvBenchReport {
    pub workload: String,
    pub shards: u32,
    pub replicas: usize,
    pub data_nodes: usize,
    pub clients: usize,
    pub sync: &'static str,
    pub skew: &'static str,
    pub validation: &'static str,
    pub duration_s: f64,
    pub committed: u64,
    pub committed_read_only: u64,
    pub committed_per_sec: f64,
    /// Aborted attempts, and their share of all attempts.
    pub aborts: u64,
    pub abort_rate: f64,
    pub abort_reasons: BTreeMap<String, u64>,
    /// Mean latency of committed transactions, start of the committed attempt to commit
    /// (programs: by kind; sessions: first attempt to commit, all kinds).
    pub mean_latency_us: f64,
    pub read_only_mean_us: f64,
    pub read_write_mean_us: f64,
    /// Requests the clients sent to primaries per committed transaction (gets, scans,
    /// prepares, and decisions: the round trips of the protocol).
    pub requests_per_commit: f64,
    /// KAIROS: sharded validators, and the requests clients sent them (validations and
    /// releases) per committed transaction.
    pub validators: usize,
    pub validator_requests_per_commit: f64,
    /// KAIROS (zero without caching): the lease rule; reads of cacheable keys, those the
    /// caches served, and the hits validation found stale; per read of a cacheable key, the
    /// hit, fresh-hit and stale rates; the share of all reads the caches served.
    pub cache: String,
    pub cache_reads: u64,
    pub cache_hits: u64,
    pub stale_hits: u64,
    pub hit_rate: f64,
    pub fresh_hit_rate: f64,
    pub stale_rate: f64,
    pub hits_of_all_reads: f64,
    /// Leases the primaries handed out, by length: `[lower bound in ms, count]` for lengths
    /// in [2^k, 2^(k+1)) µs.
    pub lease_lengths: Vec<(f64, u64)>,
}

/// A role running under the driver, and its stop switch.
struct Runner<R: virga_net::role::Role> {
    running: Running<R>,
    stop: watch::Sender<bool>,
}

/// Every role of a store started for one run.
struct Roles {
    config: Vec<Runner<ConfigCore>>,
    data: Vec<Runner<DataCore>>,
    clients: Vec<Runner<TxnClient>>,
    validators: Vec<Runner<ValidatorCore>>,
    data_nodes: usize,
    /// Stops the gRPC servers.
    servers: watch::Sender<bool>,
}

impl Roles {
    fn stop(&self) {
        let switches = self.config.iter().map(|r| &r.stop).chain(self.data.iter().map(|r| &r.stop));
        let switches = switches.chain(self.validators.iter().map(|r| &r.stop));
        for stop in switches.chain(self.clients.iter().map(|r| &r.stop)) {
            let _ = stop.send(true);
        }
        let _ = self.servers.send(true);
    }

    /// The clients' counters, summed.
    fn client_stats(&self) -> virga_dkv::client::ClientStats {
        let mut total = virga_dkv::client::ClientStats::default();
        for client in &self.clients {
            client.running.with_core(|client| add_stats(&mut total, client.stats()));
        }
        total
    }

    /// The clients' cache counters, summed.
    fn cache_stats(&self) -> CacheStats {
        let mut total = CacheStats::default();
        for client in &self.clients {
            client.running.with_core(|client| {
                let stats = client.cache_stats();
                total.reads += stats.reads;
                total.hits += stats.hits;
                total.stale += stats.stale;
                total.expired += stats.expired;
                total.fills += stats.fills;
                total.invalidations += stats.invalidations;
            });
        }
        total
    }

    /// The leases every primary handed out, by length bucket.
    fn lease_lengths(&self) -> BTreeMap<u32, u64> {
        let mut total = BTreeMap::new();
        for node in &self.data {
            node.running.with_core(|core| {
                for (bucket, count) in core.lease_lengths() {
                    *total.entry(*bucket).or_insert(0) += count;
                }
            });
        }
        total
    }

    /// What the caches and primaries did between two readings.
    fn cache_delta(&self, before: &CacheStats) -> CacheStats {
        let after = self.cache_stats();
        CacheStats {
            reads: after.reads - before.reads.min(after.reads),
            hits: after.hits - before.hits.min(after.hits),
            stale: after.stale - before.stale.min(after.stale),
            expired: after.expired - before.expired.min(after.expired),
            fills: after.fills - before.fills.min(after.fills),
            invalidations: after.invalidations - before.invalidations.min(after.invalidations),
        }
    }
}

fn add_stats(total: &mut virga_dkv::client::ClientStats, stats: &virga_dkv::client::ClientStats) {
    total.committed += stats.committed;
    total.committed_read_only += stats.committed_read_only;
    for (reason, count) in &stats.aborts {
        *total.aborts.entry(reason.clone()).or_insert(0) += count;
    }
    total.gets += stats.gets;
    total.keys_read += stats.keys_read;
    total.scans += stats.scans;
    total.prepares += stats.prepares;
    total.validations += stats.validations;
    total.decisions += stats.decisions;
    total.validator_validations += stats.validator_validations;
    total.releases += stats.releases;
    total.validator_fallbacks += stats.validator_fallbacks;
    total.validator_takeovers += stats.validator_takeovers;
    total.commit_latency_read_only.merge(&stats.commit_latency_read_only);
    total.commit_latency_read_write.merge(&stats.commit_latency_read_write);
}

fn config_names() -> Vec<String> {
    (1..=3).map(|id| format!("config-{id}")).collect()
}

fn start_config(dir: &Path, net: &Net, sync: bool) -> Result<Vec<Runner<ConfigCore>>> {
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
        running.push(Runner { running: mailbox.run(name.clone(), core, net.transport(), disk, stopped), stop });
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
    workload: &dyn LoadInto,
    bench: &DkvBenchConfig,
) -> Result<Vec<Runner<DataCore>>> {
    let mut running = Vec::new();
    for name in nodes {
        let mut config = DataConfig::new(name, map.clone());
        config.config_replicas = config_names();
        config.session = format!("{name}@bench");
        config.sync = bench.sync;
        config.cache = bench.cache.mode;
        config.snapshot_window = bench.snapshot_window;
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::create_dir_all(dir.join(name))?);
        let (mut core, disk) = open_data_node(config, storage).map_err(|error| anyhow!("{name}: {error}"))?;
        workload.load_into(&mut |k, v| core.load(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)));
        let mailbox = Mailbox::<DataCore>::new();
        net.publish(name, Host::new().with::<Dkv>(mailbox.handler()))?;
        let (stop, stopped) = watch::channel(false);
        running.push(Runner { running: mailbox.run(name.clone(), core, net.transport(), disk, stopped), stop });
    }
    Ok(running)
}

/// A workload's initial data, whatever its transactions' type.
trait LoadInto {
    fn load_into(&self, sink: &mut dyn FnMut(&[u8], &[u8]));
}

impl<W: KvWorkload> LoadInto for W {
    fn load_into(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        self.load(sink)
    }
}

fn start_clients(config: &DkvBenchConfig, net: &Net, map: &ShardMap) -> Result<Vec<Runner<TxnClient>>> {
    (0..config.clients)
        .map(|index| {
            let id = index as u32 + 1;
            let mut client = TxnClientConfig::new(id, map.clone());
            client.keep_results = false;
            client.config_replicas = config_names();
            // One transaction in flight per client by default, as each engine thread has:
            // abort rates compare at the same concurrency.
            client.programs_in_flight = config.in_flight;
            client.read_only_validation = config.validation;
            client.clock_offset_ns = config.skew.draw(u64::from(id), config.seed).offset_ns;
            client.cache = config.cache.clone();
            client.validators = validator_names(config.validators);
            let name = format!("client-{index}");
            let mailbox = Mailbox::<TxnClient>::new();
            // A client serves nothing but EI's callbacks: a server of its own only then.
            if config.cache.mode == CacheMode::Ei {
                net.publish(&name, Host::new().with::<Dkv>(mailbox.handler()))?;
            }
            let (stop, stopped) = watch::channel(false);
            let running = mailbox.run(name, TxnClient::new(client), net.transport(), NoIo, stopped);
            Ok(Runner { running, stop })
        })
        .collect()
}

fn validator_names(count: usize) -> Vec<String> {
    (0..count as u32).map(virga_dkv::kairos::validator_name).collect()
}

/// KAIROS's validators, standing alone (each a role of its own, as a data node is).
fn start_validators(net: &Net, map: &ShardMap, count: usize) -> Result<Vec<Runner<ValidatorCore>>> {
    validator_names(count)
        .into_iter()
        .enumerate()
        .map(|(index, name)| {
            let mut config = ValidatorConfig::new(index as u32, map.clone());
            config.config_replicas = config_names();
            let mailbox = Mailbox::<ValidatorCore>::new();
            net.publish(&name, Host::new().with::<Dkv>(mailbox.handler()))?;
            let (stop, stopped) = watch::channel(false);
            let running = mailbox.run(name, ValidatorCore::new(config), net.transport(), NoIo, stopped);
            Ok(Runner { running, stop })
        })
        .collect()
}

/// Runs `start` with its tasks spawned on `servers` when given (the split placement), else
/// on the current runtime.
fn on_servers<T>(servers: Option<&Handle>, start: impl FnOnce() -> T) -> T {
    match servers {
        Some(handle) => {
            let _entered = handle.enter();
            start()
        }
        None => start(),
    }
}

/// The runtimes of a run: the clients' (which drives the run), and the servers' when the
/// placement splits them.
fn runtimes(placement: Placement) -> Result<(tokio::runtime::Runtime, Option<tokio::runtime::Runtime>)> {
    let build = |threads: usize, name: &str| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).thread_name(name).enable_all().build()
    };
    Ok(match placement {
        Placement::Shared => (build(2, "store")?, None),
        Placement::Split => (build(1, "clients")?, Some(build(1, "servers")?)),
    })
}

/// Starts a store holding `workload`'s initial data (call within the clients' runtime;
/// the servers' tasks go to `servers` when given).
async fn start_store(
    config: &DkvBenchConfig,
    dir: &Path,
    workload: &dyn LoadInto,
    servers_runtime: Option<&Handle>,
) -> Result<Roles> {
    anyhow::ensure!(config.replicas % 2 == 1, "replicas per shard must be odd, not {}", config.replicas);
    let (servers, servers_stopped) = watch::channel(false);
    let net = match config.net {
        DkvNet::InProc => Net::InProc(InProc::new()),
        DkvNet::Grpc => Net::Grpc { grpc: Grpc::new(Default::default()), stop: servers_stopped },
    };
    let data_nodes = (config.shards as usize).max(config.replicas);
    let nodes: Vec<String> = (0..data_nodes).map(|index| format!("data-{index}")).collect();
    let f = (config.replicas - 1) / 2;
    let map = ShardMap::place(&nodes, Partitioning::Hash { shards: config.shards }, f)?;
    let config_roles = on_servers(servers_runtime, || start_config(dir, &net, config.sync))?;
    install(&map, &net).await?;
    let data = on_servers(servers_runtime, || start_data(dir, &net, &map, &nodes, workload, config))?;
    let validators = start_validators(&net, &map, config.validators)?;
    let clients = start_clients(config, &net, &map)?;
    Ok(Roles { config: config_roles, data, clients, validators, data_nodes, servers })
}

/// A report of `committed`, `aborts`, the clients' requests and their caches over
/// `duration_s`.
fn report(
    config: &DkvBenchConfig,
    workload: &str,
    data_nodes: usize,
    duration_s: f64,
    delta: &virga_dkv::client::ClientStats,
    cache: (&CacheStats, &BTreeMap<u32, u64>),
) -> DkvBenchReport {
    let (cache, lease_lengths) = cache;
    let per_cacheable_read = |count: u64| count as f64 / cache.reads.max(1) as f64;
    let aborts: u64 = delta.aborts.values().sum();
    let committed = delta.committed;
    let mean_us = |histogram: &virga_dkv::metrics::LatencyHistogram| {
        histogram.sum_seconds() * 1e6 / histogram.count().max(1) as f64
    };
    let latency_sum = delta.commit_latency_read_only.sum_seconds() + delta.commit_latency_read_write.sum_seconds();
    // EI's callbacks are messages the primaries send the clients.
    let requests =
        delta.gets + delta.scans + delta.prepares + delta.validations + delta.decisions + cache.invalidations;
    DkvBenchReport {
        workload: workload.to_string(),
        shards: config.shards,
        replicas: config.replicas,
        data_nodes,
        clients: config.clients,
        sync: if config.sync { "group" } else { "none" },
        skew: config.skew.name(),
        validation: match config.validation {
            ReadOnlyValidation::Local => "local",
            ReadOnlyValidation::Remote => "remote",
            ReadOnlyValidation::Validate => "validate",
        },
        duration_s,
        committed,
        committed_read_only: delta.committed_read_only,
        committed_per_sec: committed as f64 / duration_s.max(1e-9),
        aborts,
        abort_rate: if committed + aborts == 0 { 0.0 } else { aborts as f64 / (committed + aborts) as f64 },
        abort_reasons: delta.aborts.clone(),
        mean_latency_us: latency_sum * 1e6 / committed.max(1) as f64,
        read_only_mean_us: mean_us(&delta.commit_latency_read_only),
        read_write_mean_us: mean_us(&delta.commit_latency_read_write),
        requests_per_commit: requests as f64 / committed.max(1) as f64,
        validators: config.validators,
        validator_requests_per_commit: (delta.validator_validations + delta.releases) as f64 / committed.max(1) as f64,
        cache: config.cache.mode.name(),
        cache_reads: cache.reads,
        cache_hits: cache.hits,
        stale_hits: cache.stale,
        hit_rate: per_cacheable_read(cache.hits),
        fresh_hit_rate: per_cacheable_read(cache.hits - cache.stale.min(cache.hits)),
        stale_rate: per_cacheable_read(cache.stale),
        hits_of_all_reads: cache.hits as f64 / (cache.hits + delta.keys_read).max(1) as f64,
        lease_lengths: lease_lengths.iter().map(|(bucket, count)| ((1u64 << bucket) as f64 / 1000.0, *count)).collect(),
    }
}

/// `after - before`, counter by counter.
fn stats_delta(
    before: &virga_dkv::client::ClientStats,
    after: &virga_dkv::client::ClientStats,
) -> virga_dkv::client::ClientStats {
    let mut delta = after.clone();
    delta.committed -= before.committed.min(delta.committed);
    delta.committed_read_only -= before.committed_read_only.min(delta.committed_read_only);
    for (reason, count) in &before.aborts {
        if let Some(after) = delta.aborts.get_mut(reason) {
            *after -= (*count).min(*after);
        }
    }
    delta.aborts.retain(|_, count| *count > 0);
    delta.gets -= before.gets.min(delta.gets);
    delta.keys_read -= before.keys_read.min(delta.keys_read);
    delta.scans -= before.scans.min(delta.scans);
    delta.prepares -= before.prepares.min(delta.prepares);
    delta.validations -= before.validations.min(delta.validations);
    delta.decisions -= before.decisions.min(delta.decisions);
    delta.validator_validations -= before.validator_validations.min(delta.validator_validations);
    delta.releases -= before.releases.min(delta.releases);
    delta.validator_fallbacks -= before.validator_fallbacks.min(delta.validator_fallbacks);
    delta.validator_takeovers -= before.validator_takeovers.min(delta.validator_takeovers);
    delta.commit_latency_read_only.subtract(&before.commit_latency_read_only);
    delta.commit_latency_read_write.subtract(&before.commit_latency_read_write);
    delta
}
