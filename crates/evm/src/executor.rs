//! One transaction through revm over Virga's state: the block's context and fork in,
//! the outcome (status, gas, logs) out, the state changed only by a valid transaction.

use alloy_primitives::{keccak256, Address, Bytes, Log, B256, U256};
use revm::context::result::{EVMError, InvalidHeader, InvalidTransaction};
use revm::context::{BlockEnv, CfgEnv};
use revm::primitives::hardfork::SpecId;
use virga_trie::account::StateTrie;

use crate::block::execute_block;
use crate::db::{BlockHashes, StateError};
use crate::transaction::EthTransaction;

/// The Ethereum forks Virga executes, Berlin (access lists, EIP-2929 gas) and later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fork {
    Berlin,
    London,
    Paris,
    Shanghai,
    Cancun,
    Prague,
}

impl Fork {
    pub const ALL: [Fork; 6] = [Fork::Berlin, Fork::London, Fork::Paris, Fork::Shanghai, Fork::Cancun, Fork::Prague];

    /// The fork's name as Ethereum's tests write it; "Merge" is also read as Paris.
    pub fn from_name(name: &str) -> Option<Fork> {
        match name {
            "Merge" => Some(Fork::Paris),
            _ => Fork::ALL.into_iter().find(|fork| fork.name() == name),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fork::Berlin => "Berlin",
            Fork::London => "London",
            Fork::Paris => "Paris",
            Fork::Shanghai => "Shanghai",
            Fork::Cancun => "Cancun",
            Fork::Prague => "Prague",
        }
    }

    pub fn spec(self) -> SpecId {
        match self {
            Fork::Berlin => SpecId::BERLIN,
            Fork::London => SpecId::LONDON,
            Fork::Paris => SpecId::MERGE,
            Fork::Shanghai => SpecId::SHANGHAI,
            Fork::Cancun => SpecId::CANCUN,
            Fork::Prague => SpecId::PRAGUE,
        }
    }
}

/// Forks before Berlin by the names Ethereum's tests give them: refused with that reason
/// rather than as unknown.
pub const FORKS_BEFORE_BERLIN: [&str; 10] = [
    "Frontier",
    "Homestead",
    "EIP150",
    "EIP158",
    "Byzantium",
    "Constantinople",
    "ConstantinopleFix",
    "Petersburg",
    "Istanbul",
    "MuirGlacier",
];

/// What a transaction sees of the block it runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockContext {
    pub fork: Fork,
    pub chain_id: u64,
    pub number: u64,
    pub timestamp: u64,
    pub coinbase: Address,
    pub gas_limit: u64,
    /// EIP-1559's base fee (London on); ignored before.
    pub base_fee: u64,
    /// Before Paris, the block's difficulty.
    pub difficulty: U256,
    /// From Paris on, the beacon chain's randomness (`PREVRANDAO`).
    pub prev_randao: B256,
    /// From Cancun on, the excess blob gas the blob base fee follows from.
    pub excess_blob_gas: u64,
}

impl BlockContext {
    /// revm's configuration for the block: the fork's spec and the chain id.
    pub fn cfg(&self) -> CfgEnv {
        let mut cfg = CfgEnv::new_with_spec(self.fork.spec());
        cfg.chain_id = self.chain_id;
        cfg
    }

    /// revm's block environment (the blob base fee follows `cfg`'s fork).
    pub fn block_env(&self, cfg: &CfgEnv) -> BlockEnv {
        let mut block = BlockEnv {
            number: U256::from(self.number),
            beneficiary: self.coinbase,
            timestamp: U256::from(self.timestamp),
            gas_limit: self.gas_limit,
            basefee: if self.fork >= Fork::London { self.base_fee } else { 0 },
            difficulty: self.difficulty,
            prevrandao: (self.fork >= Fork::Paris).then_some(self.prev_randao),
            ..BlockEnv::default()
        };
        if self.fork >= Fork::Cancun {
            block.set_blob_excess_gas_and_price(self.excess_blob_gas, cfg.blob_base_fee_update_fraction());
        }
        block
    }
}

/// What an executed transaction did (its receipt's content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    /// Whether it succeeded (EIP-658 status 1) or reverted or halted (0).
    pub success: bool,
    pub gas_used: u64,
    pub logs: Vec<Log>,
    /// The call's return data, or the code a creation deployed.
    pub output: Bytes,
}

/// Why a transaction was not executed. An invalid transaction changes nothing and is left
/// out of a block (Ethereum's rule); a state error means the state itself is damaged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("invalid transaction: {0}")]
    Invalid(InvalidTransaction),
    #[error("invalid block context: {0}")]
    Header(InvalidHeader),
    #[error("gas limit {gas_limit} exceeds the {left} gas the block has left")]
    BlockGasExhausted { gas_limit: u64, left: u64 },
    #[error(transparent)]
    State(StateError),
    #[error("execution failed: {0}")]
    Other(String),
}

impl ExecError {
    /// A short snake_case name for counters and answers.
    pub fn name(&self) -> &'static str {
        match self {
            ExecError::Invalid(invalid) => match invalid {
                InvalidTransaction::NonceTooLow { .. } | InvalidTransaction::NonceTooHigh { .. } => "nonce_mismatch",
                InvalidTransaction::LackOfFundForMaxFee { .. } | InvalidTransaction::OverflowPaymentInTransaction => {
                    "insufficient_funds"
                }
                InvalidTransaction::GasPriceLessThanBasefee => "fee_below_base_fee",
                InvalidTransaction::InvalidChainId | InvalidTransaction::MissingChainId => "wrong_chain_id",
                InvalidTransaction::CallGasCostMoreThanGasLimit { .. } => "gas_limit_too_low",
                _ => "invalid_transaction",
            },
            ExecError::Header(_) => "invalid_block_context",
            ExecError::BlockGasExhausted { .. } => "block_gas_exhausted",
            ExecError::State(StateError::NotHeld { .. }) => "missing_witness",
            ExecError::State(_) => "state_unreadable",
            ExecError::Other(_) => "execution_failed",
        }
    }

    /// The transaction is at fault (it is left out of the block), rather than the state.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ExecError::Invalid(_) | ExecError::Header(_) | ExecError::BlockGasExhausted { .. })
    }
}

impl From<EVMError<StateError, InvalidTransaction>> for ExecError {
    fn from(error: EVMError<StateError, InvalidTransaction>) -> Self {
        match error {
            EVMError::Transaction(invalid) => ExecError::Invalid(invalid),
            EVMError::Header(header) => ExecError::Header(header),
            EVMError::Database(state) => ExecError::State(state),
            other => ExecError::Other(other.to_string()),
        }
    }
}

/// Executes `tx` in `block` against `state` and applies its changes: a block of one
/// transaction through Virga's executor. An error leaves `state` unchanged.
pub fn execute_transaction(
    state: &mut StateTrie,
    hashes: &dyn BlockHashes,
    block: &BlockContext,
    tx: &EthTransaction,
) -> Result<TxOutcome, ExecError> {
    let mut executed = execute_block(state, hashes, block, std::slice::from_ref(tx)).map_err(ExecError::State)?;
    if let Some(refused) = executed.refused.pop() {
        return Err(refused.reason);
    }
    let (Some(receipt), Some(output)) = (executed.receipts.pop(), executed.outputs.pop()) else {
        return Err(ExecError::Other("the block executed no transaction".into()));
    };
    Ok(TxOutcome { success: receipt.success, gas_used: receipt.gas_used, logs: receipt.logs, output })
}

/// keccak-256 of the RLP list of logs: what Ethereum's state tests check of a
/// transaction's logs.
pub fn logs_hash(logs: &[Log]) -> B256 {
    let mut out = Vec::with_capacity(alloy_rlp::list_length(logs));
    alloy_rlp::encode_list(logs, &mut out);
    keccak256(&out)
}
