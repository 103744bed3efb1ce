//! Shard messages between clients, primaries and backups (`virga.dkv.v1`): conversion to
//! and from the replica's types, checking every field of what arrives.

use crate::proto;
use bytes::Bytes;
use prost::Message;
use virga_storage::{Timestamp, TxnId, Version};

use super::replica::{txn_id, txn_parts, ReadOp, ScanRange, SettledPart, SettledTxn, ShardRecord, WriteOp};
use crate::layout::MAX_SHARDS;

/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value accepted.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most reads, and most writes, one shard's part of a transaction may carry.
pub const MAX_OPS_PER_SHARD: usize = 4096;
/// Most validators a store may have (a validator's index is below this).
pub const MAX_VALIDATORS: u32 = 256;
/// Most versions, and most settled transactions, one part of a settled state may carry.
pub const MAX_SETTLED_PART_ITEMS: usize = 1 << 20;

/// Why a shard message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardWireError {
    #[error("field {0} is missing")]
    Missing(&'static str),
    #[error("a key of {length} bytes (at most {max})", max = MAX_KEY_BYTES)]
    KeyTooLong { length: usize },
    #[error("the key is empty")]
    EmptyKey,
    #[error("a value of {length} bytes (at most {max})", max = MAX_VALUE_BYTES)]
    ValueTooLarge { length: usize },
    #[error("{count} {what} (at most {max})", max = MAX_OPS_PER_SHARD)]
    TooMany { what: &'static str, count: usize },
    #[error("a delete that carries a value")]
    DeleteWithValue,
    #[error("shard {shard} is out of range")]
    BadShard { shard: u32 },
    #[error("the participants do not include shard {shard}, the one addressed")]
    NotAParticipant { shard: u32 },
    #[error("participant shard {shard} is listed twice")]
    DuplicateParticipant { shard: u32 },
    #[error("key {key:?} is written twice")]
    DuplicateWrite { key: Bytes },
    #[error("the commit timestamp is zero")]
    ZeroCommitTimestamp,
    #[error("commit on vote with {participants} participants (it needs exactly one)")]
    CommitOnVoteWithOthers { participants: usize },
    #[error("a validation carries {writes} writes (it validates a read-only transaction)")]
    ValidateOnlyWithWrites { writes: usize },
    #[error("validator {validator} is out of range (at most {max} validators)", max = MAX_VALIDATORS)]
    BadValidator { validator: u32 },
    #[error("validator {validator} is passed over twice")]
    DuplicateValidator { validator: u32 },
    #[error("a validation passes over validators (only a transaction with writes can)")]
    ValidateOnlyWithTakeover,
    #[error("the transaction id has sequence number 0")]
    ZeroSequence,
    #[error(
        "the record is of log format {format}, newer than this build reads (at most {max}): open the \
         directory with the build that wrote it, or a newer one",
        max = LOG_FORMAT
    )]
    NewerLogFormat { format: u32 },
    #[error("the versions of key {key:?} are not newest first, each timestamp once")]
    VersionsOutOfOrder { key: Bytes },
    #[error("a version of key {key:?} at a nonzero timestamp has no writer")]
    VersionWithoutWriter { key: Bytes },
    #[error("the log record does not decode: {0}")]
    Undecodable(#[from] prost::DecodeError),
}

pub fn ts_to_wire(ts: Timestamp) -> proto::Timestamp {
    proto::Timestamp { time: ts.time, client: ts.client }
}

pub fn ts_from_wire(ts: Option<proto::Timestamp>) -> Timestamp {
    ts.map_or(Timestamp::ZERO, |ts| Timestamp::new(ts.time, ts.client))
}

pub fn txn_to_wire(txn: TxnId) -> proto::TxnId {
    let (client, seq) = txn_parts(txn);
    proto::TxnId { client, seq }
}

pub fn txn_from_wire(txn: Option<proto::TxnId>) -> Result<TxnId, ShardWireError> {
    let txn = txn.ok_or(ShardWireError::Missing("txn"))?;
    if txn.seq == 0 {
        return Err(ShardWireError::ZeroSequence);
    }
    Ok(txn_id(txn.client, txn.seq))
}

pub fn check_key(key: &[u8]) -> Result<(), ShardWireError> {
    if key.is_empty() {
        return Err(ShardWireError::EmptyKey);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ShardWireError::KeyTooLong { length: key.len() });
    }
    Ok(())
}

pub fn shard_from_wire(shard: u32) -> Result<u32, ShardWireError> {
    if shard >= MAX_SHARDS {
        return Err(ShardWireError::BadShard { shard });
    }
    Ok(shard)
}

pub fn write_to_wire(write: &WriteOp) -> proto::Write {
    proto::Write {
        key: write.key.to_vec(),
        value: write.value.as_ref().map(|value| value.to_vec()).unwrap_or_default(),
        delete: write.value.is_none(),
    }
}

fn writes_from_wire(writes: Vec<proto::Write>) -> Result<Vec<WriteOp>, ShardWireError> {
    if writes.len() > MAX_OPS_PER_SHARD {
        return Err(ShardWireError::TooMany { what: "writes", count: writes.len() });
    }
    let mut out: Vec<WriteOp> = Vec::with_capacity(writes.len());
    for write in writes {
        check_key(&write.key)?;
        if write.value.len() > MAX_VALUE_BYTES {
            return Err(ShardWireError::ValueTooLarge { length: write.value.len() });
        }
        if write.delete && !write.value.is_empty() {
            return Err(ShardWireError::DeleteWithValue);
        }
        let key = Bytes::from(write.key);
        if out.iter().any(|earlier| earlier.key == key) {
            return Err(ShardWireError::DuplicateWrite { key });
        }
        let value = (!write.delete).then(|| Bytes::from(write.value));
        out.push(WriteOp { key, value });
    }
    Ok(out)
}

pub(crate) fn read_to_wire(read: &ReadOp) -> proto::Read {
    proto::Read { key: read.key.to_vec(), version: Some(ts_to_wire(read.version)), cached: read.cached }
}

pub(crate) fn reads_from_wire(reads: Vec<proto::Read>) -> Result<Vec<ReadOp>, ShardWireError> {
    if reads.len() > MAX_OPS_PER_SHARD {
        return Err(ShardWireError::TooMany { what: "reads", count: reads.len() });
    }
    reads
        .into_iter()
        .map(|read| {
            check_key(&read.key)?;
            Ok(ReadOp { key: Bytes::from(read.key), version: ts_from_wire(read.version), cached: read.cached })
        })
        .collect()
}

/// A transaction's participant shards: at most every shard, each in range, none twice.
pub(crate) fn check_participants(participants: &[u32]) -> Result<(), ShardWireError> {
    if participants.len() > MAX_SHARDS as usize {
        return Err(ShardWireError::TooMany { what: "participants", count: participants.len() });
    }
    for (position, participant) in participants.iter().enumerate() {
        shard_from_wire(*participant)?;
        if participants[..position].contains(participant) {
            return Err(ShardWireError::DuplicateParticipant { shard: *participant });
        }
    }
    Ok(())
}

fn participants_from_wire(shard: u32, participants: Vec<u32>) -> Result<Vec<u32>, ShardWireError> {
    check_participants(&participants)?;
    if !participants.contains(&shard) {
        return Err(ShardWireError::NotAParticipant { shard });
    }
    Ok(participants)
}

/// The validators a transaction passed over: each in range, none twice.
pub(crate) fn takeover_from_wire(validators: Vec<u32>) -> Result<Vec<u32>, ShardWireError> {
    for (position, validator) in validators.iter().enumerate() {
        if *validator >= MAX_VALIDATORS {
            return Err(ShardWireError::BadValidator { validator: *validator });
        }
        if validators[..position].contains(validator) {
            return Err(ShardWireError::DuplicateValidator { validator: *validator });
        }
    }
    Ok(validators)
}

/// A checked prepare: this shard's part of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareRequest {
    pub shard: u32,
    pub epoch: u64,
    pub txn: TxnId,
    pub commit_ts: Timestamp,
    pub reads: Vec<ReadOp>,
    pub writes: Vec<WriteOp>,
    pub participants: Vec<u32>,
    pub scans: Vec<ScanRange>,
    /// The only participant commits once its vote is safe; no decision follows.
    pub commit_on_vote: bool,
    /// A read-only transaction's validation alone: nothing logged, held or decided.
    pub validate_only: bool,
    /// KAIROS: the validators this transaction passed over, validated here in their place.
    pub takeover_validators: Vec<u32>,
}

/// A range from the wire: an empty end is unbounded; the start is at most a key long.
pub fn range_from_wire(
    start: Vec<u8>,
    end: Vec<u8>,
    ts: Option<proto::Timestamp>,
) -> Result<ScanRange, ShardWireError> {
    if start.len() > MAX_KEY_BYTES || end.len() > MAX_KEY_BYTES {
        return Err(ShardWireError::KeyTooLong { length: start.len().max(end.len()) });
    }
    let end = (!end.is_empty()).then(|| Bytes::from(end));
    Ok(ScanRange { start: Bytes::from(start), end, ts: ts_from_wire(ts) })
}

pub fn prepare_from_wire(prepare: proto::Prepare) -> Result<PrepareRequest, ShardWireError> {
    let shard = shard_from_wire(prepare.shard)?;
    if prepare.commit_on_vote && prepare.participants.len() != 1 {
        return Err(ShardWireError::CommitOnVoteWithOthers { participants: prepare.participants.len() });
    }
    if prepare.validate_only && !prepare.writes.is_empty() {
        return Err(ShardWireError::ValidateOnlyWithWrites { writes: prepare.writes.len() });
    }
    if prepare.validate_only && !prepare.takeover_validators.is_empty() {
        return Err(ShardWireError::ValidateOnlyWithTakeover);
    }
    let commit_ts = ts_from_wire(prepare.commit_ts);
    if commit_ts == Timestamp::ZERO {
        return Err(ShardWireError::ZeroCommitTimestamp);
    }
    Ok(PrepareRequest {
        shard,
        epoch: prepare.epoch,
        txn: txn_from_wire(prepare.txn)?,
        commit_ts,
        reads: reads_from_wire(prepare.reads)?,
        writes: writes_from_wire(prepare.writes)?,
        participants: participants_from_wire(shard, prepare.participants)?,
        commit_on_vote: prepare.commit_on_vote,
        validate_only: prepare.validate_only,
        takeover_validators: takeover_from_wire(prepare.takeover_validators)?,
        scans: {
            if prepare.scans.len() > MAX_OPS_PER_SHARD {
                return Err(ShardWireError::TooMany { what: "scans", count: prepare.scans.len() });
            }
            prepare
                .scans
                .into_iter()
                .map(|range| range_from_wire(range.start, range.end, range.ts))
                .collect::<Result<_, _>>()?
        },
    })
}

pub fn prepare_to_wire(prepare: &PrepareRequest) -> proto::Prepare {
    proto::Prepare {
        shard: prepare.shard,
        epoch: prepare.epoch,
        txn: Some(txn_to_wire(prepare.txn)),
        commit_ts: Some(ts_to_wire(prepare.commit_ts)),
        reads: prepare.reads.iter().map(read_to_wire).collect(),
        writes: prepare.writes.iter().map(write_to_wire).collect(),
        participants: prepare.participants.clone(),
        scans: prepare
            .scans
            .iter()
            .map(|range| proto::ScannedRange {
                start: range.start.to_vec(),
                end: range.end.as_ref().map(|end| end.to_vec()).unwrap_or_default(),
                ts: Some(ts_to_wire(range.ts)),
            })
            .collect(),
        commit_on_vote: prepare.commit_on_vote,
        validate_only: prepare.validate_only,
        takeover_validators: prepare.takeover_validators.clone(),
    }
}

pub fn record_to_wire(record: &ShardRecord) -> proto::ShardRecord {
    use proto::shard_record::Record;
    let record = match record {
        ShardRecord::Prepared { txn, commit_ts, writes, participants, takeover_of } => {
            Record::Prepared(proto::PreparedTxn {
                txn: Some(txn_to_wire(*txn)),
                commit_ts: Some(ts_to_wire(*commit_ts)),
                writes: writes.iter().map(write_to_wire).collect(),
                participants: participants.clone(),
                takeover_validators: takeover_of.clone(),
            })
        }
        ShardRecord::Decided { txn, commit } => {
            Record::Decided(proto::DecidedTxn { txn: Some(txn_to_wire(*txn)), commit: *commit })
        }
        ShardRecord::LeaseGranted { epoch, until } => {
            Record::Lease(proto::LeaseGranted { epoch: *epoch, until: Some(ts_to_wire(*until)) })
        }
        ShardRecord::Fence { epoch } => Record::Fence(proto::Fence { epoch: *epoch }),
        ShardRecord::Settled(part) => Record::Settled(settled_part_to_wire(part)),
    };
    proto::ShardRecord { record: Some(record) }
}

fn settled_part_to_wire(part: &SettledPart) -> proto::SettledPart {
    let version_to_wire = |version: &Version| proto::StoredVersion {
        ts: Some(ts_to_wire(version.ts)),
        writer: (version.writer != 0).then(|| txn_to_wire(version.writer)),
        value: version.value.as_ref().map(|value| value.to_vec()).unwrap_or_default(),
        delete: version.value.is_none(),
    };
    proto::SettledPart {
        versions: part
            .versions
            .iter()
            .map(|(key, versions)| proto::KeyVersions {
                key: key.to_vec(),
                versions: versions.iter().map(version_to_wire).collect(),
            })
            .collect(),
        txns: part
            .txns
            .iter()
            .map(|(txn, settled)| proto::SettledTxn {
                txn: Some(txn_to_wire(*txn)),
                commit: settled.commit,
                commit_ts: Some(ts_to_wire(settled.commit_ts)),
            })
            .collect(),
        validator_floors: part
            .validator_floors
            .iter()
            .map(|(validator, high)| proto::ValidatorFloor { validator: *validator, high: Some(ts_to_wire(*high)) })
            .collect(),
    }
}

fn settled_part_from_wire(part: proto::SettledPart) -> Result<SettledPart, ShardWireError> {
    let versions: usize = part.versions.iter().map(|key| key.versions.len()).sum();
    for (what, count) in [("settled versions", versions), ("settled transactions", part.txns.len())] {
        if count > MAX_SETTLED_PART_ITEMS {
            return Err(ShardWireError::TooMany { what, count });
        }
    }
    let mut out = SettledPart::default();
    for held in part.versions {
        check_key(&held.key)?;
        let key = Bytes::from(held.key);
        let mut versions: Vec<Version> = Vec::with_capacity(held.versions.len());
        for version in held.versions {
            if version.value.len() > MAX_VALUE_BYTES {
                return Err(ShardWireError::ValueTooLarge { length: version.value.len() });
            }
            if version.delete && !version.value.is_empty() {
                return Err(ShardWireError::DeleteWithValue);
            }
            let ts = ts_from_wire(version.ts);
            if versions.last().is_some_and(|newer| newer.ts <= ts) {
                return Err(ShardWireError::VersionsOutOfOrder { key });
            }
            let writer = match version.writer {
                Some(writer) => txn_from_wire(Some(writer))?,
                None if ts == Timestamp::ZERO => 0,
                None => return Err(ShardWireError::VersionWithoutWriter { key }),
            };
            let value = (!version.delete).then(|| Bytes::from(version.value));
            versions.push(Version { ts, writer, value });
        }
        out.versions.push((key, versions));
    }
    for settled in part.txns {
        let commit_ts = ts_from_wire(settled.commit_ts);
        if commit_ts == Timestamp::ZERO {
            return Err(ShardWireError::ZeroCommitTimestamp);
        }
        out.txns.push((txn_from_wire(settled.txn)?, SettledTxn { commit: settled.commit, commit_ts }));
    }
    let validators: Vec<u32> = part.validator_floors.iter().map(|floor| floor.validator).collect();
    takeover_from_wire(validators)?;
    out.validator_floors =
        part.validator_floors.into_iter().map(|floor| (floor.validator, ts_from_wire(floor.high))).collect();
    Ok(out)
}

/// Checks a record of a fetched table, whose shard the answer does not name: every check
/// but that its participants include the shard, which the new primary makes.
pub fn table_record_from_wire(record: proto::ShardRecord) -> Result<ShardRecord, ShardWireError> {
    let shard = match &record.record {
        Some(proto::shard_record::Record::Prepared(prepared)) => prepared.participants.first().copied().unwrap_or(0),
        _ => 0,
    };
    record_from_wire(shard, record)
}

/// Checks a record replicated to shard `shard`.
pub fn record_from_wire(shard: u32, record: proto::ShardRecord) -> Result<ShardRecord, ShardWireError> {
    use proto::shard_record::Record;
    match record.record.ok_or(ShardWireError::Missing("record"))? {
        Record::Prepared(prepared) => {
            let commit_ts = ts_from_wire(prepared.commit_ts);
            if commit_ts == Timestamp::ZERO {
                return Err(ShardWireError::ZeroCommitTimestamp);
            }
            Ok(ShardRecord::Prepared {
                txn: txn_from_wire(prepared.txn)?,
                commit_ts,
                writes: writes_from_wire(prepared.writes)?,
                participants: participants_from_wire(shard, prepared.participants)?,
                takeover_of: takeover_from_wire(prepared.takeover_validators)?,
            })
        }
        Record::Decided(decided) => {
            Ok(ShardRecord::Decided { txn: txn_from_wire(decided.txn)?, commit: decided.commit })
        }
        Record::Lease(lease) => Ok(ShardRecord::LeaseGranted { epoch: lease.epoch, until: ts_from_wire(lease.until) }),
        Record::Fence(fence) => Ok(ShardRecord::Fence { epoch: fence.epoch }),
        Record::Settled(part) => Ok(ShardRecord::Settled(settled_part_from_wire(part)?)),
    }
}

/// The replica log's format this build writes, and the newest it reads (0: records written
/// before formats were numbered; 1: settled parts).
pub const LOG_FORMAT: u32 = 1;

/// A replica's log record: the shard and the record.
pub fn encode_log_record(shard: u32, record: &ShardRecord) -> Vec<u8> {
    proto::ShardLogRecord { shard, record: Some(record_to_wire(record)), format: LOG_FORMAT }.encode_to_vec()
}

pub fn decode_log_record(bytes: &[u8]) -> Result<(u32, ShardRecord), ShardWireError> {
    let record = proto::ShardLogRecord::decode(bytes)?;
    if record.format > LOG_FORMAT {
        return Err(ShardWireError::NewerLogFormat { format: record.format });
    }
    let shard = shard_from_wire(record.shard)?;
    Ok((shard, record_from_wire(shard, record.record.ok_or(ShardWireError::Missing("record"))?)?))
}
