//! SEMEL/MILANA in the simulator: data nodes holding 3 shards of 3 replicas, and clients
//! moving money between accounts while auditing the total, under message loss,
//! duplication, reordering, partitions, skewed clocks and backup crashes.
//!
//! Checks: the committed history is serializable (virga-txn's dependency-graph checker over
//! every client's committed transactions, multi-shard), every committed audit and the final
//! state hold the initial total, every committed write is installed at its primary, and
//! every backup ends with every committed transaction of its shard.

use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_core::clock::SkewProfile;
use virga_core::device::{MemStorage, Storage};
use virga_net::role::{Command, Event, IoExecutor, Nanos, Role};
use virga_net::Dkv;
use virga_sim::{NetConfig, Partition, Sim, SimConfig, SimError};
use virga_storage::VersionedStore;
use virga_txn::checker;

use crate::client::{Program, ProgramOutcome, TxnClient, TxnClientConfig};
use crate::layout::{Partitioning, ReplicaRole, ShardMap};
use crate::shard::{open_data_node, DataConfig, DataCore, DataDisk, DataIo, DataIoDone, TxnStatus, Weakened};

/// Every account's balance at the start.
const INITIAL_BALANCE: u64 = 1000;

pub enum DkvNode {
    Data(Box<DataCore>),
    Client(Box<TxnClient>),
}

pub enum DkvDisk {
    Data(Box<DataDisk>),
    None,
}

impl IoExecutor<DkvNode> for DkvDisk {
    fn execute(&mut self, op: DataIo) -> DataIoDone {
        match self {
            DkvDisk::Data(disk) => disk.execute(op),
            DkvDisk::None => DataIoDone::Appended(Ok(0)),
        }
    }
}

impl Role for DkvNode {
    type Protocol = Dkv;
    type Io = DataIo;
    type IoDone = DataIoDone;
    type Input = Vec<Program>;

    fn step(&mut self, now: Nanos, event: Event<Dkv, DataIoDone, Vec<Program>>, out: &mut Vec<Command<Dkv, DataIo>>) {
        match self {
            DkvNode::Data(core) => {
                let event = match event {
                    Event::Input(_) => return,
                    Event::Start => Event::Start,
                    Event::Request { from, call, request } => Event::Request { from, call, request },
                    Event::Response { call, result } => Event::Response { call, result },
                    Event::Timer(timer) => Event::Timer(timer),
                    Event::IoDone { io, result } => Event::IoDone { io, result },
                };
                core.step(now, event, out);
            }
            DkvNode::Client(client) => {
                let event: Event<Dkv, Infallible, Vec<Program>> = match event {
                    Event::IoDone { .. } => return,
                    Event::Start => Event::Start,
                    Event::Request { from, call, request } => Event::Request { from, call, request },
                    Event::Response { call, result } => Event::Response { call, result },
                    Event::Timer(timer) => Event::Timer(timer),
                    Event::Input(programs) => Event::Input(programs),
                };
                let mut commands = Vec::new();
                client.step(now, event, &mut commands);
                out.extend(commands.into_iter().map(|command| match command {
                    Command::Call { to, call, request, deadline } => Command::Call { to, call, request, deadline },
                    Command::Reply { to, call, response } => Command::Reply { to, call, response },
                    Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
                    Command::Io { op, .. } => match op {},
                }));
            }
        }
    }
}

/// Deliberately broken variants the checks must catch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weakening {
    /// Primaries skip the `latestRead >= ts_commit` check of Algorithm 1.
    pub skip_latest_read: bool,
    /// Read-only transactions commit without local validation.
    pub skip_local_validation: bool,
    /// Cooperative termination commits although a participant never prepared.
    pub terminate_ignoring_missing_prepare: bool,
}

impl Weakening {
    /// The name `--weaken` takes, if any.
    pub fn name(&self) -> Option<&'static str> {
        match (self.skip_latest_read, self.skip_local_validation, self.terminate_ignoring_missing_prepare) {
            (false, false, false) => None,
            (true, false, false) => Some("skip-latest-read"),
            (false, true, false) => Some("skip-local-validation"),
            (false, false, true) => Some("terminate-ignoring-missing-prepare"),
            _ => Some("several"),
        }
    }
}

/// How one seed runs.
#[derive(Debug, Clone)]
pub struct TxnRunOptions {
    pub seed: u64,
    pub shards: u32,
    pub data_nodes: usize,
    pub clients: usize,
    pub accounts: usize,
    /// Programs per client; every fourth is an audit of all accounts.
    pub programs: usize,
    pub faults: bool,
    pub fault_window: Duration,
    pub settle: Duration,
    pub clock: SkewProfile,
    /// Clients that crash for good during the fault window (their prepared transactions
    /// are then terminated by the primaries).
    pub client_crashes: bool,
    pub weakening: Weakening,
}

impl TxnRunOptions {
    pub fn new(seed: u64) -> TxnRunOptions {
        TxnRunOptions {
            seed,
            shards: 3,
            data_nodes: 6,
            clients: 3,
            accounts: 12,
            programs: 60,
            faults: true,
            fault_window: Duration::from_secs(2),
            settle: Duration::from_secs(20),
            clock: SkewProfile::Ntp,
            client_crashes: true,
            weakening: Weakening::default(),
        }
    }

    pub fn replay_command(&self) -> String {
        let weaken = self.weakening.name().map(|name| format!(" --weaken {name}")).unwrap_or_default();
        format!("virga sim dkv --seeds 1 --first-seed {}{weaken}", self.seed)
    }
}

/// What a run showed.
#[derive(Debug, Clone, Default)]
pub struct TxnRunReport {
    pub seed: u64,
    pub violations: Vec<String>,
    pub programs: usize,
    pub committed: u64,
    pub committed_read_only: u64,
    pub aborted_attempts: u64,
    /// Programs that aborted on every attempt.
    pub gave_up: usize,
    pub crashes: usize,
    pub client_crashes: usize,
    /// Transactions a primary terminated (cooperative termination), and those of them
    /// committed with no word from their client.
    pub terminations: u64,
    pub committed_by_termination: usize,
    pub partitions: usize,
    pub virtual_ms: u64,
    pub events: u64,
    pub trace_digest: u64,
}

impl TxnRunReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn ns(duration: Duration) -> u64 {
    duration.as_nanos() as u64
}

fn account(index: usize) -> Bytes {
    Bytes::from(format!("acct-{index:03}"))
}

struct Cluster {
    map: ShardMap,
    data: Vec<String>,
    clients: Vec<String>,
    /// Data nodes that are primary of no shard (the ones that may crash: a primary's crash
    /// needs failover, which comes with recovery).
    backups_only: Vec<String>,
}

fn cluster(options: &TxnRunOptions) -> Result<Cluster, String> {
    let data: Vec<String> = (0..options.data_nodes).map(|index| format!("data-{index}")).collect();
    let map =
        ShardMap::place(&data, Partitioning::Hash { shards: options.shards }, 1).map_err(|error| error.to_string())?;
    let backups_only = data
        .iter()
        .filter(|node| map.shards_of_node(node).iter().all(|(_, role)| *role == ReplicaRole::Backup))
        .cloned()
        .collect();
    let clients = (0..options.clients).map(|index| format!("client-{index}")).collect();
    Ok(Cluster { map, data, clients, backups_only })
}

type Disks = Rc<RefCell<HashMap<String, MemStorage>>>;

fn open_node(
    options: &TxnRunOptions,
    cluster: &Cluster,
    disks: &Disks,
    id: &str,
) -> (DkvNode, Box<dyn IoExecutor<DkvNode>>) {
    if let Some(index) = cluster.clients.iter().position(|client| client == id) {
        let mut config = TxnClientConfig::new(index as u32 + 1, cluster.map.clone());
        config.skip_local_validation = options.weakening.skip_local_validation;
        return (DkvNode::Client(Box::new(TxnClient::new(config))), Box::new(DkvDisk::None));
    }
    let mut config = DataConfig::new(id, cluster.map.clone());
    config.weakened = Weakened {
        skip_latest_read: options.weakening.skip_latest_read,
        terminate_ignoring_missing_prepare: options.weakening.terminate_ignoring_missing_prepare,
    };
    let storage: Arc<dyn Storage> = Arc::new(disks.borrow_mut().entry(id.to_string()).or_default().clone());
    match open_data_node(config, storage) {
        Ok((mut core, disk)) => {
            // Initial balances, as loaded data (version zero) on every replica.
            for index in 0..options.accounts {
                core.load(account(index), Bytes::from(INITIAL_BALANCE.to_string()));
            }
            (DkvNode::Data(Box::new(core)), Box::new(DkvDisk::Data(Box::new(disk))))
        }
        // A memory device always opens, and its records are the node's own.
        Err(error) => unreachable!("{id} does not reopen: {error}"),
    }
}

/// The programs of one client: transfers between random accounts, every fourth an audit.
fn programs(rng: &mut StdRng, options: &TxnRunOptions) -> Vec<Program> {
    let all: Vec<Bytes> = (0..options.accounts).map(account).collect();
    (0..options.programs)
        .map(|index| {
            if index % 4 == 3 {
                Program::Audit(all.clone())
            } else {
                let from = rng.random_range(0..options.accounts);
                let to = (from + rng.random_range(1..options.accounts)) % options.accounts;
                Program::Transfer { from: account(from), to: account(to), amount: rng.random_range(1..200) }
            }
        })
        .collect()
}

/// The seed's crashes: (at, back, node) for backups; (at, client) for clients, for good.
type Crashes = (Vec<(u64, u64, String)>, Vec<(u64, String)>);

fn sim_config(options: &TxnRunOptions, rng: &mut StdRng, cluster: &Cluster) -> (SimConfig, Crashes) {
    let mut net = NetConfig {
        latency_min: Duration::from_micros(100),
        latency_max: Duration::from_millis(2),
        ..NetConfig::default()
    };
    let mut crashes = Vec::new();
    if options.faults {
        let window = ns(options.fault_window);
        net.drop_probability = rng.random_range(0.0..0.03);
        net.duplicate_probability = rng.random_range(0.0..0.03);
        let everyone: Vec<String> = cluster.data.iter().chain(&cluster.clients).cloned().collect();
        for _ in 0..rng.random_range(0..=2) {
            let start = rng.random_range(0..window / 2);
            let end = start + rng.random_range(ns(Duration::from_millis(50))..ns(Duration::from_millis(400)));
            let cut = everyone[rng.random_range(0..everyone.len())].clone();
            let rest = everyone.iter().filter(|node| **node != cut).cloned().collect();
            net.partitions.push(Partition { start_ns: start, end_ns: end, side_a: vec![cut], side_b: rest });
        }
        for _ in 0..rng.random_range(0..=2) {
            if cluster.backups_only.is_empty() {
                break;
            }
            let at = rng.random_range(ns(Duration::from_millis(50))..window);
            let back = at + rng.random_range(ns(Duration::from_millis(20))..ns(Duration::from_millis(300)));
            crashes.push((at, back, cluster.backups_only[rng.random_range(0..cluster.backups_only.len())].clone()));
        }
    }
    let mut client_crashes = Vec::new();
    if options.faults && options.client_crashes && rng.random_bool(0.5) {
        let at = rng.random_range(ns(Duration::from_millis(20))..ns(options.fault_window));
        client_crashes.push((at, cluster.clients[rng.random_range(0..cluster.clients.len())].clone()));
    }
    let config = SimConfig {
        seed: options.seed,
        net,
        device_latency: Duration::from_millis(1),
        clock_profile: options.clock,
        max_events: Some(5_000_000),
    };
    (config, (crashes, client_crashes))
}

/// Runs one seed and checks it.
pub fn run_txn(options: &TxnRunOptions) -> Result<TxnRunReport, SimError> {
    let cluster = cluster(options).map_err(|reason| SimError::InvalidConfig { field: "layout".into(), reason })?;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let (config, (crashes, client_crashes)) = sim_config(options, &mut rng, &cluster);
    let partitions = config.net.partitions.len();
    let mut sim: Sim<DkvNode> = Sim::new(config)?;
    let disks: Disks = Rc::new(RefCell::new(HashMap::new()));
    for id in cluster.data.iter().chain(&cluster.clients) {
        let (core, io) = open_node(options, &cluster, &disks, id);
        sim.add_node(id.clone(), core, io)?;
    }
    let cluster = Rc::new(cluster);
    let (factory_options, factory_cluster, factory_disks) = (options.clone(), Rc::clone(&cluster), Rc::clone(&disks));
    sim.set_factory(move |id| open_node(&factory_options, &factory_cluster, &factory_disks, id));
    let crash_disks = Rc::clone(&disks);
    sim.set_on_crash(move |id, rng| {
        if let Some(storage) = crash_disks.borrow_mut().get_mut(id) {
            *storage = storage.crash_with(rng);
        }
    });
    for (at, back, id) in &crashes {
        sim.crash_at(*at, id)?;
        sim.restart_at(*back, id)?;
    }
    for (at, id) in &client_crashes {
        sim.crash_at(*at, id)?;
    }
    for client in &cluster.clients {
        sim.input_at(ns(Duration::from_millis(1)), client, programs(&mut rng, options))?;
    }
    let window = ns(options.fault_window);
    let mut seen = ClientViews::default();
    sim.run_while(window + ns(options.settle), |sim| {
        seen.observe(sim, &cluster.clients);
        sim.now() < window || !settled(sim, &cluster)
    });
    seen.observe(&sim, &cluster.clients);
    let mut report = TxnRunReport {
        seed: options.seed,
        partitions,
        crashes: crashes.len(),
        client_crashes: client_crashes.len(),
        virtual_ms: sim.now() / 1_000_000,
        events: sim.stats().events,
        trace_digest: sim.trace_digest(),
        ..TxnRunReport::default()
    };
    check_run(&sim, &cluster, options, &seen, &mut report);
    Ok(report)
}

/// What each client had done, as last seen before it crashed (or at the end).
#[derive(Default)]
struct ClientViews {
    views: HashMap<String, ClientView>,
}

#[derive(Default)]
struct ClientView {
    results: Vec<crate::client::ProgramResult>,
    history: Vec<checker::TxnRecord>,
    attempts: Vec<checker::TxnRecord>,
    committed: u64,
    committed_read_only: u64,
    aborts: u64,
    outstanding: usize,
    up: bool,
}

impl ClientViews {
    fn observe(&mut self, sim: &Sim<DkvNode>, clients: &[String]) {
        for id in clients {
            let view = self.views.entry(id.clone()).or_default();
            let Some(DkvNode::Client(client)) = sim.core(id) else {
                view.up = false;
                continue;
            };
            view.up = true;
            view.results.extend_from_slice(&client.results()[view.results.len()..]);
            view.history.extend_from_slice(&client.history()[view.history.len()..]);
            view.attempts.extend_from_slice(&client.attempts()[view.attempts.len()..]);
            view.committed = client.stats().committed;
            view.committed_read_only = client.stats().committed_read_only;
            view.aborts = client.stats().aborts.values().sum();
            view.outstanding = client.outstanding();
        }
    }
}

/// Every client has finished its programs and decisions, and every primary has replicated
/// all it holds.
fn settled(sim: &Sim<DkvNode>, cluster: &Cluster) -> bool {
    cluster.clients.iter().all(|id| matches!(sim.core(id), Some(DkvNode::Client(client)) if client.outstanding() == 0))
        && cluster.data.iter().all(
            |id| matches!(sim.core(id), Some(DkvNode::Data(core)) if core.replicating() == 0 && core.unlogged() == 0),
        )
}

fn check_run(
    sim: &Sim<DkvNode>,
    cluster: &Cluster,
    options: &TxnRunOptions,
    seen: &ClientViews,
    report: &mut TxnRunReport,
) {
    let total = INITIAL_BALANCE * options.accounts as u64;
    let mut history = Vec::new();
    let mut attempts = Vec::new();
    for id in &cluster.clients {
        let Some(view) = seen.views.get(id) else { continue };
        report.programs += view.results.len();
        report.committed += view.committed;
        report.committed_read_only += view.committed_read_only;
        report.aborted_attempts += view.aborts;
        if view.up && view.outstanding > 0 {
            report
                .violations
                .push(format!("liveness: {id} has {} programs or decisions outstanding", view.outstanding));
        }
        for result in &view.results {
            match &result.outcome {
                ProgramOutcome::Aborted { .. } => report.gave_up += 1,
                ProgramOutcome::Committed { txn, read_only: true, .. } if result.reads.len() == options.accounts => {
                    let sum: u64 = result.reads.iter().map(|(_, value)| crate::client::balance(value.as_ref())).sum();
                    if sum != total {
                        report
                            .violations
                            .push(format!("money: audit {txn:x} of {id} read a total of {sum}, not {total}"));
                    }
                }
                ProgramOutcome::Committed { .. } => {}
            }
        }
        history.extend(view.history.iter().cloned());
        attempts.extend(view.attempts.iter().cloned());
    }
    // Attempts their clients never heard the end of, committed by a primary's termination.
    let known: std::collections::HashSet<u64> = history.iter().map(|txn| txn.id).collect();
    for attempt in attempts.into_iter().filter(|attempt| !known.contains(&attempt.id)) {
        if committed_at_a_primary(sim, cluster, attempt.id) {
            report.committed_by_termination += 1;
            history.push(attempt);
        }
    }
    report.terminations = cluster
        .data
        .iter()
        .filter_map(|id| match sim.core(id) {
            Some(DkvNode::Data(core)) => Some(core.stats().terminations),
            _ => None,
        })
        .sum();
    if let Err(violation) = checker::check(&history) {
        report.violations.push(format!("serializability: {violation}"));
    }
    check_stores(sim, cluster, &history, total, report);
}

/// Whether some shard primary holds `txn` as committed.
fn committed_at_a_primary(sim: &Sim<DkvNode>, cluster: &Cluster, txn: u64) -> bool {
    cluster.map.groups().iter().enumerate().any(|(shard, group)| {
        matches!(sim.core(&group.primary), Some(DkvNode::Data(core))
            if core.replica(shard as u32).and_then(|replica| replica.txn(txn)).map(|entry| entry.status) == Some(TxnStatus::Committed))
    })
}

/// The primaries hold every committed write and the total; the backups every committed
/// transaction; nothing is left prepared.
fn check_stores(
    sim: &Sim<DkvNode>,
    cluster: &Cluster,
    history: &[checker::TxnRecord],
    total: u64,
    report: &mut TxnRunReport,
) {
    let map = &cluster.map;
    let mut sum = 0;
    for (index, group) in map.groups().iter().enumerate() {
        let shard = index as u32;
        let Some(DkvNode::Data(primary)) = sim.core(&group.primary) else {
            report.violations.push(format!("primary {} is down at the end", group.primary));
            continue;
        };
        let Some(replica) = primary.replica(shard) else { continue };
        replica.store().visit_range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, &mut |_, entry| {
            let newest = replica.store().read_at(entry, virga_storage::Timestamp::MAX);
            sum += crate::client::balance(newest.visible.and_then(|version| version.value).as_ref());
            true
        });
        for txn in history.iter().filter(|txn| !txn.writes.is_empty()) {
            for key in txn.writes.iter().filter(|key| map.shard_of(key).0 == shard) {
                let installed =
                    replica.store().find(key).and_then(|entry| replica.store().read_at(&entry, txn.commit_ts).visible);
                if installed.map(|version| version.writer) != Some(txn.id) {
                    report.violations.push(format!(
                        "durability: committed transaction {:x} is not installed on {key:?} at shard {shard}",
                        txn.id
                    ));
                }
            }
            let committed_here = txn.writes.iter().any(|key| map.shard_of(key).0 == shard);
            for backup in group.backups.iter().filter(|_| committed_here) {
                if let Some(DkvNode::Data(core)) = sim.core(backup) {
                    let status = core.replica(shard).and_then(|replica| replica.txn(txn.id)).map(|entry| entry.status);
                    if status != Some(TxnStatus::Committed) {
                        report.violations.push(format!(
                            "replication: backup {backup} of shard {shard} has transaction {:x} as {status:?}",
                            txn.id
                        ));
                    }
                }
            }
        }
        if replica.prepared_count() > 0 {
            report
                .violations
                .push(format!("shard {shard}: {} transactions still prepared at the end", replica.prepared_count()));
        }
    }
    if sum != total {
        report.violations.push(format!("money: the primaries end with a total of {sum}, not {total}"));
    }
    report.violations.truncate(20);
}
