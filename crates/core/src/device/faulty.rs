//! [`Storage`] wrapper that injects faults under a shared, run-time [`FaultPlan`].

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Device, Storage};

/// Which faults a [`FaultyStorage`] injects. Shared (`Arc`) between the storage, its devices
/// and the test, which changes it while the code under test runs. Every fault is
/// deterministic: it fires on a count of operations or on a named byte, never at random.
#[derive(Default)]
pub struct FaultPlan {
    /// Syncs (device `sync` and `sync_dir`) still allowed to succeed; `u64::MAX` = no limit.
    syncs_left: AtomicU64,
    /// Bytes that writes may still add; `u64::MAX` = no limit.
    write_budget: AtomicU64,
    short_reads: AtomicBool,
    has_flips: AtomicBool,
    flips: Mutex<Vec<BitFlip>>,
    syncs: AtomicU64,
    failed_syncs: AtomicU64,
}

#[derive(Clone, Debug)]
struct BitFlip {
    path: PathBuf,
    offset: u64,
    mask: u8,
}

impl fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultPlan")
            .field("syncs_left", &self.syncs_left.load(Ordering::Relaxed))
            .field("write_budget", &self.write_budget.load(Ordering::Relaxed))
            .field("short_reads", &self.short_reads.load(Ordering::Relaxed))
            .field("flips", &self.lock_flips().len())
            .finish()
    }
}

impl FaultPlan {
    /// A plan that injects nothing yet.
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan {
            syncs_left: AtomicU64::new(u64::MAX),
            write_budget: AtomicU64::new(u64::MAX),
            ..FaultPlan::default()
        })
    }

    /// The next `n` syncs succeed; every later one fails with an I/O error (as `EIO` from
    /// `fsync`). `fail_syncs_after(0)` fails the very next one.
    pub fn fail_syncs_after(&self, n: u64) {
        self.syncs_left.store(n, Ordering::SeqCst);
    }

    /// Writes may add `bytes` more bytes; the write that would pass the budget writes what
    /// fits and fails with [`io::ErrorKind::StorageFull`], as a full disk does.
    pub fn fill_disk_after(&self, bytes: u64) {
        self.write_budget.store(bytes, Ordering::SeqCst);
    }

    /// While on, every read returns at most half the bytes asked for (at least one).
    pub fn short_reads(&self, on: bool) {
        self.short_reads.store(on, Ordering::SeqCst);
    }

    /// Every read of the byte at `offset` of the object `path` (as named by
    /// [`Storage::path_of`]) returns it XORed with `mask`, as a media error would.
    pub fn flip_bits_on_read(&self, path: impl Into<PathBuf>, offset: u64, mask: u8) {
        self.lock_flips().push(BitFlip { path: path.into(), offset, mask });
        self.has_flips.store(true, Ordering::SeqCst);
    }

    /// Removes every fault.
    pub fn heal(&self) {
        self.fail_syncs_after(u64::MAX);
        self.fill_disk_after(u64::MAX);
        self.short_reads(false);
        self.lock_flips().clear();
        self.has_flips.store(false, Ordering::SeqCst);
    }

    /// Syncs attempted so far, and how many of them were made to fail.
    pub fn sync_counts(&self) -> (u64, u64) {
        (self.syncs.load(Ordering::SeqCst), self.failed_syncs.load(Ordering::SeqCst))
    }

    fn lock_flips(&self) -> std::sync::MutexGuard<'_, Vec<BitFlip>> {
        self.flips.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_sync(&self, what: &Path) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        let allowed = self
            .syncs_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                0 => None,
                u64::MAX => Some(u64::MAX),
                n => Some(n - 1),
            })
            .is_ok();
        if allowed {
            Ok(())
        } else {
            self.failed_syncs.fetch_add(1, Ordering::SeqCst);
            Err(io::Error::other(format!("injected fsync failure on {}", what.display())))
        }
    }

    /// How many of `len` bytes a write may write; the rest hit a full disk.
    fn take_budget(&self, len: u64) -> u64 {
        let mut granted = len;
        let _ = self.write_budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            if left == u64::MAX {
                return None;
            }
            granted = len.min(left);
            Some(left - granted)
        });
        granted
    }
}

fn disk_full(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, format!("injected full disk writing {}", path.display()))
}

/// Wraps a [`Storage`] and injects the faults of a [`FaultPlan`] into it and its devices.
#[derive(Debug)]
pub struct FaultyStorage {
    inner: Arc<dyn Storage>,
    plan: Arc<FaultPlan>,
}

impl FaultyStorage {
    /// Wraps `inner`; faults come from `plan`.
    pub fn new(inner: Arc<dyn Storage>, plan: Arc<FaultPlan>) -> FaultyStorage {
        FaultyStorage { inner, plan }
    }

    /// The shared plan.
    pub fn plan(&self) -> &Arc<FaultPlan> {
        &self.plan
    }

    fn wrap(&self, name: &str, device: Arc<dyn Device>) -> Arc<dyn Device> {
        Arc::new(FaultyDevice { inner: device, plan: Arc::clone(&self.plan), path: self.inner.path_of(name) })
    }
}

impl Storage for FaultyStorage {
    fn create(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        let device = self.inner.create(name)?;
        Ok(self.wrap(name, device))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        let device = self.inner.open(name)?;
        Ok(self.wrap(name, device))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.plan.check_sync(&self.inner.location())?;
        self.inner.sync_dir()
    }

    fn sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(FaultyStorage { inner: self.inner.sub(name)?, plan: Arc::clone(&self.plan) }))
    }

    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(FaultyStorage { inner: self.inner.open_sub(name)?, plan: Arc::clone(&self.plan) }))
    }

    fn remove_sub(&self, name: &str) -> io::Result<()> {
        self.plan.check_sync(&self.inner.location())?;
        self.inner.remove_sub(name)
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.inner.path_of(name)
    }

    fn location(&self) -> PathBuf {
        self.inner.location()
    }
}

/// A device of a [`FaultyStorage`].
#[derive(Debug)]
struct FaultyDevice {
    inner: Arc<dyn Device>,
    plan: Arc<FaultPlan>,
    path: PathBuf,
}

impl FaultyDevice {
    fn flip(&self, buf: &mut [u8], offset: u64) {
        if !self.plan.has_flips.load(Ordering::SeqCst) {
            return;
        }
        let end = offset + buf.len() as u64;
        for flip in self.plan.lock_flips().iter() {
            if flip.path == self.path && (offset..end).contains(&flip.offset) {
                buf[(flip.offset - offset) as usize] ^= flip.mask;
            }
        }
    }
}

impl Device for FaultyDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let want =
            if self.plan.short_reads.load(Ordering::SeqCst) && buf.len() > 1 { buf.len() / 2 } else { buf.len() };
        let n = self.inner.read_at(&mut buf[..want], offset)?;
        self.flip(&mut buf[..n], offset);
        Ok(n)
    }

    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        // Through `read_at`, so that short reads and flips apply.
        while !buf.is_empty() {
            let n = self.read_at(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} ends early", self.path.display()),
                ));
            }
            buf = &mut buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let granted = self.plan.take_budget(data.len() as u64) as usize;
        self.inner.write_at(&data[..granted], offset)?;
        if granted < data.len() {
            return Err(disk_full(&self.path));
        }
        Ok(())
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        let granted = self.plan.take_budget(data.len() as u64) as usize;
        let offset = self.inner.append(&data[..granted])?;
        if granted < data.len() {
            return Err(disk_full(&self.path));
        }
        Ok(offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.plan.check_sync(&self.path)?;
        self.inner.sync()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
}
