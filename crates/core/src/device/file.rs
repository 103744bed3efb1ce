//! [`Storage`] over a directory of the real file system.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{check_name, Device, Storage};

/// A directory of the file system as a [`Storage`]. Objects are regular files; nested
/// namespaces are subdirectories.
#[derive(Clone, Debug)]
pub struct FileStorage {
    dir: PathBuf,
}

impl FileStorage {
    /// The directory `dir`, which need not exist yet (then listing fails with `NotFound`).
    /// Touches nothing on disk.
    pub fn new(dir: impl Into<PathBuf>) -> FileStorage {
        FileStorage { dir: dir.into() }
    }

    /// The directory `dir`, created with its missing parents if needed; the new entry is made
    /// durable in its parent.
    pub fn create_dir_all(dir: impl Into<PathBuf>) -> io::Result<FileStorage> {
        let dir = dir.into();
        if !dir.is_dir() {
            fs::create_dir_all(&dir)?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_directory(parent)?;
            }
        }
        Ok(FileStorage { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// As [`Storage::sub`], keeping the concrete type.
    pub fn sub_dir(&self, name: &str) -> io::Result<FileStorage> {
        check_name(name)?;
        FileStorage::create_dir_all(self.dir.join(name))
    }
}

impl Storage for FileStorage {
    fn create(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        check_name(name)?;
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(self.dir.join(name))?;
        Ok(Arc::new(FileDevice::new(file)?))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        check_name(name)?;
        let path = self.dir.join(name);
        // Read-only media (or permissions) still allow reading a log for verification;
        // writes through such a device then fail.
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem) => {
                File::open(&path)?
            }
            other => other?,
        };
        Ok(Arc::new(FileDevice::new(file)?))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                continue;
            }
            // Names that are not UTF-8 cannot have been written through this interface.
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        fs::remove_file(self.dir.join(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        check_name(from)?;
        check_name(to)?;
        fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn sync_dir(&self) -> io::Result<()> {
        sync_directory(&self.dir)
    }

    fn sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.sub_dir(name)?))
    }

    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        check_name(name)?;
        let dir = self.dir.join(name);
        if !dir.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", dir.display())));
        }
        Ok(Arc::new(FileStorage { dir }))
    }

    /// Renames the directory aside (durably) before deleting it, so that a crash during the
    /// deletion leaves only the discarded copy, which the next removal of `name` deletes.
    fn remove_sub(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        let dir = self.dir.join(name);
        let discarded = self.dir.join(format!("{name}.discarded"));
        if discarded.is_dir() {
            fs::remove_dir_all(&discarded)?;
        }
        if !dir.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", dir.display())));
        }
        fs::rename(&dir, &discarded)?;
        sync_directory(&self.dir)?;
        fs::remove_dir_all(&discarded)
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn location(&self) -> PathBuf {
        self.dir.clone()
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        Ok(self.dir.join(name).is_file())
    }
}

fn sync_directory(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A regular file as a [`Device`]: positional reads and writes (`pread`/`pwrite`), `sync` is
/// `fdatasync`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// The file's length as this handle wrote it; appends go here. Kept in user space so an
    /// append costs one `pwrite`, not an extra `fstat`.
    len: Mutex<u64>,
}

impl FileDevice {
    /// Wraps an open file (opened for reading, and for writing if it will be written).
    pub fn new(file: File) -> io::Result<FileDevice> {
        let len = file.metadata()?.len();
        Ok(FileDevice { file, len: Mutex::new(len) })
    }

    fn lock_len(&self) -> std::sync::MutexGuard<'_, u64> {
        // The guarded value is a plain number that every holder leaves consistent.
        self.len.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut len = self.lock_len();
        let result = self.file.write_all_at(data, offset);
        // Even a failed write may have extended the file part-way.
        *len = if result.is_ok() { (*len).max(offset + data.len() as u64) } else { self.file.metadata()?.len() };
        result
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        let mut len = self.lock_len();
        let offset = *len;
        match self.file.write_all_at(data, offset) {
            Ok(()) => {
                *len = offset + data.len() as u64;
                Ok(offset)
            }
            Err(e) => {
                if let Ok(metadata) = self.file.metadata() {
                    *len = metadata.len();
                }
                Err(e)
            }
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        // Asked of the file system: another handle on the same file may have written it.
        Ok(self.file.metadata()?.len())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut current = self.lock_len();
        self.file.set_len(len)?;
        *current = len;
        Ok(())
    }
}
