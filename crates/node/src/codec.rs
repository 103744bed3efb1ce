//! Conversions between wire messages and Virga's types. Everything from a peer is checked
//! here first: a malformed field becomes an error that names it.

use alloy_consensus::Header;
use alloy_primitives::B256;
use alloy_rlp::Decodable;
use virga_ledger::block::Block;
use virga_net::proto;
use virga_trie::proof::NodeBag;

/// A 32-byte hash field.
pub fn b256(bytes: &[u8], field: &str) -> Result<B256, String> {
    B256::try_from(bytes).map_err(|_| format!("{field} must be 32 bytes, got {}", bytes.len()))
}

pub fn block_id(number: u64, hash: B256) -> proto::BlockId {
    proto::BlockId { number, hash: hash.to_vec() }
}

/// A block id field; `None` when absent.
pub fn parse_block_id(id: Option<&proto::BlockId>, field: &str) -> Result<Option<(u64, B256)>, String> {
    match id {
        None => Ok(None),
        Some(id) => Ok(Some((id.number, b256(&id.hash, field)?))),
    }
}

pub fn bag_to_wire(bag: &NodeBag) -> proto::NodeBag {
    proto::NodeBag { keys: bag.keys.clone(), nodes: bag.nodes.clone() }
}

pub fn bag_from_wire(bag: Option<proto::NodeBag>) -> NodeBag {
    let bag = bag.unwrap_or_default();
    NodeBag { keys: bag.keys, nodes: bag.nodes }
}

/// Keys of the state trie are keccak-256 hashes: 32 bytes.
pub fn check_keys(keys: &[Vec<u8>]) -> Result<(), String> {
    match keys.iter().position(|key| key.len() != 32) {
        Some(index) => Err(format!("key {index} is {} bytes, state keys are 32", keys[index].len())),
        None => Ok(()),
    }
}

/// An RLP block header that must span all of `bytes`.
pub fn decode_header(bytes: &[u8]) -> Result<Header, String> {
    let mut rest = bytes;
    let header = Header::decode(&mut rest).map_err(|error| format!("malformed block header: {error}"))?;
    if !rest.is_empty() {
        return Err(format!("block header followed by {} stray bytes", rest.len()));
    }
    Ok(header)
}

pub fn decode_block(bytes: &[u8]) -> Result<Block, String> {
    Block::decode(bytes).map_err(|error| format!("malformed block: {error}"))
}
