//! Virga's workloads and benchmark harness.
//!
//! `trie` measures the DSM-Tree against peer tries on the same data in the same run.

pub mod kv;
pub mod ledger;
#[cfg(feature = "peers")]
pub mod peers;
pub mod trie;
pub mod trie_impl;
