//! KAIROS's validator messages at the wire: a `Validate` is checked here, at the transport
//! that decoded it, so the validator core takes only well-formed ones.

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId};

use crate::proto;
use crate::shard::wire::{self as shard_wire, ShardWireError};
use crate::shard::ReadOp;

/// A checked `Validate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateRequest {
    pub txn: TxnId,
    pub commit_ts: Timestamp,
    pub freshness: Timestamp,
    pub reads: Vec<ReadOp>,
    pub writes: Vec<Bytes>,
    pub participants: Vec<u32>,
}

/// Why a `Validate` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidateWireError {
    #[error(transparent)]
    Field(#[from] ShardWireError),
    #[error("a validation with writes names no participant shard")]
    NoParticipants,
    #[error("written key {key:?} is listed twice")]
    DuplicateWrite { key: Bytes },
}

pub fn validate_from_wire(validate: proto::Validate) -> Result<ValidateRequest, ValidateWireError> {
    let commit_ts = shard_wire::ts_from_wire(validate.commit_ts);
    if commit_ts == Timestamp::ZERO {
        return Err(ShardWireError::ZeroCommitTimestamp.into());
    }
    if validate.writes.len() > shard_wire::MAX_OPS_PER_SHARD {
        return Err(ShardWireError::TooMany { what: "writes", count: validate.writes.len() }.into());
    }
    let mut writes: Vec<Bytes> = Vec::with_capacity(validate.writes.len());
    for key in validate.writes {
        shard_wire::check_key(&key)?;
        let key = Bytes::from(key);
        if writes.contains(&key) {
            return Err(ValidateWireError::DuplicateWrite { key });
        }
        writes.push(key);
    }
    shard_wire::check_participants(&validate.participants)?;
    if !writes.is_empty() && validate.participants.is_empty() {
        return Err(ValidateWireError::NoParticipants);
    }
    Ok(ValidateRequest {
        txn: shard_wire::txn_from_wire(validate.txn)?,
        commit_ts,
        freshness: shard_wire::ts_from_wire(validate.freshness),
        reads: shard_wire::reads_from_wire(validate.reads)?,
        writes,
        participants: validate.participants,
    })
}

pub fn validate_to_wire(request: &ValidateRequest) -> proto::Validate {
    proto::Validate {
        txn: Some(shard_wire::txn_to_wire(request.txn)),
        commit_ts: Some(shard_wire::ts_to_wire(request.commit_ts)),
        freshness: Some(shard_wire::ts_to_wire(request.freshness)),
        reads: request.reads.iter().map(shard_wire::read_to_wire).collect(),
        writes: request.writes.iter().map(|key| key.to_vec()).collect(),
        participants: request.participants.clone(),
    }
}
