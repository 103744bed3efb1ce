//! The storage seam: every byte Virga keeps durably goes through a [`Storage`] (a namespace of
//! named objects, like a directory) and the [`Device`]s it hands out (one file-like object
//! each).
//!
//! Three implementations:
//!
//! * [`FileStorage`]: a directory of the real file system (production).
//! * [`MemStorage`]: memory that keeps durable and volatile state apart, so that a test can
//!   [`crash`](MemStorage::crash) it and see what a power failure could leave behind.
//! * [`FaultyStorage`]: wraps any storage and injects failed fsyncs, bit flips on read, short
//!   reads and a full disk, under a shared [`FaultPlan`] that tests change at run time.
//!
//! Errors at this layer are plain [`std::io::Error`]s; callers name the object with
//! [`Storage::path_of`] in their own errors.

mod crash_point;
mod faulty;
mod file;
mod mem;
#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use crash_point::CrashPoint;
pub use faulty::{FaultPlan, FaultyStorage};
pub use file::{FileDevice, FileStorage};
pub use mem::{MemStorage, CRASH_BLOCK_BYTES};

/// One file-like object: a byte array that grows by appends and is made durable by `sync`.
///
/// Every method takes `&self` so that a device can be shared (`Arc<dyn Device>`) between a
/// writer and readers; concurrent writers must coordinate among themselves.
pub trait Device: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at or past the
    /// end). May return fewer bytes than asked for before the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `data` at `offset`, growing the object if the write ends past its end.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;

    /// Writes all of `data` at the current end; returns the offset it was written at.
    fn append(&self, data: &[u8]) -> io::Result<u64>;

    /// Makes everything written so far (contents and length) durable.
    fn sync(&self) -> io::Result<()>;

    /// Current length in bytes (what reads see, durable or not).
    fn len(&self) -> io::Result<u64>;

    /// Whether the object holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Cuts or extends (with zeros) the object to `len` bytes. Durable after `sync`.
    fn truncate(&self, len: u64) -> io::Result<()>;

    /// Fills `buf` from `offset`, or fails with [`io::ErrorKind::UnexpectedEof`].
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("object ends before byte offset {}", offset + buf.len() as u64),
                    ))
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads the whole object.
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len()?).map_err(|_| io::Error::other("object too large for memory"))?;
        let mut bytes = vec![0u8; len];
        self.read_exact_at(&mut bytes, 0)?;
        Ok(bytes)
    }
}

/// A namespace of named [`Device`]s: a directory, or its emulation.
///
/// Creating, removing and renaming objects are directory operations: they become durable
/// only after [`sync_dir`](Storage::sync_dir) (the memory storage loses unsynced ones in a
/// crash, as a file system may).
pub trait Storage: Send + Sync + Debug {
    /// Creates a new, empty object; fails with [`io::ErrorKind::AlreadyExists`] if the name is
    /// taken.
    fn create(&self, name: &str) -> io::Result<Arc<dyn Device>>;

    /// Opens an existing object; fails with [`io::ErrorKind::NotFound`] if there is none.
    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>>;

    /// Names of the objects (not of nested namespaces), in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;

    /// Removes an object; fails with [`io::ErrorKind::NotFound`] if there is none.
    fn remove(&self, name: &str) -> io::Result<()>;

    /// Renames `from` to `to`, atomically replacing any object called `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;

    /// Makes the directory operations done so far durable.
    fn sync_dir(&self) -> io::Result<()>;

    /// The nested namespace `name`, created (durably) if missing.
    fn sub(&self, name: &str) -> io::Result<Arc<dyn Storage>>;

    /// The nested namespace `name` if it exists ([`io::ErrorKind::NotFound`] otherwise);
    /// creates nothing, for readers that must not change what they read.
    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>>;

    /// Removes the nested namespace `name` with everything in it, durably: a crash leaves it
    /// whole or gone, never part of it. [`io::ErrorKind::NotFound`] if there is none.
    fn remove_sub(&self, name: &str) -> io::Result<()>;

    /// How to name object `name` in messages: a real path for files, `mem:/a/b` for memory.
    fn path_of(&self, name: &str) -> PathBuf;

    /// How to name the namespace itself in messages.
    fn location(&self) -> PathBuf;

    /// Whether an object called `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool> {
        match self.open(name) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` as object `name` so that a crash leaves either the old object or the new
    /// one, never a mix: write to `name.tmp`, sync it, rename over `name`, sync the directory.
    fn replace_atomically(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let temporary = format!("{name}.tmp");
        match self.remove(&temporary) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let device = self.create(&temporary)?;
        device.write_at(bytes, 0)?;
        device.sync()?;
        drop(device);
        self.rename(&temporary, name)?;
        self.sync_dir()
    }
}

/// Buffers writes to a [`Device`] and appends them in large pieces: streaming a file (a
/// checkpoint, a snapshot) without one device call per small write.
#[derive(Debug)]
pub struct DeviceWriter {
    device: Arc<dyn Device>,
    buf: Vec<u8>,
    capacity: usize,
}

impl DeviceWriter {
    /// Appends to `device` in pieces of about `capacity` bytes.
    pub fn new(device: Arc<dyn Device>, capacity: usize) -> DeviceWriter {
        DeviceWriter { device, buf: Vec::with_capacity(capacity), capacity }
    }

    /// Appends what is buffered, syncs the device, and returns it.
    pub fn finish(mut self) -> io::Result<Arc<dyn Device>> {
        io::Write::flush(&mut self)?;
        self.device.sync()?;
        Ok(Arc::clone(&self.device))
    }
}

impl io::Write for DeviceWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.capacity {
            self.flush()?;
        }
        if data.len() >= self.capacity {
            self.device.append(data)?;
        } else {
            self.buf.extend_from_slice(data);
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.device.append(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Rejects names that would escape the namespace or nest into another one.
pub(crate) fn check_name(name: &str) -> io::Result<()> {
    let bad = name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0');
    if bad {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid object name {name:?}")));
    }
    Ok(())
}

/// A shareable handle on a storage.
pub type SharedStorage = Arc<dyn Storage>;

/// Something that names a [`Storage`]: a directory path (a [`FileStorage`]) or a storage
/// itself. Lets APIs take `dir.path()` and `Arc<dyn Storage>` alike.
pub trait IntoStorage {
    /// How to name the storage in messages, before it is opened.
    fn location(&self) -> PathBuf;

    /// The storage. With `create`, a missing directory is created (durably) first; without
    /// it, nothing on disk is touched.
    fn into_storage(self, create: bool) -> io::Result<Arc<dyn Storage>>;
}

impl IntoStorage for &std::path::Path {
    fn location(&self) -> PathBuf {
        self.to_path_buf()
    }

    fn into_storage(self, create: bool) -> io::Result<Arc<dyn Storage>> {
        if create {
            Ok(Arc::new(FileStorage::create_dir_all(self)?))
        } else {
            Ok(Arc::new(FileStorage::new(self)))
        }
    }
}

impl IntoStorage for &PathBuf {
    fn location(&self) -> PathBuf {
        (*self).clone()
    }

    fn into_storage(self, create: bool) -> io::Result<Arc<dyn Storage>> {
        self.as_path().into_storage(create)
    }
}

impl IntoStorage for PathBuf {
    fn location(&self) -> PathBuf {
        self.clone()
    }

    fn into_storage(self, create: bool) -> io::Result<Arc<dyn Storage>> {
        self.as_path().into_storage(create)
    }
}

impl IntoStorage for Arc<dyn Storage> {
    fn location(&self) -> PathBuf {
        Storage::location(&**self)
    }

    fn into_storage(self, _create: bool) -> io::Result<Arc<dyn Storage>> {
        Ok(self)
    }
}

impl IntoStorage for &Arc<dyn Storage> {
    fn location(&self) -> PathBuf {
        Storage::location(&***self)
    }

    fn into_storage(self, _create: bool) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::clone(self))
    }
}

impl<S: Storage + Clone + 'static> IntoStorage for &S {
    fn location(&self) -> PathBuf {
        Storage::location(*self)
    }

    fn into_storage(self, _create: bool) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.clone()))
    }
}
