//! Transactional key-value workloads and the interface every engine under test implements.
//!
//! A workload ([`KvWorkload`]) only knows how to load its initial data, draw its next
//! transaction, and run that transaction's reads and writes against a [`KvTx`]. Engines
//! (Virga's, RocksDB's) implement [`KvBackend`]; the runner retries aborted transactions and
//! counts commits, aborts and latencies the same way for all of them.

use bytes::Bytes;
use rand::rngs::SmallRng;

/// Why a transaction could not commit. `reason` is a short, stable name (for example
/// `"read-stale"` or `"lock-conflict"`) so that reasons can be counted across engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxAbort {
    /// Stable name of the cause.
    pub reason: &'static str,
}

/// The operations a workload may perform inside one transaction.
pub trait KvTx {
    /// Reads a key as of the transaction's snapshot (or its own earlier write).
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort>;
    /// Buffers a write.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort>;
    /// Buffers a delete.
    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort>;
    /// Up to `limit` live pairs with `key >= start`, in key order.
    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort>;
}

/// A transaction mix over a key space.
pub trait KvWorkload: Send + Sync {
    /// One generated transaction (its type and parameters), replayed unchanged on retry.
    type Txn: Send;

    /// Name as given on the command line (`ycsb-a`, `smallbank`, ...).
    fn name(&self) -> &str;
    /// Feeds every initial key-value pair to `sink`, in any order.
    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8]));
    /// Draws the next transaction. `client` is the worker drawing it (some mixes keep
    /// per-client state such as Retwis's next post id).
    fn next_txn(&self, client: usize, rng: &mut SmallRng) -> Self::Txn;
    /// Whether `txn` never writes, so engines may run it as a read-only transaction.
    fn is_read_only(&self, txn: &Self::Txn) -> bool;
    /// Performs `txn`'s reads and writes. A business-rule failure (for example too little
    /// money) is not an abort: the transaction commits without writing.
    fn execute(&self, txn: &Self::Txn, tx: &mut dyn KvTx) -> Result<(), TxAbort>;
}

/// How a committed transaction becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// Acknowledged at once: durable already, or durability is off.
    Now,
    /// Acknowledged once [`KvSession::durable_ticket`] reaches this ticket.
    After(u64),
}

/// An engine under test, shared by all worker threads.
pub trait KvBackend: Send + Sync {
    /// One worker's connection to the engine.
    type Session: KvSession;

    /// Name for reports (`virga-occ-clock`, `rocksdb-optimistic`, ...).
    fn name(&self) -> String;
    /// Stores the initial data, durably when the engine is durable, before any session runs.
    fn load(&self, pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> anyhow::Result<()>;
    /// Opens the session of worker `client` (0-based, distinct per thread).
    fn session(&self, client: usize) -> Self::Session;
}

/// One worker's transactions against a [`KvBackend`].
pub trait KvSession: Send {
    /// Runs `body` in a new transaction and commits it. `read_only` transactions never
    /// write. On `Err` the transaction was aborted and left no effect.
    fn run(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort>;
    /// Every commit whose [`Ack::After`] ticket is at most this value is durable.
    fn durable_ticket(&self) -> u64;
}

#[cfg(feature = "rocksdb")]
pub mod rocksdb;

pub mod retwis;
pub mod runner;
pub mod smallbank;
pub mod testing;
pub mod transfer;
pub mod virga;
pub mod ycsb;
pub mod ycsb_t;
pub mod zipf;

/// Command-line names of the workloads in [`ycsb`], [`smallbank`], [`retwis`] and [`transfer`].
pub fn workload_names() -> &'static [&'static str] {
    &["ycsb-a", "ycsb-b", "ycsb-c", "ycsb-d", "ycsb-e", "ycsb-f", "smallbank", "retwis", "transfer"]
}
