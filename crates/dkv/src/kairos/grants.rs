//! A primary's side of soft leases: no state per client and no callback, only each cached
//! key's write rate, from which every read of the key gets a lease end.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use virga_net::role::Nanos;
use virga_txn::cache::{ideal_lease, static_lease};

use super::{CacheMode, MeanGap, MAX_LEASE, NAIVE_LEASE};

/// Keys whose write rate a primary tracks at most (a key enters when a client first reads
/// it as cached; past this many, reads of new keys get no lease).
const MAX_TRACKED_KEYS: usize = 1 << 16;
/// Buckets of `R / W` per octave in the memo of Algorithm 3's answers.
const BUCKETS_PER_OCTAVE: f64 = 16.0;
/// The longest lease searched, in read intervals: a key read every 76 µs or more still
/// reaches the 5 s cap, and a search costs at most about a millisecond, once per bucket (a
/// client sending absurd read intervals cannot stall the primary for long).
const MAX_SEARCH_MULTIPLE: f64 = 65_536.0;

/// The lease rule of a primary and what it measures for it.
#[derive(Debug, Default)]
pub struct LeaseGrants {
    mode: CacheMode,
    /// Each leased key's writes as this primary installed them (counted from the first
    /// read asked as cached).
    write_gaps: HashMap<Bytes, MeanGap>,
    /// Algorithm 3's lease, in read intervals, by the bucket of `R / W` (the optimum depends
    /// on that ratio only; the search takes up to thousands of steps, too many for every get).
    ideal_multiples: HashMap<i32, f64>,
    granted: u64,
    /// Leases handed out by length: bucket k counts lengths in [2^k, 2^(k+1)) µs.
    lengths: BTreeMap<u32, u64>,
    /// EI only: the clients holding a copy of each key, called back at its next write.
    sharers: HashMap<Bytes, BTreeSet<String>>,
}

impl LeaseGrants {
    pub fn new(mode: CacheMode) -> LeaseGrants {
        LeaseGrants { mode, ..LeaseGrants::default() }
    }

    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    /// Leases handed out so far.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Keys whose write rate is tracked.
    pub fn tracked(&self) -> usize {
        self.write_gaps.len()
    }

    /// The lease end (on this primary's clock, in ns) for a read at `now` of `key`, which a
    /// client reads once every `read_interval_ns` on average; 0 when no lease is given (the
    /// key is not read as cached, the mode leases nothing, or too many keys are tracked).
    pub fn grant(&mut self, key: &[u8], read_interval_ns: u64, now: Nanos) -> u64 {
        if read_interval_ns == 0 || !self.mode.caches() {
            return 0;
        }
        if self.mode == CacheMode::Ei {
            // A callback, not a lease: valid until the primary calls the holder back.
            return now.saturating_add(NAIVE_LEASE.as_nanos() as u64);
        }
        let Some(write_interval) = self.write_interval(key, now) else { return 0 };
        let read_interval = read_interval_ns as f64;
        let lease = match self.mode {
            CacheMode::None | CacheMode::Ei => return 0,
            CacheMode::Naive => NAIVE_LEASE.as_nanos() as f64,
            CacheMode::Static(x) => static_lease(write_interval, x),
            CacheMode::Lease => self.ideal_multiple(read_interval / write_interval) * read_interval,
        };
        let cap = if self.mode == CacheMode::Naive { NAIVE_LEASE } else { MAX_LEASE };
        let lease = lease.clamp(1.0, cap.as_nanos() as f64) as u64;
        self.granted += 1;
        *self.lengths.entry((lease / 1_000).max(1).ilog2()).or_insert(0) += 1;
        now.saturating_add(lease)
    }

    /// Leases handed out, by length: bucket k counts lengths in [2^k, 2^(k+1)) µs.
    pub fn lengths(&self) -> &BTreeMap<u32, u64> {
        &self.lengths
    }

    /// EI: `reader` now holds a copy of `key` (asked as cached); false if the table is
    /// full, in which case the read must not be cached (no callback would come).
    pub fn share(&mut self, key: &[u8], reader: &str) -> bool {
        if let Some(sharers) = self.sharers.get_mut(key) {
            sharers.insert(reader.to_string());
            return true;
        }
        if self.sharers.len() >= MAX_TRACKED_KEYS {
            return false;
        }
        self.sharers.insert(Bytes::copy_from_slice(key), BTreeSet::from([reader.to_string()]));
        true
    }

    /// EI: the clients holding a copy of `key`, which a write just superseded; the key has
    /// none from now on.
    pub fn take_sharers(&mut self, key: &[u8]) -> BTreeSet<String> {
        self.sharers.remove(key).unwrap_or_default()
    }

    /// A committed write of `key` installed at `now`.
    pub fn written(&mut self, key: &[u8], now: Nanos) {
        if let Some(gaps) = self.write_gaps.get_mut(key) {
            gaps.tick(now);
        }
    }

    /// W: the key's mean inter-write time, at least the time since its last write (a key
    /// that stopped being written is not held to its old rate); None if the key is not
    /// tracked and cannot be.
    fn write_interval(&mut self, key: &[u8], now: Nanos) -> Option<f64> {
        if !self.write_gaps.contains_key(key) {
            if self.write_gaps.len() >= MAX_TRACKED_KEYS {
                return None;
            }
            self.write_gaps.insert(Bytes::copy_from_slice(key), MeanGap::starting(now));
        }
        let gaps = self.write_gaps.get(key)?;
        Some(gaps.mean.unwrap_or(0.0).max(gaps.since_last(now)).max(1.0))
    }

    /// Algorithm 3's ideal lease in read intervals for a read-to-write interval ratio.
    fn ideal_multiple(&mut self, ratio: f64) -> f64 {
        let bucket = (ratio.log2() * BUCKETS_PER_OCTAVE).round().clamp(-1024.0, 1024.0) as i32;
        *self.ideal_multiples.entry(bucket).or_insert_with(|| {
            let ratio = (f64::from(bucket) / BUCKETS_PER_OCTAVE).exp2();
            ideal_lease(1.0, 1.0 / ratio, MAX_SEARCH_MULTIPLE).lease
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Writes every 19 ms and a cache reading every 1 ms: the seed's example, 6 ms.
    #[test]
    fn the_ideal_lease_follows_the_measured_write_rate() {
        let mut grants = LeaseGrants::new(CacheMode::Lease);
        let key = b"hot";
        assert_eq!(grants.grant(key, MS, 0), MS, "no write seen yet: W is tiny, one read interval");
        for i in 1..=50 {
            grants.written(key, i * 19 * MS);
        }
        let now = 50 * 19 * MS;
        let lease = grants.grant(key, MS, now) - now;
        assert!((lease as f64 - 6.0 * MS as f64).abs() < 0.5 * MS as f64, "lease {lease}");
    }

    #[test]
    fn a_key_no_longer_written_gets_longer_leases_up_to_the_cap() {
        let mut grants = LeaseGrants::new(CacheMode::Lease);
        grants.grant(b"k", MS, 0);
        grants.written(b"k", MS);
        // An hour since the last write: W is at least that, and the model's optimum (about
        // √(2RW) for W ≫ R) is 2.7 s for a read every ms.
        let later = 3_600_000 * MS;
        let lease = (grants.grant(b"k", MS, later) - later) as f64;
        let model = ideal_lease(1.0, 3_600_000.0, 1e9).lease * MS as f64;
        assert!((lease / model - 1.0).abs() < 0.03, "{lease} against the model's {model}");
        // Read every 10 ms the optimum passes 5 s: the cap.
        assert_eq!(grants.grant(b"k", 10 * MS, later) - later, MAX_LEASE.as_nanos() as u64);
    }

    #[test]
    fn static_and_naive_leases() {
        let mut grants = LeaseGrants::new(CacheMode::Static(0.1));
        grants.grant(b"k", MS, 0);
        for i in 1..=100 {
            grants.written(b"k", i * 10 * MS);
        }
        let now = 1000 * MS;
        let lease = (grants.grant(b"k", MS, now) - now) as f64;
        // 1 − e^{−d/W} = 0.1 with W = 10 ms: d ≈ 1.05 ms.
        assert!((lease - 1.0536 * MS as f64).abs() < 0.01 * MS as f64, "{lease}");
        let mut naive = LeaseGrants::new(CacheMode::Naive);
        assert_eq!(naive.grant(b"k", MS, 5), 5 + NAIVE_LEASE.as_nanos() as u64);
    }

    #[test]
    fn ei_holds_copies_until_the_next_write_calls_their_holders_back() {
        let mut grants = LeaseGrants::new(CacheMode::Ei);
        assert_eq!(grants.grant(b"k", MS, 5), 5 + NAIVE_LEASE.as_nanos() as u64);
        assert!(grants.share(b"k", "client-1") && grants.share(b"k", "client-2") && grants.share(b"k", "client-1"));
        let called: Vec<String> = grants.take_sharers(b"k").into_iter().collect();
        assert_eq!(called, ["client-1", "client-2"]);
        assert!(grants.take_sharers(b"k").is_empty(), "each copy is called back once");
    }

    #[test]
    fn absurd_read_intervals_get_bounded_leases_quickly() {
        let mut grants = LeaseGrants::new(CacheMode::Lease);
        for interval in [1, 2, 3, u64::MAX / 2, u64::MAX] {
            let lease = grants.grant(b"k", interval, 1_000) - 1_000;
            assert!((1..=MAX_LEASE.as_nanos() as u64).contains(&lease), "{interval}: {lease}");
        }
        // A read every nanosecond of a key never written searches at most the bound.
        assert!(ideal_lease(1.0, f64::INFINITY, MAX_SEARCH_MULTIPLE).lease <= MAX_SEARCH_MULTIPLE);
    }

    #[test]
    fn no_lease_without_caching_or_a_read_interval() {
        assert_eq!(LeaseGrants::new(CacheMode::None).grant(b"k", MS, 7), 0);
        let mut grants = LeaseGrants::new(CacheMode::Lease);
        assert_eq!(grants.grant(b"k", 0, 7), 0);
        assert_eq!(grants.tracked(), 0, "a read not asked as cached leaves no state");
    }
}
