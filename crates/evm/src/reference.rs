//! The peer Virga's executor is held to: revm alone over its in-memory `CacheDB` (what a
//! Rust user would pick), executing the same blocks with the same rules, its state root
//! computed independently with alloy-trie's `HashBuilder`. Tests check that roots,
//! receipts and logs agree; `virga bench evm` measures both on the same blocks.

use alloy_primitives::{Address, Bytes, B256, U256};
use alloy_trie::root::{state_root_unhashed, storage_root_unhashed};
use alloy_trie::TrieAccount;
use revm::database::{AccountState, CacheDB, EmptyDB};
use revm::state::AccountInfo;
use revm::{Context, ExecuteCommitEvm, MainBuilder, MainContext};
use virga_core::KECCAK_EMPTY;
use virga_trie::account::{Account, StateTrie};

use crate::block::{execute_in_order, ExecutedBlock};
use crate::db::bytecode;
use crate::executor::{BlockContext, ExecError};
use crate::transaction::EthTransaction;

/// revm's in-memory database. Its block hashes follow [`crate::DecimalHashes`].
pub type ReferenceDb = CacheDB<EmptyDB>;

/// One account of a genesis both executors start from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenesisAccount {
    pub address: Address,
    pub nonce: u64,
    pub balance: U256,
    pub code: Bytes,
    /// Nonzero slots.
    pub storage: Vec<(U256, U256)>,
}

/// The accounts as a DSM-Tree state (storage roots recorded).
pub fn genesis_state(accounts: &[GenesisAccount]) -> StateTrie {
    let mut state = StateTrie::new();
    for account in accounts {
        let code_hash = state.insert_code(&account.code);
        for (slot, value) in &account.storage {
            state.set_storage(account.address, B256::from(*slot), *value);
        }
        let stored = Account { nonce: account.nonce, balance: account.balance, code_hash, ..Account::default() };
        state.set_account(account.address, stored);
    }
    state.root();
    state
}

/// The accounts in revm's in-memory database.
pub fn genesis_reference(accounts: &[GenesisAccount]) -> ReferenceDb {
    let mut db = ReferenceDb::default();
    for account in accounts {
        let code = bytecode(&account.code);
        let code_hash = if account.code.is_empty() { KECCAK_EMPTY } else { code.hash_slow() };
        db.insert_account_info(account.address, AccountInfo::new(account.balance, account.nonce, code_hash, code));
        let entry = db.cache.accounts.entry(account.address).or_default();
        entry.storage.extend(account.storage.iter().copied());
    }
    db
}

/// Executes `txs` in `block` with revm over `db`, committing each, with the rules of
/// [`crate::execute_block`]: invalid or over-gas transactions are refused.
pub fn execute_reference(db: &mut ReferenceDb, block: &BlockContext, txs: &[EthTransaction]) -> ExecutedBlock {
    let cfg = block.cfg();
    let block_env = block.block_env(&cfg);
    let mut evm = Context::mainnet().with_db(&mut *db).with_cfg(cfg).with_block(block_env).build_mainnet();
    let transact = |env| evm.transact_commit(env).map_err(|error| ExecError::Other(error.to_string()));
    // revm's in-memory database cannot fail, so neither can the block.
    execute_in_order(block, txs, transact).unwrap_or_default()
}

/// The state root of revm's database, by alloy-trie: accounts that do not exist or are
/// empty (EIP-161) are left out, as are zero slots.
pub fn reference_root(db: &ReferenceDb) -> B256 {
    let accounts =
        db.cache.accounts.iter().filter(|(_, account)| {
            !matches!(account.account_state, AccountState::NotExisting) && !account.info.is_empty()
        });
    state_root_unhashed(accounts.map(|(address, account)| {
        let storage = account.storage.iter().filter(|(_, value)| !value.is_zero());
        let storage_root = storage_root_unhashed(storage.map(|(slot, value)| (B256::from(*slot), *value)));
        let trie_account = TrieAccount {
            nonce: account.info.nonce,
            balance: account.info.balance,
            storage_root,
            code_hash: account.info.code_hash,
        };
        (*address, trie_account)
    }))
}
