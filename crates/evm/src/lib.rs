//! Virga's EVM: Ethereum transactions executed by revm over the DSM-Tree's state.
//!
//! - [`transaction`]: every EIP-2718 transaction type, decoded with alloy, signer recovered.
//! - [`db`]: revm's read side over [`virga_trie::account::StateTrie`] and block hashes.
//! - [`commit`]: revm's change set folded into the trie (EIP-161 deletions included).
//! - [`executor`]: forks, the block context, one transaction in, its outcome out.
//! - [`statetest`]: Ethereum's GeneralStateTests through that executor (`virga evm-test`).

#![forbid(unsafe_code)]

pub mod commit;
pub mod db;
pub mod executor;
pub mod fuzzing;
pub mod statetest;
pub mod transaction;

pub use db::{BlockHashes, DecimalHashes, StateDb, StateError};
pub use executor::{execute_transaction, logs_hash, BlockContext, ExecError, Fork, TxOutcome};
pub use transaction::{EthTransaction, TransactionError};
