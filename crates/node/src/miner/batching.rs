//! What the next block is built from: the submissions waiting, in arrival order, up to the
//! block's transfer bound, and a copy of the tip; the block itself is built off the core
//! ([`super::BuildJob`]).

use std::sync::Arc;

use virga_ledger::verify::max_transactions;
use virga_net::role::Nanos;

use super::{BuildJob, MinerCore, Pending};

impl MinerCore {
    /// Submissions for the next block, up to the block's transfer bound.
    pub(crate) fn take_batch(&mut self) -> Vec<Pending> {
        let limit = self.config.max_block_transfers.min(max_transactions(self.config.chain.gas_limit)).max(1);
        let (mut taken, mut count) = (0, 0);
        for pending in &self.inbox {
            let size = pending.submission.transactions.len();
            if count > 0 && taken + size > limit {
                break;
            }
            taken += size;
            count += 1;
        }
        self.inbox.drain(..count).collect()
    }

    /// The job that builds `batch` on the tip, timestamped from `now`.
    pub(crate) fn build_job(&self, now: Nanos, batch: Vec<Pending>) -> BuildJob {
        BuildJob::new(
            Arc::clone(&self.config),
            self.layer.tip.clone(),
            self.layer.epoch,
            now,
            batch,
            self.layer.pruning,
            self.builds_wrong_roots(),
        )
    }
}
