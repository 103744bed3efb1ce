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
    has_bad_sectors: AtomicBool,
    bad_sectors: Mutex<Vec<BadSector>>,
    /// Writes still to be acknowledged without reaching the medium.
    writes_to_lose: AtomicU64,
    /// Writes still to land elsewhere, and how many bytes before their offset.
    writes_to_misdirect: AtomicU64,
    misdirect_back: AtomicU64,
    syncs: AtomicU64,
    failed_syncs: AtomicU64,
    media_faults: AtomicU64,
}

/// A latent sector error: reads of `start..end` of `path` fail until a write covers it.
#[derive(Clone, Debug)]
struct BadSector {
    path: PathBuf,
    start: u64,
    end: u64,
}

/// What happens to one write under the plan's media faults.
enum WriteFate {
    Lands,
    /// Acknowledged, but the medium keeps what it held (a new range reads as zeros).
    Lost,
    /// Lands this many bytes before its offset; its own range keeps what it held.
    Misdirected(u64),
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

    /// A latent sector error: every read that touches bytes `offset..offset + len` of the
    /// object `path` fails with an I/O error, as an unreadable sector does, until a write
    /// covers the whole range (the drive remaps the sector); the bytes are gone.
    pub fn latent_sector_error(&self, path: impl Into<PathBuf>, offset: u64, len: u64) {
        let sector = BadSector { path: path.into(), start: offset, end: offset.saturating_add(len.max(1)) };
        self.lock_sectors().push(sector);
        self.has_bad_sectors.store(true, Ordering::SeqCst);
    }

    /// The next `n` writes (to any object of the storage) are acknowledged, syncs included,
    /// but never reach the medium: what the range held stays, and a range past the end
    /// reads as zeros, as a drive that drops a write from its cache leaves it.
    pub fn lose_writes(&self, n: u64) {
        self.writes_to_lose.store(n, Ordering::SeqCst);
    }

    /// The next `n` writes land `back` bytes before their offset (at most at 0), over what
    /// is there, while their own range keeps what it held (zeros past the end), as a write
    /// the drive sends to the wrong place does.
    pub fn misdirect_writes(&self, n: u64, back: u64) {
        self.misdirect_back.store(back, Ordering::SeqCst);
        self.writes_to_misdirect.store(n, Ordering::SeqCst);
    }

    /// Media faults that fired: reads refused by a bad sector, writes lost or misdirected.
    pub fn media_faults(&self) -> u64 {
        self.media_faults.load(Ordering::SeqCst)
    }

    /// Removes every fault.
    pub fn heal(&self) {
        self.fail_syncs_after(u64::MAX);
        self.fill_disk_after(u64::MAX);
        self.short_reads(false);
        self.lock_flips().clear();
        self.has_flips.store(false, Ordering::SeqCst);
        self.lock_sectors().clear();
        self.has_bad_sectors.store(false, Ordering::SeqCst);
        self.lose_writes(0);
        self.misdirect_writes(0, 0);
    }

    /// Syncs attempted so far, and how many of them were made to fail.
    pub fn sync_counts(&self) -> (u64, u64) {
        (self.syncs.load(Ordering::SeqCst), self.failed_syncs.load(Ordering::SeqCst))
    }

    fn lock_flips(&self) -> std::sync::MutexGuard<'_, Vec<BitFlip>> {
        self.flips.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_sectors(&self) -> std::sync::MutexGuard<'_, Vec<BadSector>> {
        self.bad_sectors.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails a read of `offset..offset + len` of `path` that touches a bad sector.
    fn check_read(&self, path: &Path, offset: u64, len: usize) -> io::Result<()> {
        if !self.has_bad_sectors.load(Ordering::SeqCst) || len == 0 {
            return Ok(());
        }
        let end = offset + len as u64;
        let sectors = self.lock_sectors();
        let Some(bad) = sectors.iter().find(|bad| bad.path == path && bad.start < end && offset < bad.end) else {
            return Ok(());
        };
        self.media_faults.fetch_add(1, Ordering::SeqCst);
        Err(io::Error::other(format!(
            "injected latent sector error reading {} at bytes {}..{}",
            path.display(),
            bad.start,
            bad.end
        )))
    }

    /// A write of `offset..offset + len` of `path` remaps the bad sectors it covers whole.
    fn rewrite(&self, path: &Path, offset: u64, len: usize) {
        if self.has_bad_sectors.load(Ordering::SeqCst) {
            let end = offset + len as u64;
            self.lock_sectors().retain(|bad| !(bad.path == path && offset <= bad.start && bad.end <= end));
        }
    }

    fn take_one(counter: &AtomicU64) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_ok()
    }

    fn write_fate(&self) -> WriteFate {
        if Self::take_one(&self.writes_to_lose) {
            self.media_faults.fetch_add(1, Ordering::SeqCst);
            return WriteFate::Lost;
        }
        if Self::take_one(&self.writes_to_misdirect) {
            self.media_faults.fetch_add(1, Ordering::SeqCst);
            return WriteFate::Misdirected(self.misdirect_back.load(Ordering::SeqCst));
        }
        WriteFate::Lands
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

impl FaultyDevice {
    /// Writes `data` at `offset` as the plan's media faults have it land.
    fn place(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.place_as(self.plan.write_fate(), data, offset)
    }

    fn place_as(&self, fate: WriteFate, data: &[u8], offset: u64) -> io::Result<()> {
        match fate {
            WriteFate::Lands => {
                self.plan.rewrite(&self.path, offset, data.len());
                self.inner.write_at(data, offset)
            }
            WriteFate::Lost => self.keep_range(offset, data.len()),
            WriteFate::Misdirected(back) => {
                self.keep_range(offset, data.len())?;
                let to = offset.saturating_sub(back);
                self.plan.rewrite(&self.path, to, data.len());
                self.inner.write_at(data, to)
            }
        }
    }

    /// The range a write did not reach: what it held stays, and past the end it is zeros
    /// (the object still grows, as its length is metadata the write did update).
    fn keep_range(&self, offset: u64, len: usize) -> io::Result<()> {
        let end = offset + len as u64;
        let current = self.inner.len()?;
        if end > current {
            let from = current.max(offset);
            self.inner.write_at(&vec![0; (end - from) as usize], from)?;
        }
        Ok(())
    }
}

impl Device for FaultyDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let want =
            if self.plan.short_reads.load(Ordering::SeqCst) && buf.len() > 1 { buf.len() / 2 } else { buf.len() };
        self.plan.check_read(&self.path, offset, want)?;
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
        self.place(&data[..granted], offset)?;
        if granted < data.len() {
            return Err(disk_full(&self.path));
        }
        Ok(())
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        let granted = self.plan.take_budget(data.len() as u64) as usize;
        let offset = match self.plan.write_fate() {
            WriteFate::Lands => self.inner.append(&data[..granted])?,
            fate => {
                let offset = self.inner.len()?;
                self.place_as(fate, &data[..granted], offset)?;
                offset
            }
        };
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
