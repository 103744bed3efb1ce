//! The few RLP writing primitives the node encoder needs, tuned to avoid allocation:
//! a list is written by reserving room for its header, writing the payload, then
//! sliding the payload left over whatever header bytes were not needed.

pub(crate) const EMPTY_STRING: u8 = 0x80;
/// Header of a 32-byte string: how a parent refers to a child by hash.
pub(crate) const HASH_HEADER: u8 = 0x80 + 32;

const LIST_HEADER_RESERVE: usize = 5;

/// Appends `bytes` as an RLP string.
#[inline]
pub(crate) fn append_string(bytes: &[u8], out: &mut Vec<u8>) {
    if bytes.len() == 1 && bytes[0] < 0x80 {
        out.push(bytes[0]);
        return;
    }
    append_header(0x80, bytes.len(), out);
    out.extend_from_slice(bytes);
}

/// Appends the header of a string of `len` bytes (for strings longer than one byte).
#[inline]
pub(crate) fn append_string_header(len: usize, out: &mut Vec<u8>) {
    append_header(0x80, len, out);
}

fn append_header(offset: u8, len: usize, out: &mut Vec<u8>) {
    if len < 56 {
        out.push(offset + len as u8);
    } else {
        let be = (len as u64).to_be_bytes();
        let skip = be.iter().take_while(|b| **b == 0).count();
        out.push(offset + 55 + (8 - skip) as u8);
        out.extend_from_slice(&be[skip..]);
    }
}

/// Starts a list; returns the position to hand to [`end_list`].
#[inline]
pub(crate) fn begin_list(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; LIST_HEADER_RESERVE]);
    start
}

/// Writes the header of the list begun at `start` and closes the gap before its payload.
#[inline]
pub(crate) fn end_list(out: &mut Vec<u8>, start: usize) {
    let payload_start = start + LIST_HEADER_RESERVE;
    let payload_len = out.len() - payload_start;
    let mut header = [0u8; 9];
    let header_len = if payload_len < 56 {
        header[0] = 0xc0 + payload_len as u8;
        1
    } else {
        let be = (payload_len as u64).to_be_bytes();
        let skip = be.iter().take_while(|b| **b == 0).count();
        // Payloads are bounded far below 2^32 bytes by the reserve; checked here.
        assert!(8 - skip < LIST_HEADER_RESERVE, "RLP list payload of {payload_len} bytes");
        header[0] = 0xf7 + (8 - skip) as u8;
        header[1..1 + 8 - skip].copy_from_slice(&be[skip..]);
        1 + 8 - skip
    };
    let header_start = payload_start - header_len;
    out[header_start..payload_start].copy_from_slice(&header[..header_len]);
    if header_start != start {
        out.copy_within(header_start.., start);
        out.truncate(out.len() - (header_start - start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_lists_match_alloy_rlp() {
        for len in [0usize, 1, 55, 56, 300] {
            let bytes = vec![0xaa; len];
            let mut ours = Vec::new();
            append_string(&bytes, &mut ours);
            assert_eq!(ours, alloy_rlp::encode(&bytes[..]), "string of {len}");

            let mut list = Vec::new();
            let start = begin_list(&mut list);
            append_string(&bytes, &mut list);
            end_list(&mut list, start);
            let expected = alloy_rlp::encode(vec![alloy_primitives::Bytes::from(bytes.clone())]);
            assert_eq!(list, expected, "list holding a string of {len}");
        }
        let mut single = Vec::new();
        append_string(&[0x7f], &mut single);
        assert_eq!(single, vec![0x7f]);
    }
}
