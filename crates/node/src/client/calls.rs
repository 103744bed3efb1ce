//! Contract calls at the prefetching client (seeds 000 ch. 6 and 003): each call runs with
//! revm over what the batch's witnesses proved (accounts, slots, code), in a block the client
//! guesses (the next number after the miner's head, the current second), to learn what it
//! touches. Whatever the run reaches that no witness holds is recorded, answered with a
//! guess (no account; a slot holding zero, then, in a second run, the largest value) so the
//! run goes on and shows the rest of what it needs, and fetched in the batch's next round; a
//! call runs again once that arrives. Code is asked for once: the client keeps what it
//! verified, by hash.

use alloy_primitives::{keccak256, Address, B256, U256};
use revm::bytecode::Bytecode;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use virga_evm::speculation::pre_execute;
use virga_evm::{BlockContext, BlockHashes, StateError, StateSource};
use virga_ledger::exec::{ExecConfig, FORK};
use virga_ledger::tx::RecoveredTx;
use virga_trie::account::Account;

use super::witness::{ContractAsk, Witnesses};
use super::UserTransfer;

/// Filter reason of a call that still reached unwitnessed state after the last round.
pub(super) const UNREADABLE_STATE: &str = "unreadable_state";

/// Fetch rounds a batch with contract calls may take: the accounts, then what the calls
/// reach (their code the first time the client meets a contract, then their slots).
pub(super) const MAX_ROUNDS: usize = 3;

/// Gas limit of the guessed block: any call a real block could hold fits.
const GUESSED_GAS_LIMIT: u64 = 1 << 40;

/// Whether a transfer is a contract call (or creation) rather than a plain payment: it
/// carries data, creates, or goes to an account with code.
pub(super) fn is_call(transfer: &UserTransfer, values: &HashMap<B256, (Option<Vec<u8>>, usize)>) -> bool {
    let Some(to) = transfer.tx.to() else { return true };
    if !transfer.tx.input().is_empty() {
        return true;
    }
    match values.get(&keccak256(to)) {
        Some((Some(raw), _)) => {
            Account::decode_rlp(raw).is_ok_and(|account| account.code_hash != virga_core::KECCAK_EMPTY)
        }
        _ => false,
    }
}

/// A batch's calls after a pre-execution round.
#[derive(Debug, Default)]
pub(super) struct CallsPrepared {
    pub(super) kept: Vec<UserTransfer>,
    pub(super) filtered: Vec<(UserTransfer, &'static str)>,
    /// Calls that reached unwitnessed state: to run again after the next round.
    pub(super) waiting: Vec<UserTransfer>,
    /// What the next round fetches: accounts, and contracts' slots and code.
    pub(super) need_keys: Vec<B256>,
    pub(super) need: ContractAsk,
    /// Code hashes the kept calls run.
    pub(super) code_used: BTreeSet<B256>,
}

/// The block a client guesses its calls land in.
pub(super) fn guessed_block(exec: &ExecConfig, head_number: u64, now_seconds: u64) -> BlockContext {
    BlockContext {
        fork: FORK,
        chain_id: exec.chain_id,
        number: head_number.saturating_add(1),
        timestamp: now_seconds,
        coinbase: Address::ZERO,
        gas_limit: GUESSED_GAS_LIMIT,
        base_fee: 0,
        difficulty: U256::ZERO,
        prev_randao: B256::ZERO,
        excess_blob_gas: 0,
    }
}

/// Block hashes as the client knows them: its head's; any other is guessed as zero.
struct HeadHash(u64, B256);

impl BlockHashes for HeadHash {
    fn block_hash(&self, number: u64) -> B256 {
        if number == self.0 {
            self.1
        } else {
            B256::ZERO
        }
    }
}

/// What the batch's witnesses proved, as revm reads it: accounts by key, slots by account
/// and slot key (zero where proved absent), code by hash. Lookups only: no trie is built.
pub(super) struct Witnessed<'a> {
    values: &'a HashMap<B256, (Option<Vec<u8>>, usize)>,
    slots: HashMap<(B256, B256), U256>,
    codes: &'a HashMap<B256, Vec<u8>>,
}

impl<'a> Witnessed<'a> {
    pub(super) fn new(witnesses: &'a Witnesses, codes: &'a HashMap<B256, Vec<u8>>) -> Witnessed<'a> {
        let slots =
            witnesses.contracts.slots.iter().map(|(account, slot, value)| ((*account, *slot), *value)).collect();
        Witnessed { values: &witnesses.values, slots, codes }
    }
}

fn not_held(what: String) -> StateError {
    StateError::NotHeld { what, reason: "no witness of it yet".into() }
}

impl StateSource for Witnessed<'_> {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        match self.values.get(&keccak256(address)) {
            None => Err(not_held(format!("account {address}"))),
            Some((None, _)) => Ok(None),
            Some((Some(raw), _)) => Account::decode_rlp(raw)
                .map(Some)
                .map_err(|error| StateError::Account { address: *address, reason: error.to_string() }),
        }
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        let account = keccak256(address);
        if let Some(value) = self.slots.get(&(account, keccak256(B256::from(slot)))) {
            return Ok(*value);
        }
        match self.account(address)? {
            Some(held) if held.storage_root != virga_core::EMPTY_ROOT => {
                Err(not_held(format!("storage slot {slot:#x} of {address}")))
            }
            _ => Ok(U256::ZERO),
        }
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        match self.codes.get(hash) {
            Some(code) => Ok(virga_evm::db::bytecode(code)),
            None => Err(not_held(format!("code {hash}"))),
        }
    }
}

/// Runs each call over `state` in `block`; sorts them into kept, filtered and waiting, and
/// gathers what the waiting ones need. On the `last_round`, a call that needs more is
/// filtered instead.
pub(super) fn pre_execute_calls(
    calls: Vec<UserTransfer>,
    state: &dyn StateSource,
    block: &BlockContext,
    head: (u64, B256),
    last_round: bool,
) -> CallsPrepared {
    let hashes = HeadHash(head.0, head.1);
    let mut prepared = CallsPrepared::default();
    for call in calls {
        let eth = RecoveredTx { tx: call.tx.clone(), sender: call.sender }.to_eth();
        let mut missing = Missing::default();
        let mut ran = None;
        // Each guess of what a missing slot holds takes the run down other branches (a
        // zero balance reverts before the recipient's is read; a full one reads both), so
        // the calls run with both and fetch what either reached.
        for guess in [U256::ZERO, U256::MAX] {
            let optimistic = Optimistic { state, guess, missing: Mutex::default() };
            let outcome = pre_execute(&optimistic, &hashes, block, &eth);
            missing.extend(optimistic.missing.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner()));
            if ran.is_none() {
                ran = Some(outcome);
            }
            if missing.is_empty() {
                break;
            }
        }
        let (footprint, executed) = match ran {
            Some(Ok(ran)) => ran,
            _ => {
                prepared.filtered.push((call, UNREADABLE_STATE));
                continue;
            }
        };
        if !missing.is_empty() {
            if last_round {
                prepared.filtered.push((call, UNREADABLE_STATE));
            } else {
                missing.ask(&mut prepared);
                prepared.waiting.push(call);
            }
            continue;
        }
        match executed.refused.first() {
            Some(refused) if super::is_invalid(refused.reason.name()) => {
                prepared.filtered.push((call, refused.reason.name()));
            }
            _ => {
                prepared.code_used.extend(footprint.code);
                prepared.kept.push(call);
            }
        }
    }
    prepared.need_keys.sort_unstable();
    prepared.need_keys.dedup();
    prepared
}

/// What a run reached that no witness holds.
#[derive(Default)]
struct Missing {
    accounts: BTreeSet<Address>,
    slots: BTreeSet<(Address, U256)>,
    /// Code not held, by the account whose code hash it is.
    code: BTreeMap<Address, B256>,
}

impl Missing {
    fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.slots.is_empty() && self.code.is_empty()
    }

    fn extend(&mut self, other: Missing) {
        self.accounts.extend(other.accounts);
        self.slots.extend(other.slots);
        self.code.extend(other.code);
    }

    /// Adds what is missing to the next round's asks: accounts, slots with their account,
    /// and code with the account whose code hash it is.
    fn ask(&self, prepared: &mut CallsPrepared) {
        prepared.need_keys.extend(self.accounts.iter().map(keccak256));
        for (address, slot) in &self.slots {
            let slots = prepared.need.slots.entry(keccak256(address)).or_default();
            let key = keccak256(B256::from(*slot));
            if !slots.contains(&key) {
                slots.push(key);
            }
        }
        for (owner, hash) in &self.code {
            prepared.need.codes.insert(keccak256(owner), *hash);
        }
    }
}

/// The witnessed state, with what it lacks recorded and answered as absent. Code is read
/// with its account (revm asks for both at once), so missing code is recorded there, with
/// the account it belongs to; the run stops at it, since code cannot be guessed.
struct Optimistic<'a> {
    state: &'a dyn StateSource,
    /// What a missing slot is taken to hold.
    guess: U256,
    missing: Mutex<Missing>,
}

impl Optimistic<'_> {
    fn note(&self, record: impl FnOnce(&mut Missing)) {
        let mut missing = self.missing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        record(&mut missing);
    }
}

impl StateSource for Optimistic<'_> {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        match self.state.account(address) {
            Err(error) if error.is_not_held() => {
                // The guessed block's beneficiary is nobody's: the miner holds its own.
                if *address != Address::ZERO {
                    self.note(|missing| {
                        missing.accounts.insert(*address);
                    });
                }
                Ok(None)
            }
            Ok(Some(account)) => {
                let hash = account.code_hash;
                if hash != virga_core::KECCAK_EMPTY && self.state.code(&hash).is_err_and(|e| e.is_not_held()) {
                    self.note(|missing| {
                        missing.code.insert(*address, hash);
                    });
                }
                Ok(Some(account))
            }
            other => other,
        }
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        match self.state.storage(address, slot) {
            Err(error) if error.is_not_held() => {
                self.note(|missing| {
                    missing.slots.insert((*address, slot));
                });
                Ok(self.guess)
            }
            other => other,
        }
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        self.state.code(hash)
    }
}
