//! The chain store's errors, and how the log's errors become them: every damage is named by
//! segment file, byte offset and block number.

use std::io;
use std::path::PathBuf;

use alloy_primitives::B256;
use virga_log::LogError;

use super::format::{first_block_of, FORMAT_VERSION};

/// What is wrong with the bytes at some place in the store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    /// The log's framing is damaged (checksum, magic, length, segment header, a gap between
    /// segments, ...); `virga-log` says what.
    #[error("{reason}")]
    Record {
        /// What the log found.
        reason: String,
    },
    /// A record the log holds intact, too short for the block prefix.
    #[error("record payload is {len} bytes long, shorter than the 40-byte block prefix")]
    ShortPrefix {
        /// The payload's length.
        len: usize,
    },
    /// A record the log holds intact, out of the number sequence.
    #[error("record holds block number {found} where block {expected} belongs")]
    WrongNumber {
        /// The number in the record.
        found: u64,
        /// The number that belongs there.
        expected: u64,
    },
    /// A record the log holds intact, whose hash an earlier block already has.
    #[error("record holds hash {hash}, already the hash of block {first}")]
    DuplicateHash {
        /// The repeated hash.
        hash: B256,
        /// The earlier block with that hash.
        first: u64,
    },
    /// The oldest segment does not start at genesis: the segments before it are gone.
    #[error("the oldest segment starts at block {first}; blocks 0 to {} are missing", .first - 1)]
    MissingBlocks {
        /// The first block still stored.
        first: u64,
    },
    /// On a read by index: the record holds a hash other than the one the index recorded
    /// ([`super::ChainStore::hash_of`]).
    #[error("record holds hash {found}, not the hash the index recorded for this block")]
    HashChanged {
        /// Hash now on disk.
        found: B256,
    },
    /// On a read by index: the file ends before the record does.
    #[error("the file ends before the indexed record does")]
    Missing,
}

/// Errors of the chain store. Damage names the file, byte offset and block number.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A storage operation failed.
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
    #[error("chain store damaged at block {block}: {} byte offset {offset}: {damage}", .file.display())]
    Corrupt {
        /// The segment file.
        file: PathBuf,
        /// Where the damaged record (or segment header) starts in `file`.
        offset: u64,
        /// The number of the damaged block, which is also how many intact blocks precede it.
        block: u64,
        /// What is wrong.
        damage: Damage,
    },
    /// The last segment ends in a torn tail, as an interrupted append leaves it: reported by
    /// [`super::scan`]; [`super::ChainStore::open`] cuts it off.
    #[error("torn tail at block {block}: {} byte offset {offset}: {damage} ({bytes} bytes to cut)", .file.display())]
    TornTail {
        /// The last segment file.
        file: PathBuf,
        /// Where the torn data starts.
        offset: u64,
        /// The number the first torn block would have.
        block: u64,
        /// Bytes from `offset` to the end of the file.
        bytes: u64,
        /// What is wrong there.
        damage: Damage,
    },
    /// The directory holds segments of the older chain-store format (`.blk` files).
    #[error(
        "{} was written by an older chain-store format (format 1: `.blk` segments with magic VIRGACHN); this \
         build stores blocks in format {FORMAT_VERSION} (virga-log `.seg` segments) and cannot read it. Re-create \
         the chain in a fresh directory, e.g. re-run `virga bench ledger --dir DIR` or `virga up --dir DIR`",
        .file.display()
    )]
    OlderFormat {
        /// The first such segment found.
        file: PathBuf,
    },
    /// A segment of a log format version this build does not read.
    #[error(
        "chain store segment {} (starting at block {}) was written by log format version {found}, {} than \
         this build's version {supported}; it cannot be read by this build",
        .file.display(),
        .first_block.map_or_else(|| "?".to_string(), |n| n.to_string()),
        if *.found < *.supported { "older" } else { "newer" }
    )]
    UnsupportedFormat {
        /// The segment.
        file: PathBuf,
        /// Its first block, from its name.
        first_block: Option<u64>,
        /// The version it carries.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// [`super::ChainStore::append`] was given a number other than the head's successor.
    #[error("cannot append block {number}: the next block number is {expected}")]
    NotNext {
        /// The number given.
        number: u64,
        /// The only number accepted.
        expected: u64,
    },
    /// [`super::ChainStore::append`] was given a hash that is already stored.
    #[error("cannot append block {number}: its hash {hash} is already the hash of block {existing}")]
    DuplicateHash {
        /// The number given.
        number: u64,
        /// The repeated hash.
        hash: B256,
        /// The stored block with that hash.
        existing: u64,
    },
    /// [`super::ChainStore::append`] was given more than [`super::MAX_PAYLOAD_BYTES`].
    #[error("cannot append block {number}: {len} bytes exceed the maximum block size of {max} bytes")]
    TooLarge {
        /// The number given.
        number: u64,
        /// The length given.
        len: usize,
        /// The maximum.
        max: u32,
    },
    /// A write to a store opened with [`super::ChainStore::open_read_only`].
    #[error("chain store in {} was opened read-only", .dir.display())]
    ReadOnly {
        /// The store's location.
        dir: PathBuf,
    },
    /// An earlier write, fsync or segment creation failed, so what reached the disk is
    /// unknown; reopening recovers from the disk.
    #[error("chain store in {} is unusable after an earlier failure ({cause}); reopen it", .dir.display())]
    Poisoned {
        /// The store's location.
        dir: PathBuf,
        /// The failure.
        cause: String,
    },
    /// Any other error of the underlying log (a segment name that is no LSN, ...).
    #[error("chain store: {source}")]
    Log {
        /// The log's error.
        #[from]
        source: LogError,
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
            StoreError::UnsupportedFormat { first_block, .. } => *first_block,
            _ => None,
        }
    }

    /// The damage found, for [`StoreError::Corrupt`] and [`StoreError::TornTail`].
    pub fn damage(&self) -> Option<&Damage> {
        match self {
            StoreError::Corrupt { damage, .. } | StoreError::TornTail { damage, .. } => Some(damage),
            _ => None,
        }
    }

    /// The chain store's view of an error of its log. A torn tail has no block number in the
    /// log's terms; `intact_blocks` (how many blocks precede it) gives it one.
    pub(super) fn from_log(error: LogError, intact_blocks: u64) -> StoreError {
        match error {
            LogError::Io { op, path, source } => StoreError::Io { op, path, source },
            LogError::Corrupt { segment, offset, lsn: Some(lsn), reason } if lsn > 0 => {
                StoreError::Corrupt { file: segment, offset, block: lsn - 1, damage: Damage::Record { reason } }
            }
            LogError::TornTail { tail } => StoreError::TornTail {
                file: tail.segment,
                offset: tail.offset,
                block: intact_blocks,
                bytes: tail.bytes,
                damage: Damage::Record { reason: tail.reason },
            },
            LogError::UnsupportedFormat { segment, found, supported } => {
                StoreError::UnsupportedFormat { first_block: first_block_of(&segment), file: segment, found, supported }
            }
            LogError::ReadOnly { dir } => StoreError::ReadOnly { dir },
            LogError::Poisoned { dir, cause } => StoreError::Poisoned { dir, cause },
            other => StoreError::Log { source: other },
        }
    }

    /// As [`from_log`](StoreError::from_log), for a failed read of block `number` at `file`,
    /// `offset`: a file that ends early is damage to that block, not a failure to read.
    pub(super) fn from_read(error: LogError, number: u64, file: PathBuf, offset: u64) -> StoreError {
        match error {
            LogError::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof => {
                StoreError::Corrupt { file, offset, block: number, damage: Damage::Missing }
            }
            other => StoreError::from_log(other, number),
        }
    }
}
