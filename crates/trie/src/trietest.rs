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
    Format { file: String, what: String },
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
    let format = |what: String| TrieTestError::Format { file: String::new(), what };
    let document: Value =
        serde_json::from_str(text).map_err(|source| TrieTestError::Json { file: String::new(), source })?;
    let cases = document.as_object().ok_or_else(|| format("top level must be an object of named cases".into()))?;
    let mut outcomes = Vec::with_capacity(cases.len());
    for (name, case) in cases {
        let pairs = case_pairs(name, case).map_err(format)?;
        let root_text = case
            .get("root")
            .and_then(Value::as_str)
            .ok_or_else(|| format(format!("case {name}: missing string field \"root\"")))?;
        let root_bytes = decode_text(root_text).map_err(|e| format(format!("case {name}: root: {e}")))?;
        if root_bytes.len() != 32 {
            return Err(format(format!("case {name}: root must be 32 bytes, got {}", root_bytes.len())));
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

fn case_pairs(name: &str, case: &Value) -> Result<Vec<Pair>, String> {
    let input = case.get("in").ok_or_else(|| format!("case {name}: missing field \"in\""))?;
    let mut pairs = Vec::new();
    match input {
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let pair = item
                    .as_array()
                    .filter(|p| p.len() == 2)
                    .ok_or_else(|| format!("case {name}: in[{index}] must be a [key, value] pair"))?;
                let key = text_field(&pair[0]).map_err(|e| format!("case {name}: in[{index}] key: {e}"))?;
                let value = optional_text(&pair[1]).map_err(|e| format!("case {name}: in[{index}] value: {e}"))?;
                pairs.push((key, value));
            }
        }
        Value::Object(items) => {
            for (key_text, value) in items {
                let key = decode_text(key_text).map_err(|e| format!("case {name}: key {key_text:?}: {e}"))?;
                let value = optional_text(value).map_err(|e| format!("case {name}: value of {key_text:?}: {e}"))?;
                pairs.push((key, value));
            }
        }
        _ => return Err(format!("case {name}: \"in\" must be a list of pairs or an object")),
    }
    Ok(pairs)
}

fn text_field(value: &Value) -> Result<Vec<u8>, String> {
    value.as_str().ok_or_else(|| "must be a string".to_string()).and_then(decode_text)
}

fn optional_text(value: &Value) -> Result<Option<Vec<u8>>, String> {
    if value.is_null() {
        Ok(None)
    } else {
        text_field(value).map(Some)
    }
}

/// `0x…` is hex, anything else is the UTF-8 bytes of the string.
fn decode_text(text: &str) -> Result<Vec<u8>, String> {
    let bytes = if text.starts_with("0x") {
        virga_core::hex::decode(text).map_err(|e| e.to_string())?
    } else {
        text.as_bytes().to_vec()
    };
    if bytes.len() > crate::MAX_KEY_BYTES {
        return Err(format!("{} bytes is longer than the longest key ({})", bytes.len(), crate::MAX_KEY_BYTES));
    }
    Ok(bytes)
}
