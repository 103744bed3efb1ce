//! A single-threaded reference engine for tests: the oracle the workloads are checked against.
//!
//! [`Oracle`] is a `BTreeMap`; an [`OracleTx`] reads through it, buffers writes, and
//! [`Oracle::apply`] installs them at commit. Transactions run one at a time, so there is no
//! concurrency control and nothing aborts on its own. An [`OracleTx`] opened read-only refuses
//! (and counts) writes, which is how tests catch a workload mislabelling a transaction.
//!
//! [`OracleBackend`] wraps an oracle as a [`KvBackend`] (one global lock, so every schedule is
//! serial) for tests of code that drives backends, such as the runner.
#![doc(hidden)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{Ack, KvBackend, KvSession, KvTx, KvWorkload, TxAbort};

/// A transaction's buffered writes: `None` is a delete.
pub type WriteSet = BTreeMap<Vec<u8>, Option<Bytes>>;

/// What a workload asked of an [`OracleTx`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxStats {
    /// `get` calls.
    pub gets: u64,
    /// `put` calls.
    pub puts: u64,
    /// `delete` calls.
    pub deletes: u64,
    /// `scan` calls.
    pub scans: u64,
    /// `put`/`delete` calls refused because the transaction is read-only.
    pub read_only_writes: u64,
}

/// Abort returned for a write attempted in a read-only transaction.
pub const WRITE_IN_READ_ONLY: TxAbort = TxAbort { reason: "write-in-read-only" };

/// The committed state.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    data: BTreeMap<Vec<u8>, Bytes>,
}

impl Oracle {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store holding `workload`'s initial data.
    pub fn loaded<W: KvWorkload>(workload: &W) -> Self {
        let mut oracle = Self::new();
        workload.load(&mut |k, v| oracle.insert(k, v));
        oracle
    }

    /// Stores `value` under `key` outside any transaction.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.data.insert(key.to_vec(), Bytes::copy_from_slice(value));
    }

    /// The committed value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.data.get(key)
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// All pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.data.iter().map(|(k, v)| (k.as_slice(), v.as_ref()))
    }

    /// Starts a transaction over the current state.
    pub fn begin(&self, read_only: bool) -> OracleTx<'_> {
        OracleTx { base: &self.data, writes: WriteSet::new(), read_only, stats: TxStats::default() }
    }

    /// Installs a committed transaction's writes.
    pub fn apply(&mut self, writes: WriteSet) {
        for (key, value) in writes {
            match value {
                Some(value) => self.data.insert(key, value),
                None => self.data.remove(&key),
            };
        }
    }

    /// Runs `txn` without committing, read-only iff the workload says so. Returns the outcome
    /// with the transaction's stats and write set.
    pub fn dry_run<W: KvWorkload>(&self, workload: &W, txn: &W::Txn) -> (Result<(), TxAbort>, TxStats, WriteSet) {
        let mut tx = self.begin(workload.is_read_only(txn));
        let result = workload.execute(txn, &mut tx);
        let stats = tx.stats();
        (result, stats, tx.into_writes())
    }

    /// Runs `txn` and commits it if it succeeds; returns its stats and write set.
    ///
    /// # Panics
    ///
    /// If a transaction the workload labels read-only tried to write: that is a workload bug
    /// which a real engine would turn into a wrong answer or a crash.
    pub fn execute<W: KvWorkload>(&mut self, workload: &W, txn: &W::Txn) -> Result<(TxStats, WriteSet), TxAbort> {
        let (result, stats, writes) = self.dry_run(workload, txn);
        assert_eq!(stats.read_only_writes, 0, "{}: a read-only transaction wrote", workload.name());
        result?;
        self.apply(writes.clone());
        Ok((stats, writes))
    }
}

/// One transaction over an [`Oracle`]: reads see the snapshot plus the transaction's own writes.
#[derive(Debug)]
pub struct OracleTx<'a> {
    base: &'a BTreeMap<Vec<u8>, Bytes>,
    writes: WriteSet,
    read_only: bool,
    stats: TxStats,
}

impl OracleTx<'_> {
    /// The writes buffered so far.
    pub fn writes(&self) -> &WriteSet {
        &self.writes
    }

    /// The buffered writes, to pass to [`Oracle::apply`].
    pub fn into_writes(self) -> WriteSet {
        self.writes
    }

    /// Calls made so far.
    pub fn stats(&self) -> TxStats {
        self.stats
    }

    fn check_writable(&mut self) -> Result<(), TxAbort> {
        if self.read_only {
            self.stats.read_only_writes += 1;
            return Err(WRITE_IN_READ_ONLY);
        }
        Ok(())
    }
}

impl KvTx for OracleTx<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        self.stats.gets += 1;
        Ok(match self.writes.get(key) {
            Some(own) => own.clone(),
            None => self.base.get(key).cloned(),
        })
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        self.check_writable()?;
        self.stats.puts += 1;
        self.writes.insert(key.to_vec(), Some(Bytes::copy_from_slice(value)));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort> {
        self.check_writable()?;
        self.stats.deletes += 1;
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        self.stats.scans += 1;
        let range = (Bound::Included(start), Bound::Unbounded);
        let mut base = self.base.range::<[u8], _>(range).peekable();
        let mut own = self.writes.range::<[u8], _>(range).peekable();
        let mut out = Vec::new();
        // Merge the two ordered streams; on equal keys the transaction's own write wins.
        while out.len() < limit {
            let take_own = match (base.peek(), own.peek()) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((b, _)), Some((o, _))) => o <= b,
            };
            if take_own {
                let (key, value) = own.next().expect("peeked");
                if base.peek().is_some_and(|(b, _)| *b == key) {
                    base.next();
                }
                if let Some(value) = value {
                    out.push((Bytes::copy_from_slice(key), value.clone()));
                }
            } else {
                let (key, value) = base.next().expect("peeked");
                out.push((Bytes::copy_from_slice(key), value.clone()));
            }
        }
        Ok(out)
    }
}

/// An [`Oracle`] behind one lock, usable wherever a [`KvBackend`] is expected.
#[derive(Clone, Debug, Default)]
pub struct OracleBackend {
    oracle: Arc<Mutex<Oracle>>,
}

impl OracleBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks the committed state, for inspection after a run.
    pub fn state(&self) -> MutexGuard<'_, Oracle> {
        lock(&self.oracle)
    }
}

fn lock(oracle: &Mutex<Oracle>) -> MutexGuard<'_, Oracle> {
    // A panicking test thread poisons the lock; the state is still consistent because writes
    // are applied only after the body returns.
    oracle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl KvBackend for OracleBackend {
    type Session = OracleSession;

    fn name(&self) -> String {
        "oracle".to_owned()
    }

    fn load(&self, pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        let mut oracle = lock(&self.oracle);
        for (key, value) in pairs {
            oracle.data.insert(key, Bytes::from(value));
        }
        Ok(())
    }

    fn session(&self, _client: usize) -> OracleSession {
        OracleSession { oracle: Arc::clone(&self.oracle) }
    }
}

/// A worker's handle on an [`OracleBackend`]; each transaction holds the global lock throughout.
#[derive(Debug)]
pub struct OracleSession {
    oracle: Arc<Mutex<Oracle>>,
}

impl KvSession for OracleSession {
    fn run(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort> {
        let mut oracle = lock(&self.oracle);
        let mut tx = oracle.begin(read_only);
        let result = body(&mut tx);
        if tx.stats.read_only_writes > 0 {
            return Err(WRITE_IN_READ_ONLY);
        }
        result?;
        let writes = tx.into_writes();
        oracle.apply(writes);
        Ok(Ack::Now)
    }

    fn durable_ticket(&self) -> u64 {
        0
    }
}

/// Replays each of `txns` drawn transactions twice on the same state and checks that both
/// runs read and write the same (a retry after an abort must redo the same work), then
/// applies the writes so later transactions see a changing state.
pub fn assert_retries_deterministic<W: KvWorkload>(workload: &W, client: usize, seed: u64, txns: usize) {
    let mut oracle = Oracle::loaded(workload);
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..txns {
        let txn = workload.next_txn(client, &mut rng);
        let first = oracle.dry_run(workload, &txn);
        assert_eq!(first, oracle.dry_run(workload, &txn), "a retry did different work");
        oracle.apply(first.2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_writes_and_scans_merge() {
        let mut oracle = Oracle::new();
        for k in [1u8, 3, 5, 7] {
            oracle.insert(&[k], &[k]);
        }
        let mut tx = oracle.begin(false);
        tx.put(&[3], b"x").unwrap();
        tx.put(&[4], b"y").unwrap();
        tx.delete(&[5]).unwrap();
        assert_eq!(tx.get(&[3]).unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(tx.get(&[5]).unwrap(), None);
        let scanned: Vec<Vec<u8>> = tx.scan(&[2], 10).unwrap().into_iter().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(scanned, vec![vec![3], vec![4], vec![7]]);
        assert_eq!(tx.scan(&[0], 2).unwrap().len(), 2);
        assert_eq!(tx.stats().puts, 2);
        let writes = tx.into_writes();
        // Nothing is visible before commit.
        assert_eq!(oracle.get(&[3]).map(|v| v.to_vec()), Some(vec![3]));
        oracle.apply(writes);
        let all: Vec<(Vec<u8>, Vec<u8>)> = oracle.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        assert_eq!(
            all,
            vec![(vec![1], vec![1]), (vec![3], b"x".to_vec()), (vec![4], b"y".to_vec()), (vec![7], vec![7])]
        );
    }

    #[test]
    fn read_only_refuses_writes() {
        let oracle = Oracle::new();
        let mut tx = oracle.begin(true);
        assert_eq!(tx.put(b"k", b"v"), Err(WRITE_IN_READ_ONLY));
        assert_eq!(tx.delete(b"k"), Err(WRITE_IN_READ_ONLY));
        assert_eq!(tx.stats().read_only_writes, 2);
        assert!(tx.writes().is_empty());
    }

    #[test]
    fn backend_commits_and_rolls_back() {
        let backend = OracleBackend::new();
        backend.load(&mut vec![(b"a".to_vec(), b"1".to_vec())].into_iter()).unwrap();
        let mut session = backend.session(0);
        let ack = session.run(false, &mut |tx| tx.put(b"b", b"2")).unwrap();
        assert_eq!(ack, Ack::Now);
        let abort = TxAbort { reason: "test" };
        assert_eq!(
            session.run(false, &mut |tx| {
                tx.put(b"c", b"3")?;
                Err(abort)
            }),
            Err(abort)
        );
        assert_eq!(session.run(true, &mut |tx| tx.put(b"d", b"4")), Err(WRITE_IN_READ_ONLY));
        assert_eq!(backend.state().len(), 2);
    }
}
