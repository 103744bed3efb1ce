//! Concurrency-control state per key, kept beside the store rather than in it: MILANA's
//! `latestRead` (DST's tuple timestamp), the writer holding the key between validation and
//! install (OCC's prepared mark, 2PL's exclusive lock), and 2PL's shared-lock count.
//!
//! Each key's state has its own latch, and every change to the key's versions is made with
//! that latch held (install happens under it), so reading the store's newest version while
//! holding the latch is atomic with respect to installs: validation and the raise of
//! `latestRead` happen in one critical section, as MILANA requires. Latches are always taken
//! in the order concurrency-control latch, then store latch; the store never calls back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard};
use virga_storage::{InlineKey, KeyHasher, Timestamp, TxnId, VersionedStore};

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

/// One key's concurrency-control state.
#[derive(Debug, Default)]
pub(crate) struct CcState {
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

/// A key, its store entry and its latch-protected concurrency-control state.
pub(crate) struct KeyCc<E> {
    key: Bytes,
    /// The store's handle on the key, so reads, validation and installs skip the lookup.
    pub(crate) entry: E,
    state: Mutex<CcState>,
}

impl<E> KeyCc<E> {
    pub(crate) fn key(&self) -> &Bytes {
        &self.key
    }

    /// Takes the key's latch. Hold it only for a few instructions: never across I/O.
    pub(crate) fn lock(&self) -> MutexGuard<'_, CcState> {
        self.state.lock()
    }
}

/// Every key's concurrency-control state, created on first use. Entries are never removed,
/// so an `Arc<KeyCc>` obtained once is the key's state for the life of the engine.
pub(crate) struct CcTable<E> {
    index: DashMap<InlineKey, Arc<KeyCc<E>>, KeyHasher>,
}

impl<E: Clone> CcTable<E> {
    pub(crate) fn new() -> CcTable<E> {
        CcTable { index: DashMap::with_hasher_and_shard_amount(KeyHasher::default(), 256) }
    }

    /// The state of `key` if it has any.
    pub(crate) fn find(&self, key: &[u8]) -> Option<Arc<KeyCc<E>>> {
        self.index.get(&InlineKey::new(key)).map(|cc| Arc::clone(cc.value()))
    }

    /// The state of `key`, created (with its store entry) when missing.
    #[inline]
    pub(crate) fn get<S: VersionedStore<Entry = E>>(&self, store: &S, key: &[u8]) -> Arc<KeyCc<E>> {
        match self.find(key) {
            Some(cc) => cc,
            None => self.insert(key, || store.entry(key)),
        }
    }

    /// The state of `key`, whose store entry the caller already has (a range scan).
    pub(crate) fn get_with_entry(&self, key: &Bytes, entry: &E) -> Arc<KeyCc<E>> {
        match self.find(key) {
            Some(cc) => cc,
            None => self.insert(key, || entry.clone()),
        }
    }

    /// Runs `use_key` on `key`'s state (created when missing) while the index holds it,
    /// without taking a counted reference: the cheapest way to use a key once. `use_key`
    /// must be short and must not touch this table.
    #[inline]
    pub(crate) fn with<S: VersionedStore<Entry = E>, R>(
        &self,
        store: &S,
        key: &[u8],
        use_key: impl FnOnce(&KeyCc<E>) -> R,
    ) -> R {
        if let Some(cc) = self.index.get(&InlineKey::new(key)) {
            return use_key(cc.value());
        }
        use_key(&self.get(store, key))
    }

    #[cold]
    fn insert(&self, key: &[u8], entry: impl FnOnce() -> E) -> Arc<KeyCc<E>> {
        // The store entry is made before the index shard is locked: concurrent creators get
        // the same store entry anyway, and the store is never entered under a shard lock.
        let entry = entry();
        let cc = self.index.entry(InlineKey::new(key)).or_insert_with(|| {
            Arc::new(KeyCc { key: Bytes::copy_from_slice(key), entry, state: Mutex::new(CcState::default()) })
        });
        Arc::clone(cc.value())
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
pub(crate) fn lock_unprepared<E>(key: &KeyCc<E>, me: TxnId) -> MutexGuard<'_, CcState> {
    let state = key.lock();
    if !state.held_by_other(me) {
        return state;
    }
    drop(state);
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        backoff(&mut spins);
        let state = key.lock();
        if !state.held_by_other(me) || started.elapsed() >= PREPARED_WAIT {
            return state;
        }
    }
}

/// DST's `DEP_READ`: raises the tuple timestamp to `read_ts` and, once no writer holds the
/// tuple, runs `read` under the latch. It waits whenever the tuple is held (not only when
/// its timestamp is at or below the reader's, as printed): the printed rule lets a reader
/// skip a writer whose commit timestamp will still be below the read timestamp.
///
/// Under OCC a holder is inside its commit and lets go within microseconds; under 2PL (or a
/// participant waiting for its coordinator) it may hold the key much longer, so the wait is
/// bounded by [`DEPENDENT_READ_WAIT`] (then the reader aborts with `read-prepared` rather
/// than hang on a stalled writer).
pub(crate) fn dependent_read<E, R>(
    key: &KeyCc<E>,
    read_ts: Timestamp,
    read: impl FnOnce(&KeyCc<E>) -> R,
) -> Result<R, AbortReason> {
    let mut spins = 0u32;
    let started = Instant::now();
    loop {
        {
            let mut state = key.lock();
            state.latest_read = state.latest_read.max(read_ts);
            if state.prepared.is_none() {
                return Ok(read(key));
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
