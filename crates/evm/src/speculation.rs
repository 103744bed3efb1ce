//! Speculative pre-execution (RainBlock, seeds 000 ch. 6 and 003): a prefetching client runs
//! a transaction before any block holds it, in a block context it guesses (the next number,
//! its time, the hash of the block before), to learn what the transaction touches, fetches
//! the witnesses of exactly that, and sends them with it. The miner executes the transaction
//! against what came with it only ([`Bagged`]); whatever the real execution reaches outside
//! it aborts the transaction, naming the account, slot or code.
//!
//! A wrong guess matters only where it changes what is touched. A value computed from the
//! block (Kitties' genes, mixed with the number and the parent's hash) lands in the same
//! slot, which the bag holds, so the miner computes the right value from the right inputs;
//! a slot chosen by the block (the lottery's bucket) is another slot, absent from the bag.

use std::collections::BTreeSet;
use std::sync::Mutex;

use alloy_primitives::{Address, B256, U256};
use revm::bytecode::Bytecode;
use virga_trie::account::Account;

use crate::block::{execute_block_writes, ExecutedBlock, Refused};
use crate::db::{BlockHashes, StateError, StateSource};
use crate::executor::{BlockContext, ExecError};
use crate::transaction::EthTransaction;

/// What a transaction read or wrote of the state: its witnesses' keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub accounts: BTreeSet<Address>,
    pub slots: BTreeSet<(Address, U256)>,
    /// Code by hash (a called contract's; the code a creation deploys is not read).
    pub code: BTreeSet<B256>,
}

impl Footprint {
    /// Whether everything `other` touches is in this footprint.
    pub fn covers(&self, other: &Footprint) -> bool {
        other.accounts.is_subset(&self.accounts)
            && other.slots.is_subset(&self.slots)
            && other.code.is_subset(&self.code)
    }

    /// Everything either footprint touches (a batch's bag).
    pub fn extend(&mut self, other: &Footprint) {
        self.accounts.extend(other.accounts.iter().copied());
        self.slots.extend(other.slots.iter().copied());
        self.code.extend(other.code.iter().copied());
    }
}

/// A state that records what is read from it.
struct Recording<'a> {
    base: &'a dyn StateSource,
    seen: Mutex<Footprint>,
}

impl Recording<'_> {
    fn record(&self, note: impl FnOnce(&mut Footprint)) {
        // A poisoned lock means a reader panicked; the footprint it left is still a set of
        // keys, so recording goes on.
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        note(&mut seen);
    }
}

impl StateSource for Recording<'_> {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        self.record(|seen| {
            seen.accounts.insert(*address);
        });
        self.base.account(address)
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        self.record(|seen| {
            seen.slots.insert((*address, slot));
        });
        self.base.storage(address, slot)
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        self.record(|seen| {
            seen.code.insert(*hash);
        });
        self.base.code(hash)
    }
}

/// The state as a miner holding only a transaction's bag sees it: `base` answers within
/// `bag`, and everything else is [`StateError::NotHeld`], named.
pub struct Bagged<'a> {
    base: &'a dyn StateSource,
    bag: &'a Footprint,
}

impl<'a> Bagged<'a> {
    pub fn new(base: &'a dyn StateSource, bag: &'a Footprint) -> Self {
        Self { base, bag }
    }
}

fn not_in_bag(what: String) -> StateError {
    StateError::NotHeld { what, reason: "not in the transaction's bag (pre-execution did not touch it)".into() }
}

impl StateSource for Bagged<'_> {
    fn account(&self, address: &Address) -> Result<Option<Account>, StateError> {
        if !self.bag.accounts.contains(address) {
            return Err(not_in_bag(format!("account {address}")));
        }
        self.base.account(address)
    }

    fn storage(&self, address: &Address, slot: U256) -> Result<U256, StateError> {
        if !self.bag.slots.contains(&(*address, slot)) {
            return Err(not_in_bag(format!("storage slot {slot:#x} of {address}")));
        }
        self.base.storage(address, slot)
    }

    fn code(&self, hash: &B256) -> Result<Bytecode, StateError> {
        if !self.bag.code.contains(hash) {
            return Err(not_in_bag(format!("code {hash}")));
        }
        self.base.code(hash)
    }
}

/// Pre-executes `tx` over `state` in the `guessed` block: what it touched, and what it did
/// there (its receipt, or its refusal). Nothing is written.
pub fn pre_execute(
    state: &dyn StateSource,
    hashes: &dyn BlockHashes,
    guessed: &BlockContext,
    tx: &EthTransaction,
) -> Result<(Footprint, ExecutedBlock), StateError> {
    let recording = Recording { base: state, seen: Mutex::new(Footprint::default()) };
    let (executed, _) = execute_block_writes(&recording, hashes, guessed, std::slice::from_ref(tx))?;
    let footprint = recording.seen.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok((footprint, executed))
}

/// Executes `tx` in the real `block` over `state` as seen through `bag`. An error is an
/// abort: the real execution reached what the bag lacks (named), or the state is damaged.
pub fn execute_bagged(
    state: &dyn StateSource,
    bag: &Footprint,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    tx: &EthTransaction,
) -> Result<ExecutedBlock, StateError> {
    let bagged = Bagged::new(state, bag);
    let (mut executed, _) = execute_block_writes(&bagged, hashes, block, std::slice::from_ref(tx))?;
    match executed.refused.pop() {
        Some(Refused { reason: ExecError::State(missing), .. }) => Err(missing),
        Some(refused) => {
            executed.refused.push(refused);
            Ok(executed)
        }
        None => Ok(executed),
    }
}
