//! The store's messages between its roles as the cores hold them: one enum of requests and
//! one of responses, each variant a kind of message, so that a core matches on what it was
//! sent and never on an absent body. [`crate::protocol`]'s codec converts them to and from
//! `virga.dkv.v1` at the transports and refuses what does not decode: an empty message, or
//! a termination phase this build does not know.

use crate::proto;
pub use crate::proto::TxnPhase;

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
    Prepare(proto::Prepare),
    Decide(proto::Decide),
    /// SEMEL replication, primary to backup.
    Replicate(proto::Replicate),
    /// Cooperative termination: a participant primary (or a validator) asks about a transaction.
    Query(proto::TxnQuery),
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
    /// Not the primary of the shard at the epoch the request names.
    WrongEpoch(proto::WrongEpoch),
    /// What a participant primary knows of a transaction.
    State(TxnPhase),
    Grant(proto::LeaseGrant),
    Table(proto::FetchReply),
    /// A read below the primary's garbage-collection watermark.
    TooOld(proto::Timestamp),
    ValidatorGrant(proto::ValidatorGrant),
    /// The request was refused (malformed, or its outcome is unknown: retry it).
    Refused(String),
}
