//! Version garbage collection from the clients' watermarks (SEMEL §3.2, after Centiman):
//! each client tells the primaries, periodically, a timestamp below which it will read no
//! more; the minimum over the clients heard from recently is the watermark. Versions no read
//! at or above it can see are dropped (on every install, and by a full pass now and then),
//! and a read below it is refused as too old. A client silent for `client_expiry` no longer
//! holds the watermark back; if it comes back, its old reads are refused and it runs them
//! again at a newer timestamp.

use std::collections::BTreeMap;

use crate::messages::{Response, Watermark};
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

impl DataCore {
    pub(super) fn on_watermark(&mut self, now: Nanos, watermark: Watermark) -> Response {
        let ts = watermark.ts;
        let entry = self.watermarks.clients.entry(watermark.client).or_insert((ts, now));
        *entry = (entry.0.max(ts), now);
        Response::Ack
    }

    /// The minimum over the clients heard from within `client_expiry` (ZERO if none).
    fn watermark(&self, now: Nanos) -> Timestamp {
        let expiry = self.config.client_expiry.as_nanos() as u64;
        self.watermarks
            .clients
            .values()
            .filter(|(_, heard)| now.saturating_sub(*heard) < expiry)
            .map(|(ts, _)| *ts)
            .min()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Every check: raise the watermark of the shards this node leads; collect now and then.
    pub(super) fn collect_garbage(&mut self, now: Nanos) {
        let watermark = self.watermark(now);
        let full_pass = now.saturating_sub(self.watermarks.last_pass) >= self.config.collect_every.as_nanos() as u64;
        if full_pass {
            self.watermarks.last_pass = now;
        }
        let led: Vec<u32> = self
            .map
            .groups()
            .iter()
            .enumerate()
            .filter(|(_, group)| group.primary == self.config.node)
            .map(|(shard, _)| shard as u32)
            .collect();
        let expiry = self.config.client_expiry.as_nanos() as u64;
        self.watermarks.leading_since.retain(|shard, _| led.contains(shard));
        for shard in led {
            let since = *self.watermarks.leading_since.entry(shard).or_insert(now);
            if now.saturating_sub(since) < expiry || self.takeovers.contains_key(&shard) {
                continue;
            }
            if let Some(replica) = self.replicas.get_mut(&shard) {
                replica.raise_watermark(watermark);
                if full_pass {
                    self.stats.versions_collected += replica.collect();
                }
            }
        }
    }

    /// A read below the shard's watermark, refused.
    pub(super) fn too_old(&self, shard: u32, ts: Timestamp) -> Option<Response> {
        let watermark = self.replicas.get(&shard)?.watermark();
        (ts < watermark).then_some(Response::TooOld(watermark))
    }
}
