//! Opening a damaged log read-only up to its first damage.
//!
//! `virga-log` refuses to open a log with damage anywhere but a torn tail, and says where the
//! first damaged record starts. An auditor still wants the blocks before it: [`IntactPrefix`]
//! is a read-only view of the log's storage that ends right there (the segments before the
//! damaged one, and the damaged one cut at the damage), which the log opens like any other.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use virga_core::device::{Device, Storage};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, TailRepair};

use super::StoreError;

/// How the records of a log opened by [`open_intact_prefix`] end.
#[derive(Debug)]
pub(super) enum Ending {
    /// After the last record: the log is sound.
    Clean,
    /// At a torn tail, left in place.
    Torn(TailRepair),
    /// At damage, the log's [`LogError::Corrupt`].
    Damaged(LogError),
}

/// Opens the log in `storage` read-only, indexing every record before its first damage or
/// torn tail, and says how it ends. Changes nothing.
pub(super) fn open_intact_prefix(
    storage: &Arc<dyn Storage>,
    options: &LogOptions,
) -> Result<(RecordLog, Ending), StoreError> {
    match RecordLog::open_with(storage, options.clone(), OpenMode::ReadOnly, |_, _| {}) {
        Ok((log, opened)) => Ok((log, opened.repair.map_or(Ending::Clean, Ending::Torn))),
        Err(error) => {
            let Some(damage) = error.damage() else { return Err(StoreError::from_log(error, 0)) };
            let view = IntactPrefix::new(Arc::clone(storage), &damage.segment, damage.offset)
                .map_err(|source| StoreError::Io { op: "list", path: storage.location(), source })?;
            let view: Arc<dyn Storage> = Arc::new(view);
            let (log, _) = RecordLog::open_with(&view, options.clone(), OpenMode::ReadOnly, |_, _| {})
                .map_err(|e| StoreError::from_log(e, 0))?;
            Ok((log, Ending::Damaged(error)))
        }
    }
}

/// A read-only view of a log's storage that ends at the damage: the objects named before the
/// damaged segment, and the damaged segment cut at `offset` (left out when the damage is in
/// its header, at offset 0). Segment names are zero-padded LSNs, so name order is log order.
#[derive(Debug)]
struct IntactPrefix {
    inner: Arc<dyn Storage>,
    /// Objects visible through the view, with the length each is cut to.
    visible: Vec<(String, Option<u64>)>,
}

impl IntactPrefix {
    fn new(inner: Arc<dyn Storage>, damaged: &std::path::Path, offset: u64) -> io::Result<IntactPrefix> {
        let names = inner.list()?;
        let damaged_name = names.iter().find(|name| inner.path_of(name) == damaged).cloned();
        let visible = match damaged_name {
            // The damage is not in an object of this storage: nothing is known to be intact.
            None => Vec::new(),
            Some(damaged_name) => {
                let mut visible: Vec<(String, Option<u64>)> =
                    names.into_iter().filter(|name| *name < damaged_name).map(|name| (name, None)).collect();
                if offset > 0 {
                    visible.push((damaged_name, Some(offset)));
                }
                visible
            }
        };
        Ok(IntactPrefix { inner, visible })
    }
}

fn read_only() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "read-only view of a damaged chain store")
}

impl Storage for IntactPrefix {
    fn create(&self, _name: &str) -> io::Result<Arc<dyn Device>> {
        Err(read_only())
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        let Some((_, cut)) = self.visible.iter().find(|(visible, _)| visible == name) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name} lies past the damage")));
        };
        let inner = self.inner.open(name)?;
        Ok(match cut {
            Some(len) => Arc::new(CutDevice { inner, len: *len }),
            None => inner,
        })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.visible.iter().map(|(name, _)| name.clone()).collect())
    }

    fn remove(&self, _name: &str) -> io::Result<()> {
        Err(read_only())
    }

    fn rename(&self, _from: &str, _to: &str) -> io::Result<()> {
        Err(read_only())
    }

    fn sync_dir(&self) -> io::Result<()> {
        Err(read_only())
    }

    fn sub(&self, _name: &str) -> io::Result<Arc<dyn Storage>> {
        Err(read_only())
    }

    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Err(io::Error::new(io::ErrorKind::NotFound, format!("a chain store holds no namespace {name}")))
    }

    fn remove_sub(&self, _name: &str) -> io::Result<()> {
        Err(read_only())
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.inner.path_of(name)
    }

    fn location(&self) -> PathBuf {
        self.inner.location()
    }
}

/// A device whose bytes end at `len`.
#[derive(Debug)]
struct CutDevice {
    inner: Arc<dyn Device>,
    len: u64,
}

impl Device for CutDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let left = self.len.saturating_sub(offset);
        let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if take == 0 {
            return Ok(0);
        }
        self.inner.read_at(&mut buf[..take], offset)
    }

    fn write_at(&self, _data: &[u8], _offset: u64) -> io::Result<()> {
        Err(read_only())
    }

    fn append(&self, _data: &[u8]) -> io::Result<u64> {
        Err(read_only())
    }

    fn sync(&self) -> io::Result<()> {
        Err(read_only())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.len()?.min(self.len))
    }

    fn truncate(&self, _len: u64) -> io::Result<()> {
        Err(read_only())
    }
}
