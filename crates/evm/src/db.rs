//! revm reads Virga's state through [`StateDb`]: accounts, storage slots and code from a
//! [`StateSource`] (the DSM-Tree's [`StateTrie`] on a full node, a RainBlock miner's
//! witnessed top layer), recent block hashes from a [`BlockHashes`] source.

use alloy_primitives::{keccak256, Address, B256, U256};
use revm::bytecode::Bytecode;
use revm::database_interface::{DBErrorMarker, DatabaseRef};
use revm::state::AccountInfo;
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{Account, StateTrie};
use virga_trie::PartialTrie;

use crate::overlay::BlockWrites;

/// Where the `BLOCKHASH` opcode's answers come from. revm asks only for the 256 blocks
/// before the current one.
pub trait BlockHashes: Sync {
    /// The hash of block `number`.
    fn block_hash(&self, number: u64) -> B256;
}

/// The convention of Ethereum's state tests (and of revm's `EmptyDB`): block `n` hashes to
/// keccak-256 of `n` written in decimal.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecimalHashes;

impl BlockHashes for DecimalHashes {
    fn block_hash(&self, number: u64) -> B256 {
        keccak256(number.to_string().as_bytes())
    }
}

/// The state could not answer revm: it is damaged, lacks code it refers to, or (a partial
/// state) holds the item only by hash.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("account {address} in the state does not decode: {reason}")]
    Account { address: Address, reason: String },
    #[error("storage slot {slot} of {address} does not decode: {reason}")]
    Storage { address: Address, slot: U256, reason: String },
    #[error("code {hash} is referred to by an account but not in the state")]
    MissingCode { hash: B256 },
    /// A partial state (a RainBlock miner's top layer) does not hold what was asked.
    #[error("{what} is not in the partial state: {reason}")]
    NotHeld { what: String, reason: String },
}

impl DBErrorMarker for StateError {}

impl StateError {
    /// A partial state lacks what was asked (as opposed to a damaged state): the transaction
    /// that asked is left out of the block, and the block goes on.
    pub fn is_not_held(&self) -> bool {
        matches!(self, StateError::NotHeld { .. })
    }
}

/// The state revm reads: accounts, their storage slots, and code by hash.
pub trait StateSource: Sync {
    /// The account at `address`, `None` when absent.
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError>;
    /// A storage slot's value (zero when unset).
    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError>;
    /// The code whose keccak-256 is `hash`.
    fn code(&self, hash: &B256) -> Result<Bytecode, StateError>;
}

/// A state that executed blocks write into.
pub trait WorldState: StateSource {
    /// Puts a block's writes into the state. A partial state refuses writes to what it does
    /// not hold, and is then left partly written: its owner discards it.
    fn apply(&mut self, writes: &BlockWrites) -> Result<(), StateError>;
    /// The state root; `pool` hashes subtrees in parallel where the state supports it.
    fn state_root(&mut self, pool: Option<&rayon::ThreadPool>) -> B256;
}

impl StateSource for StateTrie {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        StateTrie::account(self, address)
            .map_err(|error| StateError::Account { address: *address, reason: error.to_string() })
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        self.try_storage(address, &B256::from(slot)).map_err(|error| StateError::Storage {
            address: *address,
            slot,
            reason: error.to_string(),
        })
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        StateTrie::code(self, hash).map(bytecode).ok_or(StateError::MissingCode { hash: *hash })
    }
}

impl WorldState for StateTrie {
    fn apply(&mut self, writes: &BlockWrites) -> Result<(), StateError> {
        writes.apply_to(self);
        Ok(())
    }

    fn state_root(&mut self, pool: Option<&rayon::ThreadPool>) -> B256 {
        match pool {
            Some(pool) => pool.install(|| self.root_parallel()),
            None => self.root(),
        }
    }
}

/// A partial account trie keyed by secure-trie key (a RainBlock miner's top layer): it
/// holds accounts that witnesses brought it, and no storage or code yet.
impl StateSource for PartialTrie {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        match self.get(keccak256(address).as_slice()) {
            Ok(None) => Ok(None),
            Ok(Some(raw)) => Account::decode_rlp(&raw)
                .map(Some)
                .map_err(|error| StateError::Account { address: *address, reason: error.to_string() }),
            Err(stopped) => {
                Err(StateError::NotHeld { what: format!("account {address}"), reason: stopped.to_string() })
            }
        }
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        Err(StateError::NotHeld {
            what: format!("storage slot {slot} of {address}"),
            reason: "the top layer holds accounts only".into(),
        })
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        Err(StateError::NotHeld { what: format!("code {hash}"), reason: "the top layer holds accounts only".into() })
    }
}

impl WorldState for PartialTrie {
    fn apply(&mut self, writes: &BlockWrites) -> Result<(), StateError> {
        for (address, write) in &writes.accounts {
            let key = keccak256(address);
            let not_held = |reason: String| StateError::NotHeld { what: format!("account {address}"), reason };
            let Some(info) = &write.info else {
                self.remove(key.as_slice()).map_err(|stopped| not_held(stopped.to_string()))?;
                continue;
            };
            if write.storage_cleared || !write.slots.is_empty() {
                return Err(StateError::NotHeld {
                    what: format!("storage of {address}"),
                    reason: "the top layer holds accounts only".into(),
                });
            }
            let storage_root = StateSource::account(self, address)?.map_or(EMPTY_ROOT, |account| account.storage_root);
            let account = Account { nonce: info.nonce, balance: info.balance, storage_root, code_hash: info.code_hash };
            self.insert(key.as_slice(), &account.rlp()).map_err(|stopped| not_held(stopped.to_string()))?;
        }
        Ok(())
    }

    fn state_root(&mut self, _pool: Option<&rayon::ThreadPool>) -> B256 {
        self.root_hash()
    }
}

/// A read-only view of a [`StateSource`] for revm. Writes come back from revm as change
/// sets that [`crate::overlay::BlockOverlay`] gathers into [`BlockWrites`].
#[derive(Clone, Copy)]
pub struct StateDb<'a> {
    state: &'a dyn StateSource,
    hashes: &'a dyn BlockHashes,
}

impl<'a> StateDb<'a> {
    pub fn new(state: &'a dyn StateSource, hashes: &'a dyn BlockHashes) -> Self {
        Self { state, hashes }
    }
}

impl DatabaseRef for StateDb<'_> {
    type Error = StateError;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        let Some(account) = self.state.account(&address)? else { return Ok(None) };
        // Code is handed over with the account: revm would otherwise ask for it by hash on
        // the first call, and every call into a contract needs it.
        let code =
            if account.code_hash == KECCAK_EMPTY { Bytecode::new() } else { self.code_by_hash_ref(account.code_hash)? };
        Ok(Some(AccountInfo::new(account.balance, account.nonce, account.code_hash, code)))
    }

    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, StateError> {
        if code_hash == KECCAK_EMPTY {
            return Ok(Bytecode::new());
        }
        self.state.code(&code_hash)
    }

    fn storage_ref(&self, address: Address, slot: U256) -> Result<U256, StateError> {
        self.state.storage(&address, slot)
    }

    fn block_hash_ref(&self, number: u64) -> Result<B256, StateError> {
        Ok(self.hashes.block_hash(number))
    }
}

/// Code as revm runs it. Bytes that start like an EIP-7702 delegation but are not one are
/// plain (legacy) code: before Prague such code could exist, and it executes as bytes.
pub fn bytecode(code: &[u8]) -> Bytecode {
    let bytes = alloy_primitives::Bytes::copy_from_slice(code);
    Bytecode::new_raw_checked(bytes.clone()).unwrap_or_else(|_| Bytecode::new_legacy(bytes))
}
