//! A block's writes over the DSM-Tree, and its read cache: revm reads each account, slot and
//! code from the trie at most once per block, and every transaction sees the writes of the
//! ones before it. At the end of the block the writes go into the trie in one pass.
//!
//! The overlay applies revm's change sets with Ethereum's rules from Spurious Dragon on
//! (every fork Virga runs; revm normalizes older ones to the same rule): an account that
//! was touched and is left empty is deleted (EIP-161), as is a self-destructed one, and a
//! created account's storage starts empty.

use alloy_primitives::map::Entry;

use alloy_primitives::map::{AddressMap, AddressSet, B256Map, U256Map, U256Set};

use alloy_primitives::{Address, B256, U256};
use revm::bytecode::Bytecode;
use revm::database_interface::{Database, DatabaseCommit, DatabaseRef};
use revm::state::{Account as EvmAccount, AccountInfo};
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{Account, StateTrie};

use crate::db::{bytecode, StateDb, StateError};
use crate::reference::GenesisAccount;

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
    slots: U256Map<(U256, bool)>,
}

/// The block's view of the state: the trie below (and, where the executor keeps one, a
/// cache of what earlier blocks read and wrote), this block's reads and writes above.
pub struct BlockOverlay<'a> {
    base: StateDb<'a>,
    cache: Option<&'a ReadCache>,
    accounts: AddressMap<AccountEntry>,
    code: B256Map<Bytecode>,
}

impl<'a> BlockOverlay<'a> {
    /// An overlay expecting about `accounts` accounts (sized once rather than regrown).
    pub fn new(base: StateDb<'a>, cache: Option<&'a ReadCache>, accounts: usize) -> Self {
        let accounts = AddressMap::with_capacity_and_hasher(accounts, Default::default());
        Self { base, cache, accounts, code: B256Map::default() }
    }

    fn entry(&mut self, address: Address) -> Result<&mut AccountEntry, StateError> {
        match self.accounts.entry(address) {
            Entry::Occupied(entry) => Ok(entry.into_mut()),
            Entry::Vacant(vacant) => {
                let info = match self.cache.and_then(|cache| cache.account(&address)) {
                    Some(info) => info,
                    None => self.base.basic_ref(address)?,
                };
                let entry = AccountEntry { info, written: false, storage_cleared: false, slots: U256Map::default() };
                Ok(vacant.insert(entry))
            }
        }
    }

    /// What the block changed, to be applied to the trie it read from, and what it saw, for
    /// the [`ReadCache`] it read through unless that cache holds the whole state already
    /// (then the writes are all it needs: [`ReadCache::absorb_writes`]).
    pub fn finish(self) -> (BlockWrites, Option<BlockSeen>) {
        let keep_reads = self.cache.is_some_and(|cache| !cache.is_complete());
        let mut writes = Vec::new();
        let mut seen = Vec::with_capacity(if keep_reads { self.accounts.len() } else { 0 });
        for (address, entry) in self.accounts {
            if entry.written {
                let slots =
                    entry.slots.iter().filter(|(_, (_, written))| *written).map(|(slot, (value, _))| (*slot, *value));
                let write = AccountWrite {
                    info: entry.info.clone(),
                    storage_cleared: entry.storage_cleared,
                    slots: slots.collect(),
                };
                writes.push((address, write));
            }
            if keep_reads {
                let slots = entry.slots.into_iter().map(|(slot, (value, _))| (slot, value)).collect();
                seen.push(SeenAccount { address, info: entry.info, storage_cleared: entry.storage_cleared, slots });
            }
        }
        (BlockWrites { accounts: writes }, keep_reads.then_some(BlockSeen { accounts: seen }))
    }

    fn commit_account(&mut self, address: Address, account: EvmAccount) {
        if !account.is_touched() {
            return;
        }
        let deleted = account.is_selfdestructed() || account.is_empty();
        if let Some(code) = account.info.code.as_ref().filter(|_| !deleted && account.info.code_hash != KECCAK_EMPTY) {
            self.code.entry(account.info.code_hash).or_insert_with(|| code.clone());
        }
        let Ok(entry) = self.entry(address) else {
            // revm loaded this account through us, so it is cached; a state error would have
            // failed the transaction before it reached commit.
            return;
        };
        if deleted {
            *entry = AccountEntry { info: None, written: true, storage_cleared: true, slots: U256Map::default() };
            return;
        }
        let created = account.is_created();
        if created {
            entry.storage_cleared = true;
            entry.slots.clear();
        }
        for (slot, value) in &account.storage {
            if created || value.is_changed() {
                entry.slots.insert(*slot, (value.present_value(), true));
            }
        }
        entry.written = true;
        entry.info = Some(account.info);
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
        let code = match self.cache.and_then(|cache| cache.code.get(&code_hash)) {
            Some(code) => code.clone(),
            None => self.base.code_by_hash_ref(code_hash)?,
        };
        self.code.insert(code_hash, code.clone());
        Ok(code)
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, StateError> {
        let (base, cache) = (self.base, self.cache);
        let entry = self.entry(address)?;
        if let Some((value, _)) = entry.slots.get(&slot) {
            return Ok(*value);
        }
        let value = match (entry.storage_cleared, cache.and_then(|cache| cache.slot_known(&address, &slot))) {
            (true, _) => U256::ZERO,
            (false, Some(value)) => value,
            (false, None) => base.storage_ref(address, slot)?,
        };
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
    /// Accounts plus slots written.
    pub fn entries(&self) -> usize {
        self.accounts.iter().map(|(_, write)| 1 + write.slots.len()).sum()
    }

    /// Writes the changes into `state`; storage roots are recorded by the next
    /// [`StateTrie::root`].
    pub fn apply_to(&self, state: &mut StateTrie) {
        for (address, write) in &self.accounts {
            let Some(info) = &write.info else {
                state.remove_account(address);
                continue;
            };
            if write.storage_cleared {
                state.clear_storage(address);
            }
            for (slot, value) in &write.slots {
                state.set_storage(*address, B256::from(*slot), *value);
            }
            if let Some(code) = info.code.as_ref().filter(|_| info.code_hash != KECCAK_EMPTY) {
                state.insert_code(code.original_byte_slice());
            }
            let storage_root = match state.account(address) {
                Ok(Some(existing)) if !write.storage_cleared => existing.storage_root,
                _ => EMPTY_ROOT,
            };
            let account = Account { nonce: info.nonce, balance: info.balance, storage_root, code_hash: info.code_hash };
            state.set_account(*address, account);
        }
    }
}

/// Every account and slot a block read or wrote, with its value after the block.
pub struct BlockSeen {
    accounts: Vec<SeenAccount>,
}

impl BlockSeen {
    /// What a block wrote, and what it read of the state below that it did not write. Slots
    /// of an account whose account entry was neither read nor written are left out.
    pub(crate) fn from_writes_and_reads(
        writes: &BlockWrites,
        accounts_read: AddressMap<Option<AccountInfo>>,
        mut slots_read: AddressMap<Vec<(U256, U256)>>,
    ) -> BlockSeen {
        let mut seen = BlockSeen::from_writes(writes);
        for account in &mut seen.accounts {
            if let Some(read) = slots_read.remove(&account.address) {
                let written: U256Set = account.slots.iter().map(|(slot, _)| *slot).collect();
                account.slots.extend(read.into_iter().filter(|(slot, _)| !written.contains(slot)));
            }
        }
        let written: AddressSet = seen.accounts.iter().map(|account| account.address).collect();
        for (address, info) in accounts_read.into_iter().filter(|(address, _)| !written.contains(address)) {
            let slots = slots_read.remove(&address).unwrap_or_default();
            seen.accounts.push(SeenAccount { address, info, storage_cleared: false, slots });
        }
        seen
    }

    /// What a block wrote, as what it saw (its reads are not kept).
    fn from_writes(writes: &BlockWrites) -> BlockSeen {
        let accounts = writes.accounts.iter().map(|(address, write)| SeenAccount {
            address: *address,
            info: write.info.clone(),
            storage_cleared: write.storage_cleared,
            slots: write.slots.clone(),
        });
        BlockSeen { accounts: accounts.collect() }
    }
}

/// One account a block saw: its state after the block, whether the block cleared its
/// storage, and the slots it read or wrote.
struct SeenAccount {
    address: Address,
    info: Option<AccountInfo>,
    storage_cleared: bool,
    slots: Vec<(U256, U256)>,
}

/// Accounts and slots an executor has seen, kept across blocks so that hot state is read
/// from the trie once rather than once per block. Every value it holds is the state's after
/// the last block. Blocks whose writes are not in the trie yet (write-back, see
/// [`crate::CachedState::with_write_back`]) are served from here: their slots, the accounts
/// whose storage they cleared, and the code they deployed.
///
/// A complete cache ([`Self::flat_copy`]) holds every account and nonzero slot of the
/// state: what it lacks is absent or zero, and the trie is never read.
#[derive(Clone, Debug)]
pub struct ReadCache {
    accounts: AddressMap<Option<AccountInfo>>,
    storage: AddressMap<U256Map<U256>>,
    slots: usize,
    /// Accounts whose storage a pending block cleared: their uncached slots are zero.
    cleared: AddressSet,
    /// Code deployed by pending blocks.
    code: B256Map<Bytecode>,
    complete: bool,
}

impl ReadCache {
    pub fn new() -> Self {
        Self {
            accounts: AddressMap::default(),
            storage: AddressMap::default(),
            slots: 0,
            cleared: AddressSet::default(),
            code: B256Map::default(),
            complete: false,
        }
    }

    /// A complete cache of the state `accounts` describe, as
    /// [`crate::reference::genesis_state`] puts it into the trie.
    pub fn flat_copy(accounts: &[GenesisAccount]) -> Self {
        let mut cache = Self::new();
        cache.complete = true;
        cache.accounts.reserve(accounts.len());
        for account in accounts {
            let (code_hash, code) = if account.code.is_empty() {
                (KECCAK_EMPTY, Bytecode::new())
            } else {
                (alloy_primitives::keccak256(&account.code), bytecode(&account.code))
            };
            let info = AccountInfo::new(account.balance, account.nonce, code_hash, code);
            cache.accounts.insert(account.address, Some(info));
            let nonzero = account.storage.iter().filter(|(_, value)| !value.is_zero()).copied();
            let slots: U256Map<U256> = nonzero.collect();
            cache.slots += slots.len();
            if !slots.is_empty() {
                cache.storage.insert(account.address, slots);
            }
        }
        cache
    }

    /// Whether the cache holds the whole state.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Accounts plus slots held.
    pub fn len(&self) -> usize {
        self.accounts.len() + self.slots
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot(&self, address: &Address, slot: &U256) -> Option<U256> {
        self.storage.get(address).and_then(|slots| slots.get(slot)).copied()
    }

    /// The account where the cache knows it (`Some(None)`: it is absent).
    pub(crate) fn account(&self, address: &Address) -> Option<Option<AccountInfo>> {
        match self.accounts.get(address) {
            Some(info) => Some(info.clone()),
            None => self.complete.then_some(None),
        }
    }

    /// [`Self::account`] without the account's code, which is shared, and which workers on
    /// other cores would fight over the reference count of.
    pub(crate) fn account_without_code(&self, address: &Address) -> Option<Option<AccountInfo>> {
        match self.accounts.get(address) {
            Some(info) => Some(info.as_ref().map(AccountInfo::copy_without_code)),
            None => self.complete.then_some(None),
        }
    }

    /// The slot's value where the cache knows it (zero for a slot of an account whose
    /// storage a pending block cleared, and for any slot a complete cache lacks).
    pub(crate) fn slot_known(&self, address: &Address, slot: &U256) -> Option<U256> {
        self.slot(address, slot).or_else(|| (self.complete || self.cleared.contains(address)).then_some(U256::ZERO))
    }

    pub(crate) fn code(&self, hash: &B256) -> Option<&Bytecode> {
        self.code.get(hash)
    }

    /// Takes in what a block saw. `pending`: the block's writes are not in the trie yet, so
    /// what they cleared and deployed must be answered from here until [`Self::written`].
    pub fn absorb(&mut self, seen: BlockSeen, pending: bool) {
        for SeenAccount { address, info, storage_cleared, slots } in seen.accounts {
            self.absorb_account(address, info, storage_cleared, slots, pending);
        }
    }

    /// [`Self::absorb`] of what a block wrote alone: enough for a complete cache, which
    /// holds what the block read already.
    pub fn absorb_writes(&mut self, writes: &BlockWrites, pending: bool) {
        for (address, write) in &writes.accounts {
            let slots = write.slots.iter().copied();
            self.absorb_account(*address, write.info.clone(), write.storage_cleared, slots, pending);
        }
    }

    pub(crate) fn absorb_account(
        &mut self,
        address: Address,
        info: Option<AccountInfo>,
        storage_cleared: bool,
        slots: impl IntoIterator<Item = (U256, U256)>,
        pending: bool,
    ) {
        if storage_cleared || info.is_none() {
            // Slots this block did not see read as zero now; drop the stale ones.
            if let Some(dropped) = self.storage.remove(&address) {
                self.slots -= dropped.len();
            }
            if pending {
                self.cleared.insert(address);
            }
        }
        let deployed = info.as_ref().filter(|info| pending && info.code_hash != KECCAK_EMPTY);
        if let Some(code) = deployed.and_then(|info| info.code.clone().map(|code| (info.code_hash, code))) {
            self.code.insert(code.0, code.1);
        }
        match self.accounts.entry(address) {
            Entry::Occupied(mut cached) => {
                let mut info = info;
                // The parallel executor passes accounts without their code: keep the copy
                // held, so that the serial executor finds it with the account.
                if let (Some(info), Some(held)) = (info.as_mut(), cached.get_mut().as_mut()) {
                    if info.code.is_none() && info.code_hash == held.code_hash {
                        info.code = held.code.take();
                    }
                }
                *cached.get_mut() = info;
            }
            Entry::Vacant(vacant) => {
                vacant.insert(info);
            }
        }
        let mut slots = slots.into_iter().peekable();
        if slots.peek().is_some() {
            let cached = self.storage.entry(address).or_default();
            for (slot, value) in slots {
                if cached.insert(slot, value).is_none() {
                    self.slots += 1;
                }
            }
        }
    }

    /// Every pending block's writes are now in the trie.
    pub fn written(&mut self) {
        self.cleared.clear();
        self.code.clear();
    }
}

impl Default for ReadCache {
    fn default() -> Self {
        Self::new()
    }
}
