//! The block builder: executes transactions from the pool on the parent's state, leaves out
//! the ones execution refuses, fills in the header (base fee, roots, gas, logs bloom) and
//! mines the proof of work.

use alloy_consensus::Header;
use alloy_primitives::{Address, Bytes};
use virga_evm::{BlockHashes, Refused, WorldState};

use crate::block::{transactions_root, Block};
use crate::exec::{execute, next_base_fee, BlockOutcome, StateError};
use crate::pow::mine;
use crate::tx::RecoveredTx;
use crate::verify::{max_transactions, ChainConfig};

/// A built block with its execution results.
pub struct Built {
    pub block: Block,
    pub outcome: BlockOutcome,
    /// Candidates left out because execution refused them; `index` is the position among
    /// the candidates handed to the builder.
    pub refused: Vec<Refused>,
    /// Nonces tried before the work was found.
    pub attempts: u64,
}

/// Builds the child of `parent` from `candidates` (already in block order), advancing
/// `state` (the parent's state) to the block's state.
///
/// The timestamp is raised to one after the parent's when the clock has not moved, so blocks
/// built in quick succession stay valid. Candidates beyond what the gas limit admits are
/// left out (see [`max_transactions`]), and so is every candidate execution refuses
/// (Ethereum's rule: an invalid transaction is not in a block). The block is not verified
/// here: [`crate::chain::Chain`] verifies what it appends.
#[allow(clippy::too_many_arguments)]
pub fn build_block<S: WorldState>(
    config: &ChainConfig,
    parent: &Header,
    state: &mut S,
    hashes: &dyn BlockHashes,
    candidates: Vec<RecoveredTx>,
    beneficiary: Address,
    timestamp: u64,
    pool: &rayon::ThreadPool,
) -> Result<Built, StateError> {
    // A block holds at most what its gas limit admits; the rest waits for the next block.
    let mut candidates = candidates;
    candidates.truncate(max_transactions(config.gas_limit));
    let mut header = Header {
        parent_hash: parent.hash_slow(),
        beneficiary,
        difficulty: config.difficulty,
        number: parent.number.saturating_add(1),
        gas_limit: config.gas_limit,
        timestamp: timestamp.max(parent.timestamp.saturating_add(1)),
        extra_data: Bytes::from_static(b"virga"),
        base_fee_per_gas: Some(next_base_fee(parent)),
        ..Header::default()
    };
    let txs: Vec<_> = candidates.iter().map(RecoveredTx::to_eth).collect();
    let mut outcome = execute(state, &config.exec, &header, hashes, &txs, Some(pool))?;
    let refused = std::mem::take(&mut outcome.executed.refused);
    let mut candidates: Vec<Option<RecoveredTx>> = candidates.into_iter().map(Some).collect();
    let transactions: Vec<_> = outcome
        .executed
        .included
        .iter()
        .filter_map(|&index| candidates.get_mut(index).and_then(Option::take))
        .map(|recovered| recovered.tx)
        .collect();
    // Positions now refer to the block's transactions.
    outcome.executed.included = (0..transactions.len()).collect();
    header.state_root = state.state_root(Some(pool));
    header.transactions_root = transactions_root(&transactions);
    header.receipts_root = outcome.executed.receipts_root();
    header.logs_bloom = outcome.executed.logs_bloom;
    header.gas_used = outcome.gas_used();
    let attempts = mine(&mut header, 0);
    Ok(Built { block: Block { header, transactions }, outcome, refused, attempts })
}
