//! ChainifyDB's pipeline in the deterministic simulator: three organizations on in-memory
//! SQLite (real databases, and deterministic), an ordering service of three Raft replicas,
//! and clients, under the faults a seed draws: lost and duplicated messages, a lagging
//! organization, crashed and restarted servers (orderer replicas among them, and the
//! orderers' leader of the moment), and one faulty organization that lies about its effects,
//! has its database changed outside the chain, or both. One faulty organization is what
//! Any-2 of 3 tolerates.
//!
//! After the run every check of [`checks`] compares the organizations with an oracle: a
//! fresh database executing the ordered blocks serially.

mod checks;
mod disks;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{Agreement, AgreementPolicy, BlockCut, ChainedTx, Proposal, ProposalBatch};
use virga_sim::media::Planted;
use virga_sim::{LinkConfig, NetConfig, Sim, SimConfig};

use crate::consortium::Member;
use crate::ledger::Ledger;
use crate::organization::Organization;
use crate::pipeline::chainify_server::ChainifyServer;
use crate::pipeline::client::{ClientConfig, ClientCore};
use crate::pipeline::commit::{CommitServer, CommitWeakness};
use crate::pipeline::device::{OrdererLog, OrganizationDevice, VoteLog};
use crate::pipeline::execution::{ExecutionServer, ExecutionWeakness};
use crate::pipeline::node::{ChainifyNode, NodeDevice, PipelineNode};
use crate::pipeline::orderer::{founding_records, OrderingServer};
use crate::pipeline::{node_name, orderer_names, PipelineConfig, RaftTiming};
use crate::smallbank::{self, Skew};
use crate::sqlite::SqliteOrganization;

pub use checks::Violation;

/// The client that loads the customers in the first ordered blocks.
const LOADER: &str = "loader";
const MS: u64 = 1_000_000;

/// A deliberately broken protocol, which the checks must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weakening {
    /// Every commit server commits its own effects without waiting for the vote.
    CommitWithoutQuorum,
}

impl Weakening {
    pub fn name(self) -> &'static str {
        match self {
            Weakening::CommitWithoutQuorum => "commit-without-quorum",
        }
    }
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub seed: u64,
    /// Clients, one organization each in turn, and the proposals each sends.
    pub clients: usize,
    pub transactions: u64,
    pub customers: u64,
    /// Whether the seed draws faults; without, the run is the fault-free pipeline.
    pub faults: bool,
    /// With `faults`, one orderer replica that crashes also meets a media fault (`disks`).
    pub media_faults: bool,
    /// Force a faulty organization whose database is changed outside the chain.
    pub force_tamper: bool,
    pub weakening: Option<Weakening>,
    /// Every message crosses the wire encoding, decoded before a core sees it.
    pub wire: bool,
}

impl SimOptions {
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            clients: 3,
            transactions: 40,
            customers: 30,
            faults: true,
            media_faults: false,
            force_tamper: false,
            weakening: None,
            wire: false,
        }
    }

    /// The command that runs this seed again.
    pub fn replay_command(&self) -> String {
        let mut command = format!(
            "virga sim chainify --seeds 1 --first-seed {} --clients {} --transactions {}",
            self.seed, self.clients, self.transactions
        );
        if !self.faults {
            command.push_str(" --faults none");
        } else if self.media_faults {
            command.push_str(" --faults disk");
        }
        if self.force_tamper {
            command.push_str(" --tamper");
        }
        if self.wire {
            command.push_str(" --wire");
        }
        if let Some(weakening) = self.weakening {
            command.push_str(&format!(" --weaken {}", weakening.name()));
        }
        command
    }
}

/// The faults a seed drew.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// The faulty organization, if any, and what it does.
    pub faulty: Option<String>,
    pub lies: bool,
    /// When (virtual ns) and which statement changes its database outside the chain.
    pub tamper: Option<(u64, String)>,
    /// The organization whose links are slow.
    pub lagging: Option<String>,
    /// (node, down at, up at).
    pub crashes: Vec<(String, u64, u64)>,
    /// Whichever orderer replica leads at the first time is down until the second.
    pub leader_crash: Option<(u64, u64)>,
    pub lossy: bool,
    /// With disk faults: the media fault planted on an orderer replica that crashes.
    pub media: Option<Planted>,
}

/// What a run came to.
#[derive(Debug, Clone)]
pub struct SimReport {
    pub options: SimOptions,
    pub faults: Faults,
    pub ordered_blocks: u64,
    /// Each organization's ledger height.
    pub heights: BTreeMap<String, u64>,
    /// Client proposals answered with an outcome, refused, and unanswered in time.
    pub answered: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub recoveries: u64,
    pub recovery_attempts: u64,
    /// The tampered organization's database still holds the change: no agreed block
    /// touched the changed row after it, so no digest could show it.
    pub undetected_tamper: bool,
    /// Media faults that met a read or write, and the orderer replicas whose log then
    /// refused to open (each with why).
    pub media_faults_fired: u64,
    pub unopened: Vec<String>,
    pub virtual_ms: u64,
    pub violations: Vec<Violation>,
    pub trace_digest: u64,
}

/// Everything one run builds and the checks read.
struct Cluster {
    config: Arc<PipelineConfig>,
    org_keys: BTreeMap<String, SigningKey>,
    client_keys: BTreeMap<String, SigningKey>,
    orderer_key: SigningKey,
    members: BTreeMap<String, Arc<Mutex<Member>>>,
    /// The orderer replicas' Raft logs and the commit servers' vote logs.
    disks: disks::Disks,
    /// Seeds the orderers' elections.
    seed: u64,
    clients: Vec<ClientConfig>,
}

fn org_names() -> Vec<String> {
    (1..=3).map(|index| format!("org-{index}")).collect()
}

fn build_cluster(options: &SimOptions) -> Result<Cluster, SimSetupError> {
    let orgs = org_names();
    let org_keys: BTreeMap<String, SigningKey> = orgs
        .iter()
        .enumerate()
        .map(|(at, name)| (name.clone(), SigningKey::from_seed(0x5749_0000 + at as u64)))
        .collect();
    let mut client_keys = BTreeMap::new();
    let mut client_orgs = BTreeMap::new();
    let mut clients = Vec::new();
    client_keys.insert(LOADER.to_string(), SigningKey::from_seed(0x5749_1000));
    client_orgs.insert(LOADER.to_string(), orgs[0].clone());
    for index in 0..options.clients {
        let name = format!("client-{index}");
        let organization = orgs[index % orgs.len()].clone();
        client_keys.insert(name.clone(), SigningKey::from_seed(0x5749_2000 + index as u64));
        client_orgs.insert(name.clone(), organization.clone());
        clients.push(ClientConfig {
            name,
            organization,
            window: 2,
            transactions: options.transactions,
            customers: options.customers,
            skew: Skew::Zipf(1.1),
            seed: options.seed ^ (index as u64).wrapping_mul(0x9e37_79b9),
            deadline: Duration::from_secs(2),
            first_seq: 1,
        });
    }
    let orderer_key = SigningKey::from_seed(0x5749_3000);
    let policy = AgreementPolicy::new(2, 3)?;
    let config = Arc::new(PipelineConfig {
        organizations: org_keys.iter().map(|(name, key)| (name.clone(), key.address())).collect(),
        clients: client_keys.iter().map(|(name, key)| (name.clone(), key.address())).collect(),
        client_orgs,
        orderer: orderer_key.address(),
        orderers: orderer_names(3),
        raft: RaftTiming { tick: Duration::from_millis(5), ..RaftTiming::default() },
        policy,
        agreements: 2,
        batch_size: 4,
        batch_wait: Duration::from_millis(1),
        block_size: 12,
        block_wait: Duration::from_millis(2),
        checkpoint_every: 4,
        keep_checkpoints: 3,
        call_deadline: Duration::from_millis(300),
        retry_after: Duration::from_millis(20),
    });
    let mut members = BTreeMap::new();
    for name in &orgs {
        members.insert(name.clone(), Arc::new(Mutex::new(fresh_member(name)?)));
    }
    let mut cluster = Cluster {
        config,
        org_keys,
        client_keys,
        orderer_key,
        members,
        disks: disks::Disks::new(Vec::new()),
        seed: options.seed,
        clients,
    };
    let founding = founding_records(cluster.config.orderers.len(), &customer_cuts(&cluster, options.customers)?);
    cluster.disks = disks::Disks::new(founding);
    Ok(cluster)
}

/// An organization on an in-memory SQLite database with SmallBank's tables installed.
fn fresh_member(name: &str) -> Result<Member, SimSetupError> {
    let mut organization = SqliteOrganization::in_memory(name)?;
    organization.install(&smallbank::tables())?;
    Ok(Member::new(Box::new(organization), Ledger::in_memory()))
}

/// The customers as the first ordered blocks: the loader's proposals, agreed by every
/// organization, committed in the ordering group's log before it starts.
fn customer_cuts(cluster: &Cluster, customers: u64) -> Result<Vec<BlockCut>, SimSetupError> {
    let loader = cluster.client_keys.get(LOADER).ok_or(SimSetupError::NoLoaderKey)?;
    let mut cuts = Vec::new();
    let mut seq = 0;
    for (number, block) in smallbank::load_blocks(customers, 64).into_iter().enumerate() {
        let proposals = block
            .into_iter()
            .map(|transaction| {
                seq += 1;
                Proposal::sign(loader, LOADER, seq, transaction.statements)
            })
            .collect();
        let batch = ProposalBatch { origin: "org-1".to_string(), number: u64::MAX - number as u64, proposals };
        let hash = batch.hash();
        let agreements = cluster.org_keys.iter().map(|(name, key)| Agreement::sign(key, name, hash)).collect();
        cuts.push(BlockCut { batches: vec![ChainedTx { batch, agreements }] });
    }
    Ok(cuts)
}

/// The faults of a seed, drawn from its own stream.
fn draw_faults(options: &SimOptions, rng: &mut StdRng) -> Faults {
    let mut faults = Faults::default();
    if !options.faults && !options.force_tamper {
        return faults;
    }
    let orgs = org_names();
    let faulty = orgs[rng.random_range(0..orgs.len())].clone();
    let tampered = options.force_tamper || (options.faults && rng.random_bool(0.4));
    faults.lies = options.faults && rng.random_bool(0.4);
    if tampered {
        let customer = rng.random_range(0..options.customers.max(1));
        let at = rng.random_range(20..200) * MS;
        faults.tamper = Some((at, format!("UPDATE checking SET bal = bal + 7 WHERE custid = {customer}")));
    }
    if faults.lies || tampered {
        faults.faulty = Some(faulty);
    }
    if !options.faults {
        return faults;
    }
    if rng.random_bool(0.5) {
        faults.lagging = Some(orgs[rng.random_range(0..orgs.len())].clone());
    }
    faults.lossy = rng.random_bool(0.5);
    if rng.random_bool(0.3) {
        let down = rng.random_range(30..250) * MS;
        faults.leader_crash = Some((down, down + rng.random_range(20..300) * MS));
    }
    let mut nodes: Vec<String> = orderer_names(3);
    for org in &orgs {
        for role in ["chainify", "exec", "commit"] {
            nodes.push(node_name(org, role));
        }
    }
    for _ in 0..rng.random_range(0..=3) {
        let node = nodes[rng.random_range(0..nodes.len())].clone();
        let down = rng.random_range(10..300) * MS;
        let up = down + rng.random_range(5..60) * MS;
        faults.crashes.push((node, down, up));
    }
    if options.media_faults {
        // Drawn after the rest, so a seed runs as it does without disk faults but for it.
        faults.media = disks::media_fault(rng, &orderer_names(3), &mut faults.crashes);
    }
    faults
}

fn make_node<R: PipelineNode>(
    cluster: &Cluster,
    faults: &Faults,
    weakening: Option<Weakening>,
    node: &str,
) -> (R, Box<dyn virga_net::role::IoExecutor<R>>) {
    let (core, device) = make_core(cluster, faults, weakening, node);
    let (node, device) = R::wrap(core, device);
    (node, Box::new(device))
}

fn make_core(
    cluster: &Cluster,
    faults: &Faults,
    weakening: Option<Weakening>,
    node: &str,
) -> (ChainifyNode, NodeDevice) {
    let config = Arc::clone(&cluster.config);
    let commit_weakness = weakening.map(|Weakening::CommitWithoutQuorum| CommitWeakness::CommitWithoutQuorum);
    if let Some(at) = cluster.config.orderers.iter().position(|name| name == node) {
        let seed = cluster.seed ^ (at as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        return match OrdererLog::open(cluster.disks.storage(node), || cluster.disks.founding.clone()) {
            Ok(log) => (
                ChainifyNode::Orderer(Box::new(OrderingServer::new(node, cluster.orderer_key.clone(), config, seed))),
                NodeDevice::Orderer(log),
            ),
            // Only a media fault makes a memory device refuse to open: the replica stays down.
            Err(error) => (ChainifyNode::Unopened(error.to_string()), NodeDevice::None),
        };
    }
    if let Some(client) = cluster.clients.iter().find(|client| client.name == node) {
        let key = cluster.client_keys.get(node).cloned().unwrap_or_else(|| SigningKey::from_seed(0));
        return (ChainifyNode::Client(Box::new(ClientCore::new(client.clone(), key))), NodeDevice::None);
    }
    let (org, role) = node.split_once('/').unwrap_or((node, ""));
    let key = cluster.org_keys.get(org).cloned().unwrap_or_else(|| SigningKey::from_seed(0));
    let lies = faults.lies && faults.faulty.as_deref() == Some(org);
    match (role, cluster.members.get(org)) {
        ("exec", Some(member)) => (
            ChainifyNode::Execution(Box::new(ExecutionServer::new(
                org,
                config.clone(),
                lies.then_some(ExecutionWeakness::LieAboutEffects),
            ))),
            NodeDevice::Organization(Box::new(OrganizationDevice::new(
                Arc::clone(member),
                config.checkpoint_every,
                config.keep_checkpoints,
            ))),
        ),
        ("commit", _) => match VoteLog::open(cluster.disks.storage(node)) {
            Ok(votes) => (
                ChainifyNode::Commit(Box::new(CommitServer::new(org, key, config, commit_weakness))),
                NodeDevice::Votes(votes),
            ),
            Err(error) => (ChainifyNode::Unopened(error.to_string()), NodeDevice::None),
        },
        _ => (ChainifyNode::Chainify(Box::new(ChainifyServer::new(org, key, config))), NodeDevice::None),
    }
}

/// Why a seed could not be run (its checks' findings are the report's, not an error).
#[derive(Debug, thiserror::Error)]
pub enum SimSetupError {
    #[error(transparent)]
    Sim(#[from] virga_sim::SimError),
    #[error(transparent)]
    Organization(#[from] crate::organization::OrganizationError),
    #[error(transparent)]
    Policy(#[from] virga_ledger::wlc::PolicyError),
    #[error("no loader key")]
    NoLoaderKey,
    #[error("a poisoned organization lock")]
    Poisoned,
    #[error("organization {0} is missing from the cluster")]
    MissingOrganization(String),
}

/// Runs one seed and checks it.
pub fn run_seed(options: &SimOptions) -> Result<SimReport, SimSetupError> {
    if options.wire {
        run_nodes::<virga_net::wired::Wired<ChainifyNode>>(options)
    } else {
        run_nodes::<ChainifyNode>(options)
    }
}

/// The faults that happen at a moment of the run rather than at a node: the tamper, and the
/// crash of whichever orderer replica leads then; in time order.
fn intervene<R: PipelineNode>(sim: &mut Sim<R>, cluster: &Cluster, faults: &Faults) -> Result<(), SimSetupError> {
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Moment {
        Tamper,
        LeaderCrash,
        Media,
    }
    let mut moments: Vec<(u64, Moment)> = Vec::new();
    if let Some((at, _)) = &faults.tamper {
        moments.push((*at, Moment::Tamper));
    }
    if let Some((down, _)) = faults.leader_crash {
        moments.push((down, Moment::LeaderCrash));
    }
    if let Some(planted) = &faults.media {
        moments.push((planted.at, Moment::Media));
    }
    moments.sort();
    for (at, moment) in moments {
        sim.run_until(at);
        if moment == Moment::Media {
            // A latent sector error needs bytes to hit: the log has its founding records.
            if let Some(planted) = &faults.media {
                cluster.disks.plant(planted);
            }
        } else if moment == Moment::Tamper {
            let (Some((_, statement)), Some(member)) =
                (&faults.tamper, faults.faulty.as_ref().and_then(|org| cluster.members.get(org)))
            else {
                continue;
            };
            let mut member = member.lock().map_err(|_| SimSetupError::Poisoned)?;
            member.organization.run_outside_chain(statement)?;
        } else if let Some((_, up)) = faults.leader_crash {
            let leader = cluster.config.orderers.iter().find(
                |name| matches!(sim.core(name).map(R::node), Some(ChainifyNode::Orderer(core)) if core.is_leader()),
            );
            if let Some(leader) = leader.cloned() {
                sim.crash(&leader)?;
                sim.restart_at(up, &leader)?;
            }
        }
    }
    Ok(())
}

fn run_nodes<R: PipelineNode>(options: &SimOptions) -> Result<SimReport, SimSetupError> {
    let cluster = Rc::new(build_cluster(options)?);
    let mut rng = StdRng::seed_from_u64(options.seed ^ 0xc4a1_f1db);
    let faults = draw_faults(options, &mut rng);
    let mut nodes: Vec<String> = cluster.config.orderers.clone();
    for org in org_names() {
        for role in ["chainify", "exec", "commit"] {
            nodes.push(node_name(&org, role));
        }
    }
    nodes.extend(cluster.clients.iter().map(|client| client.name.clone()));
    let mut net = NetConfig::default();
    if let Some(lagging) = &faults.lagging {
        for a in nodes.iter().filter(|node| node.starts_with(&format!("{lagging}/"))) {
            for b in nodes.iter().filter(|node| !node.starts_with(&format!("{lagging}/"))) {
                net.links.push(LinkConfig {
                    a: a.clone(),
                    b: b.clone(),
                    latency: Some(Duration::from_millis(4)),
                    bandwidth: None,
                });
            }
        }
    }
    let mut sim: Sim<R> = Sim::new(SimConfig { seed: options.seed, net, ..SimConfig::default() })?;
    if faults.lossy {
        sim.set_net_faults(0.02, 0.02)?;
    }
    for node in &nodes {
        let (core, device) = make_node::<R>(&cluster, &faults, options.weakening, node);
        sim.add_node(node.clone(), core, device)?;
    }
    let factory_cluster = Rc::clone(&cluster);
    let factory_faults = faults.clone();
    let weakening = options.weakening;
    sim.set_factory(move |node| make_node(&factory_cluster, &factory_faults, weakening, node));
    let crash_cluster = Rc::clone(&cluster);
    sim.set_on_crash(move |node, rng| crash_cluster.disks.crash(node, rng));
    for (node, down, up) in &faults.crashes {
        sim.crash_at(*down, node)?;
        sim.restart_at(*up, node)?;
    }
    intervene(&mut sim, &cluster, &faults)?;
    let limit = 60_000 * MS;
    let clients: Vec<String> = cluster.clients.iter().map(|client| client.name.clone()).collect();
    sim.run_while(limit, |sim| {
        !clients
            .iter()
            .all(|name| matches!(sim.core(name).map(R::node), Some(ChainifyNode::Client(core)) if core.is_done()))
    });
    // Every organization catches up with the ordering service's log.
    let ordered = checks::ordered_blocks(&cluster, &sim).len() as u64;
    let orgs = org_names();
    let caught_up = |sim: &Sim<R>| {
        orgs.iter().all(|org| matches!(sim.core(&node_name(org, "exec")).map(R::node), Some(ChainifyNode::Execution(core)) if core.height() >= ordered))
    };
    let end = sim.now() + 10_000 * MS;
    sim.run_while(end, |sim| !caught_up(sim));
    checks::check(options, &cluster, &sim, faults)
}

#[cfg(test)]
mod tests;
