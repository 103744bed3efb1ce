//! Verifying a block another miner announced: checked on a copy of the tip it arrived on
//! and re-executed on the top layer with the block's bag attached (never trusted). The core
//! hands it out as a device operation ([`super::MinerIo::Verify`]) and adopts the block on
//! its completion (`follower`); this module is the job's body, which only the driver runs,
//! on its execution pool. It is no part of the core.

use alloy_primitives::{keccak256, B256};
use std::sync::Arc;
use virga_evm::PartialState;
use virga_ledger::verify::{check_block, execute_block, ExecMode};

use super::build_job::attach_bag;
use super::contract_bags::ContractBags;
use super::top_layer::{kept_through_prune, record_paths, Layer, Pruning, WRITE_ALLOWANCE_BYTES};
use super::{AnnouncementRefusal, MinerConfig, MinerStats};
use crate::codec::check_keys;
use crate::messages::BlockAnnouncement;

/// Verifying one announced block on a copy of the tip.
pub struct VerifyJob {
    config: Arc<MinerConfig>,
    tip: Layer,
    pruning: Pruning,
    announcement: BlockAnnouncement,
    /// [`super::MinerFault::SkipBlockCheck`]: the announced root is adopted unexecuted.
    skip_check: bool,
}

/// A block that verified: its number, hash, the layer after it, and its encoding to store.
pub(crate) struct Verified {
    pub(crate) number: u64,
    pub(crate) hash: B256,
    pub(crate) layer: Layer,
    pub(crate) encoded: Vec<u8>,
}

/// What a [`VerifyJob`] hands back: the verdict, the announcement (to verify again if the
/// tip moved meanwhile), and the pruning state and counters of the copy it verified on.
pub struct VerifyOutcome {
    pub(crate) verdict: Result<Verified, AnnouncementRefusal>,
    pub(crate) announcement: BlockAnnouncement,
    pub(crate) pruning: Pruning,
    pub(crate) stats: MinerStats,
}

impl std::fmt::Debug for VerifyJob {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("VerifyJob")
            .field("tip", &self.tip.header.number)
            .field("block", &self.announcement.block.header.number)
            .field("transactions", &self.announcement.block.transactions.len())
            .finish()
    }
}

impl std::fmt::Debug for VerifyOutcome {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("VerifyOutcome")
            .field("block", &self.announcement.block.header.number)
            .field("verified", &self.verdict.is_ok())
            .finish()
    }
}

impl VerifyJob {
    pub(crate) fn new(
        config: Arc<MinerConfig>,
        tip: Layer,
        pruning: Pruning,
        announcement: BlockAnnouncement,
        skip_check: bool,
    ) -> VerifyJob {
        VerifyJob { config, tip, pruning, announcement, skip_check }
    }

    /// Transactions of the announced block (the simulator's cost model charges per one).
    pub fn transactions(&self) -> usize {
        self.announcement.block.transactions.len()
    }

    /// Verifies the block on `pool`.
    pub fn run(mut self, pool: &rayon::ThreadPool) -> VerifyOutcome {
        let mut stats = MinerStats::default();
        let verdict = self.verify(pool, &mut stats);
        let VerifyJob { tip, pruning, announcement, .. } = self;
        let verdict = verdict.map(|(number, hash, encoded)| Verified { number, hash, layer: tip, encoded });
        VerifyOutcome { verdict, announcement, pruning, stats }
    }

    /// Verifies the block on the tip's copy, which then holds the layer after it; returns
    /// the block's number, hash and encoding.
    fn verify(
        &mut self,
        pool: &rayon::ThreadPool,
        stats: &mut MinerStats,
    ) -> Result<(u64, B256, Vec<u8>), AnnouncementRefusal> {
        let BlockAnnouncement { block, bag, storage, codes } = &self.announcement;
        check_keys(&bag.keys).map_err(AnnouncementRefusal::BagKeys)?;
        let chain = self.config.chain;
        let transactions = check_block(&chain, &self.tip.header, block, None, ExecMode::Parallel, pool)?;
        let layer = &mut self.tip;
        let contracts =
            ContractBags::from_messages(storage.clone(), codes.clone()).map_err(AnnouncementRefusal::BagKeys)?;
        let grown = attach_bag(&mut layer.top.accounts, bag)?
            + contracts.attach(&mut layer.top).map_err(AnnouncementRefusal::ContractBag)?;
        record_paths(&mut layer.unpruned, bag.keys.iter().map(|key| B256::from_slice(key)));
        let verified = if self.skip_check {
            None
        } else {
            let top = std::mem::take(&mut layer.top);
            let hashes = &layer.hashes;
            Some(execute_block(&chain, top, hashes, block, transactions, ExecMode::Parallel, pool)?)
        };
        let beneficiary = keccak256(block.header.beneficiary);
        let no_writes = virga_evm::BlockWrites::default();
        let writes = verified.as_ref().map_or(&no_writes, |verified| &verified.outcome.writes);
        let keep = kept_through_prune(self.config.beneficiary, writes);
        if let Some(verified) = verified {
            record_paths(&mut layer.unpruned, verified.outcome.touched_keys().chain([beneficiary]));
            layer.top = verified.state;
        } else {
            // The broken variant adopts the announced root without executing anything.
            layer.top = PartialState::new(virga_trie::PartialTrie::from_root_hash(block.header.state_root));
        }
        let written = 2 * block.transactions.len() + 1;
        let estimated = layer.estimated_bytes + grown + written.saturating_mul(WRITE_ALLOWANCE_BYTES);
        let (budget, retention) = (self.config.top_budget_bytes, self.config.retention);
        layer.estimated_bytes =
            self.pruning.maybe_prune(&mut layer.top, estimated, &mut layer.unpruned, budget, retention, &keep, stats);
        let hash = block.hash();
        let number = block.header.number;
        let encoded = block.encode();
        layer.advance(block.header.clone(), hash);
        Ok((number, hash, encoded))
    }
}
