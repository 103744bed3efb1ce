//! The simulator's integration tests: one binary, one module per file.

mod common;

mod cost;
mod determinism;
mod lifecycle;
mod media;
mod network;
mod property;
mod speed;
