//! Reading a log's segments: listing them, validating every record, building the index, and
//! telling a torn tail from damage.

use std::path::PathBuf;
use std::sync::Arc;

use virga_core::device::{Device, Storage, CRASH_BLOCK_BYTES};

use crate::format::{
    decode_segment_header, parse_segment_file_name, record_checksum, segment_header_version, RecordHeader, SegmentName,
    RECORD_FORMAT_VERSION, RECORD_HEADER_LEN, RECORD_MAGIC, SEGMENT_FORMAT_VERSION, SEGMENT_HEADER_LEN,
};
use crate::{corrupt, io_error, LogError, TailRepair};

/// Size of the read buffer used while scanning segments.
const SCAN_BUFFER_BYTES: usize = 64 << 10;

/// A segment object: records with LSNs from `base_lsn` up to the next segment's `base_lsn`.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub base_lsn: u64,
    pub name: String,
    /// How the storage names it, for messages.
    pub path: PathBuf,
}

/// Where one record lies in its segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordPos {
    /// Offset of the record header.
    pub offset: u64,
    pub payload_len: u32,
}

/// A segment, its open device, and where each of its records starts (the record at index
/// `i` has LSN `base_lsn + i`; it ends where the next one starts, the last one at `end`).
/// Eight bytes per record: lengths follow from the offsets.
#[derive(Debug)]
pub(crate) struct IndexedSegment {
    pub segment: Segment,
    pub device: Arc<dyn Device>,
    pub offsets: Vec<u64>,
    /// Offset just past the last valid record.
    pub end: u64,
}

impl IndexedSegment {
    /// Position of the record at `index` among `offsets` (the segment's, or the active
    /// segment's kept by the log), whose records end at `end`.
    pub(crate) fn position(offsets: &[u64], end: u64, index: usize) -> Option<RecordPos> {
        let offset = *offsets.get(index)?;
        let next = offsets.get(index + 1).copied().unwrap_or(end);
        let payload_len = u32::try_from(next - offset - RECORD_HEADER_LEN as u64).ok()?;
        Some(RecordPos { offset, payload_len })
    }
}

/// How a torn tail must be repaired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TailKind {
    /// The segment's creation was interrupted: rewrite it as a fresh header.
    Header,
    /// Cut the segment at the tail's offset.
    Records,
}

#[derive(Clone, Debug)]
pub(crate) struct Tail {
    pub repair: TailRepair,
    pub kind: TailKind,
}

/// What scanning a log's segments found.
#[derive(Debug)]
pub(crate) struct Scanned {
    pub segments: Vec<IndexedSegment>,
    pub tail: Option<Tail>,
    pub first_lsn: u64,
    pub next_lsn: u64,
    /// Valid bytes of the last segment (before any torn tail).
    pub last_len: u64,
}

/// Segment objects of `storage`, ordered by first LSN.
pub(crate) fn list_segments(storage: &dyn Storage) -> Result<Vec<Segment>, LogError> {
    let names = storage.list().map_err(io_error("list", storage.location()))?;
    let mut segments = Vec::new();
    for name in names {
        match parse_segment_file_name(&name) {
            SegmentName::Other => {}
            SegmentName::Invalid => {
                return Err(corrupt(
                    storage.path_of(&name),
                    0,
                    None,
                    "segment file name is not an LSN between 1 and 2^64-1",
                ))
            }
            SegmentName::Base(base_lsn) => {
                let path = storage.path_of(&name);
                segments.push(Segment { base_lsn, name, path });
            }
        }
    }
    segments.sort_by_key(|s| s.base_lsn);
    Ok(segments)
}

/// Reads every segment, oldest first, calling `visit` with each intact record, and refusing
/// damage anywhere but at the end of the last segment, which is reported as a torn tail.
pub(crate) fn scan_log(
    storage: &dyn Storage,
    segments: Vec<Segment>,
    max_record_bytes: u32,
    visit: &mut dyn FnMut(u64, &[u8]),
) -> Result<Scanned, LogError> {
    let first_lsn = segments.first().map_or(1, |s| s.base_lsn);
    let mut scanned = Scanned {
        segments: Vec::new(),
        tail: None,
        first_lsn,
        next_lsn: first_lsn,
        last_len: SEGMENT_HEADER_LEN as u64,
    };
    let last_index = segments.len().saturating_sub(1);
    for (index, segment) in segments.into_iter().enumerate() {
        let is_last = index == last_index;
        let next_lsn = scanned.next_lsn;
        if segment.base_lsn != next_lsn {
            let reason = format!(
                "segment starts at LSN {} but the previous segment ends before LSN {next_lsn}; records are \
                 missing or duplicated",
                segment.base_lsn
            );
            return Err(corrupt(segment.path, 0, Some(next_lsn), reason));
        }
        let device = storage.open(&segment.name).map_err(io_error("open", segment.path.clone()))?;
        let mut offsets = Vec::new();
        let mut end = SEGMENT_HEADER_LEN as u64;
        match scan_segment(&segment, &*device, max_record_bytes, &mut offsets, visit)? {
            Scan::TornHeader { file_len, reason } => {
                if !is_last {
                    return Err(corrupt(
                        segment.path,
                        0,
                        Some(next_lsn),
                        format!("{reason}, yet later segments follow it"),
                    ));
                }
                scanned.last_len = SEGMENT_HEADER_LEN as u64;
                let repair = TailRepair { segment: segment.path.clone(), offset: 0, bytes: file_len, reason };
                scanned.tail = Some(Tail { repair, kind: TailKind::Header });
            }
            Scan::Body { next_lsn, file_len, valid_end, defect } => {
                end = valid_end;
                scanned.last_len = file_len;
                if let Some(defect) = defect {
                    if !is_last {
                        return Err(corrupt(
                            segment.path,
                            defect.offset,
                            Some(next_lsn),
                            format!("{}; later segments follow, so this is not a torn write", defect.reason),
                        ));
                    }
                    check_tail_is_torn(&segment, &*device, &defect, file_len, next_lsn, max_record_bytes)?;
                    scanned.last_len = defect.offset;
                    let repair = TailRepair {
                        segment: segment.path.clone(),
                        offset: defect.offset,
                        bytes: file_len - defect.offset,
                        reason: defect.reason,
                    };
                    scanned.tail = Some(Tail { repair, kind: TailKind::Records });
                }
                scanned.next_lsn = next_lsn;
            }
        }
        scanned.segments.push(IndexedSegment { segment, device, offsets, end });
    }
    Ok(scanned)
}

/// Result of reading one segment.
enum Scan {
    /// The object is no longer than a segment header and the header is incomplete or invalid:
    /// the segment's creation was interrupted before any record could be written to it.
    TornHeader { file_len: u64, reason: String },
    Body {
        /// LSN following the last valid record.
        next_lsn: u64,
        file_len: u64,
        /// Offset just past the last valid record.
        valid_end: u64,
        /// First invalid data, if any; everything before it is valid.
        defect: Option<Defect>,
    },
}

struct Defect {
    offset: u64,
    reason: String,
}

/// Decides whether invalid data at the end of the last segment may be cut as a torn tail.
///
/// A crash tears only what was not yet synced, but under the crash model it may keep any
/// subset of the unsynced sectors: an intact record can then follow a sector that never
/// reached the disk (zeros) or was written only in part (new bytes, then zeros to the sector
/// end). Intact records after the damage therefore prove damage in place only when no sector
/// between the damage and the intact record ends in zero bytes; then cutting would silently
/// drop records that may have been acknowledged, and recovery refuses.
fn check_tail_is_torn(
    segment: &Segment,
    device: &dyn Device,
    defect: &Defect,
    file_len: u64,
    from_lsn: u64,
    max_record_bytes: u32,
) -> Result<(), LogError> {
    let read_error = || io_error("read", segment.path.clone());
    let tail_len = usize::try_from(file_len - defect.offset).map_err(|_| {
        corrupt(segment.path.clone(), defect.offset, Some(from_lsn), "segment tail too large to inspect in memory")
    })?;
    let mut tail = vec![0u8; tail_len];
    device.read_exact_at(&mut tail, defect.offset).map_err(read_error())?;
    let Some((start, lsn)) = find_intact_record(&tail, 1, from_lsn, max_record_bytes) else {
        return Ok(());
    };
    let zeroed_sector_end = (1..=start).any(|end| {
        let absolute_end = defect.offset + end as u64;
        absolute_end.is_multiple_of(CRASH_BLOCK_BYTES) && tail[end - 1] == 0
    });
    if zeroed_sector_end {
        return Ok(());
    }
    Err(corrupt(
        segment.path.clone(),
        defect.offset,
        Some(from_lsn),
        format!(
            "{}; an intact record (LSN {lsn}) follows at offset {}, and no sector in between ends in zeros as \
             an unfinished write would, so this is damage inside the log, not a torn write, and recovery \
             refuses to drop the records after it",
            defect.reason,
            defect.offset + start as u64
        ),
    ))
}

/// Looks for an intact record (right magic, version and flags, a checksum that verifies, an
/// LSN at or after `from_lsn`) starting at or after index `from` of `bytes`. Returns its
/// index and LSN.
fn find_intact_record(bytes: &[u8], from: usize, from_lsn: u64, max_record_bytes: u32) -> Option<(usize, u64)> {
    for start in from..bytes.len().saturating_sub(RECORD_HEADER_LEN - 1) {
        if bytes[start] != RECORD_MAGIC {
            continue;
        }
        let mut raw = [0u8; RECORD_HEADER_LEN];
        raw.copy_from_slice(&bytes[start..start + RECORD_HEADER_LEN]);
        let header = RecordHeader::parse(&raw);
        if header.version != RECORD_FORMAT_VERSION || header.flags != 0 || header.lsn < from_lsn {
            continue;
        }
        if header.payload_len > max_record_bytes {
            continue;
        }
        let body = start + RECORD_HEADER_LEN;
        let Some(payload) = bytes.get(body..body + header.payload_len as usize) else { continue };
        if record_checksum(&raw, payload) == header.crc {
            return Some((start, header.lsn));
        }
    }
    None
}

/// Sequential reads of a device through a buffer.
struct SeqReader<'a> {
    device: &'a dyn Device,
    path: &'a PathBuf,
    file_len: u64,
    buf: Vec<u8>,
    /// Device offset of `buf[0]`.
    buf_at: u64,
    filled: usize,
}

impl SeqReader<'_> {
    /// Fills `out` from device offset `at`, which must lie within the file.
    fn read_exact_at(&mut self, out: &mut [u8], at: u64) -> Result<(), LogError> {
        let end = at + out.len() as u64;
        if at >= self.buf_at && end <= self.buf_at + self.filled as u64 {
            let start = (at - self.buf_at) as usize;
            out.copy_from_slice(&self.buf[start..start + out.len()]);
            return Ok(());
        }
        if out.len() >= SCAN_BUFFER_BYTES / 2 {
            return self.device.read_exact_at(out, at).map_err(io_error("read", self.path.clone()));
        }
        let want = (self.file_len - at).min(SCAN_BUFFER_BYTES as u64) as usize;
        self.buf.resize(want.max(out.len()), 0);
        self.device.read_exact_at(&mut self.buf[..want], at).map_err(io_error("read", self.path.clone()))?;
        self.buf_at = at;
        self.filled = want;
        out.copy_from_slice(&self.buf[..out.len()]);
        Ok(())
    }
}

/// Reads and validates one segment, appending each valid record's offset to `offsets` and
/// showing its payload to `visit`.
///
/// Problems that an interrupted append can cause (a short or zero-filled header, a length
/// past the end of the file or above the maximum, a checksum mismatch) end the scan with a
/// [`Defect`]; the caller decides whether that is a torn tail or corruption. A record with a
/// valid checksum but the wrong LSN, version or flags cannot come from a torn write and is
/// reported as corruption directly.
fn scan_segment(
    segment: &Segment,
    device: &dyn Device,
    max_record_bytes: u32,
    offsets: &mut Vec<u64>,
    visit: &mut dyn FnMut(u64, &[u8]),
) -> Result<Scan, LogError> {
    let path = &segment.path;
    let file_len = device.len().map_err(io_error("stat", path.clone()))?;
    let header_len = SEGMENT_HEADER_LEN as u64;
    if file_len < header_len {
        let reason =
            format!("segment file is {file_len} bytes long, shorter than its {SEGMENT_HEADER_LEN}-byte header");
        return Ok(Scan::TornHeader { file_len, reason });
    }
    let mut reader = SeqReader { device, path, file_len, buf: Vec::new(), buf_at: 0, filled: 0 };
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    reader.read_exact_at(&mut header, 0)?;
    if let Some(found) = segment_header_version(&header).filter(|&v| v != SEGMENT_FORMAT_VERSION) {
        return Err(LogError::UnsupportedFormat { segment: path.clone(), found, supported: SEGMENT_FORMAT_VERSION });
    }
    match decode_segment_header(&header) {
        Ok(base) if base == segment.base_lsn => {}
        Ok(base) => {
            let reason = format!(
                "segment header says the segment starts at LSN {base}, its file name says {}",
                segment.base_lsn
            );
            return Err(corrupt(path.clone(), 0, Some(segment.base_lsn), reason));
        }
        Err(error) if file_len == header_len => return Ok(Scan::TornHeader { file_len, reason: error.to_string() }),
        Err(reason) => {
            let reason = format!("{reason}, and record data follows the header");
            return Err(corrupt(path.clone(), 0, Some(segment.base_lsn), reason));
        }
    }

    let mut payload = Vec::new();
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
        reader.read_exact_at(&mut raw, offset)?;
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
        payload.resize(header.payload_len as usize, 0);
        reader.read_exact_at(&mut payload, offset + RECORD_HEADER_LEN as u64)?;
        let computed = record_checksum(&raw, &payload);
        if computed != header.crc {
            break defect(format!("record checksum mismatch (stored {:#010x}, computed {computed:#010x})", header.crc));
        }
        let fail = |reason: String| Err(corrupt(path.clone(), offset, Some(expected_lsn), reason));
        if header.version != RECORD_FORMAT_VERSION {
            return fail(format!(
                "record written by format version {}, {} than this build's version {RECORD_FORMAT_VERSION}",
                header.version,
                if header.version < RECORD_FORMAT_VERSION { "older" } else { "newer" }
            ));
        }
        if header.flags != 0 {
            return fail(format!("unknown record flags {:#06x}", header.flags));
        }
        if header.lsn != expected_lsn {
            return fail(format!("record has LSN {} where LSN {expected_lsn} was expected", header.lsn));
        }
        let Some(following) = expected_lsn.checked_add(1) else {
            return fail("record uses the last possible LSN".to_string());
        };
        visit(header.lsn, &payload);
        offsets.push(offset);
        expected_lsn = following;
        offset += RECORD_HEADER_LEN as u64 + u64::from(header.payload_len);
    };
    Ok(Scan::Body { next_lsn: expected_lsn, file_len, valid_end: offset, defect })
}
