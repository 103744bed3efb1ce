//! The miner's top layer: the tip it builds on, the committed head it falls back to, and
//! pruning to retention level r when the layer outgrows its memory budget.

use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, B256};
use virga_evm::PartialState;
use virga_ledger::exec::RecentHashes;
use virga_trie::PartialTrie;

use super::MinerStats;

/// The accounts whose paths a prune keeps whole: the beneficiary, which every block credits,
/// and every contract whose storage the block just written changed. A contract's account
/// changes with its storage root, so while calls keep changing a popular contract, every
/// client's witness of it is a block or more behind; the miner, which wrote it, holds it.
pub(crate) fn kept_through_prune(beneficiary: Address, writes: &virga_evm::BlockWrites) -> Vec<B256> {
    let storage_writers = writes
        .accounts
        .iter()
        .filter(|(_, write)| write.info.is_some() && (write.storage_cleared || !write.slots.is_empty()))
        .map(|(address, _)| keccak256(address));
    std::iter::once(keccak256(beneficiary)).chain(storage_writers).collect()
}

/// The keys whose paths in the top layer grew (bags attached, accounts written) since it
/// was last pruned, so a prune walks only those; `None` when unknown or too many to be
/// worth it (after a warm-up, or past [`UNPRUNED_PATHS_LIMIT`]): the next prune walks the
/// whole layer.
pub(crate) type Unpruned = Option<Vec<B256>>;

/// Past this many recorded paths the next prune walks the whole top layer instead.
const UNPRUNED_PATHS_LIMIT: usize = 1 << 16;

/// Every this many prunes, the prune walks the whole top layer and measures it: that
/// removes what pruning along paths leaves (the subtree an insert moves down beside its
/// path) and brings the memory bound (an allowance per write) back to the truth.
const WHOLE_PRUNE_EVERY: u64 = 16;

/// What one written account may add to the top layer at most: a new leaf and the branch
/// that splits the slot it lands in, each with its struct.
pub(crate) const WRITE_ALLOWANCE_BYTES: usize = 1024;

/// Records keys whose paths grew since the last prune.
pub(crate) fn record_paths(unpruned: &mut Unpruned, keys: impl IntoIterator<Item = B256>) {
    if let Some(paths) = unpruned {
        paths.extend(keys);
        if paths.len() > UNPRUNED_PATHS_LIMIT {
            *unpruned = None;
        }
    }
}

/// A block's header with the top layer after it.
#[derive(Clone)]
pub(crate) struct Layer {
    pub(crate) header: Header,
    /// The accounts, and the contracts' storage and code, as far as witnesses reached.
    pub(crate) top: PartialState,
    /// An upper bound of `top.memory_bytes()`, so the layer is walked only when it may be
    /// over budget.
    pub(crate) estimated_bytes: usize,
    pub(crate) unpruned: Unpruned,
    /// Hashes of the blocks up to `header`'s that `BLOCKHASH` reaches (those this miner saw).
    pub(crate) hashes: RecentHashes,
}

impl Layer {
    pub(crate) fn of_root(header: Header) -> Layer {
        let top = PartialState::new(PartialTrie::from_root_hash(header.state_root));
        let estimated_bytes = top.memory_bytes();
        let mut hashes = RecentHashes::default();
        hashes.push(header.number, header.hash_slow());
        Layer { header, top, estimated_bytes, unpruned: None, hashes }
    }

    /// Moves the layer to `header`, the block whose state `top` now holds.
    pub(crate) fn advance(&mut self, header: Header, hash: B256) {
        self.hashes.push(header.number, hash);
        self.header = header;
    }
}

/// The tip (what the next block builds on; blocks are built ahead of their commit) and the
/// committed head (the newest block every storage node has logged: what clients take
/// witnesses at, and where the tip returns when a block is refused).
pub(crate) struct TopLayer {
    pub(crate) tip: Layer,
    /// Raised each time the tip goes back to the committed head because a block was
    /// refused: a block built in an older epoch descends from the refused one.
    pub(crate) epoch: u64,
    pub(crate) committed: Layer,
    pub(crate) committed_hash: B256,
    pub(crate) pruning: Pruning,
}

/// What pruning remembers between blocks; a block built off the core takes a copy and
/// hands back the new one.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pruning {
    /// The layer's size just after the last whole prune (0 before any).
    pruned_bytes: usize,
    /// Prunes so far (every [`WHOLE_PRUNE_EVERY`]th walks the whole layer).
    prunes: u64,
}

impl TopLayer {
    pub(crate) fn new(header: Header) -> TopLayer {
        let hash = header.hash_slow();
        let layer = Layer::of_root(header);
        TopLayer { tip: layer.clone(), epoch: 0, committed: layer, committed_hash: hash, pruning: Pruning::default() }
    }

    /// The committed head: number, hash and state root.
    pub(crate) fn head(&self) -> (u64, B256, B256) {
        (self.committed.header.number, self.committed_hash, self.committed.header.state_root)
    }

    /// The tip goes back to the committed head in a new epoch, if it is still in `epoch`.
    pub(crate) fn fall_back(&mut self, epoch: u64) {
        if self.epoch == epoch {
            self.tip = self.committed.clone();
            self.epoch = epoch + 1;
        }
    }
}

impl Pruning {
    /// Prunes to level `retention` when the layer is over `budget`, and returns the new
    /// upper bound of its memory. While a layer pruned to r fits the budget, a bound past it
    /// is first checked by a walk (the bound counts an allowance per write, so it runs
    /// ahead); once even the pruned layer is over budget, a prune is certain and the walk is
    /// skipped. The prune walks (and copies) only the paths recorded in `unpruned`, except
    /// every [`WHOLE_PRUNE_EVERY`] prunes or when they are unknown. `stats` counts the prune
    /// and the sizes measured.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn maybe_prune(
        &mut self,
        top: &mut PartialState,
        estimated_bytes: usize,
        unpruned: &mut Unpruned,
        budget: usize,
        retention: usize,
        keep: &[B256],
        stats: &mut MinerStats,
    ) -> usize {
        if estimated_bytes <= budget {
            return estimated_bytes;
        }
        if self.pruned_bytes <= budget {
            let measured = top.memory_bytes();
            stats.peak_top_bytes = stats.peak_top_bytes.max(measured);
            if measured <= budget {
                stats.top_bytes = measured;
                return measured;
            }
        }
        stats.prunes += 1;
        self.prunes += 1;
        // Storage tries go back to their top levels and code is dropped: both come again
        // with the bags that need them.
        let contracts_before = top.contracts_memory_bytes();
        top.prune_contracts(retention);
        let contracts_freed = contracts_before.saturating_sub(top.contracts_memory_bytes());
        let bytes = match unpruned.replace(Vec::new()) {
            Some(paths) if self.prunes % WHOLE_PRUNE_EVERY != 0 => estimated_bytes
                .saturating_sub(top.accounts.prune_paths(retention, &paths, keep))
                .saturating_sub(contracts_freed),
            _ => {
                top.accounts.prune_keeping(retention, keep);
                let measured = top.memory_bytes();
                self.pruned_bytes = measured;
                stats.peak_top_bytes = stats.peak_top_bytes.max(measured);
                measured
            }
        };
        stats.top_bytes = bytes;
        bytes
    }
}
