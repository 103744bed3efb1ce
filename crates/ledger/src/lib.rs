//! Virga's ledger: blocks of signed value transfers applied to the authenticated state.
//!
//! - [`tx`]: Ethereum legacy/EIP-155 transfers, signing and sender recovery.
//! - [`block`] and [`pow`]: Ethereum-style headers and bodies, transaction roots, simulated
//!   proof of work.
//! - [`exec`]: execution of transfers with nonce, balance and fee checks, and receipts.
//! - [`parallel`]: ChainifyDB's staged execution from the block's dependency graph.
//! - [`pool`] and [`builder`]: the transaction pool and the block builder.
//! - [`verify`]: header, work, signature and re-execution checks of a block.
//! - [`store`]: the append-only chain store.
//! - [`chain`]: a chain on disk with its state, reopened after crashes and audited.
//! - [`wlc`]: ChainifyDB's Whatever-Ledger Consensus: digests, LedgerBlocks and the c-of-k vote.

#![forbid(unsafe_code)]

pub mod block;
pub mod builder;
pub mod chain;
pub mod exec;
pub mod fabric;
pub mod fuzzing;
pub mod parallel;
pub mod pool;
pub mod pow;
pub mod store;
pub mod tx;
pub mod verify;
pub mod wlc;
