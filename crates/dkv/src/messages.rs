//! The store's messages between its roles as the cores hold them: one enum of requests and
//! one of responses, each variant a kind of message, so that a core matches on what it was
//! sent and never on an absent body. [`crate::protocol`]'s codec converts them to and from
//! `virga.dkv.v1` at the transports and refuses what does not decode: an empty message, a
//! termination phase this build does not know, a transaction id or record that is not one.
//!
//! Reads, two-phase commit and its votes, replication, termination, leases, takeover and watermarks
//! carry domain types (keys as `Bytes`, transaction ids, timestamps, the replica's records
//! and scan ranges), as do the configuration service's proposals and maps and KAIROS's
//! validations, releases, leases and invalidations. Raft traffic is virga-raft's own
//! message type, which its replica checks against its log as it steps each. Rules of the
//! store rather than of the wire (a key's length, how many keys one get may ask) are the
//! cores' to check, whichever transport a message came by.

pub use crate::kairos::ValidateRequest;
use crate::layout::ShardMap;
use crate::proto;
pub use crate::proto::TxnPhase;
pub use crate::shard::replica::{ScanRange, ShardRecord};
pub use crate::shard::wire::PrepareRequest;
pub use crate::wire::Proposal;
use bytes::Bytes;
use virga_storage::{Timestamp, TxnId};

/// Read `key` of `shard` at `ts` (MILANA's get at the transaction's begin). KAIROS: a
/// caching client names how often it reads the key (`read_interval_ns`, 0: not cached) and
/// is answered with a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Get {
    pub shard: u32,
    pub epoch: u64,
    pub key: Bytes,
    pub ts: Timestamp,
    pub read_interval_ns: u64,
}

/// Several gets of one shard at one timestamp; `read_intervals_ns` is empty or one a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetMany {
    pub shard: u32,
    pub epoch: u64,
    pub keys: Vec<Bytes>,
    pub ts: Timestamp,
    pub read_intervals_ns: Vec<u64>,
}

/// The live keys of `shard` in `range` as of its timestamp, at most `limit` of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    pub shard: u32,
    pub epoch: u64,
    pub range: ScanRange,
    pub limit: u32,
}

/// A get's answer: the version visible at the read timestamp (`value` `None`: none, or a
/// delete), its timestamp and writer (zero when the key had no version), whether a
/// transaction prepared on the key commits at or below the read timestamp, and KAIROS's
/// lease on the cached copy (0: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReply {
    pub value: Option<Bytes>,
    pub version: Timestamp,
    pub writer: TxnId,
    pub prepared_below: bool,
    pub lease_end_ns: u64,
}

/// One row of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub key: Bytes,
    pub value: Bytes,
    pub version: Timestamp,
    pub writer: TxnId,
}

/// A scan's rows, and whether a writer is prepared in the range at or below its timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanReply {
    pub rows: Vec<Row>,
    pub prepared_below: bool,
}

/// A primary asks a backup of `shard` at `epoch` to let it serve reads below `until`, and
/// tells it the shard's garbage-collection watermark (the backup collects below it too) and
/// its settled point (the backup drops the decided entries below it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    pub shard: u32,
    pub epoch: u64,
    pub until: Timestamp,
    pub watermark: Timestamp,
    pub settled: Timestamp,
}

/// The new primary of `shard` at `epoch` asks a replica for its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    pub shard: u32,
    pub epoch: u64,
}

/// A replica's table for a new primary: every transaction it holds, as prepare and decision
/// records, and the largest lease it granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchTable {
    pub records: Vec<ShardRecord>,
    pub lease: Timestamp,
}

/// Every transaction of `client` from now on reads at `ts` or above; KAIROS's freshness is
/// the oldest a version it may still present for validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermark {
    pub client: u32,
    pub ts: Timestamp,
    pub freshness: Timestamp,
}

/// A participant's (or a validator's) vote; `reason` names the failed check of an abort.
/// With `below-commit-floor`, `floor` is the primary's commit floor, which a retry's commit
/// timestamp must exceed; with an abort, `stale` names the keys whose version read is no
/// longer the newest committed (a caching client drops them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Vote {
    pub commit: bool,
    pub reason: String,
    pub floor: Option<Timestamp>,
    pub stale: Vec<Bytes>,
}

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

/// KAIROS: a transaction this validator voted commit on ended (`commit`), so what the vote
/// held is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    pub txn: TxnId,
    pub commit: bool,
}

/// KAIROS: validator `validator` asks the primary of `shard` at `epoch` to let it vote on
/// read-only transactions over the shard's keys until `until_ns` of the primary's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidatorLease {
    pub validator: u32,
    pub shard: u32,
    pub epoch: u64,
    pub until_ns: u64,
}

/// A primary's answer to a validator lease: the grant (0: refused, a transaction passed
/// over the validator lately) and the highest commit timestamp of a transaction validated
/// at this shard in the validator's place, which its floor must reach before it votes under
/// the grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidatorGrant {
    pub until_ns: u64,
    pub takeover_high: Timestamp,
}

/// KAIROS's explicit-invalidation baseline: `key` has a committed version at `version`, so a
/// cached copy older than it is stale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalidate {
    pub key: Bytes,
    pub version: Timestamp,
}

/// The configuration service's answer to a proposal, once applied: the log index it applied
/// at, the map's version after it (unchanged if refused), and why the configuration refused
/// it (`None`: applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub index: u64,
    pub version: u64,
    pub refusal: Option<String>,
}

/// A configuration replica's map as it has applied it (`None` before a layout is installed)
/// and its applied log index.
#[derive(Clone, Debug, PartialEq)]
pub struct MapReply {
    pub map: Option<ShardMap>,
    pub applied: u64,
}

/// What kind of refusal a role answered, so that a caller can act on it without reading
/// its text: give up, ask another replica, or ask again later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// The request is not one the store accepts (malformed, a key outside the shard it
    /// names, too many keys, an out-of-range validator): the same request gets the same
    /// answer.
    Invalid,
    /// The role asked serves no request of this kind (a data node asked for the map, a
    /// client asked to read).
    WrongRole,
    /// The node is not the replica the request needs (the shard is not in its map, it holds
    /// no replica of it, or it is a backup asked as primary or the reverse): refresh the map
    /// and ask the right one.
    NotServing,
    /// The replica cannot answer yet (a takeover or a lease in progress, leadership changed,
    /// a proposal dropped): the same request may succeed later.
    Unavailable,
    /// The transaction asked about never prepared here.
    UnknownTxn,
    /// The callee's transport refused the request before any role saw it (it did not decode,
    /// or the role had stopped).
    Transport,
}

/// A role's refusal: its kind, and text that says what was wrong (what a refusal displays).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Refusal {
    pub kind: RefusalKind,
    pub detail: String,
}

impl Refusal {
    pub fn new(kind: RefusalKind, detail: impl Into<String>) -> Refusal {
        Refusal { kind, detail: detail.into() }
    }
}

/// A backup of `shard` that restarted asks its primary at `epoch` for the shard's records
/// again: what it acknowledged before may be gone from its disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resync {
    pub shard: u32,
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// Raft messages from one configuration replica to another.
    Raft(proto::RaftBatch),
    /// A configuration change, for the leader to propose.
    Propose(Proposal),
    /// The shard map as the replica has applied it.
    GetMap,
    /// SEMEL and MILANA, client to a shard's primary.
    Get(Get),
    GetMany(GetMany),
    Scan(Scan),
    Prepare(PrepareRequest),
    Decide(Decide),
    /// SEMEL replication, primary to backup.
    Replicate(Replicate),
    /// A restarted backup asks its primary for every record of a shard again.
    Resync(Resync),
    /// Cooperative termination: a participant primary (or a validator) asks about a transaction.
    Query(TxnQuery),
    /// A primary asks a backup for (more of) its lease.
    Lease(LeaseRequest),
    /// A new primary collects a replica's transaction table.
    Fetch(Fetch),
    /// A client's watermark, for version garbage collection.
    Watermark(Watermark),
    /// KAIROS's explicit-invalidation baseline: a committed write of a key a client caches.
    Invalidate(Invalidate),
    /// KAIROS's sharded validators: validate this validator's part, release what a vote held.
    Validate(ValidateRequest),
    Release(Release),
    /// A validator asks a shard's primary for (more of) its validator lease.
    ValidatorLease(ValidatorLease),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Ack,
    Proposed(Proposed),
    /// This configuration replica is not the leader; the leader it knows, if any.
    NotLeader(Option<String>),
    Map(MapReply),
    Value(ReadReply),
    /// A get_many's answers, one a key in the order asked.
    Values(Vec<ReadReply>),
    Rows(ScanReply),
    Vote(Vote),
    /// Not the primary of the shard at the epoch the request names; the replica's epoch.
    WrongEpoch(u64),
    /// What a participant primary knows of a transaction.
    State(TxnPhase),
    /// A backup's grant, held durably: reads may be served below this.
    Grant(Timestamp),
    Table(FetchTable),
    /// A read below the primary's garbage-collection watermark, which it names with the
    /// snapshot window it keeps.
    TooOld(TooOld),
    ValidatorGrant(ValidatorGrant),
    /// The request was refused; the kind says whether asking again may help.
    Refused(Refusal),
}

/// A snapshot older than what a primary keeps: its garbage-collection watermark, and the
/// window behind its clock below which the watermark never rises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    pub watermark: Timestamp,
    pub window_ms: u64,
}

impl TooOld {
    /// What a client tells its application of a snapshot at `ts` refused so.
    pub fn explain(&self, ts: Timestamp) -> String {
        format!(
            "snapshot-too-old: the snapshot at {ts} is below the watermark {} (versions stay readable for the \
             snapshot window of {} behind the newest commit, --snapshot-window)",
            self.watermark,
            humantime_ms(self.window_ms)
        )
    }
}

/// `ms` milliseconds as seconds, as the option spells them.
fn humantime_ms(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{} s", ms as f64 / 1000.0)
    }
}

impl Response {
    /// A refusal of `kind` that says `detail`.
    pub fn refused(kind: RefusalKind, detail: impl Into<String>) -> Response {
        Response::Refused(Refusal::new(kind, detail))
    }
}
