//! Reading geth-style `genesis.json` files.
//!
//! The accounts of `alloc` are read by alloy-genesis ([`GenesisAccount`]), the header fields
//! with alloy's serde helpers. Where alloy reads a value more leniently than go-ethereum, a
//! check here refuses it first, so Virga never computes a state root for a file geth would
//! refuse:
//!
//! - `balance` and `nonce` given as strings must be decimal digits or `0x`/`0X` followed by hex
//!   digits (`""` is zero); alloy would also take `_` separators, `0b`/`0o` prefixes and a bare
//!   `0x`. JSON numbers are taken up to 64 bits; a larger one is refused, never rounded.
//! - `code` must carry its `0x` prefix (or be `""`); alloy would take bare hex.
//! - A document without an `alloc` object is refused (alloy would read it as empty).
//!
//! What alloy itself enforces: an account is an object with a `balance` and no field besides
//! `balance`, `nonce`, `code`, `storage` and `secretKey` (names match exactly); storage keys and
//! values are hex of at most 32 bytes with an even number of digits, left-padded (`"0x01"` is
//! slot 1). Keys of `alloc` are 40 hex digits with or without `0x`. When one address, or one
//! field of an account, appears twice, the later one wins, as in go-ethereum.
//!
//! The state root depends on `alloc` only: [`Genesis::alloc_from_file`] reads nothing else, so a
//! header field that geth tooling writes oddly (`"timestamp": "0x"` in the Ethereum test suite)
//! cannot stop it. [`Genesis::from_file`] reads the header fields too, for building a chain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use alloy_primitives::{hex, Address, Bytes, B256, U256};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

pub use alloy_genesis::GenesisAccount;

/// The initial accounts of a genesis, by address.
pub type Alloc = BTreeMap<Address, GenesisAccount>;

/// A parsed geth-style genesis: the initial accounts plus the genesis header fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Genesis {
    /// The `config` object as written in the file; `None` if absent.
    pub config: Option<String>,
    pub nonce: u64,
    pub timestamp: u64,
    pub extra_data: Vec<u8>,
    pub gas_limit: u64,
    pub difficulty: U256,
    pub mix_hash: B256,
    pub coinbase: Address,
    pub number: u64,
    pub gas_used: u64,
    pub parent_hash: B256,
    pub base_fee_per_gas: Option<U256>,
    pub excess_blob_gas: Option<u64>,
    pub blob_gas_used: Option<u64>,
    /// The initial accounts.
    pub alloc: Alloc,
}

/// Why a genesis could not be read. The `Display` text is the whole message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenesisError {
    /// The file could not be read.
    #[error("cannot read genesis file {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    /// The file was read but its content is wrong; `error` says how.
    #[error("genesis file {}: {error}", path.display())]
    InFile { path: PathBuf, error: Box<GenesisError> },
    /// The bytes are not UTF-8 text.
    #[error("not UTF-8 text (bad byte at offset {offset})")]
    NotUtf8 { offset: usize },
    /// The text is not JSON, or `alloc` is not an object of address keys; the message gives
    /// line and column.
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    /// The document has no `alloc` object.
    #[error("no \"alloc\" object at the top level: not a geth-style genesis file")]
    MissingAlloc,
    /// One account of `alloc` is malformed.
    #[error("account {}: {problem}", hex::encode_prefixed(account))]
    Account { account: Address, problem: AccountProblem },
    /// A genesis header field is malformed; the message gives line and column.
    #[error("genesis header: {0}")]
    Header(serde_json::Error),
}

/// What is wrong with one account of `alloc`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountProblem {
    /// go-ethereum reads `balance` and `nonce` as decimal or `0x` hex only.
    #[error("{field} {text} is not a decimal or 0x-hex number")]
    NotANumber { field: &'static str, text: String },
    #[error("code {0} is missing the 0x prefix")]
    CodeWithoutPrefix(String),
    /// The account does not deserialize (the message, clipped, says where).
    #[error("{0}")]
    Malformed(String),
}

/// The part of a document the state root depends on.
#[derive(Deserialize)]
struct AllocDocument {
    #[serde(default)]
    alloc: Option<BTreeMap<Address, Value>>,
}

/// The header fields of a document; `null` counts as absent.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeaderFields {
    #[serde(default)]
    config: Option<Box<RawValue>>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    nonce: Option<u64>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    timestamp: Option<u64>,
    #[serde(default)]
    extra_data: Option<Bytes>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    gas_limit: Option<u64>,
    #[serde(default)]
    difficulty: Option<U256>,
    #[serde(default, alias = "mixhash")]
    mix_hash: Option<B256>,
    #[serde(default)]
    coinbase: Option<Address>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    number: Option<u64>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    gas_used: Option<u64>,
    #[serde(default)]
    parent_hash: Option<B256>,
    #[serde(default)]
    base_fee_per_gas: Option<U256>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    excess_blob_gas: Option<u64>,
    #[serde(default, with = "alloy_serde::quantity::opt")]
    blob_gas_used: Option<u64>,
}

impl Genesis {
    /// Parses the text of a geth-style `genesis.json`: `alloc` and the header fields.
    pub fn from_json_str(text: &str) -> Result<Genesis, GenesisError> {
        let alloc = Genesis::alloc_from_json_str(text)?;
        let header: HeaderFields = serde_json::from_str(text).map_err(GenesisError::Header)?;
        let config = match header.config {
            Some(raw) if !raw.get().starts_with('{') => {
                return Err(GenesisError::Header(serde::de::Error::custom(format!(
                    "config must be a JSON object, found {}",
                    quote(raw.get())
                ))))
            }
            raw => raw.map(|raw| raw.get().to_owned()),
        };
        Ok(Genesis {
            config,
            nonce: header.nonce.unwrap_or_default(),
            timestamp: header.timestamp.unwrap_or_default(),
            extra_data: header.extra_data.unwrap_or_default().to_vec(),
            gas_limit: header.gas_limit.unwrap_or_default(),
            difficulty: header.difficulty.unwrap_or_default(),
            mix_hash: header.mix_hash.unwrap_or_default(),
            coinbase: header.coinbase.unwrap_or_default(),
            number: header.number.unwrap_or_default(),
            gas_used: header.gas_used.unwrap_or_default(),
            parent_hash: header.parent_hash.unwrap_or_default(),
            base_fee_per_gas: header.base_fee_per_gas,
            excess_blob_gas: header.excess_blob_gas,
            blob_gas_used: header.blob_gas_used,
            alloc,
        })
    }

    /// Reads and parses a geth-style `genesis.json`; errors name the file.
    pub fn from_file(path: &Path) -> Result<Genesis, GenesisError> {
        in_file(path, Genesis::from_json_str)
    }

    /// Parses only the `alloc` of a genesis document: the header fields are not looked at.
    pub fn alloc_from_json_str(text: &str) -> Result<Alloc, GenesisError> {
        let document: AllocDocument = serde_json::from_str(text).map_err(GenesisError::Json)?;
        let entries = document.alloc.ok_or(GenesisError::MissingAlloc)?;
        let mut alloc = Alloc::new();
        for (address, account) in entries {
            let problem = |problem: AccountProblem| GenesisError::Account { account: address, problem };
            check_geth_forms(&account).map_err(problem)?;
            let account = GenesisAccount::deserialize(account)
                .map_err(|e| problem(AccountProblem::Malformed(clip(&e.to_string()))))?;
            alloc.insert(address, account);
        }
        Ok(alloc)
    }

    /// Reads only the `alloc` of a genesis file; errors name the file.
    pub fn alloc_from_file(path: &Path) -> Result<Alloc, GenesisError> {
        in_file(path, Genesis::alloc_from_json_str)
    }
}

fn in_file<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T, GenesisError>) -> Result<T, GenesisError> {
    let bytes = std::fs::read(path).map_err(|error| GenesisError::Read { path: path.to_owned(), error })?;
    let parsed = match std::str::from_utf8(&bytes) {
        Ok(text) => parse(text),
        Err(e) => Err(GenesisError::NotUtf8 { offset: e.valid_up_to() }),
    };
    parsed.map_err(|error| GenesisError::InFile { path: path.to_owned(), error: Box::new(error) })
}

/// Refuses the forms alloy-genesis would read but go-ethereum refuses (see the module docs).
fn check_geth_forms(account: &Value) -> Result<(), AccountProblem> {
    let Value::Object(fields) = account else { return Ok(()) };
    for field in ["balance", "nonce"] {
        if let Some(Value::String(text)) = fields.get(field) {
            if !is_geth_number(text) {
                return Err(AccountProblem::NotANumber { field, text: quote(text) });
            }
        }
    }
    if let Some(Value::String(code)) = fields.get("code") {
        if !code.is_empty() && !code.starts_with("0x") && !code.starts_with("0X") {
            return Err(AccountProblem::CodeWithoutPrefix(quote(code)));
        }
    }
    Ok(())
}

/// Decimal digits, `0x`/`0X` and at least one hex digit, or `""` (zero).
fn is_geth_number(text: &str) -> bool {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(digits) => !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit()),
        None => text.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Longest excerpt of a value shown in a message, in characters.
const SHOWN: usize = 100;

/// `text` in double quotes with escapes, cut short if long.
fn quote(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// `text` as is, cut short if long (serde's messages repeat the whole offending value).
fn clip(text: &str) -> String {
    match text.char_indices().nth(2 * SHOWN) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests;
