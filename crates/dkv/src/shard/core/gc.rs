//! Version garbage collection from the clients' watermarks (SEMEL §3.2, after Centiman):
//! each client tells the primaries, periodically, a timestamp below which it will read no
//! more; the minimum over the clients heard from recently is the watermark. Versions no read
//! at or above it can see are dropped (on every install, and by a full pass now and then),
//! and a read below it is refused as too old. A client silent for `client_expiry` no longer
//! holds the watermark back; if it comes back, its old reads are refused and it runs them
//! again at a newer timestamp.
//!
//! The watermark never rises above `snapshot_window` behind the primary's clock, so a
//! read-only snapshot that young is always served, whatever the clients report.

use std::collections::BTreeMap;

use crate::messages::{Response, TooOld, Watermark};
use virga_net::role::Nanos;
use virga_storage::Timestamp;

use super::DataCore;

#[derive(Debug, Default)]
pub(super) struct Watermarks {
    /// Per client: its watermark and when it was last heard.
    clients: BTreeMap<u32, (Timestamp, Nanos)>,
    last_pass: Nanos,
    /// Per shard: when this node began to lead it. Its watermark rises only `client_expiry`
    /// later, once every live client has had the time to report.
    leading_since: BTreeMap<u32, Nanos>,
}

impl Watermarks {
    /// A client's report: it reads no more below `ts` (a report lower than one before it
    /// does not lower its watermark).
    pub(super) fn heard(&mut self, client: u32, ts: Timestamp, now: Nanos) {
        let entry = self.clients.entry(client).or_insert((ts, now));
        *entry = (entry.0.max(ts), now);
    }

    /// The minimum over the clients heard from within `expiry` (ZERO if none).
    pub(super) fn watermark(&self, now: Nanos, expiry: Nanos) -> Timestamp {
        self.clients
            .values()
            .filter(|(_, heard)| now.saturating_sub(*heard) < expiry)
            .map(|(ts, _)| *ts)
            .min()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Whether a full pass is due, `every` after the last one (which it then is).
    pub(super) fn full_pass_due(&mut self, now: Nanos, every: Nanos) -> bool {
        let due = now.saturating_sub(self.last_pass) >= every;
        if due {
            self.last_pass = now;
        }
        due
    }

    /// Of the shards this node leads now (`led`), those it has led for `expiry` at least:
    /// their watermark may rise. A shard it stopped leading starts over.
    pub(super) fn raisable(&mut self, led: &[u32], now: Nanos, expiry: Nanos) -> Vec<u32> {
        self.leading_since.retain(|shard, _| led.contains(shard));
        led.iter()
            .copied()
            .filter(|shard| now.saturating_sub(*self.leading_since.entry(*shard).or_insert(now)) >= expiry)
            .collect()
    }
}

impl DataCore {
    pub(super) fn on_watermark(&mut self, now: Nanos, watermark: Watermark) -> Response {
        self.watermarks.heard(watermark.client, watermark.ts, now);
        Response::Ack
    }

    /// Every check: raise the watermark of the shards this node leads; collect now and then.
    pub(super) fn collect_garbage(&mut self, now: Nanos) {
        let expiry = self.config.client_expiry.as_nanos() as u64;
        let window_start = Timestamp::new(now.saturating_sub(self.config.snapshot_window.as_nanos() as u64), 0);
        let watermark = self.watermarks.watermark(now, expiry).min(window_start);
        let full_pass = self.watermarks.full_pass_due(now, self.config.collect_every.as_nanos() as u64);
        let led: Vec<u32> = self
            .map
            .groups()
            .iter()
            .enumerate()
            .filter(|(_, group)| group.primary == self.config.node)
            .map(|(shard, _)| shard as u32)
            .collect();
        for shard in self.watermarks.raisable(&led, now, expiry) {
            if self.takeovers.is_taking(shard) {
                continue;
            }
            if let Some(replica) = self.replicas.get_mut(&shard) {
                replica.raise_watermark(watermark);
            }
        }
        if full_pass {
            // Backups too: their watermark is the one their primary's lease requests carry.
            for replica in self.replicas.values_mut() {
                self.stats.versions_collected += replica.collect();
            }
        }
    }

    /// A read below the shard's watermark, refused.
    pub(super) fn too_old(&self, shard: u32, ts: Timestamp) -> Option<Response> {
        let watermark = self.replicas.get(&shard)?.watermark();
        let window_ms = self.config.snapshot_window.as_millis() as u64;
        (ts < watermark).then_some(Response::TooOld(TooOld { watermark, window_ms }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPIRY: Nanos = 1_000;

    #[test]
    fn the_watermark_is_the_lowest_report_of_the_clients_heard_from_lately() {
        let mut marks = Watermarks::default();
        assert_eq!(marks.watermark(0, EXPIRY), Timestamp::ZERO, "no client: nothing may be collected");
        marks.heard(1, Timestamp::new(50, 0), 0);
        marks.heard(2, Timestamp::new(30, 0), 400);
        assert_eq!(marks.watermark(500, EXPIRY), Timestamp::new(30, 0));
        marks.heard(2, Timestamp::new(20, 0), 600);
        assert_eq!(marks.watermark(700, EXPIRY), Timestamp::new(30, 0), "a lower report lowers nothing");
        assert_eq!(marks.watermark(1_200, EXPIRY), Timestamp::new(30, 0), "client 1 is silent past its expiry");
        marks.heard(2, Timestamp::new(90, 0), 1_300);
        assert_eq!(marks.watermark(1_400, EXPIRY), Timestamp::new(90, 0));
        assert_eq!(marks.watermark(2_400, EXPIRY), Timestamp::ZERO, "everyone silent");
    }

    #[test]
    fn a_shard_led_again_waits_an_expiry_before_its_watermark_rises() {
        let mut marks = Watermarks::default();
        assert!(marks.raisable(&[0, 1], 0, EXPIRY).is_empty(), "just started leading");
        assert_eq!(marks.raisable(&[0, 1], EXPIRY, EXPIRY), vec![0, 1]);
        assert_eq!(marks.raisable(&[1], EXPIRY + 1, EXPIRY), vec![1], "shard 0 is led no more");
        assert!(marks.raisable(&[0, 1], EXPIRY + 2, EXPIRY).contains(&1));
        assert!(!marks.raisable(&[0, 1], EXPIRY + 3, EXPIRY).contains(&0), "shard 0 starts over");
    }

    #[test]
    fn a_full_pass_comes_once_per_interval() {
        let mut marks = Watermarks::default();
        assert!(!marks.full_pass_due(10, 100));
        assert!(marks.full_pass_due(100, 100));
        assert!(!marks.full_pass_due(150, 100));
        assert!(marks.full_pass_due(200, 100));
    }
}
