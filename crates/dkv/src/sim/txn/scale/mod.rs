//! The store's throughput in virtual time (`virga sim dkv-scale`): the same cores as
//! everywhere, in the simulator with no fault, every role on a machine of a given number of
//! threads, each step costing what it costs the real cores on this machine
//! ([`StepCosts`], calibrated by [`calibrate`]), each call what the real driver and
//! transport cost ([`probe`]), each log append what this machine's disk takes. Clients run
//! a closed loop of programs (each kept `window` ahead, `in_flight` at once). A shape this
//! machine runs for real (every role on one 2-thread machine) checks the model against the
//! measured store; the seed's setting and larger ones are extrapolations.

mod costs;
// The probes run the real driver and transports, gRPC among them.
#[cfg(feature = "grpc")]
pub mod probe;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Dkv;
use bytes::Bytes;
use virga_core::device::{MemStorage, Storage};
use virga_net::role::{Command, Event, IoExecutor, Nanos, Role};
use virga_sim::{CostModel, NetConfig, Sim, SimConfig, SimError};

pub use self::costs::{calibrate, event_kind, StepCosts};
use super::node::{
    admin_node, client_node, config_node, data_node, txn_client, validator_node, DkvDisk, DkvInput, DkvIo, DkvIoDone,
    DkvNode,
};
use super::{cluster, ns, Cluster, TxnRunOptions, ADMIN};
use crate::client::{Program, ReadOnlyValidation, TxnClient, TxnClientConfig};
use crate::config::ConfigCommand;
use crate::kairos::{CacheConfig, ValidatorConfig, ValidatorCore};
use crate::service::{open_replica, ConfigClient, ConfigClientConfig, ReplicaConfig};
use crate::shard::{open_data_node, DataConfig};

/// Feeds every initial pair of a workload to its sink (each data node loads them all and
/// keeps its shards').
pub type Loader<'a> = dyn Fn(&mut dyn FnMut(Bytes, Bytes)) + 'a;

/// Where the roles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every role on one machine of `threads` threads (the embedded store on this machine).
    OneMachine { threads: usize },
    /// Each data node on a storage machine of its own (the configuration replicas on the
    /// first three), the clients spread round robin over `client_machines`.
    Spread { storage_threads: usize, client_machines: usize, client_threads: usize },
}

/// A cluster to simulate.
#[derive(Debug, Clone)]
pub struct ScaleShape {
    pub shards: u32,
    /// Data nodes (3 replicas a shard, placed round robin; at least 3).
    pub data_nodes: usize,
    pub clients: usize,
    /// Programs each client runs at once, and keeps queued.
    pub in_flight: usize,
    pub window: usize,
    pub placement: Placement,
    /// One-way message latency.
    pub latency: Duration,
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
    /// KAIROS: what the clients cache and the lease rule (clients and primaries).
    pub cache: CacheConfig,
    /// Where read-only transactions validate.
    pub validation: ReadOnlyValidation,
    /// KAIROS's sharded validators, co-located with the clients (0: none).
    pub validators: usize,
}

/// What a closed-loop run measured, in virtual time.
#[derive(Debug, Clone, Default)]
pub struct ScaleRun {
    pub committed: u64,
    pub committed_read_only: u64,
    pub aborted: u64,
    pub virtual_secs: f64,
    pub committed_per_sec: f64,
    pub events: u64,
    /// Mean CPU nanoseconds of a step, by role and event kind, over the whole run.
    pub steps: HashMap<(RoleKind, &'static str), (u64, u64)>,
}

/// A role, as costs are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoleKind {
    Config,
    Admin,
    Data,
    Client,
    Validator,
}

impl RoleKind {
    pub fn of(node: &str) -> RoleKind {
        if node.starts_with("data-") {
            RoleKind::Data
        } else if node.starts_with("client-") {
            RoleKind::Client
        } else if node.starts_with("config-") {
            RoleKind::Config
        } else if node.starts_with("validator-") {
            RoleKind::Validator
        } else {
            RoleKind::Admin
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RoleKind::Config => "config",
            RoleKind::Admin => "admin",
            RoleKind::Data => "data",
            RoleKind::Client => "client",
            RoleKind::Validator => "validator",
        }
    }
}

/// A role whose steps are timed (the wall clock of a single-threaded run: the calibration's
/// CPU time per step).
pub struct Timed {
    node: DkvNode,
    role: RoleKind,
    steps: HashMap<&'static str, (u64, u64)>,
}

impl Role for Timed {
    type Protocol = Dkv;
    type Io = DkvIo;
    type IoDone = DkvIoDone;
    type Input = DkvInput;

    fn step(&mut self, now: Nanos, event: Event<Dkv, DkvIoDone, DkvInput>, out: &mut Vec<Command<Dkv, DkvIo>>) {
        let kind = event_kind(&event);
        let started = Instant::now();
        self.node.step(now, event, out);
        let took = started.elapsed().as_nanos() as u64;
        let entry = self.steps.entry(kind).or_default();
        entry.0 += 1;
        entry.1 += took;
    }
}

struct TimedIo(Box<dyn IoExecutor<DkvNode>>);

impl IoExecutor<Timed> for TimedIo {
    fn execute(&mut self, op: DkvIo) -> DkvIoDone {
        self.0.execute(op)
    }
}

/// Opens `id` of the closed-loop cluster: replicas and data nodes on memory devices (the
/// data nodes holding `load`'s pairs), clients that keep no history.
fn open(shape: &ScaleShape, cluster: &Cluster, id: &str, load: &Loader<'_>) -> (DkvNode, Box<dyn IoExecutor<DkvNode>>) {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    if let Some(index) = cluster.clients.iter().position(|client| client == id) {
        let mut config = TxnClientConfig::new(index as u32 + 1, cluster.map.clone());
        config.config_replicas = cluster.config.clone();
        config.keep_results = false;
        config.programs_in_flight = shape.in_flight;
        config.cache = shape.cache.clone();
        config.read_only_validation = shape.validation;
        config.validators = cluster.validators.clone();
        return (client_node(TxnClient::new(config)), Box::new(DkvDisk::None));
    }
    if cluster.validators.iter().any(|validator| validator == id) {
        let mut config = ValidatorConfig::new(crate::kairos::validator_index(id).unwrap_or(0), cluster.map.clone());
        config.config_replicas = cluster.config.clone();
        return (validator_node(ValidatorCore::new(config)), Box::new(DkvDisk::None));
    }
    if id == ADMIN {
        let admin = ConfigClient::new(ConfigClientConfig::new(ADMIN, cluster.config.clone()));
        return (admin_node(admin), Box::new(DkvDisk::None));
    }
    if let Some(index) = cluster.config.iter().position(|replica| replica == id) {
        let peers = cluster.config.iter().enumerate().map(|(index, name)| (index as u64 + 1, name.clone())).collect();
        return match open_replica(ReplicaConfig::new(index as u64 + 1, peers, shape.seed ^ index as u64), storage) {
            Ok((core, disk)) => (config_node(core), Box::new(DkvDisk::Config(Box::new(disk)))),
            // A new memory device always opens.
            Err(error) => unreachable!("{id} does not open: {error}"),
        };
    }
    let mut config = DataConfig::new(id, cluster.map.clone());
    config.config_replicas = cluster.config.clone();
    config.session = format!("{id}@scale");
    config.cache = shape.cache.mode;
    match open_data_node(config, storage) {
        Ok((mut core, disk)) => {
            load(&mut |key, value| core.load(key, value));
            (data_node(core), Box::new(DkvDisk::Data(Box::new(disk))))
        }
        // A new memory device always opens.
        Err(error) => unreachable!("{id} does not open: {error}"),
    }
}

/// The machine and its threads of each role, as `placement` puts them.
fn machines(placement: Placement, cluster: &Cluster) -> Vec<(String, usize, usize)> {
    let admin = ADMIN.to_string();
    let everyone =
        cluster.config.iter().chain([&admin]).chain(&cluster.data).chain(&cluster.clients).chain(&cluster.validators);
    match placement {
        Placement::OneMachine { threads } => everyone.map(|id| (id.clone(), 0, threads)).collect(),
        Placement::Spread { storage_threads, client_machines, client_threads } => {
            let storage = cluster.data.len();
            let mut placed: Vec<(String, usize, usize)> =
                cluster.data.iter().enumerate().map(|(index, id)| (id.clone(), index, storage_threads)).collect();
            placed.extend(
                cluster.config.iter().enumerate().map(|(index, id)| (id.clone(), index % storage, storage_threads)),
            );
            placed.push((ADMIN.to_string(), 0, storage_threads));
            let machines = client_machines.max(1);
            placed.extend(
                cluster
                    .clients
                    .iter()
                    .enumerate()
                    .map(|(index, id)| (id.clone(), storage + index % machines, client_threads)),
            );
            // Validators share the clients' machines, as the seed co-locates them.
            placed.extend(
                cluster
                    .validators
                    .iter()
                    .enumerate()
                    .map(|(index, id)| (id.clone(), storage + index % machines, client_threads)),
            );
            placed
        }
    }
}

/// Runs `shape` under `costs` with programs from `next(client)` over `load`'s data.
pub fn run_closed_loop(
    shape: &ScaleShape,
    costs: impl CostModel<Timed> + 'static,
    load: &Loader<'_>,
    next: &mut dyn FnMut(usize) -> Program,
) -> Result<ScaleRun, SimError> {
    let options = TxnRunOptions {
        shards: shape.shards,
        data_nodes: shape.data_nodes,
        clients: shape.clients,
        validators: shape.validators,
        ..TxnRunOptions::new(shape.seed)
    };
    let cluster = cluster(&options)
        .map_err(|error| SimError::InvalidConfig { field: "layout".into(), reason: error.to_string() })?;
    let net = NetConfig { latency_min: shape.latency, latency_max: shape.latency, ..NetConfig::default() };
    let config = SimConfig {
        seed: shape.seed,
        net,
        device_latency: Duration::ZERO,
        clock_profile: virga_core::clock::SkewProfile::None,
        max_events: None,
    };
    let mut sim: Sim<Timed> = Sim::new(config)?;
    for (id, machine, threads) in machines(shape.placement, &cluster) {
        let (node, io) = open(shape, &cluster, &id, load);
        sim.add_node(
            id.clone(),
            Timed { node, role: RoleKind::of(&id), steps: HashMap::new() },
            Box::new(TimedIo(io)),
        )?;
        sim.place(&id, machine, threads)?;
    }
    sim.set_cost_model(costs);
    sim.input_at(1, ADMIN, DkvInput::Commands(vec![ConfigCommand::Install(cluster.map.clone())]))?;
    // The service elects a leader and installs the layout; the primaries take their shards.
    sim.run_until(ns(Duration::from_millis(800)));
    let tick = ns(Duration::from_millis(1));
    let feed = |sim: &mut Sim<Timed>, next: &mut dyn FnMut(usize) -> Program| -> Result<(), SimError> {
        for (index, client) in cluster.clients.iter().enumerate() {
            let outstanding =
                sim.core(client).and_then(|timed| txn_client(&timed.node)).map_or(0, TxnClient::outstanding);
            let missing = shape.window.max(shape.in_flight).saturating_sub(outstanding);
            if missing > 0 {
                sim.input(client, DkvInput::Programs((0..missing).map(|_| next(index)).collect()))?;
            }
        }
        Ok(())
    };
    let warm_until = sim.now() + ns(shape.warmup);
    while sim.now() < warm_until {
        feed(&mut sim, next)?;
        sim.run_until(sim.now() + tick);
    }
    let counts = |sim: &Sim<Timed>| {
        let mut totals = (0u64, 0u64, 0u64);
        for client in &cluster.clients {
            if let Some(stats) = sim.core(client).and_then(|timed| txn_client(&timed.node)).map(TxnClient::stats) {
                totals.0 += stats.committed;
                totals.1 += stats.committed_read_only;
                totals.2 += stats.aborts.values().sum::<u64>();
            }
        }
        totals
    };
    let (before, started, events_before) = (counts(&sim), sim.now(), sim.stats().events);
    let end = started + ns(shape.measure);
    while sim.now() < end {
        feed(&mut sim, next)?;
        sim.run_until(sim.now() + tick);
    }
    let after = counts(&sim);
    let virtual_secs = (sim.now() - started) as f64 / 1e9;
    let mut steps: HashMap<(RoleKind, &'static str), (u64, u64)> = HashMap::new();
    for id in sim.node_ids().map(str::to_string).collect::<Vec<_>>() {
        if let Some(timed) = sim.core(&id) {
            for (kind, (count, total)) in &timed.steps {
                let entry = steps.entry((timed.role, kind)).or_default();
                entry.0 += count;
                entry.1 += total;
            }
        }
    }
    let committed = after.0 - before.0;
    Ok(ScaleRun {
        committed,
        committed_read_only: after.1 - before.1,
        aborted: after.2 - before.2,
        virtual_secs,
        committed_per_sec: committed as f64 / virtual_secs.max(1e-9),
        events: sim.stats().events - events_before,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::TxnOp;

    fn tiny(placement: Placement) -> ScaleShape {
        ScaleShape {
            shards: 3,
            data_nodes: 3,
            clients: 8,
            in_flight: 1,
            window: 2,
            placement,
            latency: Duration::from_micros(20),
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(200),
            seed: 3,
            cache: CacheConfig::default(),
            validation: ReadOnlyValidation::Local,
            validators: 0,
        }
    }

    fn key(index: u64) -> Bytes {
        Bytes::from(format!("k{index:04}"))
    }

    fn load(sink: &mut dyn FnMut(Bytes, Bytes)) {
        (0..200).for_each(|index| sink(key(index), Bytes::from_static(b"v")));
    }

    /// Two reads, and every fourth program a write of a third key.
    fn next() -> impl FnMut(usize) -> Program {
        let mut count = 0u64;
        move |client| {
            count += 1;
            let base = (count * 7 + client as u64 * 13) % 200;
            let mut ops = vec![TxnOp::Get(key(base)), TxnOp::Get(key((base + 1) % 200))];
            if count % 4 == 0 {
                ops.push(TxnOp::Put(key((base + 2) % 200), Bytes::from_static(b"w")));
            }
            Program::Ops(ops)
        }
    }

    /// Every step of every role costs `step_us`, a call nothing more, an append 200 µs.
    fn flat(step_us: f64) -> StepCosts {
        let mut costs = StepCosts { append_ns: 200_000.0, ..StepCosts::default() };
        for role in [RoleKind::Config, RoleKind::Admin, RoleKind::Data, RoleKind::Client] {
            for kind in [
                "get",
                "get_many",
                "value",
                "values",
                "prepare",
                "vote",
                "decide",
                "ack",
                "replicate",
                "io_done",
                "timer",
            ] {
                costs.steps.insert((role, kind), step_us * 1000.0);
            }
        }
        costs
    }

    fn throughput(placement: Placement, costs: StepCosts) -> ScaleRun {
        run_closed_loop(&tiny(placement), costs, &load, &mut next()).unwrap()
    }

    #[test]
    fn the_cost_model_bounds_throughput_by_the_threads_that_run_the_steps() {
        let one = throughput(Placement::OneMachine { threads: 1 }, flat(20.0));
        let two = throughput(Placement::OneMachine { threads: 2 }, flat(20.0));
        let dearer = throughput(Placement::OneMachine { threads: 1 }, flat(40.0));
        assert!(one.committed > 100, "{one:?}");
        // CPU-bound on one thread: a second thread adds throughput, doubled costs take it away.
        assert!(
            two.committed_per_sec > 1.4 * one.committed_per_sec,
            "{} vs {}",
            two.committed_per_sec,
            one.committed_per_sec
        );
        let ratio = dearer.committed_per_sec / one.committed_per_sec;
        assert!((0.4..0.65).contains(&ratio), "doubling every step's cost: {ratio}");
        // Spread over machines of their own, the roles no longer share threads.
        let spread =
            throughput(Placement::Spread { storage_threads: 2, client_machines: 4, client_threads: 2 }, flat(20.0));
        assert!(
            spread.committed_per_sec > two.committed_per_sec,
            "{} vs {}",
            spread.committed_per_sec,
            two.committed_per_sec
        );
        // The timing wrapper saw the data nodes' gets and the clients' answers.
        assert!(
            one.steps.contains_key(&(RoleKind::Data, "get_many"))
                && one.steps.contains_key(&(RoleKind::Client, "values"))
        );
    }

    #[test]
    fn scaled_costs_scale_every_cpu_cost_but_not_the_disk() {
        let costs = flat(10.0).scaled(3.0);
        assert_eq!(costs.steps[&(RoleKind::Data, "get")], 30_000.0);
        assert_eq!(costs.append_ns, 200_000.0);
    }
}
