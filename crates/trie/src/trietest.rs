//! Runner for files in the Ethereum TrieTests format.
//!
//! A file is an object of named cases `{"in": …, "root": "0x…"}`. `in` is either a
//! list of `[key, value]` pairs applied in order, or an object applied in any order.
//! Strings starting with `0x` are hex, others UTF-8; a `null` value deletes the key.

use std::path::Path;

use alloy_primitives::B256;
use serde_json::Value;

use crate::{SecureTrie, Trie};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseOutcome {
    pub name: String,
    pub expected: B256,
    pub actual: B256,
}

impl CaseOutcome {
    pub fn passed(&self) -> bool {
        self.expected == self.actual
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrieTestError {
    #[error("{file}: cannot read: {source}")]
    Io { file: String, source: std::io::Error },
    #[error("{file}: not valid JSON: {source}")]
    Json { file: String, source: serde_json::Error },
    #[error("{file}: {what}")]
    Format { file: String, what: FormatProblem },
}

/// What is wrong with a TrieTests document that is valid JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatProblem {
    #[error("top level must be an object of named cases")]
    NotAnObject,
    #[error("case {case}: {problem}")]
    Case { case: String, problem: CaseProblem },
}

/// What is wrong with one case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaseProblem {
    #[error("missing field \"in\"")]
    MissingIn,
    #[error("\"in\" must be a list of pairs or an object")]
    InShape,
    #[error("in[{index}] must be a [key, value] pair")]
    NotAPair { index: usize },
    #[error("in[{index}] key: {problem}")]
    PairKey { index: usize, problem: TextProblem },
    #[error("in[{index}] value: {problem}")]
    PairValue { index: usize, problem: TextProblem },
    #[error("key {key:?}: {problem}")]
    Key { key: String, problem: TextProblem },
    #[error("value of {key:?}: {problem}")]
    Value { key: String, problem: TextProblem },
    #[error("missing string field \"root\"")]
    MissingRoot,
    #[error("root: {0}")]
    Root(TextProblem),
    #[error("root must be 32 bytes, got {0}")]
    RootLength(usize),
}

/// What is wrong with a key, value or root string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextProblem {
    #[error("must be a string")]
    NotAString,
    #[error("{0}")]
    Hex(#[from] virga_core::hex::FromHexError),
    #[error("{0} bytes is longer than the longest key ({max})", max = crate::MAX_KEY_BYTES)]
    TooLong(usize),
}

/// Runs every case of the file at `path`.
pub fn run_file(path: &Path, secure: bool) -> Result<Vec<CaseOutcome>, TrieTestError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TrieTestError::Io { file: file.clone(), source })?;
    run_str(&text, secure).map_err(|error| match error {
        TrieTestError::Json { source, .. } => TrieTestError::Json { file, source },
        TrieTestError::Format { what, .. } => TrieTestError::Format { file, what },
        io => io,
    })
}

/// Runs every case of a TrieTests document given as text.
pub fn run_str(text: &str, secure: bool) -> Result<Vec<CaseOutcome>, TrieTestError> {
    let format = |what: FormatProblem| TrieTestError::Format { file: String::new(), what };
    let document: Value =
        serde_json::from_str(text).map_err(|source| TrieTestError::Json { file: String::new(), source })?;
    let cases = document.as_object().ok_or_else(|| format(FormatProblem::NotAnObject))?;
    let mut outcomes = Vec::with_capacity(cases.len());
    for (name, case) in cases {
        let in_case = |problem: CaseProblem| format(FormatProblem::Case { case: name.clone(), problem });
        let pairs = case_pairs(case).map_err(in_case)?;
        let root_text = case.get("root").and_then(Value::as_str).ok_or_else(|| in_case(CaseProblem::MissingRoot))?;
        let root_bytes = decode_text(root_text).map_err(|problem| in_case(CaseProblem::Root(problem)))?;
        if root_bytes.len() != 32 {
            return Err(in_case(CaseProblem::RootLength(root_bytes.len())));
        }
        let actual = if secure {
            let mut trie = SecureTrie::new();
            for (key, value) in &pairs {
                trie.insert(key, value.as_deref().unwrap_or_default());
            }
            trie.root_hash()
        } else {
            let mut trie = Trie::new();
            for (key, value) in &pairs {
                trie.insert(key, value.as_deref().unwrap_or_default());
            }
            trie.root_hash()
        };
        outcomes.push(CaseOutcome { name: name.clone(), expected: B256::from_slice(&root_bytes), actual });
    }
    Ok(outcomes)
}

type Pair = (Vec<u8>, Option<Vec<u8>>);

fn case_pairs(case: &Value) -> Result<Vec<Pair>, CaseProblem> {
    let input = case.get("in").ok_or(CaseProblem::MissingIn)?;
    let mut pairs = Vec::new();
    match input {
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let pair = item.as_array().filter(|p| p.len() == 2).ok_or(CaseProblem::NotAPair { index })?;
                let key = text_field(&pair[0]).map_err(|problem| CaseProblem::PairKey { index, problem })?;
                let value = optional_text(&pair[1]).map_err(|problem| CaseProblem::PairValue { index, problem })?;
                pairs.push((key, value));
            }
        }
        Value::Object(items) => {
            for (key_text, value) in items {
                let key =
                    decode_text(key_text).map_err(|problem| CaseProblem::Key { key: key_text.clone(), problem })?;
                let value =
                    optional_text(value).map_err(|problem| CaseProblem::Value { key: key_text.clone(), problem })?;
                pairs.push((key, value));
            }
        }
        _ => return Err(CaseProblem::InShape),
    }
    Ok(pairs)
}

fn text_field(value: &Value) -> Result<Vec<u8>, TextProblem> {
    value.as_str().ok_or(TextProblem::NotAString).and_then(decode_text)
}

fn optional_text(value: &Value) -> Result<Option<Vec<u8>>, TextProblem> {
    if value.is_null() {
        Ok(None)
    } else {
        text_field(value).map(Some)
    }
}

/// `0x…` is hex, anything else is the UTF-8 bytes of the string.
fn decode_text(text: &str) -> Result<Vec<u8>, TextProblem> {
    let bytes = if text.starts_with("0x") { virga_core::hex::decode(text)? } else { text.as_bytes().to_vec() };
    if bytes.len() > crate::MAX_KEY_BYTES {
        return Err(TextProblem::TooLong(bytes.len()));
    }
    Ok(bytes)
}
