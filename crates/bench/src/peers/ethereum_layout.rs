//! Ethereum's Merkle Patricia trie node encoding as a trie-db layout, so the `trie_db` peer
//! computes Ethereum's roots and EIP-1186 proofs and does the same work as the other tries.
//!
//! Nodes are RLP lists (Yellow Paper, appendix D):
//! - branch: 17 items, one per child nibble and the value (`0x80` when absent);
//! - leaf and extension: 2 items, the hex-prefix encoded path (flag 2 for a leaf, 0 for an
//!   extension, plus 1 when the path has an odd number of nibbles) and the value or child.
//!
//! A child whose encoding is shorter than 32 bytes is embedded as that encoding; a longer one
//! is referenced by its keccak-256 as a 32-byte string. trie-db already makes that choice (it
//! inlines exactly the children shorter than the hash), so the codec only writes it down.
//! The empty trie is the empty string `0x80`; every root, however short its node, is hashed.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Range;

use alloy_rlp::{Encodable, Header, EMPTY_STRING_CODE};
use hash_db::Hasher;
use keccak_hasher::KeccakHasher;
use trie_db::node::{NibbleSlicePlan, NodeHandlePlan, NodePlan, Value, ValuePlan};
use trie_db::{ChildReference, NodeCodec, TrieLayout};

/// trie-db layout of Ethereum's tries: keccak-256, extension nodes, values always in the node.
pub struct EthereumLayout;

impl TrieLayout for EthereumLayout {
    const USE_EXTENSION: bool = true;
    const ALLOW_EMPTY: bool = false;
    const MAX_INLINE_VALUE: Option<u32> = None;
    type Hash = KeccakHasher;
    type Codec = EthereumNodeCodec;
}

/// Ethereum's RLP node codec.
pub struct EthereumNodeCodec;

type NodeHash = <KeccakHasher as Hasher>::Out;

const HASH_LEN: usize = 32;
/// Hex-prefix flag of a leaf's path (an extension's is 0); `+ 1` marks an odd nibble count.
const LEAF_FLAG: u8 = 2;

/// Why bytes are not an Ethereum trie node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecodeError(String);

impl fmt::Display for NodeDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an Ethereum trie node: {}", self.0)
    }
}

impl std::error::Error for NodeDecodeError {}

impl From<alloy_rlp::Error> for NodeDecodeError {
    fn from(error: alloy_rlp::Error) -> Self {
        NodeDecodeError(error.to_string())
    }
}

fn invalid(reason: impl Into<String>) -> NodeDecodeError {
    NodeDecodeError(reason.into())
}

/// One item of a node's RLP list, located in the node's bytes.
struct Item {
    list: bool,
    /// The whole item, header included.
    whole: Range<usize>,
    /// The item's payload.
    payload: Range<usize>,
}

/// Splits `data`, which must be exactly one RLP list, into its items.
fn list_items(data: &[u8]) -> Result<Vec<Item>, NodeDecodeError> {
    let mut rest = data;
    let header = Header::decode(&mut rest)?;
    if !header.list {
        return Err(invalid("a node is an RLP list"));
    }
    if rest.len() != header.payload_length {
        return Err(invalid(format!("list of {} bytes in {} bytes", header.payload_length, rest.len())));
    }
    let mut items = Vec::with_capacity(17);
    while !rest.is_empty() {
        let start = data.len() - rest.len();
        let item = Header::decode(&mut rest)?;
        let payload_start = data.len() - rest.len();
        let end = payload_start
            .checked_add(item.payload_length)
            .filter(|&end| end <= data.len())
            .ok_or_else(|| invalid("an item runs past the node"))?;
        let payload = payload_start..end;
        rest = &data[payload.end..];
        items.push(Item { list: item.list, whole: start..payload.end, payload });
    }
    Ok(items)
}

/// A child slot: empty string, 32-byte hash, or an embedded node (a list).
fn child_plan(item: &Item) -> Result<Option<NodeHandlePlan>, NodeDecodeError> {
    match (item.list, item.payload.len()) {
        (true, _) if item.whole.len() < HASH_LEN => Ok(Some(NodeHandlePlan::Inline(item.whole.clone()))),
        (true, length) => Err(invalid(format!("an embedded node of {length} bytes should have been hashed"))),
        (false, 0) => Ok(None),
        (false, HASH_LEN) => Ok(Some(NodeHandlePlan::Hash(item.payload.clone()))),
        (false, length) => Err(invalid(format!("a child reference of {length} bytes"))),
    }
}

/// Decodes a hex-prefix encoded path: whether it ends in a leaf, and its nibbles.
fn path_plan(data: &[u8], item: &Item) -> Result<(bool, NibbleSlicePlan), NodeDecodeError> {
    if item.list || item.payload.is_empty() {
        return Err(invalid("a leaf or extension path is a non-empty string"));
    }
    let first = data[item.payload.start];
    let flag = first >> 4;
    if flag > LEAF_FLAG + 1 {
        return Err(invalid(format!("hex-prefix flag {flag}")));
    }
    let plan = if flag & 1 == 1 {
        // Odd: the first nibble shares the flag's byte.
        NibbleSlicePlan::new(item.payload.clone(), 1)
    } else if first & 0x0f != 0 {
        return Err(invalid("hex-prefix padding nibble is not zero"));
    } else {
        NibbleSlicePlan::new(item.payload.start + 1..item.payload.end, 0)
    };
    Ok((flag >= LEAF_FLAG, plan))
}

/// Hex-prefix encoding of trie-db's partial path: `partial` holds the nibbles packed two to a
/// byte, with an odd first nibble alone in the low half of the first byte.
fn hex_prefix(mut partial: impl Iterator<Item = u8>, nibbles: usize, leaf: bool) -> Vec<u8> {
    let flag = if leaf { LEAF_FLAG } else { 0 };
    let mut out = Vec::with_capacity(nibbles / 2 + 1);
    if nibbles % 2 == 1 {
        let first = partial.next().unwrap_or(0) & 0x0f;
        out.push(((flag + 1) << 4) | first);
    } else {
        out.push(flag << 4);
    }
    out.extend(partial);
    out
}

fn encode_child(child: Option<&ChildReference<NodeHash>>, out: &mut Vec<u8>) {
    match child {
        None => out.push(EMPTY_STRING_CODE),
        Some(ChildReference::Hash(hash)) => hash.as_slice().encode(out),
        Some(ChildReference::Inline(encoded, length)) => out.extend_from_slice(&encoded[..*length]),
    }
}

/// The inline bytes of a value: with `MAX_INLINE_VALUE = None` trie-db never stores one apart.
fn inline_value(value: Value<'_>) -> &[u8] {
    match value {
        Value::Inline(bytes) => bytes,
        Value::Node(_) => unreachable!("EthereumLayout keeps every value inline"),
    }
}

/// Wraps `payload` in an RLP list header.
fn as_list(payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 3);
    Header { list: true, payload_length: payload.len() }.encode(&mut out);
    out.extend_from_slice(&payload);
    out
}

impl NodeCodec for EthereumNodeCodec {
    type Error = NodeDecodeError;
    type HashOut = NodeHash;

    fn hashed_null_node() -> NodeHash {
        KeccakHasher::hash(&[EMPTY_STRING_CODE])
    }

    fn decode_plan(data: &[u8]) -> Result<NodePlan, NodeDecodeError> {
        if Self::is_empty_node(data) {
            return Ok(NodePlan::Empty);
        }
        let items = list_items(data)?;
        match items.as_slice() {
            [path, second] => {
                let (leaf, partial) = path_plan(data, path)?;
                if leaf {
                    if second.list {
                        return Err(invalid("a leaf's value is a string"));
                    }
                    Ok(NodePlan::Leaf { partial, value: ValuePlan::Inline(second.payload.clone()) })
                } else {
                    let child = child_plan(second)?.ok_or_else(|| invalid("an extension without a child"))?;
                    Ok(NodePlan::Extension { partial, child })
                }
            }
            [slots @ .., value] if slots.len() == 16 => {
                let mut children: [Option<NodeHandlePlan>; 16] = Default::default();
                for (child, slot) in children.iter_mut().zip(slots) {
                    *child = child_plan(slot)?;
                }
                let value = match (value.list, value.payload.is_empty()) {
                    (true, _) => return Err(invalid("a branch's value is a string")),
                    (false, true) => None,
                    (false, false) => Some(ValuePlan::Inline(value.payload.clone())),
                };
                Ok(NodePlan::Branch { value, children })
            }
            other => Err(invalid(format!("a list of {} items (a node has 2 or 17)", other.len()))),
        }
    }

    fn is_empty_node(data: &[u8]) -> bool {
        data == [EMPTY_STRING_CODE]
    }

    fn empty_node() -> &'static [u8] {
        &[EMPTY_STRING_CODE]
    }

    fn leaf_node(partial: impl Iterator<Item = u8>, number_nibble: usize, value: Value<'_>) -> Vec<u8> {
        let mut payload = Vec::new();
        hex_prefix(partial, number_nibble, true).as_slice().encode(&mut payload);
        inline_value(value).encode(&mut payload);
        as_list(payload)
    }

    fn extension_node(
        partial: impl Iterator<Item = u8>,
        number_nibble: usize,
        child: ChildReference<NodeHash>,
    ) -> Vec<u8> {
        let mut payload = Vec::new();
        hex_prefix(partial, number_nibble, false).as_slice().encode(&mut payload);
        encode_child(Some(&child), &mut payload);
        as_list(payload)
    }

    fn branch_node(
        children: impl Iterator<Item = impl Borrow<Option<ChildReference<NodeHash>>>>,
        value: Option<Value<'_>>,
    ) -> Vec<u8> {
        let mut payload = Vec::with_capacity(17 * (HASH_LEN + 1));
        for child in children {
            encode_child(child.borrow().as_ref(), &mut payload);
        }
        match value {
            Some(value) => inline_value(value).encode(&mut payload),
            None => payload.push(EMPTY_STRING_CODE),
        }
        as_list(payload)
    }

    fn branch_node_nibbled(
        _partial: impl Iterator<Item = u8>,
        _number_nibble: usize,
        _children: impl Iterator<Item = impl Borrow<Option<ChildReference<NodeHash>>>>,
        _value: Option<Value<'_>>,
    ) -> Vec<u8> {
        unreachable!("EthereumLayout uses extension nodes, so trie-db never builds a nibbled branch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_prefix_matches_the_yellow_paper() {
        // trie-db's packing: an odd first nibble alone in the low half of the first byte.
        assert_eq!(hex_prefix([0x01, 0x23, 0x45].into_iter(), 5, false), vec![0x11, 0x23, 0x45]);
        assert_eq!(hex_prefix([0x01, 0x23, 0x45].into_iter(), 6, false), vec![0x00, 0x01, 0x23, 0x45]);
        assert_eq!(hex_prefix([0x0f, 0x1c, 0xb8].into_iter(), 5, true), vec![0x3f, 0x1c, 0xb8]);
        assert_eq!(hex_prefix(std::iter::empty(), 0, true), vec![0x20]);
    }

    #[test]
    fn nodes_decode_back_to_their_parts() {
        let leaf = EthereumNodeCodec::leaf_node([0x0a, 0xbc].into_iter(), 3, Value::Inline(b"value"));
        let plan = EthereumNodeCodec::decode_plan(&leaf).unwrap();
        let trie_db::node::Node::Leaf(partial, Value::Inline(value)) = plan.build(&leaf) else {
            panic!("not a leaf: {plan:?}")
        };
        assert_eq!(partial.len(), 3);
        assert_eq!((partial.at(0), partial.at(1), partial.at(2)), (0xa, 0xb, 0xc));
        assert_eq!(value, b"value");

        let hash = [7u8; 32];
        let mut children = vec![None; 16];
        children[3] = Some(ChildReference::Hash(hash));
        let branch = EthereumNodeCodec::branch_node(children.iter(), None);
        assert_eq!(branch.len(), 1 + 15 + 33 + 1, "list header, 15 empty slots, one hash, no value");
        let NodePlan::Branch { value: None, children } = EthereumNodeCodec::decode_plan(&branch).unwrap() else {
            panic!("not a branch")
        };
        assert_eq!(children.iter().filter(|c| c.is_some()).count(), 1);
        // List header, slots 0..=2 empty, then the hash's string header.
        let start = 1 + 3 + 1;
        assert_eq!(children[3], Some(NodeHandlePlan::Hash(start..start + 32)));
        assert_eq!(&branch[start..start + 32], &hash);
    }

    #[test]
    fn malformed_nodes_are_errors() {
        for bytes in [
            &[][..],
            &[0x01],
            &[0xc0],
            &[0xc2, 0x80, 0x80],
            &[0xc3, 0x80, 0x80, 0x80],
            &[0xc2, 0x41, 0x80],
            &[0xc3, 0x82, 0x00],
        ] {
            assert!(EthereumNodeCodec::decode_plan(bytes).is_err(), "{bytes:?}");
        }
        assert_eq!(EthereumNodeCodec::decode_plan(&[0x80]).unwrap(), NodePlan::Empty);
    }
}
