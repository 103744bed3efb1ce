//! The store's own protocol between its roles (`proto/dkv.proto`, package `virga.dkv.v1`):
//! the shard map, the configuration commands, the shard replicas' messages and records, and
//! virga-raft's Raft messages that the configuration service carries. The client API
//! (`proto/kv.proto`) is [`crate::api::proto`].

#![allow(clippy::all, clippy::too_many_lines)]

include!(concat!(env!("OUT_DIR"), "/virga.dkv.v1.rs"));

pub use crate::api::proto::Timestamp;
pub use virga_raft::proto::*;
