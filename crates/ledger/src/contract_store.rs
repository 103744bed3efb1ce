//! The contract half of a chain's state on disk: every storage slot and every piece of code,
//! kept in a [`virga_trie::durable::DurableTrie`] of its own beside the account trie's, one
//! version per block in step with it.
//!
//! Keys are flat: a storage slot is the account's address (20 bytes) followed by keccak-256
//! of the slot (32 bytes), its value the slot's RLP; code is its keccak-256 hash (32 bytes),
//! its value the code. Slots are stored by hashed key, as the storage tries hold them, so a
//! block that clears an account's storage (a self-destruct, or a creation over an address
//! that held storage) deletes exactly the keys its parent's storage trie lists.
//!
//! This trie's root commits to nothing on chain: the accounts' storage roots and code hashes
//! do. [`check`] recomputes them from the store and names the first account whose storage or
//! code disagrees.

use std::collections::{BTreeMap, HashMap};

use alloy_primitives::{keccak256, Address, B256};
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_evm::BlockWrites;
use virga_trie::account::{Account, StateTrie};
use virga_trie::versions::Update;
use virga_trie::{SecureTrie, Trie};

const SLOT_KEY_LEN: usize = 20 + 32;
const CODE_KEY_LEN: usize = 32;

/// What is wrong with a chain's contract store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContractProblem {
    #[error("a key of {0} byte(s), neither a storage slot (52) nor code (32)")]
    MalformedKey(usize),
    #[error("the storage of {address} hashes to {found}, but the account's storage root is {expected}")]
    StorageRoot { address: Address, expected: B256, found: B256 },
    #[error("{address} has stored slots but no account (or an account with empty storage)")]
    OrphanStorage { address: Address },
    #[error("code stored under {hash} hashes to {found}: the code was changed")]
    CodeHash { hash: B256, found: B256 },
    #[error(
        "the account with hashed address {hashed_address} has storage root {expected}, but no slot of it is stored"
    )]
    MissingStorage { hashed_address: B256, expected: B256 },
    #[error("the code of the account with hashed address {hashed_address} (code hash {hash}) is not in the store")]
    MissingCode { hashed_address: B256, hash: B256 },
    #[error("account {address} does not decode: {reason}")]
    Account { address: Address, reason: String },
}

fn slot_key(address: &Address, hashed_slot: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(SLOT_KEY_LEN);
    key.extend_from_slice(address.as_slice());
    key.extend_from_slice(hashed_slot);
    key
}

/// The whole contract half of `state`, as updates of an empty store.
pub(crate) fn all_contracts(state: &StateTrie) -> Vec<Update> {
    let mut updates = Vec::new();
    for (address, storage) in state.storage_tries() {
        for (hashed_slot, value) in storage.as_trie().entries() {
            updates.push((slot_key(address, &hashed_slot), Some(value)));
        }
    }
    for (hash, code) in state.code_entries() {
        updates.push((hash.to_vec(), Some(code.to_vec())));
    }
    updates.sort();
    updates
}

/// The store's updates for a block that took `parent` to `state` with `writes`.
pub(crate) fn contract_updates(parent: &StateTrie, state: &StateTrie, writes: &BlockWrites) -> Vec<Update> {
    let mut updates: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    for (address, write) in &writes.accounts {
        if write.info.is_none() || write.storage_cleared {
            if let Some(storage) = parent.storage_trie(address) {
                for (hashed_slot, _) in storage.as_trie().entries() {
                    updates.insert(slot_key(address, &hashed_slot), None);
                }
            }
        }
        for (slot, _) in &write.slots {
            let hashed_slot = keccak256(B256::from(*slot));
            let value = state.storage_trie(address).and_then(|trie| trie.get_hashed(&hashed_slot));
            updates.insert(slot_key(address, hashed_slot.as_slice()), value.map(|value| value.into_owned()));
        }
        if let Some(info) = &write.info {
            if info.code_hash != KECCAK_EMPTY && parent.code(&info.code_hash).is_none() {
                if let Some(code) = state.code(&info.code_hash) {
                    updates.insert(info.code_hash.to_vec(), Some(code.to_vec()));
                }
            }
        }
    }
    updates.into_iter().collect()
}

/// The state of a chain from its account trie and its contract store.
pub(crate) fn load_state(accounts: Trie, contracts: &Trie) -> Result<StateTrie, ContractProblem> {
    let mut storage: HashMap<Address, SecureTrie> = HashMap::new();
    let mut code: HashMap<B256, Vec<u8>> = HashMap::new();
    for (key, value) in contracts.entries() {
        match key.len() {
            SLOT_KEY_LEN => {
                let (address, hashed_slot) = key.split_at(20);
                let trie = storage.entry(Address::from_slice(address)).or_default();
                trie.insert_hashed(&B256::from_slice(hashed_slot), &value);
            }
            CODE_KEY_LEN => {
                code.insert(B256::from_slice(&key), value);
            }
            other => return Err(ContractProblem::MalformedKey(other)),
        }
    }
    Ok(StateTrie::from_parts(SecureTrie::from_trie(accounts), storage, code))
}

/// Checks every stored storage trie against its account's storage root and every piece of
/// code against its hash; with `every_account`, also that each account's storage and code
/// are there (a walk over all accounts, which an audit affords and an open does not).
pub(crate) fn check(state: &StateTrie, every_account: bool) -> Result<(), ContractProblem> {
    for (hash, code) in state.code_entries() {
        let found = keccak256(code);
        if found != *hash {
            return Err(ContractProblem::CodeHash { hash: *hash, found });
        }
    }
    for (address, storage) in state.storage_tries() {
        let account = account_of(state, address)?;
        let found = storage.root_hash();
        match account {
            Some(account) if account.storage_root != found => {
                return Err(ContractProblem::StorageRoot { address: *address, expected: account.storage_root, found });
            }
            None if found != EMPTY_ROOT => return Err(ContractProblem::OrphanStorage { address: *address }),
            _ => {}
        }
    }
    if every_account {
        check_accounts(state)?;
    }
    Ok(())
}

fn account_of(state: &StateTrie, address: &Address) -> Result<Option<Account>, ContractProblem> {
    state.account(address).map_err(|error| ContractProblem::Account { address: *address, reason: error.to_string() })
}

/// Every account that claims storage or code has it. Accounts are keyed by hashed address
/// (the address itself is not recoverable), so problems name the hash.
fn check_accounts(state: &StateTrie) -> Result<(), ContractProblem> {
    let with_storage: std::collections::HashSet<B256> =
        state.storage_tries().map(|(address, _)| keccak256(address)).collect();
    for (key, raw) in state.accounts().as_trie().entries() {
        let hashed_address = B256::from_slice(&key);
        let account = Account::decode_rlp(&raw).map_err(|error| ContractProblem::Account {
            address: Address::ZERO,
            reason: format!("(hashed address {hashed_address}) {error}"),
        })?;
        if account.storage_root != EMPTY_ROOT && !with_storage.contains(&hashed_address) {
            return Err(ContractProblem::MissingStorage { hashed_address, expected: account.storage_root });
        }
        if account.code_hash != KECCAK_EMPTY && state.code(&account.code_hash).is_none() {
            return Err(ContractProblem::MissingCode { hashed_address, hash: account.code_hash });
        }
    }
    Ok(())
}
