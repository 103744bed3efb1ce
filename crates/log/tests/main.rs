//! The crate's integration tests, linked into one binary: one link of the whole stack
//! instead of one per file. Each module is a concern of its own.

mod crash_model;
mod fuzz_smoke;
mod group;
mod on_disk;
