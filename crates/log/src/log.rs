//! [`RecordLog`]: opening, appending, reading, rotating and truncating.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virga_core::device::{Device, IntoStorage, Storage};

use crate::format::{encode_record, encode_segment_header, RecordHeader, RECORD_MAGIC};
use crate::scan::{list_segments, scan_log, IndexedSegment, RecordPos, Segment, Tail, TailKind};
use crate::{
    corrupt, io_error, segment_file_name, LogError, LogOptions, OpenMode, Record, RecordLocation, Recovered,
    ScanReport, SyncPolicy, TailRepair, Verdict, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};

/// An append-only log of checksummed records spread over segment objects in one
/// [`Storage`].
///
/// One `RecordLog` must be the only writer of its storage.
pub struct RecordLog {
    storage: Arc<dyn Storage>,
    location: PathBuf,
    options: LogOptions,
    /// Every segment, oldest first; the last one is appended to. Closed segments are durable
    /// and never written again. Empty only for a read-only log with no segment.
    segments: VecDeque<IndexedSegment>,
    /// Offsets of the last segment's records (its `offsets` stay empty until it is closed):
    /// kept apart so an append pushes to a vector without going through the deque.
    active_records: Vec<u64>,
    writable: bool,
    /// Bytes of the last segment handed to the device.
    file_len: u64,
    /// Bytes of the last segment known to be on stable storage.
    durable_len: u64,
    /// Encoded records not yet handed to the device; they start at offset `file_len`.
    buf: Vec<u8>,
    next_lsn: u64,
    /// Highest LSN handed to the device (0 if none).
    written_lsn: u64,
    /// Highest LSN known to be on stable storage (0 if none).
    durable_lsn: u64,
    /// Set when a write, fsync or rotation failed part-way.
    poisoned: Option<String>,
}

impl fmt::Debug for RecordLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordLog")
            .field("location", &self.location)
            .field("segments", &self.segments.len())
            .field("first_lsn", &self.first_lsn())
            .field("next_lsn", &self.next_lsn)
            .field("durable_lsn", &self.durable_lsn)
            .field("buffered_bytes", &self.buf.len())
            .field("writable", &self.writable)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

fn open_storage(at: impl IntoStorage, create: bool) -> Result<Arc<dyn Storage>, LogError> {
    let location = at.location();
    at.into_storage(create).map_err(io_error("open the storage of", location))
}

impl RecordLog {
    /// Opens (creating if needed) the log at `at` (a directory path or a [`Storage`]) in
    /// [`OpenMode::Strict`]: a torn tail is refused with [`LogError::TornTail`].
    pub fn open(at: impl IntoStorage, options: LogOptions) -> Result<(RecordLog, Recovered), LogError> {
        RecordLog::open_with(at, options, OpenMode::Strict, |_, _| {})
    }

    /// Opens (creating if needed) the log at `at`, cutting a torn tail first: what a process
    /// restarting after a crash wants. [`Recovered::repair`] says what was cut.
    pub fn recover(at: impl IntoStorage, options: LogOptions) -> Result<(RecordLog, Recovered), LogError> {
        RecordLog::open_with(at, options, OpenMode::Repair, |_, _| {})
    }

    /// Opens the log at `at` in `mode`, indexing every record and showing each payload once
    /// to `visit` (in LSN order, as it is validated) without keeping it.
    ///
    /// Damage in any segment but the last, a gap in the LSN sequence between segments, a
    /// checksummed record with an unexpected LSN, or damage in the last segment that intact
    /// records follow is [`LogError::Corrupt`]; a segment of another format version is
    /// [`LogError::UnsupportedFormat`]. `visit` may have seen records before such an error.
    /// In the write modes a missing directory and first segment are created, and every
    /// indexed record is durable when this returns.
    pub fn open_with(
        at: impl IntoStorage,
        options: LogOptions,
        mode: OpenMode,
        mut visit: impl FnMut(u64, &[u8]),
    ) -> Result<(RecordLog, Recovered), LogError> {
        let storage = open_storage(at, mode != OpenMode::ReadOnly)?;
        RecordLog::open_storage(storage, options, mode, &mut visit)
    }

    fn open_storage(
        storage: Arc<dyn Storage>,
        options: LogOptions,
        mode: OpenMode,
        visit: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(RecordLog, Recovered), LogError> {
        let writable = mode != OpenMode::ReadOnly;
        let mut segments = list_segments(&*storage)?;
        if segments.is_empty() && writable {
            let (segment, _) = create_segment(&*storage, 1)?;
            segments.push(segment);
        }
        let scanned = scan_log(&*storage, segments, options.max_record_bytes, visit)?;
        let mut truncated_bytes = 0;
        match (&scanned.tail, mode) {
            (Some(tail), OpenMode::Strict) => return Err(LogError::TornTail { tail: tail.repair.clone() }),
            (Some(tail), OpenMode::Repair) => {
                if let Some(last) = scanned.segments.last() {
                    apply_repair(last, tail)?;
                }
                truncated_bytes = tail.repair.bytes;
            }
            _ => {}
        }
        if writable {
            if let Some(last) = scanned.segments.last() {
                // What was read may still sit only in the page cache of a process that
                // crashed, and the last segment's directory entry may not be durable yet:
                // make both durable before anything is built on top of them.
                last.device.sync().map_err(io_error("fsync", last.segment.path.clone()))?;
            }
            storage.sync_dir().map_err(io_error("fsync directory", storage.location()))?;
        }
        let last_lsn = scanned.next_lsn - 1;
        let recovered = Recovered {
            first_lsn: scanned.first_lsn,
            next_lsn: scanned.next_lsn,
            record_count: scanned.next_lsn - scanned.first_lsn,
            truncated_bytes,
            repair: scanned.tail.map(|t| t.repair),
            segments: scanned.segments.len(),
        };
        let mut segments: VecDeque<IndexedSegment> = scanned.segments.into();
        let active_records = segments.back_mut().map(|s| std::mem::take(&mut s.offsets)).unwrap_or_default();
        let log = RecordLog {
            location: storage.location(),
            storage,
            options,
            segments,
            active_records,
            writable,
            file_len: scanned.last_len,
            durable_len: scanned.last_len,
            buf: Vec::new(),
            next_lsn: scanned.next_lsn,
            written_lsn: last_lsn,
            durable_lsn: last_lsn,
            poisoned: None,
        };
        Ok((log, recovered))
    }

    /// Checks the log at `at` without changing anything: clean, a torn tail that
    /// [`repair`](RecordLog::repair) would cut, or the first damaged record. Only failures to
    /// read (and a segment of another format version) are errors.
    pub fn scan(at: impl IntoStorage, options: &LogOptions) -> Result<ScanReport, LogError> {
        let storage = open_storage(at, false)?;
        let segments = list_segments(&*storage)?;
        let segment_count = segments.len();
        let first_lsn = segments.first().map_or(1, |s| s.base_lsn);
        match scan_log(&*storage, segments, options.max_record_bytes, &mut |_, _| {}) {
            Ok(scanned) => Ok(ScanReport {
                verdict: scanned.tail.map_or(Verdict::Clean, |t| Verdict::TornTail(t.repair)),
                first_lsn,
                next_lsn: scanned.next_lsn,
                segments: segment_count,
            }),
            Err(error) => match error.damage() {
                Some(damage) => {
                    let next_lsn = damage.lsn.unwrap_or(first_lsn);
                    Ok(ScanReport { verdict: Verdict::Damaged(damage), first_lsn, next_lsn, segments: segment_count })
                }
                None => Err(error),
            },
        }
    }

    /// Cuts a torn tail off the log at `at` (durably) and says what was cut; `None` when the
    /// log was clean. Damage elsewhere is refused with [`LogError::Corrupt`], untouched.
    pub fn repair(at: impl IntoStorage, options: &LogOptions) -> Result<Option<TailRepair>, LogError> {
        let storage = open_storage(at, false)?;
        let segments = list_segments(&*storage)?;
        let scanned = scan_log(&*storage, segments, options.max_record_bytes, &mut |_, _| {})?;
        let (Some(tail), Some(last)) = (scanned.tail, scanned.segments.last()) else {
            return Ok(None);
        };
        apply_repair(last, &tail)?;
        Ok(Some(tail.repair))
    }

    /// Appends a record and returns its LSN.
    ///
    /// With [`SyncPolicy::Every`] the record is durable when this returns; with
    /// [`SyncPolicy::None`] it is only buffered until [`RecordLog::sync`].
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, LogError> {
        self.check_writable()?;
        let max = self.options.max_record_bytes;
        let payload_len = match u32::try_from(payload.len()) {
            Ok(len) if len <= max => len,
            _ => return Err(LogError::RecordTooLarge { len: payload.len(), max }),
        };
        let lsn = self.next_lsn;
        let Some(following) = lsn.checked_add(1) else {
            return Err(LogError::LsnExhausted { dir: self.location.clone() });
        };
        let record_len = (RECORD_HEADER_LEN + payload.len()) as u64;
        let active_len = self.file_len + self.buf.len() as u64;
        if !self.active_records.is_empty() && active_len + record_len > self.options.segment_bytes {
            self.rotate().map_err(|e| self.poison(e))?;
        }

        let offset = self.file_len + self.buf.len() as u64;
        self.active_records.push(offset);
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

    /// Hands buffered records to the device without waiting for stable storage. On files
    /// they survive a crash of this process but not of the machine.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.check_writable()?;
        self.write_buffer().map_err(|e| self.poison(e))
    }

    /// Writes buffered records and fsyncs the active segment; returns the highest durable LSN
    /// (0 if the log never held a record).
    pub fn sync(&mut self) -> Result<u64, LogError> {
        self.check_writable()?;
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
        self.segments.front().map_or(self.next_lsn, |s| s.segment.base_lsn)
    }

    /// Number of segment objects, the active one included.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// How the log's storage names itself (its directory, for files).
    pub fn dir(&self) -> &Path {
        &self.location
    }

    /// The storage the log lives in.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &LogOptions {
        &self.options
    }

    /// Where the record with LSN `lsn` lies, or `None` if the log does not hold it.
    pub fn location(&self, lsn: u64) -> Option<RecordLocation> {
        let (segment, pos) = self.find(lsn)?;
        Some(RecordLocation { segment: segment.segment.name.clone(), offset: pos.offset, payload_len: pos.payload_len })
    }

    /// The payload of the record with LSN `lsn`, read from its segment and checked against
    /// its checksum.
    pub fn read(&self, lsn: u64) -> Result<Vec<u8>, LogError> {
        let mut payload = Vec::new();
        self.read_into(lsn, &mut payload)?;
        Ok(payload)
    }

    /// As [`read`](RecordLog::read), into `out` (replacing its contents) to reuse its
    /// allocation.
    pub fn read_into(&self, lsn: u64, out: &mut Vec<u8>) -> Result<(), LogError> {
        let (segment, pos) = self.find(lsn).ok_or_else(|| self.no_such_record(lsn))?;
        out.clear();
        out.resize(RECORD_HEADER_LEN + pos.payload_len as usize, 0);
        self.read_raw(segment, pos, out)?;
        let mut raw = [0u8; RECORD_HEADER_LEN];
        raw.copy_from_slice(&out[..RECORD_HEADER_LEN]);
        let header = self.check_header(segment, pos, lsn, &raw)?;
        let computed = crate::format::record_checksum(&raw, &out[RECORD_HEADER_LEN..]);
        if computed != header.crc {
            let reason = format!(
                "record checksum mismatch on read (stored {:#010x}, computed {computed:#010x}); it was intact when \
                 the log was opened",
                header.crc
            );
            return Err(corrupt(segment.segment.path.clone(), pos.offset, Some(lsn), reason));
        }
        out.drain(..RECORD_HEADER_LEN);
        Ok(())
    }

    /// The first `len` bytes (fewer if the payload is shorter) of record `lsn`'s payload. The
    /// record header is checked, the checksum cannot be (it covers the whole payload).
    pub fn read_prefix(&self, lsn: u64, len: usize) -> Result<Vec<u8>, LogError> {
        let (segment, pos) = self.find(lsn).ok_or_else(|| self.no_such_record(lsn))?;
        let take = len.min(pos.payload_len as usize);
        let mut bytes = vec![0u8; RECORD_HEADER_LEN + take];
        self.read_raw(segment, pos, &mut bytes)?;
        let mut raw = [0u8; RECORD_HEADER_LEN];
        raw.copy_from_slice(&bytes[..RECORD_HEADER_LEN]);
        self.check_header(segment, pos, lsn, &raw)?;
        bytes.drain(..RECORD_HEADER_LEN);
        Ok(bytes)
    }

    /// The records from LSN `from` (or the first held, if later) to the last, read one by
    /// one as the iterator advances.
    pub fn records(&self, from: u64) -> Records<'_> {
        Records { log: self, next: from.max(self.first_lsn()), end: self.next_lsn }
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
        self.check_writable()?;
        if !self.active_records.is_empty() && self.next_lsn <= before_lsn {
            self.rotate().map_err(|e| self.poison(e))?;
        }
        let mut removed = 0;
        while self.segments.len() > 1 {
            // The oldest segment holds LSNs below the base of the segment after it.
            if self.segments[1].segment.base_lsn > before_lsn {
                break;
            }
            let oldest = &self.segments[0].segment;
            match self.storage.remove(&oldest.name) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("delete", oldest.path.clone())(e)),
            }
            // One removal at a time: a crash may keep any unsynced directory operation, and
            // a later segment's removal surviving an earlier one's would leave a gap.
            self.storage.sync_dir().map_err(io_error("fsync directory", self.location.clone()))?;
            self.segments.pop_front();
            removed += 1;
        }
        Ok(removed)
    }

    fn active(&self) -> &IndexedSegment {
        self.segments.back().expect("a writable log always has a segment")
    }

    fn find(&self, lsn: u64) -> Option<(&IndexedSegment, RecordPos)> {
        if lsn < self.first_lsn() || lsn >= self.next_lsn {
            return None;
        }
        let index = self.segments.partition_point(|s| s.segment.base_lsn <= lsn).checked_sub(1)?;
        let segment = &self.segments[index];
        let record = (lsn - segment.segment.base_lsn) as usize;
        let pos = if index + 1 == self.segments.len() {
            let end = self.file_len + self.buf.len() as u64;
            IndexedSegment::position(&self.active_records, end, record)?
        } else {
            IndexedSegment::position(&segment.offsets, segment.end, record)?
        };
        Some((segment, pos))
    }

    fn no_such_record(&self, lsn: u64) -> LogError {
        LogError::NoSuchRecord { dir: self.location.clone(), lsn, first: self.first_lsn(), next: self.next_lsn }
    }

    /// Reads `out.len()` bytes of the record at `pos`, from the write buffer if they are
    /// still there.
    fn read_raw(&self, segment: &IndexedSegment, pos: RecordPos, out: &mut [u8]) -> Result<(), LogError> {
        let is_active = self.segments.back().is_some_and(|s| std::ptr::eq(s, segment));
        if is_active && pos.offset >= self.file_len {
            let start = (pos.offset - self.file_len) as usize;
            out.copy_from_slice(&self.buf[start..start + out.len()]);
            return Ok(());
        }
        segment.device.read_exact_at(out, pos.offset).map_err(io_error("read", segment.segment.path.clone()))
    }

    fn check_header(
        &self,
        segment: &IndexedSegment,
        pos: RecordPos,
        lsn: u64,
        raw: &[u8; RECORD_HEADER_LEN],
    ) -> Result<RecordHeader, LogError> {
        let header = RecordHeader::parse(raw);
        if header.magic != RECORD_MAGIC || header.lsn != lsn || header.payload_len != pos.payload_len {
            let reason = format!(
                "record header changed since the log was opened (magic {:#04x}, LSN {}, length {})",
                header.magic, header.lsn, header.payload_len
            );
            return Err(corrupt(segment.segment.path.clone(), pos.offset, Some(lsn), reason));
        }
        Ok(header)
    }

    fn check_writable(&self) -> Result<(), LogError> {
        if !self.writable {
            return Err(LogError::ReadOnly { dir: self.location.clone() });
        }
        match &self.poisoned {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned { dir: self.location.clone(), cause: cause.clone() }),
        }
    }

    fn poison(&mut self, error: LogError) -> LogError {
        self.poisoned = Some(error.to_string());
        error
    }

    /// Hands the buffer to the device.
    fn write_buffer(&mut self) -> Result<(), LogError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let active = self.active();
        active.device.write_at(&self.buf, self.file_len).map_err(io_error("write to", active.segment.path.clone()))?;
        self.file_len += self.buf.len() as u64;
        self.buf.clear();
        self.written_lsn = self.next_lsn - 1;
        Ok(())
    }

    /// Makes everything appended so far durable.
    fn sync_active(&mut self) -> Result<(), LogError> {
        self.write_buffer()?;
        if self.durable_len < self.file_len {
            let active = self.active();
            active.device.sync().map_err(io_error("fsync", active.segment.path.clone()))?;
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
        let (segment, device) = create_segment(&*self.storage, self.next_lsn)?;
        // The next segment likely holds about as many records as this one.
        let expected = self.active_records.len();
        let closed = std::mem::replace(&mut self.active_records, Vec::with_capacity(expected));
        let end = self.file_len;
        if let Some(last) = self.segments.back_mut() {
            last.offsets = closed;
            last.end = end;
        }
        let end = SEGMENT_HEADER_LEN as u64;
        self.segments.push_back(IndexedSegment { segment, device, offsets: Vec::new(), end });
        self.file_len = SEGMENT_HEADER_LEN as u64;
        self.durable_len = self.file_len;
        Ok(())
    }

    /// Test hook: drops the log as a crash of the process would, losing records still in the
    /// user-space buffer.
    #[cfg(test)]
    pub(crate) fn crash(mut self) {
        self.buf.clear();
    }
}

impl Drop for RecordLog {
    fn drop(&mut self) {
        // Best effort and without fsync, as documented for `SyncPolicy::None`. After a
        // failure the file's state is unknown, so nothing more is written.
        if self.writable && self.poisoned.is_none() && !self.buf.is_empty() {
            let _ = self.write_buffer();
        }
    }
}

/// Records of a [`RecordLog`], read on demand; see [`RecordLog::records`].
#[derive(Debug)]
pub struct Records<'a> {
    log: &'a RecordLog,
    next: u64,
    end: u64,
}

impl Iterator for Records<'_> {
    type Item = Result<Record, LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let lsn = self.next;
        self.next += 1;
        Some(self.log.read(lsn).map(|payload| Record { lsn, payload }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.end.saturating_sub(self.next)).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

/// Every record of the log at `at`, read without changing anything (records past a torn tail
/// are left out). For tools and tests; a log too large for memory wants
/// [`RecordLog::open_with`] and a visitor.
pub fn read_all(at: impl IntoStorage, options: LogOptions) -> Result<Vec<Record>, LogError> {
    let mut records = Vec::new();
    RecordLog::open_with(at, options, OpenMode::ReadOnly, |lsn, payload| {
        records.push(Record { lsn, payload: payload.to_vec() })
    })?;
    Ok(records)
}

/// Creates a new segment holding only its header, durably (object and directory entry).
fn create_segment(storage: &dyn Storage, base_lsn: u64) -> Result<(Segment, Arc<dyn Device>), LogError> {
    let name = segment_file_name(base_lsn);
    let path = storage.path_of(&name);
    let device = storage.create(&name).map_err(io_error("create", path.clone()))?;
    device.write_at(&encode_segment_header(base_lsn), 0).map_err(io_error("write header of", path.clone()))?;
    device.sync().map_err(io_error("fsync", path.clone()))?;
    storage.sync_dir().map_err(io_error("fsync directory", storage.location()))?;
    Ok((Segment { base_lsn, name, path }, device))
}

/// Cuts a torn tail off the last segment, durably.
fn apply_repair(last: &IndexedSegment, tail: &Tail) -> Result<(), LogError> {
    let path = &last.segment.path;
    let device = &last.device;
    match tail.kind {
        TailKind::Header => {
            // The crash hit while this segment was being created: nothing was ever written
            // to it, so start it afresh.
            device.truncate(0).map_err(io_error("truncate", path.clone()))?;
            let header = encode_segment_header(last.segment.base_lsn);
            device.write_at(&header, 0).map_err(io_error("write header of", path.clone()))?;
        }
        TailKind::Records => device.truncate(tail.repair.offset).map_err(io_error("truncate", path.clone()))?,
    }
    device.sync().map_err(io_error("fsync", path.clone()))
}
