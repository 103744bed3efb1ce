//! Virga's versioned stores.
//!
//! [`MvStore`] is the multi-version in-memory key-value store that transactions run on
//! (SEMEL's version chains, seed 004 ch. 3): every key holds a chain of versions
//! `<timestamp, writer>`, newest first, and garbage collection keeps, per key, every version
//! above the watermark plus the youngest one at or below it, which is all any live snapshot
//! can still read.
//!
//! The store also keeps the per-key concurrency-control state of the engine above it
//! ([`KeyState`]: latest read timestamp, the prepared writer, shared-lock count), because
//! validation must see that state and the version chain under one latch.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod mvcc;
mod store;

pub use mvcc::{KeyInner, KeyState, MvStore, Prepared, Timestamp, TxnId, Version};
pub use store::{GcStats, InstallRefused, Newest, ReadAt, StoreReport, VersionedStore};
