//! Folding revm's change set into the DSM-Tree.
//!
//! revm hands back every account a transaction loaded, each marked touched, created or
//! self-destructed. From Spurious Dragon on (every fork Virga runs), an account that was
//! touched and is left empty is deleted (EIP-161); revm normalizes older forks so that this
//! rule holds for them too.

use alloy_primitives::{Address, B256};
use revm::state::{Account as EvmAccount, EvmState};
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{Account, StateTrie};

/// Applies one transaction's (or one block's, merged) changes to `state`. Storage roots are
/// brought up to date by the next [`StateTrie::root`].
pub fn apply_changes(state: &mut StateTrie, changes: EvmState) {
    for (address, account) in changes {
        apply_account(state, address, account);
    }
}

fn apply_account(state: &mut StateTrie, address: Address, account: EvmAccount) {
    if !account.is_touched() {
        return;
    }
    if account.is_selfdestructed() || account.is_empty() {
        state.remove_account(&address);
        return;
    }
    // A contract created where storage already was (possible only in crafted states) starts
    // from empty storage, as Ethereum requires.
    let created = account.is_created();
    if created {
        state.clear_storage(&address);
    }
    for (slot, value) in &account.storage {
        if created || value.is_changed() {
            state.set_storage(address, B256::from(*slot), value.present_value());
        }
    }
    let code_hash = match &account.info.code {
        Some(code) if account.info.code_hash != KECCAK_EMPTY => {
            state.insert_code(code.original_byte_slice());
            account.info.code_hash
        }
        _ => account.info.code_hash,
    };
    // The stored storage root stays until `StateTrie::root` records the new one of an
    // account whose storage changed.
    let storage_root = match state.account(&address) {
        Ok(Some(existing)) if !created => existing.storage_root,
        _ => EMPTY_ROOT,
    };
    state.set_account(
        address,
        Account { nonce: account.info.nonce, balance: account.info.balance, storage_root, code_hash },
    );
}
