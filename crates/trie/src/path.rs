//! Packed nibble paths stored inside nodes.
//!
//! Layout: two little-endian bytes with the nibble count, then the nibbles packed
//! two per byte (high nibble first). A leaf appends its value after the path in the
//! same allocation, so a leaf costs one heap block for path and value together.

use virga_core::nibbles::nibble_at;

pub(crate) const HEADER_LEN: usize = 2;

/// The longest path a node can hold, in nibbles (its count is stored in 16 bits).
pub(crate) const MAX_PATH_NIBBLES: usize = u16::MAX as usize;

/// Number of nibbles of the packed path at the start of `data`.
#[inline(always)]
pub(crate) fn nibble_count(data: &[u8]) -> usize {
    u16::from_le_bytes([data[0], data[1]]) as usize
}

/// Bytes used by the packed path (header included).
#[inline(always)]
pub(crate) fn packed_len(data: &[u8]) -> usize {
    HEADER_LEN + nibble_count(data).div_ceil(2)
}

#[inline(always)]
pub(crate) fn nibble(data: &[u8], index: usize) -> u8 {
    nibble_at(&data[HEADER_LEN..], index)
}

/// Bytes a leaf keeps inside its node before spilling to a separate allocation: room
/// for a 64-nibble path and a compactly stored account.
pub(crate) const LEAF_INLINE_BYTES: usize = 48;

/// A leaf's packed path and stored value.
pub(crate) type LeafBytes = smallvec::SmallVec<[u8; LEAF_INLINE_BYTES]>;

/// Packs `nibbles` followed by `tail` (empty for extensions).
pub(crate) fn pack(nibbles: impl ExactSizeIterator<Item = u8>, tail: &[u8]) -> Box<[u8]> {
    let mut out = Vec::new();
    pack_into(nibbles, tail.len(), &mut out, |out| out.extend_from_slice(tail));
    out.into_boxed_slice()
}

/// Packs a leaf: `nibbles` followed by whatever `write_tail` appends (its stored value).
pub(crate) fn pack_leaf(
    nibbles: impl ExactSizeIterator<Item = u8>,
    tail_len: usize,
    write_tail: impl FnOnce(&mut LeafBytes),
) -> LeafBytes {
    let mut out = LeafBytes::new();
    pack_into(nibbles, tail_len, &mut out, write_tail);
    if out.spilled() {
        out.shrink_to_fit();
    }
    out
}

/// Where packed bytes can be written: a `Vec` or a `SmallVec`.
pub(crate) trait ByteSink {
    fn reserve_bytes(&mut self, additional: usize);
    fn push_byte(&mut self, byte: u8);
    fn extend_bytes(&mut self, bytes: &[u8]);
}

impl ByteSink for Vec<u8> {
    fn reserve_bytes(&mut self, additional: usize) {
        self.reserve(additional);
    }
    fn push_byte(&mut self, byte: u8) {
        self.push(byte);
    }
    fn extend_bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl ByteSink for LeafBytes {
    /// No reservation: a value is often stored smaller than it arrives (see `value`), and
    /// reserving for the raw size would push the leaf out of its inline room.
    fn reserve_bytes(&mut self, _additional: usize) {}
    fn push_byte(&mut self, byte: u8) {
        self.push(byte);
    }
    fn extend_bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

fn pack_into<S: ByteSink>(
    nibbles: impl ExactSizeIterator<Item = u8>,
    tail_len: usize,
    out: &mut S,
    write_tail: impl FnOnce(&mut S),
) {
    let count = nibbles.len();
    assert!(count <= u16::MAX as usize, "path of {count} nibbles is too long");
    out.reserve_bytes(HEADER_LEN + count.div_ceil(2) + tail_len + 1);
    out.extend_bytes(&(count as u16).to_le_bytes());
    let mut pending: Option<u8> = None;
    for n in nibbles {
        match pending.take() {
            None => pending = Some(n << 4),
            Some(high) => out.push_byte(high | n),
        }
    }
    if let Some(high) = pending {
        out.push_byte(high);
    }
    write_tail(out);
}

/// The nibbles of a packed path, unpacked one per byte.
pub(crate) fn unpack(data: &[u8]) -> Vec<u8> {
    (0..nibble_count(data)).map(|i| nibble(data, i)).collect()
}

/// Iterator over nibbles `from..to` of a key given as bytes.
pub(crate) fn key_nibbles(key: &[u8], from: usize, to: usize) -> impl ExactSizeIterator<Item = u8> + '_ {
    (from..to).map(move |i| nibble_at(key, i))
}

/// Iterator over nibbles `from..` of a packed path.
pub(crate) fn path_nibbles(data: &[u8], from: usize) -> impl ExactSizeIterator<Item = u8> + '_ {
    (from..nibble_count(data)).map(move |i| nibble(data, i))
}

/// Length of the common prefix of the packed path and the key's nibbles from `depth`.
#[inline]
pub(crate) fn common_prefix(data: &[u8], key: &[u8], depth: usize) -> usize {
    let path_len = nibble_count(data);
    let key_left = key.len() * 2 - depth;
    let max = path_len.min(key_left);
    let mut i = 0;
    while i < max && nibble(data, i) == nibble_at(key, depth + i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trip_with_tail() {
        for len in 0..9u8 {
            let nibbles: Vec<u8> = (0..len).map(|i| i % 16).collect();
            let data = pack(nibbles.iter().copied(), b"value");
            assert_eq!(nibble_count(&data), len as usize);
            assert_eq!(unpack(&data), nibbles);
            assert_eq!(&data[packed_len(&data)..], b"value");
        }
    }

    #[test]
    fn common_prefix_counts_matching_nibbles() {
        let key = [0x12, 0x34];
        let data = pack([2u8, 3, 5].into_iter(), &[]);
        assert_eq!(common_prefix(&data, &key, 1), 2);
        assert_eq!(common_prefix(&data, &key, 0), 0);
    }
}
