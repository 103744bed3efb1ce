//! raft-rs 0.7 (tikv) as Virga's Raft: its `RawNode` is a state machine with no clock, thread
//! or I/O, the shape of a Virga core, so a replicated core runs in the simulator, in one
//! process and over gRPC alike. Virga never writes Raft; this crate holds what every group
//! needs around raft-rs:
//!
//! - [`proto`]: raft-rs's messages on Virga's wire (`proto/raft.proto`, package
//!   `virga.raft.v1`, a prost mirror of raft-rs's own), which the protocols of the groups
//!   carry; [`wire`]: the conversions and the checks every received message passes before
//!   raft-rs sees it;
//! - [`log::RaftLog`]: raft-rs's `Storage` in memory, rebuilt from the replica's records;
//! - [`replica::Replica`]: the Ready loop (group-committed writes, messages held until what
//!   they promise is durable, deterministic elections).
//!
//! Its users: the dkv configuration service and ChainifyDB's ordering service.

pub mod log;
/// Raft's wire messages (package `virga.raft.v1`).
pub mod proto {
    #![allow(clippy::all, clippy::too_many_lines)]
    include!(concat!(env!("OUT_DIR"), "/virga.raft.v1.rs"));
}
pub mod replica;
pub mod wire;

pub use log::{CompactError, RaftLog, RaftLogError};
pub use replica::{ImageCheck, Output, Replica, ReplicaSettings};
pub use wire::{Checks, EntryCheck, EntryRefusal, RaftWireError, Receiver};

#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;
