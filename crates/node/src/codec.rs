//! Conversions between wire messages and Virga's types. Everything from a peer is checked
//! here first: a malformed field becomes an error that names it.

use crate::proto;
use alloy_consensus::Header;
use alloy_primitives::B256;
use alloy_rlp::Decodable;
use virga_ledger::block::Block;
use virga_trie::proof::NodeBag;

/// What is wrong with a field a peer sent; the reason goes back to it as data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{field} must be 32 bytes, got {len}")]
    HashLength { field: String, len: usize },
    #[error("key {index} is {len} bytes, state keys are 32")]
    KeyLength { index: usize, len: usize },
    #[error("malformed block header: {0}")]
    Header(#[source] alloy_rlp::Error),
    #[error("block header followed by {0} stray bytes")]
    StrayBytes(usize),
    #[error("malformed block: {0}")]
    Block(#[source] virga_ledger::block::BlockError),
}

/// A 32-byte hash field.
pub(crate) fn b256(bytes: &[u8], field: &str) -> Result<B256, WireError> {
    B256::try_from(bytes).map_err(|_| WireError::HashLength { field: field.to_string(), len: bytes.len() })
}

pub(crate) fn block_id(number: u64, hash: B256) -> proto::BlockId {
    proto::BlockId { number, hash: hash.to_vec() }
}

/// A block id field; `None` when absent.
pub(crate) fn parse_block_id(id: Option<&proto::BlockId>, field: &str) -> Result<Option<(u64, B256)>, WireError> {
    match id {
        None => Ok(None),
        Some(id) => Ok(Some((id.number, b256(&id.hash, field)?))),
    }
}

pub(crate) fn bag_to_wire(bag: &NodeBag) -> proto::NodeBag {
    proto::NodeBag { keys: bag.keys.clone(), nodes: bag.nodes.clone() }
}

pub(crate) fn bag_from_wire(bag: Option<proto::NodeBag>) -> NodeBag {
    let bag = bag.unwrap_or_default();
    NodeBag { keys: bag.keys, nodes: bag.nodes }
}

/// Keys of the state trie are keccak-256 hashes: 32 bytes.
pub(crate) fn check_keys(keys: &[Vec<u8>]) -> Result<(), WireError> {
    match keys.iter().position(|key| key.len() != 32) {
        Some(index) => Err(WireError::KeyLength { index, len: keys[index].len() }),
        None => Ok(()),
    }
}

/// An RLP block header that must span all of `bytes`.
pub(crate) fn decode_header(bytes: &[u8]) -> Result<Header, WireError> {
    let mut rest = bytes;
    let header = Header::decode(&mut rest).map_err(WireError::Header)?;
    if !rest.is_empty() {
        return Err(WireError::StrayBytes(rest.len()));
    }
    Ok(header)
}

pub(crate) fn decode_block(bytes: &[u8]) -> Result<Block, WireError> {
    Block::decode(bytes).map_err(WireError::Block)
}
