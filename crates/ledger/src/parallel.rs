//! ChainifyDB's parallel staged execution (seed 002 §4.6.3).
//!
//! The block's dependency graph follows block order: a transfer depends on every earlier
//! transfer that touches one of its accounts (transfers read and write both accounts, so any
//! overlap is a read-write, write-write or write-read conflict). Topological levels of that
//! graph are the stages: no two transfers of one stage touch the same account, so a stage
//! runs on the thread pool against the state left by the previous stages, and its writes are
//! then installed. The result equals serial execution in block order, because each transfer
//! sees exactly the writes of the transfers it depends on, and no others.

use alloy_primitives::{Address, U256};
use rayon::prelude::*;
use std::collections::HashMap;
use virga_trie::account::StateTrie;

use crate::exec::{
    apply_transfer, collect_outcome, credit_fees, load_account, load_account_by_key, write_effect, AccountState,
    BlockOutcome, Effect, ExecConfig, FailReason, StateError, TransferView,
};

/// The stages of a block: indices of transfers, each stage in block order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    pub stages: Vec<Vec<usize>>,
}

impl Stages {
    /// The longest stage (the most parallelism available at once).
    pub fn widest(&self) -> usize {
        self.stages.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// Levels of the dependency graph. The latest transfer to touch an account carries the
/// highest level of any transfer that touched it, so one look-up per account gives the
/// longest path to a transfer without materialising the edges.
pub fn dependency_stages(txs: &[TransferView]) -> Stages {
    let mut level_of_account: HashMap<Address, usize> = HashMap::with_capacity(txs.len() * 2);
    let mut stages: Vec<Vec<usize>> = Vec::new();
    for (index, tx) in txs.iter().enumerate() {
        let after_sender = level_of_account.get(&tx.sender).map_or(0, |level| level + 1);
        let after_recipient = level_of_account.get(&tx.to).map_or(0, |level| level + 1);
        let level = after_sender.max(after_recipient);
        level_of_account.insert(tx.sender, level);
        level_of_account.insert(tx.to, level);
        if stages.len() == level {
            stages.push(Vec::new());
        }
        stages[level].push(index);
    }
    Stages { stages }
}

/// Executes a block stage by stage on `pool`, then credits the fees. Produces the same
/// state and receipts as [`crate::exec::execute_serial`].
pub fn execute_staged<S: AccountState>(
    state: &mut S,
    txs: &[TransferView],
    beneficiary: Address,
    config: &ExecConfig,
    pool: &rayon::ThreadPool,
) -> Result<(BlockOutcome, Stages), StateError> {
    let stages = dependency_stages(txs);
    let mut outcomes: Vec<Result<(), FailReason>> = vec![Ok(()); txs.len()];
    for stage in &stages.stages {
        let snapshot: &S = state;
        let results: Vec<Result<Result<Effect, FailReason>, StateError>> = pool.install(|| {
            stage
                .par_iter()
                .with_min_len(16)
                .map(|&index| {
                    let tx = &txs[index];
                    let sender = load_account_by_key(snapshot, &tx.sender, &tx.sender_key)?;
                    let recipient = load_account_by_key(snapshot, &tx.to, &tx.to_key)?;
                    Ok(apply_transfer(config, tx, &sender, &recipient))
                })
                .collect()
        });
        for (&index, result) in stage.iter().zip(results) {
            match result? {
                Ok(effect) => write_effect(state, &txs[index], &effect)?,
                Err(reason) => outcomes[index] = Err(reason),
            }
        }
    }
    let outcome = collect_outcome(txs, outcomes);
    credit_fees(state, beneficiary, outcome.fees)?;
    Ok((outcome, stages))
}

/// Total value held by `accounts` (for conservation checks in tests and benchmarks).
pub fn total_balance(state: &StateTrie, accounts: &[Address]) -> Result<U256, StateError> {
    accounts.iter().try_fold(U256::ZERO, |sum, address| Ok(sum.saturating_add(load_account(state, address)?.balance)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{execute_serial, TRANSFER_GAS};
    use alloy_primitives::B256;
    use proptest::prelude::*;
    use virga_trie::account::Account;

    fn address(index: u8) -> Address {
        Address::repeat_byte(index + 1)
    }

    fn view(sender: u8, to: u8, nonce: u64, value: u64, serial: usize) -> TransferView {
        let hash = B256::with_last_byte(serial as u8);
        TransferView::new(hash, address(sender), address(to), nonce, U256::from(value), 2, TRANSFER_GAS, None)
    }

    #[test]
    fn stages_follow_block_order_conflicts() {
        // 0: a->b, 1: c->d, 2: b->c, 3: e->f, 4: a->e
        let txs =
            [view(0, 1, 0, 1, 0), view(2, 3, 0, 1, 1), view(1, 2, 0, 1, 2), view(4, 5, 0, 1, 3), view(0, 4, 1, 1, 4)];
        let stages = dependency_stages(&txs);
        assert_eq!(stages.stages, vec![vec![0, 1, 3], vec![2, 4]]);
        assert_eq!(stages.widest(), 3);
    }

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a thread pool of two threads")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random blocks over few accounts (many conflicts, failing nonces and balances):
        /// staged execution gives serial execution's root and receipts.
        #[test]
        fn staged_equals_serial(
            funds in proptest::collection::vec(0u64..200_000, 6),
            txs in proptest::collection::vec((0u8..6, 0u8..7, 0u64..3, 0u64..90_000), 0..120),
        ) {
            let mut state = StateTrie::new();
            for (index, balance) in funds.iter().enumerate() {
                state.set_account(address(index as u8), Account::with_balance(0, U256::from(*balance)));
            }
            let views: Vec<TransferView> = txs
                .iter()
                .enumerate()
                .map(|(serial, &(sender, to, nonce, value))| view(sender, to, nonce, value, serial))
                .collect();
            let beneficiary = address(9);
            let mut serial_state = state.clone();
            let serial = execute_serial(&mut serial_state, &views, beneficiary, &ExecConfig::default());
            let mut staged_state = state.clone();
            let staged = execute_staged(&mut staged_state, &views, beneficiary, &ExecConfig::default(), &pool());
            let (staged, stages) = staged.expect("state decodes");
            prop_assert_eq!(serial.expect("state decodes"), staged);
            prop_assert_eq!(serial_state.root(), staged_state.root());
            prop_assert_eq!(stages.stages.iter().map(Vec::len).sum::<usize>(), views.len());
            let mut everyone: Vec<Address> = (0..7).map(address).collect();
            everyone.push(beneficiary);
            prop_assert_eq!(
                total_balance(&staged_state, &everyone).expect("decodes"),
                total_balance(&state, &everyone).expect("decodes"),
                "transfers and fees conserve value"
            );
        }
    }
}
