//! Prediction by simulation: the real cores run in virtual time under a cost model built
//! from the calibration (`crate::cost`), on machines whose threads their roles share, and the
//! simulated cluster's throughput is the prediction. The analytic model (`cost::model`)
//! predicts the same shapes from the same calibration; the two are set side by side.

use crate::protocol::{Rainblock, Request, Response};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use virga_core::device::{MemStorage, Storage};
use virga_ledger::store::StoreOptions;
use virga_net::role::{Event, IoExecutor, Protocol};
use virga_sim::{CostModel, NetConfig, RoleEvent, Sim, SimConfig};

use super::node::{client_node, miner_node, storage_node, NodeDisk, NodeIo, RainblockNode};
use crate::client::{ClientCore, UserTransfer};
use crate::cost::calibrate::Calibration;
use crate::cost::model::{cpu_us, Work};
use crate::miner::{execution_pool, ChainDisk, MinerCore, MinerError, MinerIo};
use crate::storage::{log_options, open_core, NodeStorage, StorageError};
use crate::testkit::{Fixture, FixtureError};
use crate::topology::Topology;
use crate::workload::{client_of, sign_transfers, Mix};

/// Where the simulated roles run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Placement {
    /// Every role on one machine of this many threads (this machine's shapes).
    OneMachine { threads: usize },
    /// Each role on a machine of its own with this many threads (the seeds' deployments).
    MachinePerRole { threads: usize },
}

/// What the simulated cluster did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Simulated {
    pub tps: f64,
    pub committed: u64,
    pub offered: usize,
    pub virtual_seconds: f64,
    pub events: u64,
}

/// Per-event CPU from a calibration; a log append's fsync holds the thread that runs it.
pub struct CalibratedCosts {
    pub calibration: Calibration,
    pub grpc: bool,
    pub storage_nodes: usize,
}

impl CalibratedCosts {
    fn message_us(&self, bytes: usize) -> f64 {
        // Both ends of a call: half when the request is handled, half with its answer.
        cpu_us(&self.calibration, Work::Message { bytes, grpc: self.grpc }) / 2.0
    }
}

impl CostModel<RainblockNode> for CalibratedCosts {
    fn step_cost(&self, _node: &str, event: &RoleEvent<RainblockNode>) -> u64 {
        let calibration = &self.calibration;
        let us = match event {
            Event::Request { request, .. } => {
                let work = match request {
                    // Queued: admission and building are the build job's ([`Self::io_compute_cost`]).
                    Request::Submit(_) => 0.0,
                    Request::ApplyBlock(updates) => {
                        cpu_us(calibration, Work::ApplyBlock { updates: updates.updates.len() })
                            + calibration.storage.log_append_fsync_us
                    }
                    Request::Witness(witness) => cpu_us(calibration, Work::Witness { keys: witness.keys.len() }),
                    _ => 0.0,
                };
                work + self.message_us(Rainblock::request_bytes(request))
            }
            Event::Response { result: Ok(response), .. } => {
                let work = match response {
                    Response::Witness(witness) => {
                        let keys = witness.bag.keys.len();
                        cpu_us(calibration, Work::ClientBatch { transfers: keys / 2, keys })
                    }
                    Response::BlockAck(_) => calibration.miner.commit_block_us / self.storage_nodes.max(1) as f64,
                    _ => 0.0,
                };
                work + self.message_us(Rainblock::response_bytes(response))
            }
            _ => 0.0,
        };
        (us * 1_000.0) as u64
    }

    /// A block's build: recovery and admission of its transfers, and building them.
    fn io_compute_cost(&self, _node: &str, op: &NodeIo) -> u64 {
        let NodeIo::Miner(MinerIo::Build(job)) = op else { return 0 };
        let (calibration, transfers) = (&self.calibration, job.transfers());
        let us =
            cpu_us(calibration, Work::Submission { transfers }) + cpu_us(calibration, Work::BuildBlock { transfers });
        (us * 1_000.0) as u64
    }

    fn io_cost(&self, _node: &str, _op: &NodeIo) -> u64 {
        // The fsync's wait is in the step: the in-process driver fsyncs on the thread that
        // handles the request (a runtime worker, one per core), which it holds meanwhile.
        // (Charged as device time instead, leaving the thread free, the same calibration
        // predicts about twice the measured throughput.)
        0
    }
}

/// Why a simulation of a topology could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    #[error(transparent)]
    Sim(#[from] virga_sim::SimError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0} keeps a log but was opened without a disk")]
    NoDisk(String),
    #[error(transparent)]
    Miner(#[from] MinerError),
}

/// Simulates `topology` offering `transfers` at once, with the calibration's costs, until
/// every transfer has committed (or `limit` of virtual time has passed).
pub fn simulate(
    calibration: &Calibration,
    topology: &Topology,
    transfers: usize,
    grpc: bool,
    placement: Placement,
    limit: Duration,
) -> Result<Simulated, SimulateError> {
    let fixture = Arc::new(Fixture::new(topology.clone())?);
    let config = SimConfig {
        seed: topology.seed,
        net: NetConfig {
            latency_min: Duration::from_micros(if grpc { 30 } else { 1 }),
            latency_max: Duration::from_micros(if grpc { 60 } else { 2 }),
            ..NetConfig::default()
        },
        device_latency: Duration::ZERO,
        ..SimConfig::default()
    };
    let mut sim: Sim<RainblockNode> = Sim::new(config)?;
    let disks: Rc<RefCell<HashMap<String, MemStorage>>> = Rc::default();
    let storage_ids: Vec<String> = fixture.layout.iter().map(|(id, _)| id.clone()).collect();
    let clients: Vec<String> = (0..topology.clients).map(Topology::client_id).collect();
    let ids: Vec<String> =
        storage_ids.iter().cloned().chain(topology.miner_ids()).chain(clients.iter().cloned()).collect();
    for id in &ids {
        let (core, io) = open(&fixture, &disks, id)?;
        sim.add_node(id.clone(), core, io)?;
    }
    for (index, id) in ids.iter().enumerate() {
        let placed = match placement {
            Placement::OneMachine { threads } => sim.place(id, 0, threads),
            Placement::MachinePerRole { threads } => sim.place(id, index, threads),
        };
        placed?;
    }
    sim.set_cost_model(CalibratedCosts { calibration: calibration.clone(), grpc, storage_nodes: storage_ids.len() });
    let chain_id = fixture.config.exec.chain_id;
    let signed = sign_transfers(&fixture.accounts, transfers, chain_id, Mix::default(), topology.seed, &|_| {});
    let mut shares: Vec<Vec<UserTransfer>> = vec![Vec::new(); clients.len()];
    for transfer in signed {
        shares[client_of(&transfer, clients.len())].push(transfer);
    }
    for (id, share) in clients.iter().zip(shares) {
        sim.input_at(1_000_000, id, share)?;
    }
    let committed = |sim: &Sim<RainblockNode>| -> u64 {
        clients
            .iter()
            .map(|id| sim.core(id).and_then(|node| node.role::<ClientCore>()).map_or(0, ClientCore::committed))
            .sum()
    };
    sim.run_while(limit.as_nanos() as u64, |sim| committed(sim) < transfers as u64);
    let done = committed(&sim);
    let virtual_seconds = sim.now() as f64 / 1e9;
    Ok(Simulated {
        tps: done as f64 / virtual_seconds.max(1e-9),
        committed: done,
        offered: transfers,
        virtual_seconds,
        events: sim.stats().events,
    })
}

fn open(
    fixture: &Fixture,
    disks: &Rc<RefCell<HashMap<String, MemStorage>>>,
    id: &str,
) -> Result<(RainblockNode, Box<dyn IoExecutor<RainblockNode>>), SimulateError> {
    let storage: Arc<dyn Storage> = Arc::new(disks.borrow_mut().entry(id.to_string()).or_default().clone());
    if let Some(served) = fixture.served(id) {
        let node_storage = NodeStorage::on(storage, log_options())?;
        let opened = open_core(id, served, fixture.header.clone(), &fixture.sharded, node_storage)?;
        let disk = opened.disk.ok_or_else(|| SimulateError::NoDisk(id.to_string()))?;
        return Ok((storage_node(opened.core), Box::new(NodeDisk::Storage(disk))));
    }
    if let Some(index) = id.strip_prefix("miner-").and_then(|index| index.parse::<usize>().ok()) {
        let (store, head) = crate::miner::open_store_on(storage, StoreOptions::default(), &fixture.header)?;
        let pool = execution_pool(1)?;
        let core = MinerCore::new(fixture.miner_config(index), head)?;
        return Ok((miner_node(core), Box::new(NodeDisk::Miner(ChainDisk { store: Some(store), pool }))));
    }
    let index = id.strip_prefix("client-").and_then(|index| index.parse::<usize>().ok()).unwrap_or(0);
    let core = ClientCore::new(fixture.client_config(index));
    Ok((client_node(core), Box::new(NodeDisk::None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calibration() -> Calibration {
        let text = include_str!("../../../../docs/bench-cost/calibration.json");
        serde_json::from_str(text).unwrap_or_else(|error| panic!("the frozen calibration: {error}"))
    }

    fn small() -> Topology {
        Topology { accounts: 200, storage_nodes: 4, clients: 2, batch: 20, in_flight: 2, ..Topology::small() }
    }

    fn tps(calibration: &Calibration, placement: Placement) -> f64 {
        let simulated = simulate(calibration, &small(), 600, false, placement, Duration::from_secs(600)).unwrap();
        assert_eq!(simulated.committed, 600, "{simulated:?}");
        simulated.tps
    }

    #[test]
    fn more_threads_predict_more_and_twice_the_cost_about_half() {
        let calibration = calibration();
        let one = tps(&calibration, Placement::OneMachine { threads: 1 });
        let two = tps(&calibration, Placement::OneMachine { threads: 2 });
        assert!(two > one * 1.2, "two threads {two} against one {one}");
        let mut doubled = calibration.clone();
        for cost in [
            &mut doubled.miner.recover_us,
            &mut doubled.miner.admit_us,
            &mut doubled.miner.build_us,
            &mut doubled.miner.other_us,
            &mut doubled.miner.build_block_us,
            &mut doubled.miner.other_block_us,
            &mut doubled.miner.commit_block_us,
            &mut doubled.storage.apply_call_us,
            &mut doubled.storage.apply_update_us,
            &mut doubled.storage.log_append_cpu_us,
            &mut doubled.storage.log_append_fsync_us,
            &mut doubled.storage.witness_call_us,
            &mut doubled.storage.witness_key_us,
            &mut doubled.client.verify_key_us,
            &mut doubled.client.preexec_us,
            &mut doubled.client.bag_us,
            &mut doubled.messages.inproc_call_us,
        ] {
            *cost *= 2.0;
        }
        let slower = tps(&doubled, Placement::OneMachine { threads: 1 });
        let ratio = one / slower;
        assert!((1.6..=2.4).contains(&ratio), "twice the costs: {one} against {slower} tx/s");
    }
}
