//! What the roles measure of themselves, as plain data the cores keep: latency histograms in
//! fixed buckets and the gauges of a data node's shards. The cores record with the time
//! their step was given (they read no clock); the deployment's exporter
//! (`deploy::metrics`, Prometheus's text format over HTTP) reads them between steps.

use virga_storage::Timestamp;

/// Buckets' upper bounds: 50 µs × 2^k for k = 0..BOUNDS (50 µs to 1.6 s), then +Inf.
const BOUNDS: usize = 16;
const FIRST_BOUND_NANOS: u64 = 50_000;

/// Latencies in fixed exponential buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Per bucket (not cumulative); the last counts what exceeds every bound.
    counts: [u64; BOUNDS + 1],
    sum_nanos: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { counts: [0; BOUNDS + 1], sum_nanos: 0 }
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, nanos: u64) {
        let bucket = (0..BOUNDS).find(|k| nanos <= FIRST_BOUND_NANOS << k).unwrap_or(BOUNDS);
        self.counts[bucket] += 1;
        self.sum_nanos = self.sum_nanos.saturating_add(nanos);
    }

    /// Adds `other`'s latencies to these.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (count, more) in self.counts.iter_mut().zip(other.counts) {
            *count += more;
        }
        self.sum_nanos = self.sum_nanos.saturating_add(other.sum_nanos);
    }

    /// Removes an earlier reading of the same histogram (what was recorded since it).
    pub fn subtract(&mut self, earlier: &LatencyHistogram) {
        for (count, before) in self.counts.iter_mut().zip(earlier.counts) {
            *count = count.saturating_sub(before);
        }
        self.sum_nanos = self.sum_nanos.saturating_sub(earlier.sum_nanos);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }

    /// (upper bound in seconds, count at or below it), cumulative, the last bound +Inf.
    pub fn cumulative_buckets(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(k, count)| {
                total += count;
                let bound = if k < BOUNDS { (FIRST_BOUND_NANOS << k) as f64 / 1e9 } else { f64::INFINITY };
                (bound, total)
            })
            .collect()
    }
}

/// One shard's state at a data node.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardGauges {
    pub shard: u32,
    pub primary: bool,
    pub epoch: u64,
    /// As primary: the timestamp its read lease reaches (reads are served below it).
    pub lease_until: Option<Timestamp>,
    /// As backup: nanoseconds since the primary last asked for a lease, at the last step.
    pub lease_heard_ago: Option<u64>,
    /// As primary: records not yet held by every backup (replication lag, in records).
    pub replication_backlog: usize,
    /// Transactions prepared here with no decision yet.
    pub prepared: usize,
    /// The replica's tables: transaction entries (and decisions waiting for their prepare),
    /// settled transactions (ids only), and keys with concurrency-control state.
    pub txn_entries: usize,
    pub settled_entries: usize,
    pub cc_entries: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets_and_add_up() {
        let mut histogram = LatencyHistogram::default();
        for nanos in [0, 50_000, 50_001, 1_000_000, 10_000_000_000] {
            histogram.record(nanos);
        }
        let buckets = histogram.cumulative_buckets();
        assert_eq!(buckets.len(), BOUNDS + 1);
        assert_eq!(buckets[0], (0.00005, 2), "0 and exactly 50 µs");
        assert_eq!(buckets[1], (0.0001, 3));
        // 1 ms ≤ 50 µs × 2^5 = 1.6 ms.
        assert_eq!(buckets[5].1, 4);
        assert_eq!(buckets[BOUNDS - 1].1, 4, "10 s is above 1.6 s");
        assert_eq!(buckets[BOUNDS], (f64::INFINITY, 5));
        assert_eq!(histogram.count(), 5);
        assert!((histogram.sum_seconds() - 10.001100001).abs() < 1e-9);
    }
}
