//! Committing built blocks, in order: the block's logical updates go to every storage node;
//! once all have logged it, it is stored, becomes the committed head, its submissions are
//! answered, and it is gossiped to the other miners (whose verdicts are awaited before the
//! next block commits, so followers receive blocks in order). A storage node that cannot be
//! reached is asked again, with a growing back-off, until it answers; an answer refusing
//! the block (or acknowledging another) is final, and the block is abandoned.

use crate::messages::{BlockAnnouncement, BlockUpdates, Request, TxOutcome, Verdict};
use crate::protocol::{Rainblock, Response};
use alloy_primitives::B256;
use std::collections::BTreeSet;
use std::time::Duration;
use virga_net::role::Command;
use virga_net::NetError;

use super::{
    outcomes_reply, AckError, Built, ChainDiskError, MinerCore, MinerIo, Outstanding, Replies, StoreFor, TimerPurpose,
    BLOCK_REFUSED,
};

/// The first back-off before asking an unreachable storage node again; it doubles up to
/// [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The block being committed.
pub(crate) struct Committing {
    pub(crate) built: Built,
    pub(crate) encoded: Vec<u8>,
    /// Each storage node's message (with the header), kept to ask again.
    messages: Vec<(String, BlockUpdates)>,
    /// Storage nodes that have not logged the block yet.
    pub(crate) awaiting: BTreeSet<String>,
    /// Calls and retry timers still open for this block.
    pub(crate) open_calls: usize,
    pub(crate) refusals: Vec<(String, String)>,
    /// Follower verdicts still awaited.
    pub(crate) gossip_awaited: usize,
    /// Gossip already sent (a lying miner sends it before the storage nodes answer).
    pub(crate) gossiped: bool,
    pub(crate) phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Storage,
    Storing,
    Gossip,
}

impl MinerCore {
    /// Starts committing the next built block, unless one is committing already.
    pub(crate) fn start_next_commit(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        while self.committing.is_none() {
            let Some(built) = self.queued.pop_front() else { return };
            if self.layer.epoch != built.epoch {
                // Built on a block refused since: never sent anywhere.
                let number = built.block.header.number;
                self.abandon(number, built.epoch, built.replies, Vec::new(), out);
                continue;
            }
            let encoded = built.block.encode();
            let messages: Vec<(String, BlockUpdates)> = built.updates.clone();
            let awaiting = messages.iter().map(|(peer, _)| peer.clone()).collect();
            let mut committing = Committing {
                built,
                encoded,
                messages,
                awaiting,
                open_calls: 0,
                refusals: Vec::new(),
                gossip_awaited: 0,
                gossiped: false,
                phase: Phase::Storage,
            };
            for (peer, message) in committing.messages.clone() {
                self.send_block(&mut committing, peer, message, FIRST_RETRY_DELAY, out);
            }
            if self.announces_before_commit() {
                self.gossip(&mut committing, out);
            }
            self.committing = Some(committing);
            self.commit_progress(out);
        }
    }

    fn send_block(
        &mut self,
        committing: &mut Committing,
        peer: String,
        message: BlockUpdates,
        next_delay: Duration,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let call = self.ids.call();
        let number = committing.built.block.header.number;
        self.calls.insert(call, Outstanding::ApplyBlock { peer: peer.clone(), number, next_delay });
        committing.open_calls += 1;
        let request = Request::ApplyBlock(Box::new(message));
        out.push(Command::Call { to: peer, call, request, deadline: self.deadline });
    }

    /// A storage node's answer to the block being committed.
    pub(crate) fn block_answered(
        &mut self,
        peer: String,
        number: u64,
        next_delay: Duration,
        result: Result<Response, NetError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let Some(mut committing) = self.committing.take() else { return };
        if committing.built.block.header.number != number || committing.phase != Phase::Storage {
            self.committing = Some(committing);
            return;
        }
        committing.open_calls -= 1;
        let hash = committing.built.hash;
        let refusal = match result {
            Ok(reply) => acknowledged(reply, number, hash).err().map(|error| error.to_string()),
            Err(NetError::Refused { reason, .. }) => Some(reason),
            Err(error) => {
                if committing.refusals.is_empty() {
                    tracing::warn!(
                        miner = %self.config.id, peer = %peer, block = number, %error,
                        "storage node has not logged the block; retrying"
                    );
                    let timer = self.ids.timer();
                    self.timers
                        .insert(timer, TimerPurpose::RetryBlock { peer: peer.clone(), number, delay: next_delay });
                    committing.open_calls += 1;
                    out.push(Command::SetTimer { timer, after: next_delay });
                }
                self.committing = Some(committing);
                return self.commit_progress(out);
            }
        };
        match refusal {
            None => {
                committing.awaiting.remove(&peer);
            }
            Some(reason) => committing.refusals.push((peer, reason)),
        }
        self.committing = Some(committing);
        self.commit_progress(out);
    }

    /// The back-off before asking storage node `peer` again for block `number` is over.
    pub(crate) fn retry_block(
        &mut self,
        peer: String,
        number: u64,
        delay: Duration,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let Some(mut committing) = self.committing.take() else { return };
        if committing.built.block.header.number == number && committing.phase == Phase::Storage {
            committing.open_calls -= 1;
            // Once the block is refused, the calls still retrying stop.
            if committing.refusals.is_empty() {
                if let Some((_, message)) = committing.messages.iter().find(|(to, _)| *to == peer).cloned() {
                    self.send_block(&mut committing, peer, message, (delay * 2).min(MAX_RETRY_DELAY), out);
                }
            }
        }
        self.committing = Some(committing);
        self.commit_progress(out);
    }

    /// Moves the committing block on once its storage calls are settled.
    fn commit_progress(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let Some(committing) = self.committing.as_mut() else { return };
        if committing.phase != Phase::Storage || committing.open_calls > 0 || committing.gossip_awaited > 0 {
            return;
        }
        let number = committing.built.block.header.number;
        if !committing.refusals.is_empty() {
            let Some(committing) = self.committing.take() else { return };
            for (peer, reason) in &committing.refusals {
                tracing::warn!(
                    miner = %self.config.id, peer = %peer, block = number, %reason,
                    "the block was refused; abandoning it"
                );
            }
            let Built { replies, epoch, .. } = committing.built;
            self.abandon(number, epoch, replies, committing.refusals, out);
            return self.start_next_commit(out);
        }
        if !committing.awaiting.is_empty() {
            return;
        }
        committing.phase = Phase::Storing;
        let io = self.ids.io();
        self.stores.insert(io, StoreFor::Committed);
        let (hash, block) = (committing.built.hash, committing.encoded.clone());
        out.push(Command::Io { io, op: MinerIo::Store { number, hash, block } });
    }

    /// The block is stored: it becomes the committed head and its submissions are answered.
    pub(crate) fn stored(&mut self, result: Result<(), ChainDiskError>, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let Some(mut committing) = self.committing.take() else { return };
        let number = committing.built.block.header.number;
        if let Err(error) = result {
            tracing::error!(miner = %self.config.id, block = number, %error, "storing the block failed");
        }
        let hash = committing.built.hash;
        self.layer.committed = committing.built.layer.clone();
        self.layer.committed_hash = hash;
        self.stats.blocks += 1;
        let replies = std::mem::take(&mut committing.built.replies);
        for outcome in replies.iter().flat_map(|(_, _, outcomes)| outcomes).filter(|outcome| outcome.included) {
            self.stats.included += 1;
            if outcome.succeeded {
                self.stats.succeeded += 1;
            } else {
                *self.stats.failed.entry(outcome.reason.clone()).or_default() += 1;
            }
        }
        for (to, call, outcomes) in replies {
            out.push(Command::Reply { to, call, response: outcomes_reply(Some((number, hash)), outcomes) });
        }
        committing.phase = Phase::Gossip;
        if !committing.gossiped {
            self.gossip(&mut committing, out);
        }
        self.committing = Some(committing);
        self.gossip_progress(out);
    }

    /// Sends the committing block with its bag to every peer miner; the next block commits
    /// once every peer that answered its last announcement has given its verdict (so that a
    /// follower receives blocks in order), but a silent peer holds nothing up.
    fn gossip(&mut self, committing: &mut Committing, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        committing.gossiped = true;
        let number = committing.built.block.header.number;
        let (storage, codes) = committing.built.contracts.to_messages();
        let announcement = Box::new(BlockAnnouncement {
            block: committing.built.block.clone(),
            bag: committing.built.bag.clone(),
            storage,
            codes,
        });
        for peer in self.config.peers.clone() {
            let call = self.ids.call();
            let awaited = !self.silent_peers.contains(&peer);
            self.calls.insert(call, Outstanding::Gossip { peer: peer.clone(), number, awaited });
            committing.gossip_awaited += usize::from(awaited);
            let request = Request::Announce(announcement.clone());
            out.push(Command::Call { to: peer, call, request, deadline: self.deadline });
        }
    }

    /// A peer miner's verdict on block `number`.
    pub(crate) fn gossip_answered(
        &mut self,
        peer: String,
        number: u64,
        awaited: bool,
        result: Result<Response, NetError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        if result.is_ok() {
            self.silent_peers.remove(&peer);
        } else {
            self.silent_peers.insert(peer.clone());
        }
        let refusal = match result {
            Ok(reply) => match reply {
                Response::Verdict(Verdict::Accepted) => None,
                Response::Verdict(Verdict::Rejected(reason)) => Some(reason),
                _ => Some("answered an announcement with something else".to_string()),
            },
            Err(error) => {
                tracing::warn!(miner = %self.config.id, peer = %peer, block = number, %error, "gossip failed");
                None
            }
        };
        if let Some(reason) = refusal {
            tracing::warn!(miner = %self.config.id, peer = %peer, block = number, %reason, "peer refused the block");
            self.stats.block_refusals.push((peer, reason));
        }
        if let Some(committing) = self.committing.as_mut().filter(|c| awaited && c.built.block.header.number == number)
        {
            committing.gossip_awaited = committing.gossip_awaited.saturating_sub(1);
        }
        self.gossip_progress(out);
        self.commit_progress(out);
    }

    fn gossip_progress(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let done = self.committing.as_ref().is_some_and(|c| c.phase == Phase::Gossip && c.gossip_awaited == 0);
        if done {
            self.committing = None;
            self.pump(out);
        }
    }

    /// Drops block `number`, built in `epoch`, uncommitted: a storage node refused it or a
    /// block it builds on. If the tip is still in that epoch it goes back to the committed
    /// head in a new epoch, so that blocks built on the dropped one are dropped in turn. Its
    /// transfers are answered as not included (`block_refused`) for their clients to submit
    /// them again. The refusals that caused it are recorded before any client hears of it.
    pub(crate) fn abandon(
        &mut self,
        number: u64,
        epoch: u64,
        replies: Replies,
        refusals: Vec<(String, String)>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let dropped = replies.iter().flat_map(|(_, _, outcomes)| outcomes).filter(|outcome| outcome.included).count();
        self.stats.block_refusals.extend(refusals);
        self.stats.abandoned_blocks += 1;
        *self.stats.aborted.entry(BLOCK_REFUSED.to_string()).or_default() += dropped as u64;
        tracing::warn!(miner = %self.config.id, block = number, transfers = dropped, "block abandoned");
        self.layer.fall_back(epoch);
        for (to, call, outcomes) in replies {
            let outcomes = outcomes
                .into_iter()
                .map(|outcome| {
                    if outcome.included {
                        TxOutcome { included: false, succeeded: false, reason: BLOCK_REFUSED.to_string(), ..outcome }
                    } else {
                        outcome
                    }
                })
                .collect();
            out.push(Command::Reply { to, call, response: outcomes_reply(None, outcomes) });
        }
    }
}

/// A storage node's answer to `ApplyBlock` must acknowledge that very block.
fn acknowledged(reply: Response, number: u64, hash: B256) -> Result<(), AckError> {
    let Response::BlockAck(acked) = reply else {
        return Err(AckError::NotAnAck);
    };
    match acked.pair() {
        acked if acked == (number, hash) => Ok(()),
        (acked, acked_hash) => Err(AckError::OtherBlock { acked, acked_hash, number, hash }),
    }
}
