//! A client's cheap check of a plain transfer against witnessed accounts, before it spends a
//! miner's time: the rules revm's validation applies to a value transfer (chain id, intrinsic
//! gas, nonce, balance for value plus the most the fee can be), and the accounts it leaves.
//! The miner's execution (revm) stays the judge; this only filters what would certainly fail.

use alloy_primitives::{keccak256, Address, B256, U256};
use virga_ledger::exec::{ExecConfig, TRANSFER_GAS};
use virga_ledger::tx::SignedTx;
use virga_trie::account::Account;

/// The accounts a transfer touches, by secure-trie key: its sender and its recipient (for a
/// creation, the address it would create).
pub(crate) fn touched_keys(tx: &SignedTx, sender: Address) -> [B256; 2] {
    [keccak256(sender), keccak256(tx.to().unwrap_or_else(|| sender.create(tx.nonce())))]
}

/// What a transfer that passes leaves: the sender's and (unless it pays itself) the
/// recipient's accounts, keyed.
pub(crate) struct Effect {
    pub(crate) sender: (B256, Account),
    pub(crate) recipient: Option<(B256, Account)>,
}

/// Checks `tx`, sent by `from`, against its accounts; the error is the reason's snake_case
/// name.
pub(crate) fn check_transfer(
    exec: &ExecConfig,
    tx: &SignedTx,
    from: Address,
    sender: &Account,
    recipient: &Account,
) -> Result<Effect, &'static str> {
    if tx.chain_id().is_some_and(|chain_id| chain_id != exec.chain_id) {
        return Err("wrong_chain_id");
    }
    if tx.gas_limit() < TRANSFER_GAS {
        return Err("gas_limit_too_low");
    }
    if tx.nonce() != sender.nonce {
        return Err("nonce_mismatch");
    }
    let next_nonce = sender.nonce.checked_add(1).ok_or("nonce_exhausted")?;
    // revm requires the balance to cover the gas limit at the fee cap, plus the value.
    let most_fee = U256::from(tx.max_fee_per_gas()).saturating_mul(U256::from(tx.gas_limit()));
    if sender.balance < tx.value().saturating_add(most_fee) {
        return Err("insufficient_funds");
    }
    // A transfer uses its intrinsic gas, at no more than the fee cap.
    let fee = U256::from(tx.max_fee_per_gas()).saturating_mul(U256::from(TRANSFER_GAS));
    let [sender_key, recipient_key] = touched_keys(tx, from);
    let mut new_sender = *sender;
    new_sender.nonce = next_nonce;
    new_sender.balance = sender.balance.saturating_sub(tx.value()).saturating_sub(fee);
    if sender_key == recipient_key {
        new_sender.balance = new_sender.balance.saturating_add(tx.value());
        return Ok(Effect { sender: (sender_key, new_sender), recipient: None });
    }
    let mut new_recipient = *recipient;
    new_recipient.balance = recipient.balance.saturating_add(tx.value());
    Ok(Effect { sender: (sender_key, new_sender), recipient: Some((recipient_key, new_recipient)) })
}
