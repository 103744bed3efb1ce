//! revm reads Virga's state through [`StateDb`]: accounts, storage slots and code from the
//! DSM-Tree's [`StateTrie`], recent block hashes from a [`BlockHashes`] source.

use alloy_primitives::{keccak256, Address, B256, U256};
use revm::bytecode::Bytecode;
use revm::database_interface::{DBErrorMarker, DatabaseRef};
use revm::state::AccountInfo;
use virga_core::KECCAK_EMPTY;
use virga_trie::account::StateTrie;

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

/// The state could not answer revm: it is damaged or lacks code it refers to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("account {address} in the state does not decode: {reason}")]
    Account { address: Address, reason: String },
    #[error("storage slot {slot} of {address} does not decode: {reason}")]
    Storage { address: Address, slot: U256, reason: String },
    #[error("code {hash} is referred to by an account but not in the state")]
    MissingCode { hash: B256 },
}

impl DBErrorMarker for StateError {}

/// A read-only view of a [`StateTrie`] for revm. Writes come back from revm as a change set
/// that [`crate::commit::apply_changes`] folds into the trie.
#[derive(Clone, Copy)]
pub struct StateDb<'a> {
    state: &'a StateTrie,
    hashes: &'a dyn BlockHashes,
}

impl<'a> StateDb<'a> {
    pub fn new(state: &'a StateTrie, hashes: &'a dyn BlockHashes) -> Self {
        Self { state, hashes }
    }
}

impl DatabaseRef for StateDb<'_> {
    type Error = StateError;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, StateError> {
        let account =
            self.state.account(&address).map_err(|error| StateError::Account { address, reason: error.to_string() })?;
        let Some(account) = account else { return Ok(None) };
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
        let code = self.state.code(&code_hash).ok_or(StateError::MissingCode { hash: code_hash })?;
        Ok(bytecode(code))
    }

    fn storage_ref(&self, address: Address, slot: U256) -> Result<U256, StateError> {
        self.state.try_storage(&address, &B256::from(slot)).map_err(|error| StateError::Storage {
            address,
            slot,
            reason: error.to_string(),
        })
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
