//! Ethereum's GeneralStateTests run through Virga's executor: the `pre` accounts go into
//! the DSM-Tree, each case's signed transaction (`txbytes`) is decoded, its sender
//! recovered and executed with revm over that state, and the state root and logs hash must
//! be the file's. A transaction the file expects to be invalid must be refused and change
//! nothing. Cases of forks before Berlin, or of forks Virga does not know, are skipped with
//! the reason.

mod model;

use std::fmt;
use std::path::{Path, PathBuf};

use alloy_primitives::{B256, U256};

use crate::cached::CachedState;
use crate::db::DecimalHashes;
use crate::executor::{execute_transaction, logs_hash, BlockContext, Fork, FORKS_BEFORE_BERLIN};
use crate::reference::{genesis_state, GenesisAccount};
use crate::transaction::EthTransaction;
pub use model::{Indexes, PostEntry, TestFile, TestUnit};

/// The chain id of every state test.
const STATE_TEST_CHAIN_ID: u64 = 1;

/// A file could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum StateTestError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a GeneralStateTests file: {source}")]
    Format { path: PathBuf, source: serde_json::Error },
}

/// How one case went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// What was expected and what Virga got.
    Fail(String),
    /// Why the case was not run.
    Skip(String),
}

/// One case: a test's post entry for one fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseResult {
    pub test: String,
    pub fork: String,
    pub data: usize,
    pub gas: usize,
    pub value: usize,
    pub verdict: Verdict,
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = format!("{}/{}/d{}g{}v{}", self.test, self.fork, self.data, self.gas, self.value);
        match &self.verdict {
            Verdict::Pass => write!(f, "PASS {id}"),
            Verdict::Fail(why) => write!(f, "FAIL {id}: {why}"),
            Verdict::Skip(why) => write!(f, "SKIP {id}: {why}"),
        }
    }
}

/// Runs every case of the file at `path` (only those of `only`, if given).
pub fn run_file(path: &Path, only: Option<Fork>) -> Result<Vec<CaseResult>, StateTestError> {
    let text = std::fs::read_to_string(path).map_err(|source| StateTestError::Read { path: path.into(), source })?;
    run_json(&text, only).map_err(|source| StateTestError::Format { path: path.into(), source })
}

/// Runs every case of a GeneralStateTests document.
pub fn run_json(text: &str, only: Option<Fork>) -> Result<Vec<CaseResult>, serde_json::Error> {
    let file: TestFile = serde_json::from_str(text)?;
    Ok(file.iter().flat_map(|(name, unit)| run_unit(name, unit, only)).collect())
}

fn run_unit(name: &str, unit: &TestUnit, only: Option<Fork>) -> Vec<CaseResult> {
    let pre = pre_state(unit);
    let mut results = Vec::new();
    for (fork_name, entries) in &unit.post {
        let fork = Fork::from_name(fork_name);
        if only.is_some() && fork != only {
            continue;
        }
        for entry in entries {
            let verdict = match (fork, &pre) {
                (None, _) if FORKS_BEFORE_BERLIN.contains(&fork_name.as_str()) => {
                    Verdict::Skip("a fork before Berlin: Virga executes Berlin and later".into())
                }
                (None, _) => Verdict::Skip("unknown fork".into()),
                (Some(_), Err(why)) => Verdict::Fail(format!("pre state: {why}")),
                (Some(fork), Ok(pre)) => run_case(unit, pre, fork, entry),
            };
            let Indexes { data, gas, value } = entry.indexes;
            results.push(CaseResult { test: name.into(), fork: fork_name.clone(), data, gas, value, verdict });
        }
    }
    results
}

/// The `pre` accounts.
/// A field of the test that does not fit the type Virga gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value} does not fit in 64 bits")]
struct TooWide {
    field: &'static str,
    value: U256,
}

fn pre_state(unit: &TestUnit) -> Result<Vec<GenesisAccount>, TooWide> {
    let accounts = unit.pre.iter().map(|(address, pre)| {
        Ok(GenesisAccount {
            address: *address,
            nonce: to_u64(pre.nonce, "nonce")?,
            balance: pre.balance,
            code: pre.code.clone(),
            storage: pre.storage.iter().map(|(slot, value)| (*slot, *value)).collect(),
        })
    });
    accounts.collect()
}

fn block_context(unit: &TestUnit, fork: Fork) -> Result<BlockContext, TooWide> {
    let env = &unit.env;
    Ok(BlockContext {
        fork,
        chain_id: STATE_TEST_CHAIN_ID,
        number: to_u64(env.current_number, "currentNumber")?,
        timestamp: to_u64(env.current_timestamp, "currentTimestamp")?,
        coinbase: env.current_coinbase,
        gas_limit: to_u64(env.current_gas_limit, "currentGasLimit")?,
        base_fee: to_u64(env.current_base_fee.unwrap_or_default(), "currentBaseFee")?,
        difficulty: env.current_difficulty,
        prev_randao: env.current_random.unwrap_or_default(),
        excess_blob_gas: to_u64(env.current_excess_blob_gas.unwrap_or_default(), "currentExcessBlobGas")?,
    })
}

fn to_u64(value: U256, field: &'static str) -> Result<u64, TooWide> {
    u64::try_from(value).map_err(|_| TooWide { field, value })
}

/// What became of the case's transaction.
enum Ran {
    Executed(B256),
    Refused(String),
}

fn run_case(unit: &TestUnit, pre: &[GenesisAccount], fork: Fork, entry: &PostEntry) -> Verdict {
    let block = match block_context(unit, fork) {
        Ok(block) => block,
        Err(why) => return Verdict::Fail(format!("env: {why}")),
    };
    let mut state = genesis_state(pre);
    let (ran, tx) = match EthTransaction::decode(&entry.txbytes) {
        Err(error) => (Ran::Refused(format!("decoding: {error}")), None),
        Ok(tx) if unit.transaction.sender.is_some_and(|sender| sender != tx.sender()) => {
            return Verdict::Fail(format!(
                "the signature recovers {}, the file names {:?} as the sender",
                tx.sender(),
                unit.transaction.sender
            ));
        }
        Ok(tx) => match execute_transaction(&mut state, &DecimalHashes, &block, &tx) {
            Ok(outcome) => (Ran::Executed(logs_hash(&outcome.logs)), Some(tx)),
            Err(error) if error.is_refusal() => (Ran::Refused(error.to_string()), Some(tx)),
            Err(error) => return Verdict::Fail(error.to_string()),
        },
    };
    let logs = match (ran, &entry.expect_exception) {
        (Ran::Refused(why), None) => return Verdict::Fail(format!("expected execution, got a refusal: {why}")),
        (Ran::Executed(_), Some(expected)) => {
            return Verdict::Fail(format!("expected the refusal {expected}, got execution"));
        }
        (Ran::Executed(logs), None) => logs,
        (Ran::Refused(_), Some(_)) => logs_hash(&[]),
    };
    let root = state.root();
    if root != entry.hash {
        return Verdict::Fail(format!("expected state root {}, got {root}", entry.hash));
    }
    if logs != entry.logs {
        return Verdict::Fail(format!("expected logs hash {}, got {logs}", entry.logs));
    }
    match tx {
        Some(tx) => flat_copy_agrees(pre, &block, &tx, root, logs),
        None => Verdict::Pass,
    }
}

/// The same transaction through the executor's other read path, a flat copy of the state
/// beside the trie ([`CachedState::from_genesis`]): it must leave the same root and logs.
fn flat_copy_agrees(
    pre: &[GenesisAccount],
    block: &BlockContext,
    tx: &EthTransaction,
    root: B256,
    logs: B256,
) -> Verdict {
    let mut flat = CachedState::from_genesis(pre);
    let executed = match flat.execute_block(&DecimalHashes, block, std::slice::from_ref(tx)) {
        Ok(executed) => executed,
        Err(error) => return Verdict::Fail(format!("over the flat copy: {error}")),
    };
    let flat_logs = logs_hash(executed.receipts.first().map_or(&[][..], |receipt| &receipt.logs));
    let flat_root = flat.root();
    if (flat_root, flat_logs) != (root, logs) {
        return Verdict::Fail(format!("over the flat copy: state root {flat_root}, logs hash {flat_logs}"));
    }
    Verdict::Pass
}

/// Totals of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Tally {
    pub fn add(&mut self, result: &CaseResult) {
        match result.verdict {
            Verdict::Pass => self.passed += 1,
            Verdict::Fail(_) => self.failed += 1,
            Verdict::Skip(_) => self.skipped += 1,
        }
    }
}
