//! Retwis, the Twitter-clone mix of TAPIR's evaluation as used by MILANA's.
//!
//! As in TAPIR's benchmark, the social graph is not modelled: transactions get and put
//! Zipf-chosen keys out of `keys` pre-loaded ones, in the shapes of the four Retwis operations:
//!
//! | transaction  | share | gets | puts |
//! |--------------|-------|------|------|
//! | Add User     | 5%    | 1    | 2: the key it read, and a new key (the user's record) |
//! | Follow       | 10%   | 2    | 2: the two keys it read |
//! | Post Tweet   | 35%   | 3    | 5: the three keys it read, one more chosen key, and a new key (the tweet) |
//! | Get Timeline | 50%   | 1–10 | none (read-only) |
//!
//! Keys are `b'r'` followed by an id in big-endian; values are `value_size` pseudo-random
//! bytes. A transaction's chosen keys are distinct and accessed in ascending order (TAPIR sorts
//! them too, which spares lock-based engines needless deadlocks).
//!
//! New keys: one put of Add User and one of Post Tweet create a key with a fresh id (`keys,
//! keys + 1, ...`) from a counter shared by all clients, so ids are unique and a retry reuses
//! its id. Fresh ids are above every pre-loaded one, so they also come last in key order. We
//! create only one key per writing transaction (TAPIR creates none; a real Retwis creates
//! several per tweet) to exercise inserts while keeping the store's growth at 0.4 keys per
//! transaction; gets only ever target pre-loaded keys, so created keys are write-only.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{ensure, Result};
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::ycsb::fill_value;
use super::zipf::{mix64, Zipf};
use super::{KvTx, KvWorkload, TxAbort};

/// Table tag of Retwis keys.
pub const TAG: u8 = b'r';

/// The key with id `id`.
pub fn key(id: u64) -> [u8; 9] {
    let mut key = [TAG; 9];
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// Retwis parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetwisConfig {
    /// Pre-loaded keys (default 1,000,000).
    pub keys: u64,
    /// Zipf exponent α of the key choice (default 0.99; 0 is uniform).
    pub zipf: f64,
    /// Bytes per value (default 100).
    pub value_size: usize,
}

impl Default for RetwisConfig {
    fn default() -> Self {
        Self { keys: 1_000_000, zipf: 0.99, value_size: 100 }
    }
}

/// The four Retwis transaction types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetwisKind {
    /// 5%: get 1 key; put it and a new key.
    AddUser,
    /// 10%: get 2 keys; put both.
    Follow,
    /// 35%: get 3 keys; put them, a 4th chosen key, and a new key.
    PostTweet,
    /// 50%: get 1 to 10 keys. Read-only.
    GetTimeline,
}

/// A generated Retwis transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetwisTxn {
    /// The transaction type.
    pub kind: RetwisKind,
    /// Distinct pre-loaded ids in ascending order: 1 for Add User, 2 for Follow, 4 for Post
    /// Tweet (the first 3 are read), 1–10 for Get Timeline.
    pub keys: Vec<u64>,
    /// The id Add User or Post Tweet creates.
    pub new_key: Option<u64>,
    /// Determines the bytes written.
    pub seed: u64,
}

/// The Retwis workload.
#[derive(Debug)]
pub struct RetwisWorkload {
    config: RetwisConfig,
    keys: Zipf,
    next_new_key: AtomicU64,
}

impl RetwisWorkload {
    /// A workload over `config`. Fails with fewer than 10 keys (Get Timeline needs up to 10
    /// distinct ones), empty values, or an invalid Zipf exponent.
    pub fn new(config: RetwisConfig) -> Result<Self> {
        ensure!(config.keys >= 10, "retwis: need at least 10 keys");
        ensure!(config.value_size >= 1, "retwis: values need at least one byte");
        let keys = Zipf::scrambled(config.keys, config.zipf)?;
        let next_new_key = AtomicU64::new(config.keys);
        Ok(Self { config, keys, next_new_key })
    }

    /// The parameters.
    pub fn config(&self) -> &RetwisConfig {
        &self.config
    }

    /// Ids handed out for new keys so far (including those of transactions not yet committed).
    pub fn new_keys_issued(&self) -> u64 {
        self.next_new_key.load(Ordering::Relaxed) - self.config.keys
    }

    /// `count` distinct Zipf-chosen ids, ascending.
    fn distinct_keys(&self, count: usize, rng: &mut SmallRng) -> Vec<u64> {
        let mut ids = Vec::with_capacity(count);
        while ids.len() < count {
            let id = self.keys.sample(rng);
            // Linear search: at most 10 ids.
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        ids
    }

    fn put(&self, tx: &mut dyn KvTx, buf: &mut Vec<u8>, id: u64, seed: u64) -> Result<(), TxAbort> {
        // Different bytes per key, the same bytes on a retry.
        fill_value(buf, seed ^ mix64(id), self.config.value_size);
        tx.put(&key(id), buf)
    }
}

impl KvWorkload for RetwisWorkload {
    type Txn = RetwisTxn;

    fn name(&self) -> &str {
        "retwis"
    }

    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        let mut value = Vec::with_capacity(self.config.value_size);
        for id in 0..self.config.keys {
            fill_value(&mut value, mix64(id), self.config.value_size);
            sink(&key(id), &value);
        }
    }

    fn next_txn(&self, _client: usize, rng: &mut SmallRng) -> RetwisTxn {
        let (kind, chosen, creates) = match rng.random_range(0..100u32) {
            0..5 => (RetwisKind::AddUser, 1, true),
            5..15 => (RetwisKind::Follow, 2, false),
            15..50 => (RetwisKind::PostTweet, 4, true),
            _ => (RetwisKind::GetTimeline, rng.random_range(1..=10), false),
        };
        let keys = self.distinct_keys(chosen, rng);
        let new_key = creates.then(|| self.next_new_key.fetch_add(1, Ordering::Relaxed));
        RetwisTxn { kind, keys, new_key, seed: rng.random() }
    }

    fn is_read_only(&self, txn: &RetwisTxn) -> bool {
        txn.kind == RetwisKind::GetTimeline
    }

    fn execute(&self, txn: &RetwisTxn, tx: &mut dyn KvTx) -> Result<(), TxAbort> {
        let reads = match txn.kind {
            RetwisKind::AddUser => 1,
            RetwisKind::Follow => 2,
            RetwisKind::PostTweet => 3,
            RetwisKind::GetTimeline => txn.keys.len(),
        };
        for &id in txn.keys.iter().take(reads) {
            tx.get(&key(id))?;
        }
        if txn.kind == RetwisKind::GetTimeline {
            return Ok(());
        }
        let mut buf = Vec::new();
        for &id in txn.keys.iter().chain(&txn.new_key) {
            self.put(tx, &mut buf, id, txn.seed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::testing::{assert_retries_deterministic, Oracle};
    use rand::SeedableRng;
    use std::collections::HashMap;

    fn workload() -> RetwisWorkload {
        RetwisWorkload::new(RetwisConfig { keys: 10_000, ..RetwisConfig::default() }).unwrap()
    }

    #[test]
    fn mix_proportions() {
        let workload = workload();
        let mut rng = SmallRng::seed_from_u64(31);
        let mut counts: HashMap<RetwisKind, u64> = HashMap::new();
        let mut timeline_sizes = [0u64; 11];
        let draws = 100_000;
        for _ in 0..draws {
            let txn = workload.next_txn(0, &mut rng);
            *counts.entry(txn.kind).or_default() += 1;
            assert!(txn.keys.windows(2).all(|w| w[0] < w[1]), "sorted and distinct: {:?}", txn.keys);
            if txn.kind == RetwisKind::GetTimeline {
                timeline_sizes[txn.keys.len()] += 1;
            }
        }
        for (kind, want) in [
            (RetwisKind::AddUser, 5.0),
            (RetwisKind::Follow, 10.0),
            (RetwisKind::PostTweet, 35.0),
            (RetwisKind::GetTimeline, 50.0),
        ] {
            let seen = counts[&kind] as f64 * 100.0 / draws as f64;
            assert!((seen - want).abs() < 0.6, "{kind:?}: {seen:.2}% vs {want}%");
        }
        // Timelines read 1..=10 keys, uniformly.
        assert_eq!(timeline_sizes[0], 0);
        let per_size = counts[&RetwisKind::GetTimeline] as f64 / 10.0;
        for (size, &n) in timeline_sizes.iter().enumerate().skip(1) {
            assert!((n as f64 - per_size).abs() < 0.1 * per_size, "size {size}: {n}");
        }
        assert_eq!(workload.new_keys_issued(), counts[&RetwisKind::AddUser] + counts[&RetwisKind::PostTweet]);
    }

    /// 20k transactions against the oracle: each type does exactly its gets and puts, only Get
    /// Timeline is read-only (the oracle panics if it writes), and created keys are fresh.
    #[test]
    fn runs_against_oracle() {
        let workload = workload();
        let mut oracle = Oracle::loaded(&workload);
        assert_eq!(oracle.len(), 10_000);
        let mut rng = SmallRng::seed_from_u64(32);
        let mut created = 0;
        for _ in 0..20_000 {
            let txn = workload.next_txn(0, &mut rng);
            let before = oracle.len();
            let (stats, writes) = oracle.execute(&workload, &txn).expect("oracle never aborts");
            let (gets, puts) = match txn.kind {
                RetwisKind::AddUser => (1, 2),
                RetwisKind::Follow => (2, 2),
                RetwisKind::PostTweet => (3, 5),
                RetwisKind::GetTimeline => (txn.keys.len() as u64, 0),
            };
            assert_eq!((stats.gets, stats.puts, stats.deletes, stats.scans), (gets, puts, 0, 0), "{txn:?}");
            assert_eq!(workload.is_read_only(&txn), puts == 0);
            assert_eq!(writes.len() as u64, puts, "distinct keys");
            assert!(writes.values().all(|v| v.as_ref().is_some_and(|v| v.len() == 100)));
            if let Some(id) = txn.new_key {
                assert!(id >= 10_000);
                assert_eq!(oracle.len(), before + 1);
                created += 1;
            } else {
                assert_eq!(oracle.len(), before);
            }
        }
        assert_eq!(oracle.len(), 10_000 + created);
    }

    #[test]
    fn retries_are_deterministic() {
        assert_retries_deterministic(&workload(), 0, 33, 2_000);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(RetwisWorkload::new(RetwisConfig { keys: 9, ..RetwisConfig::default() }).is_err());
        assert!(RetwisWorkload::new(RetwisConfig { value_size: 0, ..RetwisConfig::default() }).is_err());
        assert!(RetwisWorkload::new(RetwisConfig { zipf: -0.5, ..RetwisConfig::default() }).is_err());
    }
}
