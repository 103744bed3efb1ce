//! Engine configuration: the concurrency control, the timestamp scheme, the clocks' skew
//! profile, and durability. Variants a seed compares are plain values, so two engines configured
//! differently can run side by side in one process.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use virga_core::clock::SkewProfile;
use virga_log::SyncMode;

use crate::checker::HistoryRecorder;

/// How read-write transactions are kept serializable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ConcurrencyControl {
    /// Optimistic: buffer writes, validate at commit with per-key `latestRead` /
    /// `prepared` / `latestCommitted` state (MILANA Algorithm 1).
    #[default]
    Occ,
    /// Two-phase locking, no-wait: a transaction that meets a held lock aborts at once, so
    /// no deadlock can form. The comparison baseline.
    #[cfg_attr(feature = "clap", value(name = "2pl"))]
    TwoPhaseLocking,
}

/// Where commit and snapshot timestamps come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TimestampScheme {
    /// Each client's own loosely synchronized physical clock (MILANA). Skew between clients
    /// costs aborts, never correctness.
    #[default]
    Clock,
    /// A hybrid logical clock per client (48-bit physical milliseconds, 16-bit counter) that
    /// also advances past every version the client reads.
    Hlc,
    /// DST's decentralized scalar timestamps: commit timestamps derived from the conflicting
    /// tuples' timestamps; read-only transactions read at the client's `LocalTS` and never
    /// abort.
    Dst,
}

/// When a commit's log record must be on disk before the commit is acknowledged.
#[derive(Clone, Debug, Default)]
pub enum Durability {
    /// In memory only.
    #[default]
    Off,
    /// A write-ahead log in `dir`, synced per `sync`.
    Log {
        /// Directory of the log's segments.
        dir: PathBuf,
        /// `none`, `group` or `every`.
        sync: SyncMode,
    },
}

/// Everything an [`crate::Engine`] is configured with.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// Concurrency control for read-write transactions.
    pub cc: ConcurrencyControl,
    /// Timestamp scheme.
    pub timestamps: TimestampScheme,
    /// Skew of each client's physical clock against true time: the profile
    /// [`crate::Engine::open`] builds its [`crate::SkewedClocks`] with.
    /// [`crate::Engine::open_with`] takes its clocks ready-made and ignores it.
    pub clock_skew: SkewProfile,
    /// Seeds the clock models [`crate::Engine::open`] builds, so runs are repeatable.
    pub seed: u64,
    /// Durability.
    pub durability: Durability,
    /// When set, every committed transaction's reads and writes are recorded for the
    /// history checker.
    pub history: Option<Arc<HistoryRecorder>>,
    /// Deliberately broken validation, only for proving that the history checker catches an
    /// unserializable engine. Never set it for real use.
    #[doc(hidden)]
    pub skip_read_validation: bool,
}

impl fmt::Display for ConcurrencyControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConcurrencyControl::Occ => "occ",
            ConcurrencyControl::TwoPhaseLocking => "2pl",
        })
    }
}

impl fmt::Display for TimestampScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimestampScheme::Clock => "clock",
            TimestampScheme::Hlc => "hlc",
            TimestampScheme::Dst => "dst",
        })
    }
}
