//! A block's transactions through revm, one after another, over a [`BlockOverlay`] of the
//! DSM-Tree: Virga's serial executor. Receipts carry Ethereum's status, cumulative gas,
//! logs and logs bloom; an invalid transaction is left out of the block (Ethereum's rule),
//! with the reason.

use alloy_consensus::{Eip658Value, Receipt as AlloyReceipt, ReceiptEnvelope, ReceiptWithBloom};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Bloom, Log, B256};
use revm::context::result::ExecutionResult;
use revm::context::TxEnv;
use revm::{Context, ExecuteCommitEvm, MainBuilder, MainContext};
use virga_trie::account::StateTrie;
use virga_trie::Trie;

use crate::db::{BlockHashes, StateDb, StateError, StateSource, WorldState};
use crate::executor::{BlockContext, ExecError};
use crate::overlay::{BlockOverlay, BlockSeen, BlockWrites, ReadCache};
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

fn execute_over(
    overlay: BlockOverlay<'_>,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, BlockWrites, BlockSeen), StateError> {
    let cfg = block.cfg();
    let block_env = block.block_env(&cfg);
    let mut evm = Context::mainnet().with_db(overlay).with_cfg(cfg).with_block(block_env).build_mainnet();
    let executed = execute_in_order(block, txs, |env| evm.transact_commit(env).map_err(ExecError::from))?;
    let (writes, seen) = evm.ctx.journaled_state.database.finish();
    Ok((executed, writes, seen))
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

/// A state with its executor's [`ReadCache`]: blocks execute over the trie with hot
/// accounts and slots served from memory. The state changes only through
/// [`CachedState::execute_block`], which keeps the cache equal to it.
///
/// Write-through (the default) puts each block's writes into the trie as the block ends.
/// Write-back ([`Self::with_write_back`]) keeps them in the cache until the state or its
/// root is asked for, or the cache is full: the trie's updates then happen once for many
/// blocks, where the root is needed, as a full node computes roots apart from execution.
#[derive(Clone)]
pub struct CachedState {
    state: StateTrie,
    cache: ReadCache,
    capacity: usize,
    write_back: bool,
    pending: Vec<BlockWrites>,
}

impl CachedState {
    /// Entries (accounts plus slots) the cache holds by default.
    pub const DEFAULT_CAPACITY: usize = 1 << 21;

    pub fn new(state: StateTrie, capacity: usize) -> Self {
        Self { state, cache: ReadCache::new(), capacity, write_back: false, pending: Vec::new() }
    }

    pub fn with_write_back(mut self, write_back: bool) -> Self {
        self.flush();
        self.write_back = write_back;
        self
    }

    /// The state after every executed block.
    pub fn state(&mut self) -> &StateTrie {
        self.flush();
        &self.state
    }

    pub fn into_state(mut self) -> StateTrie {
        self.flush();
        self.state
    }

    /// The state root (storage roots of changed accounts recorded first).
    pub fn root(&mut self) -> B256 {
        self.flush();
        self.state.root()
    }

    /// Puts the pending blocks' writes into the trie, in order.
    pub fn flush(&mut self) {
        for writes in self.pending.drain(..) {
            writes.apply_to(&mut self.state);
        }
        self.cache.written();
    }

    /// Executes a block as [`Self::execute_block`] does, with [`crate::parallel`]'s executor
    /// on rayon's pool (serially where it says the block needs to).
    pub fn execute_block_parallel(
        &mut self,
        hashes: &dyn BlockHashes,
        block: &BlockContext,
        txs: &[EthTransaction],
    ) -> Result<(ExecutedBlock, ParallelStats), StateError> {
        let base = StateDb::new(&self.state, hashes);
        let (executed, writes, seen, stats) = match execute_parallel(base, Some(&self.cache), block, txs) {
            Ok(done) => done,
            Err((error, _)) => return Err(error),
        };
        if stats.serial.is_some() {
            return Ok((self.execute_block(hashes, block, txs)?, stats));
        }
        self.finish_block(writes, seen);
        Ok((executed, stats))
    }

    fn finish_block(&mut self, writes: BlockWrites, seen: BlockSeen) {
        if self.write_back {
            self.pending.push(writes);
        } else {
            writes.apply_to(&mut self.state);
        }
        self.cache.absorb(seen, self.write_back);
        if self.cache.len() > self.capacity {
            // Start over, once the trie holds everything the cache answered for.
            self.flush();
            self.cache = ReadCache::new();
        }
    }

    /// Executes a block as [`execute_block`] does, reading through the cache.
    pub fn execute_block(
        &mut self,
        hashes: &dyn BlockHashes,
        block: &BlockContext,
        txs: &[EthTransaction],
    ) -> Result<ExecutedBlock, StateError> {
        let overlay = BlockOverlay::new(StateDb::new(&self.state, hashes), Some(&self.cache), 2 * txs.len());
        let (executed, writes, seen) = execute_over(overlay, block, txs)?;
        self.finish_block(writes, seen);
        Ok(executed)
    }
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
