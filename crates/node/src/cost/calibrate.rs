//! Calibration: the time of each role's unit operations on this machine, measured on Virga's
//! own code paths.
//!
//! A [`Rig`] is a small RainBlock network driven by hand, one event at a time, on one thread:
//! the storage nodes' and the miner's real cores, and the client's real checks (the witness
//! verification, pre-execution and bagging that `client.rs` does). Every block goes through
//! the whole protocol (witnesses at the committed head, submission, admission, building,
//! `ApplyBlock` at every storage node, acknowledgement, store, answer), and each step is
//! timed. Blocks of two sizes separate what an operation costs per block (or per call) from
//! what it costs per transfer (or per key, per update). Each figure is the median of several
//! repetitions. The measurements are wall-clock times of one thread (the miner's execution
//! pool has one thread here), so they include whatever the machine's other load takes from
//! that thread; [`Machine::effective_cores`] measures how much of the cores a CPU-bound job
//! of this process actually gets.

use alloy_primitives::{keccak256, B256};
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use virga_ledger::builder::build_block;
use virga_ledger::exec::{apply_transfer, TransferView};
use virga_ledger::tx::{RecoveredTransfer, SignedTransfer};
use virga_net::proto::{self, Submission};
use virga_net::role::{CallId, Command, Event, IoExecutor, Protocol, Role};
use virga_net::{request, Handler, Rainblock, Request, RequestBody, Response, ResponseBody};
use virga_trie::account::Account;
use virga_trie::proof::NodeBag;

use crate::client::UserTransfer;
use crate::codec::{bag_from_wire, bag_to_wire, block_id};
use crate::miner::{execution_pool, MinerCore, MinerIo};
use crate::storage::{log_options, open_core, NodeStorage, StorageCore, StorageIo};
use crate::testkit::{Fixture, Shape};
use crate::workload::{sign_transfers, Skew};

/// Format of the calibration file this build writes and reads.
pub const CALIBRATION_FORMAT: u32 = 1;

/// What a calibration could not do.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("calibration setup: {0}")]
    Setup(String),
    #[error("calibration step {step}: {reason}")]
    Step { step: &'static str, reason: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a calibration file: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{path}: calibration format {found}, this build reads format {CALIBRATION_FORMAT}")]
    Format { path: String, found: u32 },
}

fn step_error(step: &'static str) -> impl Fn(String) -> CalibrationError {
    move |reason| CalibrationError::Step { step, reason }
}

/// The machine a calibration was taken on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Logical cores the OS offers this process.
    pub cores: usize,
    /// Cores' worth of CPU a CPU-bound job of this process gets with one busy thread per
    /// core: its CPU time over the wall-clock time (see [`cpu_share`]). Below `cores` when
    /// other processes share the machine or the host steals time.
    pub effective_cores: f64,
    /// The same, for a process pinned to a set of cores (`taskset -c` lists such as "0" or
    /// "0,1"), measured in child processes by the command line when it calibrates.
    #[serde(default)]
    pub cpu_share: BTreeMap<String, f64>,
    /// `optimized` or `debug` (the build's `debug_assertions`): a calibration holds only for
    /// binaries built like the one that took it.
    pub build: String,
}

/// The network the rig ran: figures depend on the state's size and the shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationSetup {
    pub accounts: usize,
    pub shards: usize,
    pub storage_nodes: usize,
    pub retention: usize,
    pub compaction: usize,
    /// The two block sizes timed (transfers; one submission per block).
    pub small_block: usize,
    pub large_block: usize,
    /// Blocks of each size timed (figures are medians over them).
    pub repetitions: usize,
}

impl CalibrationSetup {
    /// A quick calibration on a state like the validation runs'.
    pub fn standard() -> CalibrationSetup {
        CalibrationSetup {
            accounts: 20_000,
            shards: 16,
            storage_nodes: 16,
            retention: 4,
            compaction: 5,
            small_block: 100,
            large_block: 400,
            repetitions: 9,
        }
    }
}

/// The miner's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinerCosts {
    /// Per transfer: decoding and recovering its signature (`RecoveredTransfer::recover`);
    /// parallel on the miner's execution pool.
    pub recover_us: f64,
    /// Per transfer: attaching its share of the submission's bag to the top layer (`PartialTrie::apply_bag`).
    pub admit_us: f64,
    /// `build_block` on the warm top layer: per block and per transfer (execution, state
    /// root, transaction and receipt roots, work).
    pub build_block_us: f64,
    pub build_us: f64,
    /// The rest of a submission's step (logical updates, shard hashes, pruning bookkeeping,
    /// replies): per block and per transfer.
    pub other_block_us: f64,
    pub other_us: f64,
    /// Committing a block once built: the storage nodes' acknowledgements and the store's
    /// completion as events of the core, per block (the store's own write is not in it).
    pub commit_block_us: f64,
}

/// A storage node's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StorageCosts {
    /// `ApplyBlock` without a log (checks, copy-on-write apply, shard hashes, root): per call
    /// and per update.
    pub apply_call_us: f64,
    pub apply_update_us: f64,
    /// Appending one block's record to the log with fsync (`StorageDisk` on a file in a
    /// temporary directory): its wall-clock time (mostly the device's latency) and the
    /// thread's own CPU time in it (user and kernel, `CLOCK_THREAD_CPUTIME_ID`).
    pub log_append_fsync_us: f64,
    pub log_append_cpu_us: f64,
    /// A witness request (`StorageCore::witness`): per call and per key.
    pub witness_call_us: f64,
    pub witness_key_us: f64,
}

/// A prefetching client's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientCosts {
    /// Per key: checking a storage node's bag against the root and compacting it (`NodeBag::verify_compact`).
    pub verify_key_us: f64,
    /// Per transfer: pre-execution (`apply_transfer` on the witnessed accounts).
    pub preexec_us: f64,
    /// Per transfer: merging the bags and encoding the transfers into the submission.
    pub bag_us: f64,
}

/// Messages and hashing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessageCosts {
    /// prost encoding and decoding of RainBlock's messages (submissions, `ApplyBlock`, witness replies).
    pub encode_ns_per_byte: f64,
    pub decode_ns_per_byte: f64,
    /// keccak-256 of a trie node (the witness nodes' own sizes).
    pub keccak_ns_per_node: f64,
    /// A call over the in-process transport, whole, as the roles make them: the caller a
    /// task of its own, the callee a mailbox whose driver task answers through a oneshot
    /// channel, on a two-worker runtime (so a call wakes tasks across threads).
    pub inproc_call_us: f64,
    /// A call over gRPC on loopback (both sides, one call at a time): per call and per byte
    /// of request. `None` in a build without gRPC.
    pub grpc_call_us: Option<f64>,
    pub grpc_ns_per_byte: Option<f64>,
}

/// Sizes and counts of the messages the rig's blocks produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Distinct accounts a transfer touches within a batch (sender and recipient, shared
    /// ones counted once).
    pub keys_per_transfer: f64,
    /// Logical updates a block carries per transfer (its accounts, the beneficiary's once).
    pub updates_per_transfer: f64,
    /// Witness requests per batch of `small_block` and of `large_block` transfers (one per storage node asked).
    pub witness_calls_small: f64,
    pub witness_calls_large: f64,
    /// Encoded bytes: a submission per transfer, a witness reply per key, an `ApplyBlock`
    /// per update and per call (its header and shard hashes), the submission's answer per transfer.
    pub submission_bytes_per_transfer: f64,
    pub witness_bytes_per_key: f64,
    pub apply_bytes_per_update: f64,
    pub apply_bytes_per_call: f64,
    pub answer_bytes_per_transfer: f64,
}

/// Everything measured, with the machine and the setup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: u32,
    pub machine: Machine,
    /// Seconds since the Unix epoch when it was taken.
    pub taken_at: u64,
    pub setup: CalibrationSetup,
    pub miner: MinerCosts,
    pub storage: StorageCosts,
    pub client: ClientCosts,
    pub messages: MessageCosts,
    pub traffic: Traffic,
}

impl Calibration {
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|source| CalibrationError::Json { path: path.display().to_string(), source })?;
        std::fs::write(path, json).map_err(|source| CalibrationError::Io { path: path.display().to_string(), source })
    }

    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CalibrationError::Io { path: path.display().to_string(), source })?;
        let calibration: Calibration = serde_json::from_str(&text)
            .map_err(|source| CalibrationError::Json { path: path.display().to_string(), source })?;
        if calibration.format != CALIBRATION_FORMAT {
            return Err(CalibrationError::Format { path: path.display().to_string(), found: calibration.format });
        }
        Ok(calibration)
    }
}

/// Wall-clock microseconds of a storage node's log append with fsync now: the median of
/// `appends` appends of a small record to a fresh log in the temporary directory.
pub fn fsync_latency_us(appends: usize) -> Result<f64, CalibrationError> {
    let mut log = LogProbe::new()?;
    for index in 0..appends.max(1) {
        log.append(vec![index as u8; 256])?;
    }
    Ok(log.finish().0)
}

/// The median of `values` (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|value| value.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// The line through (x1, y1) and (x2, y2): intercept and slope, each at least 0 (a noisy
/// pair of medians may tilt the line below zero, which no cost is).
pub fn fit_line(x1: f64, y1: f64, x2: f64, y2: f64) -> (f64, f64) {
    if (x2 - x1).abs() < f64::EPSILON {
        return (0.0, if x1 > 0.0 { y1 / x1 } else { 0.0 });
    }
    let slope = ((y2 - y1) / (x2 - x1)).max(0.0);
    let intercept = (y1 - slope * x1).max(0.0);
    (intercept, slope)
}

fn micros(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e6
}

/// This process's CPU time so far (user and kernel, every thread), microseconds, from
/// `CLOCK_PROCESS_CPUTIME_ID` (time preempted by other processes is not in it). `None` where
/// the clock cannot be read.
fn process_cpu_us() -> Option<f64> {
    cpu_clock_us(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Times work by the process's CPU time where /proc allows (less the cost of reading it),
/// else by the wall clock.
#[derive(Clone, Copy)]
struct Stopwatch {
    /// What reading the CPU clock twice costs, microseconds.
    overhead_us: Option<f64>,
}

/// A started measurement.
struct Lap {
    cpu: Option<f64>,
    wall: Instant,
}

impl Stopwatch {
    fn new() -> Stopwatch {
        let mut laps = Vec::new();
        for _ in 0..31 {
            let (Some(first), Some(second)) = (process_cpu_us(), process_cpu_us()) else {
                return Stopwatch { overhead_us: None };
            };
            laps.push(second - first);
        }
        Stopwatch { overhead_us: Some(median(&laps)) }
    }

    fn start(&self) -> Lap {
        Lap { cpu: self.overhead_us.and_then(|_| process_cpu_us()), wall: Instant::now() }
    }

    fn micros(&self, lap: Lap) -> f64 {
        match (lap.cpu, self.overhead_us, process_cpu_us()) {
            (Some(start), Some(overhead), Some(end)) => (end - start - overhead).max(0.0),
            _ => micros(lap.wall),
        }
    }
}

/// What one block's pass through the rig measured (microseconds, counts, bytes).
#[derive(Clone, Debug, Default)]
struct BlockSample {
    transfers: usize,
    keys: usize,
    witness_calls: usize,
    witness_us: f64,
    witness_bytes: usize,
    verify_us: f64,
    preexec_us: f64,
    bag_us: f64,
    submission_bytes: usize,
    recover_us: f64,
    admit_us: f64,
    build_us: f64,
    step_us: f64,
    apply_calls: usize,
    apply_updates: usize,
    apply_us: f64,
    apply_bytes: usize,
    commit_us: f64,
    answer_bytes: usize,
    /// Encoded messages of the block, for the per-byte costs.
    messages: Vec<Request>,
    witness_nodes: Vec<Vec<u8>>,
}

/// A RainBlock network of real cores driven by hand on this thread.
struct Rig {
    fixture: Fixture,
    nodes: Vec<(String, StorageCore)>,
    miner: MinerCore,
    transfers: std::vec::IntoIter<UserTransfer>,
    compaction: usize,
    next_call: u64,
    clock: Stopwatch,
}

type MinerCommand = Command<Rainblock, MinerIo>;

impl Rig {
    fn new(setup: &CalibrationSetup) -> Result<Rig, CalibrationError> {
        let shape = Shape {
            accounts: setup.accounts,
            shards: setup.shards,
            storage_nodes: setup.storage_nodes,
            replicas: 1,
            max_block_transfers: setup.large_block.max(setup.small_block),
        };
        let fixture = Fixture::new(shape).map_err(CalibrationError::Setup)?;
        let mut nodes = Vec::new();
        for (id, _) in &fixture.layout {
            let served = fixture.served(id).ok_or_else(|| CalibrationError::Setup(format!("{id} serves nothing")))?;
            let opened = open_core(id.clone(), served, fixture.header.clone(), &fixture.sharded, NodeStorage::None)
                .map_err(|error| CalibrationError::Setup(error.to_string()))?;
            nodes.push((id.clone(), opened.core));
        }
        let config = fixture.miner_config(0, 0, setup.retention, usize::MAX);
        let pool = execution_pool(1).map_err(|error| CalibrationError::Setup(error.to_string()))?;
        let miner = MinerCore::new(config, fixture.header.clone(), pool)
            .map_err(|error| CalibrationError::Setup(error.to_string()))?;
        let blocks = setup.repetitions * 2 + 2;
        let count = blocks * setup.large_block.max(setup.small_block);
        let chain_id = fixture.config.exec.chain_id;
        let transfers = sign_transfers(&fixture.accounts, count, chain_id, Skew::default(), 11, &|_| {});
        let mut rig = Rig {
            fixture,
            nodes,
            miner,
            transfers: transfers.into_iter(),
            compaction: setup.compaction,
            next_call: 0,
            clock: Stopwatch::new(),
        };
        let mut out = Vec::new();
        rig.miner.step(1_000_000_000, Event::Start, &mut out);
        rig.answer_calls(out);
        if !rig.miner.warm_up_state().0 {
            let reason = rig.miner.warm_up_state().1.map_or("no reason given".to_string(), |(_, why)| why.to_string());
            return Err(CalibrationError::Setup(format!("the miner did not warm up: {reason}")));
        }
        Ok(rig)
    }

    fn serve(&mut self, to: &str, request: Request) -> Response {
        let Some((_, node)) = self.nodes.iter_mut().find(|(id, _)| id == to) else {
            return virga_net::refusal(format!("no storage node {to}"));
        };
        let mut out: Vec<Command<Rainblock, StorageIo>> = Vec::new();
        node.step(0, Event::Request { from: "miner-0".into(), call: CallId(0), request }, &mut out);
        out.into_iter()
            .find_map(|command| match command {
                Command::Reply { response, .. } => Some(response),
                _ => None,
            })
            .unwrap_or_else(|| virga_net::refusal("the storage node did not answer"))
    }

    /// Answers the miner's calls from the storage nodes until it makes none; returns its
    /// other commands.
    fn answer_calls(&mut self, mut commands: Vec<MinerCommand>) -> Vec<MinerCommand> {
        let mut rest = Vec::new();
        while !commands.is_empty() {
            let mut next = Vec::new();
            for command in commands {
                match command {
                    Command::Call { to, call, request, .. } => {
                        let result = Rainblock::check(&to, self.serve(&to, request));
                        self.miner.step(1_000_000_000, Event::Response { call, result }, &mut next);
                    }
                    other => rest.push(other),
                }
            }
            commands = next;
        }
        rest
    }

    /// The next `count` transfers, one per sender (as a client batches them), sender order kept.
    fn batch(&mut self, count: usize) -> Vec<UserTransfer> {
        self.transfers.by_ref().take(count).collect()
    }

    /// One block of `count` transfers through the whole protocol, timed step by step.
    fn block(&mut self, count: usize) -> Result<BlockSample, CalibrationError> {
        let batch = self.batch(count);
        if batch.len() < count {
            return Err(CalibrationError::Setup("the rig ran out of signed transfers".to_string()));
        }
        let mut sample = BlockSample { transfers: batch.len(), ..BlockSample::default() };
        let (number, hash, root) = self.miner.head();

        // The client: witnesses at the head, one request per storage node.
        let mut keys: Vec<B256> = batch.iter().flat_map(|t| [keccak256(t.sender), keccak256(t.tx.to())]).collect();
        keys.sort_unstable();
        keys.dedup();
        sample.keys = keys.len();
        let mut by_node: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
        let prefix = crate::storage::prefix_nibbles(self.fixture.shape.shards).unwrap_or(0);
        for key in &keys {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix)
                .map_err(|error| step_error("shard")(error.to_string()))?;
            let node = self.fixture.layout.iter().position(|(_, shards)| shards.contains(&shard)).unwrap_or(0);
            by_node.entry(node).or_default().push(key.to_vec());
        }
        let mut replies = Vec::new();
        for (node, node_keys) in by_node {
            let witness = proto::WitnessRequest { keys: node_keys, compaction: 0, at: Some(block_id(number, hash)) };
            let core = &mut self.nodes[node].1;
            let started = self.clock.start();
            let reply = core.witness(&witness).map_err(step_error("witness"))?;
            sample.witness_us += self.clock.micros(started);
            sample.witness_calls += 1;
            sample.witness_bytes += reply.encoded_len();
            replies.push(reply);
        }

        let mut values: HashMap<B256, Option<Vec<u8>>> = HashMap::new();
        let mut compact = Vec::new();
        let started = self.clock.start();
        for reply in replies {
            let bag = bag_from_wire(reply.bag);
            let (proven, _, compacted) =
                bag.verify_compact(root, self.compaction).map_err(|error| step_error("verify")(error.to_string()))?;
            for (key, value) in bag.keys.iter().zip(proven) {
                values.insert(B256::from_slice(key), value);
            }
            sample.witness_nodes.extend(bag.nodes);
            compact.push(compacted);
        }
        sample.verify_us = self.clock.micros(started);

        let exec = self.fixture.config.exec;
        let started = self.clock.start();
        let mut accounts: HashMap<B256, Account> = HashMap::new();
        for transfer in &batch {
            let view = TransferView::of(&transfer.tx, transfer.sender);
            let load = |key: &B256, accounts: &HashMap<B256, Account>| -> Result<Account, String> {
                if let Some(account) = accounts.get(key) {
                    return Ok(*account);
                }
                match values.get(key) {
                    Some(Some(bytes)) => Account::decode_rlp(bytes).map_err(|error| error.to_string()),
                    Some(None) => Ok(Account::default()),
                    None => Err("not witnessed".to_string()),
                }
            };
            let sender = load(&view.sender_key, &accounts).map_err(step_error("pre-execution"))?;
            let recipient = load(&view.to_key, &accounts).map_err(step_error("pre-execution"))?;
            if let Ok(effect) = apply_transfer(&exec, &view, &sender, &recipient) {
                accounts.insert(effect.sender.0, effect.sender.1);
                if let Some((key, account)) = effect.recipient {
                    accounts.insert(key, account);
                }
            }
        }
        sample.preexec_us = self.clock.micros(started);

        let started = self.clock.start();
        let bag = NodeBag::merge(compact);
        let submission = Submission {
            transactions: batch.iter().map(|t| t.tx.encode()).collect(),
            bag: Some(bag_to_wire(&bag)),
            witness_at: Some(block_id(number, hash)),
            witness_root: root.to_vec(),
        };
        sample.bag_us = self.clock.micros(started);
        let submit = request(RequestBody::Submit(submission.clone()));
        sample.submission_bytes = submit.encoded_len();
        sample.messages.push(submit.clone());

        self.time_miner_parts(&submission, &bag, &mut sample)?;

        // The miner's step: recovery, admission, building, logical updates.
        let call = CallId(self.next_call);
        self.next_call += 1;
        let mut out = Vec::new();
        let started = self.clock.start();
        self.miner.step(2_000_000_000, Event::Request { from: "client-0".into(), call, request: submit }, &mut out);
        sample.step_us = self.clock.micros(started);

        // The storage nodes apply the block; the miner commits it.
        let mut commit_us = 0.0;
        let mut answers = Vec::new();
        let mut pending = out;
        while !pending.is_empty() {
            let mut next = Vec::new();
            for command in pending {
                match command {
                    Command::Call { to, call, request, .. } => {
                        if let Some(RequestBody::ApplyBlock(updates)) = &request.body {
                            sample.apply_calls += 1;
                            sample.apply_updates += updates.updates.len();
                            sample.apply_bytes += request.encoded_len();
                            sample.messages.push(request.clone());
                        }
                        let started = self.clock.start();
                        let response = self.serve(&to, request);
                        sample.apply_us += self.clock.micros(started);
                        let result = Rainblock::check(&to, response);
                        let started = self.clock.start();
                        self.miner.step(3_000_000_000, Event::Response { call, result }, &mut next);
                        commit_us += self.clock.micros(started);
                    }
                    Command::Io { io, op: MinerIo::Store { .. } } => {
                        let started = self.clock.start();
                        self.miner.step(3_000_000_000, Event::IoDone { io, result: Ok(()) }, &mut next);
                        commit_us += self.clock.micros(started);
                    }
                    Command::Reply { response, .. } => {
                        sample.answer_bytes += response.encoded_len();
                        answers.push(response);
                    }
                    Command::SetTimer { .. } => {}
                }
            }
            pending = next;
        }
        sample.commit_us = commit_us;
        let included = answers
            .iter()
            .filter_map(|response| match &response.body {
                Some(ResponseBody::Submitted(submitted)) => {
                    Some(submitted.outcomes.iter().filter(|o| o.included).count())
                }
                _ => None,
            })
            .sum::<usize>();
        if included == 0 {
            return Err(step_error("commit")(format!(
                "the block of {count} transfers committed none of them (answers: {answers:?})"
            )));
        }
        Ok(sample)
    }

    /// Times recovery, admission and `build_block` apart, on a copy of the miner's tip.
    fn time_miner_parts(
        &self,
        submission: &Submission,
        bag: &NodeBag,
        sample: &mut BlockSample,
    ) -> Result<(), CalibrationError> {
        let started = self.clock.start();
        let recovered: Vec<RecoveredTransfer> = submission
            .transactions
            .iter()
            .map(|bytes| {
                let tx = SignedTransfer::decode(bytes).map_err(|error| error.to_string())?;
                RecoveredTransfer::recover(tx).map_err(|error| error.to_string())
            })
            .collect::<Result<_, String>>()
            .map_err(step_error("recover"))?;
        sample.recover_us = self.clock.micros(started);

        let (parent, top) = self.miner.tip();
        let (parent, mut top) = (parent.clone(), top.clone());
        let started = self.clock.start();
        top.apply_bag(bag).map_err(|error| step_error("admit")(error.to_string()))?;
        sample.admit_us = self.clock.micros(started);

        let chain = self.fixture.config;
        let beneficiary = crate::cluster::beneficiary(0);
        let started = self.clock.start();
        build_block(&chain, &parent, &mut top, recovered, beneficiary, 2, self.miner.pool())
            .map_err(|error| step_error("build")(error.to_string()))?;
        sample.build_us = self.clock.micros(started);
        Ok(())
    }
}

/// This thread's CPU time so far (user and kernel), microseconds, from
/// `CLOCK_THREAD_CPUTIME_ID`; `None` where the clock cannot be read.
fn thread_cpu_us() -> Option<f64> {
    cpu_clock_us(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn cpu_clock_us(clock: libc::clockid_t) -> Option<f64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which points to a
    // live, writable one.
    let status = unsafe { libc::clock_gettime(clock, &mut now) };
    (status == 0).then(|| now.tv_sec as f64 * 1e6 + now.tv_nsec as f64 / 1e3)
}

/// A storage node's log on a temporary directory, for timing appends with fsync.
struct LogProbe {
    dir: std::path::PathBuf,
    disk: crate::storage::StorageDisk,
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl LogProbe {
    fn new() -> Result<LogProbe, CalibrationError> {
        let dir = tempfile_dir()?;
        let storage: virga_core::device::SharedStorage = Arc::new(
            virga_core::device::FileStorage::create_dir_all(&dir)
                .map_err(|source| CalibrationError::Io { path: dir.display().to_string(), source })?,
        );
        let node =
            NodeStorage::on(storage, log_options()).map_err(|error| CalibrationError::Setup(error.to_string()))?;
        let fixture = Fixture::new(Shape { accounts: 2, ..Shape::default() }).map_err(CalibrationError::Setup)?;
        let served = fixture.served("storage-0").ok_or_else(|| CalibrationError::Setup("no storage-0".to_string()))?;
        let opened = open_core("storage-0", served, fixture.header.clone(), &fixture.sharded, node)
            .map_err(|error| CalibrationError::Setup(error.to_string()))?;
        let disk = opened.disk.ok_or_else(|| CalibrationError::Setup("a logged node without a disk".to_string()))?;
        Ok(LogProbe { dir, disk, wall: Vec::new(), cpu: Vec::new() })
    }

    /// Appends `record` (with fsync) and keeps its wall-clock and CPU time.
    fn append(&mut self, record: Vec<u8>) -> Result<(), CalibrationError> {
        let cpu_before = thread_cpu_us();
        let started = Instant::now();
        let done = self.disk.execute(StorageIo::Append { record });
        self.wall.push(micros(started));
        if let (Some(before), Some(after)) = (cpu_before, thread_cpu_us()) {
            self.cpu.push(after - before);
        }
        match done {
            crate::storage::StorageIoDone::Appended(Err(reason)) => Err(step_error("log append")(reason)),
            _ => Ok(()),
        }
    }

    /// Median wall-clock and CPU microseconds of the appends.
    fn finish(self) -> (f64, f64) {
        let _ = std::fs::remove_dir_all(&self.dir);
        (median(&self.wall), median(&self.cpu))
    }
}

fn tempfile_dir() -> Result<std::path::PathBuf, CalibrationError> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("virga-calibration-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| CalibrationError::Io { path: dir.display().to_string(), source })?;
    Ok(dir)
}

/// prost encoding and decoding of `messages`: nanoseconds per byte (medians over messages).
fn codec_ns_per_byte(messages: &[Request]) -> (f64, f64) {
    let (mut encode, mut decode) = (Vec::new(), Vec::new());
    for message in messages {
        let bytes = message.encoded_len().max(1) as f64;
        let rounds = 8;
        let started = Instant::now();
        let mut encoded = Vec::new();
        for _ in 0..rounds {
            encoded = message.encode_to_vec();
        }
        encode.push(started.elapsed().as_secs_f64() * 1e9 / rounds as f64 / bytes);
        let started = Instant::now();
        for _ in 0..rounds {
            let _ = std::hint::black_box(Request::decode(encoded.as_slice()));
        }
        decode.push(started.elapsed().as_secs_f64() * 1e9 / rounds as f64 / bytes);
    }
    (median(&encode), median(&decode))
}

fn keccak_ns_per_node(nodes: &[Vec<u8>]) -> f64 {
    if nodes.is_empty() {
        return 0.0;
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for node in nodes {
            std::hint::black_box(keccak256(node));
        }
        times.push(started.elapsed().as_secs_f64() * 1e9 / nodes.len() as f64);
    }
    median(&times)
}

/// Answers every request at once with a small fixed response.
struct Echo;

impl virga_net::Handler for Echo {
    fn handle(&self, _from: String, _request: Request) -> virga_net::BoxFuture<Response> {
        let head = proto::HeadReply { head: Some(block_id(1, B256::ZERO)), state_root: vec![0; 32] };
        Box::pin(std::future::ready(virga_net::response(ResponseBody::Head(head))))
    }
}

/// Median microseconds of one call over `transport` with `request`, one call at a time.
async fn time_calls(transport: &dyn virga_net::Transport, request: &Request, calls: usize) -> Result<f64, String> {
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        transport.call("client-0", "echo-0", request.clone()).await.map_err(|error| error.to_string())?;
        times.push(micros(started));
    }
    Ok(median(&times))
}

/// A handler that hands each request to a driver task, as `virga_net::driver::Mailbox` does.
struct MailboxEcho {
    sender: tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<Response>>,
}

impl virga_net::Handler for MailboxEcho {
    fn handle(&self, _from: String, _request: Request) -> virga_net::BoxFuture<Response> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self.sender.send(reply);
        Box::pin(async move {
            if sent.is_err() {
                return virga_net::refusal("the driver stopped");
            }
            answer.await.unwrap_or_else(|_| virga_net::refusal("the driver dropped the call"))
        })
    }
}

fn inproc_call_us(small: &Request) -> Result<f64, CalibrationError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .map_err(|error| CalibrationError::Setup(error.to_string()))?;
    runtime.block_on(async {
        let (sender, mut inbox) = tokio::sync::mpsc::unbounded_channel::<tokio::sync::oneshot::Sender<Response>>();
        tokio::spawn(async move {
            while let Some(reply) = inbox.recv().await {
                let _ = reply.send(Echo.handle(String::new(), Request::default()).await);
            }
        });
        let transport = virga_net::InProc::new();
        transport.register("echo-0", Arc::new(MailboxEcho { sender }));
        let transport: Arc<dyn virga_net::Transport> = Arc::new(transport);
        let mut times = Vec::new();
        for _ in 0..2_000 {
            let (transport, request) = (Arc::clone(&transport), small.clone());
            let started = Instant::now();
            let call = tokio::spawn(async move { transport.call("client-0", "echo-0", request).await });
            match call.await {
                Ok(Ok(_)) => times.push(micros(started)),
                Ok(Err(error)) => return Err(step_error("in-process calls")(error.to_string())),
                Err(error) => return Err(step_error("in-process calls")(error.to_string())),
            }
        }
        Ok(median(&times))
    })
}

/// gRPC on loopback: microseconds per call (small request) and nanoseconds per request byte
/// (the large request's extra time over its extra bytes).
#[cfg(feature = "grpc")]
fn grpc_costs(small: &Request, large: &Request) -> Result<(Option<f64>, Option<f64>), CalibrationError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| CalibrationError::Setup(error.to_string()))?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|error| CalibrationError::Setup(format!("binding the gRPC echo server: {error}")))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (address, server) = virga_net::serve(listener, Arc::new(Echo), async move {
            let _ = stopped.await;
        })
        .map_err(|error| CalibrationError::Setup(error.to_string()))?;
        tokio::spawn(server);
        let transport = virga_net::Grpc::new(HashMap::from([("echo-0".to_string(), format!("http://{address}"))]));
        // The first call connects.
        time_calls(&transport, small, 5).await.map_err(step_error("gRPC calls"))?;
        let small_us = time_calls(&transport, small, 400).await.map_err(step_error("gRPC calls"))?;
        let large_us = time_calls(&transport, large, 100).await.map_err(step_error("gRPC calls"))?;
        let _ = stop.send(());
        let extra_bytes = large.encoded_len().saturating_sub(small.encoded_len()).max(1) as f64;
        let per_byte = ((large_us - small_us) * 1e3 / extra_bytes).max(0.0);
        Ok((Some(small_us), Some(per_byte)))
    })
}

#[cfg(not(feature = "grpc"))]
fn grpc_costs(_: &Request, _: &Request) -> Result<(Option<f64>, Option<f64>), CalibrationError> {
    Ok((None, None))
}

/// The CPU model (`model name` in /proc/cpuinfo) and the cores offered to this process.
pub fn machine_description() -> (String, usize) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    (model, cores)
}

/// Cores' worth of CPU this process gets with `threads` busy threads (signature recovery,
/// Virga's heaviest unit, in a loop) over about `seconds`: the process's CPU time over the
/// wall-clock time, from /proc/self/stat (ticks of 10 ms, so about 1% at a second).
/// `None` where /proc is not readable.
pub fn cpu_share(threads: usize, seconds: f64) -> Option<f64> {
    let fixture = Fixture::new(Shape { accounts: 8, ..Shape::default() }).ok()?;
    let chain_id = fixture.config.exec.chain_id;
    let transfers: Vec<SignedTransfer> = sign_transfers(&fixture.accounts, 32, chain_id, Skew::default(), 3, &|_| {})
        .into_iter()
        .map(|t| t.tx)
        .collect();
    let threads = threads.max(1);
    let cpu_before = crate::cluster::process_cpu_seconds()?;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while started.elapsed().as_secs_f64() < seconds {
                    for tx in &transfers {
                        let _ = std::hint::black_box(RecoveredTransfer::recover(tx.clone()));
                    }
                }
            });
        }
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = crate::cluster::process_cpu_seconds()? - cpu_before;
    Some((cpu / wall.max(1e-9)).clamp(0.01, threads as f64))
}

/// Measures everything, on a network shaped by `setup`.
pub fn calibrate(setup: &CalibrationSetup) -> Result<Calibration, CalibrationError> {
    if setup.small_block == 0 || setup.large_block <= setup.small_block || setup.repetitions == 0 {
        return Err(CalibrationError::Setup(format!(
            "blocks of {} and {} transfers, {} repetitions: the large block must be larger and both non-empty",
            setup.small_block, setup.large_block, setup.repetitions
        )));
    }
    let (cpu_model, cores) = machine_description();
    let mut rig = Rig::new(setup)?;
    // One block of each size first, untimed: the top layer grows along the hot paths.
    rig.block(setup.small_block)?;
    rig.block(setup.large_block)?;
    // The log appends are spread over the blocks (two per block: one of each size's
    // records), so a short slow spell of the disk does not set the figure.
    let mut log = LogProbe::new()?;
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for _ in 0..setup.repetitions {
        for sample in [rig.block(setup.small_block)?, rig.block(setup.large_block)?] {
            if let Some(record) = sample.messages.iter().find_map(|m| match &m.body {
                Some(RequestBody::ApplyBlock(updates)) => Some(updates.encode_to_vec()),
                _ => None,
            }) {
                log.append(record)?;
            }
            if sample.transfers == setup.small_block {
                small.push(sample);
            } else {
                large.push(sample);
            }
        }
    }
    let per = |samples: &[BlockSample], value: &dyn Fn(&BlockSample) -> f64, count: &dyn Fn(&BlockSample) -> usize| {
        median(&samples.iter().map(|s| value(s) / count(s).max(1) as f64).collect::<Vec<_>>())
    };
    let both: Vec<BlockSample> = small.iter().chain(&large).cloned().collect();
    let transfers = |s: &BlockSample| s.transfers;
    let keys = |s: &BlockSample| s.keys;
    let med = |samples: &[BlockSample], value: &dyn Fn(&BlockSample) -> f64| {
        median(&samples.iter().map(value).collect::<Vec<_>>())
    };
    let (n1, n2) = (setup.small_block as f64, setup.large_block as f64);

    let (build_block_us, build_us) = fit_line(n1, med(&small, &|s| s.build_us), n2, med(&large, &|s| s.build_us));
    let other = |s: &BlockSample| (s.step_us - s.recover_us - s.admit_us - s.build_us).max(0.0);
    let (other_block_us, other_us) = fit_line(n1, med(&small, &other), n2, med(&large, &other));
    let miner = MinerCosts {
        recover_us: per(&both, &|s| s.recover_us, &transfers),
        admit_us: per(&both, &|s| s.admit_us, &transfers),
        build_block_us,
        build_us,
        other_block_us,
        other_us,
        commit_block_us: med(&both, &|s| s.commit_us),
    };

    // Per call and per update (key): two equations, the two block sizes' medians.
    let calls_and_units =
        |samples: &[BlockSample], calls: &dyn Fn(&BlockSample) -> usize, units: &dyn Fn(&BlockSample) -> usize| {
            (med(samples, &|s| calls(s) as f64), med(samples, &|s| units(s) as f64))
        };
    let solve = |(c1, u1): (f64, f64), t1: f64, (c2, u2): (f64, f64), t2: f64| -> (f64, f64) {
        let determinant = c1 * u2 - c2 * u1;
        if determinant.abs() < 1e-9 {
            return (0.0, t2 / u2.max(1.0));
        }
        let per_call = (t1 * u2 - t2 * u1) / determinant;
        let per_unit = (c1 * t2 - c2 * t1) / determinant;
        if per_call < 0.0 || per_unit < 0.0 {
            // Noise: charge everything per unit.
            return (0.0, (t1 + t2) / (u1 + u2).max(1.0));
        }
        (per_call, per_unit)
    };
    let apply_counts = |s: &BlockSample| s.apply_calls;
    let updates = |s: &BlockSample| s.apply_updates;
    let (apply_call_us, apply_update_us) = solve(
        calls_and_units(&small, &apply_counts, &updates),
        med(&small, &|s| s.apply_us),
        calls_and_units(&large, &apply_counts, &updates),
        med(&large, &|s| s.apply_us),
    );
    let witness_counts = |s: &BlockSample| s.witness_calls;
    let (witness_call_us, witness_key_us) = solve(
        calls_and_units(&small, &witness_counts, &keys),
        med(&small, &|s| s.witness_us),
        calls_and_units(&large, &witness_counts, &keys),
        med(&large, &|s| s.witness_us),
    );
    let (log_append_fsync_us, log_append_cpu_us) = log.finish();
    let storage = StorageCosts {
        apply_call_us,
        apply_update_us,
        log_append_fsync_us,
        log_append_cpu_us,
        witness_call_us,
        witness_key_us,
    };
    let client = ClientCosts {
        verify_key_us: per(&both, &|s| s.verify_us, &keys),
        preexec_us: per(&both, &|s| s.preexec_us, &transfers),
        bag_us: per(&both, &|s| s.bag_us, &transfers),
    };

    let messages: Vec<Request> = both.iter().flat_map(|s| s.messages.iter().cloned()).collect();
    let (encode_ns_per_byte, decode_ns_per_byte) = codec_ns_per_byte(&messages);
    let nodes: Vec<Vec<u8>> = both.iter().flat_map(|s| s.witness_nodes.iter().cloned()).collect();
    let small_request = request(RequestBody::Head(proto::HeadRequest {}));
    let large_request = messages
        .iter()
        .filter(|m| matches!(m.body, Some(RequestBody::Submit(_))))
        .max_by_key(|m| m.encoded_len())
        .cloned()
        .unwrap_or_else(|| small_request.clone());
    let (grpc_call_us, grpc_ns_per_byte) = grpc_costs(&small_request, &large_request)?;
    let message_costs = MessageCosts {
        encode_ns_per_byte,
        decode_ns_per_byte,
        keccak_ns_per_node: keccak_ns_per_node(&nodes),
        inproc_call_us: inproc_call_us(&small_request)?,
        grpc_call_us,
        grpc_ns_per_byte,
    };

    let traffic = Traffic {
        keys_per_transfer: per(&both, &|s| s.keys as f64, &transfers),
        updates_per_transfer: per(&both, &|s| s.apply_updates as f64, &transfers),
        witness_calls_small: med(&small, &|s| s.witness_calls as f64),
        witness_calls_large: med(&large, &|s| s.witness_calls as f64),
        submission_bytes_per_transfer: per(&both, &|s| s.submission_bytes as f64, &transfers),
        witness_bytes_per_key: per(&both, &|s| s.witness_bytes as f64, &keys),
        apply_bytes_per_update: {
            let (per_call, per_update) = solve(
                calls_and_units(&small, &apply_counts, &updates),
                med(&small, &|s| s.apply_bytes as f64),
                calls_and_units(&large, &apply_counts, &updates),
                med(&large, &|s| s.apply_bytes as f64),
            );
            let _ = per_call;
            per_update
        },
        apply_bytes_per_call: {
            let (per_call, _) = solve(
                calls_and_units(&small, &apply_counts, &updates),
                med(&small, &|s| s.apply_bytes as f64),
                calls_and_units(&large, &apply_counts, &updates),
                med(&large, &|s| s.apply_bytes as f64),
            );
            per_call
        },
        answer_bytes_per_transfer: per(&both, &|s| s.answer_bytes as f64, &transfers),
    };

    let machine = Machine {
        cpu_model,
        cores,
        effective_cores: cpu_share(cores, 1.0).unwrap_or(cores as f64),
        cpu_share: BTreeMap::new(),
        build: if cfg!(debug_assertions) { "debug" } else { "optimized" }.to_string(),
    };
    let taken_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Calibration {
        format: CALIBRATION_FORMAT,
        machine,
        taken_at,
        setup: setup.clone(),
        miner,
        storage,
        client,
        messages: message_costs,
        traffic,
    })
}

/// A calibration with figures of the order this machine measured, for tests.
#[cfg(test)]
pub(crate) fn example() -> Calibration {
    Calibration {
        format: CALIBRATION_FORMAT,
        machine: Machine {
            cpu_model: "test CPU".to_string(),
            cores: 2,
            effective_cores: 1.9,
            cpu_share: BTreeMap::from([("0".to_string(), 0.9), ("0,1".to_string(), 1.9)]),
            build: "optimized".to_string(),
        },
        taken_at: 1,
        setup: CalibrationSetup::standard(),
        miner: MinerCosts {
            recover_us: 33.0,
            admit_us: 1.6,
            build_block_us: 400.0,
            build_us: 6.4,
            other_block_us: 0.0,
            other_us: 2.7,
            commit_block_us: 180.0,
        },
        storage: StorageCosts {
            apply_call_us: 33.0,
            apply_update_us: 2.2,
            log_append_fsync_us: 170.0,
            log_append_cpu_us: 76.0,
            witness_call_us: 4.8,
            witness_key_us: 2.3,
        },
        client: ClientCosts { verify_key_us: 3.6, preexec_us: 1.4, bag_us: 0.2 },
        messages: MessageCosts {
            encode_ns_per_byte: 0.16,
            decode_ns_per_byte: 0.64,
            keccak_ns_per_node: 470.0,
            inproc_call_us: 9.1,
            grpc_call_us: Some(50.0),
            grpc_ns_per_byte: Some(1.5),
        },
        traffic: Traffic {
            keys_per_transfer: 1.83,
            updates_per_transfer: 1.84,
            witness_calls_small: 16.0,
            witness_calls_large: 16.0,
            submission_bytes_per_transfer: 218.0,
            witness_bytes_per_key: 681.0,
            apply_bytes_per_update: 117.0,
            apply_bytes_per_call: 1057.0,
            answer_bytes_per_transfer: 40.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_round_trips_through_its_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration.json");
        let calibration = example();
        calibration.save(&path).unwrap();
        assert_eq!(Calibration::load(&path).unwrap(), calibration);
    }

    #[test]
    fn a_file_of_another_format_or_not_a_calibration_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration.json");
        let mut other = example();
        other.format = CALIBRATION_FORMAT + 1;
        other.save(&path).unwrap();
        let refused = Calibration::load(&path).unwrap_err();
        assert!(matches!(refused, CalibrationError::Format { found, .. } if found == CALIBRATION_FORMAT + 1));
        std::fs::write(&path, "{\"format\": 1}").unwrap();
        let refused = Calibration::load(&path).unwrap_err().to_string();
        assert!(refused.contains("calibration.json") && refused.contains("not a calibration"), "{refused}");
    }

    #[test]
    fn medians_and_lines_are_what_they_say() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(fit_line(100.0, 300.0, 400.0, 900.0), (100.0, 2.0));
        // A line tilted below zero by noise costs nothing per unit, never less.
        assert_eq!(fit_line(100.0, 300.0, 400.0, 200.0), (300.0, 0.0));
    }

    /// The rig drives every role's real core through whole blocks: a small calibration
    /// gives a finite, positive cost for every operation that has work to do.
    #[test]
    fn a_small_calibration_measures_every_operation() {
        let setup = CalibrationSetup {
            accounts: 400,
            shards: 16,
            storage_nodes: 4,
            retention: 2,
            compaction: 3,
            small_block: 8,
            large_block: 24,
            repetitions: 2,
        };
        let calibration = calibrate(&setup).unwrap();
        let miner = &calibration.miner;
        for (name, value) in [
            ("recover", miner.recover_us),
            ("admit", miner.admit_us),
            ("verify", calibration.client.verify_key_us),
            ("keccak", calibration.messages.keccak_ns_per_node),
            ("log append", calibration.storage.log_append_fsync_us),
        ] {
            assert!(value.is_finite() && value > 0.0, "{name}: {value}");
        }
        assert!(miner.build_us + miner.build_block_us > 0.0);
        assert!(calibration.traffic.keys_per_transfer > 1.0 && calibration.traffic.keys_per_transfer <= 2.0);
        assert!(calibration.traffic.submission_bytes_per_transfer > 100.0);
        assert_eq!(calibration.setup, setup);
    }
}
