//! Concurrency-control state per key, defined and used by the engine rather than the
//! store: MILANA's `latestRead` (DST's tuple timestamp), the writer holding the key between
//! validation and install (OCC's prepared mark, 2PL's exclusive lock), and 2PL's shared-lock
//! count.
//!
//! Every access to a key's state goes through its latch ([`TxnStore::lock`]), and every
//! install happens with the latch held, so reading the newest version under the latch is
//! atomic with respect to installs: validation and the raise of `latestRead` happen in one
//! critical section, as MILANA requires.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard};
use std::ops::Bound;

use virga_storage::{
    Chain, GcStats, InlineKey, InstallRefused, KeyHasher, KeyState, MvStore, Newest, ReadAt, StoreReport, Timestamp,
    TxnId, Version, VersionedStore,
};

use crate::abort::AbortReason;

/// A writer that holds a key between validation and installation (OCC's prepared mark) or
/// for its whole life (two-phase locking's exclusive lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// The holder.
    pub(crate) owner: TxnId,
    /// Its commit timestamp when already chosen, [`Timestamp::MAX`] when not yet.
    pub(crate) ts: Timestamp,
}

/// One key's concurrency-control state. Opaque outside this crate; stores keep it for the
/// engine ([`TxnStore`]).
#[derive(Debug, Default)]
pub struct CcState {
    /// The largest timestamp at which any transaction read this key (MILANA's
    /// `ts_latestRead`; with DST, the read part of the tuple timestamp).
    pub(crate) latest_read: Timestamp,
    /// The writer currently holding the key, if any.
    pub(crate) prepared: Option<Prepared>,
    /// Number of shared (read) locks held under two-phase locking.
    pub(crate) readers: u32,
}

impl CcState {
    /// Whether a transaction other than `me` holds the key.
    pub(crate) fn held_by_other(&self, me: TxnId) -> bool {
        self.prepared.is_some_and(|p| p.owner != me)
    }
}

/// A key's latch, held: its concurrency-control state and its versions, consistent with
/// each other until the guard is dropped. Every install happens through one, so validation
/// that reads the newest version through one sees the key either still prepared or
/// already installed.
pub trait LockedKey {
    /// The key's concurrency-control state.
    fn cc(&self) -> &CcState;
    /// The key's concurrency-control state, to change.
    fn cc_mut(&mut self) -> &mut CcState;
    /// As [`VersionedStore::read_at`].
    fn read_at(&self, ts: Timestamp) -> ReadAt;
    /// As [`VersionedStore::newest`].
    fn newest(&self) -> Newest;
    /// As [`VersionedStore::install`].
    fn install(&mut self, version: Version, watermark: Timestamp) -> Result<(), InstallRefused>;
}

/// A [`VersionedStore`] that keeps the engine's per-key concurrency-control state and
/// latches it together with the key's versions.
///
/// [`DefaultStore`] keeps the state in the store entry's attachment, under the same latch
/// as the versions (one lookup and one latch per key access, as fast as a store that knew
/// about transactions). Any other store gets it from [`SideTable`], which keeps the state
/// in a latched table of its own beside the store.
pub trait TxnStore: VersionedStore {
    /// The guard of a key's latch.
    type Locked<'a>: LockedKey
    where
        Self: 'a;
    /// The key an entry is for.
    fn key_of(entry: &Self::Entry) -> &Bytes;
    /// Takes the entry's key's latch. Hold it only for a few instructions: never across I/O.
    fn lock<'a>(&'a self, entry: &'a Self::Entry) -> Self::Locked<'a>;
    /// Runs `use_entry` on `key`'s entry (created when missing). Stores may avoid taking a
    /// counted reference.
    #[inline]
    fn with_entry<R>(&self, key: &[u8], use_entry: impl FnOnce(&Self::Entry) -> R) -> R {
        use_entry(&self.entry(key))
    }
}

/// The engine's default store: the in-memory multi-version store, each key's
/// concurrency-control state attached to its versions.
pub type DefaultStore = MvStore<CcState>;

impl LockedKey for MutexGuard<'_, Chain<CcState>> {
    #[inline]
    fn cc(&self) -> &CcState {
        &self.attached
    }

    #[inline]
    fn cc_mut(&mut self) -> &mut CcState {
        &mut self.attached
    }

    #[inline]
    fn read_at(&self, ts: Timestamp) -> ReadAt {
        ReadAt { visible: self.visible_at(ts).cloned(), newest: self.latest_ts() }
    }

    #[inline]
    fn newest(&self) -> Newest {
        Newest { ts: self.latest_ts(), live: !self.is_absent() }
    }

    #[inline]
    fn install(&mut self, version: Version, watermark: Timestamp) -> Result<(), InstallRefused> {
        match Chain::install(self, version, watermark) {
            Ok(_) => Ok(()),
            Err(refused) => Err(InstallRefused { attempted: refused.ts, newest: self.latest_ts() }),
        }
    }
}

impl TxnStore for DefaultStore {
    type Locked<'a> = MutexGuard<'a, Chain<CcState>>;

    #[inline]
    fn key_of(entry: &Arc<KeyState<CcState>>) -> &Bytes {
        entry.key()
    }

    #[inline]
    fn lock<'a>(&'a self, entry: &'a Arc<KeyState<CcState>>) -> MutexGuard<'a, Chain<CcState>> {
        entry.lock()
    }

    #[inline]
    fn with_entry<R>(&self, key: &[u8], use_entry: impl FnOnce(&Arc<KeyState<CcState>>) -> R) -> R {
        self.with_key(key, use_entry)
    }
}

/// Runs any [`VersionedStore`] under the engine: keeps each key's concurrency-control
/// state in a hash table beside the store, created on first use and never removed, paired
/// with the store's entry for the key. The state's latch is taken before the store's.
pub struct SideTable<S: VersionedStore> {
    store: S,
    index: DashMap<InlineKey, Arc<Paired<S::Entry>>, KeyHasher>,
}

/// A store entry paired with its key's concurrency-control state, in a [`SideTable`].
pub struct Paired<E> {
    key: Bytes,
    entry: E,
    cc: Mutex<CcState>,
}

/// A [`SideTable`] key's latch, held.
pub struct SideLocked<'a, S: VersionedStore> {
    state: MutexGuard<'a, CcState>,
    store: &'a S,
    entry: &'a S::Entry,
}

impl<S: VersionedStore> LockedKey for SideLocked<'_, S> {
    fn cc(&self) -> &CcState {
        &self.state
    }

    fn cc_mut(&mut self) -> &mut CcState {
        &mut self.state
    }

    fn read_at(&self, ts: Timestamp) -> ReadAt {
        self.store.read_at(self.entry, ts)
    }

    fn newest(&self) -> Newest {
        self.store.newest(self.entry)
    }

    fn install(&mut self, version: Version, watermark: Timestamp) -> Result<(), InstallRefused> {
        self.store.install(self.entry, version, watermark)
    }
}

impl<S: VersionedStore> SideTable<S> {
    /// Wraps `store`.
    pub fn new(store: S) -> SideTable<S> {
        SideTable { store, index: DashMap::with_hasher_and_shard_amount(KeyHasher::default(), 256) }
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn pair(&self, key: &[u8], entry: impl FnOnce() -> S::Entry) -> Arc<Paired<S::Entry>> {
        if let Some(pair) = self.index.get(&InlineKey::new(key)) {
            return Arc::clone(pair.value());
        }
        // The store entry is made before the index shard is locked: concurrent creators get
        // the same store entry anyway, and the store is never entered under a shard lock.
        let entry = entry();
        let pair = self.index.entry(InlineKey::new(key)).or_insert_with(|| {
            Arc::new(Paired { key: Bytes::copy_from_slice(key), entry, cc: Mutex::new(CcState::default()) })
        });
        Arc::clone(pair.value())
    }
}

impl<S: VersionedStore> VersionedStore for SideTable<S> {
    type Entry = Arc<Paired<S::Entry>>;

    fn entry(&self, key: &[u8]) -> Self::Entry {
        self.pair(key, || self.store.entry(key))
    }

    fn find(&self, key: &[u8]) -> Option<Self::Entry> {
        let entry = self.store.find(key)?;
        Some(self.pair(key, || entry))
    }

    fn read_at(&self, entry: &Self::Entry, ts: Timestamp) -> ReadAt {
        self.store.read_at(&entry.entry, ts)
    }

    fn newest(&self, entry: &Self::Entry) -> Newest {
        self.store.newest(&entry.entry)
    }

    fn install(&self, entry: &Self::Entry, version: Version, watermark: Timestamp) -> Result<(), InstallRefused> {
        self.store.install(&entry.entry, version, watermark)
    }

    fn reset(&self, entry: &Self::Entry, version: Version) {
        self.store.reset(&entry.entry, version)
    }

    fn visit_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: &mut dyn FnMut(&Bytes, &Self::Entry) -> bool) {
        self.store.visit_range(start, end, &mut |key, entry| visit(key, &self.pair(key, || entry.clone())));
    }

    fn gc(&self, watermark: Timestamp) -> GcStats {
        self.store.gc(watermark)
    }

    fn report(&self) -> StoreReport {
        self.store.report()
    }
}

impl<S: VersionedStore> TxnStore for SideTable<S> {
    type Locked<'a>
        = SideLocked<'a, S>
    where
        S: 'a;

    fn key_of(entry: &Self::Entry) -> &Bytes {
        &entry.key
    }

    fn lock<'a>(&'a self, entry: &'a Self::Entry) -> SideLocked<'a, S> {
        SideLocked { state: entry.cc.lock(), store: &self.store, entry: &entry.entry }
    }
}

/// How long an optimistic reader waits for a prepared writer to install before giving up
/// (and aborting or flagging, as its mode says).
const PREPARED_WAIT: Duration = Duration::from_micros(50);

/// The longest a DST read-only reader waits for one held tuple.
const DEPENDENT_READ_WAIT: Duration = Duration::from_secs(1);

/// Takes the key's latch once no other transaction holds the key, or after
/// [`PREPARED_WAIT`]. A prepared writer under OCC is inside its commit (log append and
/// install), so waiting briefly is cheaper than an abort and a retry; the reader holds no
/// key itself while it waits, so no wait cycle can form.
pub(crate) fn lock_unprepared<'a, S: TxnStore>(store: &'a S, entry: &'a S::Entry, me: TxnId) -> S::Locked<'a> {
    let locked = store.lock(entry);
    if !locked.cc().held_by_other(me) {
        return locked;
    }
    drop(locked);
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        backoff(&mut spins);
        let locked = store.lock(entry);
        if !locked.cc().held_by_other(me) || started.elapsed() >= PREPARED_WAIT {
            return locked;
        }
    }
}

/// DST's `DEP_READ`: raises the tuple timestamp to `read_ts` and, once no writer holds the
/// tuple, reads the newest version at or below `read_ts`. It waits whenever the tuple is
/// held (not only when its timestamp is at or below the reader's, as printed): the printed
/// rule lets a reader skip a writer whose commit timestamp will still be below the read
/// timestamp.
///
/// Under OCC a holder is inside its commit and lets go within microseconds; under 2PL (or a
/// participant waiting for its coordinator) it may hold the key much longer, so the wait is
/// bounded by [`DEPENDENT_READ_WAIT`] (then the reader aborts with `read-prepared` rather
/// than hang on a stalled writer).
pub(crate) fn dependent_read<S: TxnStore>(
    store: &S,
    entry: &S::Entry,
    read_ts: Timestamp,
) -> Result<Option<Version>, AbortReason> {
    let mut spins = 0u32;
    let started = Instant::now();
    loop {
        {
            let mut locked = store.lock(entry);
            let state = locked.cc_mut();
            state.latest_read = state.latest_read.max(read_ts);
            if state.prepared.is_none() {
                return Ok(locked.read_at(read_ts).visible);
            }
        }
        if started.elapsed() >= DEPENDENT_READ_WAIT {
            return Err(AbortReason::ReadPrepared);
        }
        backoff(&mut spins);
    }
}

fn backoff(spins: &mut u32) {
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *spins += 1;
}
