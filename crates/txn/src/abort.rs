//! Why a transaction aborted.

use std::fmt;

/// The cause of an abort. Every abort carries one, and the engine counts them by cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AbortReason {
    /// A key read has a newer committed version than the one read (MILANA: `latestCommitted`
    /// differs from the version read).
    ReadStale,
    /// A key read is held by another writer between its validation and installation.
    ReadPrepared,
    /// A transaction with a later timestamp already read the version this write would
    /// replace (MILANA: `latestRead >= commit timestamp`).
    WriteAfterRead,
    /// A version at or after this transaction's commit timestamp is already committed
    /// (MILANA: `latestCommitted >= commit timestamp`); the usual cost of a lagging clock.
    WriteStale,
    /// Another writer holds a key this transaction writes.
    WritePrepared,
    /// A read-only transaction saw a writer prepared at or below its snapshot, so its
    /// snapshot may miss that write (MILANA's local validation).
    SnapshotPrepared,
    /// Two-phase locking (no-wait) found the lock it needed held.
    LockConflict,
    /// A scanned range gained or lost a key, or an insert landed under a scan's timestamp.
    Phantom,
    /// A read-only transaction tried to write.
    WriteInReadOnly,
    /// The application aborted.
    User,
    /// A two-phase-commit coordinator decided to abort a prepared transaction (another
    /// participant voted no).
    Coordinator,
    /// The write-ahead log failed; the engine refuses further commits.
    LogFailed,
    /// A write at or below the commit floor of a primary that took over: a read its
    /// predecessor served under a lease may lie there (a retry at a later timestamp passes).
    BelowCommitFloor,
}

impl AbortReason {
    /// Every reason, in the order reports list them.
    pub const ALL: [AbortReason; 13] = [
        AbortReason::ReadStale,
        AbortReason::ReadPrepared,
        AbortReason::WriteAfterRead,
        AbortReason::WriteStale,
        AbortReason::WritePrepared,
        AbortReason::SnapshotPrepared,
        AbortReason::LockConflict,
        AbortReason::Phantom,
        AbortReason::WriteInReadOnly,
        AbortReason::User,
        AbortReason::Coordinator,
        AbortReason::LogFailed,
        AbortReason::BelowCommitFloor,
    ];

    /// Short stable name, used in reports and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            AbortReason::ReadStale => "read-stale",
            AbortReason::ReadPrepared => "read-prepared",
            AbortReason::WriteAfterRead => "write-after-read",
            AbortReason::WriteStale => "write-stale",
            AbortReason::WritePrepared => "write-prepared",
            AbortReason::SnapshotPrepared => "snapshot-prepared",
            AbortReason::LockConflict => "lock-conflict",
            AbortReason::Phantom => "phantom",
            AbortReason::WriteInReadOnly => "write-in-read-only",
            AbortReason::User => "user",
            AbortReason::Coordinator => "coordinator",
            AbortReason::LogFailed => "log-failed",
            AbortReason::BelowCommitFloor => "below-commit-floor",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A transaction was aborted and left no effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("transaction aborted: {reason}")]
pub struct Abort {
    /// Why.
    pub reason: AbortReason,
}

impl From<AbortReason> for Abort {
    fn from(reason: AbortReason) -> Abort {
        Abort { reason }
    }
}
