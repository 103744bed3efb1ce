//! Virga's durable record log.
//!
//! A [`RecordLog`] is a directory of append-only segment files holding checksummed records.
//! Each record gets a log sequence number (LSN): LSNs start at 1 and increase by one per
//! record, across segments and across reopen, even after old segments were deleted by
//! [`RecordLog::truncate_prefix`].
//!
//! [`RecordLog::open`] recovers the log: it validates every record, cuts a torn or corrupt
//! tail off the last segment (the signature of a crash during a write), and refuses with
//! [`LogError::Corrupt`] when damage sits anywhere else, because there it would mean losing
//! data that was already acknowledged as durable.
//!
//! ```
//! use virga_log::{LogOptions, RecordLog, SyncPolicy};
//!
//! let dir = tempfile::tempdir()?;
//! let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
//! let (mut log, recovered) = RecordLog::open(dir.path(), options.clone())?;
//! assert!(recovered.records.is_empty());
//! assert_eq!(log.append(b"first")?, 1);
//! assert_eq!(log.append(b"second")?, 2);
//! assert_eq!(log.sync()?, 2);
//! drop(log);
//!
//! let (log, recovered) = RecordLog::open(dir.path(), options)?;
//! assert_eq!(recovered.records.len(), 2);
//! assert_eq!(recovered.records[1].payload, b"second");
//! assert_eq!(log.next_lsn(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See the crate README for the on-disk format and the invariants the log maintains.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod format;
mod group;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use format::{
    decode_segment_header, encode_record, encode_segment_header, parse_segment_file_name, record_checksum,
    RecordHeader, SegmentName, RECORD_FORMAT_VERSION, RECORD_MAGIC,
};
pub use format::{
    decode_segment_header_with, encode_segment_header_with, segment_file_name, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
pub use group::{
    GroupLog, GroupLogOptions, GroupLogStats, ParseSyncModeError, RecordBuf, SyncMode, DEFAULT_MAX_STAGED_BYTES,
};

/// Default for [`LogOptions::segment_bytes`]: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default for [`LogOptions::max_record_bytes`]: 64 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 64 << 20;
/// Default for [`LogOptions::write_buffer_bytes`]: 1 MiB.
pub const DEFAULT_WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Size of the read buffer used while scanning segments during recovery.
const SCAN_BUFFER_BYTES: usize = 64 << 10;

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

/// One record read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's log sequence number.
    pub lsn: u64,
    /// The bytes given to [`RecordLog::append`].
    pub payload: Vec<u8>,
}

/// Where and why recovery cut the tail of the last segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailRepair {
    /// The segment that was truncated.
    pub segment: PathBuf,
    /// Byte offset in `segment` at which the invalid data started; the file now ends here.
    pub offset: u64,
    /// How many bytes were removed.
    pub bytes: u64,
    /// What was wrong with the data at `offset`.
    pub reason: String,
}

/// What [`RecordLog::open`] found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// Every valid record still in the log, in LSN order. Their LSNs are consecutive.
    pub records: Vec<Record>,
    /// Bytes cut from the end of the last segment (0 when the log was clean).
    pub truncated_bytes: u64,
    /// Details of the cut, when there was one.
    pub repair: Option<TailRepair>,
    /// LSN the next appended record will get.
    pub next_lsn: u64,
    /// Number of segment files in the log after recovery.
    pub segments: usize,
}

/// Errors of the record log. Each names the file involved; corruption also names the offset.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An operating-system call failed.
    #[error("failed to {op} {}: {source}", .path.display())]
    Io {
        /// What the log was doing, e.g. "fsync".
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Data that cannot be the result of an interrupted write: recovery stops rather than drop
    /// records that may have been acknowledged.
    #[error("corrupt log segment {} at byte offset {offset}: {reason}", .segment.display())]
    Corrupt {
        /// The damaged segment file (or, for a segment name problem, the file with that name).
        segment: PathBuf,
        /// Byte offset in `segment` where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// [`RecordLog::append`] was given a payload above [`LogOptions::max_record_bytes`].
    #[error("record payload of {len} bytes exceeds the maximum record size of {max} bytes")]
    RecordTooLarge {
        /// Length of the rejected payload.
        len: usize,
        /// The configured maximum.
        max: u32,
    },
    /// All `u64` LSNs have been used.
    #[error("log sequence numbers exhausted in {}", .dir.display())]
    LsnExhausted {
        /// The log directory.
        dir: PathBuf,
    },
    /// An earlier write or fsync failed, so what reached the disk is unknown. The handle
    /// refuses further work; reopening the log recovers it from what is on disk.
    #[error("log in {} is unusable after an earlier failure ({cause}); reopen it to recover", .dir.display())]
    Poisoned {
        /// The log directory.
        dir: PathBuf,
        /// The message of the failure that poisoned the log.
        cause: String,
    },
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |source| LogError::Io { op, path: path.to_path_buf(), source }
}

fn corrupt(segment: &Path, offset: u64, reason: impl Into<String>) -> LogError {
    LogError::Corrupt { segment: segment.to_path_buf(), offset, reason: reason.into() }
}

/// A segment file: records with LSNs from `base_lsn` up to the next segment's `base_lsn`.
#[derive(Clone, Debug)]
struct Segment {
    base_lsn: u64,
    path: PathBuf,
}

/// An append-only log of checksummed records spread over segment files in one directory.
///
/// One `RecordLog` must be the only writer of its directory.
pub struct RecordLog {
    dir: PathBuf,
    options: LogOptions,
    /// Full segments, oldest first. They are durable and never written again.
    closed: VecDeque<Segment>,
    /// The segment being appended to.
    active: Segment,
    /// Handle on the active segment, opened for appending.
    file: File,
    /// Bytes of the active segment handed to the operating system.
    file_len: u64,
    /// Bytes of the active segment known to be on stable storage.
    durable_len: u64,
    /// Encoded records not yet handed to the operating system.
    buf: Vec<u8>,
    next_lsn: u64,
    /// Highest LSN handed to the operating system (0 if none).
    written_lsn: u64,
    /// Highest LSN known to be on stable storage (0 if none).
    durable_lsn: u64,
    /// Set when a write, fsync or rotation failed part-way.
    poisoned: Option<String>,
}

impl fmt::Debug for RecordLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordLog")
            .field("dir", &self.dir)
            .field("segments", &(self.closed.len() + 1))
            .field("first_lsn", &self.first_lsn())
            .field("next_lsn", &self.next_lsn)
            .field("durable_lsn", &self.durable_lsn)
            .field("buffered_bytes", &self.buf.len())
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl RecordLog {
    /// Opens (creating if needed) the log in `dir` and recovers its records.
    ///
    /// A torn or corrupt tail of the last segment is cut off the file (and fsynced) and
    /// reported in [`Recovered::truncated_bytes`]; damage in any earlier segment, a gap in
    /// the LSN sequence between segments, or a checksummed record with an unexpected LSN is
    /// reported as [`LogError::Corrupt`]. Files whose names are not segment names are
    /// ignored. All recovered records are durable when this returns.
    pub fn open(dir: &Path, options: LogOptions) -> Result<(RecordLog, Recovered), LogError> {
        create_log_dir(dir)?;
        let mut closed = list_segments(dir)?;
        let active = match closed.pop_back() {
            Some(last) => last,
            None => {
                let first = Segment { base_lsn: 1, path: dir.join(segment_file_name(1)) };
                drop(create_segment_file(&first)?);
                first
            }
        };
        let Scanned { records, repair, next_lsn, active_len } = scan_log(&closed, &active, &options, true)?;
        let file =
            OpenOptions::new().append(true).open(&active.path).map_err(io_error("open for appending", &active.path))?;
        // What was read may still sit only in the page cache of a process that crashed, and
        // the active segment's directory entry may not be durable yet: make both durable
        // before anything is built on top of them.
        file.sync_data().map_err(io_error("fsync", &active.path))?;
        sync_dir(dir)?;

        let segment_count = closed.len() + 1;
        let truncated_bytes = repair.as_ref().map_or(0, |r| r.bytes);
        let last_lsn = next_lsn - 1;
        let log = RecordLog {
            dir: dir.to_path_buf(),
            options,
            closed,
            active,
            file,
            file_len: active_len,
            durable_len: active_len,
            buf: Vec::new(),
            next_lsn,
            written_lsn: last_lsn,
            durable_lsn: last_lsn,
            poisoned: None,
        };
        let recovered = Recovered { records, truncated_bytes, repair, next_lsn, segments: segment_count };
        Ok((log, recovered))
    }

    /// Reads the log in `dir` without changing anything on disk: the records [`Self::open`]
    /// would recover, with [`Recovered::truncated_bytes`] and [`Recovered::repair`] telling
    /// what it would cut from a torn tail. Damage `open` refuses is refused here too. For
    /// auditors of a log another process may still own.
    pub fn read(dir: &Path, options: LogOptions) -> Result<Recovered, LogError> {
        let mut closed = list_segments(dir)?;
        let Some(active) = closed.pop_back() else {
            return Ok(Recovered { records: Vec::new(), truncated_bytes: 0, repair: None, next_lsn: 1, segments: 0 });
        };
        let Scanned { records, repair, next_lsn, .. } = scan_log(&closed, &active, &options, false)?;
        let truncated_bytes = repair.as_ref().map_or(0, |r| r.bytes);
        Ok(Recovered { records, truncated_bytes, repair, next_lsn, segments: closed.len() + 1 })
    }

    /// Appends a record and returns its LSN.
    ///
    /// With [`SyncPolicy::Every`] the record is durable when this returns; with
    /// [`SyncPolicy::None`] it is only buffered until [`RecordLog::sync`].
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, LogError> {
        self.check_usable()?;
        let max = self.options.max_record_bytes;
        let payload_len = match u32::try_from(payload.len()) {
            Ok(len) if len <= max => len,
            _ => return Err(LogError::RecordTooLarge { len: payload.len(), max }),
        };
        let lsn = self.next_lsn;
        let Some(following) = lsn.checked_add(1) else {
            return Err(LogError::LsnExhausted { dir: self.dir.clone() });
        };
        let record_len = (RECORD_HEADER_LEN + payload.len()) as u64;
        let active_has_records = lsn > self.active.base_lsn;
        let active_len = self.file_len + self.buf.len() as u64;
        if active_has_records && active_len + record_len > self.options.segment_bytes {
            self.rotate().map_err(|e| self.poison(e))?;
        }

        encode_record(&mut self.buf, lsn, payload_len, payload);
        self.next_lsn = following;

        match self.options.sync {
            SyncPolicy::Every => {
                self.sync()?;
            }
            SyncPolicy::None => {
                if self.buf.len() >= self.options.write_buffer_bytes {
                    self.write_buffer().map_err(|e| self.poison(e))?;
                }
            }
        }
        Ok(lsn)
    }

    /// Hands buffered records to the operating system without waiting for stable storage.
    /// They survive a crash of this process but not of the machine.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.check_usable()?;
        self.write_buffer().map_err(|e| self.poison(e))
    }

    /// Writes buffered records and fsyncs the active segment; returns the highest durable LSN
    /// (0 if the log never held a record).
    pub fn sync(&mut self) -> Result<u64, LogError> {
        self.check_usable()?;
        self.sync_active().map_err(|e| self.poison(e))?;
        Ok(self.durable_lsn)
    }

    /// Highest LSN known to be on stable storage (0 if none).
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }

    /// LSN the next appended record will get.
    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Lowest LSN the log may still hold: the first LSN of its oldest segment. Equals
    /// [`RecordLog::next_lsn`] when every record has been truncated away.
    pub fn first_lsn(&self) -> u64 {
        self.closed.front().map_or(self.active.base_lsn, |s| s.base_lsn)
    }

    /// Number of segment files, the active one included.
    pub fn segment_count(&self) -> usize {
        self.closed.len() + 1
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &LogOptions {
        &self.options
    }

    /// Deletes every segment all of whose records have LSNs below `before_lsn`, typically
    /// after a checkpoint has made them unnecessary. Returns how many segments were deleted.
    ///
    /// Records at or above `before_lsn` are always kept; records below it may be kept too when
    /// they share a segment with later ones. If every record of the active segment is below
    /// `before_lsn`, the log first moves to a fresh segment (syncing the old one) so that it
    /// can be deleted as well. The next LSN never goes back: the surviving (possibly empty)
    /// segment carries it in its name and header.
    pub fn truncate_prefix(&mut self, before_lsn: u64) -> Result<usize, LogError> {
        self.check_usable()?;
        let active_has_records = self.next_lsn > self.active.base_lsn;
        if active_has_records && self.next_lsn <= before_lsn {
            self.rotate().map_err(|e| self.poison(e))?;
        }
        let mut removed = 0;
        while let Some(oldest) = self.closed.front() {
            // `oldest` holds LSNs below the base of the segment after it.
            let end = self.closed.get(1).map_or(self.active.base_lsn, |s| s.base_lsn);
            if end > before_lsn {
                break;
            }
            match fs::remove_file(&oldest.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("delete", &oldest.path)(e)),
            }
            self.closed.pop_front();
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    fn check_usable(&self) -> Result<(), LogError> {
        match &self.poisoned {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned { dir: self.dir.clone(), cause: cause.clone() }),
        }
    }

    fn poison(&mut self, error: LogError) -> LogError {
        self.poisoned = Some(error.to_string());
        error
    }

    /// Hands the buffer to the operating system.
    fn write_buffer(&mut self) -> Result<(), LogError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.buf).map_err(io_error("write to", &self.active.path))?;
        self.file_len += self.buf.len() as u64;
        self.buf.clear();
        self.written_lsn = self.next_lsn - 1;
        Ok(())
    }

    /// Makes everything appended so far durable.
    fn sync_active(&mut self) -> Result<(), LogError> {
        self.write_buffer()?;
        if self.durable_len < self.file_len {
            self.file.sync_data().map_err(io_error("fsync", &self.active.path))?;
            self.durable_len = self.file_len;
        }
        self.durable_lsn = self.durable_lsn.max(self.written_lsn);
        Ok(())
    }

    /// Closes the active segment and starts a new one at `next_lsn`.
    ///
    /// The old segment is made fully durable first: recovery treats damage in any segment
    /// but the last as corruption, so no segment may be followed by another while it still
    /// has a tail that a crash could tear.
    fn rotate(&mut self) -> Result<(), LogError> {
        self.sync_active()?;
        let next = Segment { base_lsn: self.next_lsn, path: self.dir.join(segment_file_name(self.next_lsn)) };
        let file = create_segment_file(&next)?;
        let old = std::mem::replace(&mut self.active, next);
        self.closed.push_back(old);
        self.file = file;
        self.file_len = SEGMENT_HEADER_LEN as u64;
        self.durable_len = self.file_len;
        Ok(())
    }

    /// Test hook: drops the log as a crash would, losing records still in the user-space
    /// buffer.
    #[cfg(test)]
    fn crash(mut self) {
        self.buf.clear();
    }
}

impl Drop for RecordLog {
    fn drop(&mut self) {
        // Best effort and without fsync, as documented for `SyncPolicy::None`. After a
        // failure the file's state is unknown, so nothing more is written.
        if self.poisoned.is_none() && !self.buf.is_empty() {
            let _ = self.file.write_all(&self.buf);
        }
    }
}

/// Creates the log directory if it is missing, making its entry in the parent durable.
/// What scanning a log's segments found.
struct Scanned {
    records: Vec<Record>,
    repair: Option<TailRepair>,
    next_lsn: u64,
    /// Valid bytes of the active segment.
    active_len: u64,
}

/// Reads every segment, oldest first, refusing damage anywhere but at the end of the last
/// segment. A torn tail there is cut off the file when `repair_tail`, else only reported.
fn scan_log(
    closed: &VecDeque<Segment>,
    active: &Segment,
    options: &LogOptions,
    repair_tail: bool,
) -> Result<Scanned, LogError> {
    let mut records = Vec::new();
    let mut repair = None;
    let mut next_lsn = closed.front().map_or(active.base_lsn, |s| s.base_lsn);
    let mut active_len = SEGMENT_HEADER_LEN as u64;
    let last_index = closed.len();
    for (index, segment) in closed.iter().chain(std::iter::once(active)).enumerate() {
        let is_last = index == last_index;
        if segment.base_lsn != next_lsn {
            return Err(corrupt(
                &segment.path,
                0,
                format!(
                    "segment starts at LSN {} but the previous segment ends before LSN \
                     {next_lsn}; records are missing or duplicated",
                    segment.base_lsn
                ),
            ));
        }
        match scan_segment(segment, options.max_record_bytes)? {
            Scan::TornHeader { file_len, reason } => {
                if !is_last {
                    return Err(corrupt(&segment.path, 0, format!("{reason}, yet later segments follow it")));
                }
                // The crash hit while this segment was being created: nothing was ever
                // written to it, so start it afresh.
                if repair_tail {
                    rewrite_segment_header(segment)?;
                }
                repair = Some(TailRepair { segment: segment.path.clone(), offset: 0, bytes: file_len, reason });
            }
            Scan::Body(body) => {
                if let Some(defect) = body.defect {
                    if !is_last {
                        return Err(corrupt(
                            &segment.path,
                            defect.offset,
                            format!("{}; later segments follow, so this is not a torn write", defect.reason),
                        ));
                    }
                    // A crash tears only the end of what was being written. Intact
                    // records after the damage mean acknowledged data was damaged in
                    // place: cutting there would silently drop it.
                    if let Some((offset, lsn)) =
                        find_intact_record_after(&segment.path, defect.offset, body.next_lsn, options.max_record_bytes)?
                    {
                        return Err(corrupt(
                            &segment.path,
                            defect.offset,
                            format!(
                                "{}; an intact record (LSN {lsn}) follows at offset {offset}, so this is \
                                 damage inside the log, not a torn write, and recovery refuses to drop \
                                 the records after it",
                                defect.reason
                            ),
                        ));
                    }
                    if repair_tail {
                        truncate_file(&segment.path, defect.offset)?;
                    }
                    repair = Some(TailRepair {
                        segment: segment.path.clone(),
                        offset: defect.offset,
                        bytes: body.file_len - defect.offset,
                        reason: defect.reason,
                    });
                    active_len = defect.offset;
                } else {
                    active_len = body.file_len;
                }
                next_lsn = body.next_lsn;
                records.extend(body.records);
            }
        }
    }
    Ok(Scanned { records, repair, next_lsn, active_len })
}

fn create_log_dir(dir: &Path) -> Result<(), LogError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Segment files of `dir`, ordered by first LSN.
fn list_segments(dir: &Path) -> Result<VecDeque<Segment>, LogError> {
    let mut segments = Vec::new();
    let entries = fs::read_dir(dir).map_err(io_error("list directory", dir))?;
    for entry in entries {
        let entry = entry.map_err(io_error("list directory", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        match parse_segment_file_name(name) {
            SegmentName::Other => {}
            SegmentName::Invalid => {
                return Err(corrupt(&entry.path(), 0, "segment file name is not an LSN between 1 and 2^64-1"))
            }
            SegmentName::Base(base_lsn) => segments.push(Segment { base_lsn, path: entry.path() }),
        }
    }
    segments.sort_by_key(|s| s.base_lsn);
    Ok(segments.into())
}

/// Creates a new segment file holding only its header, durably (file and directory entry),
/// and returns it opened for appending.
fn create_segment_file(segment: &Segment) -> Result<File, LogError> {
    let path = &segment.path;
    let mut file = OpenOptions::new().append(true).create_new(true).open(path).map_err(io_error("create", path))?;
    file.write_all(&encode_segment_header(segment.base_lsn)).map_err(io_error("write header of", path))?;
    file.sync_all().map_err(io_error("fsync", path))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(file)
}

/// Replaces the contents of a segment whose creation was interrupted with a fresh header.
fn rewrite_segment_header(segment: &Segment) -> Result<(), LogError> {
    let path = &segment.path;
    let mut file = OpenOptions::new().write(true).open(path).map_err(io_error("open for repair", path))?;
    file.set_len(0).map_err(io_error("truncate", path))?;
    file.write_all(&encode_segment_header(segment.base_lsn)).map_err(io_error("write header of", path))?;
    file.sync_all().map_err(io_error("fsync", path))
}

fn truncate_file(path: &Path, len: u64) -> Result<(), LogError> {
    let file = OpenOptions::new().write(true).open(path).map_err(io_error("open for repair", path))?;
    file.set_len(len).map_err(io_error("truncate", path))?;
    file.sync_all().map_err(io_error("fsync", path))
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("fsync directory", dir))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), LogError> {
    // Directories cannot be opened as files here; the platform persists entries itself.
    Ok(())
}

/// Result of reading one segment file.
enum Scan {
    /// The file is no longer than a segment header and the header is incomplete or invalid:
    /// the segment's creation was interrupted before any record could be written to it.
    TornHeader {
        file_len: u64,
        reason: String,
    },
    Body(SegmentBody),
}

struct SegmentBody {
    records: Vec<Record>,
    /// LSN following the last valid record.
    next_lsn: u64,
    file_len: u64,
    /// First invalid data, if any; everything before it is valid.
    defect: Option<Defect>,
}

struct Defect {
    offset: u64,
    reason: String,
}

/// Looks for an intact record (right magic, version and flags, a checksum that verifies,
/// an LSN at or after `from_lsn`) starting anywhere after `defect_offset` in `path`. Returns
/// its offset and LSN.
fn find_intact_record_after(
    path: &Path,
    defect_offset: u64,
    from_lsn: u64,
    max_record_bytes: u32,
) -> Result<Option<(u64, u64)>, LogError> {
    let mut file = File::open(path).map_err(io_error("open", path))?;
    let mut tail = Vec::new();
    io::Seek::seek(&mut file, io::SeekFrom::Start(defect_offset + 1)).map_err(io_error("seek", path))?;
    file.read_to_end(&mut tail).map_err(io_error("read", path))?;
    for start in 0..tail.len().saturating_sub(RECORD_HEADER_LEN - 1) {
        if tail[start] != RECORD_MAGIC {
            continue;
        }
        let mut raw = [0u8; RECORD_HEADER_LEN];
        raw.copy_from_slice(&tail[start..start + RECORD_HEADER_LEN]);
        let header = RecordHeader::parse(&raw);
        if header.version != RECORD_FORMAT_VERSION || header.flags != 0 || header.lsn < from_lsn {
            continue;
        }
        if header.payload_len > max_record_bytes {
            continue;
        }
        let body = start + RECORD_HEADER_LEN;
        let Some(payload) = tail.get(body..body + header.payload_len as usize) else { continue };
        if record_checksum(&raw, payload) == header.crc {
            return Ok(Some((defect_offset + 1 + start as u64, header.lsn)));
        }
    }
    Ok(None)
}

/// Reads and validates one segment.
///
/// Problems that an interrupted append can cause (a short or zero-filled header, a length
/// past the end of the file or above the maximum, a checksum mismatch) end the scan with a
/// [`Defect`]; the caller decides whether that is a torn tail or corruption. A record with a
/// valid checksum but the wrong LSN, version or flags cannot come from a torn write and is
/// reported as corruption directly.
fn scan_segment(segment: &Segment, max_record_bytes: u32) -> Result<Scan, LogError> {
    let path = segment.path.as_path();
    let file = File::open(path).map_err(io_error("open", path))?;
    let file_len = file.metadata().map_err(io_error("stat", path))?.len();
    let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, file);

    let header_len = SEGMENT_HEADER_LEN as u64;
    if file_len < header_len {
        return Ok(Scan::TornHeader {
            file_len,
            reason: format!(
                "segment file is {file_len} bytes long, shorter than its \
                 {SEGMENT_HEADER_LEN}-byte header"
            ),
        });
    }
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    reader.read_exact(&mut header).map_err(io_error("read", path))?;
    match decode_segment_header(&header) {
        Ok(base) if base == segment.base_lsn => {}
        Ok(base) => {
            return Err(corrupt(
                path,
                0,
                format!(
                    "segment header says the segment starts at LSN {base}, its file name says {}",
                    segment.base_lsn
                ),
            ))
        }
        Err(reason) if file_len == header_len => return Ok(Scan::TornHeader { file_len, reason }),
        Err(reason) => return Err(corrupt(path, 0, format!("{reason}, and record data follows the header"))),
    }

    let mut records = Vec::new();
    let mut offset = header_len;
    let mut expected_lsn = segment.base_lsn;
    let defect = loop {
        let remaining = file_len - offset;
        if remaining == 0 {
            break None;
        }
        let defect = |reason: String| Some(Defect { offset, reason });
        if remaining < RECORD_HEADER_LEN as u64 {
            break defect(format!("only {remaining} bytes left, too few for a {RECORD_HEADER_LEN}-byte record header"));
        }
        let mut raw = [0u8; RECORD_HEADER_LEN];
        reader.read_exact(&mut raw).map_err(io_error("read", path))?;
        if raw.iter().all(|&b| b == 0) {
            break defect("zero-filled bytes where a record header should be".to_string());
        }
        let header = RecordHeader::parse(&raw);
        if header.magic != RECORD_MAGIC {
            break defect(format!("bad record magic byte {:#04x} (expected {RECORD_MAGIC:#04x})", header.magic));
        }
        // The length is untrusted until the checksum has been verified: bound it by the
        // configured maximum and by the bytes actually present before allocating for it.
        if header.payload_len > max_record_bytes {
            break defect(format!(
                "record header announces a {}-byte payload, above the maximum record size of \
                 {max_record_bytes} bytes",
                header.payload_len
            ));
        }
        let available = remaining - RECORD_HEADER_LEN as u64;
        if u64::from(header.payload_len) > available {
            break defect(format!(
                "record header announces a {}-byte payload but only {available} bytes follow",
                header.payload_len
            ));
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        reader.read_exact(&mut payload).map_err(io_error("read", path))?;
        let computed = record_checksum(&raw, &payload);
        if computed != header.crc {
            break defect(format!("record checksum mismatch (stored {:#010x}, computed {computed:#010x})", header.crc));
        }
        if header.version != RECORD_FORMAT_VERSION {
            return Err(corrupt(
                path,
                offset,
                format!(
                    "unsupported record format version {} (this build reads version \
                     {RECORD_FORMAT_VERSION})",
                    header.version
                ),
            ));
        }
        if header.flags != 0 {
            return Err(corrupt(path, offset, format!("unknown record flags {:#06x}", header.flags)));
        }
        if header.lsn != expected_lsn {
            return Err(corrupt(
                path,
                offset,
                format!("record has LSN {} where LSN {expected_lsn} was expected", header.lsn),
            ));
        }
        let Some(following) = expected_lsn.checked_add(1) else {
            return Err(corrupt(path, offset, "record uses the last possible LSN"));
        };
        records.push(Record { lsn: header.lsn, payload });
        expected_lsn = following;
        offset += RECORD_HEADER_LEN as u64 + u64::from(header.payload_len);
    };

    Ok(Scan::Body(SegmentBody { records, next_lsn: expected_lsn, file_len, defect }))
}
