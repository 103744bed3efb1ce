//! The multi-version store: per-key version chains, point and range reads at a timestamp,
//! and watermark garbage collection.

use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;
use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::key::{InlineKey, KeyHasher};
use crate::store::{GcStats, InstallRefused, Newest, ReadAt, StoreReport, VersionedStore};

/// Identifies a transaction (unique per engine run; 0 is the initial load).
pub type TxnId = u64;

/// A version timestamp `<time, client>`: `time` orders versions, `client` breaks ties so the
/// order is total (SEMEL's version number). What `time` counts depends on the timestamp
/// scheme above (nanoseconds of a client's clock, a hybrid clock value, a DST scalar).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// The ordering component.
    pub time: u64,
    /// The client that issued the timestamp.
    pub client: u32,
}

impl Timestamp {
    /// Below every timestamp a transaction can get: the version of loaded and recovered data.
    pub const ZERO: Timestamp = Timestamp { time: 0, client: 0 };
    /// Above every timestamp.
    pub const MAX: Timestamp = Timestamp { time: u64::MAX, client: u32::MAX };

    /// A timestamp of `client` at `time`.
    pub const fn new(time: u64, client: u32) -> Timestamp {
        Timestamp { time, client }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.time, self.client)
    }
}

/// One committed version of a key. `value == None` is a delete (a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Commit timestamp of the writer.
    pub ts: Timestamp,
    /// The transaction that wrote it.
    pub writer: TxnId,
    /// The value, or `None` for a delete.
    pub value: Option<Bytes>,
}

/// One key's versions, newest (largest timestamp) first, and the attachment of the layer
/// above, protected by the key's latch.
#[derive(Debug, Default)]
pub struct Chain<A = ()> {
    /// Committed versions, newest first.
    pub versions: SmallVec<[Version; 2]>,
    /// Versions garbage collection dropped from this key while installing: counted here,
    /// under the latch already held, rather than in a counter every writer would share.
    dropped: u64,
    /// What the layer above keeps with this key (created with the entry, never read by the
    /// store). `virga-txn` keeps its concurrency-control state here, under the same latch
    /// as the versions, so checking it against the newest version takes one latch.
    pub attached: A,
}

impl<A> Chain<A> {
    /// The newest committed version.
    pub fn latest(&self) -> Option<&Version> {
        self.versions.first()
    }

    /// Timestamp of the newest committed version, [`Timestamp::ZERO`] for a key never written.
    pub fn latest_ts(&self) -> Timestamp {
        self.versions.first().map_or(Timestamp::ZERO, |v| v.ts)
    }

    /// The youngest version with timestamp `<= ts`.
    pub fn visible_at(&self, ts: Timestamp) -> Option<&Version> {
        self.versions.iter().find(|v| v.ts <= ts)
    }

    /// Whether the key has no live value as of its newest version (never written, or deleted).
    pub fn is_absent(&self) -> bool {
        self.versions.first().is_none_or(|v| v.value.is_none())
    }

    /// Adds `version` as the newest one and collects versions no reader at or above
    /// `watermark` can see. A version not newer than the newest is refused (handed back)
    /// rather than corrupting the order.
    pub fn install(&mut self, version: Version, watermark: Timestamp) -> Result<usize, Version> {
        if !self.versions.is_empty() && version.ts <= self.latest_ts() {
            return Err(version);
        }
        self.versions.insert(0, version);
        let dropped = self.collect(watermark);
        self.dropped += dropped as u64;
        Ok(dropped)
    }

    /// Drops every version older than the youngest one at or below `watermark`; returns how
    /// many were dropped. A reader at any timestamp `>= watermark` sees the same value before
    /// and after.
    pub fn collect(&mut self, watermark: Timestamp) -> usize {
        match self.versions.iter().position(|v| v.ts <= watermark) {
            Some(keep) if keep + 1 < self.versions.len() => {
                let dropped = self.versions.len() - keep - 1;
                self.versions.truncate(keep + 1);
                dropped
            }
            _ => 0,
        }
    }
}

/// A key and its latch-protected version chain (with the attachment of the layer above).
#[derive(Debug)]
pub struct KeyState<A = ()> {
    key: Bytes,
    chain: Mutex<Chain<A>>,
}

impl<A: Default> KeyState<A> {
    fn new(key: Bytes) -> KeyState<A> {
        KeyState { key, chain: Mutex::new(Chain::default()) }
    }
}

impl<A> KeyState<A> {
    /// The key.
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// Takes the key's latch. Hold it only for a few instructions: never across I/O.
    pub fn lock(&self) -> MutexGuard<'_, Chain<A>> {
        self.chain.lock()
    }
}

/// The multi-version store. Point lookups go through a concurrent hash index; range scans
/// through an ordered skip list holding the same entries. Entries are never removed, so an
/// `Arc<KeyState>` obtained once stays the key's state for the life of the store.
///
/// Each entry carries an attachment `A` (default `()`), an opaque per-key value the layer
/// above may keep next to the versions; the store only creates it (`A::default()`).
pub struct MvStore<A = ()> {
    index: DashMap<InlineKey, Arc<KeyState<A>>, KeyHasher>,
    ordered: SkipMap<Bytes, Arc<KeyState<A>>>,
}

impl<A: Default + Send + Sync + 'static> Default for MvStore<A> {
    fn default() -> Self {
        MvStore::with_attachments()
    }
}

impl<A: Default + Send + Sync + 'static> fmt::Debug for MvStore<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MvStore").field("keys", &self.len()).finish()
    }
}

impl MvStore {
    /// An empty store without attachments.
    pub fn new() -> MvStore {
        MvStore::with_attachments()
    }
}

impl<A: Default + Send + Sync + 'static> MvStore<A> {
    /// An empty store whose entries each carry an `A`.
    pub fn with_attachments() -> MvStore<A> {
        MvStore { index: DashMap::with_hasher_and_shard_amount(KeyHasher::default(), 256), ordered: SkipMap::new() }
    }

    /// Number of keys with an entry (including deleted ones and ones only ever looked up).
    pub fn len(&self) -> usize {
        self.ordered.len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    /// The state of `key`, if it has an entry.
    pub fn key(&self, key: &[u8]) -> Option<Arc<KeyState<A>>> {
        self.index.get(&InlineKey::new(key)).map(|entry| Arc::clone(entry.value()))
    }

    /// Runs `use_key` on `key`'s state (created empty when missing) while the index holds
    /// it, without taking a counted reference: the cheapest way to use a key once.
    /// `use_key` must be short and must not touch the index.
    #[inline]
    pub fn with_key<R>(&self, key: &[u8], use_key: impl FnOnce(&Arc<KeyState<A>>) -> R) -> R {
        if let Some(entry) = self.index.get(&InlineKey::new(key)) {
            return use_key(entry.value());
        }
        use_key(&self.key_or_insert(key))
    }

    /// The state of `key`, created empty when missing.
    pub fn key_or_insert(&self, key: &[u8]) -> Arc<KeyState<A>> {
        if let Some(state) = self.key(key) {
            return state;
        }
        // Published to the ordered index first: whoever finds the entry through the hash
        // index (and may install a version on it) finds it in the ordered index too, so a
        // scan never misses a key with a committed version. Concurrent creators agree on
        // the skip list's entry.
        let ordered = self
            .ordered
            .get_or_insert_with(Bytes::copy_from_slice(key), || Arc::new(KeyState::new(Bytes::copy_from_slice(key))));
        let state = Arc::clone(ordered.value());
        Arc::clone(self.index.entry(InlineKey::new(key)).or_insert(state).value())
    }

    /// Calls `visit` on every key entry in `(start, end)` in key order until it returns false.
    pub fn for_each_in(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        mut visit: impl FnMut(&Arc<KeyState<A>>) -> bool,
    ) {
        let range = (start.map(Bytes::copy_from_slice), end.map(Bytes::copy_from_slice));
        for entry in self.ordered.range(range) {
            if !visit(entry.value()) {
                break;
            }
        }
    }

    /// Calls `visit` on every key entry in key order.
    pub fn for_each(&self, mut visit: impl FnMut(&Arc<KeyState<A>>)) {
        for entry in self.ordered.iter() {
            visit(entry.value());
        }
    }
}

impl<A: Default + Send + Sync + 'static> VersionedStore for MvStore<A> {
    type Entry = Arc<KeyState<A>>;

    fn entry(&self, key: &[u8]) -> Arc<KeyState<A>> {
        self.key_or_insert(key)
    }

    fn find(&self, key: &[u8]) -> Option<Arc<KeyState<A>>> {
        self.key(key)
    }

    #[inline]
    fn read_at(&self, entry: &Arc<KeyState<A>>, ts: Timestamp) -> ReadAt {
        let chain = entry.lock();
        ReadAt { visible: chain.visible_at(ts).cloned(), newest: chain.latest_ts() }
    }

    #[inline]
    fn newest(&self, entry: &Arc<KeyState<A>>) -> Newest {
        let chain = entry.lock();
        Newest { ts: chain.latest_ts(), live: !chain.is_absent() }
    }

    #[inline]
    fn install(&self, entry: &Arc<KeyState<A>>, version: Version, watermark: Timestamp) -> Result<(), InstallRefused> {
        let mut chain = entry.lock();
        match chain.install(version, watermark) {
            Ok(_) => Ok(()),
            Err(refused) => Err(InstallRefused { attempted: refused.ts, newest: chain.latest_ts() }),
        }
    }

    fn reset(&self, entry: &Arc<KeyState<A>>, version: Version) {
        let mut chain = entry.lock();
        chain.versions.clear();
        chain.versions.push(version);
    }

    fn visit_range(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        visit: &mut dyn FnMut(&Bytes, &Arc<KeyState<A>>) -> bool,
    ) {
        self.for_each_in(start, end, |state| visit(state.key(), state));
    }

    fn gc(&self, watermark: Timestamp) -> GcStats {
        let mut stats = GcStats::default();
        self.for_each(|state| {
            let mut chain = state.lock();
            let dropped = chain.collect(watermark);
            chain.dropped += dropped as u64;
            stats.keys += 1;
            stats.versions_dropped += dropped as u64;
        });
        stats
    }

    fn report(&self) -> StoreReport {
        let mut report = StoreReport::default();
        self.for_each(|state| {
            let chain = state.lock();
            report.keys += 1;
            report.versions += chain.versions.len() as u64;
            report.versions_dropped += chain.dropped;
            report.bytes += state.key().len() as u64
                + chain.versions.iter().map(|v| v.value.as_ref().map_or(0, |b| b.len() as u64)).sum::<u64>();
        });
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ts(time: u64) -> Timestamp {
        Timestamp::new(time, 1)
    }

    fn val(n: u64) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(&n.to_le_bytes()))
    }

    #[test]
    fn reads_see_the_youngest_version_at_or_below_their_timestamp() {
        let store = MvStore::new();
        store.put(b"k", Version { ts: ts(10), writer: 1, value: val(1) }).unwrap();
        store.put(b"k", Version { ts: ts(20), writer: 2, value: None }).unwrap();
        store.put(b"k", Version { ts: ts(30), writer: 3, value: val(3) }).unwrap();
        assert_eq!(store.get_at(b"k", ts(9)), None);
        assert_eq!(store.get_at(b"k", ts(10)), val(1));
        assert_eq!(store.get_at(b"k", ts(25)), None, "a delete hides older versions");
        assert_eq!(store.get_at(b"k", ts(31)), val(3));
        assert_eq!(store.get_at(b"other", ts(31)), None);
        let chain: Vec<_> = store.key(b"k").unwrap().lock().versions.iter().map(|v| v.writer).collect();
        assert_eq!(chain, [3, 2, 1], "newest first");
    }

    #[test]
    fn out_of_order_install_is_refused() {
        let store = MvStore::new();
        store.put(b"k", Version { ts: ts(10), writer: 1, value: val(1) }).unwrap();
        assert!(store.put(b"k", Version { ts: ts(10), writer: 2, value: val(2) }).is_err());
        assert!(store.put(b"k", Version { ts: ts(5), writer: 2, value: val(2) }).is_err());
        assert_eq!(store.get_at(b"k", Timestamp::MAX), val(1));
    }

    #[test]
    fn scans_return_live_pairs_in_key_order_at_the_timestamp() {
        let store = MvStore::new();
        for k in 0u8..10 {
            store.put(&[k], Version { ts: ts(10), writer: 1, value: val(k as u64) }).unwrap();
        }
        store.put(&[3], Version { ts: ts(20), writer: 2, value: None }).unwrap();
        store.put(&[4], Version { ts: ts(20), writer: 2, value: val(44) }).unwrap();
        let keys = |pairs: Vec<(Bytes, Bytes)>| pairs.into_iter().map(|(k, _)| k[0]).collect::<Vec<_>>();
        assert_eq!(keys(store.scan_at(Bound::Included(&[2]), Bound::Excluded(&[6]), ts(15), 100)), [2, 3, 4, 5]);
        assert_eq!(keys(store.scan_at(Bound::Included(&[2]), Bound::Excluded(&[6]), ts(25), 100)), [2, 4, 5]);
        assert_eq!(keys(store.scan_at(Bound::Unbounded, Bound::Unbounded, ts(25), 3)), [0, 1, 2]);
        let at25 = store.scan_at(Bound::Included(&[4]), Bound::Included(&[4]), ts(25), 10);
        assert_eq!(at25[0].1, val(44).unwrap());
    }

    #[test]
    fn concurrent_creators_share_one_entry() {
        let store = Arc::new(MvStore::new());
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    (0..10_000u32).map(|i| store.key_or_insert(&i.to_be_bytes())).collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (a, b) in results[0].iter().zip(&results[1]) {
            assert!(Arc::ptr_eq(a, b));
        }
        assert_eq!(store.len(), 10_000);
        let mut seen = 0;
        store.for_each(|_| seen += 1);
        assert_eq!(seen, 10_000);
    }

    /// One key's history: (time, value or delete), strictly increasing times.
    fn history() -> impl Strategy<Value = Vec<(u64, Option<u64>)>> {
        proptest::collection::vec((1u64..8, proptest::option::weighted(0.8, 0u64..100)), 0..12).prop_map(|steps| {
            let mut time = 0;
            steps
                .into_iter()
                .map(|(gap, value)| {
                    time += gap;
                    (time, value)
                })
                .collect()
        })
    }

    proptest! {
        /// Garbage collection at a watermark never changes what a snapshot at or above the
        /// watermark reads, and leaves at most one version at or below it per key.
        #[test]
        fn gc_keeps_everything_a_live_snapshot_can_read(
            histories in proptest::collection::vec(history(), 1..8),
            live in proptest::collection::vec(0u64..100, 1..6),
            extra_reads in proptest::collection::vec(0u64..120, 0..6),
        ) {
            let store = MvStore::new();
            let mut oracle: BTreeMap<(usize, u64), Option<u64>> = BTreeMap::new();
            for (k, history) in histories.iter().enumerate() {
                for &(time, value) in history {
                    store.put(&[k as u8], Version { ts: ts(time), writer: time, value: value.and_then(val) }).unwrap();
                    oracle.insert((k, time), value);
                }
            }
            // The watermark is the oldest live snapshot; later snapshots read above it.
            let watermark = *live.iter().min().unwrap();
            let readers: Vec<u64> = live.iter().copied().chain(extra_reads.iter().map(|r| r.max(&watermark)).copied()).collect();
            let before: Vec<Vec<Option<Bytes>>> = (0..histories.len())
                .map(|k| readers.iter().map(|&r| store.get_at(&[k as u8], ts(r))).collect())
                .collect();
            store.gc(ts(watermark));
            for (k, expected) in before.iter().enumerate() {
                for (i, &r) in readers.iter().enumerate() {
                    prop_assert_eq!(&store.get_at(&[k as u8], ts(r)), &expected[i], "key {} at {}", k, r);
                    // And the value is the oracle's youngest version at or below r.
                    let want = oracle.range((k, 0)..=(k, r)).next_back().and_then(|(_, v)| v.and_then(val));
                    prop_assert_eq!(&expected[i], &want);
                }
                if let Some(state) = store.key(&[k as u8]) {
                    let inner = state.lock();
                    prop_assert!(inner.versions.iter().filter(|v| v.ts <= ts(watermark)).count() <= 1);
                    prop_assert!(inner.versions.windows(2).all(|w| w[0].ts > w[1].ts), "newest first");
                }
            }
        }
    }
}
