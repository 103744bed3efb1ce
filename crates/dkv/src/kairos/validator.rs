//! A KAIROS validator's state (seed 004 Algorithm 5) as a pure state machine: what one of
//! the sharded validators keeps of its keys and how it votes. It is not yet a role of the
//! store (validation still runs at the shard primaries); `docs/kairos-validators.md` is the
//! design this state serves, and its tests hold it to an oracle.
//!
//! Per key: the latest read, the newest committed version if known, and the transaction
//! holding a prepared write. Below `floor` (`ts_GC`) state is dropped: a key without state
//! has its newest version and its latest read at or below the floor. Algorithm 5 is
//! Algorithm 1 with one check first: a transaction whose freshness (the time up to which
//! every version it read is known unsuperseded) is below the floor aborts, since a version
//! between its freshness and the floor may have been dropped.

use std::collections::HashMap;

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId};
use virga_txn::AbortReason;

use crate::shard::ReadOp;

/// The validator of `key` among `validators` (at least one): the store's stable key hash.
pub fn validator_of(key: &[u8], validators: u32) -> u32 {
    (crate::layout::key_hash(key) % u64::from(validators.max(1))) as u32
}

/// Why a validator voted abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidatorAbort {
    /// The transaction's freshness is below the floor: state it needs may be gone.
    BelowGc,
    /// One of Algorithm 1's checks.
    Check(AbortReason),
}

impl ValidatorAbort {
    pub fn name(self) -> &'static str {
        match self {
            ValidatorAbort::BelowGc => "below-gc",
            ValidatorAbort::Check(reason) => reason.name(),
        }
    }
}

/// One transaction's part at this validator.
#[derive(Debug, Clone)]
pub struct Validation<'a> {
    pub txn: TxnId,
    pub commit_ts: Timestamp,
    /// The minimum, over the reads, of the time up to which each version read is known
    /// unsuperseded (not read when there are no reads).
    pub freshness: Timestamp,
    pub reads: &'a [ReadOp],
    pub writes: &'a [Bytes],
}

/// Deliberately broken validators, for the checks to catch. The switches exist only in test
/// builds and under the `sim` feature; otherwise this is empty and every check runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidatorWeakening {
    /// Skips `freshness < ts_GC → abort`.
    #[cfg(any(test, feature = "sim"))]
    pub skip_freshness: bool,
    /// Skips the latest-committed check of reads served from a cache.
    #[cfg(any(test, feature = "sim"))]
    pub skip_cached_latest_committed: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct KeyState {
    latest_read: Timestamp,
    /// None: not known since the state was made, so at or below the floor then.
    latest_committed: Option<Timestamp>,
    /// The transaction holding a prepared write, and its commit timestamp.
    prepared: Option<(TxnId, Timestamp)>,
}

/// The state of one validator.
#[derive(Debug, Default)]
pub struct ValidatorState {
    keys: HashMap<Bytes, KeyState>,
    floor: Timestamp,
    /// Transactions voted commit and not yet decided: their commit timestamp and writes.
    held: HashMap<TxnId, (Timestamp, Vec<Bytes>)>,
    weakened: ValidatorWeakening,
}

impl ValidatorState {
    /// A validator that knows nothing at or below `floor` (everything it was never told of
    /// lies there: a new cluster's loaded data, or what a restarted validator forgot).
    pub fn new(floor: Timestamp) -> ValidatorState {
        ValidatorState { floor, ..ValidatorState::default() }
    }

    pub fn weaken(&mut self, weakened: ValidatorWeakening) {
        self.weakened = weakened;
    }

    pub fn floor(&self) -> Timestamp {
        self.floor
    }

    /// Keys with state.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Algorithm 5: votes on `validation`, and on a commit vote raises its reads' latest
    /// read to the commit timestamp and holds its writes until [`ValidatorState::decide`].
    /// A transaction already voted commit is voted commit again (a retried request).
    pub fn validate(&mut self, validation: &Validation<'_>) -> Result<(), ValidatorAbort> {
        let (txn, ts) = (validation.txn, validation.commit_ts);
        if self.held.contains_key(&txn) {
            return Ok(());
        }
        // A transaction that read nothing has no freshness to judge.
        let reads = !validation.reads.is_empty();
        if reads
            && !crate::shard::replica::weakened!(self.weakened, skip_freshness)
            && validation.freshness < self.floor
        {
            return Err(ValidatorAbort::BelowGc);
        }
        self.check(validation).map_err(ValidatorAbort::Check)?;
        for read in validation.reads {
            let state = self.keys.entry(read.key.clone()).or_default();
            state.latest_read = state.latest_read.max(ts);
        }
        for key in validation.writes {
            self.keys.entry(key.clone()).or_default().prepared = Some((txn, ts));
        }
        if !validation.writes.is_empty() {
            self.held.insert(txn, (ts, validation.writes.to_vec()));
        }
        Ok(())
    }

    /// Algorithm 1's checks, against the keys' state or, for a key without state, the floor.
    fn check(&self, validation: &Validation<'_>) -> Result<(), AbortReason> {
        let (txn, ts) = (validation.txn, validation.commit_ts);
        let held_by_other = |state: &KeyState| state.prepared.is_some_and(|(holder, _)| holder != txn);
        for read in validation.reads {
            let Some(state) = self.keys.get(&read.key) else { continue };
            // A writer held above this commit timestamp lands above the read, whatever its
            // outcome (as a get at a snapshot waits only for writers prepared at or below it).
            if state.prepared.is_some_and(|(holder, holder_ts)| holder != txn && holder_ts <= ts) {
                return Err(AbortReason::ReadPrepared);
            }
            let skip = read.cached && crate::shard::replica::weakened!(self.weakened, skip_cached_latest_committed);
            if !skip && state.latest_committed.is_some_and(|newest| newest != read.version) {
                return Err(AbortReason::ReadStale);
            }
        }
        // A write at or below the floor could pass under a read whose state is gone.
        if !validation.writes.is_empty() && ts <= self.floor {
            return Err(AbortReason::WriteAfterRead);
        }
        for key in validation.writes {
            let Some(state) = self.keys.get(key) else { continue };
            if held_by_other(state) {
                return Err(AbortReason::WritePrepared);
            }
            if state.latest_read >= ts {
                return Err(AbortReason::WriteAfterRead);
            }
            if state.latest_committed.is_some_and(|newest| newest >= ts) {
                return Err(AbortReason::WriteStale);
            }
        }
        Ok(())
    }

    /// The reads whose version is no longer the newest this validator knows (a stale
    /// vote names them, so the client drops those cached copies).
    pub fn stale_reads<'r>(&self, reads: &'r [ReadOp]) -> impl Iterator<Item = &'r Bytes> + use<'_, 'r> {
        reads.iter().filter_map(move |read| {
            let newest = self.keys.get(&read.key)?.latest_committed?;
            (newest != read.version).then_some(&read.key)
        })
    }

    /// The outcome of a transaction this validator voted commit on (any other is ignored).
    pub fn decide(&mut self, txn: TxnId, commit: bool) {
        let Some((ts, writes)) = self.held.remove(&txn) else { return };
        for key in writes {
            let Some(state) = self.keys.get_mut(&key) else { continue };
            if state.prepared.is_some_and(|(holder, _)| holder == txn) {
                state.prepared = None;
            }
            if commit {
                state.latest_committed = Some(state.latest_committed.map_or(ts, |newest| newest.max(ts)));
            }
        }
    }

    /// Raises the floor to `ts_gc` (never lowers it) and drops the state that lies wholly at
    /// or below it.
    pub fn collect(&mut self, ts_gc: Timestamp) {
        self.floor = self.floor.max(ts_gc);
        let floor = self.floor;
        self.keys.retain(|_, state| {
            state.prepared.is_some()
                || state.latest_read > floor
                || state.latest_committed.is_some_and(|newest| newest > floor)
        });
    }
}

#[cfg(test)]
mod tests;
