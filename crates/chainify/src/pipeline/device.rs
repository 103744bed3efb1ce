//! The devices the pipeline's cores drive: an organization's database and ledger (one
//! [`Member`], shared with whoever restarts the organization's servers, since the database
//! outlives them), an orderer replica's Raft log and a commit server's votes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use virga_core::device::IntoStorage;
use virga_ledger::wlc::{LedgerBlock, SignedVote};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog};

use super::{DeviceFailure, PipelineIo, PipelineIoDone};
use crate::consortium::{Member, NextBlock};

/// An organization's database and ledger as its execution server's device.
pub struct OrganizationDevice {
    member: Arc<Mutex<Member>>,
    checkpoint_every: u64,
    keep_checkpoints: usize,
}

/// An orderer replica's Raft log: its records in order, in memory and, when opened on a
/// directory or a [`virga_core::device::Storage`], in a record log there, synced before an
/// append is reported (Raft answers a vote or an append only after that).
#[derive(Clone, Default)]
pub struct OrdererLog {
    inner: Arc<Mutex<Records>>,
}

#[derive(Default)]
struct Records {
    records: Vec<Vec<u8>>,
    disk: Option<RecordLog>,
}

impl Records {
    /// Appends `more` to the disk log (synced) if there is one, then to memory.
    fn append(&mut self, more: Vec<Vec<u8>>) -> Result<(), DeviceFailure> {
        if let Some(disk) = self.disk.as_mut() {
            let dir = disk.dir().to_path_buf();
            for record in &more {
                disk.append(record).map_err(|error| DeviceFailure::Log { dir: dir.clone(), error })?;
            }
            disk.sync().map_err(|error| DeviceFailure::Log { dir, error })?;
        }
        self.records.extend(more);
        Ok(())
    }
}

/// Opens the record log at `at` (a directory, created if absent, or a storage; a torn tail
/// cut: it was never acknowledged) and reads its records.
fn open_records(at: impl IntoStorage) -> Result<Records, DeviceError> {
    let dir = at.location();
    let mut records = Vec::new();
    let (disk, _) =
        RecordLog::open_with(at, LogOptions::default(), OpenMode::Repair, |_, payload| records.push(payload.to_vec()))
            .map_err(|error| DeviceError::Log { dir, error })?;
    Ok(Records { records, disk: Some(disk) })
}

/// A device's log on disk could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{}: {error}", dir.display())]
    Log { dir: PathBuf, error: LogError },
    #[error("{}: founding the orderer log: {reason}", dir.display())]
    Found { dir: PathBuf, reason: Box<DeviceFailure> },
    #[error("{}: vote record {at} does not decode ({reason}); the vote log is damaged", dir.display())]
    BadVote { dir: PathBuf, at: usize, reason: String },
}

impl OrdererLog {
    /// A log that starts with `records` (a founded group's history).
    pub fn with_records(records: Vec<Vec<u8>>) -> OrdererLog {
        OrdererLog { inner: Arc::new(Mutex::new(Records { records, disk: None })) }
    }

    /// The log kept at `at` (a directory or a storage); an empty one is founded with
    /// `founding()`'s records first.
    pub fn open(at: impl IntoStorage, founding: impl FnOnce() -> Vec<Vec<u8>>) -> Result<OrdererLog, DeviceError> {
        let dir = at.location();
        let mut opened = open_records(at)?;
        if opened.records.is_empty() {
            opened.append(founding()).map_err(|reason| DeviceError::Found { dir, reason: Box::new(reason) })?;
        }
        Ok(OrdererLog { inner: Arc::new(Mutex::new(opened)) })
    }

    pub fn execute(&self, op: PipelineIo) -> PipelineIoDone {
        let Ok(mut inner) = self.inner.lock() else {
            return PipelineIoDone::RaftAppended(Err(DeviceFailure::Poisoned("orderer log")));
        };
        match op {
            PipelineIo::LoadRaft => PipelineIoDone::LoadedRaft(inner.records.clone()),
            PipelineIo::AppendRaft(more) => PipelineIoDone::RaftAppended(inner.append(more)),
            _ => PipelineIoDone::RaftAppended(Err(DeviceFailure::WrongDevice(
                "an orderer's log keeps only Raft records",
            ))),
        }
    }
}

/// A commit server's log of its own votes (the newest ones, by block), in memory and, when
/// opened on a directory, in a record log there, synced before the vote may be sent.
#[derive(Clone, Default)]
pub struct VoteLog {
    inner: Arc<Mutex<Votes>>,
}

#[derive(Default)]
struct Votes {
    votes: std::collections::BTreeMap<u64, SignedVote>,
    disk: Option<RecordLog>,
}

/// How many blocks of votes a vote log keeps.
const KEPT_VOTES: usize = 1024;

impl Votes {
    fn keep(&mut self, vote: SignedVote) {
        self.votes.insert(vote.block, vote);
        while self.votes.len() > KEPT_VOTES {
            self.votes.pop_first();
        }
    }
}

impl VoteLog {
    /// The votes kept at `at` (a directory or a storage). A record that does not decode is
    /// refused: the log is this server's own, so it means damage, and voting on without it
    /// could vote two ways.
    pub fn open(at: impl IntoStorage) -> Result<VoteLog, DeviceError> {
        let dir = at.location();
        let opened = open_records(at)?;
        let mut votes = Votes { votes: Default::default(), disk: opened.disk };
        for (at, record) in opened.records.iter().enumerate() {
            let vote = SignedVote::decode(record).map_err(|refused| DeviceError::BadVote {
                dir: dir.clone(),
                at,
                reason: refused.to_string(),
            })?;
            votes.keep(vote);
        }
        Ok(VoteLog { inner: Arc::new(Mutex::new(votes)) })
    }

    pub fn execute(&self, op: PipelineIo) -> PipelineIoDone {
        let Ok(mut inner) = self.inner.lock() else {
            return PipelineIoDone::LoadedVotes(Vec::new());
        };
        match op {
            PipelineIo::LogVote(vote) => {
                let block = vote.block;
                if let Some(disk) = inner.disk.as_mut() {
                    let logged = disk.append(&vote.encode()).and_then(|_| disk.sync());
                    if let Err(error) = logged {
                        // Not reported as logged, so the commit server never sends it.
                        tracing::error!(block, %error, "a vote could not be logged");
                        return PipelineIoDone::Appended(Err(DeviceFailure::Log {
                            dir: disk.dir().to_path_buf(),
                            error,
                        }));
                    }
                }
                inner.keep(vote);
                PipelineIoDone::VoteLogged(block)
            }
            _ => PipelineIoDone::LoadedVotes(inner.votes.values().cloned().collect()),
        }
    }
}

impl OrganizationDevice {
    pub fn new(member: Arc<Mutex<Member>>, checkpoint_every: u64, keep_checkpoints: usize) -> OrganizationDevice {
        OrganizationDevice { member, checkpoint_every: checkpoint_every.max(1), keep_checkpoints }
    }

    /// Another handle on the same database and ledger.
    pub fn share(&self) -> OrganizationDevice {
        OrganizationDevice {
            member: Arc::clone(&self.member),
            checkpoint_every: self.checkpoint_every,
            keep_checkpoints: self.keep_checkpoints,
        }
    }

    pub fn execute(&mut self, op: PipelineIo) -> PipelineIoDone {
        let Ok(mut member) = self.member.lock() else {
            return PipelineIoDone::Loaded(Err(DeviceFailure::Poisoned("organization's database")));
        };
        match op {
            PipelineIo::Load => {
                let chain = member.ledger.blocks().to_vec();
                let loaded = member.rebuild(&chain, None).map_err(DeviceFailure::from);
                PipelineIoDone::Loaded(
                    loaded.map(|_| (chain.len() as u64, chain.last().map_or([0; 32], LedgerBlock::hash))),
                )
            }
            PipelineIo::Execute { number, previous, transactions } => {
                PipelineIoDone::Executed(member.execute(number, previous, &transactions).map_err(DeviceFailure::from))
            }
            PipelineIo::Append(block) => PipelineIoDone::Appended(self.append(&mut member, block)),
            PipelineIo::Recover { number, previous, transactions, consensus } => {
                let chain = member.ledger.blocks().to_vec();
                let next = NextBlock { number, previous, transactions: &transactions, expected: consensus };
                let rebuilt = match member.rebuild(&chain, Some(next)) {
                    Ok((attempts, Some(block))) => self.append(&mut member, block.clone()).map(|()| (block, attempts)),
                    Ok((_, None)) => Err(DeviceFailure::NothingRebuilt),
                    Err(error) => Err(error.into()),
                };
                PipelineIoDone::Recovered(rebuilt)
            }
            PipelineIo::LoadRaft | PipelineIo::AppendRaft(_) | PipelineIo::LoadVotes | PipelineIo::LogVote(_) => {
                PipelineIoDone::Loaded(Err(DeviceFailure::WrongDevice(
                    "an organization's database keeps no orderer or vote log",
                )))
            }
        }
    }

    fn append(&self, member: &mut Member, block: LedgerBlock) -> Result<(), DeviceFailure> {
        let number = block.number;
        member.ledger.append(block)?;
        if (number + 1) % self.checkpoint_every == 0 {
            member.checkpoint(number, self.keep_checkpoints)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virga_ledger::tx::SigningKey;

    #[test]
    fn an_orderer_log_on_disk_is_founded_once_and_reads_back_its_appends() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("raft");
        let log = OrdererLog::open(&dir, || vec![b"founding".to_vec()]).unwrap();
        let appended = log.execute(PipelineIo::AppendRaft(vec![b"one".to_vec(), b"two".to_vec()]));
        assert!(matches!(appended, PipelineIoDone::RaftAppended(Ok(()))));
        drop(log);
        let reopened = OrdererLog::open(&dir, || panic!("a log with records is not founded again")).unwrap();
        match reopened.execute(PipelineIo::LoadRaft) {
            PipelineIoDone::LoadedRaft(records) => {
                assert_eq!(records, vec![b"founding".to_vec(), b"one".to_vec(), b"two".to_vec()])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_vote_log_on_disk_keeps_its_votes_and_refuses_a_damaged_record() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("votes");
        let key = SigningKey::from_seed(7);
        let log = VoteLog::open(&dir).unwrap();
        for block in 0..3 {
            let logged = log.execute(PipelineIo::LogVote(SignedVote::sign(&key, "org-1", block, [block as u8; 32])));
            assert!(matches!(logged, PipelineIoDone::VoteLogged(at) if at == block));
        }
        drop(log);
        match VoteLog::open(&dir).unwrap().execute(PipelineIo::LoadVotes) {
            PipelineIoDone::LoadedVotes(votes) => {
                assert_eq!(votes.iter().map(|vote| vote.block).collect::<Vec<_>>(), vec![0, 1, 2]);
                assert_eq!(votes[2].ledger_block_hash, [2; 32]);
            }
            other => panic!("{other:?}"),
        }
        // A record that is no vote (well framed, so the log itself reads it back).
        let (mut raw, _) = RecordLog::open_with(&dir, LogOptions::default(), OpenMode::Repair, |_, _| {}).unwrap();
        raw.append(b"not a vote").unwrap();
        raw.sync().unwrap();
        drop(raw);
        match VoteLog::open(&dir) {
            Err(DeviceError::BadVote { at: 3, .. }) => {}
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a damaged vote log opened"),
        }
    }
}
