//! Virga's transactional engine as a [`KvBackend`], over any [`TxnStore`]: the default
//! in-memory store, or any storage engine behind `VersionedStore` wrapped in a
//! [`SideTable`](virga_txn::SideTable), runs every workload through Virga's concurrency
//! control without an adapter of its own.

use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use virga_txn::{DefaultStore, Engine, Session, Txn, TxnStore};

use super::{Ack, KvBackend, KvSession, KvTx, TxAbort};

/// An [`Engine`] under test, on store `S`.
pub struct VirgaBackend<S: TxnStore = DefaultStore> {
    engine: Arc<Engine<S>>,
}

impl<S: TxnStore> VirgaBackend<S> {
    /// Wraps an open engine.
    pub fn new(engine: Arc<Engine<S>>) -> VirgaBackend<S> {
        VirgaBackend { engine }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine<S>> {
        &self.engine
    }
}

impl<S: TxnStore> KvBackend for VirgaBackend<S> {
    type Session = VirgaSession<S>;

    fn name(&self) -> String {
        let config = self.engine.config();
        format!("virga-{}-{}", config.cc, config.timestamps)
    }

    fn load(&self, pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        self.engine.load(pairs)?;
        Ok(())
    }

    fn session(&self, _client: usize) -> VirgaSession<S> {
        // Sessions are limited to `MAX_SESSIONS`; the runner opens one per thread.
        let session = self.engine.session().unwrap_or_else(|e| panic!("opening a benchmark session: {e}"));
        VirgaSession { session }
    }
}

/// One worker's [`Session`].
pub struct VirgaSession<S: TxnStore = DefaultStore> {
    session: Session<S>,
}

impl<S: TxnStore> VirgaSession<S> {
    /// The underlying session (for its abort counts).
    pub fn session(&self) -> &Session<S> {
        &self.session
    }
}

struct TxAdapter<'a, 's, S: TxnStore>(&'a mut Txn<'s, S>);

fn abort(e: virga_txn::Abort) -> TxAbort {
    TxAbort { reason: e.reason.name() }
}

impl<S: TxnStore> KvTx for TxAdapter<'_, '_, S> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        self.0.get(key).map_err(abort)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        self.0.put(key, Bytes::copy_from_slice(value)).map_err(abort)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort> {
        self.0.delete(key).map_err(abort)
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        self.0.scan(Bound::Included(start), Bound::Unbounded, limit).map_err(abort)
    }
}

impl<S: TxnStore> KvSession for VirgaSession<S> {
    fn run(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort> {
        let mut txn = if read_only { self.session.begin_read_only() } else { self.session.begin() };
        body(&mut TxAdapter(&mut txn))?;
        let info = txn.commit().map_err(abort)?;
        Ok(match info.lsn {
            Some(lsn) if lsn > self.session.engine().durable_lsn() => Ack::After(lsn),
            _ => Ack::Now,
        })
    }

    fn durable_ticket(&self) -> u64 {
        self.session.engine().durable_lsn()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use virga_core::clock::SkewProfile;
    use virga_storage::{GcStats, InstallRefused, MvStore, Newest, ReadAt, StoreReport, Version, VersionedStore};
    use virga_txn::{EngineConfig, SideTable, SkewedClocks, Timestamp, TimestampScheme};

    use super::*;
    use crate::kv::runner;
    use crate::kv::smallbank::{SmallBankConfig, SmallBankWorkload};
    use crate::kv::testing::Oracle;
    use crate::kv::KvWorkload;

    /// Another storage engine, as far as the engine above can tell: it delegates to an
    /// [`MvStore`] and counts what it is asked to install.
    #[derive(Default)]
    struct CountingStore {
        inner: MvStore,
        installs: AtomicU64,
    }

    type Entry = <MvStore as VersionedStore>::Entry;

    impl VersionedStore for CountingStore {
        type Entry = Entry;

        fn entry(&self, key: &[u8]) -> Entry {
            self.inner.entry(key)
        }
        fn find(&self, key: &[u8]) -> Option<Entry> {
            self.inner.find(key)
        }
        fn read_at(&self, entry: &Entry, ts: Timestamp) -> ReadAt {
            self.inner.read_at(entry, ts)
        }
        fn newest(&self, entry: &Entry) -> Newest {
            self.inner.newest(entry)
        }
        fn install(&self, entry: &Entry, version: Version, watermark: Timestamp) -> Result<(), InstallRefused> {
            self.installs.fetch_add(1, Ordering::Relaxed);
            self.inner.install(entry, version, watermark)
        }
        fn reset(&self, entry: &Entry, version: Version) {
            self.inner.reset(entry, version)
        }
        fn visit_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: &mut dyn FnMut(&Bytes, &Entry) -> bool) {
            self.inner.visit_range(start, end, visit)
        }
        fn gc(&self, watermark: Timestamp) -> GcStats {
            self.inner.gc(watermark)
        }
        fn report(&self) -> StoreReport {
            self.inner.report()
        }
    }

    /// One session runs SmallBank over the counting store (its concurrency-control state in
    /// a side table, as for any store): nothing runs concurrently and
    /// hybrid clocks order each transaction after the previous one, so every transaction
    /// commits, the store ends up as the oracle's map, and every write went through it.
    #[test]
    fn workloads_run_through_virga_on_any_versioned_store() {
        let config = SmallBankConfig { accounts: 50, ..SmallBankConfig::default() };
        let workload = SmallBankWorkload::new(config).unwrap();
        let clocks = Arc::new(SkewedClocks::system(SkewProfile::None, 0));
        let engine_config = EngineConfig { timestamps: TimestampScheme::Hlc, ..EngineConfig::default() };
        let store = SideTable::new(CountingStore::default());
        let (engine, _) = Engine::open_with(engine_config, store, clocks).unwrap();
        let backend = VirgaBackend::new(engine);
        runner::load(&workload, &backend).unwrap();
        let mut oracle = Oracle::loaded(&workload);
        let mut session = backend.session(0);
        let mut rng = SmallRng::seed_from_u64(5);
        let mut writes = 0;
        for n in 0..2_000 {
            let txn = workload.next_txn(0, &mut rng);
            let read_only = workload.is_read_only(&txn);
            let ours = session.run(read_only, &mut |tx| workload.execute(&txn, tx));
            let theirs = oracle.execute(&workload, &txn);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "transaction {n}: {ours:?} against {theirs:?}");
            writes += theirs.map_or(0, |(_, w)| w.len());
        }
        assert!(writes > 0, "the mix wrote nothing");
        let store = backend.engine().store();
        assert_eq!(store.store().installs.load(Ordering::Relaxed), writes as u64);
        assert_eq!(store.report().keys, oracle.len() as u64);
        for (key, value) in oracle.iter() {
            assert_eq!(store.get_at(key, Timestamp::MAX).as_deref(), Some(value), "{key:?}");
        }
    }
}
