//! Virga's durable record log.
//!
//! A [`RecordLog`] is a namespace ([`Storage`], usually a directory) of append-only segment
//! objects holding checksummed records. Each record gets a log sequence number (LSN): LSNs
//! start at 1 and increase by one per record, across segments and across reopen, even after
//! old segments were deleted by [`RecordLog::truncate_prefix`].
//!
//! Opening a log builds an index (LSN → segment, offset, length) without keeping payloads;
//! records are read back on demand ([`RecordLog::read`], [`RecordLog::records`]), or seen
//! once while the index is built ([`RecordLog::open_with`]).
//!
//! Checking, repairing and opening are separate steps:
//!
//! * [`RecordLog::scan`] changes nothing and says whether the log is clean, ends in a torn
//!   tail (what a crash during an append leaves), or is damaged (naming the first damaged
//!   record).
//! * [`RecordLog::repair`] cuts a torn tail, and nothing else.
//! * [`RecordLog::open`] refuses a torn tail with [`LogError::TornTail`];
//!   [`RecordLog::recover`] repairs, then opens (what a restarting process wants);
//!   [`OpenMode::ReadOnly`] reads up to a torn tail without touching anything.
//!
//! Damage anywhere but the tail of the last segment is refused with [`LogError::Corrupt`]:
//! there it would mean losing data that was already acknowledged as durable.
//!
//! ```
//! use virga_log::{LogOptions, RecordLog, SyncPolicy};
//!
//! let dir = tempfile::tempdir()?;
//! let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
//! let (mut log, opened) = RecordLog::recover(dir.path(), options.clone())?;
//! assert_eq!(opened.record_count, 0);
//! assert_eq!(log.append(b"first")?, 1);
//! assert_eq!(log.append(b"second")?, 2);
//! assert_eq!(log.sync()?, 2);
//! drop(log);
//!
//! let (log, opened) = RecordLog::recover(dir.path(), options)?;
//! assert_eq!(opened.record_count, 2);
//! assert_eq!(log.read(2)?, b"second");
//! assert_eq!(log.next_lsn(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See the crate README for the on-disk format and the invariants the log maintains.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod format;
pub mod fuzzing;
mod group;
mod log;
mod scan;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use format::{
    decode_segment_header_with, encode_segment_header_with, segment_file_name, SegmentHeaderError, RECORD_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
pub use group::{
    GroupLog, GroupLogOptions, GroupLogStats, ParseSyncModeError, RecordBuf, SyncMode, DEFAULT_MAX_STAGED_BYTES,
};
pub use log::{read_all, RecordLog, Records};
pub use virga_core::device::{FileStorage, IntoStorage, Storage};

/// Default for [`LogOptions::segment_bytes`]: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default for [`LogOptions::max_record_bytes`]: 64 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 64 << 20;
/// Default for [`LogOptions::write_buffer_bytes`]: 1 MiB.
pub const DEFAULT_WRITE_BUFFER_BYTES: usize = 1 << 20;

/// When appended records are made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Only [`RecordLog::sync`] (and segment rotation or [`RecordLog::truncate_prefix`],
    /// which must sync to keep the log recoverable) makes records durable. Buffered records
    /// are handed to the operating system when the write buffer fills and on drop, without
    /// an fsync.
    None,
    /// Every [`RecordLog::append`] writes and fsyncs its record before returning.
    #[default]
    Every,
}

/// Tuning knobs of a [`RecordLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// A new segment is started before a record that would make the current segment larger
    /// than this many bytes (headers included). A segment holding a single record may exceed
    /// it when that record alone is larger.
    pub segment_bytes: u64,
    /// Largest payload accepted by [`RecordLog::append`]. During recovery a record header
    /// announcing a longer payload is treated as corruption, before anything is allocated.
    pub max_record_bytes: u32,
    /// When to fsync.
    pub sync: SyncPolicy,
    /// Appended records are kept in a user-space buffer of about this size before being
    /// written to the operating system (with [`SyncPolicy::None`]).
    pub write_buffer_bytes: usize,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            sync: SyncPolicy::default(),
            write_buffer_bytes: DEFAULT_WRITE_BUFFER_BYTES,
        }
    }
}

/// How [`RecordLog::open_with`] treats a torn tail, and whether the log may be written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenMode {
    /// Refuse a torn tail with [`LogError::TornTail`]; the caller decides whether to repair.
    #[default]
    Strict,
    /// Cut a torn tail (as [`RecordLog::repair`]), then open for writing.
    Repair,
    /// Change nothing: index the records before a torn tail, and refuse every write with
    /// [`LogError::ReadOnly`]. For auditors of a log another process may own.
    ReadOnly,
}

/// One record read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's log sequence number.
    pub lsn: u64,
    /// The bytes given to [`RecordLog::append`].
    pub payload: Vec<u8>,
}

/// Where a record lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordLocation {
    /// Name of the segment object in the log's storage.
    pub segment: String,
    /// Byte offset of the record's header in the segment; the payload follows it
    /// ([`RECORD_HEADER_LEN`] bytes later).
    pub offset: u64,
    /// Payload length in bytes.
    pub payload_len: u32,
}

/// A torn tail: where it starts and why it is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailRepair {
    /// The segment holding the tail (the last one), named as its storage names it.
    pub segment: PathBuf,
    /// Byte offset in `segment` at which the invalid data starts; the repaired file ends here
    /// (for an interrupted segment creation, 0: the segment is rewritten as a fresh header).
    pub offset: u64,
    /// How many bytes are (or would be) removed.
    pub bytes: u64,
    /// What is wrong with the data at `offset`.
    pub reason: String,
}

/// What opening a log found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// Lowest LSN the log holds (equals `next_lsn` when it holds none).
    pub first_lsn: u64,
    /// LSN the next appended record will get.
    pub next_lsn: u64,
    /// Records indexed: `next_lsn - first_lsn`.
    pub record_count: u64,
    /// Bytes cut from the end of the last segment (0 when nothing was cut).
    pub truncated_bytes: u64,
    /// The torn tail: cut in [`OpenMode::Repair`], left in place in [`OpenMode::ReadOnly`].
    pub repair: Option<TailRepair>,
    /// Number of segment objects.
    pub segments: usize,
}

/// The first damaged record of a log, as [`RecordLog::scan`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The damaged segment (or, for a segment name problem, the object with that name).
    pub segment: PathBuf,
    /// Byte offset in `segment` where the damage starts.
    pub offset: u64,
    /// LSN of the record expected at `offset`, when known.
    pub lsn: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

/// What [`RecordLog::scan`] says about a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every record is intact.
    Clean,
    /// The last segment ends in a torn tail that [`RecordLog::repair`] would cut.
    TornTail(TailRepair),
    /// Damage that repair will not touch: opening fails with [`LogError::Corrupt`].
    Damaged(Damage),
}

/// The result of [`RecordLog::scan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanReport {
    /// Clean, torn or damaged.
    pub verdict: Verdict,
    /// Lowest LSN of the log.
    pub first_lsn: u64,
    /// LSN after the last intact record before any tear or damage.
    pub next_lsn: u64,
    /// Segment objects.
    pub segments: usize,
}

/// Errors of the record log. Each names the object involved; corruption also names the
/// offset and, when known, the LSN.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A storage operation failed.
    #[error("failed to {op} {}: {source}", .path.display())]
    Io {
        /// What the log was doing, e.g. "fsync".
        op: &'static str,
        /// The object or namespace involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Data that cannot be the result of an interrupted write: recovery stops rather than drop
    /// records that may have been acknowledged.
    #[error("corrupt log segment {} at byte offset {offset}{}: {reason}", .segment.display(), lsn_suffix(*.lsn))]
    Corrupt {
        /// The damaged segment (or, for a segment name problem, the object with that name).
        segment: PathBuf,
        /// Byte offset in `segment` where the damage starts.
        offset: u64,
        /// LSN of the record expected there, when known.
        lsn: Option<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A segment written by another version of the on-disk format.
    #[error(
        "log segment {} was written by format version {found}, {} than this build's version {supported}; \
         it cannot be read by this build",
        .segment.display(),
        if *.found < *.supported { "older" } else { "newer" }
    )]
    UnsupportedFormat {
        /// The segment.
        segment: PathBuf,
        /// The version it carries.
        found: u16,
        /// The version this build reads and writes.
        supported: u16,
    },
    /// The last segment ends in a torn tail and the log was opened in [`OpenMode::Strict`].
    #[error(
        "log segment {} ends in a torn tail at byte offset {} ({} bytes: {}); run RecordLog::repair \
         (or open with RecordLog::recover) to cut it",
        .tail.segment.display(), .tail.offset, .tail.bytes, .tail.reason
    )]
    TornTail {
        /// Where the tail starts and why.
        tail: TailRepair,
    },
    /// [`RecordLog::append`] was given a payload above [`LogOptions::max_record_bytes`].
    #[error("record payload of {len} bytes exceeds the maximum record size of {max} bytes")]
    RecordTooLarge {
        /// Length of the rejected payload.
        len: usize,
        /// The configured maximum.
        max: u32,
    },
    /// A read asked for an LSN the log does not hold.
    #[error("log {} holds LSNs {first}..{next}, not LSN {lsn}", .dir.display())]
    NoSuchRecord {
        /// The log's location.
        dir: PathBuf,
        /// The LSN asked for.
        lsn: u64,
        /// Lowest LSN held.
        first: u64,
        /// One past the highest LSN held.
        next: u64,
    },
    /// A write to a log opened with [`OpenMode::ReadOnly`].
    #[error("log {} was opened read-only", .dir.display())]
    ReadOnly {
        /// The log's location.
        dir: PathBuf,
    },
    /// All `u64` LSNs have been used.
    #[error("log sequence numbers exhausted in {}", .dir.display())]
    LsnExhausted {
        /// The log's location.
        dir: PathBuf,
    },
    /// An earlier write or fsync failed, so what reached the disk is unknown. The handle
    /// refuses further work; reopening the log recovers it from what is on disk.
    #[error("log in {} is unusable after an earlier failure ({cause}); reopen it to recover", .dir.display())]
    Poisoned {
        /// The log's location.
        dir: PathBuf,
        /// The message of the failure that poisoned the log.
        cause: String,
    },
}

fn lsn_suffix(lsn: Option<u64>) -> String {
    lsn.map(|lsn| format!(" (LSN {lsn})")).unwrap_or_default()
}

impl LogError {
    /// The damage this error reports, if it is [`LogError::Corrupt`].
    pub fn damage(&self) -> Option<Damage> {
        match self {
            LogError::Corrupt { segment, offset, lsn, reason } => {
                Some(Damage { segment: segment.clone(), offset: *offset, lsn: *lsn, reason: reason.clone() })
            }
            _ => None,
        }
    }
}

fn io_error(op: &'static str, path: PathBuf) -> impl FnOnce(io::Error) -> LogError {
    move |source| LogError::Io { op, path, source }
}

fn corrupt(segment: PathBuf, offset: u64, lsn: Option<u64>, reason: impl Into<String>) -> LogError {
    LogError::Corrupt { segment, offset, lsn, reason: reason.into() }
}
