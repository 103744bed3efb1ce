//! A replica's Raft log in memory (raft-rs's `Storage`), and its records on
//! the device.
//!
//! raft-rs reads its log through `Storage` and never writes it: the replica's core writes
//! each Ready's entries and hard state here before handing the Ready back, and appends the
//! same as one [`proto::RaftLogRecord`] to its record log. Replaying those records in order
//! rebuilds the log after a restart: a record's entries replace the log from their first
//! index on (a new leader's entries overwrite a conflicting suffix), its hard state replaces
//! the hard state.
//!
//! A group compacts behind a snapshot of its state machine ([`RaftLog::compact`], or a
//! leader's snapshot installed on a lagging follower, [`RaftLog::apply_snapshot`]): the log
//! then starts after the snapshot's index, and the record that says so stands alone (the
//! snapshot, the entries after it, the hard state and membership), so every record before
//! it may be dropped from the device. Replay starts at the last such record.

use crate::proto;
use prost::Message;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::wire::{self as raft_wire, RaftWireError};

/// Why the records on a replica's device do not make a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftLogError {
    #[error("record {lsn} does not decode: {error}")]
    Undecodable { lsn: u64, error: prost::DecodeError },
    #[error("record {lsn}: {error}")]
    BadEntry { lsn: u64, error: RaftWireError },
    #[error("record {lsn}: entry {position} has index {found}, expected {expected}")]
    NotContiguous { lsn: u64, position: usize, expected: u64, found: u64 },
    #[error("record {lsn}: an entry has term 0")]
    ZeroTerm { lsn: u64 },
    #[error("record {lsn}: hard state commits index {commit}, beyond the log's last index {last}")]
    CommitBeyondLog { lsn: u64, commit: u64, last: u64 },
    #[error("record {lsn}: entries from index {first} would remove committed index {commit}")]
    RewritesCommitted { lsn: u64, first: u64, commit: u64 },
    #[error("the log has no membership record (the first record of a replica names the voters)")]
    NoMembership,
    #[error(
        "record {lsn} has format {format}, which this build does not know: it was written by a newer build of \
         Virga; run that build, or remove the replica's directory so it is rebuilt from its group"
    )]
    UnknownFormat { lsn: u64, format: u32 },
    #[error("record {lsn}: the snapshot {problem}")]
    BadSnapshot { lsn: u64, problem: &'static str },
}

/// Why the log cannot be compacted at an index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    #[error("index {index} is not after the log's snapshot at {snapshot}")]
    AlreadyCompacted { index: u64, snapshot: u64 },
    #[error("index {index} is not committed (the commit index is {commit})")]
    NotCommitted { index: u64, commit: u64 },
}

/// The format of records this build writes with a snapshot.
const SNAPSHOT_FORMAT: u32 = 1;

/// The in-memory log of one replica: the snapshot it starts after (none: index 0), the
/// entries after it, hard state, membership.
#[derive(Debug, Clone, Default)]
pub struct RaftLog {
    /// Entry i lives at position i - offset - 1, where offset is the snapshot's index.
    entries: Vec<Entry>,
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
}

impl RaftLog {
    /// The first record of a founding replica: the voters, and term 1 so that no member ever
    /// sits at term 0 (raft-rs treats a message of term 0 as local, see `raft_wire`).
    pub fn bootstrap_record(voters: &[u64]) -> Vec<u8> {
        proto::RaftLogRecord {
            entries: Vec::new(),
            hard_state: Some(proto::RaftHardState { term: 1, vote: 0, commit: 0 }),
            conf_state: Some(proto::RaftConfState { voters: voters.to_vec(), ..Default::default() }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// The first record of a group founded with a history every member holds: the voters,
    /// and `entries` committed at indices 1, 2, … in term 1 (a chain's genesis blocks).
    pub fn bootstrap_record_with(voters: &[u64], entries: &[Vec<u8>]) -> Vec<u8> {
        let entries: Vec<proto::RaftEntry> = entries
            .iter()
            .enumerate()
            .map(|(at, data)| {
                let entry = Entry { index: at as u64 + 1, term: 1, data: data.clone().into(), ..Default::default() };
                raft_wire::entry_to_wire(entry)
            })
            .collect();
        let commit = entries.len() as u64;
        proto::RaftLogRecord {
            entries,
            hard_state: Some(proto::RaftHardState { term: 1, vote: 0, commit }),
            conf_state: Some(proto::RaftConfState { voters: voters.to_vec(), ..Default::default() }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// Rebuilds the log from its records, in LSN order. Replay starts at the last record
    /// that holds a snapshot (what came before it is history the snapshot replaces).
    pub fn replay<'a>(records: impl IntoIterator<Item = (u64, &'a [u8])>) -> Result<RaftLog, RaftLogError> {
        let mut decoded = Vec::new();
        for (lsn, bytes) in records {
            let record =
                proto::RaftLogRecord::decode(bytes).map_err(|error| RaftLogError::Undecodable { lsn, error })?;
            if record.format > SNAPSHOT_FORMAT {
                return Err(RaftLogError::UnknownFormat { lsn, format: record.format });
            }
            decoded.push((lsn, record));
        }
        let start = decoded.iter().rposition(|(_, record)| record.snapshot.is_some()).unwrap_or(0);
        let mut log = RaftLog::default();
        let mut has_membership = false;
        for (lsn, record) in decoded.into_iter().skip(start) {
            if let Some(snapshot) = &record.snapshot {
                log.restart_at(lsn, snapshot)?;
                has_membership = true;
            }
            if let Some(conf_state) = &record.conf_state {
                log.conf_state = raft_wire::conf_state_into_raft(conf_state);
                has_membership = true;
            }
            let entries = record
                .entries
                .into_iter()
                .map(raft_wire::entry_into_raft)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| RaftLogError::BadEntry { lsn, error })?;
            log.check_entries(lsn, &entries)?;
            log.append(&entries);
            if let Some(hard_state) = &record.hard_state {
                let hard_state = raft_wire::hard_state_into_raft(hard_state);
                if hard_state.commit > log.last() {
                    return Err(RaftLogError::CommitBeyondLog { lsn, commit: hard_state.commit, last: log.last() });
                }
                log.hard_state = hard_state;
            }
        }
        if !has_membership || log.conf_state.voters.is_empty() {
            return Err(RaftLogError::NoMembership);
        }
        Ok(log)
    }

    /// Empties the log down to `snapshot`, read back from record `lsn`.
    fn restart_at(&mut self, lsn: u64, snapshot: &proto::RaftSnapshot) -> Result<(), RaftLogError> {
        let bad = |problem| RaftLogError::BadSnapshot { lsn, problem };
        let metadata = snapshot.metadata.as_ref().ok_or(bad("has no metadata"))?;
        if metadata.index == 0 || metadata.term == 0 {
            return Err(bad("is at index 0 or term 0"));
        }
        let conf_state = metadata.conf_state.as_ref().ok_or(bad("names no membership"))?;
        if conf_state.voters.is_empty() {
            return Err(bad("names no voters"));
        }
        let snapshot = raft_wire::snapshot_into_raft(snapshot.clone());
        *self = RaftLog {
            hard_state: HardState { term: metadata.term, commit: metadata.index, ..HardState::default() },
            conf_state: snapshot.get_metadata().get_conf_state().clone(),
            snapshot,
            entries: Vec::new(),
        };
        Ok(())
    }

    /// Entries read back from the device must continue the log and keep what is committed.
    fn check_entries(&self, lsn: u64, entries: &[Entry]) -> Result<(), RaftLogError> {
        let Some(first) = entries.first() else { return Ok(()) };
        if first.index <= self.offset() || first.index > self.last() + 1 {
            return Err(RaftLogError::NotContiguous {
                lsn,
                position: 0,
                expected: self.last() + 1,
                found: first.index,
            });
        }
        if first.index <= self.hard_state.commit {
            return Err(RaftLogError::RewritesCommitted { lsn, first: first.index, commit: self.hard_state.commit });
        }
        for (position, entry) in entries.iter().enumerate() {
            let expected = first.index + position as u64;
            if entry.index != expected {
                return Err(RaftLogError::NotContiguous { lsn, position, expected, found: entry.index });
            }
            if entry.term == 0 {
                return Err(RaftLogError::ZeroTerm { lsn });
            }
        }
        Ok(())
    }

    /// The record that makes `entries` and `hard_state` durable (None when both are empty).
    pub fn record(entries: &[Entry], hard_state: Option<&HardState>) -> Option<Vec<u8>> {
        if entries.is_empty() && hard_state.is_none() {
            return None;
        }
        let record = proto::RaftLogRecord {
            entries: entries.iter().cloned().map(raft_wire::entry_to_wire).collect(),
            hard_state: hard_state.map(raft_wire::hard_state_to_wire),
            ..Default::default()
        };
        Some(record.encode_to_vec())
    }

    /// Puts `entries` (contiguous, from at most the last index + 1) into the log, replacing
    /// any suffix from their first index on.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        let keep = (first.index.saturating_sub(self.offset() + 1) as usize).min(self.entries.len());
        self.entries.truncate(keep);
        self.entries.extend_from_slice(entries);
    }

    pub fn set_hard_state(&mut self, hard_state: HardState) {
        self.hard_state = hard_state;
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn voters(&self) -> &[u64] {
        &self.conf_state.voters
    }

    /// The index of the snapshot the log starts after (0: none).
    pub fn offset(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// The snapshot the log starts after: its index and the state machine's image (None:
    /// the log starts at index 1).
    pub fn snapshot_state(&self) -> Option<(u64, &[u8])> {
        (self.offset() > 0).then(|| (self.offset(), &self.snapshot.data[..]))
    }

    /// Entries held in memory (after the snapshot).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn last(&self) -> u64 {
        self.offset() + self.entries.len() as u64
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        if index == self.offset() {
            return Some(self.snapshot.get_metadata().term);
        }
        let position = index.checked_sub(self.offset() + 1)?;
        self.entries.get(position as usize).map(|entry| entry.term)
    }

    /// Drops the entries up to `index` (committed, and applied by the state machine whose
    /// image at `index` is `data`) behind a snapshot; returns the record that makes it
    /// durable and stands alone.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<Vec<u8>, CompactError> {
        if index <= self.offset() {
            return Err(CompactError::AlreadyCompacted { index, snapshot: self.offset() });
        }
        let Some(term) = self.term_at(index).filter(|_| index <= self.hard_state.commit) else {
            return Err(CompactError::NotCommitted { index, commit: self.hard_state.commit });
        };
        let dropped = (index - self.offset()) as usize;
        self.entries.drain(..dropped);
        let mut metadata = SnapshotMetadata { index, term, ..SnapshotMetadata::default() };
        metadata.set_conf_state(self.conf_state.clone());
        let mut snapshot = Snapshot { data: data.into(), ..Snapshot::default() };
        snapshot.set_metadata(metadata);
        self.snapshot = snapshot;
        Ok(self.standalone_record())
    }

    /// Replaces the log with a leader's `snapshot` (raft-rs checked it is newer than what
    /// is committed here); returns the record that makes it durable and stands alone.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> Vec<u8> {
        let metadata = snapshot.get_metadata();
        self.hard_state.term = self.hard_state.term.max(metadata.term);
        self.hard_state.commit = metadata.index;
        self.conf_state = metadata.get_conf_state().clone();
        self.entries.clear();
        self.snapshot = snapshot;
        self.standalone_record()
    }

    /// The record of everything the log holds: snapshot, entries, hard state, membership.
    fn standalone_record(&self) -> Vec<u8> {
        proto::RaftLogRecord {
            entries: self.entries.iter().cloned().map(raft_wire::entry_to_wire).collect(),
            hard_state: Some(raft_wire::hard_state_to_wire(&self.hard_state)),
            conf_state: Some(raft_wire::conf_state_to_wire(&self.conf_state)),
            snapshot: Some(raft_wire::snapshot_to_wire(self.snapshot.clone())),
            format: SNAPSHOT_FORMAT,
        }
        .encode_to_vec()
    }
}

impl raft::Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState { hard_state: self.hard_state.clone(), conf_state: self.conf_state.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.offset() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.offset() - 1) as usize;
        let to = (high - self.offset() - 1) as usize;
        let mut entries = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index < self.offset() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_at(index).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.offset() + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    /// The snapshot the log starts after, for a follower that lacks the entries behind it;
    /// "try later" when there is none (raft-rs then sends entries) or it is older than asked.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.offset() == 0 || self.offset() < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}
