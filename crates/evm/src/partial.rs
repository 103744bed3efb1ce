//! A partial world state: what witnesses brought of the account trie, of contracts' storage
//! tries and of code (a RainBlock miner's top layer with its contracts, or a client's view).
//! Reading what it lacks is a named [`StateError::NotHeld`]; a block's writes apply wherever
//! their paths are held, and the roots are those of the whole state.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use alloy_primitives::{keccak256, Address, B256, U256};
use alloy_rlp::Decodable;
use revm::bytecode::Bytecode;
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{storage_value_rlp, Account};
use virga_trie::partial::{BagApplied, BagError};
use virga_trie::proof::NodeBag;
use virga_trie::PartialTrie;

use crate::db::{bytecode, StateError, StateSource, WorldState};
use crate::overlay::BlockWrites;

/// Why a witness could not join a partial state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WitnessJoinError {
    #[error("slot witness of the account with key {account}: {source}")]
    Account {
        account: B256,
        #[source]
        source: StateError,
    },
    #[error("slot witness of the account with key {account}: {source}")]
    Bag {
        account: B256,
        #[source]
        source: BagError,
    },
    #[error("code handed in as {claimed} hashes to {actual}")]
    CodeHash { claimed: B256, actual: B256 },
}

/// Accounts, contracts' storage and code, each held as far as witnesses reached.
#[derive(Clone, Default)]
pub struct PartialState {
    pub accounts: PartialTrie,
    /// Storage tries by the account's secure-trie key (keccak of the address), as storage
    /// nodes and bags name them; a contract absent here has only its account's storage root.
    storage: HashMap<B256, PartialTrie>,
    code: HashMap<B256, Bytecode>,
}

impl PartialState {
    pub fn new(accounts: PartialTrie) -> PartialState {
        PartialState { accounts, storage: HashMap::new(), code: HashMap::new() }
    }

    /// Attaches a witness of storage slots of the account with secure-trie key `account`:
    /// whole proofs from the storage root the account (already held) announces, or proofs
    /// compacted below the levels held. Nodes that match no hash node are ignored, so a bag
    /// can never change a root.
    pub fn attach_storage(&mut self, account: B256, bag: &NodeBag) -> Result<BagApplied, WitnessJoinError> {
        let trie = self.storage_trie_mut(account)?;
        trie.apply_bag(bag).map_err(|source| WitnessJoinError::Bag { account, source })
    }

    /// Attaches the top levels of `account`'s storage trie (its storage node's top nodes,
    /// parents first): nodes join only where they hash to what the trie refers to, from
    /// the storage root the held account announces.
    pub fn attach_storage_top(&mut self, account: B256, nodes: &[Vec<u8>]) -> Result<BagApplied, WitnessJoinError> {
        let trie = self.storage_trie_mut(account)?;
        trie.attach_nodes(nodes).map_err(|source| WitnessJoinError::Bag { account, source })
    }

    /// The storage trie held for `account`, started from the storage root its held account
    /// announces if there is none yet.
    fn storage_trie_mut(&mut self, account: B256) -> Result<&mut PartialTrie, WitnessJoinError> {
        match self.storage.entry(account) {
            Entry::Occupied(held) => Ok(held.into_mut()),
            Entry::Vacant(vacant) => {
                let root = storage_root_by_key(&self.accounts, &account, || format!("the account with key {account}"))
                    .map_err(|source| WitnessJoinError::Account { account, source })?;
                Ok(vacant.insert(PartialTrie::from_root_hash(root)))
            }
        }
    }

    /// Holds code that hashes to `hash`.
    pub fn insert_code(&mut self, hash: B256, code: &[u8]) -> Result<(), WitnessJoinError> {
        let actual = keccak256(code);
        if actual != hash {
            return Err(WitnessJoinError::CodeHash { claimed: hash, actual });
        }
        self.code.entry(hash).or_insert_with(|| bytecode(code));
        Ok(())
    }

    /// The storage trie held for `address`, if any.
    pub fn storage_trie(&self, address: &Address) -> Option<&PartialTrie> {
        self.storage.get(&keccak256(address))
    }

    /// Memory held: the account trie's and every storage trie's nodes, and the code.
    pub fn memory_bytes(&self) -> usize {
        self.accounts.memory_bytes() + self.contracts_memory_bytes()
    }

    /// Memory held by the storage tries' nodes and the code (no walk of the account trie).
    pub fn contracts_memory_bytes(&self) -> usize {
        let storage: usize = self.storage.values().map(PartialTrie::memory_bytes).sum();
        storage + self.code.values().map(Bytecode::len).sum::<usize>()
    }

    /// Nodes held in the account trie and the storage tries.
    pub fn node_count(&self) -> usize {
        self.accounts.node_count() + self.storage.values().map(PartialTrie::node_count).sum::<usize>()
    }

    /// Prunes every storage trie to its top `retention` levels and forgets the code (it
    /// comes again with the next bag that needs it). The account trie is pruned by its owner.
    pub fn prune_contracts(&mut self, retention: usize) {
        for trie in self.storage.values_mut() {
            trie.prune(retention);
        }
        self.code.clear();
    }

    fn storage_root_by_key(&self, key: &B256, name: impl FnOnce() -> String) -> Result<B256, StateError> {
        storage_root_by_key(&self.accounts, key, name)
    }
}

/// The storage root the account with secure-trie key `key` announces (empty when absent).
fn storage_root_by_key(accounts: &PartialTrie, key: &B256, name: impl FnOnce() -> String) -> Result<B256, StateError> {
    match accounts.get(key.as_slice()) {
        Ok(None) => Ok(EMPTY_ROOT),
        Ok(Some(raw)) => Account::decode_rlp(&raw)
            .map(|account| account.storage_root)
            .map_err(|error| not_held(name(), format!("its account does not decode: {error}"))),
        Err(stopped) => Err(not_held(name(), stopped)),
    }
}

fn not_held(what: String, reason: impl ToString) -> StateError {
    StateError::NotHeld { what, reason: reason.to_string() }
}

impl StateSource for PartialState {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        StateSource::account(&self.accounts, address)
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        let key = keccak256(B256::from(slot));
        let account = keccak256(address);
        let raw = match self.storage.get(&account) {
            Some(trie) => trie
                .get(key.as_slice())
                .map_err(|stopped| not_held(format!("storage slot {slot} of {address}"), stopped))?,
            None if self.storage_root_by_key(&account, || format!("account {address}"))? == EMPTY_ROOT => None,
            None => return Err(not_held(format!("storage slot {slot} of {address}"), "no witness of its storage")),
        };
        match raw {
            None => Ok(U256::ZERO),
            Some(raw) => U256::decode(&mut &raw[..]).map_err(|error| StateError::Storage {
                address: *address,
                slot,
                reason: error.to_string(),
            }),
        }
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        if *hash == KECCAK_EMPTY {
            return Ok(Bytecode::new());
        }
        self.code.get(hash).cloned().ok_or_else(|| not_held(format!("code {hash}"), "not handed in"))
    }
}

impl WorldState for PartialState {
    fn apply(&mut self, writes: &BlockWrites) -> Result<(), StateError> {
        for (address, write) in &writes.accounts {
            let key = keccak256(address);
            let Some(info) = &write.info else {
                self.accounts
                    .remove(key.as_slice())
                    .map_err(|stopped| not_held(format!("account {address}"), stopped))?;
                self.storage.remove(&key);
                continue;
            };
            let storage_root = if write.storage_cleared || !write.slots.is_empty() {
                let trie = match write.storage_cleared {
                    true => self.storage.entry(key).insert_entry(PartialTrie::from_root_hash(EMPTY_ROOT)).into_mut(),
                    false => {
                        let root = self.storage_root_by_key(&key, || format!("account {address}"))?;
                        self.storage.entry(key).or_insert_with(|| PartialTrie::from_root_hash(root))
                    }
                };
                for (slot, value) in &write.slots {
                    let slot_key = keccak256(B256::from(*slot));
                    let written = match value.is_zero() {
                        true => trie.remove(slot_key.as_slice()).map(|_| ()),
                        false => trie.insert(slot_key.as_slice(), &storage_value_rlp(*value)),
                    };
                    written.map_err(|stopped| not_held(format!("storage slot {slot} of {address}"), stopped))?;
                }
                trie.root_hash()
            } else {
                self.storage_root_by_key(&key, || format!("account {address}"))?
            };
            if let Some(code) = info.code.as_ref().filter(|_| info.code_hash != KECCAK_EMPTY) {
                self.code.entry(info.code_hash).or_insert_with(|| code.clone());
            }
            let account = Account { nonce: info.nonce, balance: info.balance, storage_root, code_hash: info.code_hash };
            self.accounts
                .insert(key.as_slice(), &account.rlp())
                .map_err(|stopped| not_held(format!("account {address}"), stopped))?;
        }
        Ok(())
    }

    fn state_root(&mut self, _pool: Option<&rayon::ThreadPool>) -> B256 {
        self.accounts.root_hash()
    }
}
