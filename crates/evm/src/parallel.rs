//! Virga's parallel executor, in two stages: optimistic execution of every transaction at
//! once, then validation in block order with re-execution where a guess was wrong.
//!
//! Stage 1 executes the block's transactions on rayon's pool against the block's starting
//! state. A sender's transactions run in order on one worker, each seeing the writes of the
//! ones before it (they depend on one another through the nonce); different senders run in
//! parallel. Every read is recorded with the value it saw and whether it came from the state
//! below.
//!
//! Stage 2 walks the block in order, keeping the block's writes so far. A transaction is
//! valid when each of its reads still sees what it saw: a key no earlier transaction wrote
//! must have been read from the state below, and a written key must hold the value read. A
//! valid transaction's writes are applied as they are; an invalid one runs again right
//! there, over the block's writes so far, as serial execution would run it. By induction,
//! every transaction reads what serial execution reads, hence writes what it writes.
//! Stage 2 is cheap next to execution (a few map lookups per transaction), so on a block
//! with few dependencies nearly all the work is in stage 1.
//!
//! The fee credit to the block's beneficiary, which every transaction makes, is left out of
//! execution (a handler that skips it) and summed at the end, so that it does not make every
//! transaction depend on the one before. Where that or this design's other assumptions
//! would not hold, the block runs serially instead, and the reason is reported: a
//! transaction that touches the beneficiary itself, creates or destroys an account (storage
//! cleared), runs out of block gas, or pays no fee.

use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

use alloy_primitives::{Address, Bloom, B256, U256};
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
    /// Stages run: 1 when every optimistic execution held, 2 when some ran again.
    pub rounds: usize,
    /// Transactions executed again in stage 2.
    pub reexecutions: usize,
    pub serial: Option<SerialReason>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Account(Address),
    Slot(Address, U256),
}

/// Addresses and Solidity's mapping slots are hashes already: a few of their bytes, mixed by
/// the map's hasher, spread as well as all of them and cost far less to hash.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let prefix = |address: &Address| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&address.as_slice()[..8]);
            u64::from_le_bytes(word)
        };
        match self {
            Key::Account(address) => state.write_u64(prefix(address)),
            Key::Slot(address, slot) => {
                let limbs = slot.as_limbs();
                let mixed = limbs[0] ^ limbs[1].rotate_left(16) ^ limbs[2].rotate_left(32) ^ limbs[3].rotate_left(48);
                state.write_u64(prefix(address).rotate_left(1) ^ mixed ^ 1);
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Account(Option<AccountInfo>),
    Slot(U256),
}

/// One read of a transaction: the key, the value seen, and whether it came from the state
/// below (rather than from an earlier transaction's write).
#[derive(Clone, Debug)]
struct Read {
    key: Key,
    value: Value,
    below: bool,
}

/// The state below the block: the trie, through the executor's cache where it has one. It
/// does not change during the block.
#[derive(Clone, Copy)]
struct Below<'a> {
    base: StateDb<'a>,
    cache: Option<&'a ReadCache>,
}

impl Below<'_> {
    /// The account without its code (see [`without_code`]).
    fn account(&self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        match self.cache.and_then(|cache| cache.account_without_code(&address)) {
            Some(info) => Ok(info),
            None => Ok(self.base.basic_ref(address)?.map(without_code)),
        }
    }

    /// Every read is one probe of a flat copy of the state: nothing is worth remembering.
    fn is_flat(&self) -> bool {
        self.cache.is_some_and(ReadCache::is_complete)
    }

    fn slot(&self, address: Address, slot: U256) -> Result<U256, StateError> {
        match self.cache.and_then(|cache| cache.slot_known(&address, &slot)) {
            Some(value) => Ok(value),
            None => self.base.storage_ref(address, slot),
        }
    }

    fn code(&self, hash: B256) -> Result<Bytecode, StateError> {
        match self.cache.and_then(|cache| cache.code(&hash)) {
            Some(code) => Ok(code.clone()),
            None => self.base.code_by_hash_ref(hash),
        }
    }
}

/// One transaction's view: writes before it (a same-sender predecessor's in stage 1, the
/// block's so far in stage 2) over the state below, every read recorded.
struct TxView<'a> {
    below: Below<'a>,
    /// Stage 2: every write of the transactions before this one (empty in stage 1).
    written: HashMap<Key, Value>,
    reads: Vec<Read>,
    /// Stage 1: writes of the same sender's earlier transactions, run by this worker.
    local: HashMap<Key, Value>,
    /// What this worker read of the state below, so that a hot key is read from the trie
    /// once per worker and block (not kept over a flat copy, where a read is one probe).
    below_read: HashMap<Key, Value>,
    /// This EVM's own copy of each contract's code (one EVM per chunk of sender groups in
    /// stage 1, one for the re-executions of stage 2).
    codes: HashMap<B256, Bytecode>,
}

/// An account as the parallel executor passes it around: without its code, which revm then
/// asks for by hash. Code is shared behind a reference count, and two workers cloning the
/// same contract's code for every call would fight over that count's cache line.
fn without_code(mut info: AccountInfo) -> AccountInfo {
    info.code = None;
    info
}

impl TxView<'_> {
    fn read(
        &mut self,
        key: Key,
        load: impl FnOnce(&Below<'_>) -> Result<Value, StateError>,
    ) -> Result<Value, StateError> {
        let before = self.local.get(&key).or_else(|| self.written.get(&key));
        if let Some(value) = before {
            let value = value.clone();
            self.reads.push(Read { key, value: value.clone(), below: false });
            return Ok(value);
        }
        let remembered = if self.below.is_flat() { None } else { self.below_read.get(&key) };
        let value = match remembered {
            Some(value) => value.clone(),
            None => {
                let value = load(&self.below)?;
                if !self.below.is_flat() {
                    self.below_read.insert(key, value.clone());
                }
                value
            }
        };
        self.reads.push(Read { key, value: value.clone(), below: true });
        Ok(value)
    }
}

impl Database for TxView<'_> {
    type Error = StateError;

    fn basic(&mut self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        match self.read(Key::Account(address), |below| below.account(address).map(Value::Account))? {
            Value::Account(info) => Ok(info),
            Value::Slot(_) => Ok(None),
        }
    }

    fn code_by_hash(&mut self, code_hash: B256) -> Result<Bytecode, StateError> {
        if let Some(code) = self.codes.get(&code_hash) {
            return Ok(code.clone());
        }
        // A copy of this worker's own (see `without_code`).
        let code = crate::db::bytecode(self.below.code(code_hash)?.original_byte_slice());
        self.codes.insert(code_hash, code.clone());
        Ok(code)
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, StateError> {
        match self.read(Key::Slot(address, slot), |below| below.slot(address, slot).map(Value::Slot))? {
            Value::Slot(value) => Ok(value),
            Value::Account(_) => Ok(U256::ZERO),
        }
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
    outcome: Result<revm::context::result::ExecutionResult, ExecError>,
    reads: Vec<Read>,
    writes: Vec<(Key, Value)>,
    /// The beneficiary's tip for this transaction, in wei.
    fee: U256,
    serial: Option<SerialReason>,
    /// The receipt's bloom, hashed by the worker rather than in the serial assembly.
    bloom: Bloom,
}

/// revm over one transaction's view, reused for the transactions a worker runs.
type ViewEvm<'a> = revm::handler::MainnetEvm<revm::handler::MainnetContext<TxView<'a>>>;

fn evm_for<'a>(below: Below<'a>, written: HashMap<Key, Value>, block: &BlockContext) -> ViewEvm<'a> {
    let cfg = block.cfg();
    let block_env = block.block_env(&cfg);
    let view = TxView {
        below,
        written,
        reads: Vec::new(),
        local: HashMap::default(),
        below_read: HashMap::default(),
        codes: HashMap::default(),
    };
    Context::mainnet().with_db(view).with_cfg(cfg).with_block(block_env).build_mainnet()
}

/// `later_in_group`: the same sender has a transaction after this one in the worker's
/// group, which must see this one's writes.
fn run_one(evm: &mut ViewEvm<'_>, block: &BlockContext, tx: &EthTransaction, later_in_group: bool) -> Run {
    evm.ctx.journaled_state.database.reads.clear();
    let env: TxEnv = tx.tx_env();
    let tip_per_gas = tip_per_gas(&env, block);
    evm.ctx.set_tx(env);
    let result = DeferredFees::<_, EVMError<StateError, InvalidTransaction>, _>(PhantomData).run(evm);
    let state = evm.finalize();
    let reads = std::mem::take(&mut evm.ctx.journaled_state.database.reads);
    let mut run = Run {
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
    if later_in_group {
        let local = &mut evm.ctx.journaled_state.database.local;
        for (key, value) in &run.writes {
            local.insert(*key, value.clone());
        }
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
            writes.push((Key::Account(address), Value::Account(Some(without_code(account.info)))));
        }
    }
    serial
}

/// Whether every read of `run` sees what it saw, given the writes of the transactions
/// before it.
fn valid(run: &Run, written: &HashMap<Key, Value>) -> bool {
    run.reads.iter().all(|read| match written.get(&read.key) {
        Some(value) => *value == read.value,
        None => read.below,
    })
}

/// Stage 1: every transaction executed at once, a sender's in order on one worker.
fn execute_optimistically(below: Below<'_>, block: &BlockContext, txs: &[EthTransaction]) -> Vec<Option<Run>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<Address, usize> = HashMap::default();
    for (index, tx) in txs.iter().enumerate() {
        let group = *group_of.entry(tx.sender()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(index);
    }
    // A few chunks of groups per worker: enough to even out their lengths, few enough that
    // building an EVM and analysing each contract's code per chunk stays cheap.
    let chunks = 2 * rayon::current_num_threads().max(1);
    let fresh: Vec<Vec<Run>> = groups
        .par_chunks(groups.len().div_ceil(chunks).max(1))
        .map(|chunk| {
            let mut evm = evm_for(below, HashMap::default(), block);
            let mut runs = Vec::with_capacity(chunk.iter().map(Vec::len).sum());
            for group in chunk {
                evm.ctx.journaled_state.database.local.clear();
                let last = group.len() - 1;
                runs.extend(
                    group.iter().enumerate().map(|(at, &index)| run_one(&mut evm, block, &txs[index], at < last)),
                );
            }
            runs
        })
        .collect();
    let mut runs: Vec<Option<Run>> = (0..txs.len()).map(|_| None).collect();
    for (index, run) in groups.iter().flatten().copied().zip(fresh.into_iter().flatten()) {
        runs[index] = Some(run);
    }
    runs
}

/// A block executed in parallel: its outcome, its writes, what it saw where the cache keeps
/// reads, and how the execution went.
pub(crate) type ParallelBlock = (ExecutedBlock, BlockWrites, Option<BlockSeen>, ParallelStats);

/// Executes `txs` in parallel over `state` (through `cache`, where given): the same
/// receipts, refusals and writes as [`crate::execute_block_writes`]. Where the block must run
/// serially instead, `ParallelStats::serial` says why and the writes are empty.
pub(crate) fn execute_parallel(
    base: StateDb<'_>,
    cache: Option<&ReadCache>,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> Result<ParallelBlock, (StateError, ParallelStats)> {
    let below = Below { base, cache };
    let mut stats = ParallelStats { rounds: 1, ..ParallelStats::default() };
    let mut runs = execute_optimistically(below, block, txs);
    // Stage 2: in block order, over the block's writes so far, which the EVM that runs
    // transactions again holds (built once, and only if one must).
    let mut written: HashMap<Key, Value> = HashMap::with_capacity_and_hasher(4 * txs.len(), Default::default());
    let mut again: Option<ViewEvm<'_>> = None;
    for (index, tx) in txs.iter().enumerate() {
        let held = runs[index].as_ref().is_some_and(|run| valid(run, &written));
        if !held {
            let evm = again.get_or_insert_with(|| evm_for(below, HashMap::default(), block));
            std::mem::swap(&mut evm.ctx.journaled_state.database.written, &mut written);
            let run = run_one(evm, block, tx, false);
            std::mem::swap(&mut evm.ctx.journaled_state.database.written, &mut written);
            stats.rounds = 2;
            stats.reexecutions += 1;
            runs[index] = Some(run);
        }
        let Some(run) = runs[index].as_mut() else { continue };
        // A valid run that reached what a partial state does not hold is a real miss (serial
        // execution reads the same and misses too): the transaction is left out, as
        // `missing_witness`. Any other state error ends the block.
        if let Err(ExecError::State(error)) = &run.outcome {
            if !error.is_not_held() {
                return Err((error.clone(), stats));
            }
        }
        // The writes are needed no more once in the block's: moved, not copied.
        for (key, value) in run.writes.drain(..) {
            written.insert(key, value);
        }
    }
    // What the block read of the state below goes into the executor's cache too, unless
    // that cache holds the whole state already.
    let keep_reads = cache.is_some_and(|cache| !cache.is_complete());
    let reads = keep_reads.then(|| reads_below(&runs));
    let (executed, writes, stats) = assemble(runs, written, below, block, txs, stats)?;
    let seen = reads.map(|(accounts, slots)| BlockSeen::from_writes_and_reads(&writes, accounts, slots));
    Ok((executed, writes, seen, stats))
}

type AccountsRead = alloy_primitives::map::AddressMap<Option<AccountInfo>>;
type SlotsRead = alloy_primitives::map::AddressMap<Vec<(U256, U256)>>;

/// Every account and slot the runs read from the state below, each once.
fn reads_below(runs: &[Option<Run>]) -> (AccountsRead, SlotsRead) {
    let (mut accounts, mut slots) = (AccountsRead::default(), SlotsRead::default());
    let mut slots_seen: foldhash::HashSet<Key> = Default::default();
    for read in runs.iter().flatten().flat_map(|run| &run.reads).filter(|read| read.below) {
        match (read.key, &read.value) {
            (Key::Account(address), Value::Account(info)) => {
                accounts.entry(address).or_insert_with(|| info.clone());
            }
            (key @ Key::Slot(address, slot), Value::Slot(value)) if slots_seen.insert(key) => {
                slots.entry(address).or_default().push((slot, *value));
            }
            _ => {}
        }
    }
    (accounts, slots)
}

/// The block's receipts and writes from the final runs. The two are independent, and built
/// at once on two workers.
fn assemble(
    runs: Vec<Option<Run>>,
    written: HashMap<Key, Value>,
    below: Below<'_>,
    block: &BlockContext,
    txs: &[EthTransaction],
    mut stats: ParallelStats,
) -> Result<(ExecutedBlock, BlockWrites, ParallelStats), (StateError, ParallelStats)> {
    let ((executed, fees, serial), accounts) =
        rayon::join(|| receipts_of(runs, block, txs), || writes_by_account(written, below));
    stats.serial = serial;
    if stats.serial.is_some() {
        return Ok((executed, BlockWrites::default(), stats));
    }
    let mut accounts = accounts.map_err(|error| (error, stats))?;
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

/// Receipts and refusals in block order, the fees the beneficiary is owed, and a reason to
/// run the block serially where one of the runs gave one.
fn receipts_of(
    runs: Vec<Option<Run>>,
    block: &BlockContext,
    txs: &[EthTransaction],
) -> (ExecutedBlock, U256, Option<SerialReason>) {
    let mut executed = ExecutedBlock::default();
    let (mut fees, mut serial) = (U256::ZERO, None);
    for (index, (run, tx)) in runs.into_iter().zip(txs).enumerate() {
        let Some(run) = run else { continue };
        let gas_limit = alloy_consensus::Transaction::gas_limit(tx.envelope());
        if gas_limit > block.gas_limit.saturating_sub(executed.gas_used) {
            serial = Some(SerialReason::BlockGasExhausted);
        }
        match run.outcome {
            Ok(result) => {
                serial = serial.or(run.serial);
                fees += run.fee;
                record_with_bloom(&mut executed, index, tx, result, run.bloom);
            }
            Err(reason) => executed.refused.push(Refused { index, tx_hash: tx.hash(), reason }),
        }
    }
    (executed, fees, serial)
}

/// The block's writes, by account.
fn writes_by_account(
    written: HashMap<Key, Value>,
    below: Below<'_>,
) -> Result<HashMap<Address, AccountWrite>, StateError> {
    let mut accounts: HashMap<Address, AccountWrite> = HashMap::default();
    for (key, value) in written {
        match (key, value) {
            (Key::Account(address), Value::Account(info)) => {
                accounts.entry(address).or_insert_with(|| empty_write(None)).info = info;
            }
            (Key::Slot(address, slot), Value::Slot(value)) => {
                let write = match accounts.entry(address) {
                    std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::hash_map::Entry::Vacant(vacant) => {
                        vacant.insert(empty_write(below.account(address)?))
                    }
                };
                write.slots.push((slot, value));
            }
            _ => {}
        }
    }
    Ok(accounts)
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
