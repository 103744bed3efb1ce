//! The chain store: blocks kept in a `virga-log` record log, found again by number or hash.
//!
//! The store keeps opaque block bytes; what they mean is the block codec's business. Each
//! block is one log record whose payload starts with the block's number and hash, all under
//! the log's checksum. Numbers are contiguous from 0 (genesis), so a block is appended only as
//! the successor of the head, and no hash is stored twice.
//!
//! ```
//! use alloy_primitives::B256;
//! use virga_ledger::store::{ChainStore, StoreOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let (mut store, recovery) = ChainStore::open(dir.path(), StoreOptions::default())?;
//! assert_eq!(recovery.blocks, 0);
//! store.append(0, B256::repeat_byte(1), b"genesis")?;
//! store.append(1, B256::repeat_byte(2), b"block one")?;
//! drop(store);
//!
//! let (store, recovery) = ChainStore::open(dir.path(), StoreOptions::default())?;
//! assert_eq!(recovery.blocks, 2);
//! assert_eq!(store.head(), Some((1, B256::repeat_byte(2))));
//! assert_eq!(store.get_by_hash(&B256::repeat_byte(1))?.as_deref(), Some(&b"genesis"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # On disk (chain-store format 2)
//!
//! The store's directory (or any [`Storage`]) is a `virga-log` record log: segment files
//! named after the LSN of their first record (`00000000000000000001.seg`, ...), each a
//! 24-byte segment header (`VIRGALOG`, log format version 1) and records, each a 20-byte
//! record header (magic, version, length, LSN, CRC-32 of header and payload) and the payload.
//! The crate README of `virga-log` has the byte layout. Block `n` is the record with LSN
//! `n + 1`, and its payload is:
//!
//! | bytes  | field                  |
//! |--------|------------------------|
//! | 0..8   | block number `n` (u64 LE) |
//! | 8..40  | block hash             |
//! | 40..   | block bytes            |
//!
//! CRC-32 catches every error burst of up to 32 bits, so any single changed byte of a record
//! (header, prefix, block bytes) fails the check. The prefix repeats what the LSN says so
//! that a record read back is known to be the block asked for.
//!
//! Format 1 wrote the store's own `.blk` segments (magic `VIRGACHN`); a directory holding
//! one is refused with [`StoreError::OlderFormat`], which says to re-create the chain.
//!
//! # Opening, checking, repairing
//!
//! [`ChainStore::open`] reads every record once (through the log's open visitor, which shows
//! each payload once), checks the chain's rules on it (number, prefix, hash uniqueness) and
//! keeps only an index: the log's (per block, segment, offset and length) and the store's
//! (per block its hash, and a map from hash to number). Block bytes are read back on demand.
//!
//! * A torn tail (what an interrupted append leaves at the end of the last segment, as
//!   `virga-log` judges it) is cut by the log's repair step, only after the whole log was
//!   found otherwise sound, and reported in [`StoreRecovery`].
//! * Anything else is refused with [`StoreError::Corrupt`] naming the segment file, byte
//!   offset and block number, and nothing is changed: damage that the log will not take for
//!   a torn write, a record with the wrong number or a repeated hash, missing segments.
//!
//! [`ChainStore::open_read_only`] indexes the blocks before a torn tail and changes nothing:
//! for auditors. [`scan`] is the audit reader: it changes nothing either, yields every intact
//! block and ends with the first damage, named.
//!
//! # Durability
//!
//! `append` hands each block to the device before it returns (the log's write buffer is
//! flushed), so a crash of the process loses nothing that `append` returned; [`SyncPolicy`]
//! decides when it is fsynced against a machine crash. [`ChainStore::durable_head`] is the
//! last block known to be on stable storage. One process must be the only writer of a store.

mod error;
mod format;
mod scan;
#[cfg(test)]
mod tests;
mod view;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use alloy_primitives::B256;
use virga_core::device::{IntoStorage, Storage};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, Recovered};

pub use error::{Damage, StoreError};
use format::{encode_payload, is_older_format_segment, lsn_of, number_at};
pub use format::{
    segment_file_name, FORMAT_VERSION, MAX_PAYLOAD_BYTES, PREFIX_LEN, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use scan::ChainIndex;
pub use scan::{scan, Scan};
use view::open_intact_prefix;

/// Default for [`StoreOptions::segment_bytes`]: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// Above this capacity the encoding buffer is released after an append, so one huge block
/// does not pin its size in memory for the life of the store.
const KEEP_BUFFER_BYTES: usize = 1 << 20;

/// When appended blocks are fsynced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every [`ChainStore::append`] fsyncs its block before returning.
    #[default]
    Every,
    /// Only [`ChainStore::sync`] and the start of a new segment fsync; until then the
    /// operating system decides when blocks reach the disk.
    None,
    /// An append fsyncs when `n` blocks are not yet durable (0 and 1 mean every append).
    EveryN(u32),
}

/// How a [`ChainStore`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// When to fsync.
    pub sync: SyncPolicy,
    /// A new segment is started before a block that would make the current one larger than
    /// this (headers included). A segment holding a single block may exceed it.
    pub segment_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { sync: SyncPolicy::default(), segment_bytes: DEFAULT_SEGMENT_BYTES }
    }
}

/// The log options a store with `options` runs its log with. The store fsyncs itself (the
/// log's policy cannot say "every n"), and flushes after each append.
pub(crate) fn log_options(options: &StoreOptions) -> LogOptions {
    LogOptions {
        segment_bytes: options.segment_bytes,
        max_record_bytes: MAX_PAYLOAD_BYTES + PREFIX_LEN as u32,
        sync: virga_log::SyncPolicy::None,
        ..LogOptions::default()
    }
}

/// A block as stored: number, hash and the bytes given to [`ChainStore::append`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// The block number.
    pub number: u64,
    /// The hash stored with the block.
    pub hash: B256,
    /// The block's bytes.
    pub payload: Vec<u8>,
}

/// Where a block's record lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    /// The segment file, as the storage names it.
    pub file: PathBuf,
    /// Byte offset of the record header in `file`.
    pub offset: u64,
    /// Length of the record: log record header, block prefix and block bytes.
    pub record_bytes: u64,
}

/// A torn tail at the end of the last segment: cut by [`ChainStore::open`], found and left
/// in place by [`ChainStore::open_read_only`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailRepair {
    /// The last segment.
    pub file: PathBuf,
    /// Where the torn data begins; the repaired file ends here (0 for a segment whose
    /// creation was interrupted: it is rewritten as a bare header).
    pub offset: u64,
    /// Bytes removed (or, read-only, that would be).
    pub bytes: u64,
    /// Number the first dropped block would have had; also the number of blocks kept.
    pub first_dropped: u64,
    /// What was wrong at `offset`.
    pub damage: Damage,
}

/// What opening a [`ChainStore`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreRecovery {
    /// Blocks in the store, numbered `0..blocks`.
    pub blocks: u64,
    /// Bytes cut from the end of the last segment (0 when it ended cleanly, and read-only).
    pub truncated_bytes: u64,
    /// The torn tail, if there was one.
    pub repair: Option<TailRepair>,
    /// Segment files.
    pub segments: usize,
}

impl StoreRecovery {
    fn new(recovered: &Recovered, blocks: u64) -> StoreRecovery {
        let repair = recovered.repair.as_ref().map(|tail| TailRepair {
            file: tail.segment.clone(),
            offset: tail.offset,
            bytes: tail.bytes,
            first_dropped: blocks,
            damage: Damage::Record { reason: tail.reason.clone() },
        });
        StoreRecovery { blocks, truncated_bytes: recovered.truncated_bytes, repair, segments: recovered.segments }
    }
}

/// Refuses a store holding segments of chain-store format 1.
fn refuse_older_format(storage: &dyn Storage) -> Result<(), StoreError> {
    let names = match storage.list() {
        Ok(names) => names,
        // A store that does not exist yet holds nothing older; the log says so if it matters.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(StoreError::Io { op: "list", path: storage.location(), source }),
    };
    let mut older: Vec<&String> = names.iter().filter(|name| is_older_format_segment(name)).collect();
    older.sort();
    match older.first() {
        Some(name) => Err(StoreError::OlderFormat { file: storage.path_of(name) }),
        None => Ok(()),
    }
}

fn open_storage(at: impl IntoStorage, create: bool) -> Result<Arc<dyn Storage>, StoreError> {
    let location = at.location();
    at.into_storage(create).map_err(|source| StoreError::Io { op: "open the storage of", path: location, source })
}

/// An append-only store of blocks, indexed by number and by hash.
pub struct ChainStore {
    log: RecordLog,
    options: StoreOptions,
    /// The chain's index: each block's hash by number, and number by hash.
    index: ChainIndex,
    /// Refuses writes (opened by [`ChainStore::open_read_only`]).
    read_only: bool,
    /// The record being appended: prefix and block bytes.
    encoded: Vec<u8>,
}

impl fmt::Debug for ChainStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainStore")
            .field("dir", &self.log.dir())
            .field("blocks", &self.len())
            .field("segments", &self.log.segment_count())
            .field("head", &self.head())
            .field("durable", &self.durable_head())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl ChainStore {
    /// Opens (creating if needed) the store at `at` (a directory, or any [`Storage`]), checks
    /// every stored record and builds the index: what a node restarting after a crash needs.
    ///
    /// The log is first opened without repairing anything. If a torn tail is all that is
    /// wrong, the log's repair step cuts it and the cut is reported in the
    /// [`StoreRecovery`]; any other damage is refused with [`StoreError::Corrupt`] and leaves
    /// the files untouched (see the module documentation). Every block kept is durable when
    /// this returns.
    pub fn open(at: impl IntoStorage, options: StoreOptions) -> Result<(ChainStore, StoreRecovery), StoreError> {
        let storage = open_storage(at, true)?;
        refuse_older_format(&*storage)?;
        let log_options = log_options(&options);
        let mut index = ChainIndex::default();
        let opened = RecordLog::open_with(&storage, log_options.clone(), OpenMode::Strict, |lsn, payload| {
            index.visit(lsn, payload)
        });
        let (log, recovered) = match opened {
            Ok(opened) => opened,
            Err(LogError::TornTail { .. }) => {
                refuse_violation(&index, &storage, &log_options)?;
                // The tail is all that is wrong: cut it (the log's repair step), then index
                // what remains.
                index = ChainIndex::default();
                RecordLog::open_with(&storage, log_options, OpenMode::Repair, |lsn, payload| index.visit(lsn, payload))
                    .map_err(|e| StoreError::from_log(e, 0))?
            }
            Err(error) => {
                refuse_violation(&index, &storage, &log_options)?;
                return Err(StoreError::from_log(error, index.hashes.len() as u64));
            }
        };
        ChainStore::indexed(log, recovered, index, options, false)
    }

    /// Opens the store at `at` without changing anything, for auditors: indexes the blocks
    /// before a torn tail (reported in [`StoreRecovery::repair`], not cut) and refuses any
    /// other damage. Appends and syncs are refused with [`StoreError::ReadOnly`].
    pub fn open_read_only(
        at: impl IntoStorage,
        options: StoreOptions,
    ) -> Result<(ChainStore, StoreRecovery), StoreError> {
        let storage = open_storage(at, false)?;
        refuse_older_format(&*storage)?;
        let log_options = log_options(&options);
        let mut index = ChainIndex::default();
        let opened = RecordLog::open_with(&storage, log_options.clone(), OpenMode::ReadOnly, |lsn, payload| {
            index.visit(lsn, payload)
        });
        match opened {
            Ok((log, recovered)) => ChainStore::indexed(log, recovered, index, options, true),
            Err(error) => {
                refuse_violation(&index, &storage, &log_options)?;
                Err(StoreError::from_log(error, index.hashes.len() as u64))
            }
        }
    }

    /// The store over an opened log whose records `index` has seen, or the first violation
    /// of the chain's rules.
    fn indexed(
        log: RecordLog,
        recovered: Recovered,
        index: ChainIndex,
        options: StoreOptions,
        read_only: bool,
    ) -> Result<(ChainStore, StoreRecovery), StoreError> {
        if let Some(error) = index.violation_error(&log) {
            return Err(error);
        }
        if log.first_lsn() != 1 {
            let file = log.storage().path_of(&virga_log::segment_file_name(log.first_lsn()));
            let damage = Damage::MissingBlocks { first: log.first_lsn() - 1 };
            return Err(StoreError::Corrupt { file, offset: 0, block: 0, damage });
        }
        let blocks = index.hashes.len() as u64;
        assert_eq!(blocks + 1, log.next_lsn(), "the chain index covers every record of the log");
        let recovery = StoreRecovery::new(&recovered, blocks);
        Ok((ChainStore { log, options, index, read_only, encoded: Vec::new() }, recovery))
    }

    /// Appends block `number` with `hash` and bytes `payload`.
    ///
    /// `number` must be the head's number plus one (0 for the first block) and `hash` must
    /// not be stored yet; a refused append changes nothing. The block is handed to the device
    /// before this returns, and fsynced according to [`StoreOptions::sync`].
    ///
    /// If a write, fsync or segment creation fails, what reached the disk is unknown: the
    /// store then refuses further appends and syncs with [`StoreError::Poisoned`] (reads still
    /// work) until it is reopened, which recovers from the disk.
    pub fn append(&mut self, number: u64, hash: B256, payload: &[u8]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { dir: self.log.dir().to_path_buf() });
        }
        let expected = self.len();
        if number != expected {
            return Err(StoreError::NotNext { number, expected });
        }
        if let Some(&existing) = self.index.by_hash.get(&hash) {
            return Err(StoreError::DuplicateHash { number, hash, existing });
        }
        if payload.len() > MAX_PAYLOAD_BYTES as usize {
            return Err(StoreError::TooLarge { number, len: payload.len(), max: MAX_PAYLOAD_BYTES });
        }
        self.encoded.clear();
        encode_payload(&mut self.encoded, number, &hash, payload);
        let appended = self.log.append(&self.encoded);
        if self.encoded.capacity() > KEEP_BUFFER_BYTES {
            self.encoded = Vec::new();
        }
        let lsn = appended.map_err(|e| StoreError::from_log(e, number))?;
        assert_eq!(Some(lsn), lsn_of(number), "block n is the log's record n + 1");
        let not_durable = lsn - self.log.durable_lsn();
        let due = match self.options.sync {
            SyncPolicy::Every => true,
            SyncPolicy::None => false,
            SyncPolicy::EveryN(n) => not_durable >= u64::from(n.max(1)),
        };
        if !due {
            // One write per block: a crash of the process loses nothing `append` returned.
            self.log.flush().map_err(|e| StoreError::from_log(e, number))?;
        }
        self.index.hashes.push(hash);
        self.index.by_hash.insert(hash, number);
        if due {
            self.log.sync().map_err(|e| StoreError::from_log(e, number))?;
        }
        Ok(())
    }

    /// Fsyncs every appended block; afterwards [`ChainStore::durable_head`] equals
    /// [`ChainStore::head`].
    pub fn sync(&mut self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { dir: self.log.dir().to_path_buf() });
        }
        self.log.sync().map_err(|e| StoreError::from_log(e, self.len()))?;
        Ok(())
    }

    /// Number and hash of the last block, if any.
    pub fn head(&self) -> Option<(u64, B256)> {
        let number = self.len().checked_sub(1)?;
        Some((number, self.index.hashes[number as usize]))
    }

    /// Number and hash of the last block known to be on stable storage.
    pub fn durable_head(&self) -> Option<(u64, B256)> {
        let number = number_at(self.log.durable_lsn())?.min(self.len().checked_sub(1)?);
        Some((number, self.index.hashes[number as usize]))
    }

    /// Number of blocks stored (they are numbered `0..len()`).
    pub fn len(&self) -> u64 {
        self.index.hashes.len() as u64
    }

    /// Whether no block is stored.
    pub fn is_empty(&self) -> bool {
        self.index.hashes.is_empty()
    }

    /// Number of the block with this hash.
    pub fn number_of(&self, hash: &B256) -> Option<u64> {
        self.index.by_hash.get(hash).copied()
    }

    /// Hash of block `number`.
    pub fn hash_of(&self, number: u64) -> Option<B256> {
        self.index.hashes.get(usize::try_from(number).ok()?).copied()
    }

    /// Whether a block with this hash is stored.
    pub fn contains_hash(&self, hash: &B256) -> bool {
        self.index.by_hash.contains_key(hash)
    }

    /// The bytes of block `number`, read back and checked against their checksum.
    pub fn get_by_number(&self, number: u64) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.read_block(number)?.map(|block| block.payload))
    }

    /// The bytes of the block with this hash.
    pub fn get_by_hash(&self, hash: &B256) -> Result<Option<Vec<u8>>, StoreError> {
        match self.number_of(hash) {
            Some(number) => self.get_by_number(number),
            None => Ok(None),
        }
    }

    /// Block `number` with its stored hash, read back and checked: the log's checksum, then
    /// the prefix against the index.
    pub fn read_block(&self, number: u64) -> Result<Option<StoredBlock>, StoreError> {
        let Some(indexed_hash) = self.hash_of(number) else { return Ok(None) };
        let lsn = number + 1;
        let mut payload = self.log.read(lsn).map_err(|e| self.read_error(e, number))?;
        let damage = match format::decode_prefix(&payload) {
            Err(damage) => Some(damage),
            Ok((found, _)) if found != number => Some(Damage::WrongNumber { found, expected: number }),
            Ok((_, found)) if found != indexed_hash => Some(Damage::HashChanged { found }),
            Ok(_) => None,
        };
        if let Some(damage) = damage {
            let (file, offset) = self.place_of(number);
            return Err(StoreError::Corrupt { file, offset, block: number, damage });
        }
        payload.drain(..PREFIX_LEN);
        Ok(Some(StoredBlock { number, hash: indexed_hash, payload }))
    }

    /// The segment file and offset of block `number`'s record, for messages.
    fn place_of(&self, number: u64) -> (PathBuf, u64) {
        place_of(&self.log, number)
    }

    fn read_error(&self, error: LogError, number: u64) -> StoreError {
        let (file, offset) = self.place_of(number);
        StoreError::from_read(error, number, file, offset)
    }

    /// Every block in number order, read one at a time. The iterator ends after the first
    /// error.
    pub fn iter(&self) -> Blocks<'_> {
        Blocks { store: self, next: 0, end: self.len(), failed: false }
    }

    /// Where block `number` is stored.
    pub fn location(&self, number: u64) -> Option<BlockLocation> {
        self.hash_of(number)?;
        let at = self.log.location(number + 1)?;
        Some(BlockLocation {
            file: self.log.storage().path_of(&at.segment),
            offset: at.offset,
            record_bytes: (virga_log::RECORD_HEADER_LEN as u64) + u64::from(at.payload_len),
        })
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.log.segment_count()
    }

    /// How the store's storage names itself: its directory, for files.
    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// The storage the store lives in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        self.log.storage()
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }
}

/// The segment file and offset of block `number`'s record in `log`, for messages (the
/// storage's location if the log does not hold it).
pub(crate) fn place_of(log: &RecordLog, number: u64) -> (PathBuf, u64) {
    match lsn_of(number).and_then(|lsn| log.location(lsn)) {
        Some(at) => (log.storage().path_of(&at.segment), at.offset),
        None => (log.storage().location(), 0),
    }
}

/// Refuses with the chain-rule violation `index` found, located in the records of the log in
/// `storage` that precede its first damage.
fn refuse_violation(index: &ChainIndex, storage: &Arc<dyn Storage>, options: &LogOptions) -> Result<(), StoreError> {
    if index.violation.is_none() {
        return Ok(());
    }
    let (log, _) = open_intact_prefix(storage, options)?;
    match index.violation_error(&log) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Iterator over the blocks of a [`ChainStore`], from [`ChainStore::iter`].
#[derive(Debug)]
pub struct Blocks<'a> {
    store: &'a ChainStore,
    next: u64,
    end: u64,
    failed: bool,
}

impl Iterator for Blocks<'_> {
    type Item = Result<StoredBlock, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next >= self.end {
            return None;
        }
        let item = self.store.read_block(self.next).transpose()?;
        self.failed = item.is_err();
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.failed { 0 } else { usize::try_from(self.end - self.next).unwrap_or(usize::MAX) };
        (0, Some(left))
    }
}
