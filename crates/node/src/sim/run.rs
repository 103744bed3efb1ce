//! One simulated RainBlock run: the network built from an in-memory genesis, the seed's
//! faults injected until they stop, then the run settled and checked.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use virga_core::clock::SkewProfile;
use virga_core::device::{MemStorage, Storage};
use virga_ledger::store::StoreOptions;
use virga_net::role::IoExecutor;
use virga_sim::media::{self, Plans, Unopened};
use virga_sim::{NetConfig, Partition, Sim, SimConfig, Stop};

use super::checks::{check, UserView};
use super::node::{client_node, miner_node, storage_node, unopened_node, NodeDisk, RainblockNode};
use super::plan::{Broken, Faults, Length, Scenario, Schedule, TopLayer, QUIESCENCE_BOUND};
use crate::client::{ClientConfig, ClientCore, UserTransfer};
use crate::miner::{execution_pool, ChainDisk, MinerCore};
use crate::storage::{log_options, open_core, NodeStorage};
use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::{sign_transfers, Mix, GENESIS_TOKENS, TOKEN_AT};
use alloy_primitives::{B256, U256};
use virga_evm::contracts::{token, TOKEN};

/// Share of the users' transactions that call the token (the seed's workload has 10-15%).
const CONTRACT_SHARE: f64 = 0.15;

/// What a run is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    pub seed: u64,
    pub faults: Faults,
    pub length: Length,
    pub broken: Option<Broken>,
}

/// What a run found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunOutcome {
    pub seed: u64,
    /// Every invariant a check found broken (empty: the run passed).
    pub problems: Vec<String>,
    pub events: u64,
    pub virtual_ms: u64,
    pub offered: usize,
    pub committed: usize,
    /// Of `offered` and of `committed`: calls of the workload's token.
    pub contract_calls: (usize, usize),
    pub blocks: u64,
    pub crashes: usize,
    /// What the faults did: evidence that they met the protocol.
    pub effects: Effects,
    /// With `disk`: the media fault planted (kind and node), how many reads and writes it
    /// met, and the nodes whose storage then refused to open (each with why).
    pub media_fault: Option<String>,
    pub media_faults_fired: u64,
    pub unopened: Vec<String>,
    pub trace_digest: String,
}

/// Fault effects of a run (the protocol counters are those of the nodes' last incarnations).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Effects {
    pub dropped: u64,
    pub duplicated: u64,
    pub cut: u64,
    pub lost_to_crash: u64,
    pub deadlines_exceeded: u64,
    pub crashes: u64,
    pub abandoned_blocks: u64,
    pub refused_announcements: u64,
    pub bad_witnesses: u64,
}

fn effects(sim: &Sim<RainblockNode>) -> Effects {
    let stats = sim.stats();
    let mut effects = Effects {
        dropped: stats.dropped,
        duplicated: stats.duplicated,
        cut: stats.cut,
        lost_to_crash: stats.lost_to_crash,
        deadlines_exceeded: stats.deadlines_exceeded,
        crashes: stats.crashes,
        ..Effects::default()
    };
    let ids: Vec<String> = sim.node_ids().map(str::to_string).collect();
    for id in ids {
        let Some(node) = sim.core(&id) else { continue };
        if let Some(core) = node.role::<MinerCore>() {
            let miner = core.stats();
            effects.abandoned_blocks += miner.abandoned_blocks;
            effects.refused_announcements += miner.refused_blocks;
            effects.bad_witnesses += miner.bad_witnesses.len() as u64;
        } else if let Some(core) = node.role::<ClientCore>() {
            effects.bad_witnesses += core.stats().bad_witnesses.len() as u64;
        }
    }
    effects
}

const MINERS: usize = 2;
const CLIENTS: usize = 2;
/// The users offer their transfers in this many parts spread over the fault phase.
const OFFER_CHUNKS: usize = 10;
/// Every call's deadline in the simulation.
const DEADLINE: Duration = Duration::from_secs(2);

/// The simulated cluster: 4 storage nodes with 2 replicas of each shard, a producing and a
/// following miner, 2 clients; a scenario may change its top layer.
fn topology(top_layer: Option<TopLayer>) -> Topology {
    let default = Topology {
        accounts: 200,
        shards: 16,
        storage_nodes: 4,
        replicas: 2,
        miners: MINERS,
        clients: CLIENTS,
        retention: 2,
        compaction: 2,
        batch: 10,
        in_flight: 2,
        max_block_transfers: 64,
        top_budget_bytes: 1 << 20,
        seed: 0,
    };
    match top_layer {
        Some(top) => Topology {
            retention: top.retention,
            compaction: top.compaction,
            top_budget_bytes: top.budget_bytes,
            ..default
        },
        None => default,
    }
}

/// The fixture every run of `topology` starts from (it costs key derivation, so it is built
/// once per topology).
fn fixture(topology: Topology) -> Arc<Fixture> {
    thread_local! {
        static FIXTURES: RefCell<Vec<Arc<Fixture>>> = const { RefCell::new(Vec::new()) };
    }
    FIXTURES.with(|cell| {
        let mut fixtures = cell.borrow_mut();
        if let Some(fixture) = fixtures.iter().find(|fixture| fixture.topology == topology) {
            return Arc::clone(fixture);
        }
        let mut fixture = Fixture::new(topology).unwrap_or_else(|error| unreachable!("{error}"));
        // The workload's token, every account holding some: a share of the users' transactions
        // are contract calls, pre-executed by the clients and executed by the miners.
        let holdings: Vec<_> = fixture
            .accounts
            .addresses
            .iter()
            .map(|holder| (B256::from(token::balance_slot(*holder)), U256::from(GENESIS_TOKENS)))
            .collect();
        fixture.deploy(TOKEN_AT, &TOKEN.runtime_code(), &holdings).unwrap_or_else(|error| unreachable!("{error}"));
        let fixture = Arc::new(fixture);
        fixtures.push(Arc::clone(&fixture));
        fixture
    })
}

/// The durable state of every node, kept across crashes.
pub(crate) type Disks = Rc<RefCell<HashMap<String, MemStorage>>>;

fn client_config(fixture: &Fixture, index: usize) -> ClientConfig {
    ClientConfig { deadline: DEADLINE, back_off: Duration::from_millis(50), ..fixture.client_config(index) }
}

/// Builds (or, after a crash, rebuilds from its durable state) node `id`.
fn open_node(
    fixture: &Fixture,
    (disks, plans): (&Disks, &Plans),
    id: &str,
    broken: Option<Broken>,
) -> (RainblockNode, Box<dyn IoExecutor<RainblockNode>>) {
    let disk = disks.borrow_mut().entry(id.to_string()).or_default().clone();
    let storage: Arc<dyn Storage> = media::storage_of(id, disk, plans);
    let failed = |what: &str, error: String| -> ! { unreachable!("{id}: {what}: {error}") };
    if let Some(served) = fixture.served(id) {
        let node_storage = NodeStorage::on(storage, log_options()).unwrap_or_else(|e| failed("storage", e.to_string()));
        let opened = open_core(id, served, fixture.header.clone(), &fixture.sharded, node_storage)
            .unwrap_or_else(|error| failed("recovery", error.to_string()));
        #[allow(unused_mut)]
        let mut core = opened.core;
        core.set_checkpoint_interval(16);
        #[cfg(feature = "fault-injection")]
        if broken == Some(Broken::StorageAcksBeforeLog) {
            core.set_fault(crate::storage::StorageFault::AckBeforeLog);
        }
        let disk = opened.disk.unwrap_or_else(|| failed("storage", "no disk".into()));
        return (storage_node(core), Box::new(NodeDisk::Storage(disk)));
    }
    if let Some(index) = id.strip_prefix("miner-").and_then(|index| index.parse::<usize>().ok()) {
        // Every append is durable before the block counts as committed.
        let options = StoreOptions::default();
        let (store, head) = match crate::miner::open_store_on(storage, options, &fixture.header) {
            Ok(opened) => opened,
            // Only a media fault makes a memory device refuse to open: the miner stays down.
            Err(error) => return (unopened_node(error.to_string()), Box::new(NodeDisk::None)),
        };
        let config = fixture.miner_config(index);
        let pool = execution_pool(1).unwrap_or_else(|error| failed("pool", error.to_string()));
        #[allow(unused_mut)]
        let mut core = MinerCore::new(config, head).unwrap_or_else(|error| failed("miner", error.to_string()));
        core.set_deadline(DEADLINE);
        #[cfg(feature = "fault-injection")]
        if broken == Some(Broken::MinerSkipsBlockCheck) && index > 0 {
            core.set_fault(crate::miner::MinerFault::SkipBlockCheck);
        }
        return (miner_node(core), Box::new(NodeDisk::Miner(ChainDisk { store: Some(store), pool })));
    }
    let index = id.strip_prefix("client-").and_then(|index| index.parse::<usize>().ok()).unwrap_or(0);
    let mut core = ClientCore::new(client_config(fixture, index));
    core.keep_outcomes();
    let _ = broken;
    (client_node(core), Box::new(NodeDisk::None))
}

fn ns(duration: Duration) -> u64 {
    duration.as_nanos() as u64
}

/// The node ids of the simulated cluster.
struct Ids {
    storage: Vec<String>,
    miners: Vec<String>,
    clients: Vec<String>,
    all: Vec<String>,
}

impl Ids {
    fn of(fixture: &Fixture) -> Ids {
        let storage: Vec<String> = fixture.layout.iter().map(|(id, _)| id.clone()).collect();
        let miners = fixture.topology.miner_ids();
        let clients: Vec<String> = (0..CLIENTS).map(Topology::client_id).collect();
        let all = storage.iter().chain(&miners).chain(&clients).cloned().collect();
        Ids { storage, miners, clients, all }
    }
}

/// The simulator's configuration for a seed's schedule.
fn sim_config(options: &RunOptions, schedule: &Schedule, all: &[String]) -> SimConfig {
    let net = NetConfig {
        latency_max: schedule.latency_max,
        drop_probability: schedule.drop_probability,
        duplicate_probability: schedule.duplicate_probability,
        partitions: schedule
            .partitions
            .iter()
            .map(|(start, end, node)| Partition {
                start_ns: ns(*start),
                end_ns: ns(*end),
                side_a: vec![node.clone()],
                side_b: all.iter().filter(|other| *other != node).cloned().collect(),
            })
            .collect(),
        ..NetConfig::default()
    };
    SimConfig {
        seed: options.seed,
        net,
        // An fsync-like latency: a crash meets writes in flight.
        device_latency: Duration::from_millis(2),
        clock_profile: if options.faults.clocks { SkewProfile::Ntp } else { SkewProfile::None },
        max_events: Some(options.length.max_events()),
    }
}

/// Every node added, with the factory that rebuilds one after a crash from its disk, which
/// the crash hook crashes.
fn build(
    fixture: &Arc<Fixture>,
    ids: &Ids,
    options: &RunOptions,
    schedule: &Schedule,
) -> Result<(Sim<RainblockNode>, Disks, Plans), virga_sim::SimError> {
    let mut sim: Sim<RainblockNode> = Sim::new(sim_config(options, schedule, &ids.all))?;
    let disks: Disks = Rc::new(RefCell::new(HashMap::new()));
    let plans: Plans = Rc::default();
    for id in &ids.all {
        let (core, io) = open_node(fixture, (&disks, &plans), id, options.broken);
        sim.add_node(id.clone(), core, io)?;
    }
    let (fixture, factory_disks, factory_plans, broken) =
        (Arc::clone(fixture), Rc::clone(&disks), Rc::clone(&plans), options.broken);
    sim.set_factory(move |id| open_node(&fixture, (&factory_disks, &factory_plans), id, broken));
    let crash_disks = Rc::clone(&disks);
    sim.set_on_crash(move |id, rng| {
        let mut disks = crash_disks.borrow_mut();
        if let Some(storage) = disks.get_mut(id) {
            *storage = storage.crash_with(rng);
        }
    });
    Ok((sim, disks, plans))
}

/// The users' transfers, split between the clients by sender (a sender's nonces stay with
/// one client) and offered in parts over the fault phase, so that faults meet work.
fn offer(
    sim: &mut Sim<RainblockNode>,
    fixture: &Fixture,
    ids: &Ids,
    options: &RunOptions,
) -> (Vec<UserTransfer>, Vec<Vec<UserTransfer>>) {
    let transfers = sign_transfers(
        &fixture.accounts,
        options.length.transfers(),
        fixture.config.exec.chain_id,
        Mix::with_contracts(CONTRACT_SHARE),
        options.seed,
        &|_| {},
    );
    let mut per_client: Vec<Vec<UserTransfer>> = vec![Vec::new(); CLIENTS];
    for transfer in &transfers {
        let index = fixture.accounts.addresses.iter().position(|a| *a == transfer.sender).unwrap_or(0) % CLIENTS;
        per_client[index].push(transfer.clone());
    }
    let until = ns(options.length.faults_until());
    for (id, transfers) in ids.clients.iter().zip(&per_client) {
        let chunk = transfers.len().div_ceil(OFFER_CHUNKS).max(1);
        for (index, part) in transfers.chunks(chunk).enumerate() {
            let at = until / OFFER_CHUNKS as u64 * index as u64 + 1_000_000;
            let _ = sim.input_at(at, id, part.to_vec());
        }
    }
    (transfers, per_client)
}

/// The schedule's timed crashes; a restarted client's user offers its share again (the
/// client lost its queue).
fn schedule_crashes(sim: &mut Sim<RainblockNode>, schedule: &Schedule, ids: &Ids, per_client: &[Vec<UserTransfer>]) {
    for crash in &schedule.crashes {
        let _ = sim.crash_at(ns(crash.at), &crash.node);
        let _ = sim.restart_at(ns(crash.back), &crash.node);
        if let Some(index) = ids.clients.iter().position(|id| *id == crash.node) {
            let _ = sim.input_at(ns(crash.back) + 1, &crash.node, per_client[index].clone());
        }
    }
}

/// Runs one seed and checks it.
pub fn run_seed(options: RunOptions) -> RunOutcome {
    match run_scenario(options, &Scenario::default()) {
        Ok(finished) => finished.outcome,
        Err(failed) => *failed,
    }
}

/// A run that went to its end: what it found, and the simulator as it ended, whose nodes'
/// counters a scenario's test reads (those of each node's last incarnation).
pub struct Finished {
    pub outcome: RunOutcome,
    pub sim: Sim<RainblockNode>,
}

/// Runs one seed in `scenario` and checks it; `Err` is the outcome of a run that could not
/// start (or go on).
pub fn run_scenario(options: RunOptions, scenario: &Scenario) -> Result<Finished, Box<RunOutcome>> {
    let fixture = fixture(topology(scenario.top_layer));
    let ids = Ids::of(&fixture);
    let until = options.length.faults_until();
    let schedule = match &scenario.schedule {
        Some(schedule) => schedule.clone(),
        None => Schedule::draw(options.seed, options.faults, &ids.all, &ids.storage, until),
    };
    let (mut sim, disks, plans) =
        build(&fixture, &ids, &options, &schedule).map_err(|p| Box::new(failed_to_start(options.seed, p)))?;
    let (transfers, per_client) = offer(&mut sim, &fixture, &ids, &options);
    schedule_crashes(&mut sim, &schedule, &ids, &per_client);

    let mut view = UserView::default();
    // Crashes of storage nodes caught with a log write in flight, taken as they come.
    let mut write_crashes = schedule.write_crashes.clone();
    let mut media_due = schedule.media.clone();
    let mut run = |sim: &mut Sim<RainblockNode>, view: &mut UserView, until: u64, settle: bool| loop {
        let mut hit = None;
        let stop = sim.run_while(until, |sim| {
            view.observe(sim, &ids.clients);
            if media_due.as_ref().is_some_and(|due| sim.now() >= due.at && media::plant(due, &disks, &plans)) {
                media_due = None;
            }
            if let Some(crash) = write_crashes.first() {
                if sim.now() >= ns(crash.at) && writing(sim, &crash.node) {
                    hit = Some(write_crashes.remove(0));
                    return false;
                }
            }
            !(settle && view.settled(sim, &ids.clients, &per_client))
        });
        let Some(crash) = hit else { return stop };
        let now = sim.now();
        let _ = sim.crash(&crash.node);
        let _ = sim.restart_at(now + ns(crash.back.saturating_sub(crash.at)), &crash.node);
    };
    // Faults: lying roles from the start of their windows, then honest again.
    set_lying_storage(&mut sim, &schedule, true);
    if let Some((start, end)) = schedule.lying_miner {
        run(&mut sim, &mut view, ns(start), false);
        set_lying_miner(&mut sim, true);
        run(&mut sim, &mut view, ns(end), false);
        set_lying_miner(&mut sim, false);
    }
    run(&mut sim, &mut view, ns(until), false);
    set_lying_storage(&mut sim, &schedule, false);
    sim.set_net_faults(0.0, 0.0).map_err(|error| Box::new(failed_to_start(options.seed, error)))?;
    let stop = run(&mut sim, &mut view, ns(until + QUIESCENCE_BOUND), true);

    let mut problems = Vec::new();
    if stop != Stop::Predicate {
        problems.push(format!(
            "the run did not settle within {QUIESCENCE_BOUND:?} after the faults stopped ({stop:?}): {}",
            view.unsettled(&sim, &ids.clients, &per_client)
        ));
    }
    let checked = check(&fixture, &mut sim, &disks, &view, &transfers, &ids.storage, &ids.miners, options.seed);
    problems.extend(checked.problems);
    let outcome = RunOutcome {
        seed: options.seed,
        problems,
        events: sim.stats().events,
        virtual_ms: sim.now() / 1_000_000,
        offered: transfers.len(),
        committed: checked.committed,
        contract_calls: contract_calls(&transfers, &view),
        blocks: checked.blocks,
        crashes: schedule.crashes.len() + schedule.write_crashes.len(),
        effects: effects(&sim),
        media_fault: schedule.media.as_ref().map(|planted| format!("{:?} on {}", planted.fault, planted.node)),
        media_faults_fired: media::fired(&plans),
        unopened: unopened(&sim, &ids.all),
        trace_digest: format!("{:016x}", sim.trace_digest()),
    };
    Ok(Finished { outcome, sim })
}

/// Token calls offered, and those the users heard committed.
fn contract_calls(transfers: &[UserTransfer], view: &UserView) -> (usize, usize) {
    let calls = transfers.iter().filter(|transfer| transfer.tx.to() == Some(TOKEN_AT));
    let (mut offered, mut committed) = (0, 0);
    for call in calls {
        offered += 1;
        let hash = call.tx.hash();
        committed += usize::from(view.acknowledged.contains_key(&hash) || view.confirmed_late.contains(&hash));
    }
    (offered, committed)
}

/// Whether storage node `id` has a log write in flight.
fn writing(sim: &Sim<RainblockNode>, id: &str) -> bool {
    sim.core(id)
        .and_then(|node| node.role::<crate::storage::StorageCore>())
        .is_some_and(|core| core.appends_in_flight() > 0)
}

fn failed_to_start(seed: u64, problem: virga_sim::SimError) -> RunOutcome {
    RunOutcome {
        seed,
        problems: vec![format!("the simulation could not start: {problem}")],
        events: 0,
        virtual_ms: 0,
        offered: 0,
        committed: 0,
        contract_calls: (0, 0),
        blocks: 0,
        crashes: 0,
        effects: Effects::default(),
        media_fault: None,
        media_faults_fired: 0,
        unopened: Vec::new(),
        trace_digest: String::new(),
    }
}

/// The nodes whose storage refused to open, each with why.
fn unopened(sim: &Sim<RainblockNode>, ids: &[String]) -> Vec<String> {
    ids.iter()
        .filter_map(|id| Some(format!("{id}: {}", sim.core(id)?.role::<Unopened<crate::protocol::Rainblock>>()?.error)))
        .collect()
}

#[allow(unused_variables)]
fn set_lying_storage(sim: &mut Sim<RainblockNode>, schedule: &Schedule, lying: bool) {
    #[cfg(feature = "fault-injection")]
    if let Some((node, corrupt)) = &schedule.lying_storage {
        use crate::storage::StorageFault;
        let fault = match (lying, corrupt) {
            (false, _) => StorageFault::None,
            (true, true) => StorageFault::CorruptWitness,
            (true, false) => StorageFault::StaleWitness,
        };
        if let Some(core) = sim.core_mut(node).and_then(|node| node.role_mut::<crate::storage::StorageCore>()) {
            core.set_fault(fault);
        }
    }
}

#[allow(unused_variables)]
fn set_lying_miner(sim: &mut Sim<RainblockNode>, lying: bool) {
    #[cfg(feature = "fault-injection")]
    if let Some(core) = sim.core_mut("miner-0").and_then(|node| node.role_mut::<MinerCore>()) {
        core.set_fault(if lying { crate::miner::MinerFault::WrongRoot } else { crate::miner::MinerFault::None });
    }
}
