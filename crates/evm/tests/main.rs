//! The crate's integration tests, linked into one binary (docs/testing.md): agreement with
//! revm alone and between the serial and parallel executors, the contracts, Ethereum's state
//! tests.

mod agreement;
mod common;
mod contracts;
mod partial;
mod speculation;
mod state_tests;
