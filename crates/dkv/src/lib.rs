//! virga-dkv: the distributed transactional key-value store of issue 16 (seed 004: SEMEL's
//! sharded, primary-backup replicated multi-version storage and MILANA's client-coordinated
//! OCC transactions), built in steps.
//!
//! The cluster layout, as pure and deterministic code (no network, no threads, no clock):
//!
//! - [`layout`]: [`ShardMap`]: keys sharded by a stable hash or by ranges, each shard
//!   replicated by a [`ReplicaGroup`] of one primary and 2f backups (an odd replica count;
//!   [`replicas_to_f`] refuses even ones), with an epoch per group and a version per map;
//!   [`ShardMap::place`] spreads primaries and replicas round robin over the nodes.
//! - [`config`]: the configuration state machine ([`ConfigState`], [`ConfigCommand`]):
//!   install a layout, fail over a primary, add and remove backups, each change checked
//!   against the group's epoch; what the configuration service's Raft log will carry.
//! - [`cache`]: a client's [`MapCache`]: routes a key to its shard's primary and epoch, takes
//!   newer maps only, and tells when a server's epoch means the map is stale.
//! - [`wire`]: protobuf encoding of maps and commands (package `virga.dkv.v1`), with
//!   decoders that bound sizes and check everything.
//!
//! Still to come, each on top of this: the configuration service replicating
//! [`ConfigState`] through a Raft library inside the simulator; SEMEL replication (unordered
//! primary-backup writes committed by a majority, leases held from f backups, failover that
//! merges f+1 logs); MILANA's two-phase commit with cooperative termination; and the client
//! API (gRPC, a Rust client, `virga kv`).

pub mod cache;
pub mod client;
pub mod config;
pub mod fuzzing;
pub mod layout;
pub mod raft_wire;
pub mod service;
pub mod shard;
pub mod sim;
#[cfg(test)]
mod tests;
pub mod wire;

pub use cache::{MapCache, Route};
pub use config::{check_step, Applied, ConfigCommand, ConfigRefusal, ConfigState, StepViolation};
pub use layout::{
    key_hash, replicas_to_f, LayoutError, NodeIdProblem, Partitioning, ReplicaGroup, ReplicaRole, ShardId, ShardMap,
};
pub use wire::WireError;
