//! Virga's workloads and benchmark harness.
//!
//! `trie` measures the DSM-Tree against peer tries on the same data in the same run;
//! `rainblock` sweeps whole RainBlock clusters over retention levels, account and client
//! counts (the paper's Figs. 8 and 9a).

pub mod dkv;
pub mod dkv_etcd;
pub mod evm;
#[cfg(feature = "peers")]
pub mod evm_roots;
pub mod evm_runs;
pub mod kv;
pub mod ledger;
#[cfg(feature = "peers")]
pub mod peers;
pub mod plot;
pub mod rainblock;
pub mod trie;
pub mod trie_impl;

/// The median of `values` (0 for none).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}
