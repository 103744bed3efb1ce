//! Speculative pre-execution with guessed block contexts, and the miner's execution against
//! the bag alone: a wrong guess aborts a transaction exactly when it changed what the
//! transaction touches (the lottery's bucket), never when it only changed a value (the
//! kitties' genes, a token transfer).

use crate::common::{
    contracts_block as block, contracts_genesis as genesis, sender, Call, KITTIES_AT, LOTTERY_AT, TOKEN_AT,
};
use alloy_primitives::{Address, Bytes, TxKind, B256, U256};
use proptest::prelude::*;
use virga_evm::contracts::{kitties, lottery, token};
use virga_evm::speculation::{execute_bagged, pre_execute, Footprint};
use virga_evm::{BlockHashes, DecimalHashes, EthTransaction, StateError};

fn call(seed: u32, to: Address, input: Bytes) -> EthTransaction {
    let call = Call { nonce: 0, to: TxKind::Call(to), value: U256::ZERO, input, gas_limit: 300_000, legacy: false };
    crate::common::sign(seed, call)
}

/// The client's guess and the miner's block: pre-execution at `guessed`, then execution at
/// `real` against the bag. The footprint of the real execution comes with it.
fn speculate(tx: &EthTransaction, guessed: u64, real: u64) -> (Footprint, Footprint, Result<bool, StateError>) {
    let state = genesis();
    let (bag, _) = pre_execute(&state, &DecimalHashes, &block(guessed), tx).expect("the state answers");
    let (touched, _) = pre_execute(&state, &DecimalHashes, &block(real), tx).expect("the state answers");
    let outcome = execute_bagged(&state, &bag, &DecimalHashes, &block(real), tx)
        .map(|executed| executed.receipts.first().is_some_and(|receipt| receipt.success));
    (bag, touched, outcome)
}

/// Two block numbers whose lottery buckets differ (and one whose bucket is the same as
/// another's), found by search: the bucket hashes the number and its parent's hash.
fn numbers_with_buckets(same: bool) -> (u64, u64) {
    let bucket = |number: u64| lottery::bucket(number, DecimalHashes.block_hash(number - 1));
    let first = 10;
    let second = (first + 1..first + 10_000)
        .find(|&number| (bucket(number) == bucket(first)) == same)
        .expect("64 buckets: some number lands in each relation");
    (first, second)
}

#[test]
fn a_token_transfer_is_untouched_by_a_stale_guess() {
    let tx = call(1, TOKEN_AT, token::transfer(sender(2), U256::from(5)));
    let (bag, touched, outcome) = speculate(&tx, 10, 17);
    assert_eq!(outcome, Ok(true));
    assert!(bag.covers(&touched));
    let balance_slots = [token::balance_slot(sender(1)), token::balance_slot(sender(2))];
    for slot in balance_slots {
        assert!(bag.slots.contains(&(TOKEN_AT, slot)), "{bag:?}");
    }
    assert!(bag.code.len() == 1 && bag.accounts.contains(&TOKEN_AT), "the token's code travels in the bag: {bag:?}");
}

#[test]
fn kitties_written_values_follow_the_block_but_their_slots_do_not() {
    let tx = call(2, KITTIES_AT, kitties::give_birth(U256::from(7)));
    let (bag, touched, outcome) = speculate(&tx, 10, 11);
    assert_eq!(outcome, Ok(true), "a stale guess still gives the miner every slot");
    assert_eq!(bag, touched, "the same slots at either block");
    assert!(bag.slots.contains(&(KITTIES_AT, kitties::genes_slot(U256::from(7)))));

    // The value written does depend on the block: the miner's is not the client's guess.
    let genes = |number: u64| {
        let mut state = genesis();
        virga_evm::execute_block(&mut state, &DecimalHashes, &block(number), std::slice::from_ref(&tx))
            .expect("the state answers");
        state.storage(&KITTIES_AT, &B256::from(kitties::genes_slot(U256::from(7))))
    };
    assert_ne!(genes(10), genes(11));
}

#[test]
fn a_lottery_entry_aborts_when_the_guess_moves_its_bucket_and_names_the_slot() {
    let tx = call(3, LOTTERY_AT, lottery::enter());
    let (guessed, real) = numbers_with_buckets(false);
    let (bag, touched, outcome) = speculate(&tx, guessed, real);
    assert!(!bag.covers(&touched));
    let real_bucket = lottery::bucket(real, DecimalHashes.block_hash(real - 1));
    let slot = lottery::tickets_slot(real_bucket);
    match outcome {
        Err(StateError::NotHeld { what, reason }) => {
            assert_eq!(what, format!("storage slot {slot:#x} of {LOTTERY_AT}"));
            assert!(reason.contains("bag"), "{reason}");
        }
        other => panic!("expected an abort naming the slot, got {other:?}"),
    }

    // The same entry guessed right, or guessed into the same bucket, goes through.
    assert_eq!(speculate(&tx, real, real).2, Ok(true));
    let (guessed, real) = numbers_with_buckets(true);
    assert_eq!(speculate(&tx, guessed, real).2, Ok(true));
}

#[test]
fn the_bag_is_what_stops_the_miner() {
    // Broken variant: a "bag" holding everything the state holds never aborts, so the
    // lottery's wrong guess would go unnoticed; the real bag must differ from it.
    let tx = call(3, LOTTERY_AT, lottery::enter());
    let (guessed, real) = numbers_with_buckets(false);
    let state = genesis();
    let (bag, _) = pre_execute(&state, &DecimalHashes, &block(guessed), &tx).expect("answers");
    let (everything, _) = pre_execute(&state, &DecimalHashes, &block(real), &tx).expect("answers");
    let mut widened = bag.clone();
    widened.extend(&everything);
    assert!(execute_bagged(&state, &widened, &DecimalHashes, &block(real), &tx).is_ok());
    assert!(execute_bagged(&state, &bag, &DecimalHashes, &block(real), &tx).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// For any guess and any real block, the miner aborts exactly when the real execution
    /// touches something the guessed one did not.
    #[test]
    fn aborts_happen_exactly_where_the_touched_set_changed(
        which in 0usize..3,
        guessed in 2u64..500,
        real in 2u64..500,
    ) {
        let tx = match which {
            0 => call(1, TOKEN_AT, token::transfer(sender(2), U256::from(5))),
            1 => call(2, KITTIES_AT, kitties::give_birth(U256::from(guessed % 5))),
            _ => call(3, LOTTERY_AT, lottery::enter()),
        };
        let (bag, touched, outcome) = speculate(&tx, guessed, real);
        prop_assert_eq!(outcome.is_err(), !bag.covers(&touched), "{:?} {:?}", bag, touched);
        if which < 2 {
            prop_assert!(outcome.is_ok(), "{:?}", outcome);
        }
    }
}
