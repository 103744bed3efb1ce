//! The store's messages between its roles as the cores hold them: one enum of requests and
//! one of responses, each variant a kind of message, so that a core matches on what it was
//! sent and never on an absent body. [`crate::protocol`]'s codec converts them to and from
//! `virga.dkv.v1` at the transports and refuses what does not decode: an empty message, a
//! termination phase this build does not know, a transaction id or record that is not one.
//!
//! Two-phase commit, replication and termination carry domain types (transaction ids,
//! timestamps, the replica's records); the other kinds still carry their protobuf structs
//! and are checked by the core that takes them.

use crate::proto;
pub use crate::proto::TxnPhase;
pub use crate::shard::replica::ShardRecord;
pub use crate::shard::wire::PrepareRequest;
use virga_storage::{Timestamp, TxnId};

/// Phase 2 of two-phase commit, for the primary of `shard` at `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decide {
    pub shard: u32,
    pub epoch: u64,
    pub txn: TxnId,
    pub commit: bool,
}

/// A record a primary replicates to a backup of `shard` at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicate {
    pub shard: u32,
    pub epoch: u64,
    pub record: ShardRecord,
}

/// Cooperative termination: what the primary of `shard` at `epoch` knows of `txn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnQuery {
    pub shard: u32,
    pub epoch: u64,
    pub txn: TxnId,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// Raft messages from one configuration replica to another.
    Raft(proto::RaftBatch),
    /// A configuration change, for the leader to propose.
    Propose(proto::ConfigProposal),
    /// The shard map as the replica has applied it.
    GetMap,
    /// SEMEL and MILANA, client to a shard's primary.
    Get(proto::Get),
    GetMany(proto::GetMany),
    Scan(proto::Scan),
    Prepare(PrepareRequest),
    Decide(Decide),
    /// SEMEL replication, primary to backup.
    Replicate(Replicate),
    /// Cooperative termination: a participant primary (or a validator) asks about a transaction.
    Query(TxnQuery),
    /// A primary asks a backup for (more of) its lease.
    Lease(proto::LeaseRequest),
    /// A new primary collects a replica's transaction table.
    Fetch(proto::Fetch),
    /// A client's watermark, for version garbage collection.
    Watermark(proto::Watermark),
    /// KAIROS's explicit-invalidation baseline: a committed write of a key a client caches.
    Invalidate(proto::Invalidate),
    /// KAIROS's sharded validators: validate this validator's part, release what a vote held.
    Validate(proto::Validate),
    Release(proto::Release),
    /// A validator asks a shard's primary for (more of) its validator lease.
    ValidatorLease(proto::ValidatorLease),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Ack,
    Proposed(proto::Proposed),
    /// This configuration replica is not the leader.
    NotLeader(proto::NotLeader),
    Map(proto::MapReply),
    Value(proto::GetReply),
    Values(proto::GetManyReply),
    Rows(proto::ScanReply),
    Vote(proto::Vote),
    /// Not the primary of the shard at the epoch the request names; the replica's epoch.
    WrongEpoch(u64),
    /// What a participant primary knows of a transaction.
    State(TxnPhase),
    Grant(proto::LeaseGrant),
    Table(proto::FetchReply),
    /// A read below the primary's garbage-collection watermark, which it names.
    TooOld(Timestamp),
    ValidatorGrant(proto::ValidatorGrant),
    /// The request was refused (malformed, or its outcome is unknown: retry it).
    Refused(String),
}
