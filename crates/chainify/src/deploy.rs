//! ChainifyDB's servers as processes of their own over gRPC (`virga chainify node`): `init`
//! writes a deployment directory (the organizations, every server's loopback address, the
//! keys, the pipeline's settings); each process then runs one or more named servers of it
//! (an orderer replica, or an organization's ChainifyServer, ExecutionServer or
//! CommitServer) with the role cores of [`crate::pipeline`] under the tokio driver; clients
//! run SmallBank against them. Everything a server must not lose survives a SIGKILL: the
//! organization's database and ledger, an orderer replica's Raft log and a commit server's
//! votes are on disk and synced before they are acted on.
//!
//! The directory holds `deployment.json`, `consortium.json` (so that `virga chainify verify`
//! checks it), and per organization `ledger/`, `votes/` and its database; per orderer
//! replica `raft/`. The keys are in `deployment.json` in the clear: a deployment on one
//! machine, for tests and measurements.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::AgreementPolicy;
use virga_net::driver::{CoreReader, Mailbox};
use virga_net::{Grpc, Host};

use crate::consortium::Member;
use crate::keys::{Keys, PipelineSettings, LOADER};
use crate::ledger::Ledger;
use crate::pipeline::chainify_server::ChainifyServer;
use crate::pipeline::client::{ClientConfig, ClientCore};
use crate::pipeline::commit::CommitServer;
use crate::pipeline::device::{OrdererLog, OrganizationDevice, VoteLog};
use crate::pipeline::execution::ExecutionServer;
use crate::pipeline::node::{ChainifyNode, NodeDevice};
use crate::pipeline::orderer::{founding_records, OrderingServer};
use crate::pipeline::{node_name, orderer_names, PipelineConfig};
use crate::postgres_server::PostgresServer;
use crate::run::{layout, open_organization, OrganizationInfo, RunError, LAYOUT_FILE};
use crate::smallbank::Skew;

/// The file describing a deployment.
pub const DEPLOYMENT_FILE: &str = "deployment.json";

/// The servers of an organization, by role.
const ROLES: [&str; 3] = ["chainify", "exec", "commit"];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deployment {
    pub organizations: Vec<OrganizationInfo>,
    /// Every server's name and the address it listens on.
    pub addresses: BTreeMap<String, String>,
    /// Secret keys, hex: each organization's, the ordering service's, each client's.
    pub organization_keys: BTreeMap<String, String>,
    pub orderer_key: String,
    pub clients: BTreeMap<String, DeployedClient>,
    pub orderers: usize,
    pub customers: u64,
    /// c of k organizations must share a LedgerBlock hash.
    pub agree: usize,
    pub block_size: usize,
    pub batch_size: usize,
    pub checkpoint_every: u64,
    /// Connections per organization running a block's stages (0: serially).
    pub workers: usize,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeployedClient {
    pub key: String,
    pub organization: String,
}

#[derive(Debug, Clone)]
pub struct InitOptions {
    pub sqlite_only: bool,
    pub customers: u64,
    pub orderers: usize,
    pub clients: usize,
    pub host: String,
    /// Servers listen on consecutive ports from here: the orderer replicas, then each
    /// organization's ChainifyServer, ExecutionServer and CommitServer.
    pub base_port: u16,
    pub agree: usize,
    pub block_size: usize,
    pub batch_size: usize,
    pub checkpoint_every: u64,
    pub workers: usize,
    pub seed: u64,
}

fn io_error(what: &Path, error: impl std::fmt::Display) -> RunError {
    RunError::Io(format!("{}: {error}", what.display()))
}

fn random_key() -> SigningKey {
    loop {
        // Almost every 32 random bytes are a valid scalar.
        if let Ok(key) = SigningKey::from_bytes(&rand::random::<[u8; 32]>()) {
            return key;
        }
    }
}

fn hex(key: &SigningKey) -> String {
    key.to_bytes().iter().map(|byte| format!("{byte:02x}")).collect()
}

fn key_from_hex(owner: &str, text: &str) -> Result<SigningKey, RunError> {
    let bad = |problem: &str| RunError::Io(format!("{DEPLOYMENT_FILE}: the key of {owner} {problem}"));
    if text.len() != 64 || !text.is_ascii() {
        return Err(bad("is not 64 hex digits"));
    }
    let bytes: Vec<u8> = (0..32)
        .map(|at| u8::from_str_radix(&text[2 * at..2 * at + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad("is not 64 hex digits"))?;
    SigningKey::from_bytes(&bytes).map_err(|error| bad(&format!("is not a key: {error}")))
}

/// Writes a new deployment into `dir` (which must not hold one).
pub fn init(dir: &Path, options: &InitOptions) -> Result<Deployment, RunError> {
    for file in [DEPLOYMENT_FILE, LAYOUT_FILE] {
        if dir.join(file).exists() {
            return Err(RunError::Layout {
                path: dir.join(file),
                problem: "already holds a consortium: give a new directory".to_string(),
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|error| io_error(dir, error))?;
    let organizations = layout(options.sqlite_only);
    let mut names = orderer_names(options.orderers.max(1));
    for info in &organizations {
        names.extend(ROLES.iter().map(|role| node_name(&info.name, role)));
    }
    let mut addresses = BTreeMap::new();
    for (at, name) in names.into_iter().enumerate() {
        let port = u16::try_from(usize::from(options.base_port) + at)
            .map_err(|_| RunError::Io(format!("--base-port {} leaves no room for every server", options.base_port)))?;
        addresses.insert(name, format!("{}:{port}", options.host));
    }
    let mut clients = BTreeMap::new();
    let first = organizations.first().map(|info| info.name.clone()).unwrap_or_default();
    clients.insert(LOADER.to_string(), DeployedClient { key: hex(&random_key()), organization: first });
    for at in 0..options.clients {
        let organization = organizations[at % organizations.len()].name.clone();
        clients.insert(format!("client-{}", at + 1), DeployedClient { key: hex(&random_key()), organization });
    }
    let deployment = Deployment {
        organization_keys: organizations.iter().map(|info| (info.name.clone(), hex(&random_key()))).collect(),
        organizations,
        addresses,
        orderer_key: hex(&random_key()),
        clients,
        orderers: options.orderers.max(1),
        customers: options.customers,
        agree: options.agree,
        block_size: options.block_size,
        batch_size: options.batch_size,
        checkpoint_every: options.checkpoint_every,
        workers: options.workers,
        seed: options.seed,
    };
    deployment.policy()?;
    let write = |file: &str, json: Result<String, serde_json::Error>| {
        let path = dir.join(file);
        let json = json.map_err(|error| io_error(&path, error))?;
        std::fs::write(&path, json).map_err(|error| io_error(&path, error))
    };
    write(LAYOUT_FILE, serde_json::to_string_pretty(&deployment.organizations))?;
    write(DEPLOYMENT_FILE, serde_json::to_string_pretty(&deployment))?;
    Ok(deployment)
}

/// Reads the deployment in `dir`.
pub fn read(dir: &Path) -> Result<Deployment, RunError> {
    let path = dir.join(DEPLOYMENT_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|error| RunError::Layout { path: path.clone(), problem: format!("{error} (run `init` first)") })?;
    let deployment: Deployment = serde_json::from_str(&text)
        .map_err(|error| RunError::Layout { path: path.clone(), problem: error.to_string() })?;
    deployment.policy()?;
    Ok(deployment)
}

impl Deployment {
    pub fn policy(&self) -> Result<AgreementPolicy, RunError> {
        AgreementPolicy::new(self.agree, self.organizations.len())
            .map_err(|error| RunError::Io(format!("{DEPLOYMENT_FILE}: {error}")))
    }

    pub fn keys(&self) -> Result<Keys, RunError> {
        let orgs = self
            .organization_keys
            .iter()
            .map(|(name, key)| Ok((name.clone(), key_from_hex(name, key)?)))
            .collect::<Result<_, RunError>>()?;
        let clients = self
            .clients
            .iter()
            .map(|(name, client)| Ok((name.clone(), (key_from_hex(name, &client.key)?, client.organization.clone()))))
            .collect::<Result<_, RunError>>()?;
        Ok(Keys { orgs, clients, orderer: key_from_hex("the ordering service", &self.orderer_key)? })
    }

    pub fn pipeline_config(&self, keys: &Keys) -> Result<PipelineConfig, RunError> {
        Ok(keys.pipeline_config(PipelineSettings {
            orderers: self.orderers,
            policy: self.policy()?,
            batch_size: self.batch_size,
            block_size: self.block_size,
            checkpoint_every: self.checkpoint_every,
        }))
    }

    /// Every server's name: the orderer replicas, then each organization's.
    pub fn servers(&self) -> Vec<String> {
        self.addresses.keys().cloned().collect()
    }

    fn transport(&self) -> Arc<Grpc> {
        let dialled = |address: &String| format!("http://{address}");
        Grpc::new(
            self.addresses.iter().map(|(name, address)| (name.clone(), dialled(address))).collect::<HashMap<_, _>>(),
        )
    }
}

/// A server ready to run: its core, its device, its organization's database (shared with
/// the device) and the PostgreSQL server that database needs.
struct Built {
    node: ChainifyNode,
    device: NodeDevice,
    member: Option<Arc<Mutex<Member>>>,
    postgres: Option<PostgresServer>,
}

fn build(
    dir: &Path,
    deployment: &Deployment,
    keys: &Keys,
    config: &Arc<PipelineConfig>,
    name: &str,
) -> Result<Built, RunError> {
    if let Some(at) = config.orderers.iter().position(|orderer| orderer == name) {
        let origin = deployment.organizations.first().map(|info| info.name.as_str()).unwrap_or_default();
        let replicas = config.orderers.len();
        let founding =
            || founding_records(replicas, &keys.genesis(deployment.customers, origin).into_iter().collect::<Vec<_>>());
        let log =
            OrdererLog::open(dir.join(name).join("raft"), founding).map_err(|error| RunError::Io(error.to_string()))?;
        let core = OrderingServer::new(name, keys.orderer.clone(), Arc::clone(config), deployment.seed + at as u64);
        return Ok(Built {
            node: ChainifyNode::Orderer(Box::new(core)),
            device: NodeDevice::Orderer(log),
            member: None,
            postgres: None,
        });
    }
    let unknown =
        || RunError::Io(format!("{name} is no server of this deployment (its servers: {:?})", deployment.servers()));
    let (org, role) = name.split_once('/').ok_or_else(unknown)?;
    let info = deployment.organizations.iter().find(|info| info.name == org).ok_or_else(unknown)?;
    let key = keys.orgs.get(org).cloned().ok_or_else(unknown)?;
    let home = dir.join(org);
    match role {
        "chainify" => {
            let core = ChainifyServer::new(org, key, Arc::clone(config));
            let node = ChainifyNode::Chainify(Box::new(core));
            Ok(Built { node, device: NodeDevice::None, member: None, postgres: None })
        }
        "commit" => {
            let votes = VoteLog::open(home.join("votes")).map_err(|error| RunError::Io(error.to_string()))?;
            let core = CommitServer::new(org, key, Arc::clone(config), None);
            let node = ChainifyNode::Commit(Box::new(core));
            Ok(Built { node, device: NodeDevice::Votes(votes), member: None, postgres: None })
        }
        "exec" => {
            let ledger = Ledger::open(&home.join("ledger"))?;
            // A fresh organization installs its tables and triggers; one that restarts
            // attaches, and its first device operation brings the database to its ledger.
            let install = ledger.blocks().is_empty();
            let (organization, postgres) = open_organization(dir, info, install, deployment.workers)?;
            let member = Arc::new(Mutex::new(Member::new(organization, ledger)));
            let device = OrganizationDevice::new(Arc::clone(&member), config.checkpoint_every, config.keep_checkpoints);
            let core = ExecutionServer::new(org, Arc::clone(config), None);
            Ok(Built {
                node: ChainifyNode::Execution(Box::new(core)),
                device: NodeDevice::Organization(Box::new(device)),
                member: Some(member),
                postgres,
            })
        }
        _ => Err(unknown()),
    }
}

/// The named servers of a deployment, built, with their databases open.
pub struct Servers {
    deployment: Deployment,
    built: Vec<(String, Built)>,
}

/// The servers' databases. Drop them only once the runtime that ran the servers is gone:
/// the PostgreSQL client blocks on a runtime of its own, which may neither open nor close
/// a connection inside another.
pub struct Databases {
    _members: Vec<Arc<Mutex<Member>>>,
    _postgres: Vec<PostgresServer>,
}

/// Builds the servers `names` of the deployment in `dir` and opens their databases
/// (starting an organization's PostgreSQL server): call it before starting the runtime.
pub fn open_servers(dir: &Path, names: &[String]) -> Result<(Servers, Databases), RunError> {
    let deployment = read(dir)?;
    let keys = deployment.keys()?;
    let config = Arc::new(deployment.pipeline_config(&keys)?);
    let mut databases = Databases { _members: Vec::new(), _postgres: Vec::new() };
    let mut built = Vec::new();
    for name in names {
        let mut server = build(dir, &deployment, &keys, &config, name)?;
        databases._members.extend(server.member.take());
        databases._postgres.extend(server.postgres.take());
        built.push((name.clone(), server));
    }
    Ok((Servers { deployment, built }, databases))
}

/// Runs `servers`, each listening on its address, until `shutdown` turns true; `ready`
/// hears of each server once it listens.
pub async fn run_servers(
    servers: Servers,
    shutdown: watch::Receiver<bool>,
    ready: &mut dyn FnMut(&str, std::net::SocketAddr),
) -> Result<(), RunError> {
    let transport = servers.deployment.transport();
    let mut served = Vec::new();
    for (name, built) in servers.built {
        let address = &servers.deployment.addresses[&name];
        let listener = tokio::net::TcpListener::bind(address.as_str())
            .await
            .map_err(|error| RunError::Io(format!("{name}: listening on {address}: {error}")))?;
        let mailbox: Mailbox<ChainifyNode> = Mailbox::new();
        let host = Host::new().with::<crate::pipeline::ChainifyProtocol>(mailbox.handler());
        let mut stopped = shutdown.clone();
        let stop = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let (bound, server) =
            virga_net::serve(listener, host, stop).map_err(|error| RunError::Io(format!("{name}: {error}")))?;
        let transport = Arc::clone(&transport) as _;
        mailbox.run(name.clone(), built.node, transport, built.device, shutdown.clone());
        served.push(tokio::spawn(server));
        ready(&name, bound);
    }
    for server in served {
        let _ = server.await;
    }
    Ok(())
}

/// What `virga chainify node client` saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientReport {
    pub clients: usize,
    pub sent: u64,
    pub answered: u64,
    pub successful: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub seconds: f64,
    pub tps: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// The first few refusals, with their reasons.
    pub refusals: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The deployment's clients to run (names from `init`).
    pub names: Vec<String>,
    /// Proposals each client sends.
    pub transactions: u64,
    pub window: usize,
    pub skew: Skew,
    /// The longest the run may take.
    pub limit: Duration,
}

/// Runs SmallBank clients against the deployment in `dir` until each has its answers (or
/// `limit` passes); `progress` hears of the answers so far.
pub async fn run_clients(
    dir: &Path,
    options: &ClientOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ClientReport, RunError> {
    let deployment = read(dir)?;
    let keys = deployment.keys()?;
    let transport = deployment.transport();
    // Above any number an earlier run of the same client used (one a microsecond at most).
    let first_seq = virga_net::driver::system_now() / 1_000;
    let (stop, shutdown) = watch::channel(false);
    let mut readers: Vec<CoreReader<ChainifyNode>> = Vec::new();
    for (at, name) in options.names.iter().enumerate() {
        let (key, organization) = keys
            .clients
            .get(name)
            .filter(|_| name != LOADER)
            .cloned()
            .ok_or_else(|| RunError::Io(format!("{name} is no client of this deployment")))?;
        let config = ClientConfig {
            name: name.clone(),
            organization,
            window: options.window,
            transactions: options.transactions,
            customers: deployment.customers,
            skew: options.skew,
            seed: deployment.seed ^ first_seq ^ at as u64,
            deadline: Duration::from_secs(20),
            first_seq,
        };
        let node = ChainifyNode::Client(Box::new(ClientCore::new(config, key)));
        let running =
            Mailbox::new().run(name.clone(), node, Arc::clone(&transport) as _, NodeDevice::None, shutdown.clone());
        readers.push(running.reader());
    }
    let started = Instant::now();
    let mut report = ClientReport { clients: readers.len(), ..ClientReport::default() };
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut done = true;
        let mut latencies = Vec::new();
        report.refusals.clear();
        (report.sent, report.answered, report.successful, report.refused, report.timed_out) = (0, 0, 0, 0, 0);
        for reader in &readers {
            reader.with_core(|node| {
                let ChainifyNode::Client(client) = node else { return };
                let stats = client.stats();
                done &= client.is_done();
                report.sent += stats.sent;
                report.answered += stats.outcomes.len() as u64;
                report.successful += stats.outcomes.iter().filter(|outcome| outcome.successful).count() as u64;
                report.refused += stats.refused.len() as u64;
                report.timed_out += stats.timed_out;
                report.refusals.extend(stats.refused.iter().take(4).cloned());
                latencies.extend(stats.latencies.iter().copied());
            });
        }
        progress(report.answered, report.sent);
        report.seconds = started.elapsed().as_secs_f64();
        if done || started.elapsed() > options.limit {
            latencies.sort_unstable();
            report.latency_p50_ms = crate::bench::percentile(&latencies, 0.5);
            report.latency_p99_ms = crate::bench::percentile(&latencies, 0.99);
            report.tps = report.answered as f64 / report.seconds.max(1e-9);
            break;
        }
    }
    let _ = stop.send(true);
    Ok(report)
}
