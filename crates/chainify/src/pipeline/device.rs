//! The devices the pipeline's cores drive: an organization's database and ledger (one
//! [`Member`], shared with whoever restarts the organization's servers, since the database
//! outlives them), and the orderer's log.

use std::sync::{Arc, Mutex};

use virga_ledger::wlc::{LedgerBlock, SignedVote};

use super::PipelineIo;
use super::PipelineIoDone;
use crate::consortium::{Member, NextBlock};

/// An organization's database and ledger as its execution server's device.
pub struct OrganizationDevice {
    member: Arc<Mutex<Member>>,
    checkpoint_every: u64,
    keep_checkpoints: usize,
}

/// An orderer replica's Raft log: its records in order (kept in memory, outliving the
/// replica's restarts as a device does).
#[derive(Clone, Default)]
pub struct OrdererLog {
    records: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl OrdererLog {
    /// A log that starts with `records` (a founded group's history).
    pub fn with_records(records: Vec<Vec<u8>>) -> OrdererLog {
        OrdererLog { records: Arc::new(Mutex::new(records)) }
    }

    pub fn execute(&self, op: PipelineIo) -> PipelineIoDone {
        let Ok(mut records) = self.records.lock() else {
            return PipelineIoDone::RaftAppended(Err("the orderer log's lock is poisoned".to_string()));
        };
        match op {
            PipelineIo::LoadRaft => PipelineIoDone::LoadedRaft(records.clone()),
            PipelineIo::AppendRaft(more) => {
                records.extend(more);
                PipelineIoDone::RaftAppended(Ok(()))
            }
            _ => PipelineIoDone::RaftAppended(Err("an orderer's log keeps only Raft records".to_string())),
        }
    }
}

/// A commit server's log of its own votes (the newest ones, by block).
#[derive(Clone, Default)]
pub struct VoteLog {
    votes: Arc<Mutex<std::collections::BTreeMap<u64, SignedVote>>>,
}

/// How many blocks of votes a vote log keeps.
const KEPT_VOTES: usize = 1024;

impl VoteLog {
    pub fn execute(&self, op: PipelineIo) -> PipelineIoDone {
        let Ok(mut votes) = self.votes.lock() else {
            return PipelineIoDone::LoadedVotes(Vec::new());
        };
        match op {
            PipelineIo::LogVote(vote) => {
                let block = vote.block;
                votes.insert(block, vote);
                while votes.len() > KEPT_VOTES {
                    votes.pop_first();
                }
                PipelineIoDone::VoteLogged(block)
            }
            _ => PipelineIoDone::LoadedVotes(votes.values().cloned().collect()),
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
            return PipelineIoDone::Loaded(Err("the organization's database lock is poisoned".to_string()));
        };
        match op {
            PipelineIo::Load => {
                let chain = member.ledger.blocks().to_vec();
                let loaded = member.rebuild(&chain, None).map_err(|error| error.to_string());
                PipelineIoDone::Loaded(
                    loaded.map(|_| (chain.len() as u64, chain.last().map_or([0; 32], LedgerBlock::hash))),
                )
            }
            PipelineIo::Execute { number, previous, transactions } => PipelineIoDone::Executed(
                member.execute(number, previous, &transactions).map_err(|error| error.to_string()),
            ),
            PipelineIo::Append(block) => PipelineIoDone::Appended(self.append(&mut member, block)),
            PipelineIo::Recover { number, previous, transactions, consensus } => {
                let chain = member.ledger.blocks().to_vec();
                let next = NextBlock { number, previous, transactions: &transactions, expected: consensus };
                let rebuilt = match member.rebuild(&chain, Some(next)) {
                    Ok((attempts, Some(block))) => self.append(&mut member, block.clone()).map(|()| (block, attempts)),
                    Ok((_, None)) => Err("a rebuild with a block to execute returned none".to_string()),
                    Err(error) => Err(error.to_string()),
                };
                PipelineIoDone::Recovered(rebuilt)
            }
            PipelineIo::LoadRaft | PipelineIo::AppendRaft(_) | PipelineIo::LoadVotes | PipelineIo::LogVote(_) => {
                PipelineIoDone::Loaded(Err("an organization's database keeps no orderer or vote log".to_string()))
            }
        }
    }

    fn append(&self, member: &mut Member, block: LedgerBlock) -> Result<(), String> {
        let number = block.number;
        member.ledger.append(block).map_err(|error| error.to_string())?;
        if (number + 1) % self.checkpoint_every == 0 {
            member.checkpoint(number, self.keep_checkpoints).map_err(|error| error.to_string())?;
        }
        Ok(())
    }
}
