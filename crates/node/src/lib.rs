//! RainBlock's roles (seeds 000 ch. 6 and 003): storage nodes holding the sharded,
//! multi-versioned bottom layer of the DSM-Tree; prefetching clients that pre-execute
//! transfers and fetch compact witnesses; miners that execute against their private top
//! layer without I/O. No role trusts another: every witness, bag, block and update is
//! verified before use.
//!
//! - [`storage`]: the storage node ([`storage::StorageNode`]), its log (virga-log's `RecordLog`)
//!   and its checkpoints ([`checkpoint`]).
//! - [`client`]: the prefetching client, a sans-I/O core ([`client::ClientCore`]) run by
//!   `virga_net::driver`.
//! - [`miner`]: the miner (block producer and verifying follower).
//! - [`workload`]: the Ethereum-like workload.
//! - [`cluster`]: `virga up`, a whole cluster in one process.
//! - [`process`]: `virga node`, each role in a process of its own over gRPC.
//! - [`audit`]: checks a cluster directory (chain and storage-node logs).
//! - [`fuzzing`]: bodies of the fuzz targets for checkpoints and peer requests.

pub mod audit;
pub mod checkpoint;
pub mod client;
pub mod cluster;
pub mod codec;
#[cfg(test)]
mod contract_core_tests;
#[cfg(test)]
mod core_tests;
#[cfg(any(test, feature = "sim"))]
pub mod cost;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod messages;
pub mod miner;
#[cfg(feature = "grpc")]
pub mod process;
pub mod proto;
pub mod protocol;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod storage;
#[cfg(any(test, feature = "sim"))]
pub mod testkit;
pub mod topology;
pub mod workload;
