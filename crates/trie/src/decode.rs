//! Decoding of trie nodes received from outside (proofs, node bags, checkpoints).
//! Every malformed input gets an error saying what is wrong; nothing here panics.

use alloy_primitives::B256;
use alloy_rlp::Header;
use virga_core::nibbles::decode_hex_prefix;

/// How a node refers to a child.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ChildRef {
    #[default]
    Empty,
    Hash(B256),
    /// A node shorter than 32 bytes, embedded whole (its RLP list).
    Inline(Vec<u8>),
}

/// One trie node as carried in a proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedNode {
    Leaf { path: Vec<u8>, value: Vec<u8> },
    Extension { path: Vec<u8>, child: ChildRef },
    Branch { children: Box<[ChildRef; 16]>, value: Vec<u8> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed RLP: {0}")]
    Rlp(String),
    #[error("a trie node is an RLP list, found a string")]
    NotAList,
    #[error("a trie node has 2 or 17 items, found {0}")]
    ItemCount(usize),
    #[error("{0} trailing bytes after the node")]
    Trailing(usize),
    #[error("invalid hex-prefix path encoding")]
    BadPath,
    #[error("a child reference is a 32-byte hash, an empty string or an inline node; found a {0}-byte string")]
    BadChildRef(usize),
    #[error("an inline child node must be shorter than 32 bytes, found {0}")]
    InlineTooLong(usize),
    #[error("an extension must have a non-empty path and a child")]
    BadExtension,
}

fn rlp_error(error: alloy_rlp::Error) -> DecodeError {
    DecodeError::Rlp(error.to_string())
}

/// One RLP item: its full encoding and, for strings, the payload.
struct Item<'a> {
    raw: &'a [u8],
    header: Header,
    payload: &'a [u8],
}

fn next_item<'a>(input: &mut &'a [u8]) -> Result<Item<'a>, DecodeError> {
    let start = *input;
    let header = Header::decode(input).map_err(rlp_error)?;
    if input.len() < header.payload_length {
        return Err(DecodeError::Rlp(format!(
            "item declares {} payload bytes, only {} remain",
            header.payload_length,
            input.len()
        )));
    }
    let (payload, rest) = input.split_at(header.payload_length);
    *input = rest;
    let raw = &start[..start.len() - rest.len()];
    Ok(Item { raw, header, payload })
}

/// Decodes one node's RLP; the whole input must be the node.
pub fn decode_node(bytes: &[u8]) -> Result<DecodedNode, DecodeError> {
    let mut input = bytes;
    let outer = next_item(&mut input)?;
    if !input.is_empty() {
        return Err(DecodeError::Trailing(input.len()));
    }
    if !outer.header.list {
        return Err(DecodeError::NotAList);
    }
    let mut items = Vec::with_capacity(17);
    let mut payload = outer.payload;
    while !payload.is_empty() {
        if items.len() == 17 {
            return Err(DecodeError::ItemCount(18));
        }
        items.push(next_item(&mut payload)?);
    }
    match items.len() {
        2 => {
            let path_item = &items[0];
            if path_item.header.list {
                return Err(DecodeError::BadPath);
            }
            let (path, is_leaf) = decode_hex_prefix(path_item.payload).ok_or(DecodeError::BadPath)?;
            if is_leaf {
                let value_item = &items[1];
                if value_item.header.list {
                    return Err(DecodeError::Rlp("a leaf value must be a string".into()));
                }
                Ok(DecodedNode::Leaf { path, value: value_item.payload.to_vec() })
            } else {
                let child = child_ref(&items[1])?;
                if path.is_empty() || child == ChildRef::Empty {
                    return Err(DecodeError::BadExtension);
                }
                Ok(DecodedNode::Extension { path, child })
            }
        }
        17 => {
            let mut children: [ChildRef; 16] = Default::default();
            for (slot, item) in children.iter_mut().zip(&items[..16]) {
                *slot = child_ref(item)?;
            }
            let value_item = &items[16];
            if value_item.header.list {
                return Err(DecodeError::Rlp("a branch value must be a string".into()));
            }
            Ok(DecodedNode::Branch { children: Box::new(children), value: value_item.payload.to_vec() })
        }
        n => Err(DecodeError::ItemCount(n)),
    }
}

fn child_ref(item: &Item<'_>) -> Result<ChildRef, DecodeError> {
    if item.header.list {
        if item.raw.len() >= 32 {
            return Err(DecodeError::InlineTooLong(item.raw.len()));
        }
        return Ok(ChildRef::Inline(item.raw.to_vec()));
    }
    match item.payload.len() {
        0 => Ok(ChildRef::Empty),
        32 => Ok(ChildRef::Hash(B256::from_slice(item.payload))),
        n => Err(DecodeError::BadChildRef(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_nodes_get_specific_errors() {
        assert_eq!(decode_node(&[0x80]), Err(DecodeError::NotAList));
        assert_eq!(decode_node(&[0xc0]), Err(DecodeError::ItemCount(0)));
        assert!(matches!(decode_node(&[0xc3, 0x80]), Err(DecodeError::Rlp(_))));
        assert_eq!(decode_node(&[0xc2, 0x20, 0x80, 0x00]), Err(DecodeError::Trailing(1)));
        // A leaf with path [] and value 0x01.
        assert_eq!(decode_node(&[0xc2, 0x20, 0x01]), Ok(DecodedNode::Leaf { path: vec![], value: vec![1] }));
        // Extension with a 3-byte child string.
        assert_eq!(decode_node(&[0xc5, 0x11, 0x83, 1, 2, 3]), Err(DecodeError::BadChildRef(3)));
        // Bad hex-prefix flag.
        assert_eq!(decode_node(&[0xc2, 0x40, 0x01]), Err(DecodeError::BadPath));
    }
}
