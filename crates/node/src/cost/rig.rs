//! The calibration's rig: a small RainBlock network of real cores driven by hand, one event
//! at a time, on one thread (the storage nodes' and the miner's cores, and the client's own
//! checks: the witness verification, pre-execution and bagging that `client.rs` does). Every
//! block goes through the whole protocol (witnesses at the committed head, submission,
//! admission, building, `ApplyBlock` at every storage node, acknowledgement, store, answer)
//! and each step is timed by the process's CPU clock.

use crate::client::precheck::{check_transfer, touched_keys};
use crate::messages::{BlockId, Request, Response, Submission, WitnessRequest};
use crate::protocol::Rainblock;
use alloy_primitives::B256;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use virga_ledger::builder::build_block;
use virga_ledger::tx::{RecoveredTx, SignedTx};
use virga_net::role::{CallId, Command, Event, IoExecutor, Protocol, Role};
use virga_trie::account::Account;
use virga_trie::proof::NodeBag;

use crate::client::UserTransfer;
use crate::miner::{execution_pool, MinerCore, MinerIo, MinerIoDone};
use crate::storage::{log_options, open_core, NodeStorage, StorageCore, StorageIo};
use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::{sign_transfers, Mix};

use super::calibrate::{median, setup_error, step_error, CalibrationError, CalibrationSetup};

pub(super) fn micros(since: Instant) -> f64 {
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
pub(super) struct BlockSample {
    pub(super) transfers: usize,
    pub(super) keys: usize,
    pub(super) witness_calls: usize,
    pub(super) witness_us: f64,
    pub(super) witness_bytes: usize,
    pub(super) verify_us: f64,
    pub(super) preexec_us: f64,
    pub(super) bag_us: f64,
    pub(super) submission_bytes: usize,
    pub(super) recover_us: f64,
    pub(super) admit_us: f64,
    pub(super) build_us: f64,
    pub(super) step_us: f64,
    pub(super) apply_calls: usize,
    pub(super) apply_updates: usize,
    pub(super) apply_us: f64,
    pub(super) apply_bytes: usize,
    pub(super) commit_us: f64,
    pub(super) answer_bytes: usize,
    /// Encoded messages of the block, for the per-byte costs.
    pub(super) messages: Vec<Request>,
    pub(super) witness_nodes: Vec<Vec<u8>>,
}

/// A RainBlock network of real cores driven by hand on this thread.
pub(super) struct Rig {
    fixture: Fixture,
    nodes: Vec<(String, StorageCore)>,
    miner: MinerCore,
    /// The pool the miner's jobs run on, as its driver's device would.
    pool: std::sync::Arc<rayon::ThreadPool>,
    transfers: std::vec::IntoIter<UserTransfer>,
    compaction: usize,
    next_call: u64,
    clock: Stopwatch,
}

type MinerCommand = Command<Rainblock, MinerIo>;

impl Rig {
    pub(super) fn new(setup: &CalibrationSetup) -> Result<Rig, CalibrationError> {
        let topology = Topology {
            accounts: setup.accounts,
            shards: setup.shards,
            storage_nodes: setup.storage_nodes,
            replicas: 1,
            miners: 1,
            retention: setup.retention,
            max_block_transfers: setup.large_block.max(setup.small_block),
            top_budget_bytes: usize::MAX,
            ..Topology::small()
        };
        let fixture = Fixture::new(topology).map_err(setup_error)?;
        let mut nodes = Vec::new();
        for (id, _) in &fixture.layout {
            let served = fixture.served(id).ok_or_else(|| setup_error(format!("{id} serves nothing")))?;
            let opened = open_core(id.clone(), served, fixture.header.clone(), &fixture.sharded, NodeStorage::None)
                .map_err(setup_error)?;
            nodes.push((id.clone(), opened.core));
        }
        let config = fixture.miner_config(0);
        let pool = execution_pool(1).map_err(setup_error)?;
        let miner = MinerCore::new(config, fixture.header.clone()).map_err(setup_error)?;
        let blocks = setup.repetitions * 2 + 2;
        let count = blocks * setup.large_block.max(setup.small_block);
        let chain_id = fixture.config.exec.chain_id;
        let transfers = sign_transfers(&fixture.accounts, count, chain_id, Mix::default(), 11, &|_| {});
        let mut rig = Rig {
            fixture,
            nodes,
            miner,
            pool,
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
            return Err(setup_error(format!("the miner did not warm up: {reason}")));
        }
        Ok(rig)
    }

    /// Builds the blocks the miner handed out among `commands` at once, as its driver's
    /// thread would, and hands it each completion; returns the other commands.
    fn build_now(&mut self, mut commands: Vec<Command<Rainblock, MinerIo>>) -> Vec<Command<Rainblock, MinerIo>> {
        let mut rest = Vec::new();
        while !commands.is_empty() {
            let mut next = Vec::new();
            for command in commands {
                match command {
                    Command::Io { io, op: MinerIo::Build(job) } => {
                        let built = MinerIoDone::Built(Box::new(job.run(&self.pool)));
                        self.miner.step(2_000_000_000, Event::IoDone { io, result: built }, &mut next);
                    }
                    other => rest.push(other),
                }
            }
            commands = next;
        }
        rest
    }

    fn serve(&mut self, to: &str, request: Request) -> Response {
        let Some((_, node)) = self.nodes.iter_mut().find(|(id, _)| id == to) else {
            return crate::protocol::refusal(format!("no storage node {to}"));
        };
        let mut out: Vec<Command<Rainblock, StorageIo>> = Vec::new();
        node.step(0, Event::Request { from: "miner-0".into(), call: CallId(0), request }, &mut out);
        out.into_iter()
            .find_map(|command| match command {
                Command::Reply { response, .. } => Some(response),
                _ => None,
            })
            .unwrap_or_else(|| crate::protocol::refusal("the storage node did not answer"))
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
    #[allow(clippy::too_many_lines)] // Predates the lint: a debt, to split.
    pub(super) fn block(&mut self, count: usize) -> Result<BlockSample, CalibrationError> {
        let batch = self.batch(count);
        if batch.len() < count {
            return Err(setup_error("the rig ran out of signed transfers".to_string()));
        }
        let mut sample = BlockSample { transfers: batch.len(), ..BlockSample::default() };
        let (number, hash, root) = self.miner.head();

        // The client: witnesses at the head, one request per storage node.
        let mut keys: Vec<B256> = batch.iter().flat_map(|t| touched_keys(&t.tx, t.sender)).collect();
        keys.sort_unstable();
        keys.dedup();
        sample.keys = keys.len();
        let mut by_node: BTreeMap<usize, Vec<B256>> = BTreeMap::new();
        let prefix = crate::storage::prefix_nibbles(self.fixture.topology.shards).unwrap_or(0);
        for key in &keys {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).map_err(step_error("shard"))?;
            let node = self.fixture.layout.iter().position(|(_, shards)| shards.contains(&shard)).unwrap_or(0);
            by_node.entry(node).or_default().push(*key);
        }
        let mut replies = Vec::new();
        for (node, node_keys) in by_node {
            let witness = WitnessRequest {
                keys: node_keys,
                compaction: 0,
                at: Some(BlockId::new(number, hash)),
                ..Default::default()
            };
            let core = &mut self.nodes[node].1;
            let started = self.clock.start();
            let reply = core.witness(&witness).map_err(step_error("witness"))?;
            sample.witness_us += self.clock.micros(started);
            sample.witness_calls += 1;
            sample.witness_bytes += Rainblock::response_bytes(&Response::Witness(reply.clone()));
            replies.push(reply);
        }

        let mut values: HashMap<B256, Option<Vec<u8>>> = HashMap::new();
        let mut compact = Vec::new();
        let started = self.clock.start();
        for reply in replies {
            let bag = reply.bag;
            let (proven, _, compacted) = bag.verify_compact(root, self.compaction).map_err(step_error("verify"))?;
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
            let [sender_key, recipient_key] = touched_keys(&transfer.tx, transfer.sender);
            let load = |key: &B256, accounts: &HashMap<B256, Account>| -> Result<Account, CalibrationError> {
                if let Some(account) = accounts.get(key) {
                    return Ok(*account);
                }
                match values.get(key) {
                    Some(Some(bytes)) => Account::decode_rlp(bytes).map_err(step_error("pre-execution")),
                    Some(None) => Ok(Account::default()),
                    None => Err(step_error("pre-execution")(format!("account {key} not witnessed"))),
                }
            };
            let sender = load(&sender_key, &accounts)?;
            let recipient = load(&recipient_key, &accounts)?;
            if let Ok(effect) = check_transfer(&exec, &transfer.tx, transfer.sender, &sender, &recipient) {
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
            bag: bag.clone(),
            witness_at: BlockId::new(number, hash),
            witness_root: root,
            storage: Vec::new(),
            codes: Vec::new(),
        };
        sample.bag_us = self.clock.micros(started);
        let submit = Request::Submit(submission.clone());
        sample.submission_bytes = Rainblock::request_bytes(&submit);
        sample.messages.push(submit.clone());

        self.time_miner_parts(&submission, &bag, &mut sample)?;

        // The miner's step: recovery, admission, building, logical updates.
        let call = CallId(self.next_call);
        self.next_call += 1;
        let mut out = Vec::new();
        let started = self.clock.start();
        self.miner.step(2_000_000_000, Event::Request { from: "client-0".into(), call, request: submit }, &mut out);
        let out = self.build_now(out);
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
                        if let Request::ApplyBlock(updates) = &request {
                            sample.apply_calls += 1;
                            sample.apply_updates += updates.updates.len();
                            sample.apply_bytes += Rainblock::request_bytes(&request);
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
                        let stored = MinerIoDone::Stored(Ok(()));
                        self.miner.step(3_000_000_000, Event::IoDone { io, result: stored }, &mut next);
                        commit_us += self.clock.micros(started);
                    }
                    build @ Command::Io { op: MinerIo::Build(_), .. } => next.extend(self.build_now(vec![build])),
                    // The rig's one miner has no peers, so nothing announces a block to it.
                    Command::Io { op: MinerIo::Verify(_), .. } => {}
                    Command::Reply { response, .. } => {
                        sample.answer_bytes += Rainblock::response_bytes(&response);
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
            .filter_map(|response| match response {
                Response::Submitted(submitted) => Some(submitted.outcomes.iter().filter(|o| o.included).count()),
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
        let recovered: Vec<RecoveredTx> = submission
            .transactions
            .iter()
            .map(|bytes| {
                let tx = SignedTx::decode(bytes).map_err(step_error("recover"))?;
                RecoveredTx::recover(tx).map_err(step_error("recover"))
            })
            .collect::<Result<_, CalibrationError>>()?;
        sample.recover_us = self.clock.micros(started);

        let (parent, top) = self.miner.tip();
        let (parent, mut top) = (parent.clone(), top.clone());
        let started = self.clock.start();
        top.accounts.apply_bag(bag).map_err(step_error("admit"))?;
        sample.admit_us = self.clock.micros(started);

        let chain = self.fixture.config;
        let beneficiary = crate::cluster::beneficiary(0);
        let started = self.clock.start();
        let hashes = virga_ledger::exec::RecentHashes::default();
        build_block(&chain, &parent, &mut top, &hashes, recovered, beneficiary, 2, &self.pool)
            .map_err(step_error("build"))?;
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
pub(super) struct LogProbe {
    dir: std::path::PathBuf,
    disk: crate::storage::StorageDisk,
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl LogProbe {
    pub(super) fn new() -> Result<LogProbe, CalibrationError> {
        let dir = tempfile_dir()?;
        let storage: virga_core::device::SharedStorage = Arc::new(
            virga_core::device::FileStorage::create_dir_all(&dir)
                .map_err(|source| CalibrationError::Io { path: dir.display().to_string(), source })?,
        );
        let node = NodeStorage::on(storage, log_options()).map_err(setup_error)?;
        let fixture =
            Fixture::new(Topology { accounts: 2, storage_nodes: 4, ..Topology::small() }).map_err(setup_error)?;
        let served = fixture.served("storage-0").ok_or_else(|| setup_error("no storage-0".to_string()))?;
        let opened =
            open_core("storage-0", served, fixture.header.clone(), &fixture.sharded, node).map_err(setup_error)?;
        let disk = opened.disk.ok_or_else(|| setup_error("a logged node without a disk".to_string()))?;
        Ok(LogProbe { dir, disk, wall: Vec::new(), cpu: Vec::new() })
    }

    /// Appends `record` (with fsync) and keeps its wall-clock and CPU time.
    pub(super) fn append(&mut self, record: Vec<u8>) -> Result<(), CalibrationError> {
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
    pub(super) fn finish(self) -> (f64, f64) {
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
