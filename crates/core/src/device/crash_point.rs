//! [`CrashPoint`]: a [`MemStorage`] that records its state just before a chosen mutating
//! operation, so a test can crash a run at any storage operation (inside a log's rotation,
//! half-way through a checkpoint's installation), not only between its own calls.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Device, MemStorage, Storage};

/// Passes everything through to a [`MemStorage`], counting mutating operations (`create`,
/// `remove`, `rename`, `sync_dir`, and each device's `write_at`, `append`, `sync`,
/// `truncate`) and taking a [`snapshot`](MemStorage::snapshot) just before the one numbered
/// `crash_at` (from 1; 0 never). Crash the snapshot with [`MemStorage::crash`] to see what a
/// power failure at that moment could leave. Nested namespaces count into the same total.
///
/// Typical use: run once with `crash_at = 0` to learn the operation count `n`, then again
/// with a crash point drawn from `1..=n`, noting before each step of the run how many
/// operations had happened ([`operations`](CrashPoint::operations)) and what had been
/// acknowledged, to know what the crash must keep.
#[derive(Clone, Debug)]
pub struct CrashPoint {
    /// This namespace.
    inner: MemStorage,
    /// The whole storage, which snapshots copy.
    root: MemStorage,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    crash_at: u64,
    operations: AtomicU64,
    snapshot: Mutex<Option<MemStorage>>,
}

impl CrashPoint {
    /// Wraps `inner`, snapshotting it before mutating operation number `crash_at`.
    pub fn new(inner: MemStorage, crash_at: u64) -> CrashPoint {
        let shared = Shared { crash_at, operations: AtomicU64::new(0), snapshot: Mutex::new(None) };
        CrashPoint { root: inner.clone(), inner, shared: Arc::new(shared) }
    }

    /// Mutating operations so far.
    pub fn operations(&self) -> u64 {
        self.shared.operations.load(Ordering::SeqCst)
    }

    /// The storage as it was just before operation `crash_at`, once that operation began.
    pub fn state_at_crash(&self) -> Option<MemStorage> {
        self.shared.snapshot.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn tick(&self) {
        tick(&self.shared, &self.root);
    }

    fn wrap(&self, device: Arc<dyn Device>) -> Arc<dyn Device> {
        Arc::new(CrashPointDevice { inner: device, storage: self.root.clone(), shared: Arc::clone(&self.shared) })
    }

    fn nested(&self, inner: MemStorage) -> Arc<dyn Storage> {
        Arc::new(CrashPoint { inner, root: self.root.clone(), shared: Arc::clone(&self.shared) })
    }
}

fn tick(shared: &Shared, storage: &MemStorage) {
    if shared.operations.fetch_add(1, Ordering::SeqCst) + 1 == shared.crash_at {
        *shared.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = Some(storage.snapshot());
    }
}

impl Storage for CrashPoint {
    fn create(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        self.tick();
        Ok(self.wrap(self.inner.create(name)?))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        Ok(self.wrap(self.inner.open(name)?))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.tick();
        self.inner.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.tick();
        self.inner.rename(from, to)
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.tick();
        self.inner.sync_dir()
    }

    fn sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(self.nested(self.inner.sub_mem(name)?))
    }

    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(self.nested(self.inner.open_sub_mem(name)?))
    }

    fn remove_sub(&self, name: &str) -> io::Result<()> {
        self.tick();
        self.inner.remove_sub(name)
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.inner.path_of(name)
    }

    fn location(&self) -> PathBuf {
        Storage::location(&self.inner)
    }
}

#[derive(Debug)]
struct CrashPointDevice {
    inner: Arc<dyn Device>,
    /// The root storage, snapshotted whole.
    storage: MemStorage,
    shared: Arc<Shared>,
}

impl Device for CrashPointDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        tick(&self.shared, &self.storage);
        self.inner.write_at(data, offset)
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        tick(&self.shared, &self.storage);
        self.inner.append(data)
    }

    fn sync(&self) -> io::Result<()> {
        tick(&self.shared, &self.storage);
        self.inner.sync()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        tick(&self.shared, &self.storage);
        self.inner.truncate(len)
    }
}
