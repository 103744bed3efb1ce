//! The cost model: what each role's events cost from a [`Calibration`], and a predictor of a
//! cluster's throughput and commit latency.
//!
//! # Event costs
//!
//! [`cpu_us`] of a [`Work`] (what a simulator charges per event): microseconds of one
//! thread of the calibrated machine, linear in the event's size:
//! - a submission of n transfers at the miner: recovery n·`recover` (parallel on the
//!   miner's threads), then admission, building and the rest of the step, serial:
//!   n·(`admit` + `build` + `other`) + per block (`build_block` + `other_block` + `commit_block`);
//! - `ApplyBlock` with u updates at a storage node: `apply_call` + u·`apply_update`, then a
//!   log append with fsync (`log_append_cpu` of CPU, `log_append_fsync` of latency);
//! - a witness request of k keys: `witness_call` + k·`witness_key`;
//! - a client batch of n transfers with k keys: k·`verify_key` + n·(`preexec` + `bag`);
//! - a message: the transport's per-call cost (both sides together) plus, over gRPC, its
//!   bytes at `grpc_ns_per_byte`; over a network, one-way latency plus bytes / bandwidth.
//!
//! # The predictor: a bottleneck model of a closed loop
//!
//! Throughput is the smallest of these bounds (an asymptotic bound analysis):
//! 1. **CPU, pooled.** Demand D per transfer summed over all roles (the events above per
//!    transfer, per-block costs spread over the block size B) against the cores all roles
//!    share: on this machine the calibration's `effective_cores`; at scale M·T. On one
//!    machine an fsync holds a runtime worker (one per core) for its whole wall-clock time,
//!    so its wait counts as a core's time too: per block the storage nodes' fsyncs overlap
//!    (concurrent fsyncs share one journal commit) and hold every worker once, and the
//!    miner's store one worker once more.
//! 2. **CPU, per role** (each role on its own machines, M ≥ roles): clients' demand against
//!    clients·T threads; the miner's recovery against its T threads.
//! 3. **The miner's serial part.** The miner's core steps one event at a time: per transfer
//!    recover/T + admit + build + other, and its per-block costs over B.
//! 4. **A storage node's serial part.** Each node answers one request at a time: its share
//!    (1/S) of every transfer's witness keys and updates, plus its per-call costs.
//! 5. **The closed loop.** Each client keeps `in_flight` submissions of `batch` transfers
//!    out; a batch takes R0 unloaded: a head call, the witness calls, the client's own CPU
//!    for the batch, the submission, half a block cycle waiting for the next block, building,
//!    committing (ApplyBlock round trip, apply, fsync, store; with follower miners their
//!    verdicts' round trip and verification), and the answer. By Little's law throughput is
//!    at most clients·in_flight·batch / R0. With few accounts fewer transfers can be out:
//!    a client keeps one transfer per sender in flight, and 90% of transfers come from the
//!    hottest 10% of accounts, so at most about (hot senders per client)/0.9 are out.
//! 6. **The block pipeline.** One block commits at a time (one more is built ahead): at most
//!    B_max transfers per commit time.
//! 7. **The miner's link.** Bytes per transfer in and out of the miner against its
//!    bandwidth (network links only).
//!
//! The block size B is solved as a fixed point: blocks hold what arrives while the previous
//! block commits (at least a batch, at most B_max and what the clients have out), searched
//! from the largest block down. On one machine the storage nodes' ApplyBlocks (apply and
//! fsync) take turns on the runtime's workers, one per core. Commit latency is R0 when the loop is
//! the bound, and by Little's law outstanding/throughput when a resource is.
//!
//! Assumed, not modelled: queueing below saturation (throughput is the bound's minimum,
//! so it is optimistic near the knee), aborts and retries (the calibration's workload
//! has none; retention r and compaction c enter only through the measured witness and bag
//! sizes), pruning, checkpoints, and the seed's node.js and PoW. A prediction at a scale this
//! machine cannot run (more machines or threads than it has) is marked `extrapolated`.

use serde::{Deserialize, Serialize};

use super::calibrate::Calibration;

/// A role's unit of work, for a simulator charging CPU time per event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// The miner takes a submission of n transfers into the block it builds: recovery
    /// (parallel on its execution pool) and admission (its bag attached to the top layer).
    Submission { transfers: usize },
    /// The miner builds a block of n transfers once they are admitted (execution, roots,
    /// work, logical updates, replies).
    BuildBlock { transfers: usize },
    /// The miner commits a built block (the storage nodes' acknowledgements, the store's completion).
    CommitBlock,
    /// A storage node applies an `ApplyBlock` of u updates and logs it (the fsync's CPU;
    /// its latency is [`Calibration::storage`]'s `log_append_fsync_us`).
    ApplyBlock { updates: usize },
    /// A storage node answers a witness request of k keys.
    Witness { keys: usize },
    /// A client checks the witnesses of a batch (k keys), pre-executes its n transfers and
    /// bags them.
    ClientBatch { transfers: usize, keys: usize },
    /// A message of `bytes` over gRPC (both ends; `grpc` false: the in-process transport).
    Message { bytes: usize, grpc: bool },
}

/// CPU microseconds of `work` on the calibrated machine, on one thread.
pub fn cpu_us(calibration: &Calibration, work: Work) -> f64 {
    let (miner, storage, client, messages) =
        (&calibration.miner, &calibration.storage, &calibration.client, &calibration.messages);
    match work {
        Work::Submission { transfers } => transfers as f64 * (miner.recover_us + miner.admit_us),
        Work::BuildBlock { transfers } => {
            transfers as f64 * (miner.build_us + miner.other_us) + miner.build_block_us + miner.other_block_us
        }
        Work::CommitBlock => miner.commit_block_us,
        Work::ApplyBlock { updates } => {
            storage.apply_call_us + updates as f64 * storage.apply_update_us + storage.log_append_cpu_us
        }
        Work::Witness { keys } => storage.witness_call_us + keys as f64 * storage.witness_key_us,
        Work::ClientBatch { transfers, keys } => {
            keys as f64 * client.verify_key_us + transfers as f64 * (client.preexec_us + client.bag_us)
        }
        // In process a message is handed over, not encoded: its size costs nothing.
        Work::Message { grpc: false, .. } => messages.inproc_call_us,
        Work::Message { bytes, grpc: true } => {
            messages.grpc_call_us.unwrap_or(messages.inproc_call_us)
                + bytes as f64
                    * messages.grpc_ns_per_byte.unwrap_or(messages.encode_ns_per_byte + messages.decode_ns_per_byte)
                    / 1e3
        }
    }
}

/// One direction of a network link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// One-way latency, milliseconds.
    pub latency_ms: f64,
    /// Megabits per second.
    pub bandwidth_mbit: f64,
}

impl Link {
    pub fn lan() -> Link {
        Link { latency_ms: 0.05, bandwidth_mbit: 10_000.0 }
    }

    /// Microseconds a message of `bytes` takes on this link.
    fn transfer_us(&self, bytes: f64) -> f64 {
        self.latency_ms * 1e3 + bytes * 8.0 / self.bandwidth_mbit.max(1e-9)
    }
}

/// How the roles talk.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Links {
    /// One process, the in-process transport.
    InProc,
    /// gRPC on loopback on one machine.
    GrpcLoopback,
    /// gRPC over a network: `local` within a region, `wide` between regions.
    Network { local: Link, wide: Link },
}

/// A cluster's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// Machines and hardware threads per machine. One machine: every role shares it. At
    /// least one machine per role: each role has its own.
    pub machines: usize,
    pub threads: usize,
    /// Cores' worth of CPU the roles actually get on one machine (this machine's measured
    /// `effective_cores`); `None`: all `threads`.
    pub effective_cores: Option<f64>,
    pub clients: usize,
    /// Miners: one builds, the others verify its blocks before each commit completes.
    pub miners: usize,
    pub storage_nodes: usize,
    pub accounts: usize,
    pub retention: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub max_block_transfers: usize,
    pub links: Links,
    /// Regions the roles are spread over (clients, storage nodes and miners dealt evenly);
    /// the building miner is in region 0.
    pub regions: usize,
}

impl Shape {
    /// The roles: clients, miners and storage nodes.
    pub fn roles(&self) -> usize {
        self.clients + self.miners + self.storage_nodes
    }

    /// Whether each role has machines of its own.
    fn dedicated(&self) -> bool {
        self.machines >= self.roles()
    }
}

/// Which bound set the throughput.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    CpuPooled,
    ClientCpu,
    MinerRecovery,
    MinerSerial,
    StorageSerial,
    ClosedLoop,
    BlockPipeline,
    MinerLink,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub predicted_tps: f64,
    /// From a client's submission of a batch to the answer that it committed (including
    /// its witness fetch), milliseconds.
    pub predicted_latency_ms: f64,
    pub bottleneck: Bottleneck,
    /// Every bound, transfers per second.
    pub bounds: Vec<(Bottleneck, f64)>,
    /// The block size the fixed point settled on.
    pub block_transfers: f64,
    /// CPU microseconds per transfer, all roles together.
    pub cpu_us_per_tx: f64,
    /// Unloaded time of one batch, milliseconds.
    pub batch_round_ms: f64,
    /// At a scale this machine cannot run.
    pub extrapolated: bool,
}

/// Per-transfer and per-event costs derived from a calibration for one shape.
struct Costs<'a> {
    calibration: &'a Calibration,
    shape: &'a Shape,
}

impl Costs<'_> {
    fn keys(&self) -> f64 {
        self.calibration.traffic.keys_per_transfer
    }

    /// Witness requests per batch (one per storage node holding some of its keys).
    fn witness_calls(&self) -> f64 {
        let traffic = &self.calibration.traffic;
        let (n1, n2) = (self.calibration.setup.small_block as f64, self.calibration.setup.large_block as f64);
        let batch = self.shape.batch as f64;
        let calls = if batch <= n1 {
            traffic.witness_calls_small * batch / n1.max(1.0)
        } else {
            let fraction = ((batch - n1) / (n2 - n1).max(1.0)).min(1.0);
            traffic.witness_calls_small + fraction * (traffic.witness_calls_large - traffic.witness_calls_small)
        };
        calls.clamp(1.0, self.shape.storage_nodes.max(1) as f64)
    }

    /// The transport's CPU per call and per byte, microseconds (both sides together).
    fn per_call_us(&self) -> f64 {
        let messages = &self.calibration.messages;
        match self.shape.links {
            Links::InProc => messages.inproc_call_us,
            Links::GrpcLoopback | Links::Network { .. } => messages.grpc_call_us.unwrap_or(messages.inproc_call_us),
        }
    }

    fn per_byte_us(&self) -> f64 {
        let messages = &self.calibration.messages;
        match self.shape.links {
            Links::InProc => 0.0,
            Links::GrpcLoopback | Links::Network { .. } => {
                messages.grpc_ns_per_byte.unwrap_or(messages.encode_ns_per_byte + messages.decode_ns_per_byte) / 1e3
            }
        }
    }

    fn client_us(&self) -> f64 {
        let client = &self.calibration.client;
        self.keys() * client.verify_key_us + client.preexec_us + client.bag_us
    }

    /// A storage node's CPU per transfer over all nodes, given blocks of `block` transfers.
    fn storage_us(&self, block: f64) -> f64 {
        let storage = &self.calibration.storage;
        let batch = self.shape.batch.max(1) as f64;
        self.keys() * storage.witness_key_us
            + self.witness_calls() * storage.witness_call_us / batch
            + self.calibration.traffic.updates_per_transfer * storage.apply_update_us
            + self.shape.storage_nodes as f64 * (storage.apply_call_us + storage.log_append_cpu_us) / block
    }

    /// The miner's serial CPU per transfer (its recovery apart).
    fn miner_serial_us(&self, block: f64) -> f64 {
        let miner = &self.calibration.miner;
        miner.admit_us
            + miner.build_us
            + miner.other_us
            + (miner.build_block_us + miner.other_block_us + miner.commit_block_us) / block
    }

    /// Messages' CPU per transfer.
    fn messages_us(&self, block: f64) -> f64 {
        let traffic = &self.calibration.traffic;
        let batch = self.shape.batch.max(1) as f64;
        let calls = (2.0 + self.witness_calls()) / batch
            + (self.shape.storage_nodes + self.shape.miners.saturating_sub(1)) as f64 / block;
        let bytes = traffic.submission_bytes_per_transfer
            + traffic.answer_bytes_per_transfer
            + self.keys() * traffic.witness_bytes_per_key
            + traffic.updates_per_transfer * traffic.apply_bytes_per_update
            + self.shape.storage_nodes as f64 * traffic.apply_bytes_per_call / block;
        calls * self.per_call_us() + bytes * self.per_byte_us()
    }

    /// A follower miner verifies a block by executing it again: recovery and building.
    fn follower_us(&self, block: f64) -> f64 {
        let miner = &self.calibration.miner;
        let threads = self.shape.threads.max(1) as f64;
        block * (miner.recover_us / threads + miner.build_us + miner.admit_us) + miner.build_block_us
    }

    /// One message on the path from a role in region `from` to region `to`: its latency
    /// and transmission (network links) or its transport CPU (one machine), microseconds.
    fn hop_us(&self, same_region: bool, bytes: f64) -> f64 {
        match self.shape.links {
            Links::InProc | Links::GrpcLoopback => self.per_call_us() / 2.0 + bytes * self.per_byte_us(),
            Links::Network { local, wide } => {
                let link = if same_region { local } else { wide };
                link.transfer_us(bytes) + self.per_call_us() / 2.0 + bytes * self.per_byte_us()
            }
        }
    }

    /// From a built block to its commit, microseconds: every storage node's ApplyBlock round
    /// trip with its apply and fsync (the slowest region), the store, follower verdicts.
    fn commit_us(&self, block: f64) -> f64 {
        let traffic = &self.calibration.traffic;
        let storage = &self.calibration.storage;
        let nodes = self.shape.storage_nodes.max(1) as f64;
        let updates = block * traffic.updates_per_transfer / nodes;
        let message = traffic.apply_bytes_per_call + updates * traffic.apply_bytes_per_update;
        let remote = self.shape.regions > 1;
        let apply = storage.apply_call_us + updates * storage.apply_update_us;
        // On one machine the storage nodes apply on the runtime's workers (one per core), so
        // their ApplyBlocks take turns; on machines of their own, all at once. Their fsyncs
        // overlap either way (concurrent fsyncs share the file system's journal commit).
        let turns = if self.shape.machines > 1 { 1.0 } else { (nodes / self.pooled_cores().max(1.0)).ceil() };
        let to_storage = 2.0 * self.hop_us(!remote, message) + turns * apply + storage.log_append_fsync_us;
        let followers = if self.shape.miners > 1 {
            let gossip_bytes = block * traffic.submission_bytes_per_transfer;
            2.0 * self.hop_us(!remote, gossip_bytes) + self.follower_us(block)
        } else {
            0.0
        };
        to_storage + self.calibration.miner.commit_block_us + storage.log_append_fsync_us + followers
    }

    /// The miner's time to build a block of `block` transfers, microseconds.
    fn build_time_us(&self, block: f64) -> f64 {
        let threads = self.miner_threads();
        block * self.calibration.miner.recover_us / threads + block * self.miner_serial_us(block)
    }

    fn miner_threads(&self) -> f64 {
        if self.shape.dedicated() {
            self.shape.threads.max(1) as f64
        } else {
            self.pooled_cores().min(self.shape.threads.max(1) as f64)
        }
    }

    fn pooled_cores(&self) -> f64 {
        let used = self.shape.machines.clamp(1, self.shape.roles().max(1));
        let threads = (used * self.shape.threads.max(1)) as f64;
        match self.shape.effective_cores {
            Some(cores) if self.shape.machines == 1 => cores.min(threads),
            _ => threads,
        }
    }

    /// A client's unloaded time for one batch, microseconds, for a client in region 0 or not.
    fn batch_round_us(&self, local_client: bool, block: f64) -> f64 {
        let traffic = &self.calibration.traffic;
        let batch = self.shape.batch.max(1) as f64;
        let head = 2.0 * self.hop_us(local_client, 100.0);
        // Witnesses come from the client's own region's storage nodes, in parallel.
        let witness_bytes = batch * self.keys() * traffic.witness_bytes_per_key / self.witness_calls();
        let witness = 2.0 * self.hop_us(true, witness_bytes)
            + self.calibration.storage.witness_call_us
            + batch * self.keys() * self.calibration.storage.witness_key_us / self.witness_calls();
        let own = batch * self.client_us();
        let submit = self.hop_us(local_client, batch * traffic.submission_bytes_per_transfer);
        let answer = self.hop_us(local_client, batch * traffic.answer_bytes_per_transfer);
        let cycle = self.build_time_us(block).max(self.commit_us(block));
        head + witness + own + submit + cycle / 2.0 + self.build_time_us(block) + self.commit_us(block) + answer
    }
}

/// How many transfers a client can have out at once: `in_flight` batches, and one per sender
/// of the accounts whose transfers reach it (the hottest tenth send 90%).
fn outstanding_per_client(shape: &Shape) -> f64 {
    let by_loop = (shape.in_flight * shape.batch) as f64;
    let hot_senders = (shape.accounts as f64 * 0.1 / shape.clients.max(1) as f64).max(1.0);
    by_loop.min(hot_senders / 0.9)
}

/// Throughput and commit latency of `shape` from `calibration`.
pub fn predict(calibration: &Calibration, shape: &Shape) -> Prediction {
    let costs = Costs { calibration, shape };
    let max_block = shape.max_block_transfers.max(1) as f64;
    let outstanding = outstanding_per_client(shape) * shape.clients.max(1) as f64;
    // Blocks hold what arrives while the one before commits: from the largest block the loop
    // allows down to the block size that holds one cycle's arrivals.
    let mut block = max_block.min(outstanding.max(1.0)).max(shape.batch.max(1) as f64).min(max_block);
    let mut result = bounds(&costs, block, outstanding);
    for _ in 0..50 {
        let (_, tps) = minimum(&result);
        let cycle_us = costs.build_time_us(block).max(costs.commit_us(block));
        let next = (tps * cycle_us / 1e6).clamp(shape.batch.max(1) as f64, max_block.min(outstanding.max(1.0)));
        if (next - block).abs() < 0.5 {
            break;
        }
        block = (block + next) / 2.0;
        result = bounds(&costs, block, outstanding);
    }
    let (bottleneck, tps) = minimum(&result);
    let round_us = mean_round_us(&costs, block);
    let latency_ms = if bottleneck == Bottleneck::ClosedLoop {
        round_us / 1e3
    } else {
        (round_us / 1e3).max(outstanding / tps.max(1e-9) * 1e3)
    };
    let (_, this_cores) = super::calibrate::machine_description();
    Prediction {
        predicted_tps: tps,
        predicted_latency_ms: latency_ms,
        bottleneck,
        bounds: result,
        block_transfers: block,
        cpu_us_per_tx: total_cpu_us(&costs, block),
        batch_round_ms: round_us / 1e3,
        extrapolated: shape.machines > 1 || shape.threads > this_cores,
    }
}

/// On one machine an fsync holds one of the runtime's worker threads (as many as cores) for
/// its whole wall-clock time, and the part not spent on the CPU is a core's time lost all the
/// same. Per block the storage nodes' fsyncs overlap (one journal commit serves concurrent
/// fsyncs) and hold every worker once, and the miner's store holds one worker once more.
fn blocked_us(costs: &Costs, block: f64) -> f64 {
    if costs.shape.machines > 1 {
        return 0.0;
    }
    let storage = &costs.calibration.storage;
    let waiting = (storage.log_append_fsync_us - storage.log_append_cpu_us).max(0.0);
    let workers = costs.pooled_cores().min(costs.shape.storage_nodes as f64);
    (workers + 1.0) * waiting / block
}

fn total_cpu_us(costs: &Costs, block: f64) -> f64 {
    let extra_miners = costs.shape.miners.saturating_sub(1) as f64;
    costs.client_us()
        + costs.storage_us(block)
        + costs.calibration.miner.recover_us
        + costs.miner_serial_us(block)
        + costs.messages_us(block)
        + extra_miners * costs.follower_us(block) / block
}

/// The unloaded batch time averaged over the clients (those outside region 0 reach the
/// building miner over the wide link).
fn mean_round_us(costs: &Costs, block: f64) -> f64 {
    let shape = costs.shape;
    let clients = shape.clients.max(1);
    let regions = shape.regions.max(1);
    let local = (0..clients).filter(|client| client % regions == 0).count() as f64;
    let remote = clients as f64 - local;
    (local * costs.batch_round_us(true, block) + remote * costs.batch_round_us(false, block)) / clients as f64
}

fn bounds(costs: &Costs, block: f64, outstanding: f64) -> Vec<(Bottleneck, f64)> {
    let shape = costs.shape;
    let calibration = costs.calibration;
    let rate = |us: f64| if us > 0.0 { 1e6 / us } else { f64::INFINITY };
    let threads = shape.threads.max(1) as f64;
    let mut result = vec![(
        Bottleneck::CpuPooled,
        costs.pooled_cores() * rate(total_cpu_us(costs, block) + blocked_us(costs, block)),
    )];
    if shape.dedicated() {
        result.push((Bottleneck::ClientCpu, shape.clients.max(1) as f64 * threads * rate(costs.client_us())));
        result.push((Bottleneck::MinerRecovery, threads * rate(calibration.miner.recover_us)));
    }
    let miner_threads = costs.miner_threads();
    result.push((
        Bottleneck::MinerSerial,
        rate(calibration.miner.recover_us / miner_threads + costs.miner_serial_us(block)),
    ));
    result.push((Bottleneck::StorageSerial, shape.storage_nodes.max(1) as f64 * rate(costs.storage_us(block))));
    // The closed loop: each client's outstanding transfers over its own batch round.
    let clients = shape.clients.max(1);
    let regions = shape.regions.max(1);
    let per_client = outstanding / clients as f64;
    let by_loop: f64 =
        (0..clients).map(|client| per_client * rate(costs.batch_round_us(client % regions == 0, block))).sum();
    result.push((Bottleneck::ClosedLoop, by_loop));
    result.push((Bottleneck::BlockPipeline, shape.max_block_transfers.max(1) as f64 * rate(costs.commit_us(block))));
    if let Links::Network { local, .. } = shape.links {
        let traffic = &calibration.traffic;
        let bytes = traffic.submission_bytes_per_transfer
            + traffic.answer_bytes_per_transfer
            + traffic.updates_per_transfer * traffic.apply_bytes_per_update
            + shape.storage_nodes as f64 * traffic.apply_bytes_per_call / block;
        result.push((Bottleneck::MinerLink, local.bandwidth_mbit * 1e6 / 8.0 / bytes.max(1.0)));
    }
    result
}

fn minimum(bounds: &[(Bottleneck, f64)]) -> (Bottleneck, f64) {
    bounds.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((Bottleneck::CpuPooled, 0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::calibrate::example;

    fn seed_like(machines: usize, threads: usize) -> Shape {
        Shape {
            machines,
            threads,
            effective_cores: None,
            clients: 4,
            miners: 1,
            storage_nodes: 16,
            accounts: 1_000_000,
            retention: 7,
            batch: 250,
            in_flight: 4,
            max_block_transfers: 4_000,
            links: Links::Network { local: Link::lan(), wide: Link::lan() },
            regions: 1,
        }
    }

    fn this_machine(cores: f64) -> Shape {
        Shape {
            machines: 1,
            threads: 2,
            effective_cores: Some(cores),
            links: Links::InProc,
            accounts: 20_000,
            batch: 100,
            ..seed_like(1, 2)
        }
    }

    /// Every CPU cost of a calibration times `factor`.
    fn scaled(calibration: &Calibration, factor: f64) -> Calibration {
        let mut scaled = calibration.clone();
        let miner = &mut scaled.miner;
        for cost in [
            &mut miner.recover_us,
            &mut miner.admit_us,
            &mut miner.build_block_us,
            &mut miner.build_us,
            &mut miner.other_block_us,
            &mut miner.other_us,
            &mut miner.commit_block_us,
        ] {
            *cost *= factor;
        }
        let storage = &mut scaled.storage;
        for cost in [
            &mut storage.apply_call_us,
            &mut storage.apply_update_us,
            &mut storage.log_append_cpu_us,
            &mut storage.witness_call_us,
            &mut storage.witness_key_us,
        ] {
            *cost *= factor;
        }
        let client = &mut scaled.client;
        for cost in [&mut client.verify_key_us, &mut client.preexec_us, &mut client.bag_us] {
            *cost *= factor;
        }
        scaled.messages.inproc_call_us *= factor;
        scaled
    }

    #[test]
    fn event_costs_are_linear_in_their_size_and_add_up_to_the_miners_step() {
        let calibration = example();
        let works: [fn(usize) -> Work; 6] = [
            |n| Work::Submission { transfers: n },
            |n| Work::BuildBlock { transfers: n },
            |n| Work::ApplyBlock { updates: n },
            |n| Work::Witness { keys: n },
            |n| Work::ClientBatch { transfers: n, keys: 2 * n },
            |n| Work::Message { bytes: 1_000 * n, grpc: true },
        ];
        for work in works {
            let (one, two, three) =
                (cpu_us(&calibration, work(100)), cpu_us(&calibration, work(200)), cpu_us(&calibration, work(300)));
            assert!(two > one, "{:?}", work(100));
            assert!(((three - two) - (two - one)).abs() < 1e-6, "{:?}", work(100));
        }
        let miner = &calibration.miner;
        let step = cpu_us(&calibration, Work::Submission { transfers: 100 })
            + cpu_us(&calibration, Work::BuildBlock { transfers: 100 });
        let parts = 100.0 * (miner.recover_us + miner.admit_us + miner.build_us + miner.other_us)
            + miner.build_block_us
            + miner.other_block_us;
        assert!((step - parts).abs() < 1e-6);
        assert_eq!(
            cpu_us(&calibration, Work::Message { bytes: 10, grpc: false }),
            cpu_us(&calibration, Work::Message { bytes: 10_000, grpc: false })
        );
    }

    #[test]
    fn more_threads_or_machines_never_predict_less() {
        let calibration = example();
        let mut previous = 0.0;
        for threads in [1, 2, 4, 8, 16, 48, 96] {
            let tps = predict(&calibration, &seed_like(21, threads)).predicted_tps;
            assert!(tps >= previous, "{threads} threads: {tps} < {previous}");
            previous = tps;
        }
        let mut previous = 0.0;
        for machines in [1, 2, 8, 21, 42] {
            let tps = predict(&calibration, &seed_like(machines, 8)).predicted_tps;
            assert!(tps >= previous, "{machines} machines: {tps} < {previous}");
            previous = tps;
        }
        let mut previous = 0.0;
        for cores in [0.5, 1.0, 1.5, 2.0] {
            let tps = predict(&calibration, &this_machine(cores)).predicted_tps;
            assert!(tps >= previous, "{cores} cores: {tps} < {previous}");
            previous = tps;
        }
    }

    #[test]
    fn wide_area_links_make_the_loop_or_the_pipeline_the_bound() {
        let calibration = example();
        let lan = predict(&calibration, &seed_like(21, 48));
        let wan = wan_shape();
        let wan = predict(&calibration, &wan);
        assert!(
            matches!(wan.bottleneck, Bottleneck::ClosedLoop | Bottleneck::BlockPipeline),
            "{:?}: {:?}",
            wan.bottleneck,
            wan.bounds
        );
        // A batch crosses the wide link several times (a round trip is 150 ms).
        assert!(wan.predicted_latency_ms > 300.0, "{}", wan.predicted_latency_ms);
        assert!(wan.predicted_tps < lan.predicted_tps);
        assert!(wan.extrapolated && lan.extrapolated);
        // Latency-bound: twice the wide latency, about half the throughput.
        let slower = Shape {
            links: Links::Network { local: Link::lan(), wide: Link { latency_ms: 150.0, bandwidth_mbit: 1_000.0 } },
            ..wan_shape()
        };
        let slower = predict(&calibration, &slower);
        let ratio = slower.predicted_tps / wan.predicted_tps;
        assert!((0.45..=0.6).contains(&ratio), "{ratio}");
    }

    fn wan_shape() -> Shape {
        Shape {
            machines: 84,
            clients: 16,
            miners: 4,
            storage_nodes: 64,
            regions: 4,
            links: Links::Network { local: Link::lan(), wide: Link { latency_ms: 75.0, bandwidth_mbit: 1_000.0 } },
            ..seed_like(84, 48)
        }
    }

    #[test]
    fn twice_the_cpu_per_transfer_predicts_about_half_when_cpu_bound() {
        let calibration = example();
        // Large blocks: the fsyncs' waits (not CPU) are spread thin.
        let shape = Shape { batch: 1_000, ..this_machine(1.9) };
        let once = predict(&calibration, &shape);
        assert_eq!(once.bottleneck, Bottleneck::CpuPooled, "{:?}", once.bounds);
        let twice = predict(&scaled(&calibration, 2.0), &shape);
        let ratio = twice.predicted_tps / once.predicted_tps;
        assert!((0.45..=0.55).contains(&ratio), "{ratio}: {} against {}", twice.predicted_tps, once.predicted_tps);
        assert!((twice.cpu_us_per_tx / once.cpu_us_per_tx - 2.0).abs() < 0.1);
        assert!(!once.extrapolated, "two threads on one machine is this machine");
    }

    #[test]
    fn a_loop_with_little_out_is_bound_by_its_round_trips() {
        let calibration = example();
        let slow = Link { latency_ms: 5.0, bandwidth_mbit: 1_000.0 };
        let shape =
            Shape { clients: 1, in_flight: 1, links: Links::Network { local: slow, wide: slow }, ..this_machine(1.9) };
        let prediction = predict(&calibration, &shape);
        assert_eq!(prediction.bottleneck, Bottleneck::ClosedLoop, "{:?}", prediction.bounds);
        // Little's law: one batch out over one batch's round, which crosses the 5 ms link
        // six times (head, witness and submission, each there and back).
        assert!(prediction.batch_round_ms > 30.0, "{}", prediction.batch_round_ms);
        let expected = 100.0 / (prediction.batch_round_ms / 1e3);
        assert!((prediction.predicted_tps - expected).abs() < 1e-6 * expected);
        assert!((prediction.predicted_latency_ms - prediction.batch_round_ms).abs() < 1e-9);
    }
}
