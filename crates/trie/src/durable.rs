//! Persistence of the DSM-Tree: a write-ahead log of logical updates, one record per
//! version, plus periodic checkpoints of the whole key-value content, both in one
//! [`Storage`] (a directory, or memory for crash tests): checkpoint objects at its top and
//! the log in its nested namespace `wal`.
//!
//! The trie itself is only ever in memory; the log and checkpoints exist to rebuild it
//! after a crash. Each log record carries the root its updates produce, so replay
//! checks itself version by version. Recovery loads the newest valid checkpoint and
//! replays the records after it; the record log drops a torn tail, so a half-written
//! version is never replayed.
//!
//! Checkpoint file layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `VIRGACKP` |
//! | 2 | format version (1) |
//! | 8 | trie version |
//! | 32 | root |
//! | 8 | entry count |
//! | … | per entry: key length (u32), key, value length (u32), value |
//! | 4 | crc32 of everything before it |

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;

use alloy_primitives::B256;
use virga_core::device::{DeviceWriter, IntoStorage, MemStorage, Storage};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, SyncPolicy};

use crate::versions::Update;
use crate::Trie;

const CHECKPOINT_MAGIC: &[u8; 8] = b"VIRGACKP";
const CHECKPOINT_FORMAT: u16 = 1;
const LOG_DIR: &str = "wal";

#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("checkpoint {path} is corrupt: {what}")]
    CorruptCheckpoint { path: PathBuf, what: Malformed },
    #[error("log record {lsn} is corrupt: {what}")]
    CorruptRecord { lsn: u64, what: Malformed },
    #[error("log record {lsn} holds version {found}, expected {expected}: versions are missing")]
    VersionGap { lsn: u64, expected: u64, found: u64 },
    #[error("replaying version {version} gives root {actual}, the log recorded {expected}")]
    RootMismatch { version: u64, expected: B256, actual: B256 },
    #[error("version {version} is committed and durable, but the checkpoint after it failed: {source}")]
    CheckpointAfterCommit { version: u64, source: Box<DurableError> },
    #[error("the trie in {} was opened read-only", .dir.display())]
    ReadOnly { dir: PathBuf },
    /// The log is damaged inside (not a torn tail): versions from `first_lost` on cannot be
    /// replayed. Versions before it were read intact.
    #[error("version {first_lost} and later cannot be read: {source}")]
    DamagedLog { first_lost: u64, source: LogError },
}

impl DurableError {
    /// The first version the damage or inconsistency makes unreadable, where it is known.
    pub fn version(&self) -> Option<u64> {
        match self {
            DurableError::DamagedLog { first_lost: version, .. }
            | DurableError::RootMismatch { version, .. }
            | DurableError::VersionGap { expected: version, .. }
            | DurableError::CheckpointAfterCommit { version, .. } => Some(*version),
            _ => None,
        }
    }
}

fn io_error(path: PathBuf) -> impl FnOnce(io::Error) -> DurableError {
    move |source| DurableError::Io { path, source }
}

#[derive(Debug, Clone)]
pub struct DurableOptions {
    /// `Every`: a version is durable when `commit` returns. `None`: only after `sync`.
    pub sync: SyncPolicy,
    /// Write a checkpoint (and drop the log before it) every this many versions; 0 never.
    pub checkpoint_every: u64,
    pub log: LogOptions,
}

impl Default for DurableOptions {
    fn default() -> Self {
        Self { sync: SyncPolicy::Every, checkpoint_every: 1000, log: LogOptions::default() }
    }
}

/// What recovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    pub checkpoint_version: Option<u64>,
    pub replayed_versions: u64,
    /// Bytes of the log's torn tail: cut by [`DurableTrie::open`], left in place (and not
    /// replayed) by [`DurableTrie::open_read_only`].
    pub truncated_log_bytes: u64,
}

/// A trie whose versions survive crashes.
pub struct DurableTrie {
    storage: Arc<dyn Storage>,
    read_only: bool,
    trie: Trie,
    version: u64,
    log: RecordLog,
    options: DurableOptions,
    last_checkpoint: u64,
}

impl DurableTrie {
    /// Opens (or creates) the trie stored at `at` (a directory or a [`Storage`]), recovering
    /// the newest durable version: unfinished checkpoints are removed and a torn log tail is
    /// cut.
    pub fn open(at: impl IntoStorage, options: DurableOptions) -> Result<(Self, RecoveryReport), DurableError> {
        let location = at.location();
        let storage = at.into_storage(true).map_err(io_error(location))?;
        remove_unfinished_checkpoints(&*storage)?;
        let log_storage = storage.sub(LOG_DIR).map_err(io_error(storage.path_of(LOG_DIR)))?;
        DurableTrie::load(storage, log_storage, options, OpenMode::Repair)
    }

    /// Opens the trie stored at `at` without changing anything on disk, for audits: the
    /// log is read up to a torn tail (reported in [`RecoveryReport::truncated_log_bytes`]),
    /// unfinished checkpoints are ignored, and every write fails with
    /// [`DurableError::ReadOnly`]. A missing directory is an error.
    pub fn open_read_only(
        at: impl IntoStorage,
        options: DurableOptions,
    ) -> Result<(Self, RecoveryReport), DurableError> {
        let location = at.location();
        let storage = at.into_storage(false).map_err(io_error(location))?;
        let log_storage: Arc<dyn Storage> = match storage.open_sub(LOG_DIR) {
            Ok(log_storage) => log_storage,
            // Never written to: an empty log.
            Err(error) if error.kind() == io::ErrorKind::NotFound => Arc::new(MemStorage::new()),
            Err(error) => return Err(io_error(storage.path_of(LOG_DIR))(error)),
        };
        DurableTrie::load(storage, log_storage, options, OpenMode::ReadOnly)
    }

    fn load(
        storage: Arc<dyn Storage>,
        log_storage: Arc<dyn Storage>,
        options: DurableOptions,
        mode: OpenMode,
    ) -> Result<(Self, RecoveryReport), DurableError> {
        let (mut trie, mut version) = (Trie::new(), 0);
        let mut checkpoint_version = None;
        if let Some((loaded_version, loaded)) = newest_checkpoint(&*storage)? {
            trie = loaded;
            version = loaded_version;
            checkpoint_version = Some(loaded_version);
        }
        let mut log_options = options.log.clone();
        log_options.sync = options.sync;
        let mut replayed = 0;
        let mut replay_error = None;
        let opened = RecordLog::open_with(log_storage, log_options, mode, |lsn, payload| {
            if replay_error.is_none() {
                match replay(&mut trie, &mut version, lsn, payload) {
                    Ok(applied) => replayed += u64::from(applied),
                    Err(error) => replay_error = Some(error),
                }
            }
        });
        let (log, recovered) = match opened {
            Ok(opened) => opened,
            // Every record before the damage was replayed, so the damage holds the next version.
            Err(source @ LogError::Corrupt { .. }) => {
                return Err(DurableError::DamagedLog { first_lost: version + 1, source })
            }
            Err(other) => return Err(other.into()),
        };
        if let Some(error) = replay_error {
            return Err(error);
        }
        let torn_bytes = recovered.repair.as_ref().map_or(0, |tail| tail.bytes);
        let report =
            RecoveryReport { checkpoint_version, replayed_versions: replayed, truncated_log_bytes: torn_bytes };
        let last_checkpoint = checkpoint_version.unwrap_or(0);
        let read_only = mode == OpenMode::ReadOnly;
        Ok((Self { storage, read_only, trie, version, log, options, last_checkpoint }, report))
    }

    pub fn trie(&self) -> &Trie {
        &self.trie
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Applies `updates` as the next version, logs them with the new root, and (with
    /// `SyncPolicy::Every`) makes the version durable before returning.
    pub fn commit(&mut self, updates: &[Update]) -> Result<(u64, B256), DurableError> {
        let mut next = self.trie.snapshot();
        apply(&mut next, updates);
        self.commit_applied(next, updates)
    }

    /// Commits a trie the caller already derived from the current one by applying `updates`
    /// (and usually already hashed), so the updates are not applied and hashed twice. The log
    /// records the updates and `next`'s root; recovery replays the updates and refuses a root
    /// that differs, so a `next` that does not match its updates cannot go unnoticed.
    pub fn commit_applied(&mut self, next: Trie, updates: &[Update]) -> Result<(u64, B256), DurableError> {
        self.check_writable()?;
        let root = next.root_hash();
        let version = self.version + 1;
        self.log.append(&encode_record(version, root, updates))?;
        self.trie = next;
        self.version = version;
        if self.options.checkpoint_every > 0 && version - self.last_checkpoint >= self.options.checkpoint_every {
            self.checkpoint()
                .map_err(|source| DurableError::CheckpointAfterCommit { version, source: Box::new(source) })?;
        }
        Ok((version, root))
    }

    /// Makes every committed version durable; returns the durable version.
    pub fn sync(&mut self) -> Result<u64, DurableError> {
        self.log.sync()?;
        Ok(self.version)
    }

    /// Writes a checkpoint of the current version, then drops older checkpoints and the
    /// log records it covers. The checkpoint is durable (renamed into place and the
    /// directory synced) before anything it replaces is deleted.
    pub fn checkpoint(&mut self) -> Result<PathBuf, DurableError> {
        self.check_writable()?;
        self.log.sync()?;
        let path = write_checkpoint(&*self.storage, self.version, &self.trie)?;
        self.log.truncate_prefix(self.log.next_lsn())?;
        for (old_version, old_name) in list_checkpoints(&*self.storage)? {
            if old_version < self.version {
                self.storage.remove(&old_name).map_err(io_error(self.storage.path_of(&old_name)))?;
            }
        }
        self.storage.sync_dir().map_err(io_error(self.storage.location()))?;
        self.last_checkpoint = self.version;
        Ok(path)
    }

    fn check_writable(&self) -> Result<(), DurableError> {
        if self.read_only {
            return Err(DurableError::ReadOnly { dir: self.storage.location() });
        }
        Ok(())
    }
}

/// Replays one log record onto `trie` at `version`; returns whether it was applied (records
/// at or below the checkpoint's version are skipped).
fn replay(trie: &mut Trie, version: &mut u64, lsn: u64, payload: &[u8]) -> Result<bool, DurableError> {
    let (record_version, root, updates) =
        decode_record(payload).map_err(|what| DurableError::CorruptRecord { lsn, what })?;
    if record_version <= *version {
        return Ok(false);
    }
    if record_version != *version + 1 {
        return Err(DurableError::VersionGap { lsn, expected: *version + 1, found: record_version });
    }
    apply(trie, &updates);
    let actual = trie.root_hash();
    if actual != root {
        return Err(DurableError::RootMismatch { version: record_version, expected: root, actual });
    }
    *version = record_version;
    Ok(true)
}

fn apply(trie: &mut Trie, updates: &[Update]) {
    for (key, value) in updates {
        match value {
            Some(value) => trie.insert(key, value),
            None => {
                trie.remove(key);
            }
        }
    }
}

/// Record payload: version (u64), root (32), update count (u32), then per update the
/// key length (u32), key, a flag (1 put, 0 delete) and for puts value length (u32), value.
fn encode_record(version: u64, root: B256, updates: &[Update]) -> Vec<u8> {
    let mut out = Vec::with_capacity(44 + updates.len() * 64);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(root.as_slice());
    out.extend_from_slice(&(updates.len() as u32).to_le_bytes());
    for (key, value) in updates {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        match value {
            Some(value) => {
                out.push(1);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            None => out.push(0),
        }
    }
    out
}

/// What is wrong with a log record or a checkpoint whose bytes are intact on the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("{what}: needs {needs} bytes, {left} left")]
    Short { what: String, needs: usize, left: usize },
    #[error("{count} {what} cannot fit in {left} bytes")]
    TooMany { what: &'static str, count: u64, left: usize },
    #[error("{what}: key of {len} bytes exceeds {max}", max = crate::MAX_KEY_BYTES)]
    KeyTooLong { what: String, len: usize },
    #[error("update {index}: flag {flag} is neither put (1) nor delete (0)")]
    Flag { index: usize, flag: u8 },
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("shorter than its checksum")]
    NoChecksum,
    #[error("checksum mismatch")]
    Checksum,
    #[error("bad magic")]
    Magic,
    #[error("unknown format version {0}")]
    Format(u16),
    #[error("content hashes to {actual}, header says {header}")]
    Root { actual: B256, header: B256 },
}

/// A cursor over untrusted bytes: every read checks the length first.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: impl Into<String>) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < len {
            return Err(Malformed::Short { what: what.into(), needs: len, left: self.bytes.len() });
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }
    fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, Malformed> {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(buf))
    }
    fn sized(&mut self, what: &str) -> Result<&'a [u8], Malformed> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }
}

fn decode_record(payload: &[u8]) -> Result<(u64, B256, Vec<Update>), Malformed> {
    let mut reader = Reader { bytes: payload };
    let version = reader.u64("version")?;
    let root = B256::from_slice(reader.take(32, "root")?);
    let count = reader.u32("update count")? as usize;
    // Each update takes at least 5 bytes, which bounds the count before allocating.
    if count > reader.bytes.len() / 5 {
        return Err(Malformed::TooMany { what: "updates", count: count as u64, left: reader.bytes.len() });
    }
    let mut updates = Vec::with_capacity(count);
    for index in 0..count {
        let key = reader.sized(&format!("update {index} key"))?.to_vec();
        if key.len() > crate::MAX_KEY_BYTES {
            return Err(Malformed::KeyTooLong { what: format!("update {index}"), len: key.len() });
        }
        let value = match reader.take(1, "flag")?[0] {
            0 => None,
            1 => Some(reader.sized(&format!("update {index} value"))?.to_vec()),
            flag => return Err(Malformed::Flag { index, flag }),
        };
        updates.push((key, value));
    }
    if !reader.bytes.is_empty() {
        return Err(Malformed::Trailing(reader.bytes.len()));
    }
    Ok((version, root, updates))
}

fn checkpoint_name(version: u64) -> String {
    format!("checkpoint-{version:020}.ckpt")
}

/// Checkpoint objects, oldest first, by version.
fn list_checkpoints(storage: &dyn Storage) -> Result<Vec<(u64, String)>, DurableError> {
    let mut found = Vec::new();
    for name in storage.list().map_err(io_error(storage.location()))? {
        if let Some(version) = name.strip_prefix("checkpoint-").and_then(|r| r.strip_suffix(".ckpt")) {
            if let Ok(version) = version.parse::<u64>() {
                found.push((version, name));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Deletes checkpoint objects a crash left half-written (never renamed into place).
fn remove_unfinished_checkpoints(storage: &dyn Storage) -> Result<(), DurableError> {
    for name in storage.list().map_err(io_error(storage.location()))? {
        if name.starts_with("checkpoint-") && name.ends_with(".ckpt.tmp") {
            storage.remove(&name).map_err(io_error(storage.path_of(&name)))?;
        }
    }
    Ok(())
}

/// Writes the checkpoint of `version` under a temporary name, syncs it, renames it into
/// place and syncs the directory; returns how the storage names it.
fn write_checkpoint(storage: &dyn Storage, version: u64, trie: &Trie) -> Result<PathBuf, DurableError> {
    let name = checkpoint_name(version);
    let temporary = format!("{name}.tmp");
    let temporary_path = storage.path_of(&temporary);
    let device = storage.create(&temporary).map_err(io_error(temporary_path.clone()))?;
    let mut writer = DeviceWriter::new(device, 1 << 20);
    let mut hasher = crc32fast::Hasher::new();
    let mut write = |bytes: &[u8]| -> Result<(), DurableError> {
        hasher.update(bytes);
        writer.write_all(bytes).map_err(io_error(temporary_path.clone()))
    };
    let entries = trie.entries();
    write(CHECKPOINT_MAGIC)?;
    write(&CHECKPOINT_FORMAT.to_le_bytes())?;
    write(&version.to_le_bytes())?;
    write(trie.root_hash().as_slice())?;
    write(&(entries.len() as u64).to_le_bytes())?;
    for (key, value) in &entries {
        write(&(key.len() as u32).to_le_bytes())?;
        write(key)?;
        write(&(value.len() as u32).to_le_bytes())?;
        write(value)?;
    }
    let checksum = hasher.finalize();
    writer.write_all(&checksum.to_le_bytes()).map_err(io_error(temporary_path.clone()))?;
    writer.finish().map_err(io_error(temporary_path))?;
    let path = storage.path_of(&name);
    storage.rename(&temporary, &name).map_err(io_error(path.clone()))?;
    storage.sync_dir().map_err(io_error(storage.location()))?;
    Ok(path)
}

fn read_checkpoint(storage: &dyn Storage, name: &str) -> Result<(u64, Trie), DurableError> {
    let path = storage.path_of(name);
    let corrupt = |what: Malformed| DurableError::CorruptCheckpoint { path: path.clone(), what };
    let bytes = storage.open(name).and_then(|device| device.read_all()).map_err(io_error(path.clone()))?;
    if bytes.len() < 4 {
        return Err(corrupt(Malformed::NoChecksum));
    }
    let (body, checksum) = bytes.split_at(bytes.len() - 4);
    let expected = u32::from_le_bytes([checksum[0], checksum[1], checksum[2], checksum[3]]);
    if crc32fast::hash(body) != expected {
        return Err(corrupt(Malformed::Checksum));
    }
    let mut reader = Reader { bytes: body };
    if reader.take(8, "magic").map_err(corrupt)? != CHECKPOINT_MAGIC {
        return Err(corrupt(Malformed::Magic));
    }
    let format = reader.take(2, "format").map_err(corrupt)?;
    if u16::from_le_bytes([format[0], format[1]]) != CHECKPOINT_FORMAT {
        return Err(corrupt(Malformed::Format(u16::from_le_bytes([format[0], format[1]]))));
    }
    let version = reader.u64("version").map_err(corrupt)?;
    let root = B256::from_slice(reader.take(32, "root").map_err(corrupt)?);
    let count = reader.u64("entry count").map_err(corrupt)?;
    let mut trie = Trie::new();
    for index in 0..count {
        let key = reader.sized(&format!("entry {index} key")).map_err(corrupt)?;
        if key.len() > crate::MAX_KEY_BYTES {
            return Err(corrupt(Malformed::KeyTooLong { what: format!("entry {index}"), len: key.len() }));
        }
        let value = reader.sized(&format!("entry {index} value")).map_err(corrupt)?;
        trie.insert(key, value);
    }
    if !reader.bytes.is_empty() {
        return Err(corrupt(Malformed::Trailing(reader.bytes.len())));
    }
    let actual = trie.root_hash();
    if actual != root {
        return Err(corrupt(Malformed::Root { actual, header: root }));
    }
    Ok((version, trie))
}

/// The newest checkpoint, read and checked. A corrupt one is an error, not skipped: it
/// was made durable before the log it covers was deleted, so falling back to an older
/// state would silently lose versions.
fn newest_checkpoint(storage: &dyn Storage) -> Result<Option<(u64, Trie)>, DurableError> {
    let Some((_, name)) = list_checkpoints(storage)?.pop() else { return Ok(None) };
    read_checkpoint(storage, &name).map(Some)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use virga_core::device::CrashPoint;

    use super::*;

    #[test]
    fn reopening_replays_after_the_checkpoint_and_a_corrupt_checkpoint_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let options = DurableOptions { checkpoint_every: 3, ..Default::default() };
        let (mut trie, report) = DurableTrie::open(dir.path(), options.clone()).unwrap();
        assert_eq!(report.checkpoint_version, None);
        let mut roots = Vec::new();
        for v in 0..5u8 {
            roots.push(trie.commit(&[(vec![v; 32], Some(vec![v + 1; 40]))]).unwrap().1);
        }
        drop(trie);
        let (trie, report) = DurableTrie::open(dir.path(), options.clone()).unwrap();
        assert_eq!((trie.version(), trie.trie().root_hash()), (5, roots[4]));
        assert_eq!((report.checkpoint_version, report.replayed_versions), (Some(3), 2));
        drop(trie);

        let checkpoint = dir.path().join(checkpoint_name(3));
        let mut bytes = fs::read(&checkpoint).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        fs::write(&checkpoint, bytes).unwrap();
        match DurableTrie::open(dir.path(), options) {
            Err(DurableError::CorruptCheckpoint { path, what }) => {
                assert_eq!(path, checkpoint);
                assert_eq!(what, Malformed::Checksum, "{what}");
            }
            other => panic!("expected a corrupt-checkpoint error, got {:?}", other.map(|(t, _)| t.version())),
        }
    }

    #[test]
    fn read_only_open_changes_nothing_and_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let options = DurableOptions { checkpoint_every: 3, ..Default::default() };
        let (mut trie, _) = DurableTrie::open(dir.path(), options.clone()).unwrap();
        for v in 0..5u8 {
            trie.commit(&[(vec![v; 32], Some(vec![v; 8]))]).unwrap();
        }
        let root = trie.trie().root_hash();
        drop(trie);
        // A torn append and an unfinished checkpoint, as a crash leaves them.
        let wal = dir.path().join(LOG_DIR);
        let segment = fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).max().unwrap();
        let mut bytes = fs::read(&segment).unwrap();
        bytes.extend_from_slice(&[0xB5, 1, 0, 0, 9]);
        fs::write(&segment, &bytes).unwrap();
        let unfinished = dir.path().join(format!("{}.tmp", checkpoint_name(9)));
        fs::write(&unfinished, b"half").unwrap();

        let (mut reader, report) = DurableTrie::open_read_only(dir.path(), options.clone()).unwrap();
        assert_eq!((reader.version(), reader.trie().root_hash()), (5, root));
        assert_eq!((report.checkpoint_version, report.replayed_versions, report.truncated_log_bytes), (Some(3), 2, 5));
        assert!(matches!(reader.commit(&[(vec![9; 32], None)]), Err(DurableError::ReadOnly { .. })));
        assert!(matches!(reader.checkpoint(), Err(DurableError::ReadOnly { .. })));
        assert_eq!(fs::read(&segment).unwrap(), bytes, "the torn tail is still there");
        assert!(unfinished.exists());
        assert!(DurableTrie::open_read_only(dir.path().join("missing"), options.clone()).is_err());
        assert!(!dir.path().join("missing").exists());

        let (trie, report) = DurableTrie::open(dir.path(), options).unwrap();
        assert_eq!((trie.version(), report.truncated_log_bytes), (5, 5));
        assert!(!unfinished.exists());
    }

    #[test]
    fn crashes_of_the_memory_device_keep_every_synced_version() {
        let memory = MemStorage::new();
        let options = DurableOptions { checkpoint_every: 4, sync: SyncPolicy::None, ..Default::default() };
        let (mut trie, _) = DurableTrie::open(&memory, options.clone()).unwrap();
        let mut roots = vec![trie.trie().root_hash()];
        for v in 0..30u8 {
            roots.push(trie.commit(&[(vec![v % 7; 32], Some(vec![v; 50]))]).unwrap().1);
            let synced = if v % 3 == 0 { trie.sync().unwrap() } else { 0 };
            let state = memory.snapshot();
            for seed in 0..8 {
                let (recovered, _) = DurableTrie::open(&state.crash(seed + u64::from(v) * 100), options.clone())
                    .unwrap_or_else(|e| panic!("version {}: seed {seed}: {e}", v + 1));
                assert!(recovered.version() >= synced, "synced {synced}, recovered {}", recovered.version());
                assert_eq!(recovered.trie().root_hash(), roots[recovered.version() as usize]);
            }
        }
    }

    /// Commits versions (each durable when `commit` returns), with checkpoints; returns the
    /// roots by version, and per commit the storage operations before it and the version
    /// acknowledged by then.
    fn commit_versions(storage: &CrashPoint) -> (Vec<B256>, Vec<(u64, u64)>) {
        let options = DurableOptions { checkpoint_every: 3, ..Default::default() };
        let (mut trie, _) = DurableTrie::open(storage, options).unwrap();
        let mut roots = vec![trie.trie().root_hash()];
        let mut steps = Vec::new();
        for v in 0..10u8 {
            steps.push((storage.operations(), trie.version()));
            roots.push(trie.commit(&[(vec![v % 4; 32], Some(vec![v; 60]))]).unwrap().1);
        }
        steps.push((storage.operations(), trie.version()));
        (roots, steps)
    }

    #[test]
    fn a_crash_at_any_storage_operation_keeps_every_acknowledged_version() {
        let (_, steps) = commit_versions(&CrashPoint::new(MemStorage::new(), 0));
        let total = steps.last().unwrap().0;
        for crash_at in 1..=total {
            let crash_point = CrashPoint::new(MemStorage::new(), crash_at);
            let (roots, steps) = commit_versions(&crash_point);
            let acknowledged = steps.iter().rev().find(|(operations, _)| *operations < crash_at).map_or(0, |s| s.1);
            let state = crash_point.state_at_crash().unwrap();
            for seed in 0..3 {
                let options = DurableOptions { checkpoint_every: 3, ..Default::default() };
                let (recovered, _) = DurableTrie::open(&state.crash(seed), options)
                    .unwrap_or_else(|e| panic!("crash before operation {crash_at}, seed {seed}: {e}"));
                assert!(recovered.version() >= acknowledged, "operation {crash_at}: lost version {acknowledged}");
                assert_eq!(recovered.trie().root_hash(), roots[recovered.version() as usize]);
            }
        }
    }

    #[test]
    fn records_round_trip_and_garbage_is_rejected() {
        let updates: Vec<Update> = vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)];
        let encoded = encode_record(7, B256::repeat_byte(3), &updates);
        assert_eq!(decode_record(&encoded), Ok((7, B256::repeat_byte(3), updates)));
        for cut in 0..encoded.len() {
            assert!(decode_record(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_flag = encoded.clone();
        bad_flag[44 + 4 + 1] = 9;
        assert!(matches!(decode_record(&bad_flag).unwrap_err(), Malformed::Flag { flag: 9, .. }));
        let mut huge_count = encoded;
        huge_count[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_record(&huge_count).unwrap_err(), Malformed::TooMany { what: "updates", .. }));
    }
}
