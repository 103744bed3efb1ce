//! Range reads: a scan at a timestamp, and what keeps scans serializable. A scanned range is
//! remembered with its timestamp, as a key's latest read is: a write into the range at or
//! below it aborts. At prepare, the scanning transaction's ranges are checked again: a key
//! that changed or appeared in a range above the scan's timestamp (a phantom), or a writer
//! prepared in it, aborts the transaction.

use std::ops::Bound;

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId, Version, VersionedStore};
use virga_txn::AbortReason;

use super::ShardReplica;

/// A range a transaction scanned: `[start, end)` (`end` None: unbounded) at `ts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRange {
    pub start: Bytes,
    pub end: Option<Bytes>,
    pub ts: Timestamp,
}

impl ScanRange {
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_ref() && self.end.as_ref().is_none_or(|end| key < end.as_ref())
    }

    fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let end = match &self.end {
            Some(end) => Bound::Excluded(end.as_ref()),
            None => Bound::Unbounded,
        };
        (Bound::Included(self.start.as_ref()), end)
    }
}

/// What a scan found: the live keys with their visible versions, in key order, and whether a
/// writer is prepared in the range at or below the scan's timestamp.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanResult {
    pub rows: Vec<(Bytes, Version)>,
    pub prepared_below: bool,
}

impl<S: VersionedStore> ShardReplica<S> {
    /// The live keys of `range` as of `range.ts`, at most `limit`; the range is remembered
    /// as read at its timestamp.
    pub fn scan(&mut self, range: ScanRange, limit: usize) -> ScanResult {
        let mut rows = Vec::new();
        let (start, end) = range.bounds();
        let store = &self.store;
        store.visit_range(start, end, &mut |key, entry| {
            if let Some(version) = store.read_at(entry, range.ts).visible.filter(|version| version.value.is_some()) {
                rows.push((key.clone(), version));
            }
            rows.len() < limit
        });
        let prepared_below = self.held_in(&range).any(|cc| cc.prepared_at_or_below(range.ts));
        self.remember_range(range);
        ScanResult { rows, prepared_below }
    }

    /// The state of the keys in `range` a prepared transaction holds.
    fn held_in<'a>(&'a self, range: &'a ScanRange) -> impl Iterator<Item = &'a super::KeyCc> + 'a {
        // An empty range (its end at or below its start) holds nothing; `BTreeSet::range`
        // would panic on one that ends before it starts.
        let empty = range.end.as_ref().is_some_and(|end| end <= &range.start);
        let keys = if empty { None } else { Some(self.held.range::<[u8], _>(range.bounds())) };
        keys.into_iter().flatten().filter_map(|key| self.cc.get(key))
    }

    /// Remembers `range` as read up to its timestamp.
    pub(super) fn remember_range(&mut self, range: ScanRange) {
        if let Some(known) =
            self.range_reads.iter_mut().find(|known| known.start == range.start && known.end == range.end)
        {
            known.ts = known.ts.max(range.ts);
        } else {
            self.range_reads.push(range);
        }
    }

    /// Whether a write of `key` at `commit_ts` falls in a range read at or above it.
    pub(super) fn under_range_read(&self, key: &[u8], commit_ts: Timestamp) -> bool {
        self.range_reads.iter().any(|range| range.ts >= commit_ts && range.contains(key))
    }

    /// Forgets ranges read below the watermark: every later commit timestamp is above it.
    pub(super) fn forget_ranges_below(&mut self, watermark: Timestamp) {
        self.range_reads.retain(|range| range.ts >= watermark);
    }

    /// A scanning transaction's ranges at prepare: unchanged since its scans, except by
    /// itself.
    pub(super) fn validate_scans(&self, txn: TxnId, scans: &[ScanRange]) -> Result<(), AbortReason> {
        for range in scans {
            let mut outcome = Ok(());
            let (start, end) = range.bounds();
            self.store.visit_range(start, end, &mut |_, entry| {
                if self.store.newest(entry).ts > range.ts {
                    outcome = Err(AbortReason::Phantom);
                }
                outcome.is_ok()
            });
            outcome?;
            let held = self.held_in(range).any(|cc| cc.held_by_other(txn));
            if held {
                return Err(AbortReason::ReadPrepared);
            }
        }
        Ok(())
    }
}
