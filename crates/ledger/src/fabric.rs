//! Fabric's simulate–order–validate pipeline over a versioned key-value state, with the
//! in-block schedulers of [`virga_txn::schedule`] (vanilla arrival order, or Fabric++'s
//! reordering and early abort; seed 002 ch. 3).
//!
//! Every key carries the version `(block, transaction)` that last wrote it. A proposal is
//! simulated against committed state and records the version of every read; the orderer cuts
//! blocks and schedules them; validation keeps a transaction only if every version it read
//! is still current, and installs its writes at the transaction's own version.
//!
//! The pipeline overlaps, as Fabric's does: the proposals of block `b` are simulated while
//! block `b - 1` is validated. [`PipelineConfig::overlap`] says how many of them start before
//! that commit lands and [`PipelineConfig::straddle`] how many of those are still reading
//! when it does. Vanilla Fabric holds a lock on the whole state during simulation, so a
//! straddling proposal reads the old state and fails validation later. Fabric++ has per-key
//! versions instead: a straddler sees the new versions, notices they are newer than the block
//! it started from, and aborts at once (the early abort in the simulation phase).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use virga_txn::schedule::{schedule, AbortCause, Schedule, ScheduleConfig, Scheduler, TxAccess, Version};

/// Versions kept per key: enough for proposals simulated one block behind.
const VERSIONS_KEPT: usize = 4;

/// The world state of the pipeline: each key's recent values with the version that wrote them.
#[derive(Clone, Debug, Default)]
pub struct VersionedState {
    entries: HashMap<Vec<u8>, Vec<(Version, Vec<u8>)>>,
    committed_block: u64,
}

impl VersionedState {
    /// A state holding `pairs`, written by the genesis block (version `(0, 0)`).
    pub fn load(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Self {
        let genesis = Version { block: 0, tx: 0 };
        let entries = pairs.into_iter().map(|(key, value)| (key, vec![(genesis, value)])).collect();
        Self { entries, committed_block: 0 }
    }

    /// The last block whose writes are installed.
    pub fn committed_block(&self) -> u64 {
        self.committed_block
    }

    /// The value and version of `key` as of the end of block `block`.
    pub fn read_as_of(&self, key: &[u8], block: u64) -> Option<(&[u8], Version)> {
        let versions = self.entries.get(key)?;
        versions.iter().find(|(version, _)| version.block <= block).map(|(version, value)| (value.as_slice(), *version))
    }

    /// The newest version of `key`.
    pub fn current_version(&self, key: &[u8]) -> Option<Version> {
        self.entries.get(key).and_then(|versions| versions.first()).map(|(version, _)| *version)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the state holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn install(&mut self, key: &[u8], value: &[u8], version: Version) {
        let versions = self.entries.entry(key.to_vec()).or_default();
        versions.insert(0, (version, value.to_vec()));
        versions.truncate(VERSIONS_KEPT);
    }
}

/// A proposal being simulated: reads see the state as of one block (or the newest state) and
/// the proposal's own writes.
pub struct Simulation<'a> {
    state: &'a VersionedState,
    /// `None` reads the newest versions (Fabric++'s per-key concurrency control).
    as_of: Option<u64>,
    reads: Vec<(Vec<u8>, Option<Version>)>,
    writes: Vec<(Vec<u8>, Vec<u8>)>,
}

impl<'a> Simulation<'a> {
    fn new(state: &'a VersionedState, as_of: Option<u64>) -> Self {
        Self { state, as_of, reads: Vec::new(), writes: Vec::new() }
    }

    /// Reads `key`: the proposal's own write if any, else committed state (recording the
    /// version read).
    pub fn get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        if let Some((_, value)) = self.writes.iter().rev().find(|(written, _)| written == key) {
            return Some(value.clone());
        }
        let found = match self.as_of {
            Some(block) => self.state.read_as_of(key, block),
            None => self.state.read_as_of(key, u64::MAX),
        };
        if !self.reads.iter().any(|(read, _)| read == key) {
            self.reads.push((key.to_vec(), found.map(|(_, version)| version)));
        }
        found.map(|(value, _)| value.to_vec())
    }

    /// Buffers a write.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        match self.writes.iter_mut().find(|(written, _)| written == key) {
            Some(slot) => slot.1 = value.to_vec(),
            None => self.writes.push((key.to_vec(), value.to_vec())),
        }
    }

    fn finish(self, snapshot: u64) -> Proposal {
        let (reads, read_versions) = self.reads.into_iter().unzip();
        Proposal { reads, read_versions, writes: self.writes, snapshot }
    }
}

/// A simulated transaction: its read set with versions and its write set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub reads: Vec<Vec<u8>>,
    pub read_versions: Vec<Option<Version>>,
    pub writes: Vec<(Vec<u8>, Vec<u8>)>,
    /// The last committed block when the simulation started.
    pub snapshot: u64,
}

impl Proposal {
    /// Whether a read saw a version newer than the simulation's starting block.
    pub fn read_newer_than_snapshot(&self) -> bool {
        self.read_versions.iter().flatten().any(|version| version.block > self.snapshot)
    }

    /// The proposal as the scheduler sees it.
    pub fn access(&self) -> TxAccess<&[u8]> {
        TxAccess {
            reads: self.reads.iter().map(Vec::as_slice).collect(),
            writes: self.writes.iter().map(|(key, _)| key.as_slice()).collect(),
            read_versions: self.read_versions.clone(),
            snapshot: Some(self.snapshot),
        }
    }
}

/// Validates `order`'s proposals one after another and installs the writes of the valid ones
/// at version `(block, position)`. Returns how many were valid.
pub fn validate_and_commit(state: &mut VersionedState, block: u64, proposals: &[Proposal], order: &[usize]) -> usize {
    let mut valid = 0;
    for &index in order {
        let Some(proposal) = proposals.get(index) else { continue };
        let current = proposal
            .reads
            .iter()
            .zip(&proposal.read_versions)
            .all(|(key, version)| state.current_version(key) == *version);
        if !current {
            continue;
        }
        let version = Version { block, tx: u32::try_from(index).unwrap_or(u32::MAX) };
        for (key, value) in &proposal.writes {
            state.install(key, value, version);
        }
        valid += 1;
    }
    state.committed_block = block;
    valid
}

/// How the pipeline cuts, orders and overlaps blocks.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub schedule: ScheduleConfig,
    /// Proposals per block (criterion a).
    pub block_size: usize,
    /// Distinct keys per block (Fabric++'s criterion d).
    pub max_unique_keys: usize,
    /// Proposals of a block simulated before the previous block commits.
    pub overlap: usize,
    /// Of those, how many are still reading when the commit lands.
    pub straddle: usize,
}

impl PipelineConfig {
    /// Fabric's settings from the thesis (Table 3.6): 1,024 transactions or 16,384 keys per
    /// block; half of a block's proposals overlap the previous commit, 16 of them straddle it.
    pub fn thesis(scheduler: Scheduler) -> Self {
        let schedule = ScheduleConfig { scheduler, ..ScheduleConfig::default() };
        Self { schedule, block_size: 1024, max_unique_keys: 16_384, overlap: 512, straddle: 16 }
    }
}

/// What happened to one block's proposals, reported when the block commits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockReport {
    pub number: u64,
    /// Proposals in the block.
    pub transactions: usize,
    /// Proposals aborted in simulation before reaching the block.
    pub aborted_in_simulation: usize,
    /// Proposals the orderer aborted, by [`AbortCause::name`].
    pub aborted_in_orderer: Vec<(&'static str, usize)>,
    /// Proposals that failed validation.
    pub invalid: usize,
    pub committed: usize,
    /// Time the scheduler took for this block.
    pub schedule_time: Duration,
}

struct OrderedBlock {
    number: u64,
    proposals: Vec<Proposal>,
    schedule: Schedule,
    aborted_in_simulation: usize,
    schedule_time: Duration,
}

/// The pipeline: a state, the block awaiting validation, and proposals cut over to the next
/// block.
pub struct Pipeline {
    state: VersionedState,
    config: PipelineConfig,
    pending: Option<OrderedBlock>,
    carried: Vec<Proposal>,
    next_block: u64,
}

impl Pipeline {
    pub fn new(state: VersionedState, config: PipelineConfig) -> Self {
        let next_block = state.committed_block() + 1;
        Self { state, config, pending: None, carried: Vec::new(), next_block }
    }

    pub fn state(&self) -> &VersionedState {
        &self.state
    }

    fn fine_grained(&self) -> bool {
        self.config.schedule.scheduler == Scheduler::FabricPlusPlus && self.config.schedule.early_abort
    }

    /// Simulates and orders the next block, drawing proposals from `simulate`, and commits
    /// the previous block on the way. Returns the report of the block that committed.
    pub fn step(&mut self, simulate: &mut dyn FnMut(&mut Simulation<'_>)) -> Option<BlockReport> {
        let number = self.next_block;
        let commit_point = self.config.overlap.saturating_sub(self.config.straddle);
        let mut report = None;
        let mut proposals = std::mem::take(&mut self.carried);
        let mut keys: HashSet<Vec<u8>> = HashSet::new();
        for proposal in &proposals {
            keys.extend(proposal.reads.iter().cloned());
            keys.extend(proposal.writes.iter().map(|(key, _)| key.clone()));
        }
        let mut aborted_in_simulation = 0;
        let mut started = 0usize;
        let block_size = self.config.block_size.max(1);
        while proposals.len() < block_size {
            if started == commit_point {
                report = report.or_else(|| self.commit_pending());
            }
            let before_commit = self.state.committed_block();
            let (as_of, snapshot) = if self.pending.is_some() || report.is_none() {
                // The previous block has not landed (or there was none to land during this
                // step): everyone reads the committed state.
                (Some(before_commit), before_commit)
            } else if started < self.config.overlap {
                // Started before the commit landed, still reading after it.
                let snapshot = before_commit.saturating_sub(1).max(number.saturating_sub(2));
                if self.fine_grained() {
                    (None, snapshot)
                } else {
                    (Some(snapshot), snapshot)
                }
            } else {
                (Some(before_commit), before_commit)
            };
            let mut simulation = Simulation::new(&self.state, as_of);
            simulate(&mut simulation);
            let proposal = simulation.finish(snapshot);
            started += 1;
            if self.fine_grained() && proposal.read_newer_than_snapshot() {
                aborted_in_simulation += 1;
                continue;
            }
            // A key read and written counts once, as in `schedule::cut_batch`.
            let new_keys: HashSet<&[u8]> = proposal
                .reads
                .iter()
                .chain(proposal.writes.iter().map(|(key, _)| key))
                .map(Vec::as_slice)
                .filter(|key| !keys.contains(*key))
                .collect();
            let new_keys = new_keys.len();
            if !proposals.is_empty() && keys.len() + new_keys > self.config.max_unique_keys {
                self.carried.push(proposal);
                break;
            }
            keys.extend(proposal.reads.iter().cloned());
            keys.extend(proposal.writes.iter().map(|(key, _)| key.clone()));
            proposals.push(proposal);
        }
        report = report.or_else(|| self.commit_pending());
        let started_at = Instant::now();
        let accesses: Vec<TxAccess<&[u8]>> = proposals.iter().map(Proposal::access).collect();
        let schedule = schedule(&accesses, &self.config.schedule);
        let schedule_time = started_at.elapsed();
        drop(accesses);
        self.pending = Some(OrderedBlock { number, proposals, schedule, aborted_in_simulation, schedule_time });
        self.next_block += 1;
        report
    }

    /// Validates and commits the block awaiting validation, if any.
    pub fn finish(&mut self) -> Option<BlockReport> {
        self.commit_pending()
    }

    fn commit_pending(&mut self) -> Option<BlockReport> {
        let block = self.pending.take()?;
        // Vanilla Fabric validates every transaction of the block in arrival order; Fabric++
        // only those its orderer kept, in the orderer's order.
        let order: Vec<usize> = match self.config.schedule.scheduler {
            Scheduler::Arrival => (0..block.proposals.len()).collect(),
            Scheduler::FabricPlusPlus => block.schedule.order.clone(),
        };
        let aborted_in_orderer = match self.config.schedule.scheduler {
            Scheduler::Arrival => Vec::new(),
            Scheduler::FabricPlusPlus => count_causes(&block.schedule.aborted),
        };
        let committed = validate_and_commit(&mut self.state, block.number, &block.proposals, &order);
        Some(BlockReport {
            number: block.number,
            transactions: block.proposals.len(),
            aborted_in_simulation: block.aborted_in_simulation,
            aborted_in_orderer,
            invalid: order.len() - committed,
            committed,
            schedule_time: block.schedule_time,
        })
    }
}

fn count_causes(aborted: &[(usize, AbortCause)]) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for (_, cause) in aborted {
        match counts.iter_mut().find(|(name, _)| *name == cause.name()) {
            Some(entry) => entry.1 += 1,
            None => counts.push((cause.name(), 1)),
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter_state(keys: u8) -> VersionedState {
        VersionedState::load((0..keys).map(|key| (vec![key], 0u64.to_le_bytes().to_vec())))
    }

    fn read_u64(simulation: &mut Simulation<'_>, key: u8) -> u64 {
        simulation.get(&[key]).and_then(|bytes| bytes.try_into().ok()).map_or(0, u64::from_le_bytes)
    }

    /// Proposals that each read a hot key and write it (increment) or only read it.
    fn hot_key_stream() -> impl FnMut(&mut Simulation<'_>) {
        let mut serial = 0u64;
        move |simulation| {
            serial += 1;
            let value = read_u64(simulation, 0);
            if serial % 4 == 0 {
                simulation.put(&[0], &(value + 1).to_le_bytes());
            } else {
                let other = (serial % 7) as u8 + 1;
                let _ = read_u64(simulation, other);
            }
        }
    }

    fn run(scheduler: Scheduler, blocks: usize) -> (Vec<BlockReport>, VersionedState) {
        let config = PipelineConfig { block_size: 32, overlap: 16, straddle: 4, ..PipelineConfig::thesis(scheduler) };
        let mut pipeline = Pipeline::new(counter_state(8), config);
        let mut stream = hot_key_stream();
        let mut reports = Vec::new();
        for _ in 0..blocks {
            reports.extend(pipeline.step(&mut stream));
        }
        reports.extend(pipeline.finish());
        (reports, pipeline.state)
    }

    #[test]
    fn fabric_plus_plus_commits_more_than_arrival_order() {
        let (arrival, arrival_state) = run(Scheduler::Arrival, 10);
        let (reordered, reordered_state) = run(Scheduler::FabricPlusPlus, 10);
        assert_eq!(arrival.len(), 10);
        assert_eq!(reordered.len(), 10);
        let committed = |reports: &[BlockReport]| reports.iter().map(|r| r.committed).sum::<usize>();
        assert!(committed(&reordered) > committed(&arrival), "{reordered:?} vs {arrival:?}");
        // Each committed increment raised the counter by exactly one: no lost update.
        let increments = |state: &VersionedState| {
            state.read_as_of(&[0], u64::MAX).map(|(value, _)| u64::from_le_bytes(value.try_into().unwrap_or([0; 8])))
        };
        assert!(increments(&arrival_state) <= Some(10));
        assert!(increments(&reordered_state) <= Some(10));
        assert!(reordered.iter().any(|r| r.aborted_in_simulation > 0), "straddlers of a hot key abort early");
    }

    #[test]
    fn validation_rejects_stale_reads_and_installs_versions() {
        let mut state = counter_state(2);
        let proposal = |read_version: Version| Proposal {
            reads: vec![vec![0]],
            read_versions: vec![Some(read_version)],
            writes: vec![(vec![1], vec![7])],
            snapshot: 0,
        };
        let fresh = proposal(Version { block: 0, tx: 0 });
        let stale = proposal(Version { block: 0, tx: 9 });
        assert_eq!(validate_and_commit(&mut state, 1, &[fresh, stale], &[1, 0]), 1);
        assert_eq!(state.read_as_of(&[1], 1), Some((&[7u8][..], Version { block: 1, tx: 0 })));
        assert_eq!(state.read_as_of(&[1], 0).map(|(_, version)| version), Some(Version { block: 0, tx: 0 }));
        assert_eq!(state.committed_block(), 1);
    }

    #[test]
    fn simulation_reads_its_own_writes_and_records_first_read_version() {
        let state = counter_state(1);
        let mut simulation = Simulation::new(&state, Some(0));
        assert_eq!(simulation.get(&[0]), Some(0u64.to_le_bytes().to_vec()));
        simulation.put(&[0], &[5]);
        assert_eq!(simulation.get(&[0]), Some(vec![5]));
        assert_eq!(simulation.get(&[9]), None);
        let proposal = simulation.finish(0);
        assert_eq!(proposal.reads, vec![vec![0], vec![9]]);
        assert_eq!(proposal.read_versions, vec![Some(Version { block: 0, tx: 0 }), None]);
        assert!(!proposal.read_newer_than_snapshot());
    }
}
