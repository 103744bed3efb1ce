//! Byte layout of the chain store's segment files.
//!
//! All integers are little-endian; checksums are CRC-32 (IEEE, as `crc32fast` computes it).
//! The layout is documented on [`super`]; keep the two in step.

use alloy_primitives::B256;

/// Length of the header at offset 0 of every segment file.
pub const SEGMENT_HEADER_LEN: usize = virga_log::SEGMENT_HEADER_LEN;

/// Length of the header in front of every block's bytes.
pub const RECORD_HEADER_LEN: usize = 52;

/// Largest block payload the store writes or reads back. A length field above it is damage,
/// recognised before anything is allocated for it.
pub const MAX_PAYLOAD_BYTES: u32 = 64 << 20;

pub(super) const SEGMENT_MAGIC: [u8; 8] = *b"VIRGACHN";
pub(super) const RECORD_MAGIC: u8 = 0xC4;
pub(super) const RECORD_FORMAT_VERSION: u8 = 1;

const SEGMENT_SUFFIX: &str = ".blk";
const SEGMENT_DIGITS: usize = 20;

/// Byte range of the checksum inside a record header; everything before it is covered.
const CRC_AT: usize = 48;

/// Name of the segment file whose first block has number `first`: 20 zero-padded decimal
/// digits and `.blk`, so lexical and numeric order agree.
pub fn segment_file_name(first: u64) -> String {
    format!("{first:0width$}{SEGMENT_SUFFIX}", width = SEGMENT_DIGITS)
}

/// The first block number a directory entry's name announces, if it is a segment name.
///
/// Twenty digits can spell numbers beyond `u64::MAX`; they are returned as they are (hence
/// `u128`) so that the caller reports such a file as damage instead of ignoring it.
pub(super) fn parse_segment_file_name(name: &str) -> Option<u128> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    if stem.len() != SEGMENT_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse::<u128>().ok()
}

/// The segment header of `virga-log`'s layout with the chain store's magic `VIRGACHN`; the
/// base is the number of the segment's first block.
pub(super) fn encode_segment_header(first: u64) -> [u8; SEGMENT_HEADER_LEN] {
    virga_log::encode_segment_header_with(&SEGMENT_MAGIC, first)
}

/// The first block number a segment header records, or what is wrong with the header.
pub(super) fn decode_segment_header(header: &[u8; SEGMENT_HEADER_LEN]) -> Result<u64, String> {
    virga_log::decode_segment_header_with(&SEGMENT_MAGIC, header)
}

/// Appends one framed block to `out`.
///
/// | bytes  | field                                          |
/// |--------|------------------------------------------------|
/// | 0      | magic `0xC4`                                   |
/// | 1      | format version (u8), 1                         |
/// | 2..4   | flags (u16), zero                              |
/// | 4..8   | payload length `n` (u32)                       |
/// | 8..16  | block number (u64)                             |
/// | 16..48 | block hash (32 bytes)                          |
/// | 48..52 | CRC-32 of bytes 0..48 followed by the payload  |
/// | 52..   | payload (`n` bytes)                            |
pub(super) fn encode_record(out: &mut Vec<u8>, number: u64, hash: &B256, payload: &[u8]) {
    let mut header = [0u8; RECORD_HEADER_LEN];
    header[0] = RECORD_MAGIC;
    header[1] = RECORD_FORMAT_VERSION;
    // The caller has bounded the payload by MAX_PAYLOAD_BYTES, far below u32::MAX.
    header[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[8..16].copy_from_slice(&number.to_le_bytes());
    header[16..48].copy_from_slice(hash.as_slice());
    let crc = record_checksum(&header, payload);
    header[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    out.reserve(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

/// CRC-32 over the covered part of a record header and the payload.
pub(super) fn record_checksum(header: &[u8; RECORD_HEADER_LEN], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..CRC_AT]);
    hasher.update(payload);
    hasher.finalize()
}

/// A record header's fields exactly as read; none of them is trusted yet.
pub(super) struct RecordHeader {
    pub magic: u8,
    pub version: u8,
    pub flags: u16,
    pub payload_len: u32,
    pub number: u64,
    pub hash: B256,
    pub crc: u32,
}

impl RecordHeader {
    pub(super) fn parse(raw: &[u8; RECORD_HEADER_LEN]) -> RecordHeader {
        RecordHeader {
            magic: raw[0],
            version: raw[1],
            flags: u16::from_le_bytes([raw[2], raw[3]]),
            payload_len: le_u32(raw, 4),
            number: le_u64(raw, 8),
            hash: B256::from_slice(&raw[16..48]),
            crc: le_u32(raw, CRC_AT),
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
