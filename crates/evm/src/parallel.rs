//! Virga's parallel executor: optimistic execution in rounds over a multi-version memory,
//! in the manner of Block-STM, with validation in block order.
//!
//! Round 1 executes every transaction at once (on rayon's pool) against the block's
//! starting state plus the writes earlier transactions of the block made in earlier rounds,
//! each read recorded with the version it saw (the writing transaction and its
//! incarnation, or the state below). Validation walks the block in order: a transaction is
//! valid when every read still sees the same version. The invalid ones run again, at once,
//! in the next round. The lowest invalid transaction always becomes valid in the round
//! after (everything before it is valid), so rounds end; at the fixpoint every read equals
//! what serial execution reads, hence so does every write.
//!
//! A sender's transactions run in order on one worker within a round, each seeing the writes
//! of the ones before it (they depend on one another through the nonce); different senders
//! run in parallel.
//!
//! The fee credit to the block's beneficiary, which every transaction makes, is left out of
//! execution (a handler that skips it) and summed at the end, so that it does not make every
//! transaction depend on the one before. Where that or this design's other assumptions
//! would not hold, the block runs serially instead, and the reason is reported: a
//! transaction that touches the beneficiary itself, creates or destroys an account (storage
//! cleared), runs out of block gas, or pays no fee.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use alloy_primitives::{Address, Bloom, B256, U256};
use dashmap::DashMap;
use foldhash::HashMap;
use rayon::prelude::*;
use revm::bytecode::Bytecode;
use revm::context::result::{EVMError, HaltReason, InvalidTransaction};
use revm::context::{ContextSetters, TxEnv};
use revm::context_interface::{ContextTr, JournalTr, Transaction as _};
use revm::database_interface::{Database, DatabaseRef};
use revm::handler::{EvmTr, EvmTrError, FrameResult, FrameTr, Handler};
use revm::interpreter::interpreter_action::FrameInit;
use revm::state::{AccountInfo, EvmState};
use revm::{Context, ExecuteEvm, MainBuilder, MainContext};

use crate::block::{record_with_bloom, ExecutedBlock, Refused};
use crate::db::{StateDb, StateError};
use crate::executor::{BlockContext, ExecError};
use crate::overlay::{AccountWrite, BlockSeen, BlockWrites, ReadCache};
use crate::transaction::EthTransaction;

/// Why a block ran serially instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SerialReason {
    TouchesBeneficiary,
    StorageCleared,
    BlockGasExhausted,
    NoFee,
}

/// How a parallel execution went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParallelStats {
    pub rounds: usize,
    /// Executions beyond the first of each transaction.
    pub reexecutions: usize,
    pub serial: Option<SerialReason>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Account(Address),
    Slot(Address, U256),
}

#[derive(Clone, Debug)]
enum Value {
    Account(Option<AccountInfo>),
    Slot(U256),
}

/// The version a read saw: a block transaction and its incarnation, or the state below.
type Version = Option<(usize, u32)>;

/// Writes of the block's transactions, by key and writer.
#[derive(Default)]
struct MvMemory {
    entries: HashMap<Key, BTreeMap<usize, (u32, Value)>>,
}

impl MvMemory {
    /// The last write before transaction `index`.
    fn before(&self, key: &Key, index: usize) -> Option<(usize, u32, &Value)> {
        let writes = self.entries.get(key)?;
        let (writer, (incarnation, value)) = writes.range(..index).next_back()?;
        Some((*writer, *incarnation, value))
    }

    fn replace(&mut self, index: usize, old: &[(Key, Value)], new: &[(Key, Value)], incarnation: u32) {
        for (key, _) in old {
            if let Some(writes) = self.entries.get_mut(key) {
                writes.remove(&index);
            }
        }
        for (key, value) in new {
            self.entries.entry(*key).or_default().insert(index, (incarnation, value.clone()));
        }
    }
}

/// The state below the block: the trie, through the executor's cache where it has one,
/// and what the block's transactions already read of it (it does not change during the
/// block, so every transaction may share those reads).
#[derive(Clone, Copy)]
struct Below<'a> {
    base: StateDb<'a>,
    cache: Option<&'a ReadCache>,
    read: &'a DashMap<Key, Value, foldhash::fast::RandomState>,
}

impl Below<'_> {
    fn account(&self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        let key = Key::Account(address);
        if let Some(entry) = self.read.get(&key) {
            if let Value::Account(info) = entry.value() {
                return Ok(info.clone());
            }
        }
        let info = match self.cache.and_then(|cache| cache.account(&address)) {
            Some(info) => info.clone(),
            None => self.base.basic_ref(address)?,
        };
        self.read.insert(key, Value::Account(info.clone()));
        Ok(info)
    }

    fn slot(&self, address: Address, slot: U256) -> Result<U256, StateError> {
        let key = Key::Slot(address, slot);
        if let Some(entry) = self.read.get(&key) {
            if let Value::Slot(value) = entry.value() {
                return Ok(*value);
            }
        }
        let value = match self.cache.and_then(|cache| cache.slot_or_cleared(&address, &slot)) {
            Some(value) => value,
            None => self.base.storage_ref(address, slot)?,
        };
        self.read.insert(key, Value::Slot(value));
        Ok(value)
    }

    fn code(&self, hash: B256) -> Result<Bytecode, StateError> {
        match self.cache.and_then(|cache| cache.code(&hash)) {
            Some(code) => Ok(code.clone()),
            None => self.base.code_by_hash_ref(hash),
        }
    }
}

/// One transaction's view: the block's writes before it over the state below, every read
/// recorded with its version.
struct TxView<'a> {
    below: Below<'a>,
    memory: &'a MvMemory,
    index: usize,
    reads: Vec<(Key, Version)>,
    /// Writes of the same sender's earlier transactions run in this round by this worker,
    /// which the shared memory receives only after the round.
    local: HashMap<Key, (usize, u32, Value)>,
}

impl TxView<'_> {
    /// The last write before this transaction: the shared memory's or a same-sender
    /// predecessor's from this round, whichever transaction is later.
    fn before(&self, key: &Key) -> Option<(usize, u32, Value)> {
        let shared = self.memory.before(key, self.index);
        match (shared, self.local.get(key)) {
            (Some((writer, _, _)), Some(local)) if local.0 >= writer => Some(local.clone()),
            (Some((writer, incarnation, value)), _) => Some((writer, incarnation, value.clone())),
            (None, local) => local.cloned(),
        }
    }
}

impl Database for TxView<'_> {
    type Error = StateError;

    fn basic(&mut self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        let key = Key::Account(address);
        if let Some((writer, incarnation, Value::Account(info))) = self.before(&key) {
            self.reads.push((key, Some((writer, incarnation))));
            return Ok(info);
        }
        self.reads.push((key, None));
        self.below.account(address)
    }

    fn code_by_hash(&mut self, code_hash: B256) -> Result<Bytecode, StateError> {
        self.below.code(code_hash)
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, StateError> {
        let key = Key::Slot(address, slot);
        if let Some((writer, incarnation, Value::Slot(value))) = self.before(&key) {
            self.reads.push((key, Some((writer, incarnation))));
            return Ok(value);
        }
        self.reads.push((key, None));
        self.below.slot(address, slot)
    }

    fn block_hash(&mut self, number: u64) -> Result<B256, StateError> {
        self.below.base.block_hash_ref(number)
    }
}

/// revm's mainnet handler without the fee credit to the beneficiary.
struct DeferredFees<EVM, ERROR, FRAME>(PhantomData<(EVM, ERROR, FRAME)>);

impl<EVM, ERROR, FRAME> Handler for DeferredFees<EVM, ERROR, FRAME>
where
    EVM: EvmTr<Context: ContextTr<Journal: JournalTr<State = EvmState>>, Frame = FRAME>,
    ERROR: EvmTrError<EVM>,
    FRAME: FrameTr<FrameResult = FrameResult, FrameInit = FrameInit>,
{
    type Evm = EVM;
    type Error = ERROR;
    type HaltReason = HaltReason;

    fn reward_beneficiary(&self, _evm: &mut EVM, _result: &mut FrameResult) -> Result<(), ERROR> {
        Ok(())
    }
}

/// One execution of one transaction.
struct Run {
    incarnation: u32,
    outcome: Result<revm::context::result::ExecutionResult, ExecError>,
    reads: Vec<(Key, Version)>,
    writes: Vec<(Key, Value)>,
    /// The beneficiary's tip for this transaction, in wei.
    fee: U256,
    serial: Option<SerialReason>,
    /// The receipt's bloom, hashed by the worker rather than in the serial assembly.
    bloom: Bloom,
}

/// revm over one transaction's view, reused for the transactions a worker runs.
type ViewEvm<'a> = revm::handler::MainnetEvm<revm::handler::MainnetContext<TxView<'a>>>;

fn evm_for<'a>(below: Below<'a>, memory: &'a MvMemory, block: &BlockContext) -> ViewEvm<'a> {
    let cfg = block.cfg();
    let block_env = block.block_env(&cfg);
    let view = TxView { below, memory, index: 0, reads: Vec::new(), local: HashMap::default() };
    Context::mainnet().with_db(view).with_cfg(cfg).with_block(block_env).build_mainnet()
}

fn run_one(evm: &mut ViewEvm<'_>, block: &BlockContext, index: usize, incarnation: u32, tx: &EthTransaction) -> Run {
    evm.ctx.journaled_state.database.index = index;
    evm.ctx.journaled_state.database.reads.clear();
    let env: TxEnv = tx.tx_env();
    let tip_per_gas = tip_per_gas(&env, block);
    evm.ctx.set_tx(env);
    let result = DeferredFees::<_, EVMError<StateError, InvalidTransaction>, _>(PhantomData).run(evm);
    let state = evm.finalize();
    let reads = std::mem::take(&mut evm.ctx.journaled_state.database.reads);
    let mut run = Run {
        incarnation,
        outcome: result.map_err(ExecError::from),
        reads,
        writes: Vec::new(),
        fee: U256::ZERO,
        serial: None,
        bloom: Bloom::ZERO,
    };
    if let Ok(result) = &run.outcome {
        run.fee = U256::from(tip_per_gas) * U256::from(result.tx_gas_used());
        run.bloom = result.logs().iter().collect();
        run.serial = writes_of(state, block.coinbase, &mut run.writes);
        if run.fee.is_zero() {
            run.serial = run.serial.or(Some(SerialReason::NoFee));
        }
    }
    let local = &mut evm.ctx.journaled_state.database.local;
    for (key, value) in &run.writes {
        local.insert(*key, (index, incarnation, value.clone()));
    }
    run
}

fn tip_per_gas(env: &TxEnv, block: &BlockContext) -> u128 {
    let base_fee = u128::from(if block.fork >= crate::Fork::London { block.base_fee } else { 0 });
    env.effective_gas_price(base_fee).saturating_sub(base_fee)
}

/// The keys a transaction's change set writes; a reason to run serially where the change
/// set does something this executor does not track.
fn writes_of(state: EvmState, coinbase: Address, writes: &mut Vec<(Key, Value)>) -> Option<SerialReason> {
    let mut serial = None;
    for (address, account) in state {
        if address == coinbase {
            serial = Some(SerialReason::TouchesBeneficiary);
        }
        if !account.is_touched() {
            continue;
        }
        if account.is_created() || account.is_selfdestructed() {
            serial = serial.or(Some(SerialReason::StorageCleared));
        }
        for (slot, value) in account.storage.iter().filter(|(_, value)| value.is_changed()) {
            writes.push((Key::Slot(address, *slot), Value::Slot(value.present_value())));
        }
        // A call touches its target without changing it; writing it anyway would make every
        // call to a contract depend on the call before.
        if account.is_empty() {
            writes.push((Key::Account(address), Value::Account(None)));
        } else if account.is_changed() {
            writes.push((Key::Account(address), Value::Account(Some(account.info))));
        }
    }
    serial
}

fn valid(run: &Run, index: usize, memory: &MvMemory) -> bool {
    run.reads
        .iter()
        .all(|(key, seen)| memory.before(key, index).map(|(writer, incarnation, _)| (writer, incarnation)) == *seen)
}

/// Executes `txs` in parallel over `state` (through `cache`, where given): the same
/// receipts, refusals and writes as [`crate::execute_block_writes`]. Where the block must run
/// serially instead, `ParallelStats::serial` says why and the writes are empty.
pub(crate) fn execute_parallel(
    base: StateDb<'_>,
    cache: Option<&ReadCache>,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<(ExecutedBlock, BlockWrites, BlockSeen, ParallelStats), (StateError, ParallelStats)> {
    let read = DashMap::with_hasher(Default::default());
    let below = Below { base, cache, read: &read };
    let mut memory = MvMemory::default();
    let mut runs: Vec<Option<Run>> = (0..txs.len()).map(|_| None).collect();
    let mut stats = ParallelStats::default();
    let mut pending: Vec<usize> = (0..txs.len()).collect();
    while !pending.is_empty() {
        stats.rounds += 1;
        // A sender's transactions depend on one another (each reads the nonce the one before
        // wrote), so one worker runs them in order, each seeing the ones before; senders run
        // in parallel.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of: HashMap<Address, usize> = HashMap::default();
        for &index in &pending {
            let group = *group_of.entry(txs[index].sender()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(index);
        }
        let first_rerun = pending.first().copied().unwrap_or(0);
        let incarnations: Vec<u32> = runs.iter().map(|run| run.as_ref().map_or(0, |run| run.incarnation + 1)).collect();
        let shared = &memory;
        let fresh: Vec<Vec<Run>> = groups
            .par_iter()
            .map_init(
                || evm_for(below, shared, block),
                |evm, group| {
                    evm.ctx.journaled_state.database.local.clear();
                    group.iter().map(|&index| run_one(evm, block, index, incarnations[index], &txs[index])).collect()
                },
            )
            .collect();
        for (index, run) in groups.iter().flatten().copied().zip(fresh.into_iter().flatten()) {
            if let Err(ExecError::State(error)) = &run.outcome {
                return Err((error.clone(), stats));
            }
            let old = runs[index].take();
            if old.is_some() {
                stats.reexecutions += 1;
            }
            memory.replace(index, old.as_ref().map_or(&[][..], |old| &old.writes), &run.writes, run.incarnation);
            runs[index] = Some(run);
        }
        // Nothing before the first transaction run this round changed: those stay valid.
        pending = (first_rerun..txs.len())
            .filter(|&index| runs[index].as_ref().is_none_or(|run| !valid(run, index, &memory)))
            .collect();
    }
    let (executed, writes, stats) = assemble(runs, memory, below, block, txs, stats)?;
    // What the block read of the state below goes into the executor's cache too.
    let (mut accounts, mut slots) = (HashMap::default(), HashMap::<Address, Vec<(U256, U256)>>::default());
    for (key, value) in read {
        match (key, value) {
            (Key::Account(address), Value::Account(info)) => {
                accounts.insert(address, info);
            }
            (Key::Slot(address, slot), Value::Slot(value)) => slots.entry(address).or_default().push((slot, value)),
            _ => {}
        }
    }
    let seen = BlockSeen::from_writes_and_reads(&writes, accounts, slots);
    Ok((executed, writes, seen, stats))
}

fn assemble(
    runs: Vec<Option<Run>>,
    memory: MvMemory,
    below: Below<'_>,
    block: &BlockContext,
    txs: &[EthTransaction],
    mut stats: ParallelStats,
) -> Result<(ExecutedBlock, BlockWrites, ParallelStats), (StateError, ParallelStats)> {
    let mut executed = ExecutedBlock::default();
    let mut fees = U256::ZERO;
    for (index, (run, tx)) in runs.into_iter().zip(txs).enumerate() {
        let Some(run) = run else { continue };
        let gas_limit = alloy_consensus::Transaction::gas_limit(tx.envelope());
        if gas_limit > block.gas_limit.saturating_sub(executed.gas_used) {
            stats.serial = Some(SerialReason::BlockGasExhausted);
        }
        match run.outcome {
            Ok(result) => {
                stats.serial = stats.serial.or(run.serial);
                fees += run.fee;
                record_with_bloom(&mut executed, index, tx, result, run.bloom);
            }
            Err(reason) => executed.refused.push(Refused { index, tx_hash: tx.hash(), reason }),
        }
    }
    if stats.serial.is_some() {
        return Ok((executed, BlockWrites::default(), stats));
    }
    let mut accounts: HashMap<Address, AccountWrite> = HashMap::default();
    let last = |writes: &BTreeMap<usize, (u32, Value)>| writes.values().next_back().map(|(_, value)| value.clone());
    for (key, writes) in &memory.entries {
        match (key, last(writes)) {
            (Key::Account(address), Some(Value::Account(info))) => {
                accounts.entry(*address).or_insert_with(|| empty_write(None)).info = info;
            }
            (Key::Slot(address, slot), Some(Value::Slot(value))) => {
                let write = match accounts.entry(*address) {
                    std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::hash_map::Entry::Vacant(vacant) => {
                        vacant.insert(empty_write(below.account(*address).map_err(|error| (error, stats))?))
                    }
                };
                write.slots.push((*slot, value));
            }
            _ => {}
        }
    }
    // The beneficiary's fees, credited once (no transaction read or wrote it). Every
    // included transaction paid some (else the block ran serially), so a block without one
    // leaves the beneficiary untouched, as serial execution does.
    if !executed.receipts.is_empty() {
        let mut coinbase = below.account(block.coinbase).map_err(|error| (error, stats))?.unwrap_or_default();
        coinbase.balance += fees;
        accounts.insert(block.coinbase, empty_write(Some(coinbase)));
    }
    Ok((executed, BlockWrites { accounts: accounts.into_iter().collect() }, stats))
}

fn empty_write(info: Option<AccountInfo>) -> AccountWrite {
    AccountWrite { info, storage_cleared: false, slots: Vec::new() }
}

/// Counters across blocks, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParallelTotals {
    pub blocks: usize,
    pub rounds: usize,
    pub reexecutions: usize,
    /// Blocks handed to the serial executor.
    pub serial_blocks: usize,
}

impl ParallelTotals {
    pub fn add(&mut self, stats: &ParallelStats) {
        self.blocks += 1;
        self.rounds += stats.rounds;
        self.reexecutions += stats.reexecutions;
        self.serial_blocks += usize::from(stats.serial.is_some());
    }
}
