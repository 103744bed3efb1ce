//! Virga's transactions on one node.
//!
//! An [`Engine`] runs on a [`VersionedStore`] (by default [`DefaultStore`], the in-memory
//! [`MvStore`] carrying each key's concurrency-control state next to its versions; any
//! other store through [`SideTable`]), the clocks it is given
//! ([`ClockSource`]) and, when durable, a group-commit write-ahead log
//! ([`virga_log::GroupLog`]). Each worker opens a [`Session`] (a client with its own clock)
//! and runs [`Txn`]s on it:
//!
//! - read-write transactions under OCC with MILANA's validation, or under no-wait two-phase
//!   locking ([`ConcurrencyControl`]);
//! - read-only transactions that read a snapshot and validate locally (MILANA) or wait on
//!   held tuples and never abort (DST);
//! - timestamps from skewed per-client clocks, hybrid logical clocks, or DST's decentralized
//!   scalar timestamps ([`TimestampScheme`]).
//!
//! Commit is [`Txn::prepare`] (a [`Vote`]) then [`Txn::decide`] (a [`Decision`]), run back
//! to back by [`Txn::commit`] and separately by a two-phase-commit participant. Every abort
//! carries an [`AbortReason`]. The [`checker`] verifies recorded histories.
//!
//! ```
//! use virga_txn::{Engine, EngineConfig};
//!
//! let (engine, _) = Engine::open(EngineConfig::default())?;
//! engine.load([(b"alice".to_vec(), 10u64.to_le_bytes().to_vec())].into_iter())?;
//! let mut session = engine.session()?;
//! let mut txn = session.begin();
//! let balance = txn.get(b"alice")?.expect("loaded");
//! txn.put(b"bob", balance)?;
//! txn.commit()?;
//! let mut audit = session.begin_read_only();
//! assert_eq!(audit.get(b"bob")?.as_deref(), Some(&10u64.to_le_bytes()[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod abort;
pub mod cache;
mod cc;
pub mod checker;
mod clocks;
mod commit;
mod config;
mod engine;
pub mod schedule;
mod txn;
pub mod wal;

pub use abort::{Abort, AbortReason};
pub use cc::{CcState, DefaultStore, LockedKey, Paired, SideLocked, SideTable, TxnStore};
pub use clocks::{ClockSource, SkewedClocks};
pub use commit::{Decision, Vote};
pub use config::{ConcurrencyControl, Durability, EngineConfig, TimestampScheme};
pub use engine::{CommitInfo, Engine, EngineError, Recovery, Session, TxnStats, MAX_SESSIONS};
pub use txn::Txn;
pub use virga_core::clock::SkewProfile;
pub use virga_log::SyncMode;
pub use virga_storage::{MvStore, Timestamp, TxnId, VersionedStore};
