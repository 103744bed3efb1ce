//! Verification of a block against its parent: header fields, work, transactions root, every
//! signature, and re-execution to the header's gas, state root and receipts root.
//!
//! Nothing in a block is trusted: a verifier that accepts a block has recomputed everything
//! the header commits to from the parent's state.

use alloy_consensus::constants::EMPTY_OMMER_ROOT_HASH;
use alloy_consensus::Header;
use alloy_primitives::{Bloom, B256, U256};
use virga_evm::{BlockHashes, EthTransaction, ExecError, WorldState};
use virga_trie::account::StateTrie;

use crate::block::{transactions_root, Block};
use crate::exec::{execute, next_base_fee, BlockOutcome, ExecConfig, StateError, TRANSFER_GAS};
use crate::pow::{check_work, PowError};
use crate::tx::{recover_all, RecoveredTx, SignedTx, TxError};

/// The rules every block of a chain follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainConfig {
    pub exec: ExecConfig,
    /// Difficulty of every block's proof of work.
    pub difficulty: U256,
    /// Gas limit of every block.
    pub gas_limit: u64,
}

impl Default for ChainConfig {
    fn default() -> Self {
        Self { exec: ExecConfig::default(), difficulty: U256::from(1u64 << 12), gas_limit: 1_000_000_000 }
    }
}

/// How a verifier re-executes a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    /// Recover signatures and execute one transaction after another on the calling thread.
    Serial,
    /// Recover signatures on the pool and execute with the parallel executor on it.
    Parallel,
}

/// What is wrong with a block.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("number {found}, expected {expected}")]
    Number { expected: u64, found: u64 },
    #[error("parent hash {found} is not the previous block's hash {expected}")]
    ParentHash { expected: B256, found: B256 },
    #[error("timestamp {found} is not after the parent's {parent}")]
    Timestamp { parent: u64, found: u64 },
    #[error("difficulty {found}, the chain requires {expected}")]
    Difficulty { expected: U256, found: U256 },
    #[error("gas limit {found}, the chain requires {expected}")]
    GasLimit { expected: u64, found: u64 },
    #[error("the header sets {0}, which blocks of this chain never carry")]
    UnexpectedField(&'static str),
    #[error("gas used {used} is above the gas limit {limit}")]
    GasOverLimit { used: u64, limit: u64 },
    #[error("{count} transactions, above the {max} the gas limit admits")]
    TooManyTransactions { count: usize, max: usize },
    #[error("base fee {found:?}, EIP-1559 gives {expected} after the parent")]
    BaseFee { expected: u64, found: Option<u64> },
    #[error("ommers hash {0} is not the empty list's")]
    Ommers(B256),
    #[error("proof of work: {0}")]
    Work(PowError),
    #[error("stored under hash {stored}, but the header hashes to {computed}")]
    StoredHash { stored: B256, computed: B256 },
    #[error("transactions root {header} in the header, the transactions give {computed}")]
    TransactionsRoot { header: B256, computed: B256 },
    #[error("transaction {index} ({hash}): {source}")]
    Signature { index: usize, hash: B256, source: TxError },
    #[error("gas used {header} in the header, re-execution uses {computed}")]
    GasUsed { header: u64, computed: u64 },
    #[error("state root {header} in the header, re-execution gives {computed}")]
    StateRoot { header: B256, computed: B256 },
    #[error("receipts root {header} in the header, re-execution gives {computed}")]
    ReceiptsRoot { header: B256, computed: B256 },
    #[error("logs bloom in the header differs from the receipts' ({differing} byte(s) differ)")]
    LogsBloom { differing: usize },
    #[error("transaction {index} ({hash}) is invalid and must be left out: {reason}")]
    InvalidTransaction { index: usize, hash: B256, reason: Box<ExecError> },
    #[error("the parent state is damaged: {0}")]
    State(StateError),
}

/// A problem in a numbered block.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("block {number}: {problem}")]
pub struct VerifyError {
    pub number: u64,
    pub problem: Problem,
}

/// A verified block's results.
pub struct Verified<S = StateTrie> {
    /// The state after the block (its root is the header's).
    pub state: S,
    /// Receipts, writes and (parallel execution) the executor's counters.
    pub outcome: BlockOutcome,
    /// The transactions with their recovered senders.
    pub transactions: Vec<EthTransaction>,
}

/// Checks the header against its parent and the chain's rules, and the work.
pub fn check_header(config: &ChainConfig, parent: &Header, header: &Header) -> Result<(), Problem> {
    let expected = parent.number.saturating_add(1);
    if header.number != expected {
        return Err(Problem::Number { expected, found: header.number });
    }
    let parent_hash = parent.hash_slow();
    if header.parent_hash != parent_hash {
        return Err(Problem::ParentHash { expected: parent_hash, found: header.parent_hash });
    }
    if header.timestamp <= parent.timestamp {
        return Err(Problem::Timestamp { parent: parent.timestamp, found: header.timestamp });
    }
    if header.difficulty != config.difficulty {
        return Err(Problem::Difficulty { expected: config.difficulty, found: header.difficulty });
    }
    if header.gas_limit != config.gas_limit {
        return Err(Problem::GasLimit { expected: config.gas_limit, found: header.gas_limit });
    }
    if header.ommers_hash != EMPTY_OMMER_ROOT_HASH {
        return Err(Problem::Ommers(header.ommers_hash));
    }
    let expected = next_base_fee(parent);
    if header.base_fee_per_gas != Some(expected) {
        return Err(Problem::BaseFee { expected, found: header.base_fee_per_gas });
    }
    // Fields after London's, which this chain never sets: a block carrying them is not one
    // of this chain's.
    let unexpected = [
        (header.withdrawals_root.is_some(), "withdrawals_root"),
        (header.blob_gas_used.is_some(), "blob_gas_used"),
        (header.excess_blob_gas.is_some(), "excess_blob_gas"),
        (header.parent_beacon_block_root.is_some(), "parent_beacon_block_root"),
        (header.requests_hash.is_some(), "requests_hash"),
        (header.extra_data.len() > MAX_EXTRA_DATA, "more than 32 bytes of extra_data"),
    ];
    if let Some((_, field)) = unexpected.iter().find(|(present, _)| *present) {
        return Err(Problem::UnexpectedField(field));
    }
    if header.gas_used > header.gas_limit {
        return Err(Problem::GasOverLimit { used: header.gas_used, limit: header.gas_limit });
    }
    check_work(header).map_err(Problem::Work)
}

/// Longest `extra_data` a header may carry (Ethereum's limit).
pub const MAX_EXTRA_DATA: usize = 32;

/// Most transactions a block may hold: each costs at least a transfer's intrinsic gas, so a
/// block cannot be filled with transactions that every verifier must still recover a
/// signature for.
pub fn max_transactions(gas_limit: u64) -> usize {
    usize::try_from(gas_limit / TRANSFER_GAS).unwrap_or(usize::MAX)
}

/// Recovers every sender, naming the first transaction whose signature fails.
pub fn recover_senders(
    block: &Block,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
) -> Result<Vec<EthTransaction>, Problem> {
    let senders = match mode {
        ExecMode::Serial => block.transactions.iter().map(SignedTx::recover_sender).collect(),
        ExecMode::Parallel => pool.install(|| recover_all(&block.transactions)),
    };
    block
        .transactions
        .iter()
        .zip(senders)
        .enumerate()
        .map(|(index, (tx, sender))| match sender {
            Ok(sender) => Ok(RecoveredTx { tx: tx.clone(), sender }.to_eth()),
            Err(source) => Err(Problem::Signature { index, hash: tx.hash(), source }),
        })
        .collect()
}

/// Verifies `block` on top of `parent` and its state `parent_state`. `stored_hash` is the
/// hash the block was stored under, when it came from a store.
#[allow(clippy::too_many_arguments)]
pub fn verify_block(
    config: &ChainConfig,
    parent: &Header,
    parent_state: &StateTrie,
    hashes: &dyn BlockHashes,
    block: &Block,
    stored_hash: Option<B256>,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
) -> Result<Verified, VerifyError> {
    let transactions = check_block(config, parent, block, stored_hash, mode, pool)?;
    execute_block(config, parent_state.clone(), hashes, block, transactions, mode, pool)
}

/// Everything about `block` that does not need the parent's state: its stored hash, header
/// and work against `parent`, transactions root, and every signature. Returns the
/// transactions with their senders. A verifier runs this for the next block while it executes this one.
pub fn check_block(
    config: &ChainConfig,
    parent: &Header,
    block: &Block,
    stored_hash: Option<B256>,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
) -> Result<Vec<EthTransaction>, VerifyError> {
    let number = block.header.number;
    let fail = |problem| VerifyError { number, problem };
    if let Some(stored) = stored_hash {
        let computed = block.hash();
        if computed != stored {
            return Err(fail(Problem::StoredHash { stored, computed }));
        }
    }
    check_header(config, parent, &block.header).map_err(fail)?;
    let max = max_transactions(block.header.gas_limit);
    if block.transactions.len() > max {
        return Err(fail(Problem::TooManyTransactions { count: block.transactions.len(), max }));
    }
    let computed = transactions_root(&block.transactions);
    if computed != block.header.transactions_root {
        return Err(fail(Problem::TransactionsRoot { header: block.header.transactions_root, computed }));
    }
    recover_senders(block, mode, pool).map_err(fail)
}

/// Re-executes a checked block (`transactions` from [`check_block`]) on its parent's state
/// and compares gas, state root, receipts root and logs bloom with the header. Every
/// transaction must be valid: a block that holds one execution refuses is invalid.
///
/// `state` is the parent's state, consumed: a caller that keeps the parent passes a clone
/// (an O(1) snapshot), one that does not saves the copies of shared nodes.
pub fn execute_block<S: WorldState>(
    config: &ChainConfig,
    mut state: S,
    hashes: &dyn BlockHashes,
    block: &Block,
    transactions: Vec<EthTransaction>,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
) -> Result<Verified<S>, VerifyError> {
    let fail = |problem| VerifyError { number: block.header.number, problem };
    let parallel = (mode == ExecMode::Parallel).then_some(pool);
    let outcome = execute(&mut state, &config.exec, &block.header, hashes, &transactions, parallel)
        .map_err(|error| fail(Problem::State(error)))?;
    if let Some(refused) = outcome.executed.refused.first() {
        let (index, hash, reason) = (refused.index, refused.tx_hash, Box::new(refused.reason.clone()));
        return Err(fail(Problem::InvalidTransaction { index, hash, reason }));
    }
    check_results(&mut state, block, &outcome, parallel).map_err(fail)?;
    Ok(Verified { state, outcome, transactions })
}

fn check_results<S: WorldState>(
    state: &mut S,
    block: &Block,
    outcome: &BlockOutcome,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), Problem> {
    let header = &block.header;
    if outcome.gas_used() != header.gas_used {
        return Err(Problem::GasUsed { header: header.gas_used, computed: outcome.gas_used() });
    }
    let computed = state.state_root(pool);
    if computed != header.state_root {
        return Err(Problem::StateRoot { header: header.state_root, computed });
    }
    let computed = outcome.executed.receipts_root();
    if computed != header.receipts_root {
        return Err(Problem::ReceiptsRoot { header: header.receipts_root, computed });
    }
    if outcome.executed.logs_bloom != header.logs_bloom {
        let differing = differing_bytes(&outcome.executed.logs_bloom, &header.logs_bloom);
        return Err(Problem::LogsBloom { differing });
    }
    Ok(())
}

fn differing_bytes(a: &Bloom, b: &Bloom) -> usize {
    a.as_slice().iter().zip(b.as_slice()).filter(|(x, y)| x != y).count()
}
