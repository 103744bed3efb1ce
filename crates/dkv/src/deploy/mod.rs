//! The whole store in one process (`virga kv cluster up`): three configuration replicas,
//! the data nodes holding every shard's replicas, and one client core serving the client
//! API, every role under the tokio driver on the in-process transport, each with its record
//! log in its own directory under the cluster's directory.
//!
//! The directory remembers the layout (`cluster.txt`); opening it again restarts the same
//! cluster from its logs: the configuration replicas replay theirs and elect a leader, the
//! data nodes take over their shards from their own records, and the client core starts as
//! a new client id (its transaction ids never repeat an earlier incarnation's). Nothing a
//! commit acknowledged is lost by a kill: a primary votes commit only once its log and f
//! backups hold the prepare durably (with `sync`).

mod audit;
// The metrics endpoint is served by axum, which comes with the gRPC stack.
#[cfg(feature = "grpc")]
mod metrics;
// Processes talk over gRPC: without the feature (the fuzz build) there are none.
#[cfg(feature = "grpc")]
mod process;

pub use self::audit::{audit_cluster, ClusterAudit, ReplicaAudit};
#[cfg(feature = "grpc")]
pub use self::metrics::{serve_metrics, RoleMetrics, RoleReader};
#[cfg(feature = "grpc")]
pub use self::process::{init_processes, run_role, ProcessPlan};

/// The name of the role serving the client API.
pub const API_ROLE: &str = "api";

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Dkv;
use tokio::sync::watch;
use virga_core::device::{FileStorage, Storage};
use virga_net::driver::{Mailbox, Running};
use virga_net::role::NoIo;
use virga_net::{Host, InProc};

use crate::api::{Kv, LocalKv};
use crate::client::{TxnClient, TxnClientConfig};
use crate::kairos::{ValidatorConfig, ValidatorCore};
use crate::layout::{replicas_to_f, Partitioning, ShardMap};
use crate::service::{open_replica, ConfigClient, ConfigClientConfig, ConfigCore, ReplicaConfig};
use crate::shard::{open_data_node, DataConfig, DataCore};
use crate::ConfigCommand;

/// The layout file's name in the cluster's directory.
pub const LAYOUT_FILE: &str = "cluster.txt";
const CONFIG_REPLICAS: u64 = 3;

/// A new cluster's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    pub shards: u32,
    /// Replicas per shard (odd: 2f + 1).
    pub replicas: usize,
    /// Data nodes the replicas are spread over (at least `replicas`).
    pub data_nodes: usize,
    /// KAIROS's sharded validators (0: validation at the primaries).
    pub validators: usize,
}

impl Default for ClusterShape {
    fn default() -> Self {
        ClusterShape { shards: 3, replicas: 3, data_nodes: 6, validators: 0 }
    }
}

/// How the processes' roles run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Fsync every group of records before acknowledging it (`--sync group`).
    pub sync: bool,
    /// How long to wait for the configuration service's leader and the layout.
    pub start_within: Duration,
    /// Mutual TLS on every gRPC endpoint (between roles and to clients), when given.
    #[cfg(feature = "grpc")]
    pub tls: Option<virga_net::Tls>,
    /// Where a role of a cluster of processes serves its Prometheus metrics (`GET /metrics`).
    pub metrics: Option<SocketAddr>,
    /// How long versions stay readable behind the newest commit (`--snapshot-window`).
    pub snapshot_window: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            sync: true,
            start_within: Duration::from_secs(20),
            #[cfg(feature = "grpc")]
            tls: None,
            metrics: None,
            snapshot_window: crate::shard::DEFAULT_SNAPSHOT_WINDOW,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {problem}")]
    BadLayoutFile { path: PathBuf, problem: LayoutFileProblem },
    #[error(
        "{path} holds a cluster of {stored}; the options ask for {asked} (leave them out, or use a new directory)"
    )]
    ShapeMismatch { path: PathBuf, stored: String, asked: String },
    #[error("the layout: {0}")]
    Layout(String),
    #[error("opening {role}: {error}")]
    Open { role: String, error: String },
    #[error("{0}")]
    NotStarted(String),
    #[error("{role} of {dir} is running in another process (it holds {dir}/{role}.lock); stop it first")]
    InUse { role: String, dir: PathBuf },
}

/// Holds `role`'s lock in `dir` for as long as it lives.
pub(crate) struct RoleLock {
    _file: std::fs::File,
}

/// Takes `role`'s advisory lock in `dir`, or says who holds it.
pub(crate) fn lock_role(dir: &Path, role: &str) -> Result<RoleLock, DeployError> {
    let path = dir.join(format!("{role}.lock"));
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io_error(&path))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(RoleLock { _file: file }),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            Err(DeployError::InUse { role: role.to_string(), dir: dir.to_path_buf() })
        }
        Err(error) => Err(DeployError::Io { path, error: error.into() }),
    }
}

/// Every role's name in a cluster of this shape, the API server's included.
pub(crate) fn role_names(shape: &ClusterShape) -> Vec<String> {
    config_peers()
        .into_iter()
        .map(|(_, name)| name)
        .chain((0..shape.data_nodes).map(|index| format!("data-{index}")))
        .chain(validator_names(shape))
        .chain([API_ROLE.to_string()])
        .collect()
}

pub(crate) fn validator_names(shape: &ClusterShape) -> Vec<String> {
    (0..shape.validators as u32).map(crate::kairos::validator_name).collect()
}

/// What `cluster.txt` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayoutFile {
    pub(crate) shape: ClusterShape,
    /// How many times the cluster has been opened (the client core's id).
    pub(crate) incarnation: u32,
    /// For a cluster of processes (`virga kv cluster init`): the first of its roles' ports.
    pub(crate) base_port: Option<u16>,
}

fn describe(shape: &ClusterShape) -> String {
    format!(
        "{} shards × {} replicas on {} data nodes, {} validators",
        shape.shards, shape.replicas, shape.data_nodes, shape.validators
    )
}

impl LayoutFile {
    fn encode(&self) -> String {
        let shape = &self.shape;
        let mut text = format!(
            "virga kv cluster 1\nshards {}\nreplicas {}\ndata_nodes {}\nincarnation {}\n",
            shape.shards, shape.replicas, shape.data_nodes, self.incarnation
        );
        if let Some(port) = self.base_port {
            text.push_str(&format!("base_port {port}\n"));
        }
        if shape.validators > 0 {
            text.push_str(&format!("validators {}\n", shape.validators));
        }
        text
    }

    fn decode(text: &str) -> Result<LayoutFile, LayoutFileProblem> {
        let mut lines = text.lines();
        if lines.next() != Some("virga kv cluster 1") {
            return Err(LayoutFileProblem::NotALayout);
        }
        let mut field = |name: &'static str| -> Result<u64, LayoutFileProblem> {
            let line = lines.next().ok_or(LayoutFileProblem::MissingLine(name))?;
            let value = line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' '));
            let value = value.ok_or_else(|| LayoutFileProblem::Misplaced { line: line.to_string(), name })?;
            value.parse().map_err(|_| LayoutFileProblem::NotANumber { name, value: value.to_string() })
        };
        let shards = u32::try_from(field("shards")?).map_err(|_| LayoutFileProblem::TooLarge("shards"))?;
        let replicas = field("replicas")? as usize;
        let data_nodes = field("data_nodes")? as usize;
        let incarnation =
            u32::try_from(field("incarnation")?).map_err(|_| LayoutFileProblem::TooLarge("incarnation"))?;
        // Then, each when it applies: the base port of a cluster of processes, the validators.
        let (mut base_port, mut validators) = (None, 0);
        for line in lines {
            if let Some(value) = line.strip_prefix("base_port ") {
                base_port = Some(value.parse().map_err(|_| LayoutFileProblem::NotAPort(value.to_string()))?);
            } else if let Some(value) = line.strip_prefix("validators ") {
                validators = value
                    .parse::<usize>()
                    .ok()
                    .filter(|count| (1..=16).contains(count))
                    .ok_or_else(|| LayoutFileProblem::ValidatorCount(value.to_string()))?;
            } else {
                return Err(LayoutFileProblem::Trailing(line.to_string()));
            }
        }
        let shape = ClusterShape { shards, replicas, data_nodes, validators };
        Ok(LayoutFile { shape, incarnation, base_port })
    }
}

/// What is wrong with a cluster's layout file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutFileProblem {
    #[error("not a virga kv cluster layout (its first line is not `virga kv cluster 1`)")]
    NotALayout,
    #[error("no `{0}` line")]
    MissingLine(&'static str),
    #[error("`{line}` where `{name} N` belongs")]
    Misplaced { line: String, name: &'static str },
    #[error("`{name}` is not a number: {value:?}")]
    NotANumber { name: &'static str, value: String },
    #[error("`{0}` is too large")]
    TooLarge(&'static str),
    #[error("`base_port` is not a port: {0:?}")]
    NotAPort(String),
    #[error("`validators` is not a count from 1 to 16: {0:?}")]
    ValidatorCount(String),
    #[error("`{0}` after the incarnation")]
    Trailing(String),
    #[error("no base port: the directory is a `virga kv cluster up` cluster, not one of processes (`virga kv cluster init`)")]
    NoBasePort,
    #[error("a cluster is there already (its roles restart from it as they are)")]
    AlreadyThere,
    #[error("not a count of starts: {0:?}")]
    NotACount(String),
    #[error("opened too often")]
    OpenedTooOften,
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> DeployError + '_ {
    move |error| DeployError::Io { path: path.to_path_buf(), error }
}

/// The layout of the cluster in `dir`, as it is.
pub(crate) fn read_layout(dir: &Path) -> Result<LayoutFile, DeployError> {
    let path = dir.join(LAYOUT_FILE);
    let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
    LayoutFile::decode(&text).map_err(|problem| DeployError::BadLayoutFile { path, problem })
}

/// Whether `dir` holds a cluster (its layout file).
pub fn is_cluster_dir(dir: &Path) -> bool {
    dir.join(LAYOUT_FILE).is_file()
}

/// Reads the directory's layout (a new one from `shape` when there is none), counts this
/// opening, and writes it back durably.
fn open_layout(dir: &Path, shape: Option<ClusterShape>) -> Result<LayoutFile, DeployError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let path = dir.join(LAYOUT_FILE);
    let mut layout = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let stored = LayoutFile::decode(&text)
                .map_err(|problem| DeployError::BadLayoutFile { path: path.clone(), problem })?;
            if let Some(asked) = shape.filter(|asked| *asked != stored.shape) {
                let (stored, asked) = (describe(&stored.shape), describe(&asked));
                return Err(DeployError::ShapeMismatch { path, stored, asked });
            }
            stored
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            LayoutFile { shape: shape.unwrap_or_default(), incarnation: 0, base_port: None }
        }
        Err(error) => return Err(DeployError::Io { path, error }),
    };
    layout.incarnation = layout
        .incarnation
        .checked_add(1)
        .ok_or_else(|| DeployError::BadLayoutFile { path: path.clone(), problem: LayoutFileProblem::OpenedTooOften })?;
    write_durably(dir, LAYOUT_FILE, &layout.encode())?;
    Ok(layout)
}

/// Writes `text` to `dir/name` so that a crash leaves the old file or the new one whole.
pub(crate) fn write_durably(dir: &Path, name: &str, text: &str) -> Result<(), DeployError> {
    let (path, staged) = (dir.join(name), dir.join(format!("{name}.new")));
    std::fs::write(&staged, text).map_err(io_error(&staged))?;
    std::fs::File::open(&staged).and_then(|file| file.sync_all()).map_err(io_error(&staged))?;
    std::fs::rename(&staged, &path).map_err(io_error(&path))?;
    std::fs::File::open(dir).and_then(|file| file.sync_all()).map_err(io_error(dir))
}

/// The first layout of a shape: its shards' replicas placed round robin over the data nodes.
pub fn initial_map(shape: &ClusterShape) -> Result<ShardMap, DeployError> {
    let f = replicas_to_f(shape.replicas).map_err(|error| DeployError::Layout(error.to_string()))?;
    if shape.data_nodes < shape.replicas || shape.data_nodes > 64 {
        return Err(DeployError::Layout(format!(
            "{} data nodes for {} replicas per shard (at least as many, at most 64)",
            shape.data_nodes, shape.replicas
        )));
    }
    let nodes: Vec<String> = (0..shape.data_nodes).map(|index| format!("data-{index}")).collect();
    ShardMap::place(&nodes, Partitioning::Hash { shards: shape.shards }, f)
        .map_err(|error| DeployError::Layout(error.to_string()))
}

pub(crate) fn config_peers() -> Vec<(u64, String)> {
    (1..=CONFIG_REPLICAS).map(|id| (id, format!("config-{id}"))).collect()
}

/// A role running under the driver, and its stop switch.
struct Runner<R: virga_net::role::Role> {
    running: Running<R>,
    stop: watch::Sender<bool>,
}

impl<R: virga_net::role::Role> Runner<R> {
    async fn stop(self) {
        let _ = self.stop.send(true);
        self.running.join().await;
    }
}

/// A running cluster.
pub struct LocalCluster {
    _locks: Vec<RoleLock>,
    shape: ClusterShape,
    incarnation: u32,
    config: Vec<Runner<ConfigCore>>,
    data: Vec<Runner<DataCore>>,
    validators: Vec<Runner<ValidatorCore>>,
    client: Runner<TxnClient>,
}

impl LocalCluster {
    /// Opens the cluster in `dir`: a new one of `shape` (the default when None) if the
    /// directory holds none, or the one it holds (then `shape`, if given, must match).
    pub async fn open(
        dir: &Path,
        shape: Option<ClusterShape>,
        options: &ClusterOptions,
    ) -> Result<LocalCluster, DeployError> {
        // Every role of the directory's cluster is this process's: none may run elsewhere.
        let stored = if is_cluster_dir(dir) { Some(read_layout(dir)?.shape) } else { None };
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let locked = stored.or(shape).unwrap_or_default();
        let locks = role_names(&locked).iter().map(|role| lock_role(dir, role)).collect::<Result<Vec<_>, _>>()?;
        let layout = open_layout(dir, shape)?;
        let map = initial_map(&layout.shape)?;
        let inproc = InProc::new();
        let mut config = Vec::new();
        for (id, name) in config_peers() {
            let mut replica = ReplicaConfig::new(id, config_peers(), id + u64::from(layout.incarnation) * 1000);
            replica.sync = options.sync;
            let storage = storage(dir, &name)?;
            let (core, disk) = open_replica(replica, storage).map_err(|error| open_failed(&name, error.to_string()))?;
            let mailbox = Mailbox::<ConfigCore>::new();
            inproc.register_host(&name, Host::new().with::<Dkv>(mailbox.handler()));
            let (stop, stopped) = watch::channel(false);
            config.push(Runner { running: mailbox.run(name, core, Arc::clone(&inproc) as _, disk, stopped), stop });
        }
        let map = match install(&inproc, &config, map, layout.incarnation, options.start_within).await {
            Ok(map) => map,
            Err(error) => {
                for runner in config {
                    runner.stop().await;
                }
                return Err(error);
            }
        };
        let replicas: Vec<String> = config_peers().into_iter().map(|(_, name)| name).collect();
        let mut data = Vec::new();
        for index in 0..layout.shape.data_nodes {
            let name = format!("data-{index}");
            let mut node = DataConfig::new(&name, map.clone());
            node.config_replicas = replicas.clone();
            node.session = format!("{name}@{}", layout.incarnation);
            node.sync = options.sync;
            node.snapshot_window = options.snapshot_window;
            let (core, disk) =
                open_data_node(node, storage(dir, &name)?).map_err(|error| open_failed(&name, error.to_string()))?;
            let mailbox = Mailbox::<DataCore>::new();
            inproc.register_host(&name, Host::new().with::<Dkv>(mailbox.handler()));
            let (stop, stopped) = watch::channel(false);
            data.push(Runner { running: mailbox.run(name, core, Arc::clone(&inproc) as _, disk, stopped), stop });
        }
        let mut validators = Vec::new();
        for (index, name) in validator_names(&layout.shape).into_iter().enumerate() {
            let mut config = ValidatorConfig::new(index as u32, map.clone());
            config.config_replicas = replicas.clone();
            // Its state is volatile: only the cluster's first opening has nothing to forget.
            config.fresh = layout.incarnation == 1;
            let mailbox = Mailbox::<ValidatorCore>::new();
            inproc.register_host(&name, Host::new().with::<Dkv>(mailbox.handler()));
            let (stop, stopped) = watch::channel(false);
            let core = ValidatorCore::new(config);
            validators.push(Runner { running: mailbox.run(name, core, Arc::clone(&inproc) as _, NoIo, stopped), stop });
        }
        let mut client_config = TxnClientConfig::new(layout.incarnation, map);
        client_config.config_replicas = replicas;
        client_config.validators = validator_names(&layout.shape);
        let name = format!("client-{}", layout.incarnation);
        let mailbox = Mailbox::<TxnClient>::new();
        inproc.register_host(&name, Host::new().with::<Dkv>(mailbox.handler()));
        let (stop, stopped) = watch::channel(false);
        let running = mailbox.run(name, TxnClient::new(client_config), Arc::clone(&inproc) as _, NoIo, stopped);
        Ok(LocalCluster {
            _locks: locks,
            shape: layout.shape,
            incarnation: layout.incarnation,
            config,
            data,
            validators,
            client: Runner { running, stop },
        })
    }

    pub fn shape(&self) -> ClusterShape {
        self.shape
    }

    /// How many times the directory's cluster has been opened, this time included.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// The client API, served by this process's client core.
    pub fn kv(&self) -> Kv<LocalKv> {
        let wait = self.client.running.with_core(|client| client.config().op_deadline) + Duration::from_secs(5);
        Kv::new(LocalKv::new(self.client.running.input_sender(), wait))
    }

    /// The newest map a configuration replica has applied.
    pub fn map(&self) -> Option<ShardMap> {
        self.config
            .iter()
            .filter_map(|runner| runner.running.with_core(|core| core.state().map().cloned()))
            .max_by_key(ShardMap::version)
    }

    /// Every role's metrics, read at each scrape (serve them with [`serve_metrics`]).
    #[cfg(feature = "grpc")]
    pub fn metrics(&self) -> RoleMetrics {
        let mut metrics = RoleMetrics::default();
        for (runner, (_, name)) in self.config.iter().zip(config_peers()) {
            metrics.add(name, RoleReader::Config(runner.running.reader()));
        }
        for (index, runner) in self.data.iter().enumerate() {
            metrics.add(format!("data-{index}"), RoleReader::Data(runner.running.reader()));
        }
        metrics.add(API_ROLE, RoleReader::Client(self.client.running.reader()));
        metrics
    }

    /// Reads data node `name`'s core (for audits and tests).
    pub fn with_data_node<T>(&self, name: &str, read: impl FnOnce(&DataCore) -> T) -> Option<T> {
        let index: usize = name.strip_prefix("data-")?.parse().ok()?;
        self.data.get(index).map(|runner| runner.running.with_core(read))
    }

    /// Stops every role cleanly: the client first, then the data nodes, then the service.
    pub async fn stop(self) {
        self.client.stop().await;
        for runner in self.validators {
            runner.stop().await;
        }
        for runner in self.data {
            runner.stop().await;
        }
        for runner in self.config {
            runner.stop().await;
        }
    }
}

pub(crate) fn open_failed(role: &str, error: String) -> DeployError {
    DeployError::Open { role: role.to_string(), error }
}

pub(crate) fn storage(dir: &Path, name: &str) -> Result<Arc<dyn Storage>, DeployError> {
    let path = dir.join(name);
    let storage = FileStorage::create_dir_all(&path).map_err(io_error(&path))?;
    Ok(Arc::new(storage))
}

/// Waits for the service's leader, proposes the first layout (refused, harmlessly, when one
/// is installed already) and returns the map in force.
async fn install(
    inproc: &Arc<InProc>,
    config: &[Runner<ConfigCore>],
    map: ShardMap,
    incarnation: u32,
    within: Duration,
) -> Result<ShardMap, DeployError> {
    let started = Instant::now();
    let replicas = config_peers().into_iter().map(|(_, name)| name).collect();
    let session = format!("admin@{incarnation}");
    let (stop, stopped) = watch::channel(false);
    let admin = Mailbox::<ConfigClient>::new().run(
        session.clone(),
        ConfigClient::new(ConfigClientConfig::new(&session, replicas)),
        Arc::clone(inproc) as _,
        NoIo,
        stopped,
    );
    admin.input(vec![ConfigCommand::Install(map)]);
    let mut installed = None;
    while started.elapsed() < within {
        if admin.with_core(|admin| !admin.outcomes().is_empty()) {
            installed = config
                .iter()
                .filter(|runner| runner.running.with_core(ConfigCore::is_leader))
                .find_map(|runner| runner.running.with_core(|core| core.state().map().cloned()));
            if installed.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(true);
    admin.join().await;
    installed.ok_or_else(|| {
        DeployError::NotStarted(format!("the configuration service installed no layout within {within:?}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_file_round_trips_and_names_what_is_wrong() {
        let layout = LayoutFile {
            shape: ClusterShape { shards: 4, replicas: 5, data_nodes: 7, validators: 2 },
            incarnation: 9,
            base_port: None,
        };
        assert_eq!(LayoutFile::decode(&layout.encode()), Ok(layout));
        let ported = LayoutFile { base_port: Some(7400), ..layout };
        assert_eq!(LayoutFile::decode(&ported.encode()), Ok(ported));
        assert!(LayoutFile::decode(&format!("{}port 1\n", layout.encode())).is_err());
        let wrong = layout.encode().replace("replicas 5", "replicas five");
        let not_a_number = LayoutFileProblem::NotANumber { name: "replicas", value: "five".into() };
        assert_eq!(LayoutFile::decode(&wrong), Err(not_a_number));
        assert_eq!(LayoutFile::decode("hello"), Err(LayoutFileProblem::NotALayout));
        let short = "virga kv cluster 1\nshards 3\n";
        assert_eq!(LayoutFile::decode(short), Err(LayoutFileProblem::MissingLine("replicas")));
    }

    #[test]
    fn opening_counts_incarnations_and_refuses_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let shape = ClusterShape { shards: 2, replicas: 3, data_nodes: 3, validators: 0 };
        assert_eq!(open_layout(dir.path(), Some(shape)).unwrap().incarnation, 1);
        assert_eq!(open_layout(dir.path(), None).unwrap(), LayoutFile { shape, incarnation: 2, base_port: None });
        let other = ClusterShape { shards: 3, ..shape };
        let refused = open_layout(dir.path(), Some(other)).unwrap_err();
        assert!(matches!(refused, DeployError::ShapeMismatch { .. }), "{refused}");
        assert_eq!(open_layout(dir.path(), Some(shape)).unwrap().incarnation, 3);
    }

    #[test]
    fn a_role_runs_in_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_role(dir.path(), "data-0").unwrap();
        let refused = lock_role(dir.path(), "data-0").map(|_| ()).unwrap_err();
        assert!(
            refused.to_string().contains("data-0 of") && refused.to_string().contains("stop it first"),
            "{refused}"
        );
        assert!(lock_role(dir.path(), "data-1").is_ok());
        drop(held);
        assert!(lock_role(dir.path(), "data-0").is_ok());
    }

    #[test]
    fn even_replica_counts_and_too_few_nodes_are_refused() {
        let even = initial_map(&ClusterShape { shards: 3, replicas: 2, data_nodes: 6, validators: 0 }).unwrap_err();
        assert!(matches!(even, DeployError::Layout(_)), "{even}");
        let few = initial_map(&ClusterShape { shards: 3, replicas: 5, data_nodes: 4, validators: 0 }).unwrap_err();
        assert!(few.to_string().contains("4 data nodes for 5 replicas"), "{few}");
        let map = initial_map(&ClusterShape::default()).unwrap();
        assert_eq!((map.shard_count(), map.f()), (3, 1));
    }
}
