//! A block's writes over the DSM-Tree, and its read cache: revm reads each account, slot and
//! code from the trie at most once per block, and every transaction sees the writes of the
//! ones before it. At the end of the block the writes go into the trie in one pass.
//!
//! The overlay applies revm's change sets with Ethereum's rules from Spurious Dragon on
//! (every fork Virga runs; revm normalizes older ones to the same rule): an account that
//! was touched and is left empty is deleted (EIP-161), as is a self-destructed one, and a
//! created account's storage starts empty.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use alloy_primitives::{Address, B256, U256};
use revm::bytecode::Bytecode;
use revm::database_interface::{Database, DatabaseCommit, DatabaseRef};
use revm::primitives::AddressMap;
use revm::state::{Account as EvmAccount, AccountInfo};
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{Account, StateTrie};

use crate::db::{StateDb, StateError};

/// One account as the block has seen or left it.
#[derive(Clone, Debug)]
struct AccountEntry {
    /// `None`: absent, or deleted by this block.
    info: Option<AccountInfo>,
    /// Changed by this block (rather than only read).
    written: bool,
    /// The account's storage in the trie no longer counts (deleted, or created anew).
    storage_cleared: bool,
    /// Slots read or written; the flag says written.
    slots: HashMap<U256, (U256, bool)>,
}

/// The block's view of the state: the trie below, this block's reads and writes above.
pub struct BlockOverlay<'a> {
    base: StateDb<'a>,
    accounts: HashMap<Address, AccountEntry>,
    code: HashMap<B256, Bytecode>,
}

impl<'a> BlockOverlay<'a> {
    pub fn new(base: StateDb<'a>) -> Self {
        Self { base, accounts: HashMap::new(), code: HashMap::new() }
    }

    fn entry(&mut self, address: Address) -> Result<&mut AccountEntry, StateError> {
        match self.accounts.entry(address) {
            Entry::Occupied(entry) => Ok(entry.into_mut()),
            Entry::Vacant(vacant) => {
                let info = self.base.basic_ref(address)?;
                Ok(vacant.insert(AccountEntry { info, written: false, storage_cleared: false, slots: HashMap::new() }))
            }
        }
    }

    /// What the block changed, to be applied to the trie it read from.
    pub fn into_writes(self) -> BlockWrites {
        let accounts = self
            .accounts
            .into_iter()
            .filter(|(_, entry)| entry.written)
            .map(|(address, entry)| {
                let slots = entry
                    .slots
                    .into_iter()
                    .filter(|(_, (_, written))| *written)
                    .map(|(slot, (value, _))| (slot, value))
                    .collect();
                (address, AccountWrite { info: entry.info, storage_cleared: entry.storage_cleared, slots })
            })
            .collect();
        BlockWrites { accounts }
    }

    fn commit_account(&mut self, address: Address, account: EvmAccount) {
        if !account.is_touched() {
            return;
        }
        let Ok(entry) = self.entry(address) else {
            // revm loaded this account through us, so it is cached; a state error would have
            // failed the transaction before it reached commit.
            return;
        };
        entry.written = true;
        if account.is_selfdestructed() || account.is_empty() {
            *entry = AccountEntry { info: None, written: true, storage_cleared: true, slots: HashMap::new() };
            return;
        }
        if account.is_created() {
            entry.storage_cleared = true;
            entry.slots.clear();
        }
        let created = account.is_created();
        for (slot, value) in &account.storage {
            if created || value.is_changed() {
                entry.slots.insert(*slot, (value.present_value(), true));
            }
        }
        let info = account.info;
        if info.code_hash != KECCAK_EMPTY {
            if let Some(code) = &info.code {
                self.code.entry(info.code_hash).or_insert_with(|| code.clone());
            }
        }
        if let Some(entry) = self.accounts.get_mut(&address) {
            entry.info = Some(info);
        }
    }
}

impl Database for BlockOverlay<'_> {
    type Error = StateError;

    fn basic(&mut self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        Ok(self.entry(address)?.info.clone())
    }

    fn code_by_hash(&mut self, code_hash: B256) -> Result<Bytecode, StateError> {
        if let Some(code) = self.code.get(&code_hash) {
            return Ok(code.clone());
        }
        let code = self.base.code_by_hash_ref(code_hash)?;
        self.code.insert(code_hash, code.clone());
        Ok(code)
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, StateError> {
        let base = self.base;
        let entry = self.entry(address)?;
        if let Some((value, _)) = entry.slots.get(&slot) {
            return Ok(*value);
        }
        let value = if entry.storage_cleared { U256::ZERO } else { base.storage_ref(address, slot)? };
        entry.slots.insert(slot, (value, false));
        Ok(value)
    }

    fn block_hash(&mut self, number: u64) -> Result<B256, StateError> {
        self.base.block_hash_ref(number)
    }
}

impl DatabaseCommit for BlockOverlay<'_> {
    fn commit(&mut self, changes: AddressMap<EvmAccount>) {
        for (address, account) in changes {
            self.commit_account(address, account);
        }
    }
}

/// One account's change by a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountWrite {
    /// `None`: the account is deleted.
    pub info: Option<AccountInfo>,
    /// Its storage in the trie is dropped before `slots` are written.
    pub storage_cleared: bool,
    /// Slots written (zero deletes).
    pub slots: Vec<(U256, U256)>,
}

/// Everything a block changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockWrites {
    pub accounts: Vec<(Address, AccountWrite)>,
}

impl BlockWrites {
    /// Writes the changes into `state`; storage roots are recorded by the next
    /// [`StateTrie::root`].
    pub fn apply_to(self, state: &mut StateTrie) {
        for (address, write) in self.accounts {
            let Some(info) = write.info else {
                state.remove_account(&address);
                continue;
            };
            if write.storage_cleared {
                state.clear_storage(&address);
            }
            for (slot, value) in write.slots {
                state.set_storage(address, B256::from(slot), value);
            }
            if let Some(code) = info.code.as_ref().filter(|_| info.code_hash != KECCAK_EMPTY) {
                state.insert_code(code.original_byte_slice());
            }
            let storage_root = match state.account(&address) {
                Ok(Some(existing)) if !write.storage_cleared => existing.storage_root,
                _ => EMPTY_ROOT,
            };
            let account = Account { nonce: info.nonce, balance: info.balance, storage_root, code_hash: info.code_hash };
            state.set_account(address, account);
        }
    }
}
