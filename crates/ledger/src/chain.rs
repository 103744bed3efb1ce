//! A chain on disk: its genesis, its blocks in the [`ChainStore`], and the state of its head
//! in a [`DurableTrie`] (one version per block).
//!
//! Layout of a chain directory:
//! - `genesis.json`: geth-style genesis; `config.chainId`, `difficulty` and `gasLimit` are
//!   the chain's rules, `alloc` its starting balances;
//! - `blocks/`: the chain store, block 0 being the genesis block;
//! - `state/`: the account trie of the head block (log of per-block updates, checkpoints);
//! - `contracts/`: the storage slots and code of the head block, in step with `state/`
//!   (see [`crate::contract_store`]);
//! - `FORMAT`: the chain format's version ([`CHAIN_FORMAT`]).
//!
//! Blocks are the source of truth. A block is verified, appended to the store, and only then
//! is its state committed, so after a crash the state is at most some blocks behind; opening
//! replays the missing blocks (verifying them again). A state store that is damaged, ahead
//! of the blocks, or holds a root its block does not commit to is discarded and rebuilt from
//! the blocks (reported in [`OpenReport::state_rebuilt`]); `audit` reports such a store as a
//! problem.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_consensus::constants::EMPTY_ROOT_HASH;
use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, Bytes, B256, B64, U256};
use virga_core::device::{IntoStorage, Storage};
use virga_log::SyncPolicy;
use virga_trie::account::StateTrie;
use virga_trie::durable::{DurableError, DurableOptions, DurableTrie};
use virga_trie::genesis::{Genesis, GenesisError};
use virga_trie::versions::Update;

use crate::block::{Block, BlockError};
use crate::builder::{build_block, Built};
use crate::contract_store::{self, ContractProblem};
use crate::exec::{BlockOutcome, ExecConfig, RecentHashes, StateError, GENESIS_BASE_FEE};
use crate::store::{ChainStore, StoreError, StoreOptions};
use crate::tx::RecoveredTx;
use crate::verify::{check_block, execute_block, verify_block, ChainConfig, ExecMode, Verified, VerifyError};

const GENESIS_FILE: &str = "genesis.json";
const BLOCKS_DIR: &str = "blocks";
const STATE_DIR: &str = "state";
const CONTRACTS_DIR: &str = "contracts";
const FORMAT_FILE: &str = "FORMAT";

/// The chain format's version: 3 has Ethereum transactions of every type Cancun carries,
/// executed by revm, headers with the base fee and logs bloom, and the contract store.
/// Version 2 (no `FORMAT` file) had value transfers only.
pub const CHAIN_FORMAT: u32 = 3;

/// Why a chain cannot be opened, extended or audited.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Genesis { path: PathBuf, source: GenesisError },
    #[error("genesis: {0}")]
    GenesisRules(String),
    #[error("{0} already holds a chain")]
    AlreadyExists(PathBuf),
    #[error("{0} holds no chain (no genesis.json)")]
    NoChain(PathBuf),
    #[error("block store: {0}")]
    Store(#[from] StoreError),
    #[error("state store: {0}")]
    StateStore(#[from] DurableError),
    #[error("block {number} does not decode: {source}")]
    Decode { number: u64, source: BlockError },
    #[error("block 0 has hash {stored}, but genesis.json gives {computed}")]
    GenesisMismatch { stored: B256, computed: B256 },
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(
        "state store holds the state of block {number} with root {found}, but block {number} commits to {expected}"
    )]
    StateRoot { number: u64, expected: B256, found: B256 },
    #[error("state store is at block {state}, beyond the last stored block {head}")]
    StateAhead { state: u64, head: u64 },
    #[error("state store: the last {bytes} bytes of its log are torn or damaged (an interrupted write, or tampering); it holds the state of block {}; opening the chain drops them and replays from the blocks", .version.saturating_sub(1))]
    StateTail { bytes: u64, version: u64 },
    #[error("a state commit failed ({0}); reopen the chain to replay the stored blocks")]
    Poisoned(String),
    #[error("cannot start threads: {0}")]
    Threads(String),
    #[error("state store in {0} is empty")]
    EmptyState(PathBuf),
    #[error(
        "state store in {}{}: {source}. The blocks are what counts: `virga verify --dir {} --repair` \
         rebuilds the state store from them",
        .dir.display(),
        .block.map(|b| format!(" is damaged from the state of block {b} on")).unwrap_or_else(|| " is damaged".into()),
        .chain.display()
    )]
    StateDamaged { dir: PathBuf, chain: PathBuf, block: Option<u64>, source: Box<DurableError> },
    #[error("block {0} is not in the chain")]
    Missing(u64),
    #[error(
        "{} holds chain format {found} (value transfers only, headers without a base fee); this build reads \
         format {CHAIN_FORMAT} (Ethereum transactions and contracts) and cannot extend or verify it. Re-create \
         the chain in a fresh directory",
        .dir.display()
    )]
    OlderFormat { dir: PathBuf, found: u32 },
    #[error("{}: `{text}` is not a chain format version", .path.display())]
    BadFormatFile { path: PathBuf, text: String },
    #[error("contract store (block {number}): {problem}")]
    Contracts { number: u64, problem: ContractProblem },
    #[error("one state store is empty, the other holds block {block}")]
    OneStoreEmpty { block: u64 },
    #[error("contract store is at block {contracts}, the account store at block {state}: they move together")]
    StoresApart { state: u64, contracts: u64 },
    #[error("the state is damaged: {0}")]
    State(#[from] StateError),
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ChainError + '_ {
    move |source| ChainError::Io { path: path.to_path_buf(), source }
}

/// A chain directory: every file of the chain is reached through its [`Storage`].
struct ChainDir {
    path: PathBuf,
    storage: Arc<dyn Storage>,
}

impl ChainDir {
    /// The chain directory at `dir`; with `create`, a missing directory is made first.
    fn at(dir: &Path, create: bool) -> Result<ChainDir, ChainError> {
        let storage = dir.into_storage(create).map_err(io_error(dir))?;
        Ok(ChainDir { path: dir.to_path_buf(), storage })
    }

    /// The object `name`'s bytes, or `None` if there is no such object.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, ChainError> {
        let path = self.storage.path_of(name);
        match self.storage.open(name).and_then(|device| device.read_all()) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ChainError::Io { path, source }),
        }
    }

    fn exists(&self, name: &str) -> Result<bool, ChainError> {
        self.storage.exists(name).map_err(io_error(&self.storage.path_of(name)))
    }

    /// Writes object `name` so that a crash leaves the old bytes or the new ones.
    fn replace(&self, name: &str, bytes: &[u8]) -> Result<(), ChainError> {
        self.storage.replace_atomically(name, bytes).map_err(io_error(&self.storage.path_of(name)))
    }

    /// The nested namespace `name`, created if missing.
    fn sub(&self, name: &str) -> Result<Arc<dyn Storage>, ChainError> {
        self.storage.sub(name).map_err(io_error(&self.storage.path_of(name)))
    }

    /// The nested namespace `name` if it exists; creates nothing.
    fn open_sub(&self, name: &str) -> Result<Option<Arc<dyn Storage>>, ChainError> {
        match self.storage.open_sub(name) {
            Ok(storage) => Ok(Some(storage)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ChainError::Io { path: self.storage.path_of(name), source }),
        }
    }

    /// Deletes the nested namespace `name` if it exists (whole, or not at all).
    fn remove_sub(&self, name: &str) -> Result<(), ChainError> {
        match self.storage.remove_sub(name) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ChainError::Io { path: self.storage.path_of(name), source }),
        }
    }
}

/// The rules `genesis` sets: chain id from `config.chainId` (1337 when absent), difficulty
/// and gas limit of every block.
pub fn chain_config(genesis: &Genesis) -> Result<ChainConfig, ChainError> {
    let chain_id = match &genesis.config {
        None => ExecConfig::default().chain_id,
        Some(text) => {
            let config: serde_json::Value =
                serde_json::from_str(text).map_err(|error| ChainError::GenesisRules(error.to_string()))?;
            match config.get("chainId") {
                None => ExecConfig::default().chain_id,
                Some(id) => id.as_u64().ok_or_else(|| {
                    ChainError::GenesisRules(format!("config.chainId must be a non-negative integer, found {id}"))
                })?,
            }
        }
    };
    if genesis.difficulty.is_zero() {
        return Err(ChainError::GenesisRules("difficulty 0 admits no proof of work".into()));
    }
    // Fields the genesis block of a transfer ledger does not use: set, they would be
    // silently ignored, so the block would not be what the file says.
    let ignored = [
        (genesis.number != 0, "number"),
        (genesis.gas_used != 0, "gasUsed"),
        (genesis.base_fee_per_gas.is_some_and(|fee| fee > U256::from(u64::MAX)), "baseFeePerGas above 2^64-1"),
        (genesis.excess_blob_gas.is_some(), "excessBlobGas"),
        (genesis.blob_gas_used.is_some(), "blobGasUsed"),
        (genesis.extra_data.len() > crate::verify::MAX_EXTRA_DATA, "extraData longer than 32 bytes"),
    ];
    if let Some((_, field)) = ignored.iter().find(|(set, _)| *set) {
        return Err(ChainError::GenesisRules(format!("{field} is not supported in a ledger's genesis")));
    }
    Ok(ChainConfig { exec: ExecConfig { chain_id }, difficulty: genesis.difficulty, gas_limit: genesis.gas_limit })
}

/// The genesis block's header for `genesis` whose state has root `state_root`.
pub fn genesis_header(genesis: &Genesis, state_root: B256) -> Header {
    Header {
        parent_hash: genesis.parent_hash,
        beneficiary: genesis.coinbase,
        state_root,
        transactions_root: EMPTY_ROOT_HASH,
        receipts_root: EMPTY_ROOT_HASH,
        difficulty: genesis.difficulty,
        number: 0,
        gas_limit: genesis.gas_limit,
        gas_used: 0,
        timestamp: genesis.timestamp,
        extra_data: Bytes::from(genesis.extra_data.clone()),
        mix_hash: genesis.mix_hash,
        nonce: B64::from(genesis.nonce),
        base_fee_per_gas: Some(genesis.base_fee_per_gas.map_or(GENESIS_BASE_FEE, |fee| fee.saturating_to())),
        ..Header::default()
    }
}

/// A genesis document with `accounts` each holding `balance`, as geth-style JSON.
pub fn genesis_json(chain_id: u64, difficulty: U256, gas_limit: u64, accounts: &[Address], balance: U256) -> String {
    genesis_document(chain_id, difficulty, gas_limit, accounts, balance).to_string()
}

/// [`genesis_json`]'s document, for a caller that adds to it before writing it.
pub fn genesis_document(
    chain_id: u64,
    difficulty: U256,
    gas_limit: u64,
    accounts: &[Address],
    balance: U256,
) -> serde_json::Value {
    let alloc: serde_json::Map<String, serde_json::Value> = accounts
        .iter()
        .map(|address| (address.to_string(), serde_json::json!({ "balance": format!("{balance:#x}") })))
        .collect();
    let document = serde_json::json!({
        "config": { "chainId": chain_id },
        "difficulty": format!("{difficulty:#x}"),
        "gasLimit": format!("{gas_limit:#x}"),
        "timestamp": "0x0",
        "extraData": "0x",
        "alloc": alloc,
    });
    document
}

/// How a chain keeps its data.
#[derive(Clone, Debug)]
pub struct ChainOptions {
    pub store: StoreOptions,
    /// Blocks between state checkpoints.
    pub checkpoint_every: u64,
    /// States of this many latest blocks are kept in memory (they share structure).
    pub retain: usize,
}

impl Default for ChainOptions {
    fn default() -> Self {
        Self { store: StoreOptions::default(), checkpoint_every: 256, retain: 64 }
    }
}

/// What opening a chain found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub blocks: u64,
    pub truncated_bytes: u64,
    /// Blocks re-executed because the state store was behind.
    pub replayed: u64,
    /// Why the state store was discarded and rebuilt from the blocks, if it was (damaged,
    /// ahead of the blocks, or holding a root its block does not commit to).
    pub state_rebuilt: Option<String>,
}

/// A chain's genesis: its rules, state and block-0 header.
pub struct ChainGenesis {
    pub config: ChainConfig,
    pub state: StateTrie,
    pub header: Header,
}

/// Reads `genesis.json` in a chain directory and builds its state.
pub fn read_genesis(dir: &Path) -> Result<ChainGenesis, ChainError> {
    read_genesis_in(&ChainDir::at(dir, false)?)
}

fn read_genesis_in(dir: &ChainDir) -> Result<ChainGenesis, ChainError> {
    let path = dir.storage.path_of(GENESIS_FILE);
    let Some(bytes) = dir.read(GENESIS_FILE)? else {
        return Err(ChainError::NoChain(dir.path.clone()));
    };
    let text = std::str::from_utf8(&bytes).map_err(|error| ChainError::Genesis {
        path: path.clone(),
        source: GenesisError::NotUtf8 { offset: error.valid_up_to() },
    })?;
    let genesis = Genesis::from_json_str(text).map_err(|source| ChainError::Genesis { path, source })?;
    let config = chain_config(&genesis)?;
    let mut state = genesis.state();
    let header = genesis_header(&genesis, state.root());
    Ok(ChainGenesis { config, state, header })
}

fn state_options(options: &ChainOptions) -> DurableOptions {
    // The state can always be rebuilt from the blocks, so its log is not synced per block.
    DurableOptions { sync: SyncPolicy::None, checkpoint_every: options.checkpoint_every, ..DurableOptions::default() }
}

/// The accounts a block changed, as updates of the account trie (the beneficiary's
/// included: its fees are written like any account).
fn account_updates(state: &StateTrie, outcome: &BlockOutcome, beneficiary: Address) -> Vec<Update> {
    let mut touched: HashSet<B256> = outcome.touched_keys().collect();
    touched.insert(keccak256(beneficiary));
    let mut updates: Vec<Update> = touched
        .into_iter()
        .map(|key| (key.to_vec(), state.accounts().get_hashed(&key).map(|raw| raw.into_owned())))
        .collect();
    updates.sort();
    updates
}

fn all_accounts(state: &StateTrie) -> Vec<Update> {
    state.accounts().as_trie().entries().into_iter().map(|(key, value)| (key, Some(value))).collect()
}

/// Refuses a chain directory of an older format, and one whose `FORMAT` file is unreadable.
/// A directory without blocks yet gets the marker when `create` is set.
fn check_format(dir: &ChainDir, create: bool) -> Result<(), ChainError> {
    let path = dir.storage.path_of(FORMAT_FILE);
    let bytes = match dir.read(FORMAT_FILE)? {
        Some(bytes) => bytes,
        // Format 2 wrote no marker; a directory with blocks but no marker is one.
        None if dir.open_sub(BLOCKS_DIR)?.is_some() => {
            return Err(ChainError::OlderFormat { dir: dir.path.clone(), found: 2 });
        }
        None if create => return dir.replace(FORMAT_FILE, format!("{CHAIN_FORMAT}\n").as_bytes()),
        None => return Ok(()),
    };
    let text = String::from_utf8_lossy(&bytes);
    // Exactly what a new chain writes: a changed byte anywhere is noticed.
    if text == format!("{CHAIN_FORMAT}\n") {
        return Ok(());
    }
    match text.trim().parse::<u32>() {
        Ok(found) if found < CHAIN_FORMAT => Err(ChainError::OlderFormat { dir: dir.path.clone(), found }),
        _ => Err(ChainError::BadFormatFile { path, text: text.chars().take(40).collect() }),
    }
}

/// The hashes of the blocks up to `number` that `BLOCKHASH` can reach.
fn recent_hashes(store: &ChainStore, number: u64) -> Result<RecentHashes, ChainError> {
    let mut hashes = RecentHashes::default();
    let first = number.saturating_sub(RecentHashes::DEPTH as u64 - 1);
    for at in first..=number {
        hashes.push(at, store.hash_of(at).ok_or(ChainError::Missing(at))?);
    }
    Ok(hashes)
}

/// A chain open for reading and appending.
pub struct Chain {
    dir: PathBuf,
    genesis: ChainGenesis,
    store: ChainStore,
    state_store: DurableTrie,
    contract_store: DurableTrie,
    hashes: RecentHashes,
    head: Header,
    head_hash: B256,
    state: StateTrie,
    retained: VecDeque<(u64, StateTrie)>,
    options: ChainOptions,
    /// Why appends are refused until the chain is reopened.
    poisoned: Option<String>,
}

impl Chain {
    /// Creates a chain in `dir` (which must not hold one) from a genesis document.
    pub fn create(
        dir: &Path,
        genesis_json: &str,
        options: ChainOptions,
        pool: &rayon::ThreadPool,
    ) -> Result<(Chain, OpenReport), ChainError> {
        let chain_dir = ChainDir::at(dir, true)?;
        if chain_dir.exists(GENESIS_FILE)? {
            return Err(ChainError::AlreadyExists(dir.to_path_buf()));
        }
        let genesis = Genesis::from_json_str(genesis_json)
            .map_err(|source| ChainError::Genesis { path: chain_dir.storage.path_of(GENESIS_FILE), source })?;
        chain_config(&genesis)?;
        chain_dir.replace(GENESIS_FILE, genesis_json.as_bytes())?;
        Self::open(dir, options, pool)
    }

    /// Opens the chain in `dir`: drops a torn tail of the block store, checks the state
    /// store's root (rebuilding the store from the blocks if it is damaged), and brings it up
    /// to the last block.
    pub fn open(
        dir: &Path,
        options: ChainOptions,
        pool: &rayon::ThreadPool,
    ) -> Result<(Chain, OpenReport), ChainError> {
        let chain_dir = ChainDir::at(dir, false)?;
        let genesis = read_genesis_in(&chain_dir)?;
        check_format(&chain_dir, true)?;
        let genesis_hash = genesis.header.hash_slow();
        let (mut store, recovery) = ChainStore::open(chain_dir.sub(BLOCKS_DIR)?, options.store.clone())?;
        match store.hash_of(0) {
            None => {
                let block = Block { header: genesis.header.clone(), transactions: Vec::new() };
                store.append(0, genesis_hash, &block.encode())?;
                store.sync()?;
            }
            Some(stored) if stored != genesis_hash => {
                return Err(ChainError::GenesisMismatch { stored, computed: genesis_hash });
            }
            Some(_) => {}
        }
        let head_number = store.head().map_or(0, |(number, _)| number);
        let (state_store, contract_store, state, state_rebuilt) =
            open_state_stores(&chain_dir, &options, &genesis, &store, head_number)?;
        let state_number = state_store.version() - 1;
        let state_header =
            if state_number == 0 { genesis.header.clone() } else { load_block(&store, state_number)?.header };
        let mut chain = Chain {
            dir: dir.to_path_buf(),
            hashes: recent_hashes(&store, state_number)?,
            head_hash: state_header.hash_slow(),
            head: state_header,
            state,
            genesis,
            store,
            state_store,
            contract_store,
            retained: VecDeque::new(),
            options,
            poisoned: None,
        };
        chain.retain_head();
        let mut replayed = 0;
        for number in state_number + 1..=head_number {
            let block = load_block(&chain.store, number)?;
            let stored_hash = chain.store.hash_of(number).ok_or(ChainError::Missing(number))?;
            chain.apply(block, Some(stored_hash), pool, false)?;
            replayed += 1;
        }
        let report =
            OpenReport { blocks: head_number + 1, truncated_bytes: recovery.truncated_bytes, replayed, state_rebuilt };
        Ok((chain, report))
    }

    /// The chain's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The chain's rules.
    pub fn config(&self) -> &ChainConfig {
        &self.genesis.config
    }

    /// The last block's header.
    pub fn head(&self) -> &Header {
        &self.head
    }

    /// The last block's hash.
    pub fn head_hash(&self) -> B256 {
        self.head_hash
    }

    /// The state after the last block.
    pub fn head_state(&self) -> &StateTrie {
        &self.state
    }

    /// Verifies `block` on top of the head and appends it (durable per the store's sync
    /// policy), then commits its state.
    pub fn append(&mut self, block: Block, pool: &rayon::ThreadPool) -> Result<BlockOutcome, ChainError> {
        self.apply(block, None, pool, true)
    }

    /// Builds the next block from `transfers`, appends it, and returns it.
    pub fn build_next(
        &mut self,
        candidates: Vec<RecoveredTx>,
        beneficiary: Address,
        timestamp: u64,
        pool: &rayon::ThreadPool,
    ) -> Result<Built, ChainError> {
        self.check_usable()?;
        let mut state = self.state.clone();
        let config = &self.genesis.config;
        let built =
            build_block(config, &self.head, &mut state, &self.hashes, candidates, beneficiary, timestamp, pool)?;
        // Senders come from the caller and the header from the clock: check both before the
        // block is stored (execution already produced the state the header commits to).
        check_block(config, &self.head, &built.block, None, ExecMode::Parallel, pool)?;
        let hash = built.block.hash();
        self.store.append(built.block.header.number, hash, &built.block.encode())?;
        self.commit_state(built.block.header.clone(), hash, state, &built.outcome)?;
        Ok(built)
    }

    fn apply(
        &mut self,
        block: Block,
        stored_hash: Option<B256>,
        pool: &rayon::ThreadPool,
        store: bool,
    ) -> Result<BlockOutcome, ChainError> {
        self.check_usable()?;
        let (config, parent) = (&self.genesis.config, &self.head);
        let verified =
            verify_block(config, parent, &self.state, &self.hashes, &block, stored_hash, ExecMode::Parallel, pool)?;
        let hash = block.hash();
        if store {
            self.store.append(block.header.number, hash, &block.encode())?;
        }
        self.commit_state(block.header, hash, verified.state, &verified.outcome)?;
        Ok(verified.outcome)
    }

    fn commit_state(
        &mut self,
        header: Header,
        hash: B256,
        state: StateTrie,
        outcome: &BlockOutcome,
    ) -> Result<(), ChainError> {
        let updates = account_updates(&state, outcome, header.beneficiary);
        let contract_updates = contract_store::contract_updates(&self.state, &state, &outcome.writes);
        let committed = self
            .state_store
            .commit_applied(state.accounts().as_trie().snapshot(), &updates)
            .and_then(|_| self.contract_store.commit(&contract_updates));
        if let Err(error) = committed {
            // The block is stored but its state is not committed: memory and the state
            // stores disagree until a reopen replays the block (or rebuilds stores left apart).
            self.poisoned = Some(error.to_string());
            return Err(error.into());
        }
        self.hashes.push(header.number, hash);
        self.head = header;
        self.head_hash = hash;
        self.state = state;
        self.retain_head();
        Ok(())
    }

    fn check_usable(&self) -> Result<(), ChainError> {
        match &self.poisoned {
            None => Ok(()),
            Some(cause) => Err(ChainError::Poisoned(cause.clone())),
        }
    }

    fn retain_head(&mut self) {
        self.retained.push_back((self.head.number, self.state.clone()));
        while self.retained.len() > self.options.retain.max(1) {
            self.retained.pop_front();
        }
    }

    /// Makes every appended block durable.
    pub fn sync(&mut self) -> Result<(), ChainError> {
        self.store.sync()?;
        self.state_store.sync()?;
        self.contract_store.sync()?;
        Ok(())
    }

    /// The block numbered `number`.
    pub fn block(&self, number: u64) -> Result<Block, ChainError> {
        load_block(&self.store, number)
    }

    /// The state after block `number`: from memory for the latest `retain` blocks (versions
    /// of the DSM-Tree sharing structure), otherwise re-executed from genesis.
    pub fn state_at(&self, number: u64, pool: &rayon::ThreadPool) -> Result<StateTrie, ChainError> {
        if number > self.head.number {
            return Err(ChainError::Missing(number));
        }
        if let Some((_, state)) = self.retained.iter().find(|(retained, _)| *retained == number) {
            return Ok(state.clone());
        }
        let mut header = self.genesis.header.clone();
        let mut state = self.genesis.state.clone();
        let mut hashes = RecentHashes::default();
        hashes.push(0, header.hash_slow());
        for at in 1..=number {
            let block = load_block(&self.store, at)?;
            let config = &self.genesis.config;
            let verified = verify_block(config, &header, &state, &hashes, &block, None, ExecMode::Parallel, pool)?;
            hashes.push(at, block.hash());
            header = block.header;
            state = verified.state;
        }
        Ok(state)
    }
}

/// Opens the account and contract stores and the state they hold. Both are rebuilt from
/// the blocks (reported as the reason) when either is damaged, ahead of the blocks, apart
/// from the other, or holding a state its block does not commit to.
fn open_state_stores(
    dir: &ChainDir,
    options: &ChainOptions,
    genesis: &ChainGenesis,
    store: &ChainStore,
    head_number: u64,
) -> Result<(DurableTrie, DurableTrie, StateTrie, Option<String>), ChainError> {
    let (state_dir, contracts_dir) = (dir.sub(STATE_DIR)?, dir.sub(CONTRACTS_DIR)?);
    let opened = DurableTrie::open(state_dir, state_options(options))
        .and_then(|(accounts, _)| Ok((accounts, DurableTrie::open(contracts_dir, state_options(options))?.0)));
    let mut rebuilt = None;
    let stores = match opened {
        Ok((accounts, contracts)) => match check_stores(genesis, store, head_number, &accounts, &contracts) {
            Ok(Some(state)) => Some((accounts, contracts, state)),
            Ok(None) => None,
            Err(reason) => {
                rebuilt = Some(reason.to_string());
                None
            }
        },
        Err(error) => {
            rebuilt = Some(error.to_string());
            None
        }
    };
    if let Some(stores) = stores {
        return Ok((stores.0, stores.1, stores.2, rebuilt));
    }
    let mut accounts = rebuild_state_dir(dir, STATE_DIR, options)?;
    let mut contracts = rebuild_state_dir(dir, CONTRACTS_DIR, options)?;
    accounts.commit_applied(genesis.state.accounts().as_trie().snapshot(), &all_accounts(&genesis.state))?;
    contracts.commit(&contract_store::all_contracts(&genesis.state))?;
    Ok((accounts, contracts, genesis.state.clone(), rebuilt))
}

/// The state two opened stores hold, or why they must be rebuilt; `None` for empty stores
/// (a new chain), which the caller writes the genesis into.
fn check_stores(
    genesis: &ChainGenesis,
    store: &ChainStore,
    head_number: u64,
    accounts: &DurableTrie,
    contracts: &DurableTrie,
) -> Result<Option<StateTrie>, ChainError> {
    if accounts.version() == 0 && contracts.version() == 0 {
        return Ok(None);
    }
    if accounts.version() != contracts.version() {
        let empty = accounts.version() == 0 || contracts.version() == 0;
        let (state, contracts) = (accounts.version().saturating_sub(1), contracts.version().saturating_sub(1));
        if empty {
            return Err(ChainError::OneStoreEmpty { block: state.max(contracts) });
        }
        return Err(ChainError::StoresApart { state, contracts });
    }
    let number = accounts.version() - 1;
    if number > head_number {
        return Err(ChainError::StateAhead { state: number, head: head_number });
    }
    let expected = if number == 0 { genesis.header.state_root } else { load_block(store, number)?.header.state_root };
    let found = accounts.trie().root_hash();
    if found != expected {
        return Err(ChainError::StateRoot { number, expected, found });
    }
    let state = contract_store::load_state(accounts.trie().snapshot(), contracts.trie())
        .map_err(|problem| ChainError::Contracts { number, problem })?;
    contract_store::check(&state, false).map_err(|problem| ChainError::Contracts { number, problem })?;
    Ok(Some(state))
}

/// Deletes the state store `name` and opens an empty one in its place. The storage deletes a
/// namespace whole or not at all: a crash leaves either the old store or none, never a half.
fn rebuild_state_dir(dir: &ChainDir, name: &str, options: &ChainOptions) -> Result<DurableTrie, ChainError> {
    dir.remove_sub(name)?;
    Ok(DurableTrie::open(dir.sub(name)?, state_options(options))?.0)
}

fn load_block(store: &ChainStore, number: u64) -> Result<Block, ChainError> {
    let bytes = store.get_by_number(number)?.ok_or(ChainError::Missing(number))?;
    Block::decode(&bytes).map_err(|source| ChainError::Decode { number, source })
}

/// What an audit found in a sound chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditSummary {
    pub blocks: u64,
    pub transactions: u64,
    pub reverted_transactions: u64,
    pub head_number: u64,
    pub head_hash: B256,
    pub state_root: B256,
    /// The block whose state the state store holds (blocks after it are replayed on open).
    pub state_store_block: u64,
    pub elapsed: Duration,
}

/// A stored block whose stateless checks passed.
struct Checked {
    number: u64,
    hash: B256,
    block: Block,
    transactions: Vec<virga_evm::EthTransaction>,
}

/// Blocks in order, each checked against the block before it (hash, header, work,
/// transactions root, signatures); stops after the first problem. Block 0 is passed on
/// unchecked: [`execute_checked`] compares it with the genesis.
fn check_in_order<'a>(
    blocks: impl Iterator<Item = Result<(B256, Block), ChainError>> + 'a,
    config: ChainConfig,
    mode: ExecMode,
    pool: &'a rayon::ThreadPool,
) -> impl Iterator<Item = Result<Checked, ChainError>> + 'a {
    let mut parent: Option<Header> = None;
    let mut stopped = false;
    blocks.map_while(move |stored| {
        if stopped {
            return None;
        }
        let checked = stored.and_then(|(hash, block)| {
            let transactions = match &parent {
                None => Vec::new(),
                Some(parent) => check_block(&config, parent, &block, Some(hash), mode, pool)?,
            };
            parent = Some(block.header.clone());
            Ok(Checked { number: block.header.number, hash, block, transactions })
        });
        stopped = checked.is_err();
        Some(checked)
    })
}

/// The blocks of the chain in `dir`, decoded, with the hashes they were stored under.
pub fn stored_blocks(dir: &Path) -> impl Iterator<Item = Result<(B256, Block), ChainError>> {
    crate::store::scan(dir.join(BLOCKS_DIR)).map(|record| {
        let record = record?;
        let number = record.number;
        let block = Block::decode(&record.payload).map_err(|source| ChainError::Decode { number, source })?;
        if block.header.number != number {
            return Err(ChainError::Decode {
                number,
                source: BlockError::Shape("the header's number is not the record's"),
            });
        }
        Ok((record.hash, block))
    })
}

/// What [`verify_blocks`] found: the summary and each block's state root.
pub struct VerifiedChain {
    pub summary: AuditSummary,
    pub state_roots: Vec<B256>,
}

/// Verifies a chain's blocks from `genesis`: block 0 against the genesis, every later block
/// against its parent (hash, header, work, transactions root, signatures) and by
/// re-execution (gas, state root, receipts root). Stops at the first problem.
///
/// With [`ExecMode::Parallel`] this is a pipeline: a thread checks the next blocks and
/// recovers their signatures on `pool` while the caller's thread executes the current one
/// in dependency stages on a pool of its own (queued behind signature recovery on the shared
/// pool, execution would stall the pipeline it ends).
pub fn verify_blocks(
    genesis: &ChainGenesis,
    blocks: impl Iterator<Item = Result<(B256, Block), ChainError>> + Send,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
    progress: &mut dyn FnMut(u64),
) -> Result<VerifiedChain, ChainError> {
    let started = Instant::now();
    let config = genesis.config;
    let mut verified = match mode {
        ExecMode::Serial => execute_checked(genesis, check_in_order(blocks, config, mode, pool), mode, pool, progress)?,
        ExecMode::Parallel => {
            let exec_pool = rayon::ThreadPoolBuilder::new()
                .num_threads(pool.current_num_threads())
                .build()
                .map_err(|error| ChainError::Threads(error.to_string()))?;
            std::thread::scope(|scope| {
                let (sender, receiver) = std::sync::mpsc::sync_channel(4);
                scope.spawn(move || {
                    for checked in check_in_order(blocks, config, mode, pool) {
                        if sender.send(checked).is_err() {
                            break;
                        }
                    }
                });
                execute_checked(genesis, receiver.into_iter(), mode, &exec_pool, progress)
            })?
        }
    };
    verified.summary.elapsed = started.elapsed();
    Ok(verified)
}

/// Executes checked blocks from genesis, comparing every root; keeps each block's state root.
fn execute_checked(
    genesis: &ChainGenesis,
    blocks: impl Iterator<Item = Result<Checked, ChainError>>,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
    progress: &mut dyn FnMut(u64),
) -> Result<VerifiedChain, ChainError> {
    let mut header = genesis.header.clone();
    let mut state = genesis.state.clone();
    let mut hashes = RecentHashes::default();
    let mut state_roots: Vec<B256> = Vec::new();
    let (mut transactions, mut failed) = (0u64, 0u64);
    for checked in blocks {
        let Checked { number, hash, block, transactions: recovered } = checked?;
        if state_roots.is_empty() != (number == 0) {
            // Only the first block goes unchecked by `check_in_order`: it must be the genesis.
            return Err(ChainError::Missing(0));
        }
        if number == 0 {
            let computed = genesis.header.hash_slow();
            if hash != computed || block.hash() != computed || !block.transactions.is_empty() {
                return Err(ChainError::GenesisMismatch { stored: hash, computed });
            }
        } else {
            // `check_in_order` linked this block to the block before it, and block 0 was
            // compared with the genesis above: the chain hangs from the genesis.
            let parent_state = std::mem::take(&mut state);
            let verified = execute_block(&genesis.config, parent_state, &hashes, &block, recovered, mode, pool)?;
            transactions += block.transactions.len() as u64;
            failed += (verified.outcome.receipts().len() - verified.outcome.succeeded()) as u64;
            state = verified.state;
            header = block.header;
        }
        hashes.push(number, hash);
        state_roots.push(header.state_root);
        progress(number);
    }
    if state_roots.is_empty() {
        return Err(ChainError::Missing(0));
    }
    let summary = AuditSummary {
        blocks: state_roots.len() as u64,
        transactions,
        reverted_transactions: failed,
        head_number: header.number,
        head_hash: header.hash_slow(),
        state_root: header.state_root,
        state_store_block: header.number,
        elapsed: Duration::ZERO,
    };
    Ok(VerifiedChain { summary, state_roots })
}

/// Reads the state store without changing it (a torn log tail is reported, not cut;
/// unfinished checkpoints are left alone) and returns its block and root.
fn read_state_store(dir: &ChainDir, name: &str) -> Result<DurableTrie, ChainError> {
    let state_dir = dir.storage.path_of(name);
    let Some(storage) = dir.open_sub(name)? else {
        return Err(ChainError::EmptyState(state_dir));
    };
    let (state_store, recovery) =
        DurableTrie::open_read_only(storage, DurableOptions::default()).map_err(|source| {
            // Version v of the state store is the state after block v - 1.
            let block = source.version().map(|version| version.saturating_sub(1));
            ChainError::StateDamaged {
                dir: state_dir.clone(),
                chain: dir.path.clone(),
                block,
                source: Box::new(source),
            }
        })?;
    if recovery.truncated_log_bytes > 0 {
        return Err(ChainError::StateTail { bytes: recovery.truncated_log_bytes, version: state_store.version() });
    }
    if state_store.version() == 0 {
        return Err(ChainError::EmptyState(state_dir));
    }
    Ok(state_store)
}

/// Reads both state stores without changing them, checks every account's storage and code
/// against the contract store, and returns the block they hold and its state root.
fn read_state_stores(dir: &ChainDir) -> Result<(u64, B256), ChainError> {
    let accounts = read_state_store(dir, STATE_DIR)?;
    let contracts = read_state_store(dir, CONTRACTS_DIR)?;
    let number = accounts.version() - 1;
    if contracts.version() != accounts.version() {
        return Err(ChainError::StoresApart { state: number, contracts: contracts.version() - 1 });
    }
    let root = accounts.trie().root_hash();
    let state = contract_store::load_state(accounts.trie().snapshot(), contracts.trie())
        .map_err(|problem| ChainError::Contracts { number, problem })?;
    contract_store::check(&state, true).map_err(|problem| ChainError::Contracts { number, problem })?;
    Ok((number, root))
}

/// Audits the chain in `dir` without changing it: every stored record's checksum and hash,
/// the genesis block against `genesis.json`, the blocks ([`verify_blocks`]), and the state
/// store's root against the root of the block it holds. Stops at the first problem, naming
/// the block. A torn tail (an append a crash interrupted) is reported too: the audit judges
/// the bytes on disk, and [`Chain::open`] is what repairs them. In staged mode the state
/// store is recovered on a thread of its own while the blocks are verified.
pub fn audit(
    dir: &Path,
    mode: ExecMode,
    pool: &rayon::ThreadPool,
    progress: &mut dyn FnMut(u64),
) -> Result<AuditSummary, ChainError> {
    let started = Instant::now();
    let chain_dir = ChainDir::at(dir, false)?;
    let genesis = read_genesis_in(&chain_dir)?;
    check_format(&chain_dir, false)?;
    let (verified, state_store) = match mode {
        ExecMode::Serial => {
            (verify_blocks(&genesis, stored_blocks(dir), mode, pool, progress), read_state_stores(&chain_dir))
        }
        ExecMode::Parallel => std::thread::scope(|scope| {
            let state_store = scope.spawn(|| read_state_stores(&chain_dir));
            let verified = verify_blocks(&genesis, stored_blocks(dir), mode, pool, progress);
            let state_store = state_store.join().unwrap_or_else(|_| Err(ChainError::EmptyState(dir.join(STATE_DIR))));
            (verified, state_store)
        }),
    };
    let VerifiedChain { mut summary, state_roots } = verified?;
    let (state_block, found) = state_store?;
    let Some(expected) = state_roots.get(state_block as usize) else {
        return Err(ChainError::StateAhead { state: state_block, head: summary.head_number });
    };
    if found != *expected {
        return Err(ChainError::StateRoot { number: state_block, expected: *expected, found });
    }
    summary.state_store_block = state_block;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Block `number` of the chain in `dir` with its execution results (receipts, senders), by
/// verifying the chain from genesis up to it. Changes nothing on disk.
pub fn block_with_receipts(
    dir: &Path,
    number: u64,
    pool: &rayon::ThreadPool,
) -> Result<(Block, Option<Verified>), ChainError> {
    let genesis = read_genesis(dir)?;
    let mut header = genesis.header.clone();
    let mut state = genesis.state.clone();
    let mut hashes = RecentHashes::default();
    for stored in stored_blocks(dir) {
        let (hash, block) = stored?;
        if block.header.number == 0 {
            hashes.push(0, hash);
            let computed = genesis.header.hash_slow();
            if hash != computed || block.hash() != computed {
                return Err(ChainError::GenesisMismatch { stored: hash, computed });
            }
            if number == 0 {
                return Ok((block, None));
            }
            continue;
        }
        let verified =
            verify_block(&genesis.config, &header, &state, &hashes, &block, Some(hash), ExecMode::Parallel, pool)?;
        hashes.push(block.header.number, hash);
        if block.header.number == number {
            return Ok((block, Some(verified)));
        }
        header = block.header;
        state = verified.state;
    }
    Err(ChainError::Missing(number))
}
