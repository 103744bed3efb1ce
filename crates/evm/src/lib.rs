//! Virga's EVM: Ethereum transactions executed by revm over the DSM-Tree's state.
//!
//! - [`transaction`]: every EIP-2718 transaction type, decoded with alloy, signer recovered.
//! - [`db`]: revm's read side over a [`StateSource`] (the whole state, or a partial one)
//!   and block hashes; [`WorldState`] takes a block's writes.
//! - [`overlay`]: a block's reads and writes over the trie; revm's change sets folded in
//!   (EIP-161 deletions included), then written into the trie in one pass.
//! - [`executor`]: forks, the block context, one transaction in, its outcome out.
//! - [`block`]: a block's transactions in order (Virga's serial executor), receipts with
//!   logs and bloom, invalid transactions left out with the reason.
//! - [`cached`]: a state with its executor's read cache, or a flat copy of the whole state,
//!   across blocks.
//! - [`parallel`]: the same block in two stages: every transaction at once, then validation
//!   in block order with re-execution where a read went stale.
//! - [`partial`]: a partial world state (accounts, contracts' storage, code) as far as
//!   witnesses reached: a RainBlock miner's top layer with its contracts.
//! - [`speculation`]: RainBlock's speculative pre-execution (the footprint of a guessed
//!   block) and the miner's execution against the bag alone.
//! - [`statetest`]: Ethereum's GeneralStateTests through that executor (`virga evm-test`).

#![forbid(unsafe_code)]

pub mod block;
pub mod cached;
pub mod contracts;
pub mod db;
pub mod executor;
mod flat;
pub mod fuzzing;
pub mod overlay;
pub mod parallel;
pub mod partial;
pub mod reference;
pub mod speculation;
pub mod statetest;
pub mod transaction;

pub use block::{
    execute_block, execute_block_parallel, execute_block_parallel_writes, execute_block_writes, receipts_root,
    ExecutedBlock, Receipt, Refused,
};
pub use cached::CachedState;
pub use db::{BlockHashes, DecimalHashes, StateDb, StateError, StateSource, WorldState};
pub use executor::{execute_transaction, logs_hash, BlockContext, ExecError, Fork, TxOutcome};
pub use overlay::{AccountWrite, BlockWrites};
pub use parallel::{ParallelStats, SerialReason};
pub use partial::{PartialState, WitnessJoinError};
pub use transaction::{EthTransaction, TransactionError};
