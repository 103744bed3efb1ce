//! Byte layout of segment headers, records and segment file names.
//!
//! Every multi-byte integer is little-endian. The README's "On-disk format" section is the
//! human-readable version of this module; keep the two in step.

/// Length in bytes of the header at the start of every segment file.
pub const SEGMENT_HEADER_LEN: usize = 24;

/// Length in bytes of the header in front of every record's payload.
pub const RECORD_HEADER_LEN: usize = 20;

/// The first eight bytes of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"VIRGALOG";

/// Version of the segment header layout written by this crate.
pub(crate) const SEGMENT_FORMAT_VERSION: u16 = 1;

/// The first byte of every record header.
pub(crate) const RECORD_MAGIC: u8 = 0xB5;

/// Version of the record layout written by this crate.
pub(crate) const RECORD_FORMAT_VERSION: u8 = 1;

/// Extension of segment files; the stem is the segment's first LSN as 20 decimal digits.
const SEGMENT_SUFFIX: &str = ".seg";
const SEGMENT_DIGITS: usize = 20;

/// File name of the segment whose first record has LSN `base_lsn`, e.g.
/// `00000000000000000001.seg`. Zero padding makes lexical and numeric order agree.
pub fn segment_file_name(base_lsn: u64) -> String {
    format!("{base_lsn:0width$}{SEGMENT_SUFFIX}", width = SEGMENT_DIGITS)
}

/// What a directory entry's name says about it.
pub(crate) enum SegmentName {
    /// Not a segment file: ignored by the log.
    Other,
    /// A segment file starting at this LSN.
    Base(u64),
    /// Looks like a segment file but the digits do not form a usable LSN.
    Invalid,
}

pub(crate) fn parse_segment_file_name(name: &str) -> SegmentName {
    let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
        return SegmentName::Other;
    };
    if stem.len() != SEGMENT_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return SegmentName::Other;
    }
    match stem.parse::<u64>() {
        Ok(0) | Err(_) => SegmentName::Invalid,
        Ok(base) => SegmentName::Base(base),
    }
}

/// Encodes the header of a segment whose first record will have LSN `base_lsn`.
pub(crate) fn encode_segment_header(base_lsn: u64) -> [u8; SEGMENT_HEADER_LEN] {
    encode_segment_header_with(&SEGMENT_MAGIC, base_lsn)
}

/// Why a segment header is not one of this build's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentHeaderError {
    /// The header is another format's (or none).
    #[error("segment header does not start with the magic bytes {magic:?}")]
    Magic {
        /// The magic this format's headers start with.
        magic: String,
    },
    /// The header's bytes are damaged (or were never fully written).
    #[error("segment header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// The checksum the header holds.
        stored: u32,
        /// The checksum of the header's bytes.
        computed: u32,
    },
    /// Written by another version of the format.
    #[error("segment written by format version {found}, {} than this build's version {SEGMENT_FORMAT_VERSION}", if *.found < SEGMENT_FORMAT_VERSION { "older" } else { "newer" })]
    Version {
        /// The version the header names.
        found: u16,
    },
    /// Bytes the format keeps zero are not.
    #[error("reserved bytes of the segment header are not zero")]
    Reserved,
}

/// Decodes a segment header, returning its base LSN or what is wrong.
pub(crate) fn decode_segment_header(header: &[u8; SEGMENT_HEADER_LEN]) -> Result<u64, SegmentHeaderError> {
    decode_segment_header_with(&SEGMENT_MAGIC, header)
}

/// Encodes a segment header of this layout for any segmented file format (the chain store
/// uses it with its own magic); `base` is the number of the segment's first item.
///
/// | bytes  | field                                  |
/// |--------|----------------------------------------|
/// | 0..8   | magic (`VIRGALOG` for this log)        |
/// | 8..10  | format version (u16), 1                |
/// | 10..12 | reserved, zero                         |
/// | 12..20 | base LSN or first item number (u64)    |
/// | 20..24 | CRC-32 of bytes 0..20 (u32)            |
pub fn encode_segment_header_with(magic: &[u8; 8], base: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    header[0..8].copy_from_slice(magic);
    header[8..10].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&base.to_le_bytes());
    let crc = crc32fast::hash(&header[0..20]);
    header[20..24].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Decodes a header written by [`encode_segment_header_with`] with the same `magic`,
/// returning its base or what is wrong.
pub fn decode_segment_header_with(
    magic: &[u8; 8],
    header: &[u8; SEGMENT_HEADER_LEN],
) -> Result<u64, SegmentHeaderError> {
    if header[0..8] != magic[..] {
        return Err(SegmentHeaderError::Magic { magic: String::from_utf8_lossy(magic).into_owned() });
    }
    let stored = le_u32(header, 20);
    let computed = crc32fast::hash(&header[0..20]);
    if stored != computed {
        return Err(SegmentHeaderError::Checksum { stored, computed });
    }
    let found = u16::from_le_bytes([header[8], header[9]]);
    if found != SEGMENT_FORMAT_VERSION {
        return Err(SegmentHeaderError::Version { found });
    }
    if header[10..12] != [0, 0] {
        return Err(SegmentHeaderError::Reserved);
    }
    Ok(le_u64(header, 12))
}

/// The format version of a header whose magic and checksum are intact, else `None` (then
/// the header is simply invalid, as after an interrupted write).
pub(crate) fn segment_header_version(header: &[u8; SEGMENT_HEADER_LEN]) -> Option<u16> {
    let intact = header[0..8] == SEGMENT_MAGIC && le_u32(header, 20) == crc32fast::hash(&header[0..20]);
    intact.then(|| u16::from_le_bytes([header[8], header[9]]))
}

/// Appends one framed record to `out`.
///
/// | bytes  | field                                        |
/// |--------|----------------------------------------------|
/// | 0      | magic `0xB5`                                 |
/// | 1      | format version (u8)                          |
/// | 2..4   | flags (u16), zero                            |
/// | 4..8   | payload length (u32)                         |
/// | 8..16  | LSN (u64)                                    |
/// | 16..20 | CRC-32 of bytes 0..16 followed by the payload |
/// | 20..   | payload                                      |
pub(crate) fn encode_record(out: &mut Vec<u8>, lsn: u64, payload_len: u32, payload: &[u8]) {
    let mut header = [0u8; RECORD_HEADER_LEN];
    header[0] = RECORD_MAGIC;
    header[1] = RECORD_FORMAT_VERSION;
    header[4..8].copy_from_slice(&payload_len.to_le_bytes());
    header[8..16].copy_from_slice(&lsn.to_le_bytes());
    let crc = record_checksum(&header, payload);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    out.reserve(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

/// CRC-32 over the checksummed part of a record header (bytes 0..16) and the payload.
pub(crate) fn record_checksum(header: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[0..16]);
    hasher.update(payload);
    hasher.finalize()
}

/// The fields of a record header exactly as read from disk; nothing in it is trusted yet.
pub(crate) struct RecordHeader {
    pub magic: u8,
    pub version: u8,
    pub flags: u16,
    pub payload_len: u32,
    pub lsn: u64,
    pub crc: u32,
}

impl RecordHeader {
    pub(crate) fn parse(raw: &[u8; RECORD_HEADER_LEN]) -> RecordHeader {
        RecordHeader {
            magic: raw[0],
            version: raw[1],
            flags: u16::from_le_bytes([raw[2], raw[3]]),
            payload_len: le_u32(raw, 4),
            lsn: le_u64(raw, 8),
            crc: le_u32(raw, 16),
        }
    }
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}
