//! Virga's versioned stores.
//!
//! [`MvStore`] is the multi-version in-memory key-value store that transactions run on
//! (SEMEL's version chains, seed 004 ch. 3): every key holds a chain of versions
//! `<timestamp, writer>`, newest first, and garbage collection keeps, per key, every version
//! above the watermark plus the youngest one at or below it, which is all any live snapshot
//! can still read.
//!
//! Every store implements [`VersionedStore`]: versions of keys at timestamps, and nothing
//! about transactions. Concurrency-control state (read timestamps, prepared writers, locks)
//! lives in `virga-txn`, above the trait.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod key;
mod mvcc;
mod store;

pub use key::{InlineKey, KeyHasher};
pub use mvcc::{Chain, KeyState, MvStore, Timestamp, TxnId, Version};
pub use store::{GcStats, InstallRefused, Newest, ReadAt, StoreReport, VersionedStore};
