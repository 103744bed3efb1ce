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

pub use crate::median;
