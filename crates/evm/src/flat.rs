//! A block executed straight over a flat copy of the whole state (a complete
//! [`ReadCache`]): revm reads from it and commits into it, as it does with its own
//! `CacheDB`, and the keys the block wrote are noted on the side so that the trie can take
//! the block's writes later. No per-block overlay stands between revm and the state: with
//! every account and slot one hash probe away, the overlay's copies would cost more than
//! they save.
//!
//! Commits follow [`crate::overlay`]'s rules (EIP-161 deletions, a created account's
//! storage starting empty), so both give the same [`BlockWrites`].

use alloy_primitives::map::{AddressMap, B256Map, U256Map};
use alloy_primitives::{Address, B256, U256};
use revm::bytecode::Bytecode;
use revm::database_interface::{Database, DatabaseCommit, DatabaseRef};
use revm::state::{Account as EvmAccount, AccountInfo};
use virga_core::KECCAK_EMPTY;

use crate::db::{StateDb, StateError};
use crate::overlay::{AccountWrite, BlockWrites, ReadCache};

/// What a block wrote of one account besides its fields (read from the flat copy at the
/// end of the block).
#[derive(Default)]
struct Written {
    /// Its storage was dropped (deleted, or created anew) before `slots` were written.
    storage_cleared: bool,
    /// Slots written, with their latest values.
    slots: U256Map<U256>,
}

/// revm's database for one block over a complete [`ReadCache`].
pub(crate) struct FlatBlock<'a> {
    flat: &'a mut ReadCache,
    /// Code by hash and block hashes (the flat copy holds accounts and slots).
    base: StateDb<'a>,
    /// The block's writes stay out of the trie for now (see [`ReadCache::absorb`]).
    pending: bool,
    written: AddressMap<Written>,
    /// Code deployed by this block.
    code: B256Map<Bytecode>,
}

impl<'a> FlatBlock<'a> {
    /// `flat` must be complete: what it lacks is read as absent or zero.
    pub(crate) fn new(flat: &'a mut ReadCache, base: StateDb<'a>, pending: bool) -> Self {
        debug_assert!(flat.is_complete());
        Self { flat, base, pending, written: AddressMap::default(), code: B256Map::default() }
    }

    /// What the block changed, with the values it left, for the trie.
    pub(crate) fn finish(self) -> BlockWrites {
        let accounts = self.written.into_iter().map(|(address, written)| {
            let info = self.flat.account(&address).flatten();
            let slots = written.slots.into_iter().collect();
            (address, AccountWrite { info, storage_cleared: written.storage_cleared, slots })
        });
        BlockWrites { accounts: accounts.collect() }
    }

    fn commit_account(&mut self, address: Address, mut account: EvmAccount) {
        if !account.is_touched() {
            return;
        }
        let Self { flat, pending, written, code, .. } = self;
        let written = written.entry(address).or_default();
        if account.is_selfdestructed() || account.is_empty() {
            written.storage_cleared = true;
            written.slots.clear();
            flat.absorb_account(address, None, true, [], *pending);
            return;
        }
        let created = account.is_created();
        if created {
            written.storage_cleared = true;
            written.slots.clear();
        }
        if let Some(deployed) = account.info.code.as_ref().filter(|_| account.info.code_hash != KECCAK_EMPTY) {
            code.entry(account.info.code_hash).or_insert_with(|| deployed.clone());
        }
        let storage = std::mem::take(&mut account.storage);
        let slots = storage.into_iter().filter(|(_, value)| created || value.is_changed()).map(|(slot, value)| {
            written.slots.insert(slot, value.present_value());
            (slot, value.present_value())
        });
        flat.absorb_account(address, Some(account.info), created, slots, *pending);
    }
}

impl Database for FlatBlock<'_> {
    type Error = StateError;

    fn basic(&mut self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        Ok(self.flat.account(&address).flatten())
    }

    fn code_by_hash(&mut self, code_hash: B256) -> Result<Bytecode, StateError> {
        match self.code.get(&code_hash).or_else(|| self.flat.code(&code_hash)) {
            Some(code) => Ok(code.clone()),
            None => self.base.code_by_hash_ref(code_hash),
        }
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, StateError> {
        Ok(self.flat.slot_known(&address, &slot).unwrap_or(U256::ZERO))
    }

    fn block_hash(&mut self, number: u64) -> Result<B256, StateError> {
        self.base.block_hash_ref(number)
    }
}

impl DatabaseCommit for FlatBlock<'_> {
    fn commit(&mut self, changes: AddressMap<EvmAccount>) {
        for (address, account) in changes {
            self.commit_account(address, account);
        }
    }
}
