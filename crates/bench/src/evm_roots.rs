//! The peer of execution with a state root after every block: revm alone over its
//! `CacheDB`, with `eth_trie` (Ethereum's Merkle-Patricia trie, the `peers` feature) keeping
//! the accounts and every contract's storage, updated with each block's changes and hashed
//! after it. What a Rust user without Virga would assemble from the two crates.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use alloy_primitives::{keccak256, Address, B256, U256};
use alloy_trie::TrieAccount;
use eth_trie::{EthTrie, MemoryDB, Trie as _};
use revm::database::AccountState;
use revm::{Context, ExecuteCommitEvm, ExecuteEvm, MainBuilder, MainContext};
use virga_core::EMPTY_ROOT;
use virga_evm::reference::{genesis_reference, GenesisAccount, ReferenceDb};
use virga_evm::{BlockContext, ExecError, ExecutedBlock};

/// revm over its `CacheDB`, and the Ethereum tries of the same state.
pub struct RevmEthTrie {
    db: ReferenceDb,
    accounts: EthTrie<MemoryDB>,
    storage: HashMap<Address, EthTrie<MemoryDB>>,
}

fn new_trie() -> EthTrie<MemoryDB> {
    // Light mode: replaced nodes are dropped at each commit, so memory holds the current
    // tries only, as Virga's does.
    EthTrie::new(Arc::new(MemoryDB::new(true)))
}

fn expect_trie<T>(result: Result<T, eth_trie::TrieError>) -> T {
    // The in-memory database cannot fail; a failure is a bug of the peer crate.
    result.unwrap_or_else(|error| panic!("eth_trie over its memory db failed: {error}"))
}

impl RevmEthTrie {
    /// Loads `genesis` into revm's database and into the tries (not timed by callers).
    pub fn new(genesis: &[GenesisAccount]) -> Self {
        let mut peer = Self { db: genesis_reference(genesis), accounts: new_trie(), storage: HashMap::new() };
        let touched: Vec<(Address, BTreeSet<U256>)> = genesis
            .iter()
            .map(|account| (account.address, account.storage.iter().map(|(slot, _)| *slot).collect()))
            .collect();
        peer.update_tries(touched);
        peer
    }

    /// Executes a block's transactions (each committed to the database, its changes
    /// recorded), then updates the tries and returns the state root.
    pub fn execute_block(&mut self, block: &BlockContext, txs: &[virga_evm::EthTransaction]) -> (ExecutedBlock, B256) {
        let mut touched: HashMap<Address, BTreeSet<U256>> = HashMap::new();
        let executed = {
            let cfg = block.cfg();
            let block_env = block.block_env(&cfg);
            let mut evm = Context::mainnet().with_db(&mut self.db).with_cfg(cfg).with_block(block_env).build_mainnet();
            let transact = |env| {
                let outcome = evm.transact(env).map_err(|error| ExecError::Other(error.to_string()))?;
                for (address, account) in outcome.state.iter().filter(|(_, account)| account.is_touched()) {
                    let slots = touched.entry(*address).or_default();
                    slots.extend(account.changed_storage_slots().map(|(slot, _)| *slot));
                }
                evm.commit(outcome.state);
                Ok(outcome.result)
            };
            virga_evm::block::execute_in_order(block, txs, transact).unwrap_or_default()
        };
        let root = self.update_tries(touched.into_iter().collect());
        (executed, root)
    }

    /// Writes the touched accounts and slots from the database into the tries; the root.
    fn update_tries(&mut self, touched: Vec<(Address, BTreeSet<U256>)>) -> B256 {
        for (address, slots) in touched {
            let Some(account) = self.db.cache.accounts.get(&address) else { continue };
            if !slots.is_empty() {
                let trie = self.storage.entry(address).or_insert_with(new_trie);
                for slot in slots {
                    let key = keccak256(B256::from(slot));
                    match account.storage.get(&slot).copied().unwrap_or_default() {
                        value if value.is_zero() => {
                            expect_trie(trie.remove(key.as_slice()));
                        }
                        value => expect_trie(trie.insert(key.as_slice(), &alloy_rlp::encode(value))),
                    }
                }
            }
            let key = keccak256(address);
            if matches!(account.account_state, AccountState::NotExisting) || account.info.is_empty() {
                expect_trie(self.accounts.remove(key.as_slice()));
                continue;
            }
            let storage_root = match self.storage.get_mut(&address) {
                Some(trie) => B256::from(expect_trie(trie.root_hash()).0),
                None => EMPTY_ROOT,
            };
            let trie_account = TrieAccount {
                nonce: account.info.nonce,
                balance: account.info.balance,
                storage_root,
                code_hash: account.info.code_hash,
            };
            expect_trie(self.accounts.insert(key.as_slice(), &alloy_rlp::encode(trie_account)));
        }
        B256::from(expect_trie(self.accounts.root_hash()).0)
    }
}
