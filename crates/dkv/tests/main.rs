//! The crate's integration tests, linked into one binary. Each module is a concern of its
//! own; `deploy` holds what they share.

mod deploy;
mod grpc;
mod inproc;
mod store;
