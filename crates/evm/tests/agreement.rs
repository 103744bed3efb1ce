//! Virga's executor (revm over the DSM-Tree through a per-block overlay) against revm alone
//! over its in-memory `CacheDB`, on random blocks: the same receipts, logs and refusals, and
//! the same state root (the peer's computed by alloy-trie) after every block.

use crate::common::{sender, sign, Call};
use alloy_primitives::{Address, Bytes, TxKind, U256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_evm::contracts::{kitties, lottery, token, KITTIES, LOTTERY, TOKEN};
use virga_evm::reference::{execute_reference, genesis_reference, genesis_state, reference_root, GenesisAccount};
use virga_evm::{
    execute_block, execute_block_parallel, BlockContext, CachedState, DecimalHashes, EthTransaction, ExecutedBlock,
    Fork,
};

const USERS: u32 = 12;
const TOKEN_AT: Address = Address::with_last_byte(0xe2);
const KITTIES_AT: Address = Address::with_last_byte(0xc4);
const LOTTERY_AT: Address = Address::with_last_byte(0x10);

fn genesis() -> Vec<GenesisAccount> {
    let mut accounts: Vec<GenesisAccount> = (1..=USERS)
        .map(|seed| GenesisAccount {
            address: sender(seed),
            balance: U256::from(10u64).pow(U256::from(18)),
            ..GenesisAccount::default()
        })
        .collect();
    let holdings = (1..=USERS).map(|seed| (token::balance_slot(sender(seed)), U256::from(1_000_000u64))).collect();
    accounts.push(GenesisAccount {
        address: TOKEN_AT,
        code: TOKEN.runtime_code(),
        storage: holdings,
        ..Default::default()
    });
    accounts.push(GenesisAccount { address: KITTIES_AT, code: KITTIES.runtime_code(), ..Default::default() });
    accounts.push(GenesisAccount { address: LOTTERY_AT, code: LOTTERY.runtime_code(), ..Default::default() });
    accounts
}

fn block(number: u64, rng: &mut StdRng) -> BlockContext {
    BlockContext {
        fork: if rng.random_bool(0.5) { Fork::Cancun } else { Fork::Shanghai },
        chain_id: 1,
        number,
        timestamp: 10 * number,
        coinbase: Address::with_last_byte(0xcb),
        gas_limit: 3_000_000,
        base_fee: rng.random_range(1..15),
        difficulty: U256::ZERO,
        prev_randao: alloy_primitives::B256::with_last_byte(number as u8),
        excess_blob_gas: 0,
    }
}

/// One random transaction; `nonces` tracks what each user's next nonce will be if it is
/// accepted (deliberately wrong nonces and oversized gas limits are refused and do not
/// advance it).
fn random_tx(rng: &mut StdRng, nonces: &mut [u64]) -> EthTransaction {
    random_tx_of(rng, nonces, 0..11)
}

/// [`random_tx`] of the kinds in `kinds` (8 deploys a token).
fn random_tx_of(rng: &mut StdRng, nonces: &mut [u64], kinds: std::ops::Range<u32>) -> EthTransaction {
    let seed = rng.random_range(1..=USERS);
    let user = |rng: &mut StdRng| sender(rng.random_range(1..=USERS));
    let mut nonce = nonces[seed as usize];
    let mut gas_limit = 200_000;
    let (to, value, input) = match rng.random_range(kinds) {
        // Plain transfers, some of zero value to an address that does not exist: a touched
        // empty account that EIP-161 deletes.
        0 => (TxKind::Call(user(rng)), U256::from(rng.random_range(1..1_000_000u64)), Bytes::new()),
        1 => (TxKind::Call(Address::with_last_byte(rng.random_range(0x40..0x48))), U256::ZERO, Bytes::new()),
        2 | 3 => {
            // Up to twice a typical holding: some transfers revert.
            let amount = U256::from(rng.random_range(0..2_000_000u64));
            (TxKind::Call(TOKEN_AT), U256::ZERO, token::transfer(user(rng), amount))
        }
        4 => {
            (TxKind::Call(TOKEN_AT), U256::ZERO, token::approve(user(rng), U256::from(rng.random_range(0..500_000u64))))
        }
        5 => {
            let amount = U256::from(rng.random_range(0..400_000u64));
            (TxKind::Call(TOKEN_AT), U256::ZERO, token::transfer_from(user(rng), user(rng), amount))
        }
        6 => (TxKind::Call(KITTIES_AT), U256::ZERO, kitties::give_birth(U256::from(rng.random_range(0..5u64)))),
        7 => (TxKind::Call(LOTTERY_AT), U256::ZERO, lottery::enter()),
        8 => {
            gas_limit = 1_500_000;
            (TxKind::Create, U256::ZERO, TOKEN.init_code())
        }
        9 => {
            nonce += 3;
            (TxKind::Call(user(rng)), U256::from(1u64), Bytes::new())
        }
        _ => {
            gas_limit = 5_000_000;
            (TxKind::Call(user(rng)), U256::from(1u64), Bytes::new())
        }
    };
    if nonce == nonces[seed as usize] && gas_limit <= 3_000_000 {
        nonces[seed as usize] += 1;
    }
    sign(seed, Call { nonce, to, value, input, gas_limit, legacy: rng.random_bool(0.3) })
}

fn summary(executed: &ExecutedBlock) -> Vec<(usize, bool, u64, u64, usize)> {
    let receipts = executed.receipts.iter().zip(&executed.included);
    receipts
        .map(|(receipt, index)| {
            (*index, receipt.success, receipt.gas_used, receipt.cumulative_gas_used, receipt.logs.len())
        })
        .collect()
}

#[test]
fn virga_and_revm_alone_agree_on_random_blocks() {
    // (included, reverted, refused, logs): the blocks exercise every path.
    let mut seen = (0, 0, 0, 0);
    for seed in 0..12u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let accounts = genesis();
        let mut state = genesis_state(&accounts);
        // Virga's executor with its read cache across blocks: write-through or write-back
        // (the trie updated only at the end), with a cache so small that it starts over
        // every block, one that keeps everything, or a flat copy of the whole state.
        let write_back = seed % 4 >= 2;
        let mut cached = match seed % 3 {
            0 => CachedState::new(state.clone(), CachedState::DEFAULT_CAPACITY),
            1 => CachedState::new(state.clone(), 8),
            _ => CachedState::from_genesis(&accounts),
        }
        .with_write_back(write_back);
        let mut reference = genesis_reference(&accounts);
        assert_eq!(state.root(), reference_root(&reference), "seed {seed}: genesis");
        let mut nonces = vec![0u64; USERS as usize + 1];
        for number in 1..=6u64 {
            let context = block(number, &mut rng);
            let count = rng.random_range(1..40);
            let txs: Vec<EthTransaction> = (0..count).map(|_| random_tx(&mut rng, &mut nonces)).collect();
            let ours = execute_block(&mut state, &DecimalHashes, &context, &txs).expect("the state answers");
            let theirs = execute_reference(&mut reference, &context, &txs);
            let through_cache = cached.execute_block(&DecimalHashes, &context, &txs).expect("the state answers");
            assert_eq!(through_cache, ours, "seed {seed}, block {number}: through the read cache");
            let replay = format!("seed {seed}, block {number} (replay: this test with only that seed)");
            assert_eq!(summary(&ours), summary(&theirs), "{replay}: receipts");
            assert_eq!(ours.receipts, theirs.receipts, "{replay}: logs");
            assert_eq!(ours.receipts_root(), theirs.receipts_root(), "{replay}");
            assert_eq!(ours.logs_bloom, theirs.logs_bloom, "{replay}");
            let refused = |block: &ExecutedBlock| block.refused.iter().map(|refused| refused.index).collect::<Vec<_>>();
            assert_eq!(refused(&ours), refused(&theirs), "{replay}: refusals");
            assert_eq!(state.root(), reference_root(&reference), "{replay}: state root");
            if !write_back {
                assert_eq!(cached.root(), state.root(), "{replay}: state root through the read cache");
            }
            seen.0 += ours.receipts.len();
            seen.1 += ours.receipts.iter().filter(|receipt| !receipt.success).count();
            seen.2 += ours.refused.len();
            seen.3 += ours.receipts.iter().map(|receipt| receipt.logs.len()).sum::<usize>();
        }
        assert_eq!(cached.root(), state.root(), "seed {seed}: state root after write-back");
    }
    let (included, reverted, refused, logs) = seen;
    assert!(included > 500 && reverted > 20 && refused > 50 && logs > 200, "{seen:?}");
}

#[test]
fn a_broken_executor_is_caught_by_the_comparison() {
    // Drop one transaction's writes by executing a block without its last transaction on
    // Virga's side: the roots must differ.
    let mut rng = StdRng::seed_from_u64(99);
    let accounts = genesis();
    let mut state = genesis_state(&accounts);
    let mut reference = genesis_reference(&accounts);
    let mut nonces = vec![0u64; USERS as usize + 1];
    let context = block(1, &mut rng);
    let transfer = sign(
        1,
        Call {
            nonce: 0,
            to: TxKind::Call(TOKEN_AT),
            value: U256::ZERO,
            input: token::transfer(sender(2), U256::from(5u64)),
            gas_limit: 200_000,
            legacy: false,
        },
    );
    nonces[1] = 1;
    let mut txs: Vec<EthTransaction> = (0..10).map(|_| random_tx(&mut rng, &mut nonces)).collect();
    txs.insert(0, transfer);
    execute_block(&mut state, &DecimalHashes, &context, &txs[1..]).expect("the state answers");
    execute_reference(&mut reference, &context, &txs);
    assert_ne!(state.root(), reference_root(&reference));
}

#[test]
fn parallel_execution_equals_serial_on_random_blocks_with_hot_contract_storage() {
    // (blocks run in parallel, re-executions, blocks run serially)
    let mut seen = (0, 0, 0);
    for seed in 0..16u64 {
        let mut rng = StdRng::seed_from_u64(1_000 + seed);
        let accounts = genesis();
        let mut serial = genesis_state(&accounts);
        let mut parallel = serial.clone();
        let cached = match seed % 3 {
            2 => CachedState::from_genesis(&accounts),
            _ => CachedState::new(serial.clone(), CachedState::DEFAULT_CAPACITY),
        };
        let mut cached = cached.with_write_back(seed % 2 == 1);
        let mut nonces = vec![0u64; USERS as usize + 1];
        for number in 1..=5u64 {
            let context = block(number, &mut rng);
            let count = rng.random_range(5..60);
            // Deployments only in some seeds: they make a block run serially.
            let kinds = if seed % 4 == 0 { 0..11 } else { 0..8 };
            let txs: Vec<EthTransaction> =
                (0..count).map(|_| random_tx_of(&mut rng, &mut nonces, kinds.clone())).collect();
            let expected = execute_block(&mut serial, &DecimalHashes, &context, &txs).expect("the state answers");
            let (got, stats) =
                execute_block_parallel(&mut parallel, &DecimalHashes, &context, &txs).expect("the state answers");
            let replay = format!("seed {seed}, block {number}: {stats:?}");
            assert_eq!(got, expected, "{replay}");
            assert_eq!(parallel.root(), serial.root(), "{replay}: state root");
            let (through_cache, _) =
                cached.execute_block_parallel(&DecimalHashes, &context, &txs).expect("the state answers");
            assert_eq!(through_cache, expected, "{replay}: through the read cache");
            match stats.serial {
                None => seen.0 += 1,
                Some(_) => seen.2 += 1,
            }
            seen.1 += stats.reexecutions;
        }
        assert_eq!(cached.root(), serial.root(), "seed {seed}: through the read cache");
    }
    let (parallel, reexecutions, serial) = seen;
    assert!(parallel >= 40 && reexecutions >= 100 && serial >= 1, "{seen:?}");
}

#[test]
fn a_transaction_whose_optimistic_read_was_stale_runs_again_and_ends_as_serially() {
    // Sender 2 holds no tokens until sender 1's transfer, earlier in the same block, pays it:
    // run at once against the block's start, sender 2's transfer reverts; in block order it
    // succeeds. Validation must catch the stale balance and run it again.
    let state = crate::common::contracts_genesis();
    let context = crate::common::contracts_block(1);
    let transfer = |seed: u32, to: Address, amount: u64| {
        let call = Call {
            nonce: 0,
            to: TxKind::Call(crate::common::TOKEN_AT),
            value: U256::ZERO,
            input: token::transfer(to, U256::from(amount)),
            gas_limit: 100_000,
            legacy: false,
        };
        sign(seed, call)
    };
    let txs = vec![transfer(1, sender(2), 400), transfer(2, sender(3), 300)];
    let mut serial = state.clone();
    let expected = execute_block(&mut serial, &DecimalHashes, &context, &txs).expect("the state answers");
    assert!(expected.receipts.iter().all(|receipt| receipt.success), "{expected:?}");
    let mut parallel = state;
    let (got, stats) =
        execute_block_parallel(&mut parallel, &DecimalHashes, &context, &txs).expect("the state answers");
    assert_eq!(stats.serial, None);
    assert_eq!((stats.rounds, stats.reexecutions), (2, 1), "{stats:?}");
    assert_eq!(got, expected);
    assert_eq!(parallel.root(), serial.root());
}
