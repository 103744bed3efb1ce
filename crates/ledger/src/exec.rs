//! Execution of value transfers against the world state.
//!
//! A transfer succeeds when its chain id fits, its gas limit covers the fixed cost of a
//! transfer, its nonce is the sender's next one and the sender can pay value plus fee. A
//! transfer that fails changes nothing and gets a receipt that says why.
//!
//! Fees are credited to the block's beneficiary once, after the last transaction, rather
//! than after each one. Every transfer then touches exactly its sender and recipient, which
//! is what lets [`crate::parallel`] run non-overlapping transfers at the same time; serial
//! and staged execution apply the same rule, so they produce the same root.

use alloy_primitives::{keccak256, Address, B256, U256};
use alloy_rlp::{Encodable, Header as RlpHeader};
use virga_trie::account::{Account, StateTrie};
use virga_trie::{PartialTrie, Trie};

/// Gas charged for every transfer (Ethereum's intrinsic cost of a plain transfer).
pub const TRANSFER_GAS: u64 = 21_000;

/// Rules of the chain that execution enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecConfig {
    /// Transactions signed for another chain (EIP-155) fail. Unprotected (pre-EIP-155)
    /// transactions are accepted, as Ethereum still accepts them.
    pub chain_id: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self { chain_id: 1337 }
    }
}

/// What execution needs of a transfer: its fields, the sender its signature recovered, and
/// the secure-trie keys of both accounts (hashed once, where signatures are recovered in
/// parallel, rather than on every state access).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferView {
    pub hash: B256,
    pub sender: Address,
    pub to: Address,
    pub sender_key: B256,
    pub to_key: B256,
    pub nonce: u64,
    pub value: U256,
    pub gas_price: u128,
    pub gas_limit: u64,
    pub chain_id: Option<u64>,
}

impl TransferView {
    /// A view with the account keys derived from the addresses.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hash: B256,
        sender: Address,
        to: Address,
        nonce: u64,
        value: U256,
        gas_price: u128,
        gas_limit: u64,
        chain_id: Option<u64>,
    ) -> Self {
        let (sender_key, to_key) = (keccak256(sender), keccak256(to));
        Self { hash, sender, to, sender_key, to_key, nonce, value, gas_price, gas_limit, chain_id }
    }

    /// The fee a successful transfer pays.
    pub fn fee(&self) -> U256 {
        U256::from(self.gas_price) * U256::from(TRANSFER_GAS)
    }
}

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    #[error("signed for chain {got}, this chain is {expected}")]
    WrongChainId { expected: u64, got: u64 },
    #[error("gas limit {limit} is below the {TRANSFER_GAS} a transfer costs")]
    GasLimitTooLow { limit: u64 },
    #[error("nonce {got}, but the sender's next nonce is {expected}")]
    NonceMismatch { expected: u64, got: u64 },
    #[error("balance {balance} cannot pay {needed} (value plus fee)")]
    InsufficientFunds { balance: U256, needed: U256 },
    #[error("the sender's nonce is at its maximum (EIP-2681)")]
    NonceExhausted,
}

impl FailReason {
    /// Stable code stored in receipts (0 means success).
    pub fn code(&self) -> u8 {
        match self {
            FailReason::WrongChainId { .. } => 1,
            FailReason::GasLimitTooLow { .. } => 2,
            FailReason::NonceMismatch { .. } => 3,
            FailReason::InsufficientFunds { .. } => 4,
            FailReason::NonceExhausted => 5,
        }
    }

    /// Short snake_case name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            FailReason::WrongChainId { .. } => "wrong_chain_id",
            FailReason::GasLimitTooLow { .. } => "gas_limit_too_low",
            FailReason::NonceMismatch { .. } => "nonce_mismatch",
            FailReason::InsufficientFunds { .. } => "insufficient_funds",
            FailReason::NonceExhausted => "nonce_exhausted",
        }
    }
}

/// The outcome of one transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub tx_hash: B256,
    pub outcome: Result<(), FailReason>,
    /// Gas used by this and every earlier transaction of the block.
    pub cumulative_gas_used: u64,
}

impl Receipt {
    /// RLP of `[status code, cumulative gas]`: what the receipts root commits to. The code
    /// names the failure; its details follow from re-execution.
    pub fn rlp(&self) -> Vec<u8> {
        let code = match &self.outcome {
            Ok(()) => 0u8,
            Err(reason) => reason.code(),
        };
        let payload_length = code.length() + self.cumulative_gas_used.length();
        let mut out = Vec::with_capacity(payload_length + 2);
        RlpHeader { list: true, payload_length }.encode(&mut out);
        code.encode(&mut out);
        self.cumulative_gas_used.encode(&mut out);
        out
    }
}

/// The root of the trie from RLP(index) to each receipt, as Ethereum builds its receipts root.
pub fn receipts_root(receipts: &[Receipt]) -> B256 {
    let mut trie = Trie::new();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
        receipts.iter().enumerate().map(|(index, receipt)| (alloy_rlp::encode(index), receipt.rlp())).collect();
    trie.insert_many(pairs);
    trie.root_hash()
}

/// The state holds something that is not an account: the state itself is damaged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("account {address} in the state does not decode: {reason}")]
pub struct StateError {
    pub address: Address,
    pub reason: String,
}

/// The accounts a block executes against: the whole state ([`StateTrie`]) on a full node, or
/// a RainBlock miner's top layer ([`PartialTrie`] keyed by secure-trie key) that holds only
/// what witnesses brought it. Execution is the same code over either, so a miner's block is
/// exactly what a full verifier recomputes.
pub trait AccountState: Sync {
    /// The account under a secure-trie key, `None` when absent. An error means the state
    /// cannot answer: it is damaged, or (partial state) knows the account only by hash.
    fn read_account(&self, key: &B256) -> Result<Option<Account>, String>;
    /// Writes an account; a partial state fails when the key's path is known only by hash.
    fn write_account(&mut self, key: &B256, account: Account) -> Result<(), String>;
    /// The root after the writes so far; `pool` hashes subtrees in parallel where supported.
    fn state_root(&mut self, pool: Option<&rayon::ThreadPool>) -> B256;
}

impl AccountState for StateTrie {
    fn read_account(&self, key: &B256) -> Result<Option<Account>, String> {
        self.account_by_key(key).map_err(|error| error.to_string())
    }

    fn write_account(&mut self, key: &B256, account: Account) -> Result<(), String> {
        self.set_account_by_key(key, account);
        Ok(())
    }

    fn state_root(&mut self, pool: Option<&rayon::ThreadPool>) -> B256 {
        match pool {
            Some(pool) => pool.install(|| self.root_parallel()),
            None => self.root(),
        }
    }
}

impl AccountState for PartialTrie {
    fn read_account(&self, key: &B256) -> Result<Option<Account>, String> {
        match self.get(key.as_slice()) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => Account::decode_rlp(&bytes).map(Some).map_err(|error| error.to_string()),
            Err(stopped) => Err(format!("not in the top layer: {stopped}")),
        }
    }

    fn write_account(&mut self, key: &B256, account: Account) -> Result<(), String> {
        self.insert(key.as_slice(), &account.rlp()).map_err(|stopped| format!("not in the top layer: {stopped}"))
    }

    fn state_root(&mut self, _pool: Option<&rayon::ThreadPool>) -> B256 {
        self.root_hash()
    }
}

/// Reads an account, treating an absent one as empty.
pub fn load_account<S: AccountState + ?Sized>(state: &S, address: &Address) -> Result<Account, StateError> {
    load_account_by_key(state, address, &keccak256(address))
}

/// [`load_account`] with the address's secure-trie key already computed.
pub fn load_account_by_key<S: AccountState + ?Sized>(
    state: &S,
    address: &Address,
    key: &B256,
) -> Result<Account, StateError> {
    match state.read_account(key) {
        Ok(account) => Ok(account.unwrap_or_default()),
        Err(reason) => Err(StateError { address: *address, reason }),
    }
}

/// The accounts a successful transfer leaves behind, by secure-trie key (sender first;
/// recipient absent when it is the sender).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effect {
    pub sender: (B256, Account),
    pub recipient: Option<(B256, Account)>,
}

/// Checks a transfer against the accounts it touches and computes what it writes.
pub fn apply_transfer(
    config: &ExecConfig,
    tx: &TransferView,
    sender: &Account,
    recipient: &Account,
) -> Result<Effect, FailReason> {
    if let Some(chain_id) = tx.chain_id {
        if chain_id != config.chain_id {
            return Err(FailReason::WrongChainId { expected: config.chain_id, got: chain_id });
        }
    }
    if tx.gas_limit < TRANSFER_GAS {
        return Err(FailReason::GasLimitTooLow { limit: tx.gas_limit });
    }
    if tx.nonce != sender.nonce {
        return Err(FailReason::NonceMismatch { expected: sender.nonce, got: tx.nonce });
    }
    // A nonce that cannot advance would let the same transfer run again and again.
    let next_nonce = sender.nonce.checked_add(1).ok_or(FailReason::NonceExhausted)?;
    let needed = tx.value.saturating_add(tx.fee());
    if sender.balance < needed {
        return Err(FailReason::InsufficientFunds { balance: sender.balance, needed });
    }
    let mut new_sender = *sender;
    new_sender.nonce = next_nonce;
    new_sender.balance = sender.balance - needed;
    if tx.to == tx.sender {
        // A self-transfer only pays the fee.
        new_sender.balance = new_sender.balance.saturating_add(tx.value);
        return Ok(Effect { sender: (tx.sender_key, new_sender), recipient: None });
    }
    let mut new_recipient = *recipient;
    new_recipient.balance = recipient.balance.saturating_add(tx.value);
    Ok(Effect { sender: (tx.sender_key, new_sender), recipient: Some((tx.to_key, new_recipient)) })
}

/// Receipts and totals of one block's execution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockOutcome {
    pub receipts: Vec<Receipt>,
    pub gas_used: u64,
    pub fees: U256,
}

impl BlockOutcome {
    /// Transfers that succeeded.
    pub fn succeeded(&self) -> usize {
        self.receipts.iter().filter(|receipt| receipt.outcome.is_ok()).count()
    }
}

/// Builds receipts from per-transfer outcomes in block order, and totals gas and fees.
pub(crate) fn collect_outcome(txs: &[TransferView], outcomes: Vec<Result<(), FailReason>>) -> BlockOutcome {
    let mut block = BlockOutcome { receipts: Vec::with_capacity(txs.len()), ..BlockOutcome::default() };
    for (tx, outcome) in txs.iter().zip(outcomes) {
        if outcome.is_ok() {
            block.gas_used += TRANSFER_GAS;
            block.fees = block.fees.saturating_add(tx.fee());
        }
        block.receipts.push(Receipt { tx_hash: tx.hash, outcome, cumulative_gas_used: block.gas_used });
    }
    block
}

/// Credits the block's fees to its beneficiary.
pub(crate) fn credit_fees<S: AccountState + ?Sized>(
    state: &mut S,
    beneficiary: Address,
    fees: U256,
) -> Result<(), StateError> {
    if fees.is_zero() {
        return Ok(());
    }
    let mut account = load_account(state, &beneficiary)?;
    account.balance = account.balance.saturating_add(fees);
    state.write_account(&keccak256(beneficiary), account).map_err(|reason| StateError { address: beneficiary, reason })
}

/// Executes a block's transfers one after another, then credits the fees.
pub fn execute_serial<S: AccountState + ?Sized>(
    state: &mut S,
    txs: &[TransferView],
    beneficiary: Address,
    config: &ExecConfig,
) -> Result<BlockOutcome, StateError> {
    let mut outcomes = Vec::with_capacity(txs.len());
    for tx in txs {
        let sender = load_account_by_key(state, &tx.sender, &tx.sender_key)?;
        let recipient = load_account_by_key(state, &tx.to, &tx.to_key)?;
        match apply_transfer(config, tx, &sender, &recipient) {
            Ok(effect) => {
                write_effect(state, tx, &effect)?;
                outcomes.push(Ok(()));
            }
            Err(reason) => outcomes.push(Err(reason)),
        }
    }
    let outcome = collect_outcome(txs, outcomes);
    credit_fees(state, beneficiary, outcome.fees)?;
    Ok(outcome)
}

pub(crate) fn write_effect<S: AccountState + ?Sized>(
    state: &mut S,
    tx: &TransferView,
    effect: &Effect,
) -> Result<(), StateError> {
    state
        .write_account(&effect.sender.0, effect.sender.1)
        .map_err(|reason| StateError { address: tx.sender, reason })?;
    if let Some((key, account)) = effect.recipient {
        state.write_account(&key, account).map_err(|reason| StateError { address: tx.to, reason })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(byte: u8) -> Address {
        Address::repeat_byte(byte)
    }

    fn transfer(sender: u8, to: u8, nonce: u64, value: u64) -> TransferView {
        let hash = B256::repeat_byte(nonce as u8);
        TransferView::new(hash, address(sender), address(to), nonce, U256::from(value), 1, TRANSFER_GAS, Some(1337))
    }

    fn funded(pairs: &[(u8, u64)]) -> StateTrie {
        let mut state = StateTrie::new();
        for &(byte, balance) in pairs {
            state.set_account(address(byte), Account::with_balance(0, U256::from(balance)));
        }
        state
    }

    fn balance(state: &StateTrie, byte: u8) -> U256 {
        load_account(state, &address(byte)).map(|account| account.balance).unwrap_or_default()
    }

    #[test]
    fn transfer_moves_value_charges_fee_and_bumps_nonce() {
        let mut state = funded(&[(1, 100_000)]);
        let outcome = execute_serial(&mut state, &[transfer(1, 2, 0, 500)], address(9), &ExecConfig::default());
        let outcome = outcome.expect("state decodes");
        assert_eq!(outcome.succeeded(), 1);
        assert_eq!(balance(&state, 1), U256::from(100_000 - 500 - 21_000));
        assert_eq!(balance(&state, 2), U256::from(500));
        assert_eq!(balance(&state, 9), U256::from(21_000));
        assert_eq!(load_account(&state, &address(1)).map(|a| a.nonce), Ok(1));
        assert_eq!(outcome.gas_used, TRANSFER_GAS);
    }

    #[test]
    fn failing_transfers_change_nothing_and_say_why() {
        let mut state = funded(&[(1, 30_000)]);
        let before = state.root();
        let mut wrong_chain = transfer(1, 2, 0, 1);
        wrong_chain.chain_id = Some(1);
        let mut low_gas = transfer(1, 2, 0, 1);
        low_gas.gas_limit = 20_999;
        let txs = [wrong_chain, low_gas, transfer(1, 2, 5, 1), transfer(1, 2, 0, 9_001), transfer(3, 2, 0, 1)];
        let outcome = execute_serial(&mut state, &txs, address(9), &ExecConfig::default()).expect("state decodes");
        let reasons: Vec<&str> =
            outcome.receipts.iter().map(|r| r.outcome.as_ref().err().map_or("ok", FailReason::name)).collect();
        assert_eq!(
            reasons,
            ["wrong_chain_id", "gas_limit_too_low", "nonce_mismatch", "insufficient_funds", "insufficient_funds"]
        );
        assert_eq!(state.root(), before);
        assert_eq!(outcome.gas_used, 0);
        assert_eq!(
            outcome.receipts[2].outcome,
            Err(FailReason::NonceMismatch { expected: 0, got: 5 }),
            "the receipt carries the expected nonce"
        );
    }

    #[test]
    fn an_exhausted_nonce_cannot_be_replayed() {
        let mut state = StateTrie::new();
        state.set_account(address(1), Account::with_balance(u64::MAX, U256::from(1_000_000)));
        let mut tx = transfer(1, 2, 0, 5);
        tx.nonce = u64::MAX;
        let outcome = execute_serial(&mut state, &[tx, tx], address(9), &ExecConfig::default()).expect("decodes");
        assert_eq!(outcome.receipts[0].outcome, Err(FailReason::NonceExhausted));
        assert_eq!(outcome.receipts[1].outcome, Err(FailReason::NonceExhausted));
        assert_eq!(balance(&state, 2), U256::ZERO);
    }

    #[test]
    fn self_transfer_pays_only_the_fee() {
        let mut state = funded(&[(1, 50_000)]);
        execute_serial(&mut state, &[transfer(1, 1, 0, 10_000)], address(9), &ExecConfig::default())
            .expect("state decodes");
        assert_eq!(balance(&state, 1), U256::from(50_000 - 21_000));
    }

    #[test]
    fn receipts_root_depends_on_every_outcome() {
        let ok = Receipt { tx_hash: B256::ZERO, outcome: Ok(()), cumulative_gas_used: 21_000 };
        let failed = Receipt {
            outcome: Err(FailReason::NonceMismatch { expected: 1, got: 2 }),
            cumulative_gas_used: 0,
            ..ok.clone()
        };
        assert_ne!(receipts_root(std::slice::from_ref(&ok)), receipts_root(&[failed]));
        assert_eq!(receipts_root(&[]), virga_core::EMPTY_ROOT);
    }
}
