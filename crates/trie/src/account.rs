//! Ethereum accounts and the world state: a secure trie of accounts, each with its own
//! secure storage trie whose root the account records.

use std::collections::{BTreeSet, HashMap};

use alloy_primitives::{keccak256, Address, B256, U256};
use alloy_rlp::{Decodable, Encodable, RlpDecodable, RlpEncodable};
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};

use crate::SecureTrie;

/// An account as the state trie stores it (RLP list of these four fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, RlpEncodable, RlpDecodable)]
pub struct Account {
    pub nonce: u64,
    pub balance: U256,
    pub storage_root: B256,
    pub code_hash: B256,
}

impl Default for Account {
    fn default() -> Self {
        Self { nonce: 0, balance: U256::ZERO, storage_root: EMPTY_ROOT, code_hash: KECCAK_EMPTY }
    }
}

impl Account {
    /// An account with no code and no storage.
    pub fn with_balance(nonce: u64, balance: U256) -> Self {
        Self { nonce, balance, ..Self::default() }
    }

    pub fn rlp(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.length());
        self.encode(&mut out);
        out
    }

    /// Decodes an account's RLP, rejecting trailing bytes.
    pub fn decode_rlp(mut bytes: &[u8]) -> Result<Self, alloy_rlp::Error> {
        let account = Self::decode(&mut bytes)?;
        if !bytes.is_empty() {
            return Err(alloy_rlp::Error::Custom("trailing bytes after account"));
        }
        Ok(account)
    }
}

/// The RLP a storage trie holds for a slot value: the big-endian integer without
/// leading zeros, as an RLP string. Zero is not stored (it deletes the slot).
pub fn storage_value_rlp(value: U256) -> Vec<u8> {
    alloy_rlp::encode(value)
}

/// The world state: accounts keyed by address, storage per account, code by hash.
#[derive(Clone, Default)]
pub struct StateTrie {
    accounts: SecureTrie,
    storage: HashMap<Address, SecureTrie>,
    code: HashMap<B256, Vec<u8>>,
    /// Accounts whose storage changed since their storage root was last recorded.
    dirty_storage: BTreeSet<Address>,
}

impl StateTrie {
    pub fn new() -> Self {
        Self::default()
    }

    /// The account at `address`. A stored value that is not a valid account is an error
    /// of the state itself, reported rather than hidden.
    pub fn account(&self, address: &Address) -> Result<Option<Account>, alloy_rlp::Error> {
        self.accounts.get(address.as_slice()).map(|raw| Account::decode_rlp(&raw)).transpose()
    }

    /// The account whose secure-trie key (keccak-256 of the address) is `key`; callers that
    /// touch an account twice hash its address once.
    pub fn account_by_key(&self, key: &B256) -> Result<Option<Account>, alloy_rlp::Error> {
        self.accounts.get_hashed(key).map(|raw| Account::decode_rlp(&raw)).transpose()
    }

    /// Stores `account` under its secure-trie key (see [`Self::account_by_key`]).
    pub fn set_account_by_key(&mut self, key: &B256, account: Account) {
        self.accounts.insert_hashed(key, &account.rlp());
    }

    /// The state root with the account trie hashed in parallel (see
    /// [`crate::Trie::root_hash_parallel`]); only for states without dirty storage, which
    /// [`Self::root`] would fold in first.
    pub fn root_parallel(&mut self) -> B256 {
        if self.dirty_storage.is_empty() {
            self.accounts.as_trie().root_hash_parallel()
        } else {
            self.root()
        }
    }

    /// Stores `account` as is (its storage root is overwritten at the next [`Self::root`]
    /// if this account's storage changes).
    pub fn set_account(&mut self, address: Address, account: Account) {
        self.accounts.insert(address.as_slice(), &account.rlp());
    }

    pub fn remove_account(&mut self, address: &Address) {
        self.accounts.remove(address.as_slice());
        self.storage.remove(address);
        self.dirty_storage.remove(address);
    }

    /// Stores code and returns its hash (for the account's `code_hash`).
    pub fn insert_code(&mut self, code: &[u8]) -> B256 {
        if code.is_empty() {
            return KECCAK_EMPTY;
        }
        let hash = keccak256(code);
        self.code.entry(hash).or_insert_with(|| code.to_vec());
        hash
    }

    pub fn code(&self, hash: &B256) -> Option<&[u8]> {
        self.code.get(hash).map(Vec::as_slice)
    }

    pub fn storage(&self, address: &Address, slot: &B256) -> U256 {
        self.storage
            .get(address)
            .and_then(|trie| trie.get(slot.as_slice()))
            .and_then(|raw| U256::decode(&mut &raw[..]).ok())
            .unwrap_or(U256::ZERO)
    }

    /// Sets a storage slot; zero deletes it.
    pub fn set_storage(&mut self, address: Address, slot: B256, value: U256) {
        let trie = self.storage.entry(address).or_default();
        if value.is_zero() {
            trie.remove(slot.as_slice());
        } else {
            trie.insert(slot.as_slice(), &storage_value_rlp(value));
        }
        self.dirty_storage.insert(address);
    }

    /// Drops every storage slot of `address` (a contract created over an address that held
    /// storage starts empty); its storage root becomes empty at the next [`Self::root`].
    pub fn clear_storage(&mut self, address: &Address) {
        self.storage.remove(address);
        self.dirty_storage.insert(*address);
    }

    /// The storage slot's value, or why the stored bytes are not one: the state is damaged.
    pub fn try_storage(&self, address: &Address, slot: &B256) -> Result<U256, alloy_rlp::Error> {
        match self.storage.get(address).and_then(|trie| trie.get(slot.as_slice())) {
            Some(raw) => U256::decode(&mut &raw[..]),
            None => Ok(U256::ZERO),
        }
    }

    /// Records the storage roots of accounts whose storage changed, then returns the
    /// state root.
    pub fn root(&mut self) -> B256 {
        for address in std::mem::take(&mut self.dirty_storage) {
            let storage_root = self.storage.get(&address).map(SecureTrie::root_hash).unwrap_or(EMPTY_ROOT);
            let mut account = match self.account(&address) {
                Ok(Some(account)) => account,
                // Storage written for an account never created: create it empty, as Ethereum does.
                Ok(None) | Err(_) => Account::default(),
            };
            account.storage_root = storage_root;
            self.set_account(address, account);
        }
        self.accounts.root_hash()
    }

    pub fn accounts(&self) -> &SecureTrie {
        &self.accounts
    }

    /// A state of accounts without storage or code (value-transfer ledgers keep only this).
    pub fn from_accounts(accounts: SecureTrie) -> Self {
        Self { accounts, ..Self::default() }
    }

    /// A state from its parts as a store keeps them: the account trie, each account's
    /// storage trie, and code by hash. Storage roots are taken from the accounts as stored.
    pub fn from_parts(
        accounts: SecureTrie,
        storage: HashMap<Address, SecureTrie>,
        code: HashMap<B256, Vec<u8>>,
    ) -> Self {
        Self { accounts, storage, code, dirty_storage: BTreeSet::new() }
    }

    /// The storage trie of `address`, if it has stored any slot.
    pub fn storage_trie(&self, address: &Address) -> Option<&SecureTrie> {
        self.storage.get(address)
    }

    /// Every account's storage trie.
    pub fn storage_tries(&self) -> impl Iterator<Item = (&Address, &SecureTrie)> {
        self.storage.iter()
    }

    /// Every piece of code, by hash.
    pub fn code_entries(&self) -> impl Iterator<Item = (&B256, &[u8])> {
        self.code.iter().map(|(hash, code)| (hash, code.as_slice()))
    }
}

impl crate::genesis::Genesis {
    /// The world state the genesis `alloc` describes; see [`alloc_state`].
    pub fn state(&self) -> StateTrie {
        alloc_state(&self.alloc)
    }

    /// The state root of the genesis `alloc`, as in the genesis block header.
    pub fn state_root(&self) -> B256 {
        self.state().root()
    }
}

/// The world state a genesis `alloc` describes: each account's storage trie (zero values are
/// not stored), its code, then the account itself.
pub fn alloc_state(alloc: &crate::genesis::Alloc) -> StateTrie {
    let mut state = StateTrie::new();
    // One bulk build instead of an insert per account: genesis files hold up to millions.
    let mut accounts: Vec<(Address, Vec<u8>)> = Vec::with_capacity(alloc.len());
    for (address, genesis_account) in alloc {
        let code_hash = state.insert_code(genesis_account.code.as_ref().map_or(&[][..], |code| code.as_ref()));
        let mut account = Account {
            nonce: genesis_account.nonce.unwrap_or_default(),
            balance: genesis_account.balance,
            code_hash,
            storage_root: EMPTY_ROOT,
        };
        let mut slots = genesis_account.storage_slots().filter(|(_, value)| !value.is_zero()).peekable();
        if slots.peek().is_some() {
            let mut storage = SecureTrie::new();
            for (slot, value) in slots {
                storage.insert(slot.as_slice(), &storage_value_rlp(value));
            }
            account.storage_root = storage.root_hash();
            state.storage.insert(*address, storage);
        }
        accounts.push((*address, account.rlp()));
    }
    state.accounts.insert_many(accounts);
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_rlp_round_trips_and_rejects_garbage() {
        let account = Account::with_balance(3, U256::from(1_000_000u64));
        assert_eq!(Account::decode_rlp(&account.rlp()), Ok(account));
        let mut extra = account.rlp();
        extra.push(0);
        assert!(Account::decode_rlp(&extra).is_err());
        assert!(Account::decode_rlp(&[0xc1]).is_err());
    }

    #[test]
    fn storage_changes_reach_the_account_and_the_root() {
        let mut state = StateTrie::new();
        let address = Address::repeat_byte(7);
        state.set_account(address, Account::with_balance(0, U256::from(5u8)));
        let before = state.root();
        state.set_storage(address, B256::with_last_byte(1), U256::from(42u8));
        let after = state.root();
        assert_ne!(before, after);
        let account = state.account(&address).unwrap().unwrap();
        assert_ne!(account.storage_root, EMPTY_ROOT);
        state.set_storage(address, B256::with_last_byte(1), U256::ZERO);
        assert_eq!(state.root(), before, "clearing the only slot restores the empty storage root");
    }
}
