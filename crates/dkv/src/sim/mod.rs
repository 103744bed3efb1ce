//! The configuration service in the deterministic simulator (`virga-sim`): 3 or 5 replicas
//! and a client proposing layout changes, under a seeded schedule of message loss,
//! duplication, partitions and crashes that lose unsynced writes, and with media faults
//! (`--faults disk`) a latent sector error or misdirected writes on a replica that crashes;
//! the [`checks`] observe every event. The same seed gives the same run (the same trace
//! digest).

pub mod checks;
mod node;
pub mod txn;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_core::device::{MemStorage, Storage};
use virga_net::role::IoExecutor;
use virga_sim::media::{self, Kinds, Plans, Planted, Unopened};
use virga_sim::{NetConfig, Partition, Sim, SimConfig, SimError};

pub use self::checks::Observer;
use self::node::{client_node, replica_node, unopened_node};
pub use self::node::{ServiceDisk, ServiceNode};
use crate::config::ConfigCommand;
use crate::layout::{Partitioning, ShardId, ShardMap};
use crate::service::{open_replica, ConfigClient, ConfigClientConfig, ReplicaConfig};

/// The client's peer name.
pub const CLIENT: &str = "admin-0";

/// How one seed runs.
#[derive(Debug, Clone)]
pub struct ServiceRunOptions {
    pub seed: u64,
    /// 3 or 5.
    pub replicas: usize,
    /// Commands the client proposes (the first installs a layout).
    pub commands: usize,
    /// Message loss and duplication, partitions and crashes during the first `fault_window`.
    pub faults: bool,
    pub fault_window: Duration,
    /// How long after the faults the service has to answer everything and converge.
    pub settle: Duration,
    /// With `faults`, one replica that crashes and restarts also meets a media fault: a
    /// latent sector error while it is down, or misdirected writes just before its crash.
    pub media_faults: bool,
    /// The deliberately broken variant the checks must catch.
    pub unsafe_ack_before_write: bool,
    /// The broken variant of disk faults: a replica whose log refuses to open starts over
    /// on an empty one (as if its disk were replaced), with nothing it voted or
    /// acknowledged before.
    pub unsafe_rejoin_empty: bool,
    /// Each replica compacts its log behind a snapshot this many applied entries after
    /// the last one: few, so that compactions, crashes during them and snapshots sent to
    /// replicas left behind happen in every run.
    pub compact_every: u64,
}

impl ServiceRunOptions {
    pub fn new(seed: u64) -> ServiceRunOptions {
        ServiceRunOptions {
            seed,
            replicas: 3,
            commands: 24,
            faults: true,
            fault_window: Duration::from_secs(6),
            settle: Duration::from_secs(30),
            media_faults: false,
            unsafe_ack_before_write: false,
            unsafe_rejoin_empty: false,
            compact_every: 4,
        }
    }

    /// The command that replays this run, and only it: `virga sim config-service` runs seeds
    /// `--first-seed` onwards with the other fields at their defaults (as `new` sets them).
    pub fn replay_command(&self) -> String {
        let broken = match (self.unsafe_ack_before_write, self.unsafe_rejoin_empty) {
            (true, _) => " --broken ack-before-write",
            (false, true) => " --broken rejoin-empty",
            (false, false) => "",
        };
        let faults = match (self.faults, self.media_faults) {
            (false, _) => " --faults none",
            (true, true) => " --faults disk",
            (true, false) => "",
        };
        format!(
            "virga sim config-service --seeds 1 --first-seed {} --replicas {}{faults}{broken}",
            self.seed, self.replicas
        )
    }
}

/// What a run showed.
#[derive(Debug, Clone)]
pub struct ServiceRunReport {
    pub seed: u64,
    pub violations: Vec<String>,
    /// Commands the client got an outcome for, of those given.
    pub answered: usize,
    pub commands: usize,
    /// Of the answered, those the configuration refused (a stale epoch, …): still applied
    /// once, in log order.
    pub refused: usize,
    /// Terms in which a leader was elected.
    pub elections: usize,
    pub crashes: usize,
    /// Of the scheduled power failures, those that happened (each needs a write in flight).
    pub power_failures: usize,
    pub partitions: usize,
    /// The replicas' applied index at the end.
    pub applied_index: u64,
    /// `--faults disk`: the media fault planted (kind and replica), how many reads and
    /// writes it met, and the replicas whose storage then refused to open (each with why).
    pub media_fault: Option<String>,
    pub media_faults_fired: u64,
    pub unopened: Vec<String>,
    /// Over the replicas' last incarnations: compactions, and leaders' snapshots installed.
    pub compactions: u64,
    pub snapshots_installed: u64,
    pub virtual_ms: u64,
    pub events: u64,
    pub trace_digest: u64,
}

impl ServiceRunReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn ns(duration: Duration) -> u64 {
    duration.as_nanos() as u64
}

fn replica_names(replicas: usize) -> Vec<String> {
    (1..=replicas).map(|id| format!("config-{id}")).collect()
}

/// The seed of one incarnation of one node: distinct per (run, node, restart).
fn incarnation_seed(run: u64, node: &str, restart: u64) -> u64 {
    let mut seed = run ^ 0x9e37_79b9_7f4a_7c15;
    for byte in node.bytes().chain(restart.to_le_bytes()) {
        seed = (seed ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    seed
}

/// The client's commands: a layout over six data nodes, then failovers and backup changes
/// at the epochs the client expects (some will be stale, which the service refuses in order).
fn commands(rng: &mut StdRng, count: usize) -> Vec<ConfigCommand> {
    let nodes: Vec<String> = (0..6).map(|index| format!("data-{index}")).collect();
    let mut commands = Vec::with_capacity(count);
    let map = ShardMap::place(&nodes, Partitioning::Hash { shards: 4 }, 1);
    let Ok(mut map) = map else { return commands };
    commands.push(ConfigCommand::Install(map.clone()));
    let mut expected = crate::ConfigState::new();
    let _ = expected.apply(1, &ConfigCommand::Install(map.clone()));
    for index in 2..=count as u64 {
        let shard = ShardId(rng.random_range(0..4));
        let Some(group) = map.group(shard).cloned() else { break };
        let command = match rng.random_range(0..3) {
            0 if !group.backups.is_empty() => ConfigCommand::Failover {
                shard,
                epoch: group.epoch,
                new_primary: group.backups[rng.random_range(0..group.backups.len())].clone(),
            },
            1 if !group.backups.is_empty() => {
                ConfigCommand::RemoveBackup { shard, epoch: group.epoch, node: group.backups[0].clone() }
            }
            _ => {
                let outsider = nodes.iter().find(|node| !group.replicas().any(|member| member == *node));
                let node = outsider.cloned().unwrap_or_else(|| nodes[0].clone());
                ConfigCommand::AddBackup { shard, epoch: group.epoch, node }
            }
        };
        let _ = expected.apply(index, &command);
        if let Some(next) = expected.map() {
            map = next.clone();
        }
        commands.push(command);
    }
    commands
}

/// A seed's faults, all inside the fault window.
#[derive(Debug, Default)]
struct Schedule {
    net: NetConfig,
    /// (at, back, replica): one replica crashes and restarts.
    crashes: Vec<(u64, u64, String)>,
    /// (from, skip, down for): every replica crashes at once (a power failure) from `from` on,
    /// at the `skip`-th event seen with a log write in flight somewhere (so that it meets
    /// writes at every stage of a proposal, not only the first).
    power_failures: Vec<(u64, u32, u64)>,
    media_fault: Option<Planted>,
}

/// The seed's faults: network settings, partitions (one replica cut off, or a minority),
/// crashes with restarts, and power failures.
fn schedule(options: &ServiceRunOptions, rng: &mut StdRng, names: &[String]) -> Schedule {
    let net = NetConfig {
        latency_min: Duration::from_micros(100),
        latency_max: Duration::from_millis(3),
        ..NetConfig::default()
    };
    let mut schedule = Schedule { net, ..Schedule::default() };
    if !options.faults {
        return schedule;
    }
    let (net, crashes) = (&mut schedule.net, &mut schedule.crashes);
    let window = ns(options.fault_window);
    net.drop_probability = rng.random_range(0.0..0.05);
    net.duplicate_probability = rng.random_range(0.0..0.05);
    for _ in 0..rng.random_range(0..=3) {
        let start = rng.random_range(0..window / 2);
        let end = start + rng.random_range(ns(Duration::from_millis(200))..ns(Duration::from_millis(1500)));
        let cut = rng.random_range(1..=(names.len() - 1) / 2);
        let mut shuffled = names.to_vec();
        for position in (1..shuffled.len()).rev() {
            shuffled.swap(position, rng.random_range(0..=position));
        }
        let (side_a, side_b) = shuffled.split_at(cut);
        net.partitions.push(Partition {
            start_ns: start,
            end_ns: end,
            side_a: side_a.to_vec(),
            side_b: side_b.to_vec(),
        });
    }
    for _ in 0..rng.random_range(0..=4) {
        let at = rng.random_range(ns(Duration::from_millis(100))..window);
        let back = at + rng.random_range(ns(Duration::from_millis(50))..ns(Duration::from_millis(800)));
        crashes.push((at, back, names[rng.random_range(0..names.len())].clone()));
    }
    for _ in 0..rng.random_range(0..=2) {
        let from = rng.random_range(ns(Duration::from_millis(300))..window);
        let down = rng.random_range(ns(Duration::from_millis(20))..ns(Duration::from_millis(500)));
        schedule.power_failures.push((from, rng.random_range(0..60), down));
    }
    schedule.power_failures.sort_unstable();
    if options.media_faults {
        // Drawn after the rest, so a seed runs as it does without disk faults but for it.
        schedule.media_fault = media_fault(rng, names, &mut schedule.crashes, window);
    }
    schedule
}

/// The seed's media fault, on a replica that crashes and comes back (one crash is added
/// when the schedule has none). Lost writes are not among them: a replica cannot tell
/// records its device acknowledged and dropped at the log's end from records a crash cut
/// before their sync, and Raft's safety rests on a vote or an entry it acknowledged staying
/// on its disk (see docs/testing.md).
fn media_fault(
    rng: &mut StdRng,
    names: &[String],
    crashes: &mut Vec<(u64, u64, String)>,
    window: u64,
) -> Option<Planted> {
    let (crash_at, node) = match crashes.len() {
        0 => {
            let node = names.get(rng.random_range(0..names.len().max(1)))?.clone();
            let at = rng.random_range(ns(Duration::from_millis(100))..window.max(ns(Duration::from_millis(101))));
            let back = at + rng.random_range(ns(Duration::from_millis(50))..ns(Duration::from_millis(800)));
            crashes.push((at, back, node.clone()));
            (at, node)
        }
        count => {
            let (at, _, node) = &crashes[rng.random_range(0..count)];
            (*at, node.clone())
        }
    };
    Some(media::draw(rng, node, crash_at, Kinds::Detectable))
}

type Disks = Rc<RefCell<HashMap<String, MemStorage>>>;

fn open_node(
    options: &ServiceRunOptions,
    names: &[String],
    (disks, plans): (&Disks, &Plans),
    restarts: &mut HashMap<String, u64>,
    id: &str,
) -> (ServiceNode, Box<dyn IoExecutor<ServiceNode>>) {
    if id == CLIENT {
        let client = ConfigClient::new(ConfigClientConfig::new(
            format!("{CLIENT}.{}", restarts.get(id).copied().unwrap_or(0)),
            names.to_vec(),
        ));
        *restarts.entry(id.to_string()).or_default() += 1;
        return (client_node(client), Box::new(ServiceDisk::None));
    }
    let restart = restarts.entry(id.to_string()).or_default();
    let peers: Vec<(u64, String)> =
        names.iter().enumerate().map(|(index, name)| (index as u64 + 1, name.clone())).collect();
    let raft_id = peers.iter().find(|(_, name)| name == id).map_or(0, |(raft_id, _)| *raft_id);
    let mut config = ReplicaConfig::new(raft_id, peers, incarnation_seed(options.seed, id, *restart));
    *restart += 1;
    config.keep_history = true;
    config.compact_every = options.compact_every;
    config.unsafe_ack_before_write = options.unsafe_ack_before_write;
    let disk = disks.borrow_mut().entry(id.to_string()).or_default().clone();
    let storage: std::sync::Arc<dyn Storage> = media::storage_of(id, disk, plans);
    let opened = match open_replica(config.clone(), storage) {
        Err(_) if options.unsafe_rejoin_empty => {
            // The broken variant: a new, empty disk, and the faults of the old one gone.
            let fresh = MemStorage::new();
            disks.borrow_mut().insert(id.to_string(), fresh.clone());
            if let Some(plan) = plans.borrow().get(id) {
                plan.heal();
            }
            open_replica(config, media::storage_of(id, fresh, plans))
        }
        opened => opened,
    };
    match opened {
        Ok((core, disk)) => (replica_node(core), Box::new(ServiceDisk::Replica(Box::new(disk)))),
        // Only a media fault makes a memory device refuse to open: the replica stays down.
        Err(error) => (unopened_node(error.to_string()), Box::new(ServiceDisk::None)),
    }
}

/// The replicas and the client added, with the factory that reopens one after a crash from
/// its disk (which the crash hook crashes) through its fault plan.
fn build(
    options: &ServiceRunOptions,
    names: &[String],
    net: NetConfig,
) -> Result<(Sim<ServiceNode>, Disks, Plans), SimError> {
    let config =
        SimConfig { seed: options.seed, net, device_latency: Duration::from_millis(2), ..SimConfig::default() };
    let mut sim: Sim<ServiceNode> = Sim::new(config)?;
    let disks: Disks = Rc::new(RefCell::new(HashMap::new()));
    let plans: Plans = Rc::new(RefCell::new(HashMap::new()));
    let restarts = Rc::new(RefCell::new(HashMap::new()));
    for id in names.iter().map(String::as_str).chain([CLIENT]) {
        let (core, io) = open_node(options, names, (&disks, &plans), &mut restarts.borrow_mut(), id);
        sim.add_node(id, core, io)?;
    }
    let (factory_options, factory_names, factory_disks, factory_plans, factory_restarts) =
        (options.clone(), names.to_vec(), Rc::clone(&disks), Rc::clone(&plans), Rc::clone(&restarts));
    sim.set_factory(move |id| {
        let devices = (&factory_disks, &factory_plans);
        open_node(&factory_options, &factory_names, devices, &mut factory_restarts.borrow_mut(), id)
    });
    let crash_disks = Rc::clone(&disks);
    sim.set_on_crash(move |id, rng| {
        if let Some(storage) = crash_disks.borrow_mut().get_mut(id) {
            *storage = storage.crash_with(rng);
        }
    });
    Ok((sim, disks, plans))
}

/// Runs one seed and checks it.
pub fn run_service(options: &ServiceRunOptions) -> Result<ServiceRunReport, SimError> {
    let names = replica_names(options.replicas);
    let mut rng = StdRng::seed_from_u64(options.seed);
    let Schedule { net, crashes, mut power_failures, media_fault } = schedule(options, &mut rng, &names);
    let partitions = net.partitions.len();
    let (mut sim, disks, plans) = build(options, &names, net)?;
    for (at, back, id) in &crashes {
        sim.crash_at(*at, id)?;
        sim.restart_at(*back, id)?;
    }
    let commands = commands(&mut rng, options.commands);
    let given = commands.len();
    let window = ns(options.fault_window);
    for (part, chunk) in commands.chunks(given.div_ceil(4).max(1)).enumerate() {
        sim.input_at(ns(Duration::from_millis(300)) + window / 4 * part as u64, CLIENT, chunk.to_vec())?;
    }
    let mut observer = Observer::default();
    let limit = window + ns(options.settle);
    let mut power_failed = 0;
    let media_description = media_fault.as_ref().map(|planted| format!("{:?} on {}", planted.fault, planted.node));
    let mut planted = media_fault;
    loop {
        let mut due = None;
        sim.run_while(limit, |sim| {
            observer.observe(sim, &names);
            if planted.as_ref().is_some_and(|fault| sim.now() >= fault.at && media::plant(fault, &disks, &plans)) {
                planted = None;
            }
            if let Some((from, skip, down)) = power_failures.first_mut() {
                if sim.now() >= *from && names.iter().any(|id| writing(sim, id)) {
                    if *skip > 0 {
                        *skip -= 1;
                    } else {
                        due = Some(*down);
                        power_failures.remove(0);
                        return false;
                    }
                }
            }
            sim.now() < window || !settled(sim, &names)
        });
        let Some(down) = due else { break };
        power_failed += 1;
        let back = sim.now() + down;
        for id in &names {
            if sim.is_up(id) == Some(true) {
                sim.crash(id)?;
                sim.restart_at(back, id)?;
            }
        }
    }
    observer.observe(&sim, &names);
    let (answered, refused) = match sim.core(CLIENT).and_then(|node| node.role::<crate::service::ConfigClient>()) {
        Some(client) => {
            (client.outcomes().len(), client.outcomes().iter().filter(|outcome| !outcome.refusal.is_empty()).count())
        }
        _ => (0, 0),
    };
    if answered < given {
        observer.violations.push(format!("liveness: {answered} of {given} commands answered within the run"));
    }
    let unopened = unopened(&sim, &names);
    observer.check_end(&sim, &names, CLIENT);
    let applied_index = match sim.core(&names[0]).and_then(|node| node.role::<crate::service::ConfigCore>()) {
        Some(core) => core.applied().0,
        _ => 0,
    };
    let cores = names.iter().filter_map(|id| sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>()));
    let (compactions, snapshots_installed) = cores.fold((0, 0), |(compactions, installed), core| {
        (compactions + core.stats().compactions, installed + core.stats().snapshots_installed)
    });
    Ok(ServiceRunReport {
        seed: options.seed,
        violations: observer.violations.clone(),
        answered,
        commands: given,
        refused,
        elections: observer.elections(),
        crashes: crashes.len(),
        power_failures: power_failed,
        partitions,
        applied_index,
        media_fault: media_description,
        media_faults_fired: media::fired(&plans),
        unopened,
        compactions,
        snapshots_installed,
        virtual_ms: sim.now() / 1_000_000,
        events: sim.stats().events,
        trace_digest: sim.trace_digest(),
    })
}

/// The replicas whose storage refused to open, each with why.
fn unopened(sim: &Sim<ServiceNode>, names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter_map(|id| Some(format!("{id}: {}", sim.core(id)?.role::<Unopened<crate::Dkv>>()?.error)))
        .collect()
}

/// Whether replica `id` has a log write in flight.
fn writing(sim: &Sim<ServiceNode>, id: &str) -> bool {
    matches!(sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>()), Some(core) if core.writes_in_flight() > 0)
}

/// The client has every outcome, a leader has committed its whole log (so everything a
/// client was told is committed on it), and every replica has applied exactly that (but a
/// replica whose storage refused to open, while a majority runs).
fn settled(sim: &Sim<ServiceNode>, names: &[String]) -> bool {
    let Some(client) = sim.core(CLIENT).and_then(|node| node.role::<crate::service::ConfigClient>()) else {
        return false;
    };
    if client.outstanding() > 0 {
        return false;
    }
    let replicas: Vec<_> =
        names.iter().filter_map(|id| sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>())).collect();
    let Some(leader) = replicas.iter().find(|core| core.is_leader()) else { return false };
    let committed = leader.commit_index();
    let unopened = unopened(sim, names).len();
    replicas.len() + unopened == names.len()
        && unopened < names.len().div_ceil(2)
        && leader.last_index() == committed
        && replicas.iter().all(|core| core.applied().0 == committed)
}
