//! The interface every storage engine implements: versions of keys at timestamps, with no
//! notion of transactions. Concurrency control (who may install what, and when) lives above
//! it, in `virga-txn`.

use std::ops::Bound;

use bytes::Bytes;

use crate::mvcc::{Timestamp, Version};

/// What a read at a timestamp found on one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadAt {
    /// The youngest version at or below the read timestamp (a tombstone included), if any.
    pub visible: Option<Version>,
    /// Timestamp of the key's newest version, [`Timestamp::ZERO`] when it has none.
    pub newest: Timestamp,
}

/// The newest version of a key, without its value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Newest {
    /// Its timestamp; [`Timestamp::ZERO`] when the key has no version.
    pub ts: Timestamp,
    /// Whether it holds a value (false for a tombstone or no version at all).
    pub live: bool,
}

/// An install that would not have been the key's newest version: the store keeps each
/// key's versions in strictly increasing timestamp order and refuses to break it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("version at {attempted} refused: the key already has a version at {newest}")]
pub struct InstallRefused {
    /// The timestamp of the refused version.
    pub attempted: Timestamp,
    /// The key's newest version's timestamp, at or after `attempted`.
    pub newest: Timestamp,
}

/// What a garbage-collection pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Keys visited.
    pub keys: u64,
    /// Versions dropped.
    pub versions_dropped: u64,
}

/// What a store holds, as it reports about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreReport {
    /// Keys with an entry (including deleted ones and ones only ever looked up).
    pub keys: u64,
    /// Versions held, tombstones included.
    pub versions: u64,
    /// Bytes of keys and values held (each key once, each version's value).
    pub bytes: u64,
    /// Versions dropped by garbage collection since the store was created.
    pub versions_dropped: u64,
}

/// A multi-version key-value store: each key has versions `<timestamp, writer, value or
/// tombstone>` in strictly increasing timestamp order, readable at any timestamp the
/// garbage-collection watermark has not passed.
///
/// Operations go through an [`Entry`](VersionedStore::Entry), a handle on one key that the
/// caller may keep so that later operations on the key skip the lookup (a transaction reads
/// a key, then validates and installs on it). The key-addressed operations
/// ([`get_at`](VersionedStore::get_at), [`put`](VersionedStore::put),
/// [`scan_at`](VersionedStore::scan_at)) are built on them.
///
/// Contract, checked by the model test in `mvcc.rs` for [`crate::MvStore`]:
/// - `read_at(e, ts).visible` is the version with the largest timestamp `<= ts` among those
///   installed on the key, as long as `ts` is at or above every watermark passed to `gc` or
///   `install` so far;
/// - `install` refuses (and changes nothing) a version not newer than the key's newest;
/// - garbage collection at `w` keeps every version above `w` and the youngest at or below
///   it, so reads at timestamps `>= w` are unchanged;
/// - `visit_range` visits every key that has had a version installed before the call began,
///   in key order.
pub trait VersionedStore: Send + Sync {
    /// A handle on one key's versions.
    type Entry: Clone + Send + Sync;

    /// The entry of `key`, created empty when missing.
    fn entry(&self, key: &[u8]) -> Self::Entry;
    /// The entry of `key` if it has one.
    fn find(&self, key: &[u8]) -> Option<Self::Entry>;
    /// The visible version at `ts` and the newest version's timestamp.
    fn read_at(&self, entry: &Self::Entry, ts: Timestamp) -> ReadAt;
    /// The newest version's timestamp and whether it is live.
    fn newest(&self, entry: &Self::Entry) -> Newest;
    /// Adds `version` as the key's newest, then may drop versions no reader at or above
    /// `watermark` can see. Refused when `version.ts` is not above the newest version's.
    fn install(&self, entry: &Self::Entry, version: Version, watermark: Timestamp) -> Result<(), InstallRefused>;
    /// Replaces the key's whole history with `version` (initial load, recovery).
    fn reset(&self, entry: &Self::Entry, version: Version);
    /// Calls `visit` with each key in `(start, end)` and its entry, in key order, until it
    /// returns false. Keys that never held a version may be visited too.
    fn visit_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: &mut dyn FnMut(&Bytes, &Self::Entry) -> bool);
    /// Drops, on every key, the versions no reader at or above `watermark` can see.
    fn gc(&self, watermark: Timestamp) -> GcStats;
    /// Keys, versions and bytes held.
    fn report(&self) -> StoreReport;

    /// The value of `key` as of `ts`: `None` if no version is visible or it is a tombstone.
    fn get_at(&self, key: &[u8], ts: Timestamp) -> Option<Bytes> {
        let entry = self.find(key)?;
        self.read_at(&entry, ts).visible.and_then(|v| v.value)
    }

    /// Installs `version` on `key` outside any transaction, collecting nothing.
    fn put(&self, key: &[u8], version: Version) -> Result<(), InstallRefused> {
        self.install(&self.entry(key), version, Timestamp::ZERO)
    }

    /// Live pairs with keys in `(start, end)` as of `ts`, in key order, at most `limit`.
    fn scan_at(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, ts: Timestamp, limit: usize) -> Vec<(Bytes, Bytes)> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.visit_range(start, end, &mut |key, entry| {
            if let Some(value) = self.read_at(entry, ts).visible.and_then(|v| v.value) {
                out.push((key.clone(), value));
            }
            out.len() < limit
        });
        out
    }
}
