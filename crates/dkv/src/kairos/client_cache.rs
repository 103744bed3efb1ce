//! A client's look-through cache of hot keys across transactions (seed 004 Algorithm 4).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use virga_net::role::Nanos;
use virga_storage::{Timestamp, TxnId};

use super::{CacheMode, MeanGap};

/// What a client caches: the mode, and the keys it may cache (fixed before the run from the
/// workload's popularity, as the seed's top-k set).
#[derive(Debug, Clone, Default)]
pub struct CacheConfig {
    pub mode: CacheMode,
    pub keys: Arc<HashSet<Bytes>>,
}

impl CacheConfig {
    pub fn new(mode: CacheMode, keys: impl IntoIterator<Item = Bytes>) -> CacheConfig {
        CacheConfig { mode, keys: Arc::new(keys.into_iter().collect()) }
    }
}

/// A value served from the cache: what a get would have returned, and its freshness (no
/// write supersedes `version` at or below `freshness`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRead {
    pub value: Option<Bytes>,
    pub version: Timestamp,
    pub writer: TxnId,
    pub freshness: Timestamp,
}

#[derive(Debug, Clone)]
struct Entry {
    read: CachedRead,
    /// The lease end, on the granting primary's clock (ns).
    lease_end: u64,
}

/// What a cache did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads of cacheable keys by this client's transactions (hits and misses).
    pub reads: u64,
    /// Reads served from the cache.
    pub hits: u64,
    /// Hits a participant's validation found superseded (the transaction aborted).
    pub stale: u64,
    /// Misses on an entry whose lease had run out.
    pub expired: u64,
    /// Values put in the cache by a get with a lease.
    pub fills: u64,
    /// EI: callbacks received from primaries.
    pub invalidations: u64,
}

/// The cache of one client.
#[derive(Debug, Default)]
pub struct ClientCache {
    config: CacheConfig,
    entries: HashMap<Bytes, Entry>,
    /// Each cacheable key's mean inter-read time at this client, hits and misses alike.
    read_gaps: HashMap<Bytes, MeanGap>,
    stats: CacheStats,
}

impl ClientCache {
    pub fn new(config: CacheConfig) -> ClientCache {
        ClientCache { config, ..ClientCache::default() }
    }

    pub fn mode(&self) -> CacheMode {
        self.config.mode
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn is_cacheable(&self, key: &[u8]) -> bool {
        self.config.mode.caches() && self.config.keys.contains(key)
    }

    /// A transaction reading at `ts` reads `key` at local time `now` (the client's clock,
    /// skew included): the cached value if its lease has not run out on this clock and its
    /// version is at or below `ts`; None is a miss, to be fetched. Every read of a cacheable
    /// key counts toward its mean inter-read time.
    pub fn read(&mut self, key: &Bytes, ts: Timestamp, now: Nanos) -> Option<CachedRead> {
        if !self.is_cacheable(key) {
            return None;
        }
        self.stats.reads += 1;
        self.tick(key, now);
        let entry = self.entries.get(key)?;
        if entry.lease_end <= now {
            self.stats.expired += 1;
            self.entries.remove(key);
            return None;
        }
        if entry.read.version > ts {
            return None;
        }
        self.stats.hits += 1;
        Some(entry.read.clone())
    }

    fn tick(&mut self, key: &Bytes, now: Nanos) {
        match self.read_gaps.get_mut(key) {
            Some(gaps) => gaps.tick(now),
            None => {
                self.read_gaps.insert(key.clone(), MeanGap::starting(now));
            }
        }
    }

    /// R for `key`, as its gets carry it: the mean time between this client's reads of it
    /// (at least 1 ns); 0 for a key it does not cache or has read only once.
    pub fn read_interval_ns(&self, key: &[u8]) -> u64 {
        if !self.is_cacheable(key) {
            return 0;
        }
        self.read_gaps.get(key).and_then(|gaps| gaps.mean).map_or(0, |gap| (gap as u64).max(1))
    }

    /// A get at `ts` answered `read` with `lease_end` (0: none): cache it, unless a writer
    /// was prepared below `ts` (the value may be superseded at `ts` already) or the cache
    /// holds a fresher copy.
    pub fn fill(&mut self, key: &Bytes, read: CachedRead, lease_end: u64, prepared_below: bool) {
        if lease_end == 0 || prepared_below || !self.is_cacheable(key) {
            return;
        }
        if self.entries.get(key).is_some_and(|entry| entry.read.freshness >= read.freshness) {
            return;
        }
        self.stats.fills += 1;
        self.entries.insert(key.clone(), Entry { read, lease_end });
    }

    /// Validation found the cached copy of `key` superseded: drop it (`was_hit`: the
    /// transaction read it from the cache, a stale hit).
    pub fn found_stale(&mut self, key: &[u8], was_hit: bool) {
        self.stats.stale += u64::from(was_hit);
        self.entries.remove(key);
    }

    /// This client committed a write of `key`: its cached copy is superseded.
    pub fn wrote(&mut self, key: &[u8]) {
        self.entries.remove(key);
    }

    /// EI: a primary says `key` has a committed version at `version`: a copy older than it
    /// is dropped.
    pub fn invalidated(&mut self, key: &[u8], version: Timestamp) {
        self.stats.invalidations += 1;
        if self.entries.get(key).is_some_and(|entry| entry.read.version < version) {
            self.entries.remove(key);
        }
    }

    /// Drops the cached copy of `key` (a transaction that read it aborted).
    pub fn drop_copy(&mut self, key: &[u8]) {
        self.entries.remove(key);
    }

    /// `c_freshness`: the oldest freshness in the cache (None: empty), below which the
    /// client may still send cached reads to validation.
    pub fn freshness(&self) -> Option<Timestamp> {
        self.entries.values().map(|entry| entry.read.freshness).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(time: u64) -> Timestamp {
        Timestamp::new(time, 1)
    }

    fn read(version: u64, freshness: u64) -> CachedRead {
        CachedRead { value: Some(Bytes::from_static(b"v")), version: ts(version), writer: 9, freshness: ts(freshness) }
    }

    fn cache() -> (ClientCache, Bytes) {
        let key = Bytes::from_static(b"hot");
        (ClientCache::new(CacheConfig::new(CacheMode::Lease, [key.clone()])), key)
    }

    #[test]
    fn a_read_within_its_lease_hits_and_one_past_it_misses() {
        let (mut cache, key) = cache();
        assert_eq!(cache.read(&key, ts(100), 100), None);
        cache.fill(&key, read(50, 100), 200, false);
        assert_eq!(cache.read(&key, ts(150), 150), Some(read(50, 100)));
        assert_eq!(cache.read(&key, ts(200), 200), None, "the lease ends at 200");
        let stats = cache.stats();
        assert_eq!((stats.reads, stats.hits, stats.expired), (3, 1, 1));
    }

    #[test]
    fn the_read_interval_is_measured_over_hits_and_misses() {
        let (mut cache, key) = cache();
        assert_eq!(cache.read_interval_ns(&key), 0);
        cache.read(&key, ts(1), 1_000);
        cache.fill(&key, read(0, 1), u64::MAX, false);
        cache.read(&key, ts(2), 3_000);
        assert_eq!(cache.read_interval_ns(&key), 2_000);
        assert_eq!(cache.read_interval_ns(b"cold"), 0, "not cacheable");
    }

    #[test]
    fn no_caching_without_a_lease_or_with_a_prepared_writer_or_an_older_copy() {
        let (mut cache, key) = cache();
        cache.fill(&key, read(50, 100), 0, false);
        cache.fill(&key, read(50, 100), 500, true);
        assert!(cache.is_empty());
        cache.fill(&key, read(50, 100), 500, false);
        cache.fill(&key, read(40, 90), 900, false);
        assert_eq!(cache.read(&key, ts(120), 120), Some(read(50, 100)));
        assert_eq!(cache.freshness(), Some(ts(100)));
    }

    #[test]
    fn a_copy_newer_than_the_snapshot_is_not_served() {
        let (mut cache, key) = cache();
        cache.fill(&key, read(50, 100), 500, false);
        assert_eq!(cache.read(&key, ts(40), 120), None);
    }

    #[test]
    fn stale_and_written_copies_are_dropped() {
        let (mut cache, key) = cache();
        cache.fill(&key, read(50, 100), 500, false);
        cache.found_stale(&key, true);
        assert!(cache.is_empty());
        assert_eq!(cache.stats().stale, 1);
        cache.fill(&key, read(60, 110), 500, false);
        cache.wrote(&key);
        assert!(cache.is_empty());
    }

    #[test]
    fn nothing_is_cached_with_caching_off() {
        let key = Bytes::from_static(b"hot");
        let mut cache = ClientCache::new(CacheConfig::new(CacheMode::None, [key.clone()]));
        cache.fill(&key, read(1, 2), 500, false);
        assert_eq!(cache.read(&key, ts(3), 3), None);
        assert_eq!(cache.stats().reads, 0);
    }
}
