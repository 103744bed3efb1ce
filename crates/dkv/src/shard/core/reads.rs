//! The read path of a primary: gets, batched gets and scans at a snapshot timestamp,
//! served only by the shard's primary at the caller's epoch, above the garbage-collection
//! watermark and under the read lease. A client that caches a key asks for a soft lease on
//! it (KAIROS), granted here from the key's write rate.

use bytes::Bytes;

use crate::messages::{Get, GetMany, ReadReply, RefusalKind, Response, Row, Scan, ScanReply};
use virga_storage::Timestamp;

use super::{DataCore, MAX_KEYS_PER_GET};
use crate::shard::wire;

impl DataCore {
    pub(super) fn on_get(&mut self, from: &str, get: Get) -> Response {
        if let Err(error) = wire::check_key(&get.key) {
            return Response::refused(RefusalKind::Invalid, format!("a malformed get: {error}"));
        }
        let ts = get.ts;
        if let Err(refusal) = self.check_read(get.shard, get.epoch, ts, std::slice::from_ref(&get.key)) {
            return refusal;
        }
        match self.read(from, get.shard, get.key, ts, get.read_interval_ns) {
            Some(value) => Response::Value(value),
            None => Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", get.shard)),
        }
    }

    pub(super) fn on_get_many(&mut self, from: &str, get: GetMany) -> Response {
        if get.keys.is_empty() || get.keys.len() > MAX_KEYS_PER_GET {
            return Response::refused(
                RefusalKind::Invalid,
                format!("a get_many of {} keys (1 to {MAX_KEYS_PER_GET} may be asked at once)", get.keys.len()),
            );
        }
        if let Some(error) = get.keys.iter().find_map(|key| wire::check_key(key).err()) {
            return Response::refused(RefusalKind::Invalid, format!("a malformed get_many: {error}"));
        }
        if !get.read_intervals_ns.is_empty() && get.read_intervals_ns.len() != get.keys.len() {
            return Response::refused(
                RefusalKind::Invalid,
                format!(
                    "a get_many of {} keys with {} read intervals (none, or one a key)",
                    get.keys.len(),
                    get.read_intervals_ns.len()
                ),
            );
        }
        let ts = get.ts;
        if let Err(refusal) = self.check_read(get.shard, get.epoch, ts, &get.keys) {
            return refusal;
        }
        let mut values = Vec::with_capacity(get.keys.len());
        let intervals = get.read_intervals_ns.into_iter().chain(std::iter::repeat(0));
        for (key, interval) in get.keys.into_iter().zip(intervals) {
            match self.read(from, get.shard, key, ts, interval) {
                Some(value) => values.push(value),
                None => {
                    return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", get.shard))
                }
            }
        }
        Response::Values(values)
    }

    /// Whether this node may serve reads of `keys` in `shard` at `ts`: it is the primary at
    /// `epoch`, the keys are the shard's, `ts` is above the watermark and under its lease.
    fn check_read(&mut self, shard: u32, epoch: u64, ts: Timestamp, keys: &[Bytes]) -> Result<(), Response> {
        self.primary_of(shard, epoch)?;
        if keys.iter().any(|key| self.map.shard_of(key).0 != shard) {
            return Err(Response::refused(RefusalKind::Invalid, format!("a key is not in shard {shard}")));
        }
        if let Some(refusal) = self.too_old(shard, ts) {
            self.stats.too_old += 1;
            return Err(refusal);
        }
        if !self.under_lease(shard, ts) {
            self.stats.lease_refusals += 1;
            return Err(Response::refused(
                RefusalKind::Unavailable,
                format!("the lease of shard {shard} does not cover {ts} yet; retry"),
            ));
        }
        Ok(())
    }

    /// The snapshot read of `key` at `ts` by `from` (None: no replica of the shard here),
    /// with a lease if a client caching the key asked (`read_interval_ns` > 0); under EI,
    /// `from` is remembered as holding a copy.
    fn read(&mut self, from: &str, shard: u32, key: Bytes, ts: Timestamp, read_interval_ns: u64) -> Option<ReadReply> {
        let replica = self.replicas.get_mut(&shard)?;
        self.stats.gets += 1;
        let mut lease_end_ns = self.grants.grant(&key, read_interval_ns, self.now);
        if lease_end_ns > 0 && self.grants.mode() == crate::kairos::CacheMode::Ei && !self.grants.share(&key, from) {
            lease_end_ns = 0;
        }
        let found = replica.get(&key, ts);
        Some(ReadReply {
            value: found.value,
            version: found.version,
            writer: found.writer,
            prepared_below: found.prepared_below,
            lease_end_ns,
        })
    }

    pub(super) fn on_scan(&mut self, scan: Scan) -> Response {
        let range = scan.range;
        if let Err(refusal) = self.primary_of(scan.shard, scan.epoch) {
            return refusal;
        }
        if let Some(refusal) = self.too_old(scan.shard, range.ts) {
            self.stats.too_old += 1;
            return refusal;
        }
        if !self.under_lease(scan.shard, range.ts) {
            self.stats.lease_refusals += 1;
            return Response::refused(
                RefusalKind::Unavailable,
                format!("the lease of shard {} does not cover {} yet; retry", scan.shard, range.ts),
            );
        }
        let Some(replica) = self.replicas.get_mut(&scan.shard) else {
            return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", scan.shard));
        };
        self.stats.scans += 1;
        let limit = (scan.limit as usize).clamp(1, wire::MAX_OPS_PER_SHARD);
        let found = replica.scan(range, limit);
        Response::Rows(ScanReply {
            rows: found
                .rows
                .into_iter()
                .map(|(key, version)| Row {
                    key,
                    value: version.value.unwrap_or_default(),
                    version: version.ts,
                    writer: version.writer,
                })
                .collect(),
            prepared_below: found.prepared_below,
        })
    }
}
