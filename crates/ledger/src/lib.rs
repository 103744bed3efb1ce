//! Virga's ledger: blocks of signed Ethereum transactions (value transfers, contract calls
//! and creations) executed by revm over the authenticated state.
//!
//! - [`tx`]: legacy, EIP-2930 and EIP-1559 transactions, signing and sender recovery.
//! - [`block`] and [`pow`]: Ethereum-style headers (with the base fee) and bodies,
//!   transaction roots, simulated proof of work.
//! - [`exec`]: execution through `virga-evm`, serial or parallel; receipts with logs and bloom.
//! - [`pool`] and [`builder`]: the transaction pool and the block builder.
//! - [`verify`]: header, work, signature and re-execution checks of a block.
//! - [`store`]: the append-only chain store.
//! - [`chain`]: a chain on disk with its state, reopened after crashes and audited;
//!   [`contract_store`] keeps its storage slots and code.
//! - [`wlc`]: ChainifyDB's Whatever-Ledger Consensus: digests, LedgerBlocks and the c-of-k vote.

#![forbid(unsafe_code)]

pub mod block;
pub mod builder;
pub mod chain;
pub mod contract_store;
pub mod exec;
pub mod fabric;
pub mod fuzzing;
pub mod pool;
pub mod pow;
pub mod store;
pub mod tx;
pub mod verify;
pub mod wlc;
