//! The DSM-Tree: Virga's authenticated, versioned state.
//!
//! An Ethereum-compatible hexary Merkle Patricia trie held in memory as pointer-linked
//! nodes (seeds 000 ch. 6 and 003 §5):
//! - [`Trie`] / [`SecureTrie`]: one version; `clone` is an O(1) snapshot, updates copy
//!   only their path, hashes are computed lazily and cached.
//! - [`proof`]: EIP-1186 proofs, node bags and compaction; [`verify_proof`].
//! - [`PartialTrie`]: the miners' top layer with hash nodes, node-bag application,
//!   pruning at a retention level and witness revision.
//! - [`ShardedTrie`]: the bottom layer split into vertical subtrees by key prefix.
//! - [`VersionedTrie`]: named versions with forks that can be dropped.
//! - [`DurableTrie`]: write-ahead log of logical updates plus checkpoints.
//! - [`account`]: Ethereum accounts with per-account storage tries; [`genesis`].

pub mod account;
pub mod decode;
pub mod durable;
pub mod fuzzing;
pub mod genesis;
mod node;
mod ops;
pub mod partial;
mod path;
pub mod proof;
mod rlp;
pub mod shard;
mod trie;
pub mod trietest;
mod value;
pub mod versions;

/// The longest key a trie accepts, in bytes: node paths store their nibble count in
/// 16 bits. Inserting a longer key is a programming error (it panics); decoders of
/// outside input check this limit and return an error instead.
pub const MAX_KEY_BYTES: usize = path::MAX_PATH_NIBBLES / 2;

pub use decode::{decode_node, ChildRef, DecodeError, DecodedNode};
pub use durable::DurableTrie;
pub use ops::Stopped;
pub use partial::PartialTrie;
pub use proof::{verify_proof, NodeBag, ProofError};
pub use shard::{Shard, ShardError, ShardedTrie};
pub use trie::{SecureTrie, Trie};
pub use versions::VersionedTrie;
