//! Execution of a block's transactions with revm (through `virga-evm`), under Ethereum's
//! Cancun rules for transactions.
//!
//! A transaction that revm's validation refuses (wrong chain id, nonce, balance, fee below
//! the base fee, gas above what the block has left, …) changes nothing and is left out of
//! the block, as Ethereum leaves it out; one that reverts or runs out of gas is included
//! with a failed receipt and pays its fee. Each transaction pays its priority fee to the
//! block's beneficiary and burns the base fee (EIP-1559).
//!
//! Execution runs serially or with `virga-evm`'s parallel executor (optimistic execution of
//! every transaction at once, validated in block order); both give the same receipts and
//! writes, which [`WorldState::apply`] puts into the state.

use std::collections::VecDeque;

use alloy_consensus::Header;
use alloy_eips::eip1559::BaseFeeParams;
use alloy_primitives::{keccak256, Address, B256};
use virga_evm::{
    execute_block_parallel_writes, execute_block_writes, BlockContext, BlockHashes, BlockWrites, EthTransaction,
    ExecutedBlock, Fork, ParallelStats,
};
use virga_trie::account::Account;

pub use virga_evm::{receipts_root, ExecError, Receipt, Refused, StateError, StateSource, WorldState};

/// Gas of a plain value transfer (Ethereum's intrinsic cost).
pub const TRANSFER_GAS: u64 = 21_000;

/// The base fee of a chain's first block when its genesis names none: one wei, so that
/// transactions priced at one wei per gas stay valid while blocks stay under their target.
pub const GENESIS_BASE_FEE: u64 = 1;

/// Rules of the chain that execution enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecConfig {
    /// Transactions signed for another chain are invalid. Unprotected (pre-EIP-155)
    /// legacy transactions are accepted, as Ethereum still accepts them.
    pub chain_id: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self { chain_id: 1337 }
    }
}

/// The fork whose rules Virga's chain executes transactions under.
pub const FORK: Fork = Fork::Cancun;

/// What revm needs of a block: its header's fields under the chain's rules. PoW blocks have
/// no beacon randomness; `PREVRANDAO` reads the header's mix hash.
pub fn block_context(config: &ExecConfig, header: &Header) -> BlockContext {
    BlockContext {
        fork: FORK,
        chain_id: config.chain_id,
        number: header.number,
        timestamp: header.timestamp,
        coinbase: header.beneficiary,
        gas_limit: header.gas_limit,
        base_fee: header.base_fee_per_gas.unwrap_or_default(),
        difficulty: header.difficulty,
        prev_randao: header.mix_hash,
        excess_blob_gas: 0,
    }
}

/// The base fee of the block after `parent` (EIP-1559 with Ethereum's parameters).
pub fn next_base_fee(parent: &Header) -> u64 {
    let base_fee = parent.base_fee_per_gas.unwrap_or(GENESIS_BASE_FEE);
    alloy_eips::eip1559::calc_next_block_base_fee(
        parent.gas_used,
        parent.gas_limit,
        base_fee,
        BaseFeeParams::ethereum(),
    )
}

/// The hashes of the latest 256 blocks, which is all `BLOCKHASH` may ask for; older or
/// future blocks hash to zero, as the opcode answers for them.
#[derive(Clone, Debug, Default)]
pub struct RecentHashes {
    hashes: VecDeque<(u64, B256)>,
}

impl RecentHashes {
    /// Most blocks `BLOCKHASH` reaches back.
    pub const DEPTH: usize = 256;

    /// Records the hash of the next block (numbers must follow each other; a gap or a
    /// rewind starts the record over).
    pub fn push(&mut self, number: u64, hash: B256) {
        if self.hashes.back().is_some_and(|(last, _)| last.checked_add(1) != Some(number)) {
            self.hashes.clear();
        }
        self.hashes.push_back((number, hash));
        while self.hashes.len() > Self::DEPTH {
            self.hashes.pop_front();
        }
    }
}

impl BlockHashes for RecentHashes {
    fn block_hash(&self, number: u64) -> B256 {
        let Some(&(first, _)) = self.hashes.front() else { return B256::ZERO };
        number
            .checked_sub(first)
            .and_then(|offset| usize::try_from(offset).ok())
            .and_then(|offset| self.hashes.get(offset))
            .map_or(B256::ZERO, |(_, hash)| *hash)
    }
}

/// A block's execution: receipts and refusals, its writes, and the parallel executor's
/// counters when it ran.
#[derive(Clone, Debug, Default)]
pub struct BlockOutcome {
    pub executed: ExecutedBlock,
    pub writes: BlockWrites,
    pub parallel: Option<ParallelStats>,
}

impl BlockOutcome {
    pub fn receipts(&self) -> &[Receipt] {
        &self.executed.receipts
    }

    pub fn gas_used(&self) -> u64 {
        self.executed.gas_used
    }

    /// Included transactions that succeeded.
    pub fn succeeded(&self) -> usize {
        self.executed.receipts.iter().filter(|receipt| receipt.success).count()
    }

    /// Secure-trie keys of every account the block changed.
    pub fn touched_keys(&self) -> impl Iterator<Item = B256> + '_ {
        self.writes.accounts.iter().map(|(address, _)| keccak256(address))
    }
}

/// Executes `txs` in the block `header` describes over `state` and applies the writes.
/// With `pool`, the parallel executor runs on it. An error means the state could not answer
/// (it is damaged, or a partial state lacks something); `state` may then be partly written.
pub fn execute<S: WorldState>(
    state: &mut S,
    config: &ExecConfig,
    header: &Header,
    hashes: &dyn BlockHashes,
    txs: &[EthTransaction],
    pool: Option<&rayon::ThreadPool>,
) -> Result<BlockOutcome, StateError> {
    let block = block_context(config, header);
    let (executed, writes, parallel) = match pool {
        None => {
            let (executed, writes) = execute_block_writes(&*state, hashes, &block, txs)?;
            (executed, writes, None)
        }
        Some(pool) => {
            let (executed, writes, stats) =
                pool.install(|| execute_block_parallel_writes(&*state, hashes, &block, txs))?;
            (executed, writes, Some(stats))
        }
    };
    state.apply(&writes)?;
    Ok(BlockOutcome { executed, writes, parallel })
}

/// Reads an account, treating an absent one as empty.
pub fn load_account(state: &dyn StateSource, address: &Address) -> Result<Account, StateError> {
    Ok(state.account(address)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use alloy_primitives::U256;
    use virga_trie::account::StateTrie;

    use super::*;
    use crate::tx::{RecoveredTx, SignedTx, SigningKey};

    fn header(base_fee: u64) -> Header {
        Header {
            number: 1,
            gas_limit: 30_000_000,
            timestamp: 10,
            beneficiary: Address::repeat_byte(9),
            base_fee_per_gas: Some(base_fee),
            ..Header::default()
        }
    }

    fn transfer(seed: u64, nonce: u64, to: Address, value: u64, gas_price: u128) -> EthTransaction {
        let tx =
            SignedTx::sign(&SigningKey::from_seed(seed), nonce, to, U256::from(value), gas_price, 21_000, Some(1337));
        RecoveredTx::recover(tx).expect("signed here").to_eth()
    }

    fn funded(seeds: &[u64]) -> StateTrie {
        let mut state = StateTrie::new();
        for &seed in seeds {
            state
                .set_account(SigningKey::from_seed(seed).address(), Account::with_balance(0, U256::from(10u64.pow(9))));
        }
        state
    }

    #[test]
    fn a_transfer_pays_the_priority_fee_to_the_beneficiary_and_burns_the_base_fee() {
        let mut state = funded(&[1]);
        let to = Address::repeat_byte(2);
        let outcome = execute(
            &mut state,
            &ExecConfig::default(),
            &header(3),
            &RecentHashes::default(),
            &[transfer(1, 0, to, 500, 5)],
            None,
        )
        .expect("state reads");
        assert_eq!(outcome.gas_used(), TRANSFER_GAS);
        assert_eq!(outcome.succeeded(), 1);
        let sender = load_account(&state, &SigningKey::from_seed(1).address()).expect("decodes");
        assert_eq!(sender.balance, U256::from(10u64.pow(9) - 500 - 5 * 21_000));
        assert_eq!(sender.nonce, 1);
        assert_eq!(load_account(&state, &to).expect("decodes").balance, U256::from(500));
        let beneficiary = load_account(&state, &Address::repeat_byte(9)).expect("decodes");
        assert_eq!(beneficiary.balance, U256::from(2 * 21_000), "priority fee only: 5 - 3 per gas");
    }

    #[test]
    fn invalid_transactions_are_refused_and_change_nothing() {
        let mut state = funded(&[1]);
        let before = state.root();
        let to = Address::repeat_byte(2);
        let txs = [transfer(1, 5, to, 1, 5), transfer(1, 0, to, 1, 2), transfer(3, 0, to, 1, 5)];
        let outcome = execute(&mut state, &ExecConfig::default(), &header(3), &RecentHashes::default(), &txs, None)
            .expect("state reads");
        assert!(outcome.executed.receipts.is_empty());
        let reasons: Vec<String> = outcome.executed.refused.iter().map(|refused| refused.reason.to_string()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("nonce"), "{reasons:?}");
        assert!(reasons[1].contains("fee") || reasons[1].contains("base"), "{reasons:?}");
        assert!(reasons[2].contains("funds") || reasons[2].contains("balance"), "{reasons:?}");
        assert_eq!(state.root(), before);
    }

    #[test]
    fn parallel_and_serial_execution_agree() {
        let seeds: Vec<u64> = (1..=20).collect();
        let txs: Vec<EthTransaction> = seeds
            .iter()
            .flat_map(|&seed| {
                (0..3).map(move |nonce| transfer(seed, nonce, Address::with_last_byte((seed % 4) as u8), 7, 4))
            })
            .collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("threads");
        let mut serial = funded(&seeds);
        let mut parallel = serial.clone();
        let hashes = RecentHashes::default();
        let refused_only = [transfer(99, 0, Address::ZERO, 1, 4)];
        for txs in [&txs[..], &[], &refused_only] {
            let a = execute(&mut serial, &ExecConfig::default(), &header(3), &hashes, txs, None).expect("reads");
            let b =
                execute(&mut parallel, &ExecConfig::default(), &header(3), &hashes, txs, Some(&pool)).expect("reads");
            assert_eq!(a.executed, b.executed);
            assert_eq!(a.writes.accounts.len(), b.writes.accounts.len(), "{} transactions", txs.len());
            assert_eq!(serial.root(), parallel.root(), "{} transactions", txs.len());
            assert!(b.parallel.is_some());
        }
    }

    #[test]
    fn the_base_fee_follows_eip1559_and_recent_hashes_reach_back_256_blocks() {
        let mut parent = header(1_000);
        parent.gas_used = parent.gas_limit;
        assert_eq!(next_base_fee(&parent), 1_125);
        parent.gas_used = 0;
        assert_eq!(next_base_fee(&parent), 875);
        parent.gas_used = parent.gas_limit / 2;
        assert_eq!(next_base_fee(&parent), 1_000);

        let mut hashes = RecentHashes::default();
        for number in 0..300u64 {
            hashes.push(number, B256::with_last_byte(number as u8));
        }
        assert_eq!(hashes.block_hash(299), B256::with_last_byte(299u64 as u8));
        assert_eq!(hashes.block_hash(44), B256::with_last_byte(44));
        assert_eq!(hashes.block_hash(43), B256::ZERO, "older than 256 blocks");
        assert_eq!(hashes.block_hash(300), B256::ZERO, "not yet mined");
    }
}
