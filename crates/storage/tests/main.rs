//! The crate's integration tests, linked into one binary.

mod model;
