//! A partial state made of exactly the witnesses pre-execution names (accounts, storage
//! slots with their proofs from each storage root, code) executes a block as the whole state
//! does: the same receipts and the same state root, storage roots included. What it lacks
//! is named.

use std::collections::BTreeMap;

use crate::common::{contracts_block as block, contracts_genesis as genesis, sender, Call, KITTIES_AT, TOKEN_AT};
use alloy_primitives::{keccak256, Address, Bytes, TxKind, B256, U256};
use virga_evm::contracts::{kitties, token};
use virga_evm::speculation::{pre_execute, Footprint};
use virga_evm::{
    execute_block, execute_block_parallel, DecimalHashes, EthTransaction, ExecError, PartialState, StateError,
    WorldState,
};
use virga_trie::account::StateTrie;
use virga_trie::PartialTrie;

fn call(seed: u32, nonce: u64, to: Address, input: Bytes) -> EthTransaction {
    let call = Call { nonce, to: TxKind::Call(to), value: U256::ZERO, input, gas_limit: 300_000, legacy: false };
    crate::common::sign(seed, call)
}

fn pay(seed: u32, nonce: u64, to: Address) -> EthTransaction {
    let call = Call {
        nonce,
        to: TxKind::Call(to),
        value: U256::from(1_000u64),
        input: Bytes::new(),
        gas_limit: 21_000,
        legacy: false,
    };
    crate::common::sign(seed, call)
}

/// Token moves that create a slot, empty one and fill another, a kitty's birth and a
/// payment to a new account.
fn transactions() -> Vec<EthTransaction> {
    vec![
        call(1, 0, TOKEN_AT, token::transfer(sender(2), U256::from(400))),
        call(2, 0, TOKEN_AT, token::transfer(sender(3), U256::from(400))),
        call(1, 1, TOKEN_AT, token::transfer(sender(3), U256::from(600))),
        call(3, 0, KITTIES_AT, kitties::give_birth(U256::from(7))),
        pay(3, 1, Address::repeat_byte(0x42)),
    ]
}

/// What the block touches, each transaction pre-executed after the ones before it.
fn footprint(state: &StateTrie, txs: &[EthTransaction], number: u64) -> Footprint {
    let mut state = state.clone();
    let mut touched = Footprint::default();
    for tx in txs {
        let (footprint, _) = pre_execute(&state, &DecimalHashes, &block(number), tx).unwrap();
        touched.extend(&footprint);
        execute_block(&mut state, &DecimalHashes, &block(number), std::slice::from_ref(tx)).unwrap();
    }
    touched
}

/// The partial state a miner assembles from the witnesses of `footprint`.
fn witnessed(state: &StateTrie, footprint: &Footprint) -> PartialState {
    let mut accounts = PartialTrie::from_root_hash(state.accounts().root_hash());
    let keys: Vec<B256> = footprint.accounts.iter().map(keccak256).collect();
    accounts.apply_bag(&state.accounts().as_trie().prove_many(&keys, 0)).unwrap();
    let mut partial = PartialState::new(accounts);
    let mut slots: BTreeMap<Address, Vec<B256>> = BTreeMap::new();
    for (address, slot) in &footprint.slots {
        slots.entry(*address).or_default().push(keccak256(B256::from(*slot)));
    }
    for (address, keys) in slots {
        if let Some(trie) = state.storage_trie(&address) {
            partial.attach_storage(keccak256(address), &trie.as_trie().prove_many(&keys, 0)).unwrap();
        }
    }
    for hash in &footprint.code {
        partial.insert_code(*hash, state.code(hash).unwrap()).unwrap();
    }
    partial
}

#[test]
fn a_block_over_its_witnesses_alone_gives_the_whole_states_receipts_and_root() {
    let state = genesis();
    let txs = transactions();
    let touched = footprint(&state, &txs, 5);
    assert!(touched.slots.iter().any(|(address, _)| *address == TOKEN_AT));
    let mut partial = witnessed(&state, &touched);
    let mut whole = state.clone();
    let expected = execute_block(&mut whole, &DecimalHashes, &block(5), &txs).unwrap();
    let executed = execute_block(&mut partial, &DecimalHashes, &block(5), &txs).unwrap();
    assert_eq!(executed.receipts, expected.receipts);
    assert!(expected.receipts.iter().all(|receipt| receipt.success));
    assert_eq!(partial.state_root(None), whole.root());
    // The token's storage root moved, and the partial trie agrees with the whole one.
    assert_ne!(
        whole.account(&TOKEN_AT).unwrap().unwrap().storage_root,
        genesis().account(&TOKEN_AT).unwrap().unwrap().storage_root
    );
    assert_eq!(
        partial.storage_trie(&TOKEN_AT).unwrap().root_hash(),
        whole.storage_trie(&TOKEN_AT).unwrap().root_hash()
    );

    // The next block runs on from there, over fresh witnesses of what it touches.
    let next = vec![call(3, 2, TOKEN_AT, token::transfer(sender(1), U256::from(1_000)))];
    let touched = footprint(&whole, &next, 6);
    let mut partial = witnessed(&whole, &touched);
    let expected = execute_block(&mut whole, &DecimalHashes, &block(6), &next).unwrap();
    assert_eq!(execute_block(&mut partial, &DecimalHashes, &block(6), &next).unwrap().receipts, expected.receipts);
    assert_eq!(partial.state_root(None), whole.root());
}

/// The transactions `executed` left out: each one's index, reason and, for a missing
/// witness, what it lacked.
fn left_out(executed: &virga_evm::ExecutedBlock) -> Vec<(usize, &'static str, String)> {
    executed
        .refused
        .iter()
        .map(|refused| match &refused.reason {
            ExecError::State(StateError::NotHeld { what, .. }) => (refused.index, refused.reason.name(), what.clone()),
            other => (refused.index, other.name(), String::new()),
        })
        .collect()
}

#[test]
fn a_transaction_whose_witnesses_fall_short_is_left_out_naming_what_it_lacked() {
    let state = genesis();
    let txs = transactions();
    let touched = footprint(&state, &txs, 5);

    // Without the token's storage witness, no token transfer can read a balance; the
    // kitty's birth and the payment go through, and the root is the whole state's after
    // those two alone.
    let mut no_storage = touched.clone();
    no_storage.slots.retain(|(address, _)| *address != TOKEN_AT);
    let mut bare = witnessed(&state, &no_storage);
    let executed = execute_block(&mut bare, &DecimalHashes, &block(5), &txs).unwrap();
    let refused = left_out(&executed);
    let reasons: Vec<_> = refused.iter().map(|(index, name, _)| (*index, *name)).collect();
    // Sender 1's second transfer follows its first, which was left out: its nonce is ahead.
    assert_eq!(reasons, vec![(0, "missing_witness"), (1, "missing_witness"), (2, "nonce_mismatch")]);
    for (_, _, what) in &refused[..2] {
        assert!(what.contains("storage slot") && what.contains(&format!("{TOKEN_AT}")), "{what}");
    }
    assert_eq!(executed.included, vec![3, 4]);
    // The parallel executor leaves out the same transactions, for the same reasons.
    let mut in_parallel = witnessed(&state, &no_storage);
    let (executed_in_parallel, stats) =
        execute_block_parallel(&mut in_parallel, &DecimalHashes, &block(5), &txs).unwrap();
    assert_eq!(stats.serial, None, "the block ran in parallel");
    assert_eq!(executed_in_parallel, executed, "{stats:?}");
    assert_eq!(in_parallel.state_root(None), bare.state_root(None));
    let mut whole = state.clone();
    execute_block(&mut whole, &DecimalHashes, &block(5), &txs[3..]).unwrap();
    assert_eq!(bare.state_root(None), whole.root());

    let mut no_code = touched;
    no_code.code.retain(|hash| *hash != whole.account(&TOKEN_AT).unwrap().unwrap().code_hash);
    let mut partial = witnessed(&state, &no_code);
    let executed = execute_block(&mut partial, &DecimalHashes, &block(5), &txs).unwrap();
    let refused = left_out(&executed);
    assert_eq!(refused.len(), 3);
    assert!(
        refused[..2].iter().all(|(_, name, what)| *name == "missing_witness" && what.starts_with("code ")),
        "{refused:?}"
    );
}

#[test]
fn code_that_does_not_hash_to_its_claim_is_refused() {
    let mut partial = PartialState::default();
    let claimed = keccak256([1u8]);
    assert!(partial.insert_code(claimed, &[2u8]).is_err());
    assert!(partial.insert_code(claimed, &[1u8]).is_ok());
}
