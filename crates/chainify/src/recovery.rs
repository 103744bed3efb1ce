//! The order in which a disagreeing organization tries to recover (seed 002 §4.3): restore
//! its newest checkpoint and replay the agreed blocks after it; if its effects still differ,
//! take the checkpoint for corrupt and try the next older one; then replay the whole ledger
//! from empty tables; if even that differs, the organization cannot reach the agreed
//! effects from the agreed blocks, and it suspects the ordering service.

/// One way to rebuild the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Restore the checkpoint taken after this block, then replay the blocks after it.
    FromCheckpoint(u64),
    /// Drop everything and replay every block from the first.
    FullReplay,
}

/// The attempts, in order, given the blocks an organization holds checkpoints of (any
/// order) and the block it must reach: checkpoints newer than the target cannot help and
/// are left out.
pub fn attempts(checkpoints: &[u64], target: u64) -> Vec<Attempt> {
    let mut usable: Vec<u64> = checkpoints.iter().copied().filter(|block| *block < target).collect();
    usable.sort_unstable_by(|a, b| b.cmp(a));
    usable.dedup();
    usable.into_iter().map(Attempt::FromCheckpoint).chain([Attempt::FullReplay]).collect()
}

/// The checkpoints to drop after taking one, so that `keep` remain (the newest).
pub fn to_drop(checkpoints: &[u64], keep: usize) -> Vec<u64> {
    let mut sorted = checkpoints.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let excess = sorted.len().saturating_sub(keep);
    sorted.truncate(excess);
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_checkpoint_first_then_older_then_everything() {
        assert_eq!(
            attempts(&[41, 44, 38], 46),
            vec![
                Attempt::FromCheckpoint(44),
                Attempt::FromCheckpoint(41),
                Attempt::FromCheckpoint(38),
                Attempt::FullReplay
            ]
        );
        assert_eq!(attempts(&[], 3), vec![Attempt::FullReplay]);
        // A checkpoint of the block being recovered, or later, is not a starting point.
        assert_eq!(attempts(&[5, 6, 2], 5), vec![Attempt::FromCheckpoint(2), Attempt::FullReplay]);
    }

    #[test]
    fn the_oldest_checkpoints_go_beyond_the_kept_number() {
        assert_eq!(to_drop(&[9, 3, 6, 12], 3), vec![3]);
        assert_eq!(to_drop(&[9, 3], 3), Vec::<u64>::new());
        assert_eq!(to_drop(&[1, 2, 3, 4, 5], 3), vec![1, 2]);
    }
}
