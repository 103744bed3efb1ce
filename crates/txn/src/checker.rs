//! The history checker: builds the direct serialization graph of committed transactions
//! (Adya's write-write, write-read and read-write dependencies, with each key's versions
//! ordered by commit timestamp) and reports a cycle if there is one. A history is
//! serializable (for point reads and writes) exactly when the graph is acyclic.
//!
//! It takes nothing on trust from the engine except what a history naturally has: which
//! version each read returned (by writer) and each transaction's writes and commit timestamp.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;

use bytes::Bytes;
use parking_lot::Mutex;
use virga_core::hex;
use virga_storage::{Timestamp, TxnId};

/// Writer id of the versions present before the history started (the initial load).
pub const INITIAL_WRITER: TxnId = 0;

/// What one committed transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRecord {
    /// The transaction (never [`INITIAL_WRITER`]).
    pub id: TxnId,
    /// Its commit timestamp: orders its writes among each key's versions.
    pub commit_ts: Timestamp,
    /// Each key read and the writer of the version it returned ([`INITIAL_WRITER`] for the
    /// initial version or for a key that had none).
    pub reads: Vec<(Bytes, TxnId)>,
    /// Keys written (puts and deletes).
    pub writes: Vec<Bytes>,
}

/// Collects [`TxnRecord`]s from many threads.
#[derive(Debug, Default)]
pub struct HistoryRecorder {
    txns: Mutex<Vec<TxnRecord>>,
}

impl HistoryRecorder {
    /// An empty recorder.
    pub fn new() -> HistoryRecorder {
        HistoryRecorder::default()
    }

    /// Adds one committed transaction.
    pub fn record(&self, txn: TxnRecord) {
        self.txns.lock().push(txn);
    }

    /// The transactions recorded so far.
    pub fn snapshot(&self) -> Vec<TxnRecord> {
        self.txns.lock().clone()
    }

    /// Number of transactions recorded.
    pub fn len(&self) -> usize {
        self.txns.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Kind of a dependency edge `from -> to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// `to` overwrote `from`'s version.
    WriteWrite,
    /// `to` read `from`'s version.
    WriteRead,
    /// `from` read a version that `to` overwrote (an anti-dependency).
    ReadWrite,
}

/// One edge of a reported cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Source transaction.
    pub from: TxnId,
    /// Target transaction.
    pub to: TxnId,
    /// Why `to` must follow `from`.
    pub kind: Dependency,
    /// The key that causes it.
    pub key: Bytes,
}

/// What the checker found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The dependency graph has a cycle: no serial order explains the history.
    Cycle {
        /// The cycle's edges, each ending where the next starts.
        edges: Vec<Edge>,
    },
    /// A read returned a version written by no committed transaction (a dirty or
    /// invented read).
    UnknownWriter {
        /// The reader.
        reader: TxnId,
        /// The key.
        key: Bytes,
        /// The claimed writer.
        writer: TxnId,
    },
    /// Two transactions wrote one key at the same timestamp, so versions are unordered.
    DuplicateVersion {
        /// The key.
        key: Bytes,
        /// The timestamp.
        ts: Timestamp,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Cycle { edges } => {
                write!(f, "dependency cycle through {} transactions:", edges.len())?;
                for edge in edges {
                    write!(f, " T{} -{:?}[{}]-> T{};", edge.from, edge.kind, hex::encode(&edge.key), edge.to)?;
                }
                Ok(())
            }
            Violation::UnknownWriter { reader, key, writer } => {
                write!(f, "T{reader} read key {} from T{writer}, which never committed", hex::encode(key))
            }
            Violation::DuplicateVersion { key, ts } => {
                write!(f, "two versions of key {} at timestamp {ts}", hex::encode(key))
            }
        }
    }
}

/// Summary of an accepted history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Committed transactions checked.
    pub transactions: usize,
    /// Dependency edges found.
    pub edges: usize,
}

/// Checks a history: `Ok` with its size when serializable, otherwise the first violation.
pub fn check(txns: &[TxnRecord]) -> Result<CheckReport, Violation> {
    let index: HashMap<TxnId, usize> = txns.iter().enumerate().map(|(i, t)| (t.id, i)).collect();

    // Each key's committed writers in version (commit timestamp) order. Keys in order, so the
    // graph is built, and the violation reported, the same way on every check of a history (a
    // replayed seed must report what it reported the first time).
    let mut writers: BTreeMap<&Bytes, Vec<(Timestamp, TxnId)>> = BTreeMap::new();
    for txn in txns {
        for key in &txn.writes {
            writers.entry(key).or_default().push((txn.commit_ts, txn.id));
        }
    }
    for (key, versions) in writers.iter_mut() {
        versions.sort_unstable();
        if let Some(pair) = versions.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Violation::DuplicateVersion { key: (*key).clone(), ts: pair[0].0 });
        }
    }

    let mut adjacency: Vec<Vec<(usize, Dependency, Bytes)>> = vec![Vec::new(); txns.len()];
    let mut edges = 0;
    let mut add = |adjacency: &mut Vec<Vec<(usize, Dependency, Bytes)>>, from: TxnId, to: TxnId, kind, key: &Bytes| {
        if from == to || from == INITIAL_WRITER || to == INITIAL_WRITER {
            return;
        }
        if let (Some(&f), Some(&t)) = (index.get(&from), index.get(&to)) {
            adjacency[f].push((t, kind, key.clone()));
            edges += 1;
        }
    };
    for (key, versions) in &writers {
        for pair in versions.windows(2) {
            add(&mut adjacency, pair[0].1, pair[1].1, Dependency::WriteWrite, key);
        }
    }
    for txn in txns {
        for (key, writer) in &txn.reads {
            if *writer != INITIAL_WRITER && !index.contains_key(writer) {
                return Err(Violation::UnknownWriter { reader: txn.id, key: key.clone(), writer: *writer });
            }
            add(&mut adjacency, *writer, txn.id, Dependency::WriteRead, key);
            // The anti-dependency goes to the writer of the next version after the one read.
            let Some(versions) = writers.get(key) else { continue };
            let next = if *writer == INITIAL_WRITER {
                versions.first()
            } else {
                match versions.iter().position(|&(_, w)| w == *writer) {
                    Some(pos) => versions.get(pos + 1),
                    None => return Err(Violation::UnknownWriter { reader: txn.id, key: key.clone(), writer: *writer }),
                }
            };
            if let Some(&(_, next_writer)) = next {
                add(&mut adjacency, txn.id, next_writer, Dependency::ReadWrite, key);
            }
        }
    }

    if let Some(cycle) = find_cycle(&adjacency) {
        let edges = cycle
            .iter()
            .map(|&(from, to, kind, ref key)| Edge { from: txns[from].id, to: txns[to].id, kind, key: key.clone() })
            .collect();
        return Err(Violation::Cycle { edges });
    }
    Ok(CheckReport { transactions: txns.len(), edges })
}

type CycleEdge = (usize, usize, Dependency, Bytes);

/// Finds a cycle: strongly connected components (iterative Tarjan), then a shortest cycle
/// inside the first component with more than one node, by breadth-first search.
fn find_cycle(adjacency: &[Vec<(usize, Dependency, Bytes)>]) -> Option<Vec<CycleEdge>> {
    let component = strongly_connected(adjacency).into_iter().find(|c| c.len() > 1)?;
    let members: HashSet<usize> = component.iter().copied().collect();
    let start = component[0];
    // BFS from `start` back to `start` within the component.
    let mut parent: HashMap<usize, (usize, Dependency, Bytes)> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for (next, kind, key) in &adjacency[node] {
            if !members.contains(next) {
                continue;
            }
            if *next == start {
                let mut cycle = vec![(node, start, *kind, key.clone())];
                let mut at = node;
                while at != start {
                    let (prev, kind, key) = parent[&at].clone();
                    cycle.push((prev, at, kind, key));
                    at = prev;
                }
                cycle.reverse();
                return Some(cycle);
            }
            if !parent.contains_key(next) {
                parent.insert(*next, (node, *kind, key.clone()));
                queue.push_back(*next);
            }
        }
    }
    None
}

fn strongly_connected(adjacency: &[Vec<(usize, Dependency, Bytes)>]) -> Vec<Vec<usize>> {
    const UNVISITED: usize = usize::MAX;
    let n = adjacency.len();
    let mut order = vec![UNVISITED; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut counter = 0;
    for root in 0..n {
        if order[root] != UNVISITED {
            continue;
        }
        // Explicit call stack of (node, next edge index) so deep graphs cannot overflow.
        let mut calls = vec![(root, 0usize)];
        order[root] = counter;
        low[root] = counter;
        counter += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (node, ref mut edge)) = calls.last_mut() {
            if let Some((next, _, _)) = adjacency[node].get(*edge) {
                *edge += 1;
                let next = *next;
                if order[next] == UNVISITED {
                    order[next] = counter;
                    low[next] = counter;
                    counter += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    calls.push((next, 0));
                } else if on_stack[next] {
                    low[node] = low[node].min(order[next]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Bytes {
        Bytes::copy_from_slice(name.as_bytes())
    }

    fn txn(id: TxnId, ts: u64, reads: &[(&str, TxnId)], writes: &[&str]) -> TxnRecord {
        TxnRecord {
            id,
            commit_ts: Timestamp::new(ts, 0),
            reads: reads.iter().map(|(k, w)| (key(k), *w)).collect(),
            writes: writes.iter().map(|k| key(k)).collect(),
        }
    }

    #[test]
    fn a_serial_history_passes() {
        let history = [
            txn(1, 10, &[("x", 0)], &["x"]),
            txn(2, 20, &[("x", 1), ("y", 0)], &["y"]),
            txn(3, 30, &[("x", 1), ("y", 2)], &[]),
        ];
        let report = check(&history).unwrap();
        assert_eq!(report.transactions, 3);
        assert!(report.edges >= 3);
    }

    #[test]
    fn write_skew_is_a_cycle() {
        // Both read x and y at the initial version, each writes one of them.
        let history = [txn(1, 10, &[("x", 0), ("y", 0)], &["x"]), txn(2, 11, &[("x", 0), ("y", 0)], &["y"])];
        let Err(Violation::Cycle { edges }) = check(&history) else { panic!("write skew must be caught") };
        assert_eq!(edges.len(), 2);
        assert!(edges.iter().all(|e| e.kind == Dependency::ReadWrite));
        assert_eq!(edges[0].to, edges[1].from);
        assert_eq!(edges[1].to, edges[0].from);
    }

    #[test]
    fn lost_update_is_a_cycle() {
        let history = [txn(1, 10, &[("x", 0)], &["x"]), txn(2, 20, &[("x", 0)], &["x"])];
        let Err(Violation::Cycle { edges }) = check(&history) else { panic!("lost update must be caught") };
        let kinds: HashSet<_> = edges.iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&Dependency::ReadWrite));
    }

    #[test]
    fn a_read_only_transaction_seeing_half_of_a_commit_is_a_cycle() {
        // T1 writes x and y; T2 reads the new x but the old y.
        let history = [txn(1, 10, &[], &["x", "y"]), txn(2, 15, &[("x", 1), ("y", 0)], &[])];
        assert!(matches!(check(&history), Err(Violation::Cycle { .. })));
    }

    #[test]
    fn the_same_history_reports_the_same_cycle_every_time() {
        // Two transactions in a cycle through write-write edges on many keys and a read, so
        // the edges' order depends on the order keys are visited in.
        let keys: Vec<String> = (0..32).map(|i| format!("k{i:02}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let history = [txn(1, 10, &[("z", 2)], &keys), txn(2, 20, &[], &[&keys[..], &["z"]].concat())];
        let first = check(&history);
        assert!(matches!(first, Err(Violation::Cycle { .. })), "{first:?}");
        for _ in 0..50 {
            assert_eq!(check(&history), first);
        }
    }

    #[test]
    fn reading_an_uncommitted_writer_is_reported() {
        let history = [txn(2, 15, &[("x", 99)], &[])];
        assert!(matches!(check(&history), Err(Violation::UnknownWriter { writer: 99, .. })));
    }

    #[test]
    fn long_cycles_are_found_in_long_histories() {
        // A chain T1 -> T2 -> ... -> T500 through ww edges on distinct keys, closed by a read.
        let mut history: Vec<TxnRecord> = (1..=500)
            .map(|i| {
                let reads = if i > 1 { vec![(format!("k{}", i - 1), i - 1)] } else { vec![] };
                TxnRecord {
                    id: i,
                    commit_ts: Timestamp::new(i * 10, 0),
                    reads: reads.into_iter().map(|(k, w)| (key(&k), w)).collect(),
                    writes: vec![key(&format!("k{i}"))],
                }
            })
            .collect();
        assert!(check(&history).is_ok());
        // T1 also read T500's write: T500 -wr-> T1 closes the chain.
        history[0].reads.push((key("k500"), 500));
        let Err(Violation::Cycle { edges }) = check(&history) else { panic!() };
        assert_eq!(edges.len(), 500);
    }
}
