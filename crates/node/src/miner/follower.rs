//! A follower: blocks announced by another miner are verified from this miner's own top
//! layer and the block's bag (re-executed, never trusted), stored, then adopted.

use crate::messages::{BlockAnnouncement, Response, Verdict};
use crate::protocol::Rainblock;
use alloy_primitives::{keccak256, B256};
use virga_ledger::verify::{check_block, execute_block, ExecMode};
use virga_net::role::{CallId, Command};

use super::building::attach_bag;
use super::contract_bags::ContractBags;
use super::top_layer::{kept_through_prune, record_paths, Layer, WRITE_ALLOWANCE_BYTES};
use super::{AnnouncementRefusal, ChainDiskError, MinerCore, MinerIo, StoreFor};
use crate::codec::check_keys;
use virga_evm::PartialState;

impl MinerCore {
    /// A block from another miner: verified, then stored; the verdict goes back once it is.
    pub(crate) fn announced(
        &mut self,
        from: String,
        call: CallId,
        announcement: BlockAnnouncement,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        match self.verify_announced(announcement) {
            Ok((number, hash, layer, encoded)) => {
                self.layer.committed = layer.clone();
                self.layer.committed_hash = hash;
                self.layer.tip = layer;
                // A block this miner built or is building on the old tip must not commit.
                self.layer.epoch += 1;
                let io = self.ids.io();
                self.stores.insert(io, StoreFor::Followed { from, call });
                out.push(Command::Io { io, op: MinerIo::Store { number, hash, block: encoded } });
            }
            Err(reason) => {
                tracing::warn!(miner = %self.config.id, peer = %from, %reason, "announced block refused");
                self.stats.refused_blocks += 1;
                let verdict = Verdict::Rejected(reason.to_string());
                out.push(Command::Reply { to: from, call, response: Response::Verdict(verdict) });
            }
        }
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

    /// Checks the block on the tip and re-executes it on the top layer with its bag attached;
    /// returns the block's number, hash, the layer after it, and its encoding to store.
    fn verify_announced(
        &mut self,
        announcement: BlockAnnouncement,
    ) -> Result<(u64, B256, Layer, Vec<u8>), AnnouncementRefusal> {
        let BlockAnnouncement { block, bag, storage, codes } = announcement;
        check_keys(&bag.keys).map_err(AnnouncementRefusal::BagKeys)?;
        let chain = self.config.chain;
        let transactions = check_block(&chain, &self.layer.tip.header, &block, None, ExecMode::Parallel, &self.pool)?;
        let mut layer = self.layer.tip.clone();
        let contracts = ContractBags::from_messages(storage, codes).map_err(AnnouncementRefusal::BagKeys)?;
        let grown = attach_bag(&mut layer.top.accounts, &bag)?
            + contracts.attach(&mut layer.top).map_err(AnnouncementRefusal::ContractBag)?;
        record_paths(&mut layer.unpruned, bag.keys.iter().map(|key| B256::from_slice(key)));
        let verified = if self.skips_block_check() {
            None
        } else {
            let top = std::mem::take(&mut layer.top);
            let hashes = &layer.hashes;
            Some(execute_block(&chain, top, hashes, &block, transactions, ExecMode::Parallel, &self.pool)?)
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
        layer.estimated_bytes = self.layer.pruning.maybe_prune(
            &mut layer.top,
            estimated,
            &mut layer.unpruned,
            budget,
            retention,
            &keep,
            &mut self.stats,
        );
        let hash = block.hash();
        let number = block.header.number;
        let encoded = block.encode();
        layer.advance(block.header, hash);
        Ok((number, hash, layer, encoded))
    }
}
