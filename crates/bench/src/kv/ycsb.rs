//! The YCSB core workloads A–F as multi-operation transactions.
//!
//! Keys are `b'u'` followed by the record id in big-endian, so key order is id order and scans
//! walk consecutive records. Values are `value_size` pseudo-random bytes.
//!
//! Each transaction runs `ops_per_txn` operations, each drawn independently with the standard
//! YCSB proportions:
//!
//! | mix | operations |
//! |-----|------------|
//! | A   | 50% read, 50% update |
//! | B   | 95% read, 5% update |
//! | C   | 100% read |
//! | D   | 95% read of recent records ("latest" distribution), 5% insert |
//! | E   | 95% scan (zipf start, length uniform in `1..=scan_max`), 5% insert |
//! | F   | 50% read, 50% read-modify-write |
//!
//! Reads, updates, read-modify-writes and scan starts pick a loaded record with a scrambled
//! Zipf sampler (YCSB's `ScrambledZipfianGenerator`). Inserts take fresh ids `records,
//! records + 1, ...` from a counter shared by all clients, so ids are unique. D's reads pick
//! `latest - rank` where `latest` is the newest id handed out and `rank` is plain Zipf over
//! `records` (YCSB's `SkewedLatestGenerator`, with the domain fixed at the loaded size rather
//! than growing: 5% inserts change it little, and a fixed domain needs no shared state). As
//! YCSB without its acknowledgement tracking, a read may hit an id whose insert has not
//! committed yet; it then finds nothing, which is a valid outcome.
//!
//! Every random choice is made in [`KvWorkload::next_txn`], so a retried transaction replays
//! the same operations and writes the same bytes.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{ensure, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::zipf::{mix64, Zipf};
use super::{KvTx, KvWorkload, TxAbort};

/// Table tag of YCSB keys (`usertable`).
pub const TAG: u8 = b'u';

/// The key of record `id`.
pub fn key(id: u64) -> [u8; 9] {
    let mut key = [TAG; 9];
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// Fills `buf` with `len` pseudo-random bytes determined by `seed` (a SplitMix64 stream).
/// Shared with other workloads that store opaque payloads.
pub(crate) fn fill_value(buf: &mut Vec<u8>, seed: u64, len: usize) {
    buf.clear();
    buf.reserve(len);
    let mut state = seed;
    while buf.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let word = mix64(state).to_le_bytes();
        let take = (len - buf.len()).min(word.len());
        buf.extend_from_slice(&word[..take]);
    }
}

/// One of the six YCSB core workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum YcsbMix {
    /// Update heavy: 50% read, 50% update.
    A,
    /// Read mostly: 95% read, 5% update.
    B,
    /// Read only.
    C,
    /// Read latest: 95% read of recent records, 5% insert.
    D,
    /// Short ranges: 95% scan, 5% insert.
    E,
    /// Read-modify-write: 50% read, 50% read-modify-write.
    F,
}

impl YcsbMix {
    /// All mixes, A to F.
    pub const ALL: [YcsbMix; 6] = [YcsbMix::A, YcsbMix::B, YcsbMix::C, YcsbMix::D, YcsbMix::E, YcsbMix::F];

    /// Command-line name: `ycsb-a` .. `ycsb-f`.
    pub fn name(self) -> &'static str {
        match self {
            YcsbMix::A => "ycsb-a",
            YcsbMix::B => "ycsb-b",
            YcsbMix::C => "ycsb-c",
            YcsbMix::D => "ycsb-d",
            YcsbMix::E => "ycsb-e",
            YcsbMix::F => "ycsb-f",
        }
    }

    /// The mix named `name` (`ycsb-a` .. `ycsb-f`, case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mix| mix.name().eq_ignore_ascii_case(name))
    }
}

/// YCSB parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct YcsbConfig {
    /// Records loaded before the run (default 1,000,000).
    pub records: u64,
    /// Zipf exponent of the key choice (default 0.99, YCSB's `zipfianconstant`).
    pub zipf: f64,
    /// Operations per transaction (default 4).
    pub ops_per_txn: usize,
    /// Bytes per value (default 100).
    pub value_size: usize,
    /// Longest scan (default 100).
    pub scan_max: usize,
}

impl Default for YcsbConfig {
    fn default() -> Self {
        Self { records: 1_000_000, zipf: 0.99, ops_per_txn: 4, value_size: 100, scan_max: 100 }
    }
}

/// One YCSB operation. Ids are record ids; seeds determine the bytes written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YcsbOp {
    /// Reads one record.
    Read {
        /// Record id.
        id: u64,
    },
    /// Overwrites one record without reading it.
    Update {
        /// Record id.
        id: u64,
        /// Seed of the new value.
        seed: u64,
    },
    /// Creates a new record.
    Insert {
        /// Fresh record id.
        id: u64,
        /// Seed of the value.
        seed: u64,
    },
    /// Reads up to `len` consecutive records starting at `start`.
    Scan {
        /// First record id.
        start: u64,
        /// Number of records.
        len: usize,
    },
    /// Reads a record, then writes a value derived from what it read.
    ReadModifyWrite {
        /// Record id.
        id: u64,
        /// Seed of the modification.
        seed: u64,
    },
}

impl YcsbOp {
    /// Whether the operation never writes.
    pub fn is_read_only(&self) -> bool {
        matches!(self, YcsbOp::Read { .. } | YcsbOp::Scan { .. })
    }
}

/// A generated YCSB transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YcsbTxn {
    /// The operations, in execution order.
    pub ops: Vec<YcsbOp>,
    read_only: bool,
}

impl YcsbTxn {
    /// A transaction running `ops` in order.
    pub fn new(ops: Vec<YcsbOp>) -> Self {
        let read_only = ops.iter().all(YcsbOp::is_read_only);
        Self { ops, read_only }
    }

    /// Whether no operation writes.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }
}

/// A YCSB core workload.
#[derive(Debug)]
pub struct YcsbWorkload {
    mix: YcsbMix,
    config: YcsbConfig,
    /// Scrambled Zipf over the loaded records.
    keys: Zipf,
    /// Plain Zipf over `records`, for D's distance back from the newest record.
    recency: Zipf,
    /// Next id an insert will create.
    next_insert: AtomicU64,
}

impl YcsbWorkload {
    /// A workload of `mix` over `config`. Fails on an empty key space or zero-sized
    /// transactions, values or scans, or an invalid Zipf exponent.
    pub fn new(mix: YcsbMix, config: YcsbConfig) -> Result<Self> {
        ensure!(config.records >= 1, "ycsb: need at least one record");
        ensure!(config.ops_per_txn >= 1, "ycsb: need at least one operation per transaction");
        ensure!(config.value_size >= 1, "ycsb: values need at least one byte");
        ensure!(config.scan_max >= 1, "ycsb: scan_max must be at least 1");
        let keys = Zipf::scrambled(config.records, config.zipf)?;
        let recency = Zipf::new(config.records, config.zipf)?;
        let next_insert = AtomicU64::new(config.records);
        Ok(Self { mix, config, keys, recency, next_insert })
    }

    /// The mix.
    pub fn mix(&self) -> YcsbMix {
        self.mix
    }

    /// The parameters.
    pub fn config(&self) -> &YcsbConfig {
        &self.config
    }

    /// Ids handed out to inserts so far (including those of transactions not yet committed).
    pub fn inserts_issued(&self) -> u64 {
        self.next_insert.load(Ordering::Relaxed) - self.config.records
    }

    fn insert(&self, rng: &mut SmallRng) -> YcsbOp {
        YcsbOp::Insert { id: self.next_insert.fetch_add(1, Ordering::Relaxed), seed: rng.random() }
    }

    fn draw_op(&self, rng: &mut SmallRng) -> YcsbOp {
        let percent = rng.random_range(0..100u32);
        let read = |rng: &mut SmallRng| YcsbOp::Read { id: self.keys.sample(rng) };
        match self.mix {
            YcsbMix::A | YcsbMix::B => {
                let reads = if self.mix == YcsbMix::A { 50 } else { 95 };
                if percent < reads {
                    read(rng)
                } else {
                    YcsbOp::Update { id: self.keys.sample(rng), seed: rng.random() }
                }
            }
            YcsbMix::C => read(rng),
            YcsbMix::D => {
                if percent < 95 {
                    // `next_insert >= records > rank`, so this never underflows.
                    let latest = self.next_insert.load(Ordering::Relaxed) - 1;
                    YcsbOp::Read { id: latest - self.recency.sample_rank(rng) }
                } else {
                    self.insert(rng)
                }
            }
            YcsbMix::E => {
                if percent < 95 {
                    YcsbOp::Scan { start: self.keys.sample(rng), len: rng.random_range(1..=self.config.scan_max) }
                } else {
                    self.insert(rng)
                }
            }
            YcsbMix::F => {
                if percent < 50 {
                    read(rng)
                } else {
                    YcsbOp::ReadModifyWrite { id: self.keys.sample(rng), seed: rng.random() }
                }
            }
        }
    }
}

impl KvWorkload for YcsbWorkload {
    type Txn = YcsbTxn;

    fn name(&self) -> &str {
        self.mix.name()
    }

    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        let mut value = Vec::with_capacity(self.config.value_size);
        for id in 0..self.config.records {
            fill_value(&mut value, mix64(id), self.config.value_size);
            sink(&key(id), &value);
        }
    }

    fn next_txn(&self, _client: usize, rng: &mut SmallRng) -> YcsbTxn {
        YcsbTxn::new((0..self.config.ops_per_txn).map(|_| self.draw_op(rng)).collect())
    }

    fn is_read_only(&self, txn: &YcsbTxn) -> bool {
        txn.read_only
    }

    fn execute(&self, txn: &YcsbTxn, tx: &mut dyn KvTx) -> Result<(), TxAbort> {
        // One buffer for every value this transaction writes.
        let mut value = Vec::new();
        for op in &txn.ops {
            match *op {
                YcsbOp::Read { id } => {
                    tx.get(&key(id))?;
                }
                YcsbOp::Update { id, seed } | YcsbOp::Insert { id, seed } => {
                    fill_value(&mut value, seed, self.config.value_size);
                    tx.put(&key(id), &value)?;
                }
                YcsbOp::Scan { start, len } => {
                    tx.scan(&key(start), len)?;
                }
                YcsbOp::ReadModifyWrite { id, seed } => {
                    let old = tx.get(&key(id))?;
                    fill_value(&mut value, seed, self.config.value_size);
                    // XOR in the old bytes so the write really depends on the read (YCSB
                    // itself writes a fresh value; this also makes lost updates observable).
                    for (new, old) in value.iter_mut().zip(old.as_ref().map_or(&[][..], Bytes::as_ref)) {
                        *new ^= old;
                    }
                    tx.put(&key(id), &value)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::testing::{assert_retries_deterministic, Oracle};
    use rand::SeedableRng;

    fn small(mix: YcsbMix) -> YcsbWorkload {
        let config = YcsbConfig { records: 5_000, scan_max: 20, ..YcsbConfig::default() };
        YcsbWorkload::new(mix, config).unwrap()
    }

    #[test]
    fn names_round_trip() {
        for mix in YcsbMix::ALL {
            assert_eq!(YcsbMix::parse(mix.name()), Some(mix));
        }
        assert_eq!(YcsbMix::parse("YCSB-A"), Some(YcsbMix::A));
        assert_eq!(YcsbMix::parse("ycsb-g"), None);
    }

    #[test]
    fn keys_sort_by_id() {
        assert!(key(255) < key(256));
        assert!(key(1) < key(u64::MAX));
        assert_eq!(key(0x0102)[..], [TAG, 0, 0, 0, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn values_are_deterministic_and_sized() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        fill_value(&mut a, 9, 100);
        fill_value(&mut b, 9, 100);
        assert_eq!(a, b);
        assert_eq!(a.len(), 100);
        fill_value(&mut b, 10, 3);
        assert_eq!(b.len(), 3);
        assert_ne!(a[..3], b[..]);
    }

    #[test]
    fn op_proportions() {
        // (reads, updates, inserts, scans, rmws) in percent.
        let expected = [
            (YcsbMix::A, [50.0, 50.0, 0.0, 0.0, 0.0]),
            (YcsbMix::B, [95.0, 5.0, 0.0, 0.0, 0.0]),
            (YcsbMix::C, [100.0, 0.0, 0.0, 0.0, 0.0]),
            (YcsbMix::D, [95.0, 0.0, 5.0, 0.0, 0.0]),
            (YcsbMix::E, [0.0, 0.0, 5.0, 95.0, 0.0]),
            (YcsbMix::F, [50.0, 0.0, 0.0, 0.0, 50.0]),
        ];
        for (mix, want) in expected {
            let workload = small(mix);
            let mut rng = SmallRng::seed_from_u64(5);
            let mut counts = [0u64; 5];
            let mut scan_lens = (usize::MAX, 0);
            let txns = 25_000; // 100k operations
            for _ in 0..txns {
                let txn = workload.next_txn(0, &mut rng);
                assert_eq!(txn.ops.len(), 4);
                for op in &txn.ops {
                    let slot = match op {
                        YcsbOp::Read { .. } => 0,
                        YcsbOp::Update { .. } => 1,
                        YcsbOp::Insert { .. } => 2,
                        YcsbOp::Scan { len, .. } => {
                            scan_lens = (scan_lens.0.min(*len), scan_lens.1.max(*len));
                            3
                        }
                        YcsbOp::ReadModifyWrite { .. } => 4,
                    };
                    counts[slot] += 1;
                }
            }
            for (slot, (&seen, want)) in counts.iter().zip(want).enumerate() {
                let seen = seen as f64 * 100.0 / (txns * 4) as f64;
                assert!((seen - want).abs() < 0.6, "{mix:?} slot {slot}: {seen:.2}% vs {want}%");
            }
            if mix == YcsbMix::E {
                assert_eq!(scan_lens, (1, 20));
            }
        }
    }

    #[test]
    fn inserts_get_unique_fresh_ids() {
        let workload = small(YcsbMix::D);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut ids = Vec::new();
        for client in 0..4 {
            for _ in 0..2_000 {
                for op in workload.next_txn(client, &mut rng).ops {
                    if let YcsbOp::Insert { id, .. } = op {
                        ids.push(id);
                    }
                }
            }
        }
        let issued = ids.len() as u64;
        assert_eq!(workload.inserts_issued(), issued);
        ids.sort_unstable();
        assert_eq!(ids, (5_000..5_000 + issued).collect::<Vec<_>>());
    }

    #[test]
    fn latest_distribution_prefers_recent_records() {
        let workload = small(YcsbMix::D);
        let mut rng = SmallRng::seed_from_u64(2);
        let (mut recent, mut reads) = (0u64, 0u64);
        for _ in 0..10_000 {
            for op in workload.next_txn(0, &mut rng).ops {
                if let YcsbOp::Read { id } = op {
                    let latest = workload.next_insert.load(Ordering::Relaxed) - 1;
                    assert!(id <= latest);
                    reads += 1;
                    recent += u64::from(latest - id < 100);
                }
            }
        }
        // P(rank < 100) for s = 0.99 over 5,000 ranks is about 0.56.
        assert!(recent as f64 / reads as f64 > 0.5, "{recent} of {reads} reads were recent");
    }

    /// Runs every mix against the oracle: read-only labels are honest (the oracle panics
    /// otherwise), nothing aborts, writes have the configured size, and inserts add records.
    #[test]
    fn runs_against_oracle() {
        for mix in YcsbMix::ALL {
            let workload = small(mix);
            let mut oracle = Oracle::loaded(&workload);
            assert_eq!(oracle.len(), 5_000);
            let mut rng = SmallRng::seed_from_u64(3);
            let (mut read_only, mut scanned) = (0u64, 0u64);
            for _ in 0..20_000 {
                let txn = workload.next_txn(0, &mut rng);
                let (stats, writes) = oracle.execute(&workload, &txn).expect("oracle never aborts");
                assert_eq!(txn.is_read_only(), txn.ops.iter().all(YcsbOp::is_read_only));
                if txn.is_read_only() {
                    read_only += 1;
                    assert!(writes.is_empty());
                }
                scanned += stats.scans;
                for value in writes.values() {
                    assert_eq!(value.as_ref().map(Bytes::len), Some(100));
                }
            }
            let inserted = workload.inserts_issued();
            assert_eq!(oracle.len() as u64, 5_000 + inserted, "{mix:?}");
            match mix {
                YcsbMix::C => assert_eq!(read_only, 20_000),
                YcsbMix::A | YcsbMix::F => assert!(read_only < 20_000 / 8),
                _ => assert!(read_only > 20_000 * 3 / 4),
            }
            assert_eq!(scanned > 0, mix == YcsbMix::E);
            assert_eq!(inserted > 0, matches!(mix, YcsbMix::D | YcsbMix::E));
        }
    }

    /// A retried transaction on the same state writes exactly the same bytes.
    #[test]
    fn retries_are_deterministic() {
        for mix in YcsbMix::ALL {
            assert_retries_deterministic(&small(mix), 1, 4, 2_000);
        }
    }

    #[test]
    fn read_modify_write_depends_on_the_read() {
        let workload = small(YcsbMix::F);
        let mut oracle = Oracle::loaded(&workload);
        let txn = YcsbTxn::new(vec![YcsbOp::ReadModifyWrite { id: 7, seed: 1 }]);
        let (_, first) = oracle.execute(&workload, &txn).unwrap();
        let (_, second) = oracle.execute(&workload, &txn).unwrap();
        assert_ne!(first, second);
        // XOR-ing the same bytes twice restores the loaded value.
        let mut loaded = Vec::new();
        fill_value(&mut loaded, mix64(7), 100);
        assert_eq!(oracle.get(&key(7)).unwrap().as_ref(), &loaded[..]);
    }

    #[test]
    fn rejects_bad_configs() {
        let bad = [
            YcsbConfig { records: 0, ..YcsbConfig::default() },
            YcsbConfig { ops_per_txn: 0, ..YcsbConfig::default() },
            YcsbConfig { value_size: 0, ..YcsbConfig::default() },
            YcsbConfig { scan_max: 0, ..YcsbConfig::default() },
            YcsbConfig { zipf: -1.0, ..YcsbConfig::default() },
        ];
        for config in bad {
            assert!(YcsbWorkload::new(YcsbMix::A, config).is_err());
        }
    }
}
