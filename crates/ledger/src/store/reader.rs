//! The one sequential reader of segment files, shared by [`super::ChainStore::open`] (which
//! repairs a torn tail) and [`super::scan`] (which only reports), so that both judge the same
//! bytes the same way.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use alloy_primitives::B256;

use super::format::{
    decode_segment_header, parse_segment_file_name, record_checksum, RecordHeader, MAX_PAYLOAD_BYTES,
    RECORD_FORMAT_VERSION, RECORD_HEADER_LEN, RECORD_MAGIC, SEGMENT_HEADER_LEN,
};
use super::{io_error, Damage, IntactAfter, StoreError};

const SCAN_BUFFER_BYTES: usize = 64 << 10;

/// A segment file as listed in the directory. The number comes from the file name and is
/// kept wide so that a name beyond `u64::MAX` is reported where it sits in the sequence.
pub(super) struct SegmentFile {
    pub first: u128,
    pub path: PathBuf,
}

/// Segment files of `dir`, in block order. Other files are ignored.
pub(super) fn list_segments(dir: &Path) -> Result<Vec<SegmentFile>, StoreError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("list directory", dir))? {
        let entry = entry.map_err(io_error("list directory", dir))?;
        let name = entry.file_name();
        let Some(first) = name.to_str().and_then(parse_segment_file_name) else { continue };
        segments.push(SegmentFile { first, path: entry.path() });
    }
    segments.sort_by_key(|s| s.first);
    Ok(segments)
}

/// A block found intact at `offset` of the current segment; its bytes are in the caller's
/// buffer.
pub(super) struct BlockAt {
    pub number: u64,
    pub hash: B256,
    pub offset: u64,
    pub payload_len: u32,
}

/// The first invalid data met. Everything before it was intact.
pub(super) struct Defect {
    pub segment: usize,
    pub offset: u64,
    pub file_len: u64,
    pub damage: Damage,
    /// Whether an interrupted append or segment creation can leave these bytes. Only then,
    /// and only at the very end of the log, may the store cut them off.
    pub tearable: bool,
    /// The segment header is what is damaged: a repair rewrites it instead of cutting records.
    pub in_header: bool,
}

pub(super) enum Event {
    Block(BlockAt),
    Defect(Defect),
    End,
}

/// What may be done about a defect.
pub(super) enum Verdict {
    /// Nothing intact follows and a crash can explain it: the tail may be cut.
    Tail,
    /// Cutting here would drop data that was complete; `IntactAfter` says which, when known.
    Refuse(Option<IntactAfter>),
}

struct Current {
    index: usize,
    reader: BufReader<File>,
    file_len: u64,
    offset: u64,
}

/// Walks every record of every segment in order, checking framing, checksums, the block
/// number sequence and hash uniqueness. Stops for good at the first defect.
pub(super) struct Walker {
    segments: Vec<SegmentFile>,
    next_segment: usize,
    current: Option<Current>,
    /// Number the next block must carry: the count of intact blocks so far.
    pub expected: u64,
    pub hashes: HashMap<B256, u64>,
    stopped: bool,
}

impl Walker {
    pub(super) fn new(segments: Vec<SegmentFile>) -> Walker {
        Walker { segments, next_segment: 0, current: None, expected: 0, hashes: HashMap::new(), stopped: false }
    }

    pub(super) fn segments(&self) -> &[SegmentFile] {
        &self.segments
    }

    pub(super) fn into_parts(self) -> (Vec<SegmentFile>, HashMap<B256, u64>) {
        (self.segments, self.hashes)
    }

    /// Reads the next record; its bytes are left in `payload`.
    pub(super) fn next(&mut self, payload: &mut Vec<u8>) -> Result<Event, StoreError> {
        if self.stopped {
            return Ok(Event::End);
        }
        let event = self.step(payload);
        if !matches!(event, Ok(Event::Block(_))) {
            self.stopped = true;
        }
        event
    }

    fn step(&mut self, payload: &mut Vec<u8>) -> Result<Event, StoreError> {
        loop {
            let Some(current) = self.current.as_mut() else {
                if self.next_segment == self.segments.len() {
                    return Ok(Event::End);
                }
                let index = self.next_segment;
                self.next_segment += 1;
                match self.open_segment(index)? {
                    Ok(current) => {
                        self.current = Some(current);
                        continue;
                    }
                    Err(defect) => return Ok(Event::Defect(defect)),
                }
            };
            let offset = current.offset;
            let remaining = current.file_len - offset;
            if remaining == 0 {
                self.current = None;
                continue;
            }
            let (segment, file_len) = (current.index, current.file_len);
            let path = &self.segments[segment].path;
            let defect = |damage: Damage, tearable: bool| {
                Ok(Event::Defect(Defect { segment, offset, file_len, damage, tearable, in_header: false }))
            };
            if remaining < RECORD_HEADER_LEN as u64 {
                return defect(Damage::ShortRecordHeader { available: remaining }, true);
            }
            let mut raw = [0u8; RECORD_HEADER_LEN];
            current.reader.read_exact(&mut raw).map_err(io_error("read", path))?;
            if raw.iter().all(|&b| b == 0) {
                return defect(Damage::ZeroFilled, true);
            }
            let header = RecordHeader::parse(&raw);
            if header.magic != RECORD_MAGIC {
                return defect(Damage::BadMagic { found: header.magic }, true);
            }
            // Nothing in the header is trusted before the checksum verifies, so the length is
            // bounded by the maximum and by the bytes present before a buffer is sized by it.
            if header.payload_len > MAX_PAYLOAD_BYTES {
                return defect(Damage::LengthTooLarge { len: header.payload_len, max: MAX_PAYLOAD_BYTES }, true);
            }
            let available = remaining - RECORD_HEADER_LEN as u64;
            if u64::from(header.payload_len) > available {
                return defect(Damage::LengthPastEnd { len: header.payload_len, available }, true);
            }
            payload.clear();
            payload.resize(header.payload_len as usize, 0);
            current.reader.read_exact(payload).map_err(io_error("read", path))?;
            let computed = record_checksum(&raw, payload);
            if computed != header.crc {
                return defect(Damage::ChecksumMismatch { stored: header.crc, computed }, true);
            }
            // From here on the record is exactly what some writer framed, so a problem is not
            // the trace of an interrupted write and must never be cut away.
            if header.version != RECORD_FORMAT_VERSION {
                return defect(Damage::UnsupportedVersion { version: header.version }, false);
            }
            if header.flags != 0 {
                return defect(Damage::UnknownFlags { flags: header.flags }, false);
            }
            if header.number != self.expected {
                return defect(Damage::WrongNumber { found: header.number, expected: self.expected }, false);
            }
            if let Some(&first) = self.hashes.get(&header.hash) {
                return defect(Damage::DuplicateHash { hash: header.hash, first }, false);
            }
            let Some(following) = self.expected.checked_add(1) else {
                return defect(Damage::WrongNumber { found: header.number, expected: self.expected }, false);
            };
            self.hashes.insert(header.hash, header.number);
            current.offset = offset + RECORD_HEADER_LEN as u64 + u64::from(header.payload_len);
            let block = BlockAt { number: header.number, hash: header.hash, offset, payload_len: header.payload_len };
            self.expected = following;
            return Ok(Event::Block(block));
        }
    }

    /// Opens segment `index` positioned after its header, or describes why it cannot be read.
    fn open_segment(&self, index: usize) -> Result<Result<Current, Defect>, StoreError> {
        let segment = &self.segments[index];
        let path = segment.path.as_path();
        let file = File::open(path).map_err(io_error("open", path))?;
        let file_len = file.metadata().map_err(io_error("stat", path))?.len();
        let defect = |damage: Damage, tearable: bool| {
            Ok(Err(Defect { segment: index, offset: 0, file_len, damage, tearable, in_header: true }))
        };
        if segment.first != u128::from(self.expected) {
            return defect(Damage::SegmentOutOfSequence { expected: self.expected, found: segment.first }, false);
        }
        let header_len = SEGMENT_HEADER_LEN as u64;
        if file_len < header_len {
            return defect(Damage::SegmentTooShort { len: file_len }, true);
        }
        let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, file);
        let mut header = [0u8; SEGMENT_HEADER_LEN];
        reader.read_exact(&mut header).map_err(io_error("read", path))?;
        match decode_segment_header(&header) {
            Ok(first) if u128::from(first) == segment.first => {}
            Ok(first) => return defect(Damage::SegmentNameMismatch { name: self.expected, header: first }, false),
            // A segment is created with its header alone and fsynced before any record goes
            // in, so a bad header with nothing after it is a creation cut short.
            Err(reason) if file_len == header_len => return defect(Damage::SegmentHeaderUnwritten { reason }, true),
            Err(reason) => return defect(Damage::SegmentHeader { reason }, false),
        }
        Ok(Ok(Current { index, reader, file_len, offset: header_len }))
    }

    /// Decides whether `defect` may be a torn tail: it must be the kind of damage a crash
    /// leaves, in the last segment, with no intact record after it.
    pub(super) fn judge(&self, defect: &Defect) -> Result<Verdict, StoreError> {
        if !defect.tearable {
            return Ok(Verdict::Refuse(None));
        }
        if let Some(later) = self.segments.get(defect.segment + 1) {
            // Segments are fsynced whole before the next one is created: a crash cannot tear
            // one that has a successor.
            return Ok(Verdict::Refuse(Some(IntactAfter::LaterSegment { file: later.path.clone() })));
        }
        if !defect.in_header {
            let path = &self.segments[defect.segment].path;
            if let Some((offset, block)) = find_intact_record_after(path, defect.offset, self.expected)? {
                return Ok(Verdict::Refuse(Some(IntactAfter::Record { offset, block })));
            }
        }
        Ok(Verdict::Tail)
    }
}

/// Looks for a complete record with a valid checksum and a block number at or above
/// `from_number` starting anywhere after `defect_offset`; returns its offset and number.
///
/// An append writes one record at the end of the file, so a crash damages only the end of
/// what was written: a later intact record proves the damage is in the middle of the log.
fn find_intact_record_after(
    path: &Path,
    defect_offset: u64,
    from_number: u64,
) -> Result<Option<(u64, u64)>, StoreError> {
    let mut file = File::open(path).map_err(io_error("open", path))?;
    let start = defect_offset + 1;
    file.seek(SeekFrom::Start(start)).map_err(io_error("seek", path))?;
    // Only ever run on the last segment after damage was found, so reading its rest at once
    // is bounded by one segment.
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).map_err(io_error("read", path))?;
    for at in 0..tail.len().saturating_sub(RECORD_HEADER_LEN - 1) {
        if tail[at] != RECORD_MAGIC {
            continue;
        }
        let mut raw = [0u8; RECORD_HEADER_LEN];
        raw.copy_from_slice(&tail[at..at + RECORD_HEADER_LEN]);
        let header = RecordHeader::parse(&raw);
        if header.version != RECORD_FORMAT_VERSION
            || header.flags != 0
            || header.number < from_number
            || header.payload_len > MAX_PAYLOAD_BYTES
        {
            continue;
        }
        let body = at + RECORD_HEADER_LEN;
        let Some(payload) = tail.get(body..body + header.payload_len as usize) else { continue };
        if record_checksum(&raw, payload) == header.crc {
            return Ok(Some((start + at as u64, header.number)));
        }
    }
    Ok(None)
}

/// Reads a record at a known position and checks it is block `number` with `hash` and
/// `payload_len` bytes, as the index says. Returns its hash and bytes, or the damage found.
pub(super) fn read_indexed<R: Read>(
    reader: &mut R,
    number: u64,
    hash: &B256,
    payload_len: u32,
) -> io::Result<Result<(B256, Vec<u8>), Damage>> {
    let mut raw = [0u8; RECORD_HEADER_LEN];
    if let Err(e) = reader.read_exact(&mut raw) {
        return eof_is_damage(e);
    }
    let header = RecordHeader::parse(&raw);
    if header.magic != RECORD_MAGIC {
        return Ok(Err(Damage::BadMagic { found: header.magic }));
    }
    // The index, not the disk, sizes the buffer: its length was checked at open or append.
    if header.payload_len != payload_len {
        return Ok(Err(Damage::LengthChanged { indexed: payload_len, found: header.payload_len }));
    }
    let mut payload = vec![0u8; payload_len as usize];
    if let Err(e) = reader.read_exact(&mut payload) {
        return eof_is_damage(e);
    }
    let computed = record_checksum(&raw, &payload);
    if computed != header.crc {
        return Ok(Err(Damage::ChecksumMismatch { stored: header.crc, computed }));
    }
    if header.version != RECORD_FORMAT_VERSION {
        return Ok(Err(Damage::UnsupportedVersion { version: header.version }));
    }
    if header.flags != 0 {
        return Ok(Err(Damage::UnknownFlags { flags: header.flags }));
    }
    if header.number != number {
        return Ok(Err(Damage::WrongNumber { found: header.number, expected: number }));
    }
    if header.hash != *hash {
        return Ok(Err(Damage::HashChanged { found: header.hash }));
    }
    Ok(Ok((header.hash, payload)))
}

fn eof_is_damage<T>(e: io::Error) -> io::Result<Result<T, Damage>> {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Ok(Err(Damage::Missing))
    } else {
        Err(e)
    }
}
