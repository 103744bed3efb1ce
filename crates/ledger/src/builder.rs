//! The block builder: executes transfers from the pool on the parent's state, fills in the
//! header (roots, gas) and mines the proof of work.

use alloy_consensus::Header;
use alloy_primitives::{Address, Bytes};

use crate::block::{transactions_root, Block};
use crate::exec::{receipts_root, AccountState, BlockOutcome, StateError};
use crate::parallel::execute_staged;
use crate::pow::mine;
use crate::tx::RecoveredTransfer;
use crate::verify::{max_transfers, views, ChainConfig};

/// A built block with its execution results.
pub struct Built {
    pub block: Block,
    pub outcome: BlockOutcome,
    /// Nonces tried before the work was found.
    pub attempts: u64,
}

/// Builds the child of `parent` from `transfers` (already in block order), advancing `state`
/// (the parent's state) to the block's state.
///
/// The timestamp is raised to one after the parent's when the clock has not moved, so blocks
/// built in quick succession stay valid. Transfers beyond what the gas limit admits are left
/// out (see [`max_transfers`]). The block is not verified here: [`crate::chain::Chain`]
/// verifies what it appends.
pub fn build_block<S: AccountState>(
    config: &ChainConfig,
    parent: &Header,
    state: &mut S,
    transfers: Vec<RecoveredTransfer>,
    beneficiary: Address,
    timestamp: u64,
    pool: &rayon::ThreadPool,
) -> Result<Built, StateError> {
    // A block holds at most what its gas limit admits; the rest waits for the next block.
    let mut transfers = transfers;
    transfers.truncate(max_transfers(config.gas_limit));
    let views = views(&transfers);
    let (outcome, _) = execute_staged(state, &views, beneficiary, &config.exec, pool)?;
    let transactions: Vec<_> = transfers.into_iter().map(|recovered| recovered.tx).collect();
    let mut header = Header {
        parent_hash: parent.hash_slow(),
        beneficiary,
        state_root: state.state_root(Some(pool)),
        transactions_root: transactions_root(&transactions),
        receipts_root: receipts_root(&outcome.receipts),
        difficulty: config.difficulty,
        number: parent.number.saturating_add(1),
        gas_limit: config.gas_limit,
        gas_used: outcome.gas_used,
        timestamp: timestamp.max(parent.timestamp.saturating_add(1)),
        extra_data: Bytes::from_static(b"virga"),
        ..Header::default()
    };
    let attempts = mine(&mut header, 0);
    Ok(Built { block: Block { header, transactions }, outcome, attempts })
}
