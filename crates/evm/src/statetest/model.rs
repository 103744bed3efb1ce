//! The fields of Ethereum's GeneralStateTests format (ethereum/tests, as retesteth fills
//! them) that the runner reads. Fields it does not need are ignored.

use std::collections::BTreeMap;

use alloy_primitives::{Address, Bytes, B256, U256};
use serde::Deserialize;

/// A file: test name to test.
pub type TestFile = BTreeMap<String, TestUnit>;

#[derive(Debug, Deserialize)]
pub struct TestUnit {
    pub env: Env,
    pub pre: BTreeMap<Address, PreAccount>,
    pub transaction: TransactionFields,
    /// Fork name to the expected outcome of each (data, gas, value) combination.
    pub post: BTreeMap<String, Vec<PostEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Env {
    pub current_coinbase: Address,
    pub current_difficulty: U256,
    pub current_gas_limit: U256,
    pub current_number: U256,
    pub current_timestamp: U256,
    #[serde(default)]
    pub current_base_fee: Option<U256>,
    #[serde(default)]
    pub current_random: Option<B256>,
    #[serde(default)]
    pub current_excess_blob_gas: Option<U256>,
}

#[derive(Debug, Deserialize)]
pub struct PreAccount {
    pub balance: U256,
    pub code: Bytes,
    pub nonce: U256,
    pub storage: BTreeMap<U256, U256>,
}

/// The unsigned transaction the cases vary; each case executes its signed `txbytes`, and the
/// sender recovered from them must be this one.
#[derive(Debug, Deserialize)]
pub struct TransactionFields {
    #[serde(default)]
    pub sender: Option<Address>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostEntry {
    /// The state root after the transaction.
    pub hash: B256,
    /// keccak-256 of the RLP list of the transaction's logs.
    pub logs: B256,
    pub indexes: Indexes,
    pub txbytes: Bytes,
    /// Set when the transaction is invalid: it must be refused and change nothing.
    #[serde(default)]
    pub expect_exception: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Indexes {
    pub data: usize,
    pub gas: usize,
    pub value: usize,
}
