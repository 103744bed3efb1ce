//! What the chain store adds to `virga-log`'s records: the block prefix, the mapping between
//! block numbers and LSNs, and how the older chain-store format is recognised.
//!
//! All integers are little-endian. The layout is documented on [`super`]; keep the two in
//! step.

use alloy_primitives::B256;

use super::Damage;

/// Length of the prefix in front of a block's bytes in its record's payload: the block
/// number (8 bytes) and the block hash (32 bytes).
pub const PREFIX_LEN: usize = 40;

/// Bytes in front of a block's bytes in a segment: `virga-log`'s record header and the block
/// prefix.
pub const RECORD_HEADER_LEN: usize = virga_log::RECORD_HEADER_LEN + PREFIX_LEN;

/// Length of the header at offset 0 of every segment (`virga-log`'s).
pub const SEGMENT_HEADER_LEN: usize = virga_log::SEGMENT_HEADER_LEN;

/// Largest block the store writes or reads back. A record announcing more is damage,
/// recognised by the log before anything is allocated for it.
pub const MAX_PAYLOAD_BYTES: u32 = 64 << 20;

/// Version of the chain store's on-disk format: 1 was the store's own `.blk` segments, 2 is
/// `virga-log` segments whose records carry the block prefix.
pub const FORMAT_VERSION: u16 = 2;

/// The log sequence number of block `number`: blocks are numbered from 0, LSNs from 1.
pub(super) fn lsn_of(number: u64) -> Option<u64> {
    number.checked_add(1)
}

/// The block number stored at `lsn`.
pub(super) fn number_at(lsn: u64) -> Option<u64> {
    lsn.checked_sub(1)
}

/// Name of the segment whose first block is `first`: `virga-log`'s name for LSN `first + 1`,
/// e.g. `00000000000000000001.seg` for the segment starting at genesis.
pub fn segment_file_name(first: u64) -> String {
    virga_log::segment_file_name(first.saturating_add(1))
}

/// The first block of the segment at `path`, from its file name, if it is a segment name.
pub(super) fn first_block_of(path: &std::path::Path) -> Option<u64> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".seg")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number_at(stem.parse().ok()?)
}

/// Whether `name` is a segment file of chain-store format 1: 20 digits and `.blk`.
pub(super) fn is_older_format_segment(name: &str) -> bool {
    name.strip_suffix(".blk").is_some_and(|stem| stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
}

/// Appends the payload of block `number`'s record to `out`.
///
/// | bytes  | field                  |
/// |--------|------------------------|
/// | 0..8   | block number (u64)     |
/// | 8..40  | block hash             |
/// | 40..   | block bytes            |
pub(super) fn encode_payload(out: &mut Vec<u8>, number: u64, hash: &B256, block: &[u8]) {
    out.reserve(PREFIX_LEN + block.len());
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(hash.as_slice());
    out.extend_from_slice(block);
}

/// The block number and hash a record's payload starts with.
pub(super) fn decode_prefix(payload: &[u8]) -> Result<(u64, B256), Damage> {
    if payload.len() < PREFIX_LEN {
        return Err(Damage::ShortPrefix { len: payload.len() });
    }
    let mut number = [0u8; 8];
    number.copy_from_slice(&payload[..8]);
    Ok((u64::from_le_bytes(number), B256::from_slice(&payload[8..PREFIX_LEN])))
}
