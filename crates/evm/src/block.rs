//! A block's transactions through revm, one after another, over a [`BlockOverlay`] of the
//! DSM-Tree: Virga's serial executor. Receipts carry Ethereum's status, cumulative gas,
//! logs and logs bloom; an invalid transaction is left out of the block (Ethereum's rule),
//! with the reason.

use alloy_consensus::{Eip658Value, Receipt as AlloyReceipt, ReceiptEnvelope, ReceiptWithBloom};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Bloom, Log, B256};
use revm::context::result::ExecutionResult;
use revm::context::TxEnv;
use revm::database_interface::{Database, DatabaseCommit};
use revm::{Context, ExecuteCommitEvm, MainBuilder, MainContext};
use virga_trie::Trie;

use crate::db::{BlockHashes, StateDb, StateError, StateSource, WorldState};
use crate::executor::{BlockContext, ExecError};
use crate::overlay::{BlockOverlay, BlockSeen, BlockWrites};
use crate::parallel::{execute_parallel, ParallelStats};
use crate::transaction::EthTransaction;

/// A transaction's receipt, as Ethereum's receipts root commits to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The transaction's EIP-2718 type: the receipt is encoded with it.
    pub tx_type: u8,
    pub tx_hash: B256,
    /// EIP-658: 1 when the transaction succeeded, 0 when it reverted or halted.
    pub success: bool,
    pub gas_used: u64,
    /// Gas used by this and every earlier transaction of the block.
    pub cumulative_gas_used: u64,
    pub logs: Vec<Log>,
}

impl Receipt {
    pub fn bloom(&self) -> Bloom {
        self.logs.iter().collect()
    }

    /// The EIP-2718 encoding: a type byte (none for legacy) and the RLP of
    /// `[status, cumulative gas, bloom, logs]`.
    pub fn encoded(&self) -> Vec<u8> {
        let receipt = AlloyReceipt {
            status: Eip658Value::Eip658(self.success),
            cumulative_gas_used: self.cumulative_gas_used,
            logs: self.logs.clone(),
        };
        let with_bloom = ReceiptWithBloom::new(receipt, self.bloom());
        let envelope = match self.tx_type {
            1 => ReceiptEnvelope::Eip2930(with_bloom),
            2 => ReceiptEnvelope::Eip1559(with_bloom),
            3 => ReceiptEnvelope::Eip4844(with_bloom),
            4 => ReceiptEnvelope::Eip7702(with_bloom),
            _ => ReceiptEnvelope::Legacy(with_bloom),
        };
        envelope.encoded_2718()
    }
}

/// The root of the trie from RLP(index) to each receipt's encoding.
pub fn receipts_root(receipts: &[Receipt]) -> B256 {
    let mut trie = Trie::new();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
        receipts.iter().enumerate().map(|(index, receipt)| (alloy_rlp::encode(index), receipt.encoded())).collect();
    trie.insert_many(pairs);
    trie.root_hash()
}

/// A transaction the block leaves out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Its position in the list handed to the executor.
    pub index: usize,
    pub tx_hash: B256,
    pub reason: ExecError,
}

/// What executing a block's transactions gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutedBlock {
    /// One per included transaction, in order.
    pub receipts: Vec<Receipt>,
    /// Positions (in the input) of the included transactions.
    pub included: Vec<usize>,
    pub refused: Vec<Refused>,
    pub gas_used: u64,
    pub logs_bloom: Bloom,
    /// The calls' return data (or deployed code), per included transaction.
    pub outputs: Vec<alloy_primitives::Bytes>,
}

impl ExecutedBlock {
    pub fn receipts_root(&self) -> B256 {
        receipts_root(&self.receipts)
    }
}

/// Executes `txs` in order in `block` over `state` and returns the outcome with the
/// block's writes, which [`WorldState::apply`] puts into the state. A transaction that is
/// invalid, or whose gas limit exceeds what the block has left, is refused and changes
/// nothing; an error means the state itself could not be read.
pub fn execute_block_writes(
    state: &dyn StateSource,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, BlockWrites), StateError> {
    let (executed, writes, _) =
        execute_over(BlockOverlay::new(StateDb::new(state, hashes), None, 2 * txs.len()), block, txs)?;
    Ok((executed, writes))
}

pub(crate) fn execute_over(
    overlay: BlockOverlay<'_>,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, BlockWrites, Option<BlockSeen>), StateError> {
    let (executed, overlay) = execute_with(overlay, block, txs)?;
    let (writes, seen) = overlay.finish();
    Ok((executed, writes, seen))
}

/// `txs` executed in order by revm over `db`, each valid one committed into it; `db` back.
pub(crate) fn execute_with<DB: Database<Error = StateError> + DatabaseCommit>(
    db: DB,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, DB), StateError> {
    let cfg = block.cfg();
    let block_env = block.block_env(&cfg);
    let mut evm = Context::mainnet().with_db(db).with_cfg(cfg).with_block(block_env).build_mainnet();
    let executed = execute_in_order(block, txs, |env| evm.transact_commit(env).map_err(ExecError::from))?;
    Ok((executed, evm.ctx.journaled_state.database))
}

/// [`execute_block`] with [`crate::parallel`]'s executor on rayon's pool (serially where it
/// says the block needs to).
pub fn execute_block_parallel<S: WorldState>(
    state: &mut S,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, ParallelStats), StateError> {
    let (executed, writes, stats) = execute_block_parallel_writes(&*state, hashes, block, txs)?;
    state.apply(&writes)?;
    Ok((executed, stats))
}

/// [`execute_block_writes`] with [`crate::parallel`]'s executor on rayon's pool (serially
/// where it says the block needs to).
pub fn execute_block_parallel_writes(
    state: &dyn StateSource,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, BlockWrites, ParallelStats), StateError> {
    let (executed, writes, _, stats) = match execute_parallel(StateDb::new(state, hashes), None, block, txs) {
        Ok(done) => done,
        Err((error, _)) => return Err(error),
    };
    if stats.serial.is_some() {
        let (executed, writes) = execute_block_writes(state, hashes, block, txs)?;
        return Ok((executed, writes, stats));
    }
    Ok((executed, writes, stats))
}

/// [`execute_block_writes`], its writes applied to `state`.
pub fn execute_block<S: WorldState>(
    state: &mut S,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<ExecutedBlock, StateError> {
    let (executed, writes) = execute_block_writes(&*state, hashes, block, txs)?;
    state.apply(&writes)?;
    Ok(executed)
}

/// The block rule every executor shares (and a peer that drives revm itself can reuse):
/// `txs` in order, each refused if its gas limit exceeds what the block has left, if
/// `transact` refuses it, or if it reaches what a partial state does not hold (its
/// witnesses fell short: `missing_witness`, and nothing it did stays); any other state
/// error ends the block.
pub fn execute_in_order(
    block: &BlockContext,
    txs: &[EthTransaction],
    mut transact: impl FnMut(TxEnv) -> Result<ExecutionResult, ExecError>,
) -> Result<ExecutedBlock, StateError> {
    let mut executed = ExecutedBlock::default();
    for (index, tx) in txs.iter().enumerate() {
        let env = tx.tx_env();
        let left = block.gas_limit.saturating_sub(executed.gas_used);
        if env.gas_limit > left {
            let reason = ExecError::BlockGasExhausted { gas_limit: env.gas_limit, left };
            executed.refused.push(Refused { index, tx_hash: tx.hash(), reason });
            continue;
        }
        match transact(env) {
            Ok(result) => record(&mut executed, index, tx, result),
            Err(ExecError::State(error)) if !error.is_not_held() => return Err(error),
            Err(reason) => executed.refused.push(Refused { index, tx_hash: tx.hash(), reason }),
        }
    }
    Ok(executed)
}

pub(crate) fn record(executed: &mut ExecutedBlock, index: usize, tx: &EthTransaction, result: ExecutionResult) {
    let bloom = result.logs().iter().collect();
    record_with_bloom(executed, index, tx, result, bloom);
}

/// [`record`] with the receipt's bloom computed already (by a parallel worker).
pub(crate) fn record_with_bloom(
    executed: &mut ExecutedBlock,
    index: usize,
    tx: &EthTransaction,
    result: ExecutionResult,
    bloom: Bloom,
) {
    let gas_used = result.tx_gas_used();
    executed.gas_used += gas_used;
    let output = result.output().cloned().unwrap_or_default();
    let receipt = Receipt {
        tx_type: tx.envelope().tx_type() as u8,
        tx_hash: tx.hash(),
        success: result.is_success(),
        gas_used,
        cumulative_gas_used: executed.gas_used,
        logs: result.into_logs(),
    };
    executed.logs_bloom.accrue_bloom(&bloom);
    executed.receipts.push(receipt);
    executed.included.push(index);
    executed.outputs.push(output);
}
