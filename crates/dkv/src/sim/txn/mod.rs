//! SEMEL/MILANA in the simulator: a configuration service of 3 Raft replicas, data nodes
//! holding 3 shards of 3 replicas, and clients moving money between accounts while auditing
//! the total, under message loss, duplication, reordering, partitions, skewed clocks, and
//! crashes of backups, primaries (which fail over) and clients (whose transactions the
//! primaries terminate). The last clients run their work as interactive sessions
//! (`session`) rather than programs. The checks are in `checks`.

mod checks;
pub mod lease_scenario;
mod media;
pub mod missing_prepare;
mod node;
pub mod scale;
mod session;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_core::clock::SkewProfile;
use virga_core::device::{MemStorage, Storage};
use virga_net::role::IoExecutor;
use virga_sim::{NetConfig, Partition, Sim, SimConfig, SimError};

use self::node::{admin_node, client_node, config_node, data_node, session_node, unopened_node, validator_node};
pub use self::node::{txn_client, DkvDisk, DkvInput, DkvIo, DkvIoDone, DkvNode};
pub use self::session::{SessionClient, SessionCounts, SessionDriver};
use crate::client::{ClientClock, Program, ReadOnlyValidation, TxnClient, TxnClientConfig};
use crate::config::ConfigCommand;
use crate::kairos::validator::ValidatorWeakening;
use crate::kairos::{CacheConfig, CacheMode, ValidatorConfig, ValidatorCore};
use crate::layout::{Partitioning, ShardMap};
use crate::service::{open_replica, ConfigClient, ConfigClientConfig, ReplicaConfig};
use crate::shard::{open_data_node, DataConfig, Weakened};
use virga_sim::media::{fired, plant, storage_of, Plans, Planted, Unopened};

/// Every account's balance at the start.
const INITIAL_BALANCE: u64 = 1000;
/// How long a session client's operation waits for the primaries: shorter than a
/// failover, so some sessions end unavailable or with their outcome unknown.
const SESSION_OP_DEADLINE: Duration = Duration::from_secs(1);

/// Deliberately broken variants the checks must catch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weakening {
    /// Primaries skip the `latestRead >= ts_commit` check of Algorithm 1.
    pub skip_latest_read: bool,
    /// Read-only transactions commit without local validation.
    pub skip_local_validation: bool,
    /// Cooperative termination commits although a participant never prepared.
    pub terminate_ignoring_missing_prepare: bool,
    /// Primaries skip the check that a cached read's version is still the newest (KAIROS's
    /// `latestCommitted` check), so a stale cached read can commit.
    pub skip_cached_latest_committed: bool,
    /// KAIROS validators skip `freshness < ts_GC → abort` (Algorithm 5's own check).
    pub validator_skip_freshness: bool,
    /// KAIROS validators skip the latest-committed check of cached reads.
    pub validator_skip_cached_latest_committed: bool,
    /// Primaries validate in place of a passed-over validator under the lease they granted it.
    pub skip_validator_lease: bool,
    /// Restarted backups skip their resync (caught under `--faults disk`).
    pub skip_resync: bool,
    /// Primaries settle decided transactions before every backup holds their records.
    pub settle_early: bool,
}

impl Weakening {
    fn flags(&self) -> [(bool, &'static str); 9] {
        [
            (self.skip_latest_read, "skip-latest-read"),
            (self.skip_local_validation, "skip-local-validation"),
            (self.terminate_ignoring_missing_prepare, "terminate-ignoring-missing-prepare"),
            (self.skip_cached_latest_committed, "skip-cached-latest-committed"),
            (self.validator_skip_freshness, "validator-skip-freshness"),
            (self.validator_skip_cached_latest_committed, "validator-skip-cached-latest-committed"),
            (self.skip_validator_lease, "skip-validator-lease"),
            (self.skip_resync, "skip-resync"),
            (self.settle_early, "settle-early"),
        ]
    }

    /// The name `--weaken` takes, if any.
    pub fn name(&self) -> Option<&'static str> {
        let on: Vec<&'static str> = self.flags().into_iter().filter(|(on, _)| *on).map(|(_, name)| name).collect();
        match on.as_slice() {
            [] => None,
            [one] => Some(one),
            _ => Some("several"),
        }
    }

    /// The names `--weaken` takes, each weakening one thing.
    pub const NAMES: [&'static str; 9] = [
        "skip-latest-read",
        "skip-local-validation",
        "terminate-ignoring-missing-prepare",
        "skip-cached-latest-committed",
        "validator-skip-freshness",
        "validator-skip-cached-latest-committed",
        "skip-validator-lease",
        "skip-resync",
        "settle-early",
    ];

    /// The weakening `--weaken NAME` names (the inverse of [`Weakening::name`]).
    pub fn from_name(name: &str) -> Result<Weakening, UnknownWeakening> {
        let none = Weakening::default();
        match name {
            "skip-latest-read" => Ok(Weakening { skip_latest_read: true, ..none }),
            "skip-local-validation" => Ok(Weakening { skip_local_validation: true, ..none }),
            "terminate-ignoring-missing-prepare" => Ok(Weakening { terminate_ignoring_missing_prepare: true, ..none }),
            "skip-cached-latest-committed" => Ok(Weakening { skip_cached_latest_committed: true, ..none }),
            "validator-skip-freshness" => Ok(Weakening { validator_skip_freshness: true, ..none }),
            "validator-skip-cached-latest-committed" => {
                Ok(Weakening { validator_skip_cached_latest_committed: true, ..none })
            }
            "skip-validator-lease" => Ok(Weakening { skip_validator_lease: true, ..none }),
            "skip-resync" => Ok(Weakening { skip_resync: true, ..none }),
            "settle-early" => Ok(Weakening { settle_early: true, ..none }),
            _ => Err(UnknownWeakening { name: name.to_owned() }),
        }
    }
}

/// A `--weaken` name that names no weakening.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no weakening is called {name:?}: the names are skip-latest-read, skip-local-validation, \
     terminate-ignoring-missing-prepare, skip-cached-latest-committed, validator-skip-freshness, \
     validator-skip-cached-latest-committed, skip-validator-lease, skip-resync and settle-early"
)]
pub struct UnknownWeakening {
    pub name: String,
}

/// How one seed runs.
#[derive(Debug, Clone)]
pub struct TxnRunOptions {
    pub seed: u64,
    pub shards: u32,
    pub data_nodes: usize,
    pub clients: usize,
    /// How many of the clients (the last ones) run their work as interactive sessions
    /// instead of programs: the same transfers, audits and scans, one operation at a time.
    pub session_clients: usize,
    pub accounts: usize,
    /// Programs per client; every fourth is an audit of all accounts.
    pub programs: usize,
    pub faults: bool,
    /// With `faults`, one data node that crashes and restarts also meets a media fault: a
    /// latent sector error, or lost or misdirected writes just before its crash (`media`).
    pub media_faults: bool,
    pub fault_window: Duration,
    pub settle: Duration,
    pub clock: SkewProfile,
    /// Clients that crash for good during the fault window (their prepared transactions
    /// are then terminated by the primaries).
    pub client_crashes: bool,
    /// A shard primary that crashes during the fault window (a backup takes over through
    /// the configuration service) and comes back later as an ordinary node.
    pub primary_crashes: bool,
    /// Primaries serve reads under leases (see `DataConfig::leases`).
    pub leases: bool,
    /// The clients' timestamp scheme.
    pub client_clock: ClientClock,
    /// Where the clients validate read-only transactions.
    pub read_only_validation: ReadOnlyValidation,
    /// KAIROS: how clients cache the hot third of the accounts across transactions.
    pub cache: CacheMode,
    /// KAIROS's sharded validators (0: validation at the primaries). With faults, one of
    /// them may crash and restart.
    pub validators: usize,
    pub weakening: Weakening,
    /// How long versions stay readable behind the newest commit (`--snapshot-window`).
    pub snapshot_window: Duration,
}

impl TxnRunOptions {
    pub fn new(seed: u64) -> TxnRunOptions {
        TxnRunOptions {
            seed,
            shards: 3,
            data_nodes: 6,
            clients: 3,
            session_clients: 1,
            accounts: 12,
            programs: 60,
            faults: true,
            media_faults: false,
            fault_window: Duration::from_secs(2),
            settle: Duration::from_secs(20),
            clock: SkewProfile::Ntp,
            client_crashes: true,
            primary_crashes: true,
            leases: true,
            client_clock: ClientClock::Physical,
            read_only_validation: ReadOnlyValidation::Local,
            cache: CacheMode::None,
            validators: 0,
            weakening: Weakening::default(),
            snapshot_window: crate::shard::DEFAULT_SNAPSHOT_WINDOW,
        }
    }

    /// The `virga sim dkv` command that runs this seed alone with these options. It names
    /// every option the command sets that differs from its default: faults (the network's and
    /// the crashes together), the weakening, the clients' clock, the skew, the leases and the
    /// session clients. What
    /// the command cannot set (faults with a crash kind off, the layout, the workload) it runs
    /// as [`TxnRunOptions::new`] has it, so options that change those do not replay.
    pub fn replay_command(&self) -> String {
        let mut command = format!("virga sim dkv --seeds 1 --first-seed {}", self.seed);
        if !self.faults {
            command.push_str(" --faults none");
        } else if self.media_faults {
            command.push_str(" --faults disk");
        }
        if let Some(name) = self.weakening.name() {
            command.push_str(&format!(" --weaken {name}"));
        }
        if self.client_clock == ClientClock::Hybrid {
            command.push_str(" --clock hybrid");
        }
        match self.read_only_validation {
            ReadOnlyValidation::Local => {}
            ReadOnlyValidation::Remote => command.push_str(" --validation remote"),
            ReadOnlyValidation::Validate => command.push_str(" --validation validate"),
        }
        if self.clock != SkewProfile::Ntp {
            command.push_str(&format!(" --skew {}", self.clock.name()));
        }
        if !self.leases {
            command.push_str(" --no-leases");
        }
        if self.cache != CacheMode::None {
            command.push_str(&format!(" --cache {}", self.cache.name()));
        }
        if self.validators > 0 {
            command.push_str(&format!(" --validators {}", self.validators));
        }
        if self.session_clients != TxnRunOptions::new(self.seed).session_clients {
            command.push_str(&format!(" --session-clients {}", self.session_clients));
        }
        if self.snapshot_window != crate::shard::DEFAULT_SNAPSHOT_WINDOW {
            command.push_str(&format!(" --snapshot-window {}", self.snapshot_window.as_secs_f64()));
        }
        command
    }
}

/// What a run showed.
#[derive(Debug, Clone, Default)]
pub struct TxnRunReport {
    pub seed: u64,
    pub violations: Vec<String>,
    /// Programs and session work that ended (committed, gave up, or, for sessions,
    /// unavailable or of unknown outcome).
    pub programs: usize,
    pub committed: u64,
    pub committed_read_only: u64,
    pub aborted_attempts: u64,
    /// Programs that aborted on every attempt.
    pub gave_up: usize,
    pub crashes: usize,
    pub client_crashes: usize,
    pub primary_crashes: usize,
    /// Changes of a group's membership through the configuration service (failovers and
    /// added backups), and failed primaries that rejoined their group as a backup.
    pub failovers: u64,
    pub backups_added: usize,
    /// Versions garbage-collected by full passes, and reads refused as below the watermark.
    pub versions_collected: u64,
    pub too_old: u64,
    /// Transaction entries the data nodes dropped once settled (every replica held them).
    pub entries_settled: u64,
    /// Transactions a primary terminated (cooperative termination), and those of them
    /// committed with no word from their client.
    pub terminations: u64,
    pub committed_by_termination: usize,
    pub partitions: usize,
    /// `--faults disk`: the media fault planted (node and kind), how many reads and writes
    /// it hit, and the nodes whose storage then refused to open (with why).
    pub media_fault: Option<String>,
    pub media_faults_fired: u64,
    pub unopened: Vec<String>,
    /// The session clients' work: committed, aborted on every attempt, ended unavailable,
    /// by a stale map, or with its commit's outcome unknown; and their aborted attempts.
    pub session_committed: u64,
    pub session_gave_up: u64,
    pub session_unavailable: u64,
    pub session_stale_map: u64,
    pub session_outcome_unknown: u64,
    pub session_aborted_attempts: u64,
    /// KAIROS: the clients' reads of cached keys, those served from the cache, and the hits
    /// validation found stale.
    pub cache_reads: u64,
    pub cache_hits: u64,
    pub stale_hits: u64,
    /// KAIROS's validators: crashes, votes, and held transactions they decided from the
    /// primaries' answers; read-only validations the primaries took over, and read-write
    /// transactions they validated in a validator's place.
    pub validator_crashes: usize,
    pub validator_votes: u64,
    pub validator_terminations: u64,
    pub validator_fallbacks: u64,
    pub validator_takeovers: u64,
    pub virtual_ms: u64,
    pub events: u64,
    pub trace_digest: u64,
}

impl TxnRunReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The client programs' node ids, the configuration replicas' and the administrator's.
pub(super) const ADMIN: &str = "admin-0";

pub(super) fn ns(duration: Duration) -> u64 {
    duration.as_nanos() as u64
}

fn account(index: usize) -> Bytes {
    Bytes::from(format!("acct-{index:03}"))
}

pub(super) struct Cluster {
    map: ShardMap,
    config: Vec<String>,
    data: Vec<String>,
    clients: Vec<String>,
    validators: Vec<String>,
    /// Data nodes that are primary of a shard.
    primaries: Vec<String>,
    /// Data nodes that are primary of no shard.
    backups_only: Vec<String>,
}

pub(super) fn cluster(options: &TxnRunOptions) -> Result<Cluster, crate::LayoutError> {
    let data: Vec<String> = (0..options.data_nodes).map(|index| format!("data-{index}")).collect();
    let map = ShardMap::place(&data, Partitioning::Hash { shards: options.shards }, 1)?;
    let (primaries, backups_only) =
        data.iter().cloned().partition(|node| map.groups().iter().any(|group| group.primary == *node));
    let clients = (0..options.clients).map(|index| format!("client-{index}")).collect();
    let config = (1..=3).map(|index| format!("config-{index}")).collect();
    let validators = (0..options.validators as u32).map(crate::kairos::validator_name).collect();
    Ok(Cluster { map, config, data, clients, validators, primaries, backups_only })
}

pub(super) type Disks = Rc<RefCell<HashMap<String, MemStorage>>>;
pub(super) type Restarts = Rc<RefCell<HashMap<String, u64>>>;

pub(super) fn open_node(
    options: &TxnRunOptions,
    cluster: &Cluster,
    disks: &Disks,
    plans: &Plans,
    restarts: &Restarts,
    id: &str,
) -> (DkvNode, Box<dyn IoExecutor<DkvNode>>) {
    let incarnation = {
        let mut restarts = restarts.borrow_mut();
        let count = restarts.entry(id.to_string()).or_default();
        *count += 1;
        *count - 1
    };
    let disk = disks.borrow_mut().entry(id.to_string()).or_default().clone();
    let storage: Arc<dyn Storage> = storage_of(id, disk, plans);
    if let Some(index) = cluster.clients.iter().position(|client| client == id) {
        let mut config = TxnClientConfig::new(index as u32 + 1, cluster.map.clone());
        config.keep_history = true;
        config.skip_local_validation = options.weakening.skip_local_validation;
        config.config_replicas = cluster.config.clone();
        config.clock = options.client_clock;
        config.read_only_validation = options.read_only_validation;
        config.cache = CacheConfig::new(options.cache, (0..options.accounts.div_ceil(3)).map(account));
        config.validators = cluster.validators.clone();
        if index >= options.clients.saturating_sub(options.session_clients) {
            config.op_deadline = SESSION_OP_DEADLINE;
            let session = SessionClient::new(TxnClient::new(config));
            return (session_node(session), Box::new(DkvDisk::None));
        }
        return (client_node(TxnClient::new(config)), Box::new(DkvDisk::None));
    }
    if cluster.validators.iter().any(|validator| validator == id) {
        let mut config = ValidatorConfig::new(crate::kairos::validator_index(id).unwrap_or(0), cluster.map.clone());
        config.config_replicas = cluster.config.clone();
        config.fresh = incarnation == 0;
        // Shorter than the seeds' partitions, so a cut-off client's caches fall below the
        // floor and Algorithm 5's freshness check has work to do.
        config.report_expiry = Duration::from_millis(200);
        config.max_lag = Duration::from_millis(50);
        config.weakened = ValidatorWeakening {
            skip_freshness: options.weakening.validator_skip_freshness,
            skip_cached_latest_committed: options.weakening.validator_skip_cached_latest_committed,
        };
        return (validator_node(ValidatorCore::new(config)), Box::new(DkvDisk::None));
    }
    if id == ADMIN {
        let admin =
            ConfigClient::new(ConfigClientConfig::new(format!("{ADMIN}@{incarnation}"), cluster.config.clone()));
        return (admin_node(admin), Box::new(DkvDisk::None));
    }
    if let Some(index) = cluster.config.iter().position(|replica| replica == id) {
        let peers = cluster.config.iter().enumerate().map(|(index, name)| (index as u64 + 1, name.clone())).collect();
        let seed = options.seed ^ ((index as u64 + 1) << 40) ^ (incarnation << 20);
        return match open_replica(ReplicaConfig::new(index as u64 + 1, peers, seed), storage) {
            Ok((core, disk)) => (config_node(core), Box::new(DkvDisk::Config(Box::new(disk)))),
            // A memory device always opens, and its records are the replica's own.
            Err(error) => unreachable!("{id} does not reopen: {error}"),
        };
    }
    let mut config = DataConfig::new(id, cluster.map.clone());
    config.weakened = Weakened {
        skip_latest_read: options.weakening.skip_latest_read,
        terminate_ignoring_missing_prepare: options.weakening.terminate_ignoring_missing_prepare,
        skip_cached_latest_committed: options.weakening.skip_cached_latest_committed,
        skip_validator_lease: options.weakening.skip_validator_lease,
        skip_resync: options.weakening.skip_resync,
        settle_early: options.weakening.settle_early,
    };
    config.cache = options.cache;
    config.config_replicas = cluster.config.clone();
    config.session = format!("{id}@{incarnation}");
    config.leases = options.leases;
    // Garbage collection within a run's few seconds.
    config.client_expiry = Duration::from_secs(1);
    config.collect_every = Duration::from_millis(500);
    config.snapshot_window = options.snapshot_window;
    // Checkpoints and truncation within a run's few hundred transactions: crashes land
    // before, during and after them.
    config.checkpoint_every = 150;
    config.log_segment_bytes = 16 << 10;
    match open_data_node(config, storage) {
        Ok((mut core, disk)) => {
            // Initial balances, as loaded data (version zero) on every replica.
            for index in 0..options.accounts {
                core.load(account(index), Bytes::from(INITIAL_BALANCE.to_string()));
            }
            (data_node(core), Box::new(DkvDisk::Data(Box::new(disk))))
        }
        // Only a media fault makes a memory device refuse to open: the node stays down.
        Err(error) => (unopened_node(error.to_string()), Box::new(DkvDisk::None)),
    }
}

/// The programs of one client: transfers between random accounts; every fourth an audit,
/// by gets or (every eighth) by a scan of the accounts' range. A session client runs the
/// same work as sessions.
fn programs(rng: &mut StdRng, options: &TxnRunOptions) -> Vec<Program> {
    let all: Vec<Bytes> = (0..options.accounts).map(account).collect();
    (0..options.programs)
        .map(|index| {
            if index % 8 == 7 {
                let (start, end) = (Bytes::from_static(b"acct-"), Some(Bytes::from_static(b"acct.")));
                Program::Ops(vec![crate::client::TxnOp::Scan { start, end, limit: 4096 }])
            } else if index % 4 == 3 {
                Program::Audit(all.clone())
            } else {
                let from = rng.random_range(0..options.accounts);
                let to = (from + rng.random_range(1..options.accounts)) % options.accounts;
                Program::Transfer { from: account(from), to: account(to), amount: rng.random_range(1..200) }
            }
        })
        .collect()
}

/// The seed's crashes: (at, back, node) for data nodes, `back == None` for good.
type Crashes = Vec<(u64, Option<u64>, String)>;

fn sim_config(options: &TxnRunOptions, rng: &mut StdRng, cluster: &Cluster) -> (SimConfig, Crashes, Option<Planted>) {
    let mut net = NetConfig {
        latency_min: Duration::from_micros(100),
        latency_max: Duration::from_millis(2),
        ..NetConfig::default()
    };
    let mut crashes = Vec::new();
    let window = ns(options.fault_window);
    if options.faults {
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
            crashes.push((
                at,
                Some(back),
                cluster.backups_only[rng.random_range(0..cluster.backups_only.len())].clone(),
            ));
        }
        if options.primary_crashes && !cluster.primaries.is_empty() && rng.random_bool(0.5) {
            let at = rng.random_range(ns(Duration::from_millis(100))..window);
            let back = at + rng.random_range(ns(Duration::from_secs(2))..ns(Duration::from_secs(4)));
            crashes.push((at, Some(back), cluster.primaries[rng.random_range(0..cluster.primaries.len())].clone()));
        }
        // A validator that crashes and comes back with its state gone (KAIROS: the
        // primaries take over read-only validation meanwhile; its floor covers what it
        // forgot).
        if !cluster.validators.is_empty() && rng.random_bool(0.7) {
            let at = rng.random_range(ns(Duration::from_millis(100))..window);
            let back = at + rng.random_range(ns(Duration::from_millis(50))..ns(Duration::from_millis(600)));
            crashes.push((at, Some(back), cluster.validators[rng.random_range(0..cluster.validators.len())].clone()));
        }
        if options.client_crashes && rng.random_bool(0.5) {
            let at = rng.random_range(ns(Duration::from_millis(20))..window);
            crashes.push((at, None, cluster.clients[rng.random_range(0..cluster.clients.len())].clone()));
        }
    }
    let planted =
        if options.faults && options.media_faults { media::schedule(rng, cluster, &mut crashes, window) } else { None };
    let config = SimConfig {
        seed: options.seed,
        net,
        device_latency: Duration::from_millis(1),
        clock_profile: options.clock,
        max_events: Some(5_000_000),
    };
    (config, crashes, planted)
}

/// Runs one seed and checks it.
pub fn run_txn(options: &TxnRunOptions) -> Result<TxnRunReport, SimError> {
    let cluster = cluster(options)
        .map_err(|error| SimError::InvalidConfig { field: "layout".into(), reason: error.to_string() })?;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let (config, crashes, mut planted) = sim_config(options, &mut rng, &cluster);
    let media_fault = planted.as_ref().map(|planted| format!("{:?} on {}", planted.fault, planted.node));
    let partitions = config.net.partitions.len();
    let mut sim: Sim<DkvNode> = Sim::new(config)?;
    let disks: Disks = Rc::new(RefCell::new(HashMap::new()));
    let restarts: Restarts = Rc::new(RefCell::new(HashMap::new()));
    let plans: Plans = Rc::new(RefCell::new(HashMap::new()));
    let everyone: Vec<String> = cluster
        .config
        .iter()
        .chain([&ADMIN.to_string()])
        .chain(&cluster.data)
        .chain(&cluster.clients)
        .chain(&cluster.validators)
        .cloned()
        .collect();
    for id in &everyone {
        let (core, io) = open_node(options, &cluster, &disks, &plans, &restarts, id);
        sim.add_node(id.clone(), core, io)?;
    }
    let cluster = Rc::new(cluster);
    let (factory_options, factory_cluster, factory_disks, factory_plans, factory_restarts) =
        (options.clone(), Rc::clone(&cluster), Rc::clone(&disks), Rc::clone(&plans), Rc::clone(&restarts));
    sim.set_factory(move |id| {
        open_node(&factory_options, &factory_cluster, &factory_disks, &factory_plans, &factory_restarts, id)
    });
    let crash_disks = Rc::clone(&disks);
    sim.set_on_crash(move |id, rng| {
        if let Some(storage) = crash_disks.borrow_mut().get_mut(id) {
            *storage = storage.crash_with(rng);
        }
    });
    for (at, back, id) in &crashes {
        sim.crash_at(*at, id)?;
        if let Some(back) = back {
            sim.restart_at(*back, id)?;
        }
    }
    sim.input_at(1, ADMIN, DkvInput::Commands(vec![ConfigCommand::Install(cluster.map.clone())]))?;
    // A failed primary that comes back rejoins its old group as a backup (once the group
    // failed over: the command names the epoch after the failover; refused otherwise).
    for (_, back, id) in &crashes {
        let Some(back) = back else { continue };
        for (shard, group) in cluster.map.groups().iter().enumerate() {
            if group.primary == *id {
                let command = ConfigCommand::AddBackup {
                    shard: crate::layout::ShardId(shard as u32),
                    epoch: group.epoch + 1,
                    node: id.clone(),
                };
                sim.input_at(back + ns(Duration::from_millis(500)), ADMIN, DkvInput::Commands(vec![command]))?;
            }
        }
    }
    for client in &cluster.clients {
        sim.input_at(ns(Duration::from_millis(1)), client, DkvInput::Programs(programs(&mut rng, options)))?;
    }
    let window = ns(options.fault_window);
    let mut seen = checks::ClientViews::default();
    // Past every restart, and the rejoin of a primary that came back.
    let restart_ends =
        crashes.iter().filter_map(|(_, back, _)| *back).max().map_or(0, |back| back + ns(Duration::from_secs(2)));
    sim.run_while(window.max(restart_ends) + ns(options.settle), |sim| {
        seen.observe(sim, &cluster.clients);
        if planted.as_ref().is_some_and(|due| sim.now() >= due.at && plant(due, &disks, &plans)) {
            planted = None;
        }
        sim.now() < window.max(restart_ends) || !checks::settled(sim, &cluster)
    });
    seen.observe(&sim, &cluster.clients);
    let mut report = TxnRunReport {
        seed: options.seed,
        partitions,
        crashes: crashes.len(),
        client_crashes: crashes.iter().filter(|(_, _, id)| cluster.clients.contains(id)).count(),
        primary_crashes: crashes.iter().filter(|(_, _, id)| cluster.primaries.contains(id)).count(),
        validator_crashes: crashes.iter().filter(|(_, _, id)| cluster.validators.contains(id)).count(),
        virtual_ms: sim.now() / 1_000_000,
        events: sim.stats().events,
        trace_digest: sim.trace_digest(),
        media_fault,
        media_faults_fired: fired(&plans),
        unopened: unopened(&sim, &cluster),
        ..TxnRunReport::default()
    };
    checks::check_run(&sim, &cluster, options, &seen, &mut report);
    Ok(report)
}

/// The data nodes down at the end because their storage did not open, with why.
fn unopened(sim: &Sim<DkvNode>, cluster: &Cluster) -> Vec<String> {
    cluster
        .data
        .iter()
        .filter_map(|id| Some(format!("{id}: {}", sim.core(id)?.role::<Unopened<crate::Dkv>>()?.error)))
        .collect()
}
