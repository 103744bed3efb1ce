//! The workload's contracts executed by Virga's block executor: what they write, where, and
//! how that depends on the block.

use crate::common::{
    contracts_block as block, contracts_genesis as genesis, sender, Call, KITTIES_AT, LOTTERY_AT, TOKEN_AT,
};
use alloy_primitives::{Address, Bytes, TxKind, B256, U256};
use virga_core::KECCAK_EMPTY;
use virga_evm::contracts::{kitties, lottery, token, TOKEN};
use virga_evm::{execute_block, BlockHashes, DecimalHashes, EthTransaction, ExecutedBlock};
use virga_trie::account::StateTrie;

fn sign(seed: u32, nonce: u64, to: TxKind, input: Bytes) -> EthTransaction {
    let gas_limit = if to.is_create() { 2_000_000 } else { 300_000 };
    crate::common::sign(seed, Call { nonce, to, value: U256::ZERO, input, gas_limit, legacy: false })
}

fn run(state: &mut StateTrie, number: u64, txs: &[EthTransaction]) -> ExecutedBlock {
    let executed = execute_block(state, &DecimalHashes, &block(number), txs).expect("the state answers");
    assert!(executed.refused.is_empty(), "{:?}", executed.refused);
    executed
}

fn slot(state: &StateTrie, at: Address, slot: U256) -> U256 {
    state.try_storage(&at, &B256::from(slot)).expect("a stored value")
}

#[test]
fn token_transfers_move_balances_emit_events_and_revert_on_overdraft() {
    let mut state = genesis();
    let (alice, bob, carol) = (sender(1), sender(2), sender(3));
    let txs = [
        sign(1, 0, TxKind::Call(TOKEN_AT), token::transfer(bob, U256::from(300))),
        sign(1, 1, TxKind::Call(TOKEN_AT), token::approve(carol, U256::from(200))),
        sign(3, 0, TxKind::Call(TOKEN_AT), token::transfer_from(alice, carol, U256::from(150))),
        // More than bob holds: reverts, changes no balance, still pays gas.
        sign(2, 0, TxKind::Call(TOKEN_AT), token::transfer(carol, U256::from(301))),
    ];
    let executed = run(&mut state, 1, &txs);
    let statuses: Vec<bool> = executed.receipts.iter().map(|receipt| receipt.success).collect();
    assert_eq!(statuses, [true, true, true, false]);
    assert_eq!(slot(&state, TOKEN_AT, token::balance_slot(alice)), U256::from(550));
    assert_eq!(slot(&state, TOKEN_AT, token::balance_slot(bob)), U256::from(300));
    assert_eq!(slot(&state, TOKEN_AT, token::balance_slot(carol)), U256::from(150));
    assert_eq!(slot(&state, TOKEN_AT, token::allowance_slot(alice, carol)), U256::from(50));
    // Transfer, Approval, Transfer; the reverted call logs nothing.
    let logs: Vec<usize> = executed.receipts.iter().map(|receipt| receipt.logs.len()).collect();
    assert_eq!(logs, [1, 1, 1, 0]);
    let bob_account = state.account(&bob).expect("decodes").expect("exists");
    assert_eq!(bob_account.nonce, 1);
    assert!(executed.receipts[3].gas_used > 21_000);
    assert!(!executed.logs_bloom.is_zero());
}

#[test]
fn a_kitty_birth_writes_the_same_slot_with_a_value_that_depends_on_the_block() {
    let mut at_five = genesis();
    let mut at_six = genesis();
    let birth = sign(1, 0, TxKind::Call(KITTIES_AT), kitties::give_birth(U256::from(7)));
    run(&mut at_five, 5, std::slice::from_ref(&birth));
    run(&mut at_six, 6, &[birth]);
    let genes = kitties::genes_slot(U256::from(7));
    let (five, six) = (slot(&at_five, KITTIES_AT, genes), slot(&at_six, KITTIES_AT, genes));
    assert!(!five.is_zero() && !six.is_zero());
    assert_ne!(five, six);
    assert_eq!(slot(&at_five, KITTIES_AT, kitties::BIRTHS_SLOT), U256::from(1));
}

#[test]
fn a_lottery_entry_writes_the_bucket_its_block_chooses() {
    for number in [5u64, 6, 7, 8] {
        let mut state = genesis();
        run(&mut state, number, &[sign(1, 0, TxKind::Call(LOTTERY_AT), lottery::enter())]);
        let bucket = lottery::bucket(number, DecimalHashes.block_hash(number - 1));
        assert_eq!(slot(&state, LOTTERY_AT, lottery::tickets_slot(bucket)), U256::from(1), "block {number}");
        assert_eq!(slot(&state, LOTTERY_AT, lottery::ENTRIES_SLOT), U256::from(1));
    }
    let buckets: std::collections::BTreeSet<u64> =
        (5..9).map(|number| lottery::bucket(number, DecimalHashes.block_hash(number - 1))).collect();
    assert!(buckets.len() > 1, "the bucket depends on the block");
}

#[test]
fn deploying_a_token_stores_its_code_under_its_hash() {
    let mut state = genesis();
    let executed = run(&mut state, 1, &[sign(2, 0, TxKind::Create, TOKEN.init_code())]);
    assert!(executed.receipts[0].success);
    let created = sender(2).create(0);
    let account = state.account(&created).expect("decodes").expect("deployed");
    assert_ne!(account.code_hash, KECCAK_EMPTY);
    assert_eq!(state.code(&account.code_hash), Some(&TOKEN.runtime_code()[..]));
    assert_eq!(account.nonce, 1);
}
