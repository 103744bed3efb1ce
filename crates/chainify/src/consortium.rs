//! The consortium in one process: every block goes to every organization, which executes
//! it on its own database (in parallel, one thread each: the Whatever phase); each builds
//! its LedgerBlock from its effects, and the c-of-k vote decides (the LedgerConsensus
//! phase). An organization whose hash lost recovers from its checkpoints; every K blocks the
//! organizations that committed take a checkpoint and keep the newest few.
//!
//! This is the pipeline's in-process driver: it runs the threads and the database I/O and
//! times the phases. The decisions it takes are pure functions it calls: the vote and the
//! signed votes' checks (`virga_ledger::wlc`) and the order of recovery attempts
//! ([`crate::recovery`]). Each organization hears every vote here, so all of them reach the
//! same outcome. The servers as role cores over a transport come later.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use alloy_primitives::Address;
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{counted_votes, AgreementPolicy, Hash, LedgerBlock, SignedVote, VoteOutcome};

use crate::ledger::{Ledger, LedgerError};
use crate::organization::{BlockEffects, Organization, OrganizationError, Transaction};
use crate::recovery::{attempts, to_drop, Attempt};

#[derive(Debug, Clone)]
pub struct ConsortiumConfig {
    pub policy: AgreementPolicy,
    /// K: a checkpoint after every K-th agreed block.
    pub checkpoint_every: u64,
    /// How many checkpoints each organization keeps (the seed: three).
    pub keep_checkpoints: usize,
}

/// One organization: its database and its copy of the ledger.
pub struct Member {
    pub organization: Box<dyn Organization>,
    pub ledger: Ledger,
    /// The state hash of each checkpoint when it was taken: a restored checkpoint that no
    /// longer has it was changed since, and is skipped as corrupt (a change to rows no
    /// later block touches would otherwise pass the replay unseen).
    pub checkpoint_hashes: BTreeMap<u64, Hash>,
}

/// A block to execute after a rebuild, and the LedgerBlock hash it must reach.
pub struct NextBlock<'a> {
    pub number: u64,
    pub previous: Hash,
    pub transactions: &'a [Transaction],
    pub expected: Hash,
}

impl Member {
    pub fn new(organization: Box<dyn Organization>, ledger: Ledger) -> Member {
        Member { organization, ledger, checkpoint_hashes: BTreeMap::new() }
    }

    /// Executes a block and builds this organization's LedgerBlock from its effects.
    pub fn execute(
        &mut self,
        number: u64,
        previous: Hash,
        transactions: &[Transaction],
    ) -> Result<LedgerBlock, OrganizationError> {
        let effects = self.organization.execute_block(transactions)?;
        Ok(LedgerBlock {
            number,
            transactions: transactions.iter().map(Transaction::sql).collect(),
            successful: effects.successful.clone(),
            digest: effects.digest_hash(),
            previous,
        })
    }

    /// Checkpoints the database after block `number` and drops its oldest checkpoints
    /// beyond `keep`, remembering each kept checkpoint's state hash.
    pub fn checkpoint(&mut self, number: u64, keep: usize) -> Result<(), OrganizationError> {
        self.organization.checkpoint(number)?;
        self.checkpoint_hashes.insert(number, self.organization.state_hash()?);
        let held = self.organization.checkpoints()?;
        for old in to_drop(&held, keep) {
            self.organization.drop_checkpoint(old)?;
            self.checkpoint_hashes.remove(&old);
        }
        Ok(())
    }

    /// Rebuilds the database to the effects of `chain` (the agreed blocks from 0), and then,
    /// if `next` is given, to the effects of executing it with the hash it expects: from the
    /// newest checkpoint that is unchanged since it was taken, then older ones, then a full
    /// replay (the seed's order). Returns the attempts it took, and `next`'s LedgerBlock.
    pub fn rebuild(
        &mut self,
        chain: &[LedgerBlock],
        next: Option<NextBlock<'_>>,
    ) -> Result<(usize, Option<LedgerBlock>), ConsortiumError> {
        let name = self.organization.name().to_string();
        let checkpoints = self.organization.checkpoints()?;
        let target = chain.len() as u64 + u64::from(next.is_some());
        let plan = if target == 0 { vec![Attempt::FullReplay] } else { attempts(&checkpoints, target) };
        for (tried, attempt) in plan.into_iter().enumerate() {
            let from = match attempt {
                Attempt::FromCheckpoint(block) if block as usize >= chain.len() => continue,
                Attempt::FromCheckpoint(block) => {
                    self.organization.restore(block)?;
                    let expected = self.checkpoint_hashes.get(&block).copied();
                    if expected.is_some_and(|expected| self.organization.state_hash().ok() != Some(expected)) {
                        tracing::warn!(org = %name, block, "a checkpoint changed since it was taken: skipped");
                        continue;
                    }
                    block as usize + 1
                }
                Attempt::FullReplay => {
                    self.organization.reset()?;
                    0
                }
            };
            if !self.replays(&chain[from..])? {
                continue;
            }
            let Some(next) = &next else {
                tracing::info!(org = %name, ?attempt, "recovered to the agreed effects");
                return Ok((tried + 1, None));
            };
            let executed = self.execute(next.number, next.previous, next.transactions)?;
            if executed.hash() == next.expected {
                tracing::info!(org = %name, ?attempt, block = next.number, "recovered to the agreed effects");
                return Ok((tried + 1, Some(executed)));
            }
        }
        Err(ConsortiumError::Unrecoverable { org: name, block: target.saturating_sub(1) })
    }

    /// Whether executing `blocks` again gives each one's agreed success bits and digest.
    fn replays(&mut self, blocks: &[LedgerBlock]) -> Result<bool, OrganizationError> {
        for agreed in blocks {
            let replayed = self.organization.execute_block(&replay_transactions(agreed))?;
            if replayed.successful != agreed.successful || replayed.digest_hash() != agreed.digest {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsortiumError {
    #[error(transparent)]
    Organization(#[from] OrganizationError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("block {block}: no LedgerBlock hash reached {agree} votes, even after every organization recovered; the ordering service is suspect")]
    NoConsensus { block: u64, agree: usize },
    #[error(
        "organization {org} cannot reach the agreed effects of block {block} from any checkpoint or a full replay"
    )]
    Unrecoverable { org: String, block: u64 },
    #[error("the organizations' ledgers hold {lengths:?} blocks; they must start from the same agreed chain")]
    LedgersDiffer { lengths: Vec<usize> },
}

/// What one block did.
#[derive(Debug, Clone, Default)]
pub struct BlockReport {
    pub number: u64,
    pub transactions: usize,
    pub successful: usize,
    /// The organizations that recovered, and the attempts each needed.
    pub recovered: Vec<(String, usize)>,
    /// The organizations that could not reach the agreed effects, and why: they lag behind
    /// the chain and try again at the next block.
    pub failed: Vec<(String, String)>,
    /// Wall time of the execution at all organizations (in parallel), of the vote and the
    /// ledger appends, of checkpoints, and of recoveries.
    pub execute: Duration,
    pub agree: Duration,
    pub checkpoint: Duration,
    pub recover: Duration,
    /// Signing the votes and checking them (part of `agree`).
    pub crypto: Duration,
}

pub struct Consortium {
    members: Vec<Member>,
    /// Each organization's signing key, and every organization's address by name: the fixed
    /// membership each commit server checks votes against.
    keys: Vec<SigningKey>,
    addresses: BTreeMap<String, Address>,
    config: ConsortiumConfig,
    chain: Vec<LedgerBlock>,
}

impl Consortium {
    pub fn new(members: Vec<Member>, config: ConsortiumConfig) -> Result<Consortium, ConsortiumError> {
        let lengths: Vec<usize> = members.iter().map(|member| member.ledger.blocks().len()).collect();
        let first = members.first().map(|member| member.ledger.blocks().to_vec()).unwrap_or_default();
        if members.iter().any(|member| member.ledger.blocks() != first.as_slice()) {
            return Err(ConsortiumError::LedgersDiffer { lengths });
        }
        // Keys derived from the member's place, the same on every run (a deployment gives
        // each organization its own).
        let keys: Vec<SigningKey> =
            (0..members.len()).map(|at| SigningKey::from_seed(0x5749_0000 + at as u64)).collect();
        let addresses = members
            .iter()
            .zip(&keys)
            .map(|(member, key)| (member.organization.name().to_string(), key.address()))
            .collect();
        Ok(Consortium { members, keys, addresses, config, chain: first })
    }

    /// The agreed chain.
    pub fn chain(&self) -> &[LedgerBlock] {
        &self.chain
    }

    pub fn members_mut(&mut self) -> &mut [Member] {
        &mut self.members
    }

    /// Orders `transactions` as the next block, has every organization execute it, votes,
    /// and commits or recovers.
    pub fn run_block(&mut self, transactions: &[Transaction]) -> Result<BlockReport, ConsortiumError> {
        let number = self.chain.len() as u64;
        let previous = self.chain.last().map_or([0; 32], LedgerBlock::hash);
        let started = Instant::now();
        let mut blocks = self.execute_everywhere(number, previous, transactions)?;
        let execute = started.elapsed();
        let started = Instant::now();
        let mut crypto = Duration::ZERO;
        let mut agreed = self.vote(number, &blocks, &mut crypto);
        let mut recover = Duration::ZERO;
        if agreed.is_none() {
            // No effects reached the policy: every organization rebuilds its state up to the
            // previous block and executes this one again, then a new vote.
            let rebuilding = Instant::now();
            for at in 0..self.members.len() {
                if let Err(error) = self.recover(at, number.checked_sub(1)) {
                    tracing::warn!(org = self.members[at].organization.name(), %error, "an organization could not rebuild");
                }
            }
            blocks = self.execute_everywhere(number, previous, transactions)?;
            agreed = self.vote(number, &blocks, &mut crypto);
            recover += rebuilding.elapsed();
        }
        let Some(agreed) = agreed else {
            return Err(ConsortiumError::NoConsensus { block: number, agree: self.config.policy.agree });
        };
        self.chain.push(
            blocks
                .iter()
                .flatten()
                .find(|block| block.hash() == agreed)
                .cloned()
                .ok_or(ConsortiumError::NoConsensus { block: number, agree: self.config.policy.agree })?,
        );
        let mut report = BlockReport {
            number,
            transactions: transactions.len(),
            successful: self.chain[number as usize].successful.iter().filter(|ok| **ok).count(),
            execute,
            crypto,
            ..BlockReport::default()
        };
        for (at, block) in blocks.iter().enumerate() {
            if block.as_ref().map(LedgerBlock::hash) == Some(agreed) {
                self.members[at].ledger.append(self.chain[number as usize].clone())?;
            } else {
                let rebuilding = Instant::now();
                let name = self.members[at].organization.name().to_string();
                match self.recover(at, Some(number)) {
                    Ok(tries) => report.recovered.push((name, tries)),
                    Err(error) => {
                        tracing::warn!(org = %name, %error, "an organization could not recover");
                        report.failed.push((name, error.to_string()));
                    }
                }
                recover += rebuilding.elapsed();
            }
        }
        report.agree = started.elapsed().saturating_sub(recover);
        report.recover = recover;
        if (number + 1) % self.config.checkpoint_every.max(1) == 0 {
            let started = Instant::now();
            self.checkpoint(number)?;
            report.checkpoint = started.elapsed();
        }
        Ok(report)
    }

    /// Every organization executes the block at once (one thread each) and builds its
    /// LedgerBlock; an organization whose database failed casts no vote (None).
    fn execute_everywhere(
        &mut self,
        number: u64,
        previous: Hash,
        transactions: &[Transaction],
    ) -> Result<Vec<Option<LedgerBlock>>, ConsortiumError> {
        let effects: Vec<Result<BlockEffects, OrganizationError>> = std::thread::scope(|scope| {
            let running: Vec<_> = self
                .members
                .iter_mut()
                .map(|member| scope.spawn(move || member.organization.execute_block(transactions)))
                .collect();
            running
                .into_iter()
                .map(|thread| thread.join().unwrap_or_else(|_| Err(panicked("executing a block"))))
                .collect()
        });
        Ok(effects
            .into_iter()
            .zip(&self.members)
            .map(|(effects, member)| match effects {
                Ok(effects) => Some(LedgerBlock {
                    number,
                    transactions: transactions.iter().map(Transaction::sql).collect(),
                    successful: effects.successful.clone(),
                    digest: effects.digest_hash(),
                    previous,
                }),
                Err(error) => {
                    tracing::warn!(org = member.organization.name(), %error, "an organization could not execute a block");
                    None
                }
            })
            .collect())
    }

    /// The hash the votes agree on, if one reached the policy. Each organization signs its
    /// LedgerBlock's hash for the block, and every organization checks every vote before
    /// counting it (k × k signature checks, as each commit server makes them); the time
    /// spent signing and checking is added to `crypto`.
    fn vote(&self, number: u64, blocks: &[Option<LedgerBlock>], crypto: &mut Duration) -> Option<Hash> {
        let started = Instant::now();
        let votes: Vec<SignedVote> = blocks
            .iter()
            .zip(&self.members)
            .zip(&self.keys)
            .filter_map(|((block, member), key)| {
                Some(SignedVote::sign(key, member.organization.name(), number, block.as_ref()?.hash()))
            })
            .collect();
        let mut counted = Vec::new();
        for _ in &self.members {
            let refused;
            (counted, refused) = counted_votes(&votes, &self.addresses, number);
            for reason in refused {
                tracing::warn!(%reason, "a vote was refused");
            }
        }
        *crypto += started.elapsed();
        counted.iter().find_map(|(name, own)| match self.config.policy.decide(name, *own, counted.iter().copied()) {
            VoteOutcome::Commit { hash, .. } | VoteOutcome::Recover { consensus: hash, .. } => Some(hash),
            VoteOutcome::Undecided { .. } => None,
        })
    }

    /// Rebuilds organization `at` to the agreed effects up to block `target` (None: empty),
    /// then completes its ledger; returns the attempts it took.
    fn recover(&mut self, at: usize, target: Option<u64>) -> Result<usize, ConsortiumError> {
        let end = target.map_or(0, |target| target as usize + 1);
        let member = &mut self.members[at];
        let (tries, _) = member.rebuild(&self.chain[..end], None)?;
        for block in &self.chain[member.ledger.blocks().len().min(end)..end] {
            member.ledger.append(block.clone())?;
        }
        Ok(tries)
    }

    /// Every organization that holds the agreed chain up to `number` checkpoints it (all at
    /// once, one thread each, as they execute) and drops its oldest checkpoints beyond the
    /// number kept.
    fn checkpoint(&mut self, number: u64) -> Result<(), ConsortiumError> {
        let keep = self.config.keep_checkpoints;
        let results: Vec<Result<(), OrganizationError>> = std::thread::scope(|scope| {
            let running: Vec<_> = self
                .members
                .iter_mut()
                .filter(|member| member.ledger.blocks().len() as u64 == number + 1)
                .map(|member| scope.spawn(move || checkpoint_member(member, number, keep)))
                .collect();
            running.into_iter().map(|thread| thread.join().unwrap_or_else(|_| Err(panicked("checkpointing")))).collect()
        });
        results.into_iter().collect::<Result<(), _>>()?;
        Ok(())
    }
}

fn checkpoint_member(member: &mut Member, number: u64, keep: usize) -> Result<(), OrganizationError> {
    member.checkpoint(number, keep)
}

fn panicked(what: &str) -> OrganizationError {
    OrganizationError::Database {
        org: "?".to_string(),
        what: what.to_string(),
        error: crate::organization::SqlError::Panicked,
    }
}

/// A LedgerBlock's transactions, as the organizations execute them again.
pub fn replay_transactions(block: &LedgerBlock) -> Vec<Transaction> {
    block.transactions.iter().map(|sql| Transaction::new(vec![sql.clone()])).collect()
}
