//! A replica's Raft log in memory (raft-rs's `Storage`), and its records on
//! the device.
//!
//! raft-rs reads its log through `Storage` and never writes it: the replica's core writes
//! each Ready's entries and hard state here before handing the Ready back, and appends the
//! same as one [`proto::RaftLogRecord`] to its record log. Replaying those records in order
//! rebuilds the log after a restart: a record's entries replace the log from their first
//! index on (a new leader's entries overwrite a conflicting suffix), its hard state replaces
//! the hard state. The log is never compacted (Virga's groups replicate rare configuration
//! changes, or blocks that are kept anyway), so it starts at index 1 and has no snapshot.

use crate::proto;
use prost::Message;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
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
}

/// The in-memory log of one replica: entries from index 1, hard state, membership.
#[derive(Debug, Clone, Default)]
pub struct RaftLog {
    entries: Vec<Entry>,
    hard_state: HardState,
    conf_state: ConfState,
}

impl RaftLog {
    /// The first record of a founding replica: the voters, and term 1 so that no member ever
    /// sits at term 0 (raft-rs treats a message of term 0 as local, see `raft_wire`).
    pub fn bootstrap_record(voters: &[u64]) -> Vec<u8> {
        proto::RaftLogRecord {
            entries: Vec::new(),
            hard_state: Some(proto::RaftHardState { term: 1, vote: 0, commit: 0 }),
            conf_state: Some(proto::RaftConfState { voters: voters.to_vec(), ..Default::default() }),
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
        }
        .encode_to_vec()
    }

    /// Rebuilds the log from its records, in LSN order.
    pub fn replay<'a>(records: impl IntoIterator<Item = (u64, &'a [u8])>) -> Result<RaftLog, RaftLogError> {
        let mut log = RaftLog::default();
        let mut has_membership = false;
        for (lsn, bytes) in records {
            let record =
                proto::RaftLogRecord::decode(bytes).map_err(|error| RaftLogError::Undecodable { lsn, error })?;
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

    /// Entries read back from the device must continue the log and keep what is committed.
    fn check_entries(&self, lsn: u64, entries: &[Entry]) -> Result<(), RaftLogError> {
        let Some(first) = entries.first() else { return Ok(()) };
        if first.index == 0 || first.index > self.last() + 1 {
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
            conf_state: None,
        };
        Some(record.encode_to_vec())
    }

    /// Puts `entries` (contiguous, from at most the last index + 1) into the log, replacing
    /// any suffix from their first index on.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        // Index i lives at position i - 1: the log starts at 1 and is never compacted.
        let keep = (first.index.saturating_sub(1) as usize).min(self.entries.len());
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

    fn last(&self) -> u64 {
        self.entries.len() as u64
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
        if low == 0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut entries = self.entries[(low - 1) as usize..(high - 1) as usize].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index == 0 {
            return Ok(0);
        }
        match self.entries.get((index - 1) as usize) {
            Some(entry) => Ok(entry.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    /// The log is never compacted, so no follower ever needs a snapshot; raft-rs takes this
    /// answer as "try later".
    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))
    }
}
