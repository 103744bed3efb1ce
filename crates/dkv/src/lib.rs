//! virga-dkv: the distributed transactional key-value store of issue 16 (seed 004: SEMEL's
//! sharded, primary-backup replicated multi-version storage and MILANA's client-coordinated
//! OCC transactions). Every role is a `virga_net::role` core (events in, commands out; no
//! clock, socket, thread or fsync inside), so the same code runs in the simulator, in one
//! process and over gRPC.
//!
//! - [`layout`], [`config`], [`cache`], [`wire`]: the cluster layout ([`ShardMap`]: hash or
//!   range shards, one primary and 2f backups per shard, an epoch per group), the
//!   configuration state machine ([`ConfigState`], [`ConfigCommand`]), a client's map cache,
//!   and their checked encodings.
//! - [`service`]: the configuration service, the state machine replicated by raft-rs
//!   ([`service::ConfigCore`]) with its client; [`raft_wire`] checks every Raft message a
//!   peer sends before raft-rs sees it.
//! - [`shard`]: the data nodes ([`shard::DataCore`]): per shard a [`shard::ShardReplica`]
//!   (versions, MILANA's per-key state, the transaction table, Algorithm 1), SEMEL's
//!   unordered replication to 2f backups, read leases from f backups, failover by Algorithm
//!   2, cooperative termination, watermark garbage collection, group commit to a record log.
//! - [`client`]: MILANA's client ([`client::TxnClient`]): reads at `ts_begin`, local
//!   validation of read-only transactions, two-phase commit it coordinates itself; its
//!   transactions come from programs or from interactive sessions.
//! - [`api`]: the client library ([`api::Kv`] over a core in this process or a gRPC server)
//!   and the `virga.kv.v1` service (`proto/kv.proto`); [`deploy`]: the whole cluster in one
//!   process from a directory (`virga kv cluster up`), or a process per role (`virga kv
//!   cluster init|node`), and the offline audit of a stopped cluster (`virga kv audit`).
//! - [`sim`]: both in the deterministic simulator, with their checkers: the configuration
//!   service alone (`sim::run_service`) and the whole store (`sim::txn::run_txn`, and the
//!   scripted failover anomaly `sim::txn::lease_scenario`).
//!
//! - [`metrics`]: what the cores measure of themselves (latency histograms, shard gauges),
//!   exported by `deploy` in Prometheus's text format.
//!
//! Bounded so far: the concurrency-control state, the scanned ranges, the versions (at
//! primaries and backups, below the watermark) and the transaction entries (settled, ids
//! kept: `shard::replica::settled`). Still to come: the settled ids, `voted_abort` and early
//! decisions (the cluster low mark of `docs/dkv-pruning.md`), checkpoints and log truncation.

pub mod api;
pub mod cache;
pub mod client;
pub mod config;
pub mod deploy;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod kairos;
pub mod layout;
mod map_refresh;
pub mod messages;
pub mod metrics;
pub mod proto;
mod protocol;
pub mod raft_wire;
mod record_io;
pub mod service;
pub mod shard;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
#[cfg(test)]
mod tests;
pub mod wire;

pub use cache::{MapCache, Route};
pub use config::{check_step, Applied, ConfigCommand, ConfigRefusal, ConfigState, StepViolation};
pub use layout::{
    key_hash, replicas_to_f, LayoutError, NodeIdProblem, Partitioning, ReplicaGroup, ReplicaRole, ShardId, ShardMap,
};
pub use protocol::{Dkv, DkvWireError};
pub use wire::WireError;
