//! The crate's integration tests, linked into one binary: one link of the whole stack
//! instead of one per file. Each module is a concern of its own.

mod ethereum_vectors;
mod fuzz_smoke;
mod genesis_roots;
mod layers;
mod properties;
mod revision;
