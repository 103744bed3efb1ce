//! RainBlock's wire codec: [`crate::messages`] to and from `virga.rainblock.v1`. Everything
//! from a peer is checked here first, and a malformed field becomes an error that names it;
//! the cores never see the wire form. A storage node's log records are a block's updates in
//! this same form.

use crate::messages::{
    BlockAnnouncement, BlockId, BlockUpdates, HeadReply, KeyUpdate, Request, Response, SlotKeys, SlotUpdate,
    StorageBag, Submission, SubmissionReply, TopReply, TopRequest, TxOutcome, Verdict, WitnessReply, WitnessRequest,
};
use crate::proto;
use crate::proto::{request::Body as RequestBody, response::Body as ResponseBody};
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
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("malformed block header: {0}")]
    Header(#[source] alloy_rlp::Error),
    #[error("block header followed by {0} stray bytes")]
    StrayBytes(usize),
    #[error("malformed block: {0}")]
    Block(#[source] virga_ledger::block::BlockError),
    #[error("the message has no body")]
    Empty,
}

/// A 32-byte hash field.
pub(crate) fn b256(bytes: &[u8], field: &str) -> Result<B256, WireError> {
    B256::try_from(bytes).map_err(|_| WireError::HashLength { field: field.to_string(), len: bytes.len() })
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

/// Each hash of a repeated field, the bad one named by its index.
fn hashes(list: &[Vec<u8>], field: &str) -> Result<Vec<B256>, WireError> {
    list.iter().enumerate().map(|(index, bytes)| b256(bytes, &format!("{field}[{index}]"))).collect()
}

fn hashes_to_wire(list: &[B256]) -> Vec<Vec<u8>> {
    list.iter().map(|hash| hash.to_vec()).collect()
}

fn block_id_to_wire(id: BlockId) -> proto::BlockId {
    proto::BlockId { number: id.number, hash: id.hash.to_vec() }
}

fn block_id_from_wire(id: Option<&proto::BlockId>, field: &'static str) -> Result<Option<BlockId>, WireError> {
    id.map(|id| Ok(BlockId { number: id.number, hash: b256(&id.hash, field)? })).transpose()
}

fn required_block_id(id: Option<&proto::BlockId>, field: &'static str) -> Result<BlockId, WireError> {
    block_id_from_wire(id, field)?.ok_or(WireError::Missing(field))
}

fn bag_to_wire(bag: NodeBag) -> proto::NodeBag {
    proto::NodeBag { keys: bag.keys, nodes: bag.nodes }
}

/// An absent bag is an empty one (proto3 leaves an empty message out).
fn bag_from_wire(bag: Option<proto::NodeBag>) -> NodeBag {
    let bag = bag.unwrap_or_default();
    NodeBag { keys: bag.keys, nodes: bag.nodes }
}

fn storage_to_wire(storage: Vec<StorageBag>) -> Vec<proto::StorageBag> {
    storage
        .into_iter()
        .map(|entry| proto::StorageBag { account: entry.account.to_vec(), bag: Some(bag_to_wire(entry.bag)) })
        .collect()
}

fn storage_from_wire(storage: Vec<proto::StorageBag>, field: &str) -> Result<Vec<StorageBag>, WireError> {
    storage
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let account = b256(&entry.account, &format!("{field}[{index}].account"))?;
            Ok(StorageBag { account, bag: bag_from_wire(entry.bag) })
        })
        .collect()
}

pub(crate) fn slot_update_to_wire(update: SlotUpdate) -> proto::SlotUpdate {
    proto::SlotUpdate { account: update.account.to_vec(), slot: update.slot.to_vec(), value: update.value }
}

fn slot_updates_from_wire(slots: Vec<proto::SlotUpdate>, field: &str) -> Result<Vec<SlotUpdate>, WireError> {
    slots
        .into_iter()
        .enumerate()
        .map(|(index, update)| {
            let account = b256(&update.account, &format!("{field}[{index}].account"))?;
            let slot = b256(&update.slot, &format!("{field}[{index}].slot"))?;
            Ok(SlotUpdate { account, slot, value: update.value })
        })
        .collect()
}

pub(crate) fn key_update_to_wire(update: KeyUpdate) -> proto::KeyUpdate {
    proto::KeyUpdate { key: update.key.to_vec(), value: update.value }
}

fn key_updates_from_wire(updates: Vec<proto::KeyUpdate>, field: &str) -> Result<Vec<KeyUpdate>, WireError> {
    updates
        .into_iter()
        .enumerate()
        .map(|(index, update)| {
            Ok(KeyUpdate { key: b256(&update.key, &format!("{field}[{index}]"))?, value: update.value })
        })
        .collect()
}

/// A block's updates on the wire, and in a storage node's log.
pub(crate) fn block_updates_to_wire(updates: BlockUpdates) -> proto::BlockUpdates {
    proto::BlockUpdates {
        header: alloy_rlp::encode(&updates.header),
        shard_hashes: hashes_to_wire(&updates.shard_hashes),
        updates: updates.updates.into_iter().map(key_update_to_wire).collect(),
        slots: updates.slots.into_iter().map(slot_update_to_wire).collect(),
        cleared: hashes_to_wire(&updates.cleared),
        codes: updates.codes,
    }
}

pub(crate) fn block_updates_from_wire(updates: proto::BlockUpdates) -> Result<BlockUpdates, WireError> {
    Ok(BlockUpdates {
        header: decode_header(&updates.header)?,
        shard_hashes: hashes(&updates.shard_hashes, "shard_hashes")?,
        updates: key_updates_from_wire(updates.updates, "updates")?,
        slots: slot_updates_from_wire(updates.slots, "slots")?,
        cleared: hashes(&updates.cleared, "cleared")?,
        codes: updates.codes,
    })
}

fn witness_request_to_wire(request: WitnessRequest) -> proto::WitnessRequest {
    proto::WitnessRequest {
        keys: hashes_to_wire(&request.keys),
        compaction: request.compaction,
        at: request.at.map(block_id_to_wire),
        slots: request
            .slots
            .into_iter()
            .map(|asked| proto::SlotKeys { account: asked.account.to_vec(), slots: hashes_to_wire(&asked.slots) })
            .collect(),
        code_hashes: hashes_to_wire(&request.code_hashes),
    }
}

fn witness_request_from_wire(request: proto::WitnessRequest) -> Result<WitnessRequest, WireError> {
    let slots = request
        .slots
        .iter()
        .enumerate()
        .map(|(index, asked)| {
            Ok(SlotKeys {
                account: b256(&asked.account, &format!("witness.slots[{index}].account"))?,
                slots: hashes(&asked.slots, &format!("witness.slots[{index}].slots"))?,
            })
        })
        .collect::<Result<_, WireError>>()?;
    Ok(WitnessRequest {
        keys: hashes(&request.keys, "witness.keys")?,
        compaction: request.compaction,
        at: block_id_from_wire(request.at.as_ref(), "witness.at")?,
        slots,
        code_hashes: hashes(&request.code_hashes, "witness.code_hashes")?,
    })
}

fn submission_to_wire(submission: Submission) -> proto::Submission {
    proto::Submission {
        transactions: submission.transactions,
        bag: Some(bag_to_wire(submission.bag)),
        witness_at: Some(block_id_to_wire(submission.witness_at)),
        witness_root: submission.witness_root.to_vec(),
        storage: storage_to_wire(submission.storage),
        codes: submission.codes,
    }
}

fn submission_from_wire(submission: proto::Submission) -> Result<Submission, WireError> {
    Ok(Submission {
        witness_at: required_block_id(submission.witness_at.as_ref(), "submit.witness_at")?,
        witness_root: b256(&submission.witness_root, "submit.witness_root")?,
        storage: storage_from_wire(submission.storage, "submit.storage")?,
        transactions: submission.transactions,
        bag: bag_from_wire(submission.bag),
        codes: submission.codes,
    })
}

fn announcement_to_wire(announcement: BlockAnnouncement) -> proto::BlockAnnouncement {
    proto::BlockAnnouncement {
        block: announcement.block.encode(),
        bag: Some(bag_to_wire(announcement.bag)),
        storage: storage_to_wire(announcement.storage),
        codes: announcement.codes,
    }
}

fn announcement_from_wire(announcement: proto::BlockAnnouncement) -> Result<BlockAnnouncement, WireError> {
    Ok(BlockAnnouncement {
        block: decode_block(&announcement.block)?,
        bag: bag_from_wire(announcement.bag),
        storage: storage_from_wire(announcement.storage, "announce.storage")?,
        codes: announcement.codes,
    })
}

pub(crate) fn request_to_wire(request: Request) -> proto::Request {
    let body = match request {
        Request::Witness(request) => RequestBody::Witness(witness_request_to_wire(request)),
        Request::Top(request) => {
            RequestBody::Top(proto::TopRequest { levels: request.levels, at: request.at.map(block_id_to_wire) })
        }
        Request::ApplyBlock(updates) => RequestBody::ApplyBlock(block_updates_to_wire(*updates)),
        Request::Head => RequestBody::Head(proto::HeadRequest {}),
        Request::Submit(submission) => RequestBody::Submit(submission_to_wire(submission)),
        Request::Announce(announcement) => RequestBody::Announce(announcement_to_wire(*announcement)),
    };
    proto::Request { body: Some(body) }
}

pub(crate) fn request_from_wire(request: proto::Request) -> Result<Request, WireError> {
    Ok(match request.body.ok_or(WireError::Empty)? {
        RequestBody::Witness(request) => Request::Witness(witness_request_from_wire(request)?),
        RequestBody::Top(request) => {
            Request::Top(TopRequest { levels: request.levels, at: block_id_from_wire(request.at.as_ref(), "top.at")? })
        }
        RequestBody::ApplyBlock(updates) => Request::ApplyBlock(Box::new(block_updates_from_wire(updates)?)),
        RequestBody::Head(proto::HeadRequest {}) => Request::Head,
        RequestBody::Submit(submission) => Request::Submit(submission_from_wire(submission)?),
        RequestBody::Announce(announcement) => Request::Announce(Box::new(announcement_from_wire(announcement)?)),
    })
}

fn outcome_to_wire(outcome: TxOutcome) -> proto::TxOutcome {
    proto::TxOutcome {
        tx_hash: outcome.tx_hash.to_vec(),
        included: outcome.included,
        succeeded: outcome.succeeded,
        reason: outcome.reason,
    }
}

fn outcomes_from_wire(outcomes: Vec<proto::TxOutcome>) -> Result<Vec<TxOutcome>, WireError> {
    outcomes
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| {
            Ok(TxOutcome {
                tx_hash: b256(&outcome.tx_hash, &format!("submitted.outcomes[{index}].tx_hash"))?,
                included: outcome.included,
                succeeded: outcome.succeeded,
                reason: outcome.reason,
            })
        })
        .collect()
}

pub(crate) fn response_to_wire(response: Response) -> proto::Response {
    let body = match response {
        Response::Witness(reply) => ResponseBody::Witness(proto::WitnessReply {
            at: Some(block_id_to_wire(reply.at)),
            state_root: reply.state_root.to_vec(),
            bag: Some(bag_to_wire(reply.bag)),
            storage: storage_to_wire(reply.storage),
            codes: reply.codes,
        }),
        Response::Top(reply) => ResponseBody::Top(proto::TopReply {
            at: Some(block_id_to_wire(reply.at)),
            state_root: reply.state_root.to_vec(),
            nodes: reply.nodes,
            storage: storage_to_wire(reply.storage),
        }),
        Response::BlockAck(block) => ResponseBody::BlockAck(proto::BlockAck { block: Some(block_id_to_wire(block)) }),
        Response::Head(reply) => ResponseBody::Head(proto::HeadReply {
            head: Some(block_id_to_wire(reply.head)),
            state_root: reply.state_root.to_vec(),
        }),
        Response::Submitted(reply) => ResponseBody::Submitted(proto::SubmissionReply {
            block: reply.block.map(block_id_to_wire),
            outcomes: reply.outcomes.into_iter().map(outcome_to_wire).collect(),
        }),
        Response::Verdict(Verdict::Accepted) => {
            ResponseBody::Verdict(proto::Verdict { accepted: true, reason: String::new() })
        }
        Response::Verdict(Verdict::Rejected(reason)) => {
            ResponseBody::Verdict(proto::Verdict { accepted: false, reason })
        }
        Response::Refused(reason) => ResponseBody::Error(reason),
    };
    proto::Response { body: Some(body) }
}

pub(crate) fn response_from_wire(response: proto::Response) -> Result<Response, WireError> {
    Ok(match response.body.ok_or(WireError::Empty)? {
        ResponseBody::Witness(reply) => Response::Witness(WitnessReply {
            at: required_block_id(reply.at.as_ref(), "witness.at")?,
            state_root: b256(&reply.state_root, "witness.state_root")?,
            bag: bag_from_wire(reply.bag),
            storage: storage_from_wire(reply.storage, "witness.storage")?,
            codes: reply.codes,
        }),
        ResponseBody::Top(reply) => Response::Top(TopReply {
            at: required_block_id(reply.at.as_ref(), "top.at")?,
            state_root: b256(&reply.state_root, "top.state_root")?,
            nodes: reply.nodes,
            storage: storage_from_wire(reply.storage, "top.storage")?,
        }),
        ResponseBody::BlockAck(ack) => Response::BlockAck(required_block_id(ack.block.as_ref(), "block_ack.block")?),
        ResponseBody::Head(reply) => Response::Head(HeadReply {
            head: required_block_id(reply.head.as_ref(), "head.head")?,
            state_root: b256(&reply.state_root, "head.state_root")?,
        }),
        ResponseBody::Submitted(reply) => Response::Submitted(SubmissionReply {
            block: block_id_from_wire(reply.block.as_ref(), "submitted.block")?,
            outcomes: outcomes_from_wire(reply.outcomes)?,
        }),
        ResponseBody::Verdict(verdict) if verdict.accepted => Response::Verdict(Verdict::Accepted),
        ResponseBody::Verdict(verdict) => Response::Verdict(Verdict::Rejected(verdict.reason)),
        ResponseBody::Error(reason) => Response::Refused(reason),
    })
}
