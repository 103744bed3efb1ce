//! The chain store: blocks appended to segment files, found again by number or hash.
//!
//! The store keeps opaque block bytes; what they mean is the block codec's business. Each
//! stored record carries the block's number and hash beside its bytes, all under one
//! checksum. Numbers are contiguous from 0 (genesis), so a block is appended only as the
//! successor of the head, and no hash is stored twice.
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
//! # On disk
//!
//! A directory of segment files named after their first block number (20 digits, `.blk`):
//! `00000000000000000000.blk`, `00000000000000001873.blk`, ... Every segment starts with a
//! 24-byte header (`VIRGACHN`, version, the first block number, CRC-32 of the header), then
//! records back to back, each a 52-byte header and the block bytes:
//!
//! | bytes  | field                                          |
//! |--------|------------------------------------------------|
//! | 0      | magic `0xC4`                                   |
//! | 1      | format version, 1                              |
//! | 2..4   | flags, 0                                       |
//! | 4..8   | length `n` of the block bytes (u32 LE)         |
//! | 8..16  | block number (u64 LE)                          |
//! | 16..48 | block hash                                     |
//! | 48..52 | CRC-32 of bytes 0..48 and the block bytes      |
//! | 52..   | block bytes                                    |
//!
//! CRC-32 catches every error burst of up to 32 bits, so any single changed byte of a record
//! (header, hash, checksum field or block bytes) fails the check.
//!
//! # Why not `virga_log::RecordLog`
//!
//! The framing follows `RecordLog`'s rules (segments, length and CRC per record, only the
//! last segment may be torn, damage elsewhere is refused), but is written here because
//! `RecordLog` does not fit three needs of a chain store: its `open` returns every payload in
//! memory, so reopening a 1 GB chain would hold 1 GB; it does not say where a record lies
//! (and buffers appends in user space), so blocks could not be read back by position
//! without copying its private rotation rule; and its `open` always repairs, while
//! `virga verify` needs a pass that changes nothing and names the first damaged block. One
//! reader ([`scan`] and [`ChainStore::open`] share it) judges both.
//!
//! # Recovery
//!
//! [`ChainStore::open`] reads every record once, checking framing, checksum, the number
//! sequence and hash uniqueness, and keeps only an index in memory: per block its offset and
//! length (the segment is found by binary search over segment first numbers), and a map
//! from hash to number. Block bytes are read from disk on demand.
//!
//! * Damage that a crash can leave (an incomplete or zero-filled record, a length past the
//!   end of the file, a checksum mismatch, an unwritten segment header) **at the end of the
//!   last segment, with no intact record after it**, is a torn tail: the file is cut there,
//!   fsynced, and the cut is reported in [`StoreRecovery`].
//! * Anything else is refused with [`StoreError::Corrupt`] naming the file, byte offset and
//!   block number, and nothing is changed: damage in a segment that another follows (a
//!   segment is fsynced whole before the next is created), damage followed by an intact
//!   record, a checksummed record with the wrong number or a repeated hash, missing segments.
//!
//! The last complete record with a bad checksum is indistinguishable from an append torn
//! by a power cut (file length persisted, some data pages not), so `open` cuts it like a
//! torn tail and reports it (`StoreRecovery::repair`, with the damage). [`scan`] reports the
//! same bytes as [`StoreError::Corrupt`], keeping [`StoreError::TornTail`] for a record that
//! is visibly incomplete.
//!
//! # Durability
//!
//! `append` hands each record to the operating system at once (no user-space buffer), so a
//! process crash loses nothing that `append` returned; [`SyncPolicy`] decides when it is
//! fsynced against a machine crash. [`ChainStore::durable_head`] is the last block known to
//! be on stable storage. One process must be the only writer of a directory.

mod format;
mod reader;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use alloy_primitives::B256;

use format::{encode_record, encode_segment_header};
pub use format::{segment_file_name, MAX_PAYLOAD_BYTES, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use reader::{read_indexed, Defect, Event, SegmentFile, Verdict, Walker};

/// Default for [`StoreOptions::segment_bytes`]: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// Above this capacity the encoding buffer is released after an append, so one huge block
/// does not pin its size in memory for the life of the store.
const KEEP_BUFFER_BYTES: usize = 1 << 20;

const READ_BUFFER_BYTES: usize = 64 << 10;

/// When appended blocks are fsynced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every [`ChainStore::append`] fsyncs its block before returning.
    #[default]
    Every,
    /// Only [`ChainStore::sync`] and the start of a new segment fsync; until then the
    /// operating system decides when blocks reach the disk.
    None,
    /// Every `n`-th append since the last fsync fsyncs (0 and 1 mean every append).
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

/// Where a block's record lies on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    /// The segment file.
    pub file: PathBuf,
    /// Byte offset of the record header in `file`.
    pub offset: u64,
    /// Length of the record, header included.
    pub record_bytes: u64,
}

/// The cut [`ChainStore::open`] made at the end of the last segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailRepair {
    /// The segment that was cut (or whose unwritten header was rewritten).
    pub file: PathBuf,
    /// Where the invalid data began; the file now ends here.
    pub offset: u64,
    /// Bytes removed.
    pub bytes: u64,
    /// Number the first dropped block would have had; also the number of blocks kept.
    pub first_dropped: u64,
    /// What was wrong at `offset`.
    pub damage: Damage,
}

/// What [`ChainStore::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreRecovery {
    /// Blocks in the store, numbered `0..blocks`.
    pub blocks: u64,
    /// Bytes cut from the end of the last segment (0 when it ended cleanly).
    pub truncated_bytes: u64,
    /// Details of the cut, if one was made.
    pub repair: Option<TailRepair>,
    /// Segment files after recovery.
    pub segments: usize,
}

/// What is wrong with the bytes at some place in the store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    /// The segment file is shorter than a segment header.
    #[error("segment file is {len} bytes long, shorter than its 24-byte header")]
    SegmentTooShort {
        /// The file's length.
        len: u64,
    },
    /// The segment header is invalid and nothing follows it: its creation was interrupted.
    #[error("{reason}, and nothing follows the header")]
    SegmentHeaderUnwritten {
        /// What is wrong with the header.
        reason: String,
    },
    /// The segment header is invalid and records follow it.
    #[error("{reason}, and block records follow the header")]
    SegmentHeader {
        /// What is wrong with the header.
        reason: String,
    },
    /// The header's first block number disagrees with the file name.
    #[error("segment header says the segment starts at block {header}, its file name says block {name}")]
    SegmentNameMismatch {
        /// From the file name.
        name: u64,
        /// From the header.
        header: u64,
    },
    /// A segment does not start where the previous one ended: blocks are missing or repeated.
    #[error("segment file name says it starts at block {found}, but the blocks before it end before block {expected}")]
    SegmentOutOfSequence {
        /// The number the segment should start at.
        expected: u64,
        /// The number its name gives (may exceed `u64::MAX`).
        found: u128,
    },
    /// Fewer bytes than a record header remain in the file.
    #[error("only {available} bytes left, too few for a 52-byte record header")]
    ShortRecordHeader {
        /// Bytes left in the file.
        available: u64,
    },
    /// Zero bytes where a record header should be, as left by a file extended without data.
    #[error("zero-filled bytes where a record header should be")]
    ZeroFilled,
    /// The first byte of a record header is not the record magic `0xC4`.
    #[error("bad record magic byte {found:#04x} (expected 0xc4)")]
    BadMagic {
        /// The byte found.
        found: u8,
    },
    /// The length field runs past the end of the file: the record is incomplete.
    #[error("record header announces {len} block bytes but only {available} bytes follow it")]
    LengthPastEnd {
        /// The announced length.
        len: u32,
        /// Bytes after the header.
        available: u64,
    },
    /// The length field is above [`MAX_PAYLOAD_BYTES`].
    #[error("record header announces {len} block bytes, above the maximum of {max}")]
    LengthTooLarge {
        /// The announced length.
        len: u32,
        /// The maximum.
        max: u32,
    },
    /// The checksum does not match the record's bytes.
    #[error("record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    ChecksumMismatch {
        /// The checksum field.
        stored: u32,
        /// The checksum of the bytes present.
        computed: u32,
    },
    /// A checksummed record of a format version this build does not read.
    #[error("unsupported record format version {version}")]
    UnsupportedVersion {
        /// The version found.
        version: u8,
    },
    /// A checksummed record with flags this build does not know.
    #[error("unknown record flags {flags:#06x}")]
    UnknownFlags {
        /// The flags found.
        flags: u16,
    },
    /// A checksummed record out of the number sequence.
    #[error("record holds block number {found} where block {expected} belongs")]
    WrongNumber {
        /// The number in the record.
        found: u64,
        /// The number that belongs there.
        expected: u64,
    },
    /// A checksummed record whose hash an earlier block already has.
    #[error("record holds hash {hash}, already the hash of block {first}")]
    DuplicateHash {
        /// The repeated hash.
        hash: B256,
        /// The earlier block with that hash.
        first: u64,
    },
    /// On a read by index: the record's length field differs from the one seen at open.
    #[error("record's length field says {found} bytes, the index recorded {indexed}")]
    LengthChanged {
        /// Length in the index.
        indexed: u32,
        /// Length now on disk.
        found: u32,
    },
    /// On a read by index: a checksummed record whose hash differs from the one the index
    /// recorded ([`ChainStore::hash_of`]).
    #[error("record holds hash {found}, not the hash the index recorded for this block")]
    HashChanged {
        /// Hash now on disk.
        found: B256,
    },
    /// On a read by index: the file ends before the record does.
    #[error("the file ends before the indexed record does")]
    Missing,
}

impl Damage {
    /// Whether these bytes are visibly incomplete: a record or segment header the file ends
    /// inside of, or zero fill. This is what an interrupted append leaves.
    pub fn is_incomplete(&self) -> bool {
        matches!(
            self,
            Damage::SegmentTooShort { .. }
                | Damage::SegmentHeaderUnwritten { .. }
                | Damage::ShortRecordHeader { .. }
                | Damage::ZeroFilled
                | Damage::LengthPastEnd { .. }
        )
    }
}

/// Intact data found after damage, which is why the damage is not a torn tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntactAfter {
    /// Another segment follows the damaged one.
    LaterSegment {
        /// The following segment file.
        file: PathBuf,
    },
    /// A record with a valid checksum follows in the same file.
    Record {
        /// Its byte offset.
        offset: u64,
        /// The block number it holds.
        block: u64,
    },
}

impl fmt::Display for IntactAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntactAfter::LaterSegment { file } => write!(f, "segment {} follows it", file.display()),
            IntactAfter::Record { offset, block } => {
                write!(f, "an intact record of block {block} follows it at byte offset {offset}")
            }
        }
    }
}

fn after_note(after: &Option<Box<IntactAfter>>) -> String {
    match after {
        Some(after) => format!("; {after}, so this is damage inside the chain, not a torn write"),
        None => String::new(),
    }
}

/// Errors of the chain store. Damage names the file, byte offset and block number.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An operating-system call failed.
    #[error("failed to {op} {}: {source}", .path.display())]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Damaged data that the store will not cut away.
    #[error("chain store damaged at block {block}: {} byte offset {offset}: {damage}{}", .file.display(), after_note(.intact_after))]
    Corrupt {
        /// The segment file.
        file: PathBuf,
        /// Where the damage starts in `file`.
        offset: u64,
        /// The number of the damaged block, which is also how many intact blocks precede it.
        block: u64,
        /// What is wrong.
        damage: Damage,
        /// Intact data after the damage, when that is what rules out a torn write.
        intact_after: Option<Box<IntactAfter>>,
    },
    /// [`scan`] only: the log ends in an incomplete record, as an interrupted append leaves
    /// it. [`ChainStore::open`] cuts it off.
    #[error("torn tail at block {block}: {} byte offset {offset}: {damage} ({bytes} bytes to cut)", .file.display())]
    TornTail {
        /// The last segment file.
        file: PathBuf,
        /// Where the incomplete record starts.
        offset: u64,
        /// The number the incomplete block would have.
        block: u64,
        /// Bytes from `offset` to the end of the file.
        bytes: u64,
        /// What is incomplete.
        damage: Damage,
    },
    /// [`ChainStore::append`] was given a number other than the head's successor.
    #[error("cannot append block {number}: the next block number is {expected}")]
    NotNext {
        /// The number given.
        number: u64,
        /// The only number accepted.
        expected: u64,
    },
    /// [`ChainStore::append`] was given a hash that is already stored.
    #[error("cannot append block {number}: its hash {hash} is already the hash of block {existing}")]
    DuplicateHash {
        /// The number given.
        number: u64,
        /// The repeated hash.
        hash: B256,
        /// The stored block with that hash.
        existing: u64,
    },
    /// [`ChainStore::append`] was given more than [`MAX_PAYLOAD_BYTES`].
    #[error("cannot append block {number}: {len} bytes exceed the maximum block size of {max} bytes")]
    TooLarge {
        /// The number given.
        number: u64,
        /// The length given.
        len: usize,
        /// The maximum.
        max: u32,
    },
    /// An earlier write, fsync or segment creation failed, so what reached the disk is
    /// unknown; reopening recovers from the disk.
    #[error("chain store in {} is unusable after an earlier failure ({cause}); reopen it", .dir.display())]
    Poisoned {
        /// The store directory.
        dir: PathBuf,
        /// The failure.
        cause: String,
    },
}

impl StoreError {
    /// The block the error is about, if any.
    pub fn block(&self) -> Option<u64> {
        match self {
            StoreError::Corrupt { block, .. } | StoreError::TornTail { block, .. } => Some(*block),
            StoreError::NotNext { number, .. }
            | StoreError::DuplicateHash { number, .. }
            | StoreError::TooLarge { number, .. } => Some(*number),
            StoreError::Io { .. } | StoreError::Poisoned { .. } => None,
        }
    }

    /// The damage found, for [`StoreError::Corrupt`] and [`StoreError::TornTail`].
    pub fn damage(&self) -> Option<&Damage> {
        match self {
            StoreError::Corrupt { damage, .. } | StoreError::TornTail { damage, .. } => Some(damage),
            _ => None,
        }
    }
}

pub(crate) fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { op, path: path.to_path_buf(), source }
}

fn damage_error(file: &Path, defect: Defect, block: u64, verdict: Verdict) -> StoreError {
    let Defect { offset, file_len, damage, .. } = defect;
    match verdict {
        Verdict::Refuse(intact_after) => StoreError::Corrupt {
            file: file.to_path_buf(),
            offset,
            block,
            damage,
            intact_after: intact_after.map(Box::new),
        },
        Verdict::Tail if damage.is_incomplete() => {
            StoreError::TornTail { file: file.to_path_buf(), offset, block, bytes: file_len - offset, damage }
        }
        Verdict::Tail => StoreError::Corrupt { file: file.to_path_buf(), offset, block, damage, intact_after: None },
    }
}

/// What the index keeps per block: its hash and where its record lies in its segment.
#[derive(Clone, Copy, Debug)]
struct Slot {
    hash: B256,
    offset: u64,
    payload_len: u32,
}

#[derive(Clone, Debug)]
struct Segment {
    first: u64,
    path: PathBuf,
}

/// An append-only store of blocks, indexed by number and by hash.
pub struct ChainStore {
    dir: PathBuf,
    options: StoreOptions,
    /// Oldest first; the last one is being appended to.
    segments: Vec<Segment>,
    /// Indexed by block number.
    slots: Vec<Slot>,
    by_hash: HashMap<B256, u64>,
    head: Option<(u64, B256)>,
    durable: Option<(u64, B256)>,
    /// The last segment, opened for appending.
    file: File,
    /// Bytes of the last segment handed to the operating system.
    active_len: u64,
    /// Appends not yet covered by an fsync.
    unsynced: u64,
    encoded: Vec<u8>,
    poisoned: Option<String>,
}

impl fmt::Debug for ChainStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainStore")
            .field("dir", &self.dir)
            .field("blocks", &self.slots.len())
            .field("segments", &self.segments.len())
            .field("head", &self.head)
            .field("durable", &self.durable)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl ChainStore {
    /// Opens (creating if needed) the store in `dir`, checks every stored record, and builds
    /// the index.
    ///
    /// A torn tail is cut off and reported in the [`StoreRecovery`]; any other damage is
    /// refused with [`StoreError::Corrupt`] and leaves the files untouched (see the module
    /// documentation). Every block kept is durable when this returns.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<(ChainStore, StoreRecovery), StoreError> {
        create_dir(dir)?;
        let mut walker = Walker::new(reader::list_segments(dir)?);
        let mut slots = Vec::new();
        let mut head = None;
        let mut repair = None;
        let mut payload = Vec::new();
        loop {
            match walker.next(&mut payload)? {
                Event::Block(block) => {
                    slots.push(Slot { hash: block.hash, offset: block.offset, payload_len: block.payload_len });
                    head = Some((block.number, block.hash));
                }
                Event::End => break,
                Event::Defect(defect) => {
                    let verdict = walker.judge(&defect)?;
                    let file = walker.segments()[defect.segment].path.clone();
                    if let Verdict::Refuse(_) = verdict {
                        return Err(damage_error(&file, defect, walker.expected, verdict));
                    }
                    repair = Some(cut_tail(&walker, &file, defect)?);
                    break;
                }
            }
        }
        drop(payload);
        let blocks = walker.expected;
        let (listed, by_hash) = walker.into_parts();

        let mut segments = Vec::with_capacity(listed.len());
        for SegmentFile { first, path } in listed {
            // The walk accepted every listed segment, so each name fits a block number.
            let first = u64::try_from(first).map_err(|_| StoreError::Corrupt {
                offset: 0,
                block: blocks,
                damage: Damage::SegmentOutOfSequence { expected: blocks, found: first },
                intact_after: None,
                file: path.clone(),
            })?;
            segments.push(Segment { first, path });
        }
        if segments.is_empty() {
            let first = Segment { first: 0, path: dir.join(segment_file_name(0)) };
            drop(create_segment(&first)?);
            segments.push(first);
        }
        let active = &segments[segments.len() - 1].path;
        let file = OpenOptions::new().append(true).open(active).map_err(io_error("open for appending", active))?;
        let active_len = file.metadata().map_err(io_error("stat", active))?.len();
        // What was read may sit only in the page cache of a process that crashed, and a new
        // segment's directory entry may not be durable yet: make both durable before
        // reporting the blocks as kept.
        file.sync_data().map_err(io_error("fsync", active))?;
        sync_dir(dir)?;

        let recovery = StoreRecovery {
            blocks,
            truncated_bytes: repair.as_ref().map_or(0, |r: &TailRepair| r.bytes),
            repair,
            segments: segments.len(),
        };
        let store = ChainStore {
            dir: dir.to_path_buf(),
            options,
            segments,
            slots,
            by_hash,
            head,
            durable: head,
            file,
            active_len,
            unsynced: 0,
            encoded: Vec::new(),
            poisoned: None,
        };
        Ok((store, recovery))
    }

    /// Appends block `number` with `hash` and bytes `payload`.
    ///
    /// `number` must be the head's number plus one (0 for the first block) and `hash` must
    /// not be stored yet; a refused append changes nothing. The block is handed to the
    /// operating system before this returns, and fsynced according to [`StoreOptions::sync`].
    ///
    /// If a write, fsync or segment creation fails, what reached the disk is unknown: the
    /// store then refuses further appends and syncs with [`StoreError::Poisoned`] (reads still
    /// work) until it is reopened, which recovers from the disk.
    pub fn append(&mut self, number: u64, hash: B256, payload: &[u8]) -> Result<(), StoreError> {
        self.check_usable()?;
        let expected = self.len();
        if number != expected {
            return Err(StoreError::NotNext { number, expected });
        }
        if let Some(&existing) = self.by_hash.get(&hash) {
            return Err(StoreError::DuplicateHash { number, hash, existing });
        }
        let payload_len = match u32::try_from(payload.len()) {
            Ok(len) if len <= MAX_PAYLOAD_BYTES => len,
            _ => return Err(StoreError::TooLarge { number, len: payload.len(), max: MAX_PAYLOAD_BYTES }),
        };
        let record_bytes = RECORD_HEADER_LEN as u64 + u64::from(payload_len);
        let active_has_blocks = self.active().first < number;
        if active_has_blocks && self.active_len + record_bytes > self.options.segment_bytes {
            self.rotate(number).map_err(|e| self.poison(e))?;
        }

        self.encoded.clear();
        encode_record(&mut self.encoded, number, &hash, payload);
        // One write per record: a crash can tear only the record being written.
        let written = self.file.write_all(&self.encoded);
        if self.encoded.capacity() > KEEP_BUFFER_BYTES {
            self.encoded = Vec::new();
        }
        if let Err(e) = written {
            let path = self.active().path.clone();
            return Err(self.poison(io_error("write to", &path)(e)));
        }
        self.slots.push(Slot { hash, offset: self.active_len, payload_len });
        self.by_hash.insert(hash, number);
        self.head = Some((number, hash));
        self.active_len += record_bytes;
        self.unsynced += 1;

        let due = match self.options.sync {
            SyncPolicy::Every => true,
            SyncPolicy::None => false,
            SyncPolicy::EveryN(n) => self.unsynced >= u64::from(n.max(1)),
        };
        if due {
            self.sync_active().map_err(|e| self.poison(e))?;
        }
        Ok(())
    }

    /// Fsyncs every appended block; afterwards [`ChainStore::durable_head`] equals
    /// [`ChainStore::head`].
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.check_usable()?;
        self.sync_active().map_err(|e| self.poison(e))
    }

    /// Number and hash of the last block, if any.
    pub fn head(&self) -> Option<(u64, B256)> {
        self.head
    }

    /// Number and hash of the last block known to be on stable storage.
    pub fn durable_head(&self) -> Option<(u64, B256)> {
        self.durable
    }

    /// Number of blocks stored (they are numbered `0..len()`).
    pub fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Whether no block is stored.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Number of the block with this hash.
    pub fn number_of(&self, hash: &B256) -> Option<u64> {
        self.by_hash.get(hash).copied()
    }

    /// Hash of block `number`.
    pub fn hash_of(&self, number: u64) -> Option<B256> {
        self.locate(number).map(|(_, _, slot)| slot.hash)
    }

    /// Whether a block with this hash is stored.
    pub fn contains_hash(&self, hash: &B256) -> bool {
        self.by_hash.contains_key(hash)
    }

    /// The bytes of block `number`, read from disk and checked against their checksum.
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

    /// Block `number` with its stored hash, read from disk and checked.
    pub fn read_block(&self, number: u64) -> Result<Option<StoredBlock>, StoreError> {
        let Some((_, segment, slot)) = self.locate(number) else { return Ok(None) };
        let path = &segment.path;
        let mut file = File::open(path).map_err(io_error("open", path))?;
        file.seek(SeekFrom::Start(slot.offset)).map_err(io_error("seek", path))?;
        match read_indexed(&mut file, number, &slot.hash, slot.payload_len).map_err(io_error("read", path))? {
            Ok((hash, payload)) => Ok(Some(StoredBlock { number, hash, payload })),
            Err(damage) => Err(StoreError::Corrupt {
                file: path.clone(),
                offset: slot.offset,
                block: number,
                damage,
                intact_after: None,
            }),
        }
    }

    /// Every block in number order, read from disk one at a time. The iterator ends after
    /// the first error.
    pub fn iter(&self) -> Blocks<'_> {
        Blocks { store: self, next: 0, end: self.len(), reader: None, failed: false }
    }

    /// Where block `number` is stored.
    pub fn location(&self, number: u64) -> Option<BlockLocation> {
        let (_, segment, slot) = self.locate(number)?;
        Some(BlockLocation {
            file: segment.path.clone(),
            offset: slot.offset,
            record_bytes: RECORD_HEADER_LEN as u64 + u64::from(slot.payload_len),
        })
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    fn active(&self) -> &Segment {
        // `open` always leaves at least one segment and none is ever removed.
        &self.segments[self.segments.len() - 1]
    }

    /// The index of the segment holding block `number`, the segment and the block's slot.
    fn locate(&self, number: u64) -> Option<(usize, &Segment, Slot)> {
        let slot = *self.slots.get(usize::try_from(number).ok()?)?;
        let index = self.segments.partition_point(|s| s.first <= number).checked_sub(1)?;
        Some((index, &self.segments[index], slot))
    }

    fn check_usable(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            None => Ok(()),
            Some(cause) => Err(StoreError::Poisoned { dir: self.dir.clone(), cause: cause.clone() }),
        }
    }

    fn poison(&mut self, error: StoreError) -> StoreError {
        self.poisoned = Some(error.to_string());
        error
    }

    fn sync_active(&mut self) -> Result<(), StoreError> {
        if self.unsynced > 0 {
            let path = &self.segments[self.segments.len() - 1].path;
            self.file.sync_data().map_err(io_error("fsync", path))?;
            self.unsynced = 0;
        }
        self.durable = self.head;
        Ok(())
    }

    /// Closes the last segment and starts one whose first block is `first`.
    ///
    /// The old segment is fsynced first: recovery refuses damage in any segment that another
    /// follows, so none may be followed while a crash could still tear it.
    fn rotate(&mut self, first: u64) -> Result<(), StoreError> {
        self.sync_active()?;
        let next = Segment { first, path: self.dir.join(segment_file_name(first)) };
        self.file = create_segment(&next)?;
        self.segments.push(next);
        self.active_len = SEGMENT_HEADER_LEN as u64;
        Ok(())
    }
}

/// Iterator over the blocks of a [`ChainStore`], from [`ChainStore::iter`].
pub struct Blocks<'a> {
    store: &'a ChainStore,
    next: u64,
    end: u64,
    /// The segment being read, its reader and the reader's position.
    reader: Option<(usize, BufReader<File>, u64)>,
    failed: bool,
}

impl fmt::Debug for Blocks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocks").field("next", &self.next).field("end", &self.end).finish()
    }
}

impl Blocks<'_> {
    /// Reads block `self.next`; `None` if it is not indexed, which cannot happen below `end`
    /// because the store cannot change while the iterator borrows it.
    fn read_next(&mut self) -> Option<Result<StoredBlock, StoreError>> {
        let number = self.next;
        let store = self.store;
        let (index, segment, slot) = store.locate(number)?;
        Some(self.read_at(number, index, &segment.path, slot))
    }

    fn read_at(&mut self, number: u64, index: usize, path: &Path, slot: Slot) -> Result<StoredBlock, StoreError> {
        let reader = match &mut self.reader {
            Some((current, reader, position)) if *current == index => {
                // Records of a segment lie back to back, so this seek happens only when a
                // previous read failed part-way.
                if *position != slot.offset {
                    reader.seek(SeekFrom::Start(slot.offset)).map_err(io_error("seek", path))?;
                }
                reader
            }
            _ => {
                let mut file = File::open(path).map_err(io_error("open", path))?;
                file.seek(SeekFrom::Start(slot.offset)).map_err(io_error("seek", path))?;
                &mut self.reader.insert((index, BufReader::with_capacity(READ_BUFFER_BYTES, file), slot.offset)).1
            }
        };
        let read = read_indexed(reader, number, &slot.hash, slot.payload_len).map_err(io_error("read", path))?;
        let (hash, payload) = read.map_err(|damage| StoreError::Corrupt {
            file: path.to_path_buf(),
            offset: slot.offset,
            block: number,
            damage,
            intact_after: None,
        })?;
        if let Some((_, _, position)) = &mut self.reader {
            *position = slot.offset + RECORD_HEADER_LEN as u64 + u64::from(slot.payload_len);
        }
        Ok(StoredBlock { number, hash, payload })
    }
}

impl Iterator for Blocks<'_> {
    type Item = Result<StoredBlock, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next >= self.end {
            return None;
        }
        let item = self.read_next();
        self.failed = !matches!(item, Some(Ok(_)));
        self.next += 1;
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.failed { 0 } else { usize::try_from(self.end - self.next).unwrap_or(usize::MAX) };
        (0, Some(left))
    }
}

/// Reads the store in `dir` without changing anything, yielding every intact block in
/// order and ending with an error at the first damage: [`StoreError::TornTail`] for an
/// incomplete last record (which [`ChainStore::open`] would cut), [`StoreError::Corrupt`]
/// for anything else, each naming the file, byte offset and block number (the count of
/// intact blocks before it). A directory without segment files holds no blocks.
///
/// This is the audit entry point: unlike `open` it also reports a complete last record whose
/// checksum fails as [`StoreError::Corrupt`]. Memory use is the map of hashes seen, which
/// catches repeated hashes.
pub fn scan(dir: &Path) -> Scan {
    Scan { dir: dir.to_path_buf(), walker: None, payload: Vec::new(), done: false, torn_tail_bytes: 0 }
}

/// The iterator returned by [`scan`].
pub struct Scan {
    dir: PathBuf,
    walker: Option<Walker>,
    payload: Vec<u8>,
    done: bool,
    torn_tail_bytes: u64,
}

impl fmt::Debug for Scan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scan")
            .field("dir", &self.dir)
            .field("blocks", &self.blocks())
            .field("done", &self.done)
            .finish()
    }
}

impl Scan {
    /// Intact blocks yielded so far.
    pub fn blocks(&self) -> u64 {
        self.walker.as_ref().map_or(0, |w| w.expected)
    }

    /// Bytes of the torn tail, once the scan has ended with [`StoreError::TornTail`]; 0
    /// otherwise. Lets an audit that accepts a torn tail report it after the loop.
    pub fn torn_tail_bytes(&self) -> u64 {
        self.torn_tail_bytes
    }

    fn advance(&mut self) -> Result<Option<StoredBlock>, StoreError> {
        let walker = match &mut self.walker {
            Some(walker) => walker,
            None => self.walker.insert(Walker::new(reader::list_segments(&self.dir)?)),
        };
        match walker.next(&mut self.payload)? {
            Event::Block(block) => Ok(Some(StoredBlock {
                number: block.number,
                hash: block.hash,
                payload: std::mem::take(&mut self.payload),
            })),
            Event::End => Ok(None),
            Event::Defect(defect) => {
                let verdict = walker.judge(&defect)?;
                let file = walker.segments()[defect.segment].path.clone();
                Err(damage_error(&file, defect, walker.expected, verdict))
            }
        }
    }
}

impl Iterator for Scan {
    type Item = Result<StoredBlock, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.advance().transpose();
        self.done = !matches!(item, Some(Ok(_)));
        if let Some(Err(StoreError::TornTail { bytes, .. })) = &item {
            self.torn_tail_bytes = *bytes;
        }
        item
    }
}

/// Cuts the torn tail `defect` describes off the last segment, durably.
fn cut_tail(walker: &Walker, file: &Path, defect: Defect) -> Result<TailRepair, StoreError> {
    let first_dropped = walker.expected;
    let handle = OpenOptions::new().write(true).open(file).map_err(io_error("open for repair", file))?;
    if defect.in_header {
        // The segment was being created: give it the header it was meant to get.
        let mut handle = handle;
        handle.set_len(0).map_err(io_error("truncate", file))?;
        handle.write_all(&encode_segment_header(first_dropped)).map_err(io_error("write header of", file))?;
        handle.sync_all().map_err(io_error("fsync", file))?;
    } else {
        handle.set_len(defect.offset).map_err(io_error("truncate", file))?;
        handle.sync_all().map_err(io_error("fsync", file))?;
    }
    Ok(TailRepair {
        file: file.to_path_buf(),
        offset: defect.offset,
        bytes: defect.file_len - defect.offset,
        first_dropped,
        damage: defect.damage,
    })
}

/// Creates the store directory if missing, making its entry durable.
fn create_dir(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Creates a segment holding only its header, durably (file and directory entry), and
/// returns it opened for appending.
fn create_segment(segment: &Segment) -> Result<File, StoreError> {
    let path = &segment.path;
    let mut file = OpenOptions::new().append(true).create_new(true).open(path).map_err(io_error("create", path))?;
    file.write_all(&encode_segment_header(segment.first)).map_err(io_error("write header of", path))?;
    file.sync_all().map_err(io_error("fsync", path))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(file)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("fsync directory", dir))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), StoreError> {
    // Directories cannot be opened as files here; the platform persists entries itself.
    Ok(())
}
