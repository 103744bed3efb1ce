//! `virga bench chainify`: the pipeline's servers (the role cores of [`crate::pipeline`])
//! under the tokio driver in one process, every message crossing the wire encoding on the
//! in-process transport, over three organizations' real databases (two PostgreSQL and one
//! SQLite, or three SQLite), with SmallBank clients; the seed's Table 4.2 and Fig. 4.11a
//! shape (throughput against the number of clients, Zipf and uniform), each point next to
//! one PostgreSQL alone running the same kind of transactions on as many connections, in
//! the same run, interleaved.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use tokio::sync::watch;
use virga_ledger::wlc::{AgreementPolicy, SignatureCounts};
use virga_net::driver::{CoreReader, Mailbox};
use virga_net::InProc;

use crate::consortium::Member;
use crate::keys::{Keys, PipelineSettings};
use crate::ledger::Ledger;
use crate::pipeline::chainify_server::ChainifyServer;
use crate::pipeline::client::{ClientConfig, ClientCore};
use crate::pipeline::commit::CommitServer;
use crate::pipeline::device::{OrdererLog, OrganizationDevice, VoteLog};
use crate::pipeline::execution::ExecutionServer;
use crate::pipeline::node::{ChainifyNode, NodeDevice};
use crate::pipeline::orderer::{founding_records, OrderingServer};
use crate::pipeline::{node_name, PipelineConfig};
use crate::run::{layout, open, Alone, OrganizationInfo, RunError};
use crate::smallbank::{self, Skew};

mod recovery;
mod signature_costs;

pub use self::recovery::{RecoveryPoint, TAMPER_SQL};
pub use self::signature_costs::SignatureCosts;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub dir: PathBuf,
    pub sqlite_only: bool,
    pub customers: u64,
    /// The numbers of clients, each a point (the seed's 3, 6, 12, 24).
    pub clients: Vec<usize>,
    pub skews: Vec<Skew>,
    pub policy: AgreementPolicy,
    /// Rounds of every point, interleaved.
    pub runs: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Proposals each client keeps in flight.
    pub window: usize,
    pub block_size: usize,
    pub batch_size: usize,
    /// Database connections each organization executes a block's stages on (0: serial).
    pub workers: usize,
    /// Transactions PostgreSQL alone runs per point.
    pub alone_transactions: usize,
    /// Replicas of the ordering service's Raft group.
    pub orderers: usize,
    /// After the points, tamper with the last organization's database and time its recovery.
    pub tamper: bool,
    pub seed: u64,
}

/// One point: a number of clients under one skew, in one round.
#[derive(Debug, Clone, Serialize)]
pub struct BenchPoint {
    pub round: usize,
    pub clients: usize,
    pub skew: String,
    /// Transactions answered a second (each executed by every organization).
    pub tps: f64,
    pub answered: u64,
    pub successful: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// The share of the execution servers' time (summed over organizations) spent executing
    /// on the database, waiting for the vote, and appending or recovering.
    pub execute_share: f64,
    pub decide_share: f64,
    pub apply_share: f64,
    /// Signatures made and checked per answered transaction, everywhere in the pipeline
    /// (proposals, agreements, ordered blocks, votes), and their estimated share of the
    /// machine's time: the counts times [`SignatureCosts`], over every core.
    pub signed_per_transaction: f64,
    pub checked_per_transaction: f64,
    pub crypto_share: f64,
    /// PostgreSQL alone on `clients` connections, measured right after; absent with
    /// `--sqlite-only`.
    pub postgres_alone_tps: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub organizations: Vec<OrganizationInfo>,
    pub policy: String,
    pub customers: u64,
    pub block_size: usize,
    pub window: usize,
    pub workers: usize,
    pub durability: String,
    pub load_seconds: f64,
    pub signature_costs: SignatureCosts,
    pub points: Vec<BenchPoint>,
    /// The tampering phase, when it ran; or why it did not run, or how it failed.
    pub recovery: Option<RecoveryPoint>,
    pub recovery_skipped: Option<String>,
    pub recovery_failed: Option<String>,
}

/// How the organizations and PostgreSQL alone make transactions durable.
pub fn durability(workers: usize, more: &str) -> String {
    let commits = if workers == 0 {
        "organizations commit once a block (each transaction in a savepoint; no client is answered before its block is decided)"
    } else {
        "organizations commit each transaction (staged on worker connections)"
    };
    format!(
        "PostgreSQL synchronous_commit = on, SQLite synchronous = FULL (WAL); {commits}; PostgreSQL alone commits each transaction{more}"
    )
}

fn skew_name(skew: Skew) -> String {
    match skew {
        Skew::Uniform => "uniform".to_string(),
        Skew::Zipf(exponent) => format!("zipf:{exponent}"),
    }
}

/// The servers running in this process, and readers of their cores.
struct Running {
    transport: Arc<InProc>,
    execs: Vec<CoreReader<ChainifyNode>>,
    orderers: Vec<CoreReader<ChainifyNode>>,
    signature_costs: SignatureCosts,
}

fn spawn(
    transport: &Arc<InProc>,
    name: &str,
    node: ChainifyNode,
    device: NodeDevice,
    shutdown: watch::Receiver<bool>,
) -> CoreReader<ChainifyNode> {
    let mailbox: Mailbox<ChainifyNode> = Mailbox::new();
    transport.register::<crate::pipeline::ChainifyProtocol>(name.to_string(), mailbox.handler());
    let running = mailbox.run(name.to_string(), node, Arc::clone(transport) as _, device, shutdown);
    running.reader()
}

fn exec_of(node: &ChainifyNode) -> Option<&ExecutionServer> {
    match node {
        ChainifyNode::Execution(core) => Some(core),
        _ => None,
    }
}

fn client_of(node: &ChainifyNode) -> Option<&ClientCore> {
    match node {
        ChainifyNode::Client(core) => Some(core),
        _ => None,
    }
}

/// The execution servers' heights, and their summed (execute, decide, apply) times.
fn exec_state(running: &Running) -> (Vec<u64>, [u64; 3]) {
    let mut heights = Vec::new();
    let mut times = [0; 3];
    for reader in &running.execs {
        reader.with_core(|node| {
            if let Some(exec) = exec_of(node) {
                heights.push(exec.height());
                let stats = exec.stats();
                times[0] += stats.execute_ns;
                times[1] += stats.decide_ns;
                times[2] += stats.apply_ns;
            }
        });
    }
    (heights, times)
}

/// The most blocks an orderer replica has applied.
fn orderer_height(running: &Running) -> u64 {
    let heights = running.orderers.iter().map(|reader| {
        reader.with_core(|node| match node {
            ChainifyNode::Orderer(core) => core.blocks().len() as u64,
            _ => 0,
        })
    });
    heights.max().unwrap_or(0)
}

/// Waits until every organization holds every ordered block (the orderers' log holds the
/// genesis, so at least one).
async fn drain(running: &Running, limit: Duration) -> Result<(), RunError> {
    let started = Instant::now();
    loop {
        let ordered = orderer_height(running);
        let (heights, _) = exec_state(running);
        if ordered > 0 && heights.iter().all(|height| *height >= ordered) {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(RunError::Io(format!(
                "the organizations hold {heights:?} of {ordered} ordered blocks after {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)] as f64 / 1e6
}

/// Runs the benchmark; `progress` hears of each point as it is measured.
///
/// The databases are opened, and PostgreSQL alone started, before the runtime: the
/// `postgres` client runs a runtime of its own, which may not start inside another. The
/// databases are closed after it, for the same reason.
pub fn run(config: &BenchConfig, progress: &mut dyn FnMut(&BenchPoint)) -> Result<BenchReport, RunError> {
    std::fs::create_dir_all(&config.dir).map_err(|error| RunError::Io(format!("{}: {error}", config.dir.display())))?;
    let infos = layout(config.sqlite_only);
    let opened = open(&config.dir, &infos, true, config.workers)?;
    let mut members = Vec::new();
    for (organization, info) in opened.organizations.into_iter().zip(&infos) {
        let ledger = Ledger::open(&config.dir.join(&info.name).join("ledger"))?;
        members.push(Arc::new(Mutex::new(Member::new(organization, ledger))));
    }
    let connections = config.clients.iter().copied().max().unwrap_or(1);
    let mut alone = match config.sqlite_only {
        true => None,
        false => Some(Alone::start(&config.dir.join("alone"), config.customers, connections)?),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| RunError::Io(format!("starting the runtime: {error}")))?;
    // Measured while nothing else runs: the servers would otherwise share the cores with it.
    let signature_costs = SignatureCosts::measure();
    let result = runtime.block_on(run_async(config, &infos, &members, alone.as_mut(), signature_costs, progress));
    drop(runtime);
    drop(members);
    drop(alone);
    drop(opened.servers);
    result
}

#[allow(clippy::too_many_lines)] // Predates the lint: a debt, to split.
async fn run_async(
    config: &BenchConfig,
    infos: &[OrganizationInfo],
    members: &[Arc<Mutex<Member>>],
    mut alone: Option<&mut Alone>,
    signature_costs: SignatureCosts,
    progress: &mut dyn FnMut(&BenchPoint),
) -> Result<BenchReport, RunError> {
    let mut points_plan = Vec::new();
    for round in 0..config.runs.max(1) {
        for skew in &config.skews {
            for clients in &config.clients {
                points_plan.push((round, *skew, *clients));
            }
        }
    }
    // The tampering phase's clients come after the points' and are as many as the most.
    let most_clients = config.clients.iter().copied().max().unwrap_or(1);
    let tamper_point = points_plan.len();
    let client_counts = points_plan.iter().map(|(_, _, clients)| *clients).chain(config.tamper.then_some(most_clients));
    let client_names: Vec<String> = client_counts
        .enumerate()
        .flat_map(|(point, clients)| (0..clients).map(move |at| format!("client-{point}-{at}")))
        .collect();
    let keys = Keys::from_seeds(infos, &client_names);
    let pipeline = Arc::new(keys.pipeline_config(PipelineSettings {
        orderers: config.orderers,
        policy: config.policy,
        batch_size: config.batch_size,
        block_size: config.block_size,
        checkpoint_every: 1_000_000,
    }));
    let genesis = keys.genesis(config.customers, &infos[0].name).ok_or(RunError::Io("no loader key".to_string()))?;
    let founding = founding_records(pipeline.orderers.len(), &[genesis]);
    let transport = InProc::new();
    let (stop_servers, servers_shutdown) = watch::channel(false);
    let orderers: Vec<CoreReader<ChainifyNode>> = pipeline
        .orderers
        .iter()
        .enumerate()
        .map(|(at, name)| {
            let core = OrderingServer::new(name, keys.orderer.clone(), Arc::clone(&pipeline), config.seed + at as u64);
            let log = OrdererLog::with_records(founding.clone());
            let device = NodeDevice::Orderer(log);
            spawn(&transport, name, ChainifyNode::Orderer(Box::new(core)), device, servers_shutdown.clone())
        })
        .collect();
    let mut execs = Vec::new();
    for (member, info) in members.iter().zip(infos) {
        let member = Arc::clone(member);
        let key = keys.orgs[&info.name].clone();
        let org = info.name.as_str();
        let device = OrganizationDevice::new(member, pipeline.checkpoint_every, pipeline.keep_checkpoints);
        execs.push(spawn(
            &transport,
            &node_name(org, "exec"),
            ChainifyNode::Execution(Box::new(ExecutionServer::new(org, Arc::clone(&pipeline), None))),
            NodeDevice::Organization(Box::new(device)),
            servers_shutdown.clone(),
        ));
        spawn(
            &transport,
            &node_name(org, "commit"),
            ChainifyNode::Commit(Box::new(CommitServer::new(org, key.clone(), Arc::clone(&pipeline), None))),
            NodeDevice::Votes(VoteLog::default()),
            servers_shutdown.clone(),
        );
        spawn(
            &transport,
            &node_name(org, "chainify"),
            ChainifyNode::Chainify(Box::new(ChainifyServer::new(org, key, Arc::clone(&pipeline)))),
            NodeDevice::None,
            servers_shutdown.clone(),
        );
    }
    let running = Running { transport, execs, orderers, signature_costs };
    let started = Instant::now();
    drain(&running, Duration::from_secs(3600)).await?;
    let load_seconds = started.elapsed().as_secs_f64();
    let mut report = BenchReport {
        organizations: infos.to_vec(),
        policy: format!("any {} of {}", config.policy.agree, config.policy.of),
        customers: config.customers,
        block_size: config.block_size,
        window: config.window,
        workers: config.workers,
        durability: durability(
            config.workers,
            &format!("; {} orderer replicas (Raft), their logs and the votes' in memory", pipeline.orderers.len()),
        ),
        load_seconds,
        signature_costs,
        points: Vec::new(),
        recovery: None,
        recovery_skipped: None,
        recovery_failed: None,
    };
    let mut rng = SmallRng::seed_from_u64(config.seed);
    for (point, (round, skew, clients)) in points_plan.into_iter().enumerate() {
        let mut measured = measure(config, &running, &pipeline, &keys, point, skew, clients).await?;
        measured.round = round;
        if let Some(alone) = alone.as_mut() {
            let transactions =
                smallbank::random_block_skewed(&mut rng, config.customers, config.alone_transactions, skew);
            measured.postgres_alone_tps = Some(alone.run_on(clients, &transactions));
        }
        progress(&measured);
        report.points.push(measured);
    }
    if config.tamper && config.policy.agree >= config.policy.of {
        // The pipeline has no second round of votes yet: a block the tampered organization
        // disagrees on can then never be decided.
        report.recovery_skipped = Some(format!(
            "under {}, the organizations that were not tampered with cannot decide a block without the one that was",
            report.policy
        ));
    } else if config.tamper {
        let skew = config.skews.first().copied().unwrap_or(Skew::Uniform);
        let recovered =
            recovery::tamper_and_recover(config, &running, members, &pipeline, &keys, tamper_point, most_clients, skew)
                .await;
        // The points stand whatever became of the tampering.
        match recovered {
            Ok(point) => report.recovery = Some(point),
            Err(error) => report.recovery_failed = Some(error.to_string()),
        }
    }
    let _ = stop_servers.send(true);
    Ok(report)
}

/// Clients running against the pipeline, and what stops them.
struct Clients {
    stop: watch::Sender<bool>,
    names: Vec<String>,
    readers: Vec<CoreReader<ChainifyNode>>,
}

/// What the clients had been answered at one moment.
struct Answered {
    answered: u64,
    successful: u64,
    /// Each client's latencies so far, so a window's latencies are those after it.
    latency_marks: Vec<usize>,
}

impl Clients {
    /// Starts `clients` clients named `client-{point}-{at}` (their keys are in `keys`).
    fn start(
        config: &BenchConfig,
        running: &Running,
        pipeline: &PipelineConfig,
        keys: &Keys,
        point: usize,
        skew: Skew,
        clients: usize,
    ) -> Clients {
        let (stop, shutdown) = watch::channel(false);
        let mut readers = Vec::new();
        let mut names = Vec::new();
        for at in 0..clients {
            let name = format!("client-{point}-{at}");
            let (key, org) = keys.clients[&name].clone();
            let client = ClientConfig {
                name: name.clone(),
                organization: org,
                window: config.window,
                transactions: u64::MAX,
                customers: config.customers,
                skew,
                seed: config.seed ^ ((point as u64) << 20) ^ at as u64,
                deadline: pipeline.call_deadline * 4,
                first_seq: 1,
            };
            readers.push(spawn(
                &running.transport,
                &name,
                ChainifyNode::Client(Box::new(ClientCore::new(client, key))),
                NodeDevice::None,
                shutdown.clone(),
            ));
            names.push(name);
        }
        Clients { stop, names, readers }
    }

    fn answered(&self) -> Answered {
        let mut counts = Answered { answered: 0, successful: 0, latency_marks: Vec::new() };
        for reader in &self.readers {
            reader.with_core(|node| {
                if let Some(client) = client_of(node) {
                    let stats = client.stats();
                    counts.answered += stats.outcomes.len() as u64;
                    counts.successful += stats.outcomes.iter().filter(|outcome| outcome.successful).count() as u64;
                    counts.latency_marks.push(stats.latencies.len());
                }
            });
        }
        counts
    }

    /// The latencies answered since `since`, sorted.
    fn latencies_since(&self, since: &Answered) -> Vec<u64> {
        let mut latencies: Vec<u64> = Vec::new();
        for (reader, mark) in self.readers.iter().zip(&since.latency_marks) {
            reader.with_core(|node| {
                if let Some(client) = client_of(node) {
                    latencies.extend(client.stats().latencies.iter().skip(*mark).copied());
                }
            });
        }
        latencies.sort_unstable();
        latencies
    }

    fn stop(self, running: &Running) {
        let _ = self.stop.send(true);
        for name in &self.names {
            running.transport.unregister(name);
        }
    }
}

/// One point: `clients` clients for the warm-up and the measured window, then drained.
async fn measure(
    config: &BenchConfig,
    running: &Running,
    pipeline: &Arc<PipelineConfig>,
    keys: &Keys,
    point: usize,
    skew: Skew,
    clients: usize,
) -> Result<BenchPoint, RunError> {
    let started = Clients::start(config, running, pipeline, keys, point, skew, clients);
    tokio::time::sleep(config.warmup).await;
    let before = started.answered();
    let (_, times_before) = exec_state(running);
    let signatures_before = SignatureCounts::now();
    let window_started = Instant::now();
    tokio::time::sleep(config.duration).await;
    let after = started.answered();
    let (_, times_after) = exec_state(running);
    let signatures = SignatureCounts::now().since(signatures_before);
    let seconds = window_started.elapsed().as_secs_f64();
    let latencies = started.latencies_since(&before);
    started.stop(running);
    drain(running, Duration::from_secs(600)).await?;
    let spent: Vec<f64> = (0..3).map(|at| times_after[at].saturating_sub(times_before[at]) as f64).collect();
    let total = spent.iter().sum::<f64>().max(1.0);
    let answered = after.answered - before.answered;
    let per_transaction = |count: u64| count as f64 / answered.max(1) as f64;
    Ok(BenchPoint {
        round: 0,
        clients,
        skew: skew_name(skew),
        tps: answered as f64 / seconds.max(1e-9),
        answered,
        successful: after.successful - before.successful,
        latency_p50_ms: percentile(&latencies, 0.5),
        latency_p99_ms: percentile(&latencies, 0.99),
        execute_share: spent[0] / total,
        decide_share: spent[1] / total,
        apply_share: spent[2] / total,
        signed_per_transaction: per_transaction(signatures.signed),
        checked_per_transaction: per_transaction(signatures.checked),
        crypto_share: running.signature_costs.share(signatures, seconds),
        postgres_alone_tps: None,
    })
}
