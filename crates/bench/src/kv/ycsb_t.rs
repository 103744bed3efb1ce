//! Transactional YCSB ("ycsb-t", as MILANA's evaluation runs it): every transaction touches
//! 4 keys of 16 bytes; 90% are read-only (4 reads, keys drawn with Zipf 0.99), the rest
//! read-modify-write their 4 keys (drawn with Zipf 0.75). The same generated transactions
//! run on the single-node engine (through [`KvWorkload`]) and on the distributed store.

use anyhow::{ensure, Result};
use rand::rngs::SmallRng;
use rand::Rng;

use super::zipf::Zipf;
use super::{KvTx, KvWorkload, TxAbort};

/// ycsb-t's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct YcsbTConfig {
    /// Records loaded before the run.
    pub records: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys per transaction.
    pub keys_per_txn: usize,
    /// Percent of transactions that only read.
    pub read_only_percent: u32,
    /// Zipf exponents of the read-only and of the read-write transactions' keys.
    pub read_zipf: f64,
    pub write_zipf: f64,
    /// Read-write transactions put without reading first (SEMEL's puts); otherwise they
    /// read-modify-write.
    pub blind_writes: bool,
}

impl Default for YcsbTConfig {
    fn default() -> Self {
        YcsbTConfig {
            records: 100_000,
            value_size: 100,
            keys_per_txn: 4,
            read_only_percent: 90,
            read_zipf: 0.99,
            write_zipf: 0.75,
            blind_writes: false,
        }
    }
}

/// One generated transaction: its distinct record ids, and whether it writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YcsbTTxn {
    pub ids: Vec<u64>,
    pub writes: bool,
    /// Seeds the bytes written.
    pub seed: u64,
}

pub struct YcsbT {
    config: YcsbTConfig,
    reads: Zipf,
    writes: Zipf,
}

/// The 16-byte key of record `id`: `user` and 12 decimal digits.
pub fn key(id: u64) -> Vec<u8> {
    format!("user{id:012}").into_bytes()
}

/// A value of `size` bytes derived from `seed`.
pub fn value(seed: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    let mut state = seed | 1;
    while out.len() < size {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(size);
    out
}

impl YcsbT {
    pub fn new(config: YcsbTConfig) -> Result<YcsbT> {
        ensure!(config.records >= config.keys_per_txn as u64, "ycsb-t: fewer records than keys per transaction");
        ensure!((1..=64).contains(&config.keys_per_txn), "ycsb-t: 1 to 64 keys per transaction");
        ensure!((1..=1 << 20).contains(&config.value_size), "ycsb-t: values of 1 byte to 1 MiB");
        ensure!(config.read_only_percent <= 100, "ycsb-t: a percentage is at most 100");
        let reads = Zipf::scrambled(config.records, config.read_zipf)?;
        let writes = Zipf::scrambled(config.records, config.write_zipf)?;
        Ok(YcsbT { config, reads, writes })
    }

    pub fn config(&self) -> &YcsbTConfig {
        &self.config
    }

    /// The `count` keys read-only transactions draw most often (KAIROS's top-k cacheable
    /// set, fixed before the run from the workload's popularity).
    pub fn hottest(&self, count: u64) -> Vec<u64> {
        (0..count.min(self.config.records)).map(|rank| self.reads.item_of_rank(rank)).collect()
    }

    /// Draws a transaction: distinct keys, read-only or read-modify-write.
    pub fn draw(&self, rng: &mut SmallRng) -> YcsbTTxn {
        let writes = rng.random_range(0..100) >= self.config.read_only_percent;
        let zipf = if writes { &self.writes } else { &self.reads };
        let mut ids = Vec::with_capacity(self.config.keys_per_txn);
        while ids.len() < self.config.keys_per_txn {
            let id = zipf.sample(rng);
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        YcsbTTxn { ids, writes, seed: rng.random() }
    }
}

impl KvWorkload for YcsbT {
    type Txn = YcsbTTxn;

    fn name(&self) -> &str {
        "ycsb-t"
    }

    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        for id in 0..self.config.records {
            sink(&key(id), &value(id, self.config.value_size));
        }
    }

    fn next_txn(&self, _client: usize, rng: &mut SmallRng) -> YcsbTTxn {
        self.draw(rng)
    }

    fn is_read_only(&self, txn: &YcsbTTxn) -> bool {
        !txn.writes
    }

    fn execute(&self, txn: &YcsbTTxn, tx: &mut dyn KvTx) -> Result<(), TxAbort> {
        if !(txn.writes && self.config.blind_writes) {
            for id in &txn.ids {
                tx.get(&key(*id))?;
            }
        }
        if txn.writes {
            for (position, id) in txn.ids.iter().enumerate() {
                tx.put(&key(*id), &value(txn.seed.wrapping_add(position as u64), self.config.value_size))?;
            }
        }
        Ok(())
    }
}
