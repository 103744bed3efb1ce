//! Ledger benchmarks:
//! - [`schedule`]: Fabric++'s reordering on the thesis's microbenchmarks (seed 002 Figs.
//!   3.6 and 3.7): transactions kept and time to schedule a 1,024-transaction block;
//! - [`fabric`]: the SmallBank sweep of Fig. 3.10 through Virga's simulate–order–validate
//!   pipeline, arrival order against Fabric++ in one run;
//! - [`chain`]: building a chain of signed value transfers and verifying it, serially and in
//!   ChainifyDB's parallel stages.

pub mod chain;
pub mod fabric;
pub mod schedule;

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
