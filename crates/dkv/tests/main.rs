//! The crate's integration tests, linked into one binary. Each module is a concern of its
//! own; `deploy` holds what they share.

mod api;
mod deploy;
mod grpc;
mod inproc;
mod store;
