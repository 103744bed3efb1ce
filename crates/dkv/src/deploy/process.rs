//! The store's roles as processes of their own over gRPC (`virga kv cluster init` and
//! `virga kv cluster node`): the directory's layout names every role and its loopback port
//! (the three configuration replicas from the base port, then the data nodes, KAIROS's
//! validators if any, then the API server); each process runs one role from its own subdirectory, reaching the others over
//! the gRPC transport. A role killed at any moment restarts with the same command: it
//! replays its log and takes up its part again (a data node whose shard failed over while it
//! was down stays out of that shard's group).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Dkv;
use tokio::net::TcpListener;
use tokio::sync::watch;
use virga_net::driver::{CoreReader, Mailbox};
use virga_net::role::NoIo;
use virga_net::{Grpc, Host, Tls, Transport};

use super::metrics::{serve_metrics, RoleMetrics, RoleReader};
use super::{
    config_peers, initial_map, io_error, open_failed, read_layout, storage, write_durably, ClusterOptions,
    ClusterShape, DeployError, LayoutFile, API_ROLE, LAYOUT_FILE,
};
use crate::api::{Kv, LocalKv};
use crate::client::{TxnClient, TxnClientConfig};
use crate::kairos::{ValidatorConfig, ValidatorCore};
use crate::service::{open_replica, ConfigClient, ConfigClientConfig, ReplicaConfig};
use crate::shard::{open_data_node, DataConfig};
use crate::ConfigCommand;

/// Every role of a cluster of processes and its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPlan {
    pub shape: ClusterShape,
    /// (role, address), in port order: config-1..3, data-0.., api.
    pub roles: Vec<(String, SocketAddr)>,
}

impl ProcessPlan {
    fn of(shape: ClusterShape, base_port: u16) -> Result<ProcessPlan, DeployError> {
        let mut roles = Vec::new();
        for (offset, name) in super::role_names(&shape).into_iter().enumerate() {
            let port = u16::try_from(usize::from(base_port) + offset)
                .map_err(|_| DeployError::Layout(format!("base port {base_port} leaves no room for {name}")))?;
            roles.push((name, SocketAddr::from(([127, 0, 0, 1], port))));
        }
        Ok(ProcessPlan { shape, roles })
    }

    /// The plan of the cluster of processes in `dir`.
    pub fn read(dir: &Path) -> Result<ProcessPlan, DeployError> {
        let layout = read_layout(dir)?;
        let base_port = layout.base_port.ok_or_else(|| DeployError::BadLayoutFile {
            path: dir.join(LAYOUT_FILE),
            problem: super::LayoutFileProblem::NoBasePort,
        })?;
        ProcessPlan::of(layout.shape, base_port)
    }

    pub fn address(&self, role: &str) -> Option<SocketAddr> {
        self.roles.iter().find(|(name, _)| name == role).map(|(_, address)| *address)
    }

    /// The gRPC transport to every role but the API server (whom no role calls), over mutual
    /// TLS when `tls` is given.
    fn transport(&self, tls: Option<&Tls>) -> Arc<Grpc> {
        let addresses: HashMap<String, String> = self
            .roles
            .iter()
            .filter(|(name, _)| name != API_ROLE)
            .map(|(name, address)| (name.clone(), format!("http://{address}")))
            .collect();
        match tls {
            Some(tls) => Grpc::with_tls(addresses, tls.clone()),
            None => Grpc::new(addresses),
        }
    }
}

/// Writes a new cluster of processes into `dir` (which must hold none) and returns its plan.
pub fn init_processes(dir: &Path, shape: ClusterShape, base_port: u16) -> Result<ProcessPlan, DeployError> {
    initial_map(&shape)?;
    let plan = ProcessPlan::of(shape, base_port)?;
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let path = dir.join(LAYOUT_FILE);
    if path.exists() {
        return Err(DeployError::BadLayoutFile { path, problem: super::LayoutFileProblem::AlreadyThere });
    }
    let layout = LayoutFile { shape, incarnation: 0, base_port: Some(base_port) };
    write_durably(dir, LAYOUT_FILE, &layout.encode())?;
    Ok(plan)
}

/// Counts one more start of `role` in `dir/<role>.starts` and returns it (from 1): what makes
/// its sessions and client id new on every start.
fn count_start(dir: &Path, role: &str) -> Result<u32, DeployError> {
    let name = format!("{role}.starts");
    let path = dir.join(&name);
    let starts = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map_err(|_| DeployError::BadLayoutFile {
            path: path.clone(),
            problem: super::LayoutFileProblem::NotACount(text.to_string()),
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
        Err(error) => return Err(DeployError::Io { path, error }),
    };
    let starts = starts.checked_add(1).ok_or_else(|| DeployError::Layout(format!("{role} started too often")))?;
    write_durably(dir, &name, &format!("{starts}\n"))?;
    Ok(starts)
}

/// Binds the role's port; a port still held (by the connections of the role's previous life,
/// or a process that let it go a moment ago) is tried again for a few seconds.
async fn listen(plan: &ProcessPlan, role: &str) -> Result<TcpListener, DeployError> {
    let address = plan.address(role).ok_or_else(|| DeployError::Layout(format!("no role {role:?} in the plan")))?;
    let started = Instant::now();
    loop {
        match TcpListener::bind(address).await {
            Ok(listener) => return Ok(listener),
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < Duration::from_secs(10) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(DeployError::Io { path: format!("{role} at {address}").into(), error }),
        }
    }
}

/// Serves `host` on `listener` until `stop` turns true.
fn serve_host(
    listener: TcpListener,
    host: Host,
    tls: Option<&Tls>,
    stop: &watch::Receiver<bool>,
) -> Result<(), DeployError> {
    let mut stop = stop.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let (_, server) = virga_net::serve_with_tls(listener, host, tls, shutdown)
        .map_err(|error| DeployError::Io { path: "a role's server".into(), error })?;
    tokio::spawn(server);
    Ok(())
}

/// Runs `role` of the cluster of processes in `dir` until `stop` turns true. `ready` is
/// called with the address it serves once it does.
pub async fn run_role(
    dir: &Path,
    role: &str,
    options: &ClusterOptions,
    stop: watch::Receiver<bool>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), DeployError> {
    let plan = ProcessPlan::read(dir)?;
    let address = plan.address(role).ok_or_else(|| {
        let known: Vec<&str> = plan.roles.iter().map(|(name, _)| name.as_str()).collect();
        DeployError::Layout(format!("no role {role:?} in the plan (its roles: {})", known.join(", ")))
    })?;
    let _lock = super::lock_role(dir, role)?;
    let starts = count_start(dir, role)?;
    let tls = options.tls.as_ref();
    let transport = plan.transport(tls);
    let listener = listen(&plan, role).await?;
    let metrics = match options.metrics {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .map_err(|error| DeployError::Io { path: format!("the metrics endpoint {address}").into(), error })?,
        ),
        None => None,
    };
    let mut serving = Serving { listener, transport: Arc::clone(&transport), tls, metrics, stop: stop.clone() };
    let replicas: Vec<String> = config_peers().into_iter().map(|(_, name)| name).collect();
    let map = initial_map(&plan.shape)?;
    if let Some((id, _)) = config_peers().into_iter().find(|(_, name)| name == role) {
        let mut config = ReplicaConfig::new(id, config_peers(), id + u64::from(starts) * 1000);
        config.sync = options.sync;
        let (core, disk) = open_replica(config, storage(dir, role)?).map_err(|e| open_failed(role, e.to_string()))?;
        serve_core(role, core, disk, serving, RoleReader::Config, || ready(address)).await?;
    } else if role.starts_with("data-") {
        let mut config = DataConfig::new(role, map);
        config.config_replicas = replicas;
        config.session = format!("{role}@{starts}");
        config.sync = options.sync;
        config.snapshot_window = options.snapshot_window;
        let (core, disk) = open_data_node(config, storage(dir, role)?).map_err(|e| open_failed(role, e.to_string()))?;
        serve_core(role, core, disk, serving, RoleReader::Data, || ready(address)).await?;
    } else if let Some(index) = crate::kairos::validator_index(role) {
        let mut config = ValidatorConfig::new(index, map);
        config.config_replicas = replicas;
        // Its state is volatile: a restart starts above every vote it may have cast.
        config.fresh = starts == 1;
        serve_core(role, ValidatorCore::new(config), NoIo, serving, RoleReader::Validator, || ready(address)).await?;
    } else {
        let client_id = 1_000_000 + starts;
        propose_install(transport.clone(), &replicas, map.clone(), client_id, options.start_within).await?;
        let mut config = TxnClientConfig::new(client_id, map);
        config.config_replicas = replicas;
        config.validators = super::validator_names(&plan.shape);
        let running = Mailbox::<TxnClient>::new().run(
            format!("client-{client_id}"),
            TxnClient::new(config),
            transport as _,
            NoIo,
            stop.clone(),
        );
        let wait_for = running.with_core(|client| client.config().op_deadline) + Duration::from_secs(5);
        let kv = Kv::new(LocalKv::new(running.input_sender(), wait_for));
        export(role, serving.metrics.take(), RoleReader::Client(running.reader()), &stop)?;
        serve_api(serving, kv)?;
        ready(address);
        wait(stop).await;
        running.join().await;
    }
    Ok(())
}

/// Where and how a role serves: its listener, its transport to the others, TLS, and the
/// switch that stops it.
struct Serving<'a> {
    listener: TcpListener,
    transport: Arc<Grpc>,
    tls: Option<&'a Tls>,
    /// Where to serve the role's metrics.
    metrics: Option<TcpListener>,
    stop: watch::Receiver<bool>,
}

/// Runs a replica's or a data node's core, serving its peers (and its metrics), until `stop`.
async fn serve_core<R, X>(
    role: &str,
    core: R,
    disk: X,
    serving: Serving<'_>,
    reader: fn(CoreReader<R>) -> RoleReader,
    ready: impl FnOnce(),
) -> Result<(), DeployError>
where
    R: virga_net::role::Role<Protocol = Dkv>,
    X: virga_net::role::IoExecutor<R>,
{
    let Serving { listener, transport, tls, metrics, stop } = serving;
    let mailbox = Mailbox::<R>::new();
    serve_host(listener, Host::new().with::<Dkv>(mailbox.handler()), tls, &stop)?;
    let running = mailbox.run(role, core, transport as _, disk, stop.clone());
    export(role, metrics, reader(running.reader()), &stop)?;
    ready();
    wait(stop).await;
    running.join().await;
    Ok(())
}

/// Serves `role`'s metrics on `listener`, if any, until `stop`.
fn export(
    role: &str,
    listener: Option<TcpListener>,
    reader: RoleReader,
    stop: &watch::Receiver<bool>,
) -> Result<(), DeployError> {
    let Some(listener) = listener else { return Ok(()) };
    let mut metrics = RoleMetrics::default();
    metrics.add(role, reader);
    let mut stop = stop.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let (_, server) = serve_metrics(listener, metrics, shutdown)
        .map_err(|error| DeployError::Io { path: "the metrics endpoint".into(), error })?;
    tokio::spawn(server);
    Ok(())
}

async fn wait(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

fn serve_api(serving: Serving<'_>, kv: Kv<LocalKv>) -> Result<(), DeployError> {
    let Serving { listener, tls, mut stop, .. } = serving;
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let (_, server) = crate::api::grpc::serve(listener, kv, tls, shutdown)
        .map_err(|error| DeployError::Io { path: "the API server".into(), error })?;
    tokio::spawn(server);
    Ok(())
}

/// Proposes the first layout (refused, harmlessly, once one is installed) and waits for the
/// service's answer.
async fn propose_install(
    transport: Arc<Grpc>,
    replicas: &[String],
    map: crate::ShardMap,
    client_id: u32,
    within: Duration,
) -> Result<(), DeployError> {
    let session = format!("admin@{client_id}");
    let (stop, stopped) = watch::channel(false);
    let admin = Mailbox::<ConfigClient>::new().run(
        session.clone(),
        ConfigClient::new(ConfigClientConfig::new(&session, replicas.to_vec())),
        transport as Arc<dyn Transport<Dkv>>,
        NoIo,
        stopped,
    );
    admin.input(vec![ConfigCommand::Install(map)]);
    let started = Instant::now();
    let mut answered = false;
    while !answered && started.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(20)).await;
        answered = admin.with_core(|admin| !admin.outcomes().is_empty());
    }
    let _ = stop.send(true);
    admin.join().await;
    if answered {
        Ok(())
    } else {
        Err(DeployError::NotStarted(format!(
            "the configuration service did not answer within {within:?}: are config-1, config-2 and config-3 running?"
        )))
    }
}
