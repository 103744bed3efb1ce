//! A follower: blocks announced by another miner are verified off the core, one at a time
//! in arrival order (a [`VerifyJob`] the driver runs on its pool: re-executed from this
//! miner's own top layer and the block's bag, never trusted), then stored and adopted.
//!
//! A block is verified on a copy of the tip as it was when its job was handed out. If the
//! tip is still that one when the job completes, the block is adopted (and blocks this miner
//! is building on that tip are dropped: the tip's epoch moves); if the tip moved meanwhile
//! (a block of its own built on it, or the tip fell back), what it was checked against is
//! gone, and it is verified again on the tip as it is now. Either way a block is adopted
//! only on the tip it was verified on, as when verification ran inside the step.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::messages::{BlockAnnouncement, Response, Verdict};
use crate::protocol::Rainblock;
use alloy_primitives::B256;
use virga_net::role::{CallId, Command, IoId};

use super::verify_job::{VerifyJob, VerifyOutcome};
use super::{ChainDiskError, MinerCore, MinerIo, StoreFor};

/// Announced blocks: the one being verified, and those waiting for it.
#[derive(Debug, Default)]
pub(crate) struct Following {
    verifying: Option<Verifying>,
    waiting: VecDeque<(String, CallId, BlockAnnouncement)>,
}

#[derive(Debug)]
struct Verifying {
    io: IoId,
    from: String,
    call: CallId,
    /// The tip's epoch and hash when the job was handed out.
    epoch: u64,
    tip: B256,
}

impl Following {
    pub(crate) fn is_idle(&self) -> bool {
        self.verifying.is_none() && self.waiting.is_empty()
    }
}

impl MinerCore {
    /// A block from another miner: verified in its turn; the verdict goes back once it is
    /// refused, or once it is stored.
    pub(crate) fn announced(
        &mut self,
        from: String,
        call: CallId,
        announcement: BlockAnnouncement,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        self.following.waiting.push_back((from, call, announcement));
        self.verify_next(out);
    }

    fn verify_next(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if self.following.verifying.is_some() {
            return;
        }
        if let Some((from, call, announcement)) = self.following.waiting.pop_front() {
            self.start_verifying(from, call, announcement, out);
        }
    }

    fn start_verifying(
        &mut self,
        from: String,
        call: CallId,
        announcement: BlockAnnouncement,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let tip = self.layer.tip.clone();
        let job =
            VerifyJob::new(Arc::clone(&self.config), tip, self.layer.pruning, announcement, self.skips_block_check());
        let io = self.ids.io();
        let (epoch, tip) = (self.layer.epoch, self.layer.tip.header.hash_slow());
        self.following.verifying = Some(Verifying { io, from, call, epoch, tip });
        out.push(Command::Io { io, op: MinerIo::Verify(Box::new(job)) });
    }

    /// The announced block's verification ended: adopted and stored, refused, or verified
    /// again if the tip it was checked on is gone.
    pub(crate) fn verified(&mut self, io: IoId, outcome: VerifyOutcome, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if self.following.verifying.as_ref().map(|verifying| verifying.io) != Some(io) {
            return;
        }
        let Some(Verifying { from, call, epoch, tip, .. }) = self.following.verifying.take() else { return };
        let VerifyOutcome { verdict, announcement, pruning, stats } = outcome;
        if (self.layer.epoch, self.layer.tip.header.hash_slow()) != (epoch, tip) {
            self.start_verifying(from, call, announcement, out);
            return;
        }
        self.stats.absorb(stats);
        self.layer.pruning = pruning;
        match verdict {
            Ok(verified) => {
                self.layer.committed = verified.layer.clone();
                self.layer.committed_hash = verified.hash;
                self.layer.tip = verified.layer;
                // A block this miner built or is building on the old tip must not commit.
                self.layer.epoch += 1;
                let io = self.ids.io();
                self.stores.insert(io, StoreFor::Followed { from, call });
                let (number, hash, block) = (verified.number, verified.hash, verified.encoded);
                out.push(Command::Io { io, op: MinerIo::Store { number, hash, block } });
            }
            Err(reason) => {
                tracing::warn!(miner = %self.config.id, peer = %from, %reason, "announced block refused");
                self.stats.refused_blocks += 1;
                let verdict = Verdict::Rejected(reason.to_string());
                out.push(Command::Reply { to: from, call, response: Response::Verdict(verdict) });
            }
        }
        self.verify_next(out);
    }

    /// The followed block is stored (or storing it failed: the verdict says so).
    pub(crate) fn followed_stored(
        &mut self,
        from: String,
        call: CallId,
        result: Result<(), ChainDiskError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        let verdict = match result {
            Ok(()) => {
                self.stats.verified_blocks += 1;
                Verdict::Accepted
            }
            Err(reason) => Verdict::Rejected(format!("storing the block failed: {reason}")),
        };
        out.push(Command::Reply { to: from, call, response: Response::Verdict(verdict) });
    }
}
