//! In-block transaction schedulers: Fabric's arrival order and Fabric++'s reordering.
//!
//! A block is a list of transactions that were simulated in isolation against committed
//! state, each described by what it read and wrote ([`TxAccess`]). Fabric validates a block
//! in order: a transaction is invalid when it read a key that a valid transaction earlier in
//! the same block wrote, because its read is then outdated. [`schedule`] decides which
//! transactions of a block to keep and in which order to apply them:
//!
//! - [`Scheduler::Arrival`] is vanilla Fabric: the block's order as received; the
//!   transactions validation would reject are reported as [`AbortCause::ReadsEarlierWrite`].
//! - [`Scheduler::FabricPlusPlus`] is Fabric++ (Sharma et al., SIGMOD 2019): first the
//!   early aborts of the ordering phase (stale reads and version mismatches, when
//!   [`ScheduleConfig::early_abort`] is set), then the reordering of the thesis's
//!   Algorithm 1: build the writer → reader conflict graph, find its strongly connected
//!   components (Tarjan), enumerate their elementary cycles (Johnson), abort transactions in
//!   the most cycles until none is left, and order the survivors so every reader is applied
//!   before the writers of the keys it read.
//!
//! Both are pure functions of their input. Keys are interned in order of first appearance and
//! every loop runs in index order, so equal inputs give equal schedules.
//!
//! # Where this departs from the printed algorithm
//!
//! - **Building the graph.** Edges come from per-key lists of readers and writers rather
//!   than from AND-ing bit-vectors of every pair: the same edges, at a cost proportional to
//!   the (writer, reader) pairs that share a key instead of n² × keys.
//! - **Decrement loop.** The printed pseudo-code decrements the counts of every cycle's
//!   members after each removal; the prose (and the worked example) only decrement the
//!   members of the cycles that contained the removed transaction. This follows the prose.
//! - **Cycle budget.** Johnson's algorithm is output-sensitive and the number of elementary
//!   cycles is exponential in dense components: a hot key that hundreds of transactions both
//!   read and write makes a clique of 2-cycles. Each strongly connected component may yield
//!   at most [`ScheduleConfig::cycle_budget`] cycles per round. A component with more is
//!   broken by a cheaper rule instead: a greedy vertex cover of its 2-cycles when it has
//!   any, otherwise the one transaction in the most enumerated cycles. Its survivors are
//!   re-examined in the next round, until no cycle is left. A component with more edges
//!   than nodes plus the budget is known to have too many cycles (see
//!   [`ScheduleStats::budget_exhausted_sccs`]) and is not enumerated at all. When no
//!   component exceeds the budget there is one round, and it is exactly the thesis's
//!   steps 1-4.
//! - **Hot keys.** Before the graph is built, a key with at least [`HOT_KEY_CLIQUE`]
//!   read-modify-writers keeps only one of them (the budget fallback above would remove all
//!   but one anyway, after materialising the clique's quadratic number of edges; at Zipf
//!   2.0 SmallBank that is up to a million edges per block). The removed transactions are
//!   [`AbortCause::ConflictCycle`]s and are not put back by the re-add pass.
//! - **Re-add.** Greedy cycle breaking can remove more than needed. After it, each removed
//!   transaction, in index order, is put back when that leaves the kept graph acyclic.
//! - **Never worse than arrival order.** The greedy is not minimal (a minimum is NP-hard),
//!   so on some blocks the arrival order keeps more. Fabric++ then returns the arrival order
//!   of the transactions that early abort left (see [`schedule`] for why that comparison is
//!   the fair one), flagged in [`ScheduleStats::arrival_fallback`].

mod graph;

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;

use graph::{Cycles, Graph, Interned, Johnson, Rows, SubGraph, Tarjan};

/// A version of a key as Fabric records it: the block and the transaction in it that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Version {
    /// The block that committed the write.
    pub block: u64,
    /// The writing transaction's position in that block.
    pub tx: u32,
}

impl Version {
    /// The version written by transaction `tx` of block `block`.
    pub const fn new(block: u64, tx: u32) -> Version {
        Version { block, tx }
    }
}

/// What one transaction of a block read and wrote while it was simulated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxAccess<K> {
    /// Keys read (duplicates allowed).
    pub reads: Vec<K>,
    /// Keys written (duplicates allowed).
    pub writes: Vec<K>,
    /// Parallel to `reads`: the version each read saw, when known (for the early-abort
    /// rules). Empty when no version is known; entries past its end count as unknown.
    pub read_versions: Vec<Option<Version>>,
    /// The last block committed when the simulation started ("last-block-ID"), when known.
    pub snapshot: Option<u64>,
}

impl<K> TxAccess<K> {
    /// A transaction with these reads and writes and no version information.
    pub fn new(reads: Vec<K>, writes: Vec<K>) -> TxAccess<K> {
        TxAccess { reads, writes, read_versions: Vec::new(), snapshot: None }
    }

    /// The same transaction with the versions its reads saw and the block it simulated
    /// against.
    pub fn with_versions(mut self, read_versions: Vec<Option<Version>>, snapshot: Option<u64>) -> TxAccess<K> {
        self.read_versions = read_versions;
        self.snapshot = snapshot;
        self
    }

    fn read_version(&self, read: usize) -> Option<Version> {
        self.read_versions.get(read).copied().flatten()
    }
}

/// Which in-block scheduler to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scheduler {
    /// Vanilla Fabric: keep the order of arrival; validation rejects what it must.
    Arrival,
    /// Fabric++: early abort, then cycle breaking and reordering (Algorithm 1).
    #[cfg_attr(feature = "clap", value(name = "fabricpp", alias = "fabric++"))]
    FabricPlusPlus,
}

impl Scheduler {
    /// Both schedulers, in the order reports list them.
    pub const ALL: [Scheduler; 2] = [Scheduler::Arrival, Scheduler::FabricPlusPlus];

    /// Stable name: `arrival` or `fabricpp`.
    pub const fn name(self) -> &'static str {
        match self {
            Scheduler::Arrival => "arrival",
            Scheduler::FabricPlusPlus => "fabricpp",
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How [`schedule`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// Fabric++ only: abort stale reads and version mismatches before reordering. Arrival
    /// order models vanilla Fabric and ignores it. Default `true`.
    pub early_abort: bool,
    /// Fabric++ only: the most elementary cycles enumerated in one strongly connected
    /// component in one round before that component is broken by the fallback rule (see the
    /// module docs). Values below 1 count as 1. Default 1,000.
    pub cycle_budget: usize,
}

impl ScheduleConfig {
    /// The default configuration for `scheduler`.
    pub fn new(scheduler: Scheduler) -> ScheduleConfig {
        ScheduleConfig { scheduler, ..ScheduleConfig::default() }
    }
}

impl Default for ScheduleConfig {
    /// Fabric++ with early abort and a budget of 1,000 cycles.
    fn default() -> Self {
        ScheduleConfig { scheduler: Scheduler::FabricPlusPlus, early_abort: true, cycle_budget: 1_000 }
    }
}

/// Why a transaction of the block cannot commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum AbortCause {
    /// Early abort in simulation: read `read` (an index into `reads`) saw `version`, written
    /// by a block after the `snapshot` block the simulation started from.
    StaleRead {
        /// Index into the transaction's `reads`.
        read: usize,
        /// The version that read saw.
        version: Version,
        /// The last block committed when the simulation started.
        snapshot: u64,
    },
    /// Early abort in ordering: read `read` saw `version` of a key of which another
    /// transaction of the block read the newer `newer`.
    VersionMismatch {
        /// Index into the transaction's `reads`.
        read: usize,
        /// The version that read saw.
        version: Version,
        /// The newest version of the same key read in the block.
        newer: Version,
    },
    /// Fabric++ removed it to break conflict cycles.
    ConflictCycle,
    /// Arrival-order validation: it reads a key written by `writer` (an input index), a
    /// transaction kept earlier in the block.
    ReadsEarlierWrite {
        /// The first kept transaction that wrote a key this one read.
        writer: usize,
    },
}

impl AbortCause {
    /// Every cause's name, in the order reports list them.
    pub const NAMES: [&'static str; 4] = ["stale_read", "version_mismatch", "conflict_cycle", "reads_earlier_write"];

    /// Stable snake_case name, used in JSON.
    pub const fn name(&self) -> &'static str {
        match self {
            AbortCause::StaleRead { .. } => "stale_read",
            AbortCause::VersionMismatch { .. } => "version_mismatch",
            AbortCause::ConflictCycle => "conflict_cycle",
            AbortCause::ReadsEarlierWrite { .. } => "reads_earlier_write",
        }
    }

    /// Whether this is one of the early aborts (stale read or version mismatch).
    pub const fn is_early(&self) -> bool {
        matches!(self, AbortCause::StaleRead { .. } | AbortCause::VersionMismatch { .. })
    }
}

impl fmt::Display for AbortCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What scheduling one block cost and found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScheduleStats {
    /// Transactions in the block.
    pub txs: usize,
    /// Transactions kept.
    pub kept: usize,
    /// Aborted as [`AbortCause::StaleRead`].
    pub stale_reads: usize,
    /// Aborted as [`AbortCause::VersionMismatch`].
    pub version_mismatches: usize,
    /// Aborted as [`AbortCause::ConflictCycle`].
    pub conflict_cycles: usize,
    /// Aborted as [`AbortCause::ReadsEarlierWrite`].
    pub reads_earlier_write: usize,
    /// Fabric++: edges of the conflict graph of the transactions left after early abort.
    pub conflict_edges: usize,
    /// Fabric++: strongly connected components with more than one transaction, first round.
    pub nontrivial_sccs: usize,
    /// Fabric++: transactions in the largest strongly connected component, first round.
    pub largest_scc: usize,
    /// Fabric++: elementary cycles enumerated, all rounds.
    pub cycles: usize,
    /// Fabric++: transactions in the longest cycle enumerated.
    pub longest_cycle: usize,
    /// Fabric++: cycle-breaking rounds (1 unless some component exceeded the budget).
    pub rounds: usize,
    /// Fabric++: (round, component) pairs whose cycles exceeded the budget. A strongly
    /// connected component with E edges and N nodes has at least E − N + 1 elementary
    /// cycles, so one with E − N + 1 above the budget counts here without being enumerated.
    pub budget_exhausted_sccs: usize,
    /// Fabric++: rounds in which some component exceeded the budget.
    pub budget_exhausted_rounds: usize,
    /// Fabric++: transactions removed by cycle breaking and then put back.
    pub readded: usize,
    /// Fabric++: the arrival order kept more, so it was returned instead of the reordering.
    pub arrival_fallback: bool,
    /// Read-modify-writers of hot keys removed before the graph was built (see
    /// [`HOT_KEY_CLIQUE`]).
    pub hot_clique_removed: usize,
}

/// The result of scheduling one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Indices (into the input) of the kept transactions, in the order they must be applied.
    pub order: Vec<usize>,
    /// Every other input index with why it cannot commit, sorted by index.
    pub aborted: Vec<(usize, AbortCause)>,
    /// What the scheduler found and did.
    pub stats: ScheduleStats,
}

impl Schedule {
    /// Number of transactions kept.
    pub fn kept(&self) -> usize {
        self.order.len()
    }

    /// Aborts per cause, in [`AbortCause::NAMES`] order.
    pub fn aborts_by_cause(&self) -> [(&'static str, usize); 4] {
        let s = &self.stats;
        let counts = [s.stale_reads, s.version_mismatches, s.conflict_cycles, s.reads_earlier_write];
        std::array::from_fn(|i| (AbortCause::NAMES[i], counts[i]))
    }
}

/// Schedules one block.
///
/// With [`Scheduler::Arrival`] the order is the input order and a transaction is kept iff it
/// reads no key written by a transaction kept before it.
///
/// With [`Scheduler::FabricPlusPlus`]:
///
/// 1. Early abort (when `early_abort`): a transaction is a [`AbortCause::StaleRead`] when a
///    read saw a version from a block after its `snapshot`; then, among the others, a
///    [`AbortCause::VersionMismatch`] when a read saw an older version of a key than the
///    newest version of that key any of them read.
/// 2. Cycle breaking and ordering on the rest (the module docs list the departures from
///    the printed algorithm).
/// 3. If arrival-order validation of the transactions left after step 1, in input order,
///    keeps more than step 2, that arrival order is returned instead.
///
/// Why step 3 compares against the transactions left after early abort rather than the
/// whole block:
///
/// - A version-mismatch victim is doomed in any order: a newer version of the key it read
///   was already committed when another transaction of the block read it, so Fabric's
///   validation rejects it. A rejected transaction's writes are not applied, so it never
///   invalidates a later reader. As far as the block's own read versions show, vanilla
///   Fabric therefore keeps exactly what arrival order keeps on the block without the
///   victims, which is the count step 3 compares with. (Arrival order on the whole block
///   would count the victims as kept and let them invalidate their readers: a different,
///   and wrong, number, higher or lower.)
/// - A stale read is not always doomed: its own read saw the current version, and the
///   transaction fails validation only if another of its reads saw a version that the newer
///   block overwrote. The thesis aborts it anyway because its simulation overlapped a
///   commit; vanilla Fabric, which locks the state while simulating, never produces one.
///
/// So the guarantee is: Fabric++ keeps at least as many transactions as arrival order of
/// the transactions its early abort left, and, with `early_abort` off, at least as many as
/// [`Scheduler::Arrival`] on the same block.
pub fn schedule<K: Eq + Hash>(txs: &[TxAccess<K>], config: &ScheduleConfig) -> Schedule {
    let interned = Interned::new(txs);
    let mut stats = ScheduleStats { txs: txs.len(), ..ScheduleStats::default() };
    let mut aborted = Vec::new();
    let candidates: Vec<usize> = match config.scheduler {
        Scheduler::FabricPlusPlus if config.early_abort => early_abort(txs, &interned, &mut aborted),
        _ => (0..txs.len()).collect(),
    };
    let (order, rest) = match config.scheduler {
        Scheduler::Arrival => arrival(&interned, &candidates),
        Scheduler::FabricPlusPlus => {
            let (thinned, hot_removed) = thin_hot_cliques(&interned, &candidates);
            stats.hot_clique_removed = hot_removed.len();
            let (order, mut removed) = fabric_plus_plus(&interned, &thinned, config.cycle_budget.max(1), &mut stats);
            removed.extend(hot_removed);
            let (arrival_order, arrival_aborts) = arrival(&interned, &candidates);
            if arrival_order.len() > order.len() {
                stats.arrival_fallback = true;
                (arrival_order, arrival_aborts)
            } else {
                (order, removed.into_iter().map(|i| (i, AbortCause::ConflictCycle)).collect())
            }
        }
    };
    aborted.extend(rest);
    aborted.sort_unstable_by_key(|&(i, _)| i);
    stats.kept = order.len();
    for (_, cause) in &aborted {
        match cause {
            AbortCause::StaleRead { .. } => stats.stale_reads += 1,
            AbortCause::VersionMismatch { .. } => stats.version_mismatches += 1,
            AbortCause::ConflictCycle => stats.conflict_cycles += 1,
            AbortCause::ReadsEarlierWrite { .. } => stats.reads_earlier_write += 1,
        }
    }
    Schedule { order, aborted, stats }
}

/// Transactions that read and write the same key (read-modify-writes of it) form a clique
/// of 2-cycles, in which at most one transaction can survive any order. A clique this large
/// has far more elementary cycles than any budget, so cycle breaking would fall back to a
/// cover of its 2-cycles anyway, after materialising its quadratic number of edges.
pub const HOT_KEY_CLIQUE: usize = 64;

/// Keeps one read-modify-writer of every key that has at least [`HOT_KEY_CLIQUE`] of them
/// among `candidates`, before the conflict graph is built: one already kept for another hot
/// key if possible, else the one touching the fewest keys (the least likely to close other
/// cycles), ties to the latest. Keys are taken in id order,
/// so the result is deterministic. Returns the remaining candidates and the removed ones,
/// both ascending.
fn thin_hot_cliques(interned: &Interned, candidates: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let read_modify_writes = |i: usize| {
        let reads = interned.reads.row(i);
        interned.writes.row(i).iter().copied().filter(move |k| reads.contains(k))
    };
    let mut writers = vec![0usize; interned.keys];
    for &i in candidates {
        for k in read_modify_writes(i) {
            writers[k as usize] += 1;
        }
    }
    if writers.iter().all(|&count| count < HOT_KEY_CLIQUE) {
        return (candidates.to_vec(), Vec::new());
    }
    let mut removed = vec![false; interned.reads.len()];
    let mut kept_for_a_key = vec![false; interned.reads.len()];
    for (key, _) in writers.iter().enumerate().filter(|&(_, &count)| count >= HOT_KEY_CLIQUE) {
        let members: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| !removed[i] && read_modify_writes(i).any(|k| k as usize == key))
            .collect();
        let width = |i: usize| interned.reads.row(i).len() + interned.writes.row(i).len();
        // A member already kept for an earlier hot key is preferred: removing it would leave
        // that key without its one survivor.
        let rank = |i: usize| (!kept_for_a_key[i], width(i), std::cmp::Reverse(i));
        let Some(&keep) = members.iter().min_by_key(|&&i| rank(i)) else { continue };
        kept_for_a_key[keep] = true;
        for &i in &members {
            removed[i] = i != keep;
        }
    }
    candidates.iter().copied().partition(|&i| !removed[i])
}

/// The early aborts of Fabric++; returns the input indices that survive, ascending.
fn early_abort<K>(txs: &[TxAccess<K>], interned: &Interned, aborted: &mut Vec<(usize, AbortCause)>) -> Vec<usize> {
    let mut doomed = vec![false; txs.len()];
    for (i, tx) in txs.iter().enumerate() {
        let Some(snapshot) = tx.snapshot else { continue };
        let stale = (0..tx.reads.len()).find_map(|r| tx.read_version(r).filter(|v| v.block > snapshot).map(|v| (r, v)));
        if let Some((read, version)) = stale {
            doomed[i] = true;
            aborted.push((i, AbortCause::StaleRead { read, version, snapshot }));
        }
    }
    let mut newest: Vec<Option<Version>> = vec![None; interned.keys];
    for (i, tx) in txs.iter().enumerate().filter(|&(i, _)| !doomed[i]) {
        for (r, &k) in interned.reads.row(i).iter().enumerate() {
            if let Some(v) = tx.read_version(r) {
                let slot = &mut newest[k as usize];
                *slot = (*slot).max(Some(v));
            }
        }
    }
    let mut survivors = Vec::with_capacity(txs.len());
    for (i, tx) in txs.iter().enumerate() {
        if doomed[i] {
            continue;
        }
        let mismatch = interned.reads.row(i).iter().enumerate().find_map(|(r, &k)| {
            let version = tx.read_version(r)?;
            let newer = newest[k as usize].filter(|&n| n > version)?;
            Some(AbortCause::VersionMismatch { read: r, version, newer })
        });
        match mismatch {
            Some(cause) => aborted.push((i, cause)),
            None => survivors.push(i),
        }
    }
    survivors
}

/// Arrival-order validation of `candidates` (ascending): the kept ones in order, and the
/// others with the first kept transaction that wrote a key they read.
fn arrival(interned: &Interned, candidates: &[usize]) -> (Vec<usize>, Vec<(usize, AbortCause)>) {
    let mut first_writer = vec![usize::MAX; interned.keys];
    let mut kept = Vec::with_capacity(candidates.len());
    let mut aborted = Vec::new();
    for &i in candidates {
        let writer = interned.reads.row(i).iter().map(|&k| first_writer[k as usize]).min().filter(|&w| w != usize::MAX);
        if let Some(writer) = writer {
            aborted.push((i, AbortCause::ReadsEarlierWrite { writer }));
            continue;
        }
        kept.push(i);
        for &k in interned.writes.row(i) {
            if first_writer[k as usize] == usize::MAX {
                first_writer[k as usize] = i;
            }
        }
    }
    (kept, aborted)
}

/// Fabric++'s reordering of `candidates` (ascending input indices): the order to apply and
/// the input indices removed to break cycles (ascending).
fn fabric_plus_plus(
    interned: &Interned,
    candidates: &[usize],
    budget: usize,
    stats: &mut ScheduleStats,
) -> (Vec<usize>, Vec<usize>) {
    let graph = Graph::build(interned, candidates);
    stats.conflict_edges = graph.edges();
    let m = graph.len();
    let mut alive = vec![true; m];
    let mut removed = vec![false; m];
    // Only the survivors of components that exceeded the budget can still hold cycles
    // after a round, so later rounds look at those alone. Components are disjoint and a
    // removal only changes its own component's counts, so their order does not matter.
    let mut active = vec![true; m];
    let mut pos = vec![u32::MAX; m];
    let mut tarjan = Tarjan::default();
    let mut johnson = Johnson::default();
    let mut comps = Rows::default();
    let mut cycles = Cycles::default();
    loop {
        comps.clear();
        tarjan.run(&graph.out, &active, &mut comps);
        if comps.is_empty() {
            break;
        }
        stats.rounds += 1;
        if stats.rounds == 1 {
            stats.nontrivial_sccs = comps.len();
            stats.largest_scc = (0..comps.len()).map(|c| comps.row(c).len()).max().unwrap_or(0);
        }
        active.fill(false);
        let mut exhausted_round = false;
        for c in 0..comps.len() {
            let comp = comps.row(c);
            let sub = SubGraph::induced(&graph, comp, &mut pos);
            cycles.clear();
            let complete = sub.cycle_lower_bound() <= budget && johnson.enumerate(&sub, budget, &mut cycles);
            let mut enumerated = cycles.len();
            let take = if complete {
                graph::greedy_hitting_set(&cycles, sub.len())
            } else {
                exhausted_round = true;
                stats.budget_exhausted_sccs += 1;
                let partners = graph::two_cycle_partners(&graph, comp, &mut pos);
                let take = if partners.total() > 0 {
                    graph::greedy_two_cycle_cover(&partners)
                } else {
                    if cycles.is_empty() {
                        // Skipped by the lower bound: enumerate up to the budget now.
                        johnson.enumerate(&sub, budget, &mut cycles);
                        enumerated = cycles.len();
                    }
                    let counts = graph::cycle_counts(&cycles, sub.len());
                    graph::argmax(&counts).map(|v| v as u32).into_iter().collect()
                };
                for &v in comp {
                    active[v as usize] = true;
                }
                take
            };
            stats.cycles += enumerated;
            let longest = (0..cycles.len()).map(|c| cycles.row(c).len()).max().unwrap_or(0);
            stats.longest_cycle = stats.longest_cycle.max(longest);
            for p in take {
                let v = comp[p as usize] as usize;
                alive[v] = false;
                removed[v] = true;
                active[v] = false;
            }
        }
        if exhausted_round {
            stats.budget_exhausted_rounds += 1;
        }
    }
    // Put back what the greedy removed needlessly, in index order.
    let mut mark = vec![0u32; m];
    let mut stamp = 1u32;
    for v in 0..m {
        if removed[v] {
            if !graph::closes_cycle(&graph, &alive, v, &mut mark, stamp) {
                alive[v] = true;
                removed[v] = false;
                stats.readded += 1;
            }
            stamp += 2;
        }
    }
    let order = graph::thesis_order(&graph, &alive).into_iter().map(|v| candidates[v as usize]).collect();
    let removed = (0..m).filter(|&v| removed[v]).map(|v| candidates[v]).collect();
    (order, removed)
}

/// How many transactions of `order` Fabric's validation keeps when the block is applied in
/// that order: a transaction is invalid when it reads a key that a valid transaction before
/// it wrote. Indices past the end of `txs` count as invalid.
pub fn validate_in_order<K: Eq + Hash>(txs: &[TxAccess<K>], order: &[usize]) -> usize {
    let mut written: HashSet<&K> = HashSet::new();
    let mut valid = 0;
    for &i in order {
        let Some(tx) = txs.get(i) else { continue };
        if tx.reads.iter().any(|k| written.contains(k)) {
            continue;
        }
        valid += 1;
        written.extend(tx.writes.iter());
    }
    valid
}

/// Fabric++ batch cutting, criterion (d): how many leading transactions of `txs` go in the
/// next block, which ends before it would touch more than `max_unique_keys` distinct keys
/// (read or written) or hold more than `max_txs` transactions.
///
/// A block always takes at least one transaction when there is one (a `max_txs` of 0 counts
/// as 1, and a transaction that alone touches too many keys forms a block by itself), so a
/// cutter calling this in a loop always makes progress.
pub fn cut_batch<K: Eq + Hash>(txs: &[TxAccess<K>], max_txs: usize, max_unique_keys: usize) -> usize {
    let max_txs = max_txs.max(1);
    let mut seen: HashSet<&K> = HashSet::new();
    let mut fresh: HashSet<&K> = HashSet::new();
    for (i, tx) in txs.iter().enumerate() {
        if i == max_txs {
            return i;
        }
        fresh.clear();
        fresh.extend(tx.reads.iter().chain(&tx.writes).filter(|k| !seen.contains(*k)));
        if i > 0 && seen.len() + fresh.len() > max_unique_keys {
            return i;
        }
        seen.extend(fresh.drain());
    }
    txs.len()
}

/// The thesis's Micro-Benchmark 1: `n / 2` transactions that each write one key, then
/// `n - n / 2` that each read one (key `i` for the `i`-th of each half, so reader `i`
/// conflicts with writer `i`), the whole sequence rotated right by `shift`. Shift 0 puts
/// every write before its read (arrival order keeps only the writers); shift `n / 2` puts
/// every read first (no conflict).
pub fn interleaved_conflicts(n: usize, shift: usize) -> Vec<TxAccess<u64>> {
    let writers = n / 2;
    let mut txs: Vec<TxAccess<u64>> = (0..writers as u64)
        .map(|k| TxAccess::new(Vec::new(), vec![k]))
        .chain((0..(n - writers) as u64).map(|k| TxAccess::new(vec![k], Vec::new())))
        .collect();
    if n > 0 {
        txs.rotate_right(shift % n);
    }
    txs
}

/// The thesis's Micro-Benchmark 2: `n` transactions in groups of `t` that form conflict
/// cycles of length `t`: `T[r(k0), w(k0)], T[r(k0), w(k1)], T[r(k1), w(k2)], …,
/// T[r(k(t-2)), w(k0)]`, with fresh keys for every group. When `t` does not divide `n` the
/// last group is shorter; a `t` of 0 counts as 1.
pub fn cycles_of_length(n: usize, t: usize) -> Vec<TxAccess<u64>> {
    let t = t.max(1);
    let mut txs = Vec::with_capacity(n);
    let mut base = 0u64;
    while txs.len() < n {
        let len = t.min(n - txs.len());
        txs.push(TxAccess::new(vec![base], vec![base]));
        for i in 1..len as u64 {
            let write = if i == len as u64 - 1 { base } else { base + i };
            txs.push(TxAccess::new(vec![base + i - 1], vec![write]));
        }
        base += (len as u64 - 1).max(1);
    }
    txs
}

#[cfg(test)]
mod tests;
