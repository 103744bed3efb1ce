//! Reading geth-style `genesis.json` files.
//!
//! [`Genesis::from_json_str`] and [`Genesis::from_file`] accept what go-ethereum's genesis
//! decoder accepts (with the few deliberate differences listed at the end) and turn it into
//! plain typed values. Errors say what is wrong and where: which account, which field, which
//! storage slot, and for [`Genesis::from_file`] which file.
//!
//! # Accepted forms
//!
//! - `balance`, `difficulty`, `baseFeePerGas`: a JSON string holding a decimal (`"1000"`) or
//!   `0x`/`0X`-prefixed hexadecimal (`"0x3e8"`) number, or a JSON number (`1000`, kept digit
//!   for digit however large); at most 256 bits. `""` is zero, leading zeros are fine.
//! - `nonce`, `timestamp`, `gasLimit`, `gasUsed`, `number`, `excessBlobGas`, `blobGasUsed`:
//!   the same forms, at most 64 bits.
//! - Keys of `alloc`: 40 hex digits, with or without a `0x`/`0X` prefix, any letter case.
//! - `code`, `extraData`: `0x`-prefixed hex with an even number of digits; `""` is empty.
//! - Storage keys and values: at most 64 hex digits, an even number of them, with an optional
//!   lower-case `0x`; shorter ones are left-padded to 32 bytes, so `"0x01"` is slot 1 and
//!   `""`/`"0x"` is zero. Zero values are kept here; the state root leaves them out.
//! - `mixHash`, `parentHash`, `coinbase`: `0x` followed by exactly 64 or 40 hex digits.
//! - `config` is kept as JSON text (numbers digit for digit) and not interpreted.
//! - Field names match regardless of ASCII letter case, as Go's `encoding/json` does; unknown
//!   fields are ignored; `null` counts as absent; when a key appears twice (also two spellings
//!   of one address or slot, such as `"0x01"` and `"0x0001"`) the later one wins.
//!
//! # Differences from go-ethereum
//!
//! - A missing `balance` is zero (go-ethereum requires the field).
//! - A negative 256-bit number (`"-1"`) is rejected; go-ethereum's big-integer parser takes
//!   it and fails later. A sign on a zero (`"-0"`) or a `+` is accepted, as there.
//! - Unknown account fields such as `secretKey` are ignored without being checked.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use alloy_primitives::{hex, Address, B256, U256};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// A parsed geth-style genesis: the initial accounts plus the genesis header fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Genesis {
    /// The `config` object as compact JSON text, numbers as written; `None` if absent.
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
    pub alloc: BTreeMap<Address, GenesisAccount>,
}

/// One account of a genesis `alloc`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenesisAccount {
    pub balance: U256,
    pub nonce: u64,
    pub code: Vec<u8>,
    /// Slot → value, both as 32-byte words (short hex left-padded). May hold zero values.
    pub storage: BTreeMap<B256, B256>,
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
    /// The text is not JSON; the message gives line and column.
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    /// A value that must be a JSON object is something else.
    #[error("{what} must be a JSON object, found {found}")]
    NotAnObject { what: String, found: &'static str },
    /// The document has no `alloc` object.
    #[error("no \"alloc\" object at the top level: not a geth-style genesis file")]
    MissingAlloc,
    /// A key of `alloc` is not an address.
    #[error("alloc key {} is not an address: {reason}", quote(key))]
    BadAddress { key: String, reason: String },
    /// A field of one account is malformed.
    #[error("account {}: {field} {problem}", hex::encode_prefixed(account))]
    Account { account: Address, field: String, problem: String },
    /// A genesis header field (`field` as spelled in the file) is malformed.
    #[error("genesis {field} {problem}")]
    Header { field: String, problem: String },
}

impl Genesis {
    /// Parses the text of a geth-style `genesis.json`.
    pub fn from_json_str(text: &str) -> Result<Genesis, GenesisError> {
        Genesis::from_tree(parse_json(text)?)
    }

    /// Reads and parses a geth-style `genesis.json`; errors name the file.
    pub fn from_file(path: &Path) -> Result<Genesis, GenesisError> {
        let bytes = std::fs::read(path).map_err(|error| GenesisError::Read { path: path.to_owned(), error })?;
        let parsed = match std::str::from_utf8(&bytes) {
            Ok(text) => Genesis::from_json_str(text),
            Err(e) => Err(GenesisError::NotUtf8 { offset: e.valid_up_to() }),
        };
        parsed.map_err(|error| GenesisError::InFile { path: path.to_owned(), error: Box::new(error) })
    }

    fn from_tree(root: Json) -> Result<Genesis, GenesisError> {
        let Json::Object(fields) = root else {
            return Err(GenesisError::NotAnObject { what: "the genesis document".to_owned(), found: root.kind() });
        };
        let mut genesis = Genesis::default();
        let mut alloc = None;
        for (key, value) in fields {
            let header = |problem: String| GenesisError::Header { field: key.clone(), problem };
            match key.to_ascii_lowercase().as_str() {
                "alloc" => alloc = if value.is_null() { None } else { Some(parse_alloc(value)?) },
                "config" => {
                    genesis.config = match value {
                        Json::Null => None,
                        Json::Object(_) => Some(value.to_text()),
                        other => return Err(header(format!("must be a JSON object, found {}", other.kind()))),
                    }
                }
                "nonce" => genesis.nonce = parse_u64(&value).map_err(header)?,
                "timestamp" => genesis.timestamp = parse_u64(&value).map_err(header)?,
                "extradata" => genesis.extra_data = parse_bytes(&value).map_err(header)?,
                "gaslimit" => genesis.gas_limit = parse_u64(&value).map_err(header)?,
                "difficulty" => genesis.difficulty = parse_u256(&value).map_err(header)?,
                "mixhash" => genesis.mix_hash = B256::from(parse_fixed::<32>(&value).map_err(header)?),
                "coinbase" => genesis.coinbase = Address::from(parse_fixed::<20>(&value).map_err(header)?),
                "number" => genesis.number = parse_u64(&value).map_err(header)?,
                "gasused" => genesis.gas_used = parse_u64(&value).map_err(header)?,
                "parenthash" => genesis.parent_hash = B256::from(parse_fixed::<32>(&value).map_err(header)?),
                "basefeepergas" => {
                    genesis.base_fee_per_gas =
                        if value.is_null() { None } else { Some(parse_u256(&value).map_err(header)?) }
                }
                "excessblobgas" => {
                    genesis.excess_blob_gas =
                        if value.is_null() { None } else { Some(parse_u64(&value).map_err(header)?) }
                }
                "blobgasused" => {
                    genesis.blob_gas_used =
                        if value.is_null() { None } else { Some(parse_u64(&value).map_err(header)?) }
                }
                _ => {}
            }
        }
        genesis.alloc = alloc.ok_or(GenesisError::MissingAlloc)?;
        Ok(genesis)
    }
}

fn parse_alloc(value: Json) -> Result<BTreeMap<Address, GenesisAccount>, GenesisError> {
    let Json::Object(entries) = value else {
        return Err(GenesisError::NotAnObject { what: "\"alloc\"".to_owned(), found: value.kind() });
    };
    let mut alloc = BTreeMap::new();
    for (key, account) in entries {
        let address = parse_address(&key)?;
        alloc.insert(address, parse_account(address, account)?);
    }
    Ok(alloc)
}

fn parse_address(key: &str) -> Result<Address, GenesisError> {
    let bad = |reason: String| GenesisError::BadAddress { key: key.to_owned(), reason };
    let digits = strip_0x(key).unwrap_or(key);
    if let Some((_, c)) = first_non_hex(digits) {
        return Err(bad(format!("it has the non-hex character {c:?}")));
    }
    if digits.len() != 40 {
        return Err(bad(format!("it has {} hex digits, want 40", digits.len())));
    }
    let mut out = [0u8; 20];
    hex::decode_to_slice(digits, &mut out).map_err(|e| bad(e.to_string()))?;
    Ok(Address::from(out))
}

fn parse_account(address: Address, value: Json) -> Result<GenesisAccount, GenesisError> {
    let Json::Object(fields) = value else {
        return Err(GenesisError::NotAnObject {
            what: format!("account {}", hex::encode_prefixed(address)),
            found: value.kind(),
        });
    };
    let fault =
        |field: &str, problem: String| GenesisError::Account { account: address, field: field.to_owned(), problem };
    let mut account = GenesisAccount::default();
    for (key, value) in fields {
        match key.to_ascii_lowercase().as_str() {
            "balance" => account.balance = parse_u256(&value).map_err(|p| fault("balance", p))?,
            "nonce" => account.nonce = parse_u64(&value).map_err(|p| fault("nonce", p))?,
            "code" => account.code = parse_bytes(&value).map_err(|p| fault("code", p))?,
            "storage" => {
                account.storage = match value {
                    Json::Null => BTreeMap::new(),
                    Json::Object(slots) => {
                        let mut storage = BTreeMap::new();
                        for (slot, word) in slots {
                            let key = parse_word(&slot)
                                .map_err(|reason| fault("storage key", format!("{} {reason}", quote(&slot))))?;
                            let field = || format!("storage[{}]", quote(&slot));
                            let word = match &word {
                                Json::Null => B256::ZERO,
                                Json::String(s) => {
                                    parse_word(s).map_err(|reason| fault(&field(), format!("{} {reason}", quote(s))))?
                                }
                                other => {
                                    return Err(fault(
                                        &field(),
                                        format!("must be a hex string, found {}", other.kind()),
                                    ))
                                }
                            };
                            storage.insert(key, word);
                        }
                        storage
                    }
                    other => return Err(fault("storage", format!("must be a JSON object, found {}", other.kind()))),
                }
            }
            _ => {}
        }
    }
    Ok(account)
}

/// Why a number was refused.
enum NumberFault {
    Syntax,
    Negative,
    TooBig,
}

/// Parses decimal or `0x`/`0X` hex (`""` is zero). `signed` admits one `+`/`-` after the prefix,
/// as Go's big-integer parser does; a minus on a non-zero value is still refused.
fn parse_quantity(text: &str, signed: bool) -> Result<U256, NumberFault> {
    if text.is_empty() {
        return Ok(U256::ZERO);
    }
    let (mut digits, radix) = match strip_0x(text) {
        Some(rest) => (rest, 16u32),
        None => (text, 10u32),
    };
    let mut negative = false;
    if signed {
        if let Some(rest) = digits.strip_prefix('+') {
            digits = rest;
        } else if let Some(rest) = digits.strip_prefix('-') {
            digits = rest;
            negative = true;
        }
    }
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(NumberFault::Syntax);
    }
    let mut value = U256::ZERO;
    let base = U256::from(radix);
    for c in digits.chars() {
        let digit = U256::from(c.to_digit(radix).unwrap_or(0));
        value = value.checked_mul(base).and_then(|v| v.checked_add(digit)).ok_or(NumberFault::TooBig)?;
    }
    if negative && !value.is_zero() {
        return Err(NumberFault::Negative);
    }
    Ok(value)
}

/// The text of a number field and how to show it in a message.
fn number_text(value: &Json) -> Result<Option<(&str, String)>, String> {
    match value {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some((s, quote(s)))),
        Json::Number(s) => Ok(Some((s, clip(s)))),
        other => Err(format!("must be a string or a number, found {}", other.kind())),
    }
}

fn number_problem(shown: &str, fault: NumberFault, bits: u32) -> String {
    match fault {
        NumberFault::Syntax => format!("{shown} is not a decimal or 0x-hex number"),
        NumberFault::Negative => format!("{shown} is negative"),
        NumberFault::TooBig => format!("{shown} does not fit in {bits} bits"),
    }
}

fn parse_u256(value: &Json) -> Result<U256, String> {
    let Some((text, shown)) = number_text(value)? else { return Ok(U256::ZERO) };
    parse_quantity(text, true).map_err(|fault| number_problem(&shown, fault, 256))
}

fn parse_u64(value: &Json) -> Result<u64, String> {
    let Some((text, shown)) = number_text(value)? else { return Ok(0) };
    let wide = parse_quantity(text, false).map_err(|fault| number_problem(&shown, fault, 64))?;
    u64::try_from(wide).map_err(|_| number_problem(&shown, NumberFault::TooBig, 64))
}

/// `0x`-prefixed hex of even length, or `""` (go-ethereum's `hexutil.Bytes`).
fn parse_bytes(value: &Json) -> Result<Vec<u8>, String> {
    let text = match value {
        Json::Null => return Ok(Vec::new()),
        Json::String(s) => s,
        other => return Err(format!("must be a hex string, found {}", other.kind())),
    };
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Some(digits) = strip_0x(text) else {
        return Err(format!("{} is missing the 0x prefix", quote(text)));
    };
    if let Some((at, c)) = first_non_hex(digits) {
        return Err(format!("has the non-hex character {c:?} at offset {}", at + 2));
    }
    if digits.len() % 2 == 1 {
        return Err(format!("has an odd number of hex digits ({})", digits.len()));
    }
    hex::decode(digits).map_err(|e| e.to_string())
}

/// `0x` followed by exactly `2 * N` hex digits (go-ethereum's fixed-size hex types).
fn parse_fixed<const N: usize>(value: &Json) -> Result<[u8; N], String> {
    let text = match value {
        Json::Null => return Ok([0; N]),
        Json::String(s) => s,
        other => return Err(format!("must be a hex string, found {}", other.kind())),
    };
    let Some(digits) = strip_0x(text) else {
        return Err(format!("{} is missing the 0x prefix", quote(text)));
    };
    if first_non_hex(digits).is_some() {
        return Err(format!("{} is not hex", quote(text)));
    }
    if digits.len() != 2 * N {
        return Err(format!("{} has {} hex digits, want {}", quote(text), digits.len(), 2 * N));
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(digits, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// A storage key or value: optional lower-case `0x`, at most 64 hex digits, an even number of
/// them, left-padded to 32 bytes (go-ethereum's `storageJSON`). Returns the reason on failure.
fn parse_word(text: &str) -> Result<B256, &'static str> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if digits.len() > 64 {
        return Err("is longer than 32 bytes (64 hex digits)");
    }
    if first_non_hex(digits).is_some() {
        return Err("is not hex");
    }
    if digits.len() % 2 == 1 {
        return Err("has an odd number of hex digits");
    }
    let mut word = [0u8; 32];
    hex::decode_to_slice(digits, &mut word[32 - digits.len() / 2..]).map_err(|_| "is not hex")?;
    Ok(B256::from(word))
}

fn strip_0x(text: &str) -> Option<&str> {
    text.strip_prefix("0x").or_else(|| text.strip_prefix("0X"))
}

fn first_non_hex(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|(_, c)| !c.is_ascii_hexdigit())
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

/// `text` as is, cut short if long.
fn clip(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// A JSON document as written: objects keep their key order and duplicate keys, numbers keep
/// their literal text (so integers of any size stay exact).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// Compact JSON text of the value.
    fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_text(&mut out);
        out
    }

    fn write_text(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => out.push_str(&serde_json::Value::String(s.clone()).to_string()),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_text(out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    value.write_text(out);
                }
                out.push('}');
            }
        }
    }
}

/// Parses `text` with serde_json (strict syntax, nesting limit, line/column errors) into a
/// [`Json`] tree. serde_json hands numbers over as `u64`/`i64`/`f64`, which would round big
/// integers, so the literal texts are taken from a scan of `text` instead: serde_json visits
/// every value in document order, so the n-th number visited is the n-th literal in the text.
fn parse_json(text: &str) -> Result<Json, GenesisError> {
    let numbers = NumberLiterals::scan(text);
    let mut de = serde_json::Deserializer::from_str(text);
    let tree = JsonSeed { numbers: &numbers }.deserialize(&mut de).map_err(GenesisError::Json)?;
    de.end().map_err(GenesisError::Json)?;
    if numbers.next.get() != numbers.literals.len() {
        return Err(GenesisError::Json(de::Error::custom("internal error: number literals out of step")));
    }
    Ok(tree)
}

/// The number literals of a JSON text, in order, and how many have been handed out.
struct NumberLiterals<'t> {
    literals: Vec<&'t str>,
    next: Cell<usize>,
}

impl<'t> NumberLiterals<'t> {
    /// Collects the number literals outside strings. Exact for valid JSON, which is all that
    /// reaches [`NumberLiterals::take`]: serde_json rejects anything else first.
    fn scan(text: &'t str) -> Self {
        let bytes = text.as_bytes();
        let mut literals = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'"' {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    while i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                        i += 1;
                    }
                    literals.push(&text[start..i]);
                }
                _ => i += 1,
            }
        }
        NumberLiterals { literals, next: Cell::new(0) }
    }

    fn take<E: de::Error>(&self) -> Result<Json, E> {
        let i = self.next.get();
        let literal = self.literals.get(i).ok_or_else(|| E::custom("internal error: number literals out of step"))?;
        self.next.set(i + 1);
        Ok(Json::Number((*literal).to_owned()))
    }
}

#[derive(Clone, Copy)]
struct JsonSeed<'a, 't> {
    numbers: &'a NumberLiterals<'t>,
}

impl<'de> DeserializeSeed<'de> for JsonSeed<'_, '_> {
    type Value = Json;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonSeed<'_, '_> {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Json, E> {
        self.numbers.take()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Json, E> {
        self.numbers.take()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Json, E> {
        self.numbers.take()
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A1: &str = "0x00000000000000000000000000000000000000a1";

    fn addr(s: &str) -> Address {
        s.parse().expect("test address")
    }

    fn word(n: u64) -> B256 {
        B256::from(U256::from(n))
    }

    /// Parses a document holding one account `A1` with the given JSON body.
    fn account(body: &str) -> Result<GenesisAccount, GenesisError> {
        let g = Genesis::from_json_str(&format!(r#"{{"alloc": {{"{A1}": {body}}}}}"#))?;
        Ok(g.alloc[&addr(A1)].clone())
    }

    /// The message of the error from parsing `text`.
    fn error(text: &str) -> String {
        match Genesis::from_json_str(text) {
            Ok(g) => panic!("expected an error, parsed {g:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn account_error(body: &str) -> String {
        error(&format!(r#"{{"alloc": {{"{A1}": {body}}}}}"#))
    }

    #[test]
    fn balances_decimal_hex_and_json_numbers_agree() {
        for body in [
            r#"{"balance": "1000"}"#,
            r#"{"balance": "0x3e8"}"#,
            r#"{"balance": "0X3E8"}"#,
            r#"{"balance": "0x00003e8"}"#,
            r#"{"balance": "0001000"}"#,
            r#"{"balance": 1000}"#,
            r#"{"balance": "+1000"}"#,
        ] {
            assert_eq!(account(body).unwrap().balance, U256::from(1000), "{body}");
        }
        assert_eq!(account(r#"{"balance": ""}"#).unwrap().balance, U256::ZERO);
        assert_eq!(account(r#"{"balance": "-0"}"#).unwrap().balance, U256::ZERO);
    }

    #[test]
    fn large_balances_are_exact() {
        // 10^24 as a JSON number: beyond u64 and f64 precision, must still be exact.
        let e24 = U256::from(10u64).pow(U256::from(24));
        assert_eq!(account(r#"{"balance": 1000000000000000000000000}"#).unwrap().balance, e24);
        assert_eq!(account(r#"{"balance": "1000000000000000000000000"}"#).unwrap().balance, e24);
        assert_eq!(account(r#"{"balance": "0xD3C21BCECCEDA1000000"}"#).unwrap().balance, e24);
        let max_dec = U256::MAX.to_string();
        assert_eq!(account(&format!(r#"{{"balance": "{max_dec}"}}"#)).unwrap().balance, U256::MAX);
        assert_eq!(account(&format!(r#"{{"balance": {max_dec}}}"#)).unwrap().balance, U256::MAX);
        let max_hex = format!("0x{}", "f".repeat(64));
        assert_eq!(account(&format!(r#"{{"balance": "{max_hex}"}}"#)).unwrap().balance, U256::MAX);
        // Leading zeros do not count against the 256 bits.
        let padded = format!("0x{}1", "0".repeat(100));
        assert_eq!(account(&format!(r#"{{"balance": "{padded}"}}"#)).unwrap().balance, U256::from(1));
    }

    #[test]
    fn nonces() {
        assert_eq!(account(r#"{"nonce": "0x10"}"#).unwrap().nonce, 16);
        assert_eq!(account(r#"{"nonce": "16"}"#).unwrap().nonce, 16);
        assert_eq!(account(r#"{"nonce": 16}"#).unwrap().nonce, 16);
        assert_eq!(account(r#"{"nonce": ""}"#).unwrap().nonce, 0);
        assert_eq!(account(r#"{"nonce": "18446744073709551615"}"#).unwrap().nonce, u64::MAX);
        assert_eq!(account(r#"{"nonce": "0xffffffffffffffff"}"#).unwrap().nonce, u64::MAX);
    }

    #[test]
    fn addresses_with_and_without_prefix() {
        let text = r#"{"alloc": {
            "00000000000000000000000000000000000000b1": {"balance": "1"},
            "0x00000000000000000000000000000000000000B2": {"balance": "2"},
            "0X00000000000000000000000000000000000000b3": {"balance": "3"},
            "0xa94f5374Fce5edBC8E2a8697C15331677e6EbF0B": {"balance": "4"}
        }}"#;
        let g = Genesis::from_json_str(text).unwrap();
        assert_eq!(g.alloc.len(), 4);
        assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000b1")].balance, U256::from(1));
        assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000b2")].balance, U256::from(2));
        assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000b3")].balance, U256::from(3));
        assert_eq!(g.alloc[&addr("0xa94f5374fce5edbc8e2a8697c15331677e6ebf0b")].balance, U256::from(4));
    }

    #[test]
    fn later_duplicates_win() {
        let text = r#"{"alloc": {
            "0x00000000000000000000000000000000000000b1": {"balance": "1", "storage": {"0x01": "0x05", "0x0001": "0x06"}},
            "00000000000000000000000000000000000000B1": {"balance": "2", "Balance": "3", "storage": {"0x0001": "0x07", "01": "0x08"}}
        }}"#;
        let g = Genesis::from_json_str(text).unwrap();
        let a = &g.alloc[&addr("0x00000000000000000000000000000000000000b1")];
        assert_eq!(a.balance, U256::from(3));
        assert_eq!(a.storage.len(), 1);
        assert_eq!(a.storage[&word(1)], word(8));
    }

    #[test]
    fn short_storage_keys_and_values_are_left_padded() {
        let a = account(
            r#"{"storage": {
                "0x01": "0x01",
                "02": "0xff00",
                "0x": "0x02",
                "0x0000000000000000000000000000000000000000000000000000000000000003": "",
                "0x04": "0x000000000000000000000000000000000000000000000000000000000000000a",
                "0x05": null,
                "0x1000000000000000000000000000000000000000000000000000000000000006": "0xabcdef"
            }}"#,
        )
        .unwrap();
        assert_eq!(a.storage.len(), 7);
        assert_eq!(a.storage[&word(1)], word(1));
        assert_eq!(a.storage[&word(2)], word(0xff00));
        assert_eq!(a.storage[&word(0)], word(2));
        assert_eq!(a.storage[&word(3)], B256::ZERO);
        assert_eq!(a.storage[&word(4)], word(10));
        assert_eq!(a.storage[&word(5)], B256::ZERO);
        let high: B256 = "0x1000000000000000000000000000000000000000000000000000000000000006".parse().unwrap();
        assert_eq!(a.storage[&high], word(0xabcdef));
    }

    #[test]
    fn code() {
        assert_eq!(account(r#"{"code": "0x6001600155"}"#).unwrap().code, vec![0x60, 1, 0x60, 1, 0x55]);
        assert_eq!(account(r#"{"code": "0XAbCd"}"#).unwrap().code, vec![0xab, 0xcd]);
        assert!(account(r#"{"code": "0x"}"#).unwrap().code.is_empty());
        assert!(account(r#"{"code": ""}"#).unwrap().code.is_empty());
    }

    #[test]
    fn missing_and_null_fields_default() {
        assert_eq!(account("{}").unwrap(), GenesisAccount::default());
        let nulls = r#"{"balance": null, "nonce": null, "code": null, "storage": null, "secretKey": "0x1234"}"#;
        assert_eq!(account(nulls).unwrap(), GenesisAccount::default());
        let g = Genesis::from_json_str(r#"{"alloc": {}}"#).unwrap();
        assert_eq!(g, Genesis::default());
        let g = Genesis::from_json_str(r#"{"alloc": {}, "config": null, "baseFeePerGas": null}"#).unwrap();
        assert_eq!(g, Genesis::default());
    }

    #[test]
    fn header_fields() {
        let text = r#"{
            "config": {"chainId": 1, "terminalTotalDifficulty": 58750000000000000000000, "ethash": {}, "x": [1.5, -2e3, "a\"b"]},
            "nonce": "0x42", "timestamp": "1695902100", "extraData": "0x1234", "gasLimit": 5000,
            "difficulty": "0x400000000", "mixhash": "0x0000000000000000000000000000000000000000000000000000000000000001",
            "coinbase": "0x0000000000000000000000000000000000000002", "number": "0x0", "gasUsed": "0",
            "parentHash": "0x0000000000000000000000000000000000000000000000000000000000000003",
            "baseFeePerGas": "1000000000", "excessBlobGas": "0x0", "blobGasUsed": 0,
            "stateRoot": "ignored", "alloc": {"0x00000000000000000000000000000000000000a1": {"balance": 77}}
        }"#;
        let g = Genesis::from_json_str(text).unwrap();
        assert_eq!(
            g.config.as_deref(),
            Some(
                r#"{"chainId":1,"terminalTotalDifficulty":58750000000000000000000,"ethash":{},"x":[1.5,-2e3,"a\"b"]}"#
            )
        );
        assert_eq!(g.nonce, 0x42);
        assert_eq!(g.timestamp, 1695902100);
        assert_eq!(g.extra_data, vec![0x12, 0x34]);
        assert_eq!(g.gas_limit, 5000);
        assert_eq!(g.difficulty, U256::from(0x400000000u64));
        assert_eq!(g.mix_hash, word(1));
        assert_eq!(g.coinbase, addr("0x0000000000000000000000000000000000000002"));
        assert_eq!(g.parent_hash, word(3));
        assert_eq!(g.base_fee_per_gas, Some(U256::from(1_000_000_000u64)));
        assert_eq!(g.excess_blob_gas, Some(0));
        assert_eq!(g.blob_gas_used, Some(0));
        // The number literals inside `config` must not shift the one used for the balance.
        assert_eq!(g.alloc[&addr(A1)].balance, U256::from(77));
    }

    #[test]
    fn malformed_numbers() {
        let a = "account 0x00000000000000000000000000000000000000a1";
        let cases = [
            (r#"{"balance": "12x"}"#, format!(r#"{a}: balance "12x" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": "0x"}"#, format!(r#"{a}: balance "0x" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": "0xfg"}"#, format!(r#"{a}: balance "0xfg" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": " 1"}"#, format!(r#"{a}: balance " 1" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": "1_000"}"#, format!(r#"{a}: balance "1_000" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": 1.5}"#, format!("{a}: balance 1.5 is not a decimal or 0x-hex number")),
            (r#"{"balance": 1e18}"#, format!("{a}: balance 1e18 is not a decimal or 0x-hex number")),
            (r#"{"balance": -5}"#, format!("{a}: balance -5 is negative")),
            (r#"{"balance": "-0x5"}"#, format!(r#"{a}: balance "-0x5" is not a decimal or 0x-hex number"#)),
            (r#"{"balance": true}"#, format!("{a}: balance must be a string or a number, found boolean")),
            (r#"{"balance": ["1"]}"#, format!("{a}: balance must be a string or a number, found array")),
            (r#"{"nonce": "0x1_0"}"#, format!(r#"{a}: nonce "0x1_0" is not a decimal or 0x-hex number"#)),
            (r#"{"nonce": "+1"}"#, format!(r#"{a}: nonce "+1" is not a decimal or 0x-hex number"#)),
            (
                r#"{"nonce": "18446744073709551616"}"#,
                format!(r#"{a}: nonce "18446744073709551616" does not fit in 64 bits"#),
            ),
            (
                r#"{"nonce": "0x10000000000000000"}"#,
                format!(r#"{a}: nonce "0x10000000000000000" does not fit in 64 bits"#),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(account_error(body), want, "{body}");
        }
        let too_big = format!("0x1{}", "0".repeat(64));
        assert_eq!(
            account_error(&format!(r#"{{"balance": "{too_big}"}}"#)),
            format!(r#"{a}: balance "{too_big}" does not fit in 256 bits"#)
        );
        // 2^256 as a JSON number.
        let two_256 = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        assert_eq!(
            account_error(&format!(r#"{{"balance": {two_256}}}"#)),
            format!("{a}: balance {two_256} does not fit in 256 bits")
        );
    }

    #[test]
    fn malformed_code_and_storage() {
        let a = "account 0x00000000000000000000000000000000000000a1";
        let long_key = format!("0x{}", "1".repeat(66));
        let cases = [
            (r#"{"code": "6001"}"#.to_owned(), format!(r#"{a}: code "6001" is missing the 0x prefix"#)),
            (r#"{"code": "0x600"}"#.to_owned(), format!("{a}: code has an odd number of hex digits (3)")),
            (r#"{"code": "0x60zz"}"#.to_owned(), format!("{a}: code has the non-hex character 'z' at offset 4")),
            (r#"{"code": 96}"#.to_owned(), format!("{a}: code must be a hex string, found number")),
            (r#"{"storage": []}"#.to_owned(), format!("{a}: storage must be a JSON object, found array")),
            (
                r#"{"storage": {"0x1": "0x01"}}"#.to_owned(),
                format!(r#"{a}: storage key "0x1" has an odd number of hex digits"#),
            ),
            (r#"{"storage": {"0X01": "0x01"}}"#.to_owned(), format!(r#"{a}: storage key "0X01" is not hex"#)),
            (
                format!(r#"{{"storage": {{"{long_key}": "0x01"}}}}"#),
                format!(r#"{a}: storage key "{long_key}" is longer than 32 bytes (64 hex digits)"#),
            ),
            (r#"{"storage": {"0x01": "0xzz"}}"#.to_owned(), format!(r#"{a}: storage["0x01"] "0xzz" is not hex"#)),
            (
                r#"{"storage": {"0x01": "0x123"}}"#.to_owned(),
                format!(r#"{a}: storage["0x01"] "0x123" has an odd number of hex digits"#),
            ),
            (
                r#"{"storage": {"0x01": 1}}"#.to_owned(),
                format!(r#"{a}: storage["0x01"] must be a hex string, found number"#),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(account_error(&body), want, "{body}");
        }
    }

    #[test]
    fn malformed_documents() {
        let cases = [
            ("[]", "the genesis document must be a JSON object, found array".to_owned()),
            ("{}", r#"no "alloc" object at the top level: not a geth-style genesis file"#.to_owned()),
            (r#"{"alloc": null}"#, r#"no "alloc" object at the top level: not a geth-style genesis file"#.to_owned()),
            (r#"{"alloc": []}"#, r#""alloc" must be a JSON object, found array"#.to_owned()),
            (
                r#"{"alloc": {"0x00000000000000000000000000000000000000a1": "1000"}}"#,
                "account 0x00000000000000000000000000000000000000a1 must be a JSON object, found string".to_owned(),
            ),
            (
                r#"{"alloc": {"0x00000000000000000000000000000000000000a1": null}}"#,
                "account 0x00000000000000000000000000000000000000a1 must be a JSON object, found null".to_owned(),
            ),
            (r#"{"alloc": {"0x1234": {}}}"#, r#"alloc key "0x1234" is not an address: it has 4 hex digits, want 40"#.to_owned()),
            (r#"{"alloc": {"": {}}}"#, r#"alloc key "" is not an address: it has 0 hex digits, want 40"#.to_owned()),
            (
                r#"{"alloc": {"0x00000000000000000000000000000000000000g1": {}}}"#,
                r#"alloc key "0x00000000000000000000000000000000000000g1" is not an address: it has the non-hex character 'g'"#.to_owned(),
            ),
            (r#"{"alloc": {}, "gasLimit": "lots"}"#, r#"genesis gasLimit "lots" is not a decimal or 0x-hex number"#.to_owned()),
            (r#"{"alloc": {}, "difficulty": -1}"#, "genesis difficulty -1 is negative".to_owned()),
            (r#"{"alloc": {}, "extraData": "hello"}"#, r#"genesis extraData "hello" is missing the 0x prefix"#.to_owned()),
            (r#"{"alloc": {}, "mixHash": "0x01"}"#, r#"genesis mixHash "0x01" has 2 hex digits, want 64"#.to_owned()),
            (r#"{"alloc": {}, "coinbase": 0}"#, "genesis coinbase must be a hex string, found number".to_owned()),
            (r#"{"alloc": {}, "config": []}"#, "genesis config must be a JSON object, found array".to_owned()),
        ];
        for (text, want) in cases {
            assert_eq!(error(text), want, "{text}");
        }
    }

    #[test]
    fn invalid_json_says_where() {
        let msg = error("{\"alloc\": {\n  \"0x00000000000000000000000000000000000000a1\": {\"balance\": \"1\",}\n}}");
        assert!(msg.starts_with("invalid JSON: ") && msg.contains("line 2 column"), "{msg}");
        for text in ["", "{", r#"{"alloc": {}} x"#, r#"{"alloc": {}, "nonce": 01}"#, r#"{"alloc": NaN}"#] {
            assert!(error(text).starts_with("invalid JSON: "), "{text}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!(r#"{{"alloc": {{}}, "config": {{"x": {}{}}}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(error(&deep).starts_with("invalid JSON: "));
    }

    #[test]
    fn long_values_are_cut_short_in_messages() {
        let long = format!("0x{}", "z".repeat(5000));
        let msg = account_error(&format!(r#"{{"balance": "{long}"}}"#));
        assert!(msg.len() < 300 && msg.contains("(5002 bytes)"), "{msg}");
    }

    /// Every file listed in testdata/genesis/roots.json parses, with the expected shape.
    #[test]
    fn vector_files_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/genesis");
        let roots = std::fs::read_to_string(dir.join("roots.json")).unwrap();
        let roots: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&roots).unwrap();
        // file: (accounts, accounts with code, storage slots)
        let shapes: [(&str, usize, usize, usize); 10] = [
            ("mainnet.json", 8893, 0, 0),
            ("sepolia.json", 15, 0, 0),
            ("goerli.json", 260, 0, 0),
            ("holesky.json", 317, 1, 31),
            ("hoodi.json", 335, 5, 33),
            ("devnet4.json", 263, 1, 31),
            ("bc_initcollision_pre.json", 4, 1, 2),
            ("bc_initcollision_post.json", 5, 1, 2),
            ("single_max_balance_9fe4.json", 1, 0, 0),
            ("single_max_balance_c2ba.json", 1, 0, 0),
        ];
        let mut listed: Vec<&str> = roots.keys().map(String::as_str).collect();
        listed.sort_unstable();
        let mut known: Vec<&str> = shapes.iter().map(|s| s.0).collect();
        known.sort_unstable();
        assert_eq!(listed, known, "roots.json and this test list different files");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".json") && n != "roots.json")
            .collect();
        on_disk.sort_unstable();
        assert_eq!(on_disk, known, "every vector file must be listed in roots.json");

        for (name, accounts, with_code, slots) in shapes {
            let root = roots[name].as_str().unwrap();
            assert!(
                root.len() == 66 && root.starts_with("0x") && root[2..].bytes().all(|b| b.is_ascii_hexdigit()),
                "{name}: {root}"
            );
            let g = Genesis::from_file(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(g.alloc.len(), accounts, "{name}: accounts");
            assert_eq!(
                g.alloc.values().filter(|a| !a.code.is_empty()).count(),
                with_code,
                "{name}: accounts with code"
            );
            assert_eq!(g.alloc.values().map(|a| a.storage.len()).sum::<usize>(), slots, "{name}: storage slots");
        }

        // Spot checks of values written in different forms.
        let g = Genesis::from_file(&dir.join("devnet4.json")).unwrap();
        let e25 = U256::from(10u64).pow(U256::from(25));
        assert_eq!(g.alloc[&addr("0xf97e180c050e5ab072211ad2c213eb5aee4df134")].balance, e25);
        assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000ff")].balance, U256::from(1));
        assert_eq!(g.gas_limit, 0x400000);
        let g = Genesis::from_file(&dir.join("bc_initcollision_post.json")).unwrap();
        let a = &g.alloc[&addr("0x6295ee1b4f6dd65047762f924ecd367c17eabf8f")];
        assert_eq!((a.nonce, a.storage[&word(1)]), (1, word(1)));
        let g = Genesis::from_file(&dir.join("hoodi.json")).unwrap();
        assert_eq!(g.alloc[&addr("0x000f3df6d732807ef1319fb7b8bb8522d0beac02")].nonce, 1);
        for name in ["single_max_balance_9fe4.json", "single_max_balance_c2ba.json"] {
            let g = Genesis::from_file(&dir.join(name)).unwrap();
            assert_eq!(g.alloc.values().next().unwrap().balance, U256::MAX, "{name}");
        }
        let g = Genesis::from_file(&dir.join("mainnet.json")).unwrap();
        assert_eq!((g.nonce, g.gas_limit, g.base_fee_per_gas), (0x42, 5000, None));
        assert!(g.config.as_deref().unwrap().starts_with(r#"{"chainId":1,"homesteadBlock":1150000,"#));
    }

    #[test]
    fn from_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("genesis.json");
        std::fs::write(&path, r#"{"alloc": {"0x00000000000000000000000000000000000000a1": {"balance": "12x"}}}"#)
            .unwrap();
        let msg = Genesis::from_file(&path).unwrap_err().to_string();
        assert_eq!(
            msg,
            format!(
                r#"genesis file {}: account 0x00000000000000000000000000000000000000a1: balance "12x" is not a decimal or 0x-hex number"#,
                path.display()
            )
        );

        std::fs::write(&path, b"{\"alloc\": {\xff}}").unwrap();
        let msg = Genesis::from_file(&path).unwrap_err().to_string();
        assert_eq!(msg, format!("genesis file {}: not UTF-8 text (bad byte at offset 11)", path.display()));

        let missing = dir.path().join("missing.json");
        let msg = Genesis::from_file(&missing).unwrap_err().to_string();
        assert!(msg.starts_with(&format!("cannot read genesis file {}: ", missing.display())), "{msg}");

        std::fs::write(&path, r#"{"alloc": {"a1000000000000000000000000000000000000a1": {"nonce": "0x1"}}}"#).unwrap();
        let g = Genesis::from_file(&path).unwrap();
        assert_eq!(g.alloc[&addr("0xa1000000000000000000000000000000000000a1")].nonce, 1);
    }
}
