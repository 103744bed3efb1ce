//! The crate's integration tests, linked into one binary: one link of the whole stack
//! instead of one per file. Each module is a concern of its own.

mod chain;
mod contracts;
mod store;
mod store_device;
mod vectors;
