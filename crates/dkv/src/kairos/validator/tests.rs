//! The validator against an oracle that knows every committed version: over random
//! histories (blind writes from lagging clocks, read-only transactions reading versions
//! as of some past time, cached or not, garbage collection at any point), a read voted
//! commit must have read the newest version at its commit timestamp, and a write voted commit
//! must lie above every read voted commit on its key and every version committed before it.
//! Without collection the validator is exact: every valid read passes. Each weakened
//! validator is caught.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const KEYS: u64 = 4;
/// The most a writer's clock lags.
const MAX_LAG: u64 = 3;

fn key(index: u64) -> Bytes {
    Bytes::from(format!("k{index}"))
}

fn ts(time: u64, id: u32) -> Timestamp {
    Timestamp::new(time, id)
}

/// What the oracle saw go wrong, if anything.
#[derive(Debug, Default)]
struct Outcome {
    violations: Vec<String>,
    valid_reads_refused: usize,
    reads_passed: usize,
}

/// The newest committed version of `key` at or below `at`.
fn newest_at(versions: &[Vec<Timestamp>], key: u64, at: Timestamp) -> Timestamp {
    versions[key as usize].iter().copied().filter(|version| *version <= at).max().unwrap_or(Timestamp::ZERO)
}

/// One random history of `events` steps against a validator weakened by `weakening`.
fn history(seed: u64, events: u64, collect: bool, weakening: ValidatorWeakening) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut validator = ValidatorState::new(Timestamp::ZERO);
    validator.weaken(weakening);
    let mut versions: Vec<Vec<Timestamp>> = (0..KEYS).map(|_| Vec::new()).collect();
    let mut reads_at: Vec<Timestamp> = vec![Timestamp::ZERO; KEYS as usize];
    let mut outcome = Outcome::default();
    for event in 0..events {
        let now = 10 + event;
        let id = event as u32 + 1;
        match rng.random_range(0..10) {
            0..=3 => {
                // A blind write from a clock up to MAX_LAG behind.
                let k = rng.random_range(0..KEYS);
                let commit_ts = ts(now - rng.random_range(0..=MAX_LAG), id);
                let writes = [key(k)];
                let validation =
                    Validation { txn: u64::from(id), commit_ts, freshness: commit_ts, reads: &[], writes: &writes };
                if validator.validate(&validation).is_ok() {
                    let newest = versions[k as usize].iter().copied().max().unwrap_or(Timestamp::ZERO);
                    if commit_ts <= reads_at[k as usize] || commit_ts <= newest {
                        outcome.violations.push(format!("write of k{k} at {commit_ts:?} below a read or a version"));
                    }
                    let commit = rng.random_range(0..4) != 0;
                    validator.decide(u64::from(id), commit);
                    if commit {
                        versions[k as usize].push(commit_ts);
                    }
                }
            }
            4..=8 => {
                // A read-only transaction of one or two keys, each read as of a past time no
                // later write can fall below (its freshness), from a cache or not.
                let count = rng.random_range(1..=2);
                let mut reads = Vec::new();
                let mut freshness = Timestamp::new(now, 0);
                for _ in 0..count {
                    let k = rng.random_range(0..KEYS);
                    if reads.iter().any(|read: &ReadOp| read.key == key(k)) {
                        continue;
                    }
                    let seen_at = ts(now.saturating_sub(MAX_LAG + 1 + rng.random_range(0..8)), 0);
                    let version = newest_at(&versions, k, seen_at);
                    reads.push(ReadOp { key: key(k), version, cached: rng.random_range(0..2) == 0 });
                    freshness = freshness.min(seen_at);
                }
                let commit_ts = ts(now, id);
                let valid = reads.iter().all(|read| {
                    let index = read.key[1] - b'0';
                    newest_at(&versions, u64::from(index), commit_ts) == read.version
                });
                let validation = Validation { txn: u64::from(id), commit_ts, freshness, reads: &reads, writes: &[] };
                match validator.validate(&validation) {
                    Ok(()) => {
                        outcome.reads_passed += 1;
                        if !valid {
                            outcome.violations.push(format!("a stale read passed: {reads:?} at {commit_ts:?}"));
                        }
                        for read in &reads {
                            let index = usize::from(read.key[1] - b'0');
                            reads_at[index] = reads_at[index].max(commit_ts);
                        }
                    }
                    Err(_) if valid => outcome.valid_reads_refused += 1,
                    Err(_) => {}
                }
            }
            _ if collect => validator.collect(ts(now.saturating_sub(rng.random_range(0..12)), 0)),
            _ => {}
        }
    }
    outcome
}

#[test]
fn no_stale_read_or_write_below_a_read_passes_whatever_is_collected() {
    let mut passed = 0;
    for seed in 0..2_000 {
        let outcome = history(seed, 60, true, ValidatorWeakening::default());
        assert!(outcome.violations.is_empty(), "seed {seed}: {:?}", outcome.violations);
        passed += outcome.reads_passed;
    }
    assert!(passed > 10_000, "only {passed} reads passed: the histories test little");
}

#[test]
fn without_collection_every_valid_read_passes() {
    for seed in 0..500 {
        let outcome = history(seed, 60, false, ValidatorWeakening::default());
        assert!(outcome.violations.is_empty(), "seed {seed}: {:?}", outcome.violations);
        assert_eq!(outcome.valid_reads_refused, 0, "seed {seed}");
    }
}

#[test]
fn a_validator_that_skips_the_freshness_check_is_caught() {
    let weakening = ValidatorWeakening { skip_freshness: true, ..ValidatorWeakening::default() };
    let caught = (0..2_000).find_map(|seed| history(seed, 60, true, weakening).violations.into_iter().next());
    let violation =
        caught.unwrap_or_else(|| panic!("no history caught a validator reading collected state as current"));
    assert!(violation.starts_with("a stale read passed"), "{violation}");
}

#[test]
fn a_validator_that_skips_the_check_of_cached_reads_is_caught() {
    let weakening = ValidatorWeakening { skip_cached_latest_committed: true, ..ValidatorWeakening::default() };
    let caught = (0..200).find_map(|seed| history(seed, 60, false, weakening).violations.into_iter().next());
    let violation = caught.unwrap_or_else(|| panic!("no history caught a stale cached read passing"));
    assert!(violation.starts_with("a stale read passed"), "{violation}");
}

#[test]
fn a_prepared_write_holds_its_key_until_decided() {
    let mut validator = ValidatorState::new(Timestamp::ZERO);
    let writes = [key(0)];
    let write = Validation { txn: 1, commit_ts: ts(20, 1), freshness: ts(20, 1), reads: &[], writes: &writes };
    assert_eq!(validator.validate(&write), Ok(()));
    assert_eq!(validator.validate(&write), Ok(()), "a retried request is voted the same");
    let reads = [ReadOp { key: key(0), version: Timestamp::ZERO, cached: true }];
    let read = Validation { txn: 2, commit_ts: ts(30, 2), freshness: ts(15, 0), reads: &reads, writes: &[] };
    assert_eq!(validator.validate(&read), Err(ValidatorAbort::Check(AbortReason::ReadPrepared)));
    validator.decide(1, true);
    assert_eq!(validator.validate(&read), Err(ValidatorAbort::Check(AbortReason::ReadStale)));
    let fresh = [ReadOp { key: key(0), version: ts(20, 1), cached: false }];
    let read = Validation { txn: 3, commit_ts: ts(30, 3), freshness: ts(25, 0), reads: &fresh, writes: &[] };
    assert_eq!(validator.validate(&read), Ok(()));
    let late = Validation { txn: 4, commit_ts: ts(28, 4), freshness: ts(28, 4), reads: &[], writes: &writes };
    assert_eq!(validator.validate(&late), Err(ValidatorAbort::Check(AbortReason::WriteAfterRead)));
}

#[test]
fn collection_drops_settled_state_and_refuses_what_it_can_no_longer_judge() {
    let mut validator = ValidatorState::new(Timestamp::ZERO);
    let writes = [key(1)];
    let write = Validation { txn: 1, commit_ts: ts(20, 1), freshness: ts(20, 1), reads: &[], writes: &writes };
    assert_eq!(validator.validate(&write), Ok(()));
    validator.decide(1, true);
    validator.collect(ts(30, 0));
    assert!(validator.is_empty());
    assert_eq!(validator.floor(), ts(30, 0));
    validator.collect(ts(25, 0));
    assert_eq!(validator.floor(), ts(30, 0), "the floor never falls");
    // Known unsuperseded up to 35, above the floor: the version read is the newest.
    let reads = [ReadOp { key: key(1), version: ts(20, 1), cached: true }];
    let read = Validation { txn: 2, commit_ts: ts(40, 2), freshness: ts(35, 0), reads: &reads, writes: &[] };
    assert_eq!(validator.validate(&read), Ok(()));
    // A copy older than the floor could have missed a version the floor hides.
    let old = [ReadOp { key: key(2), version: Timestamp::ZERO, cached: true }];
    let read = Validation { txn: 3, commit_ts: ts(40, 3), freshness: ts(12, 0), reads: &old, writes: &[] };
    assert_eq!(validator.validate(&read), Err(ValidatorAbort::BelowGc));
    let writes = [key(3)];
    let low = Validation { txn: 4, commit_ts: ts(29, 4), freshness: ts(29, 4), reads: &[], writes: &writes };
    assert_eq!(validator.validate(&low), Err(ValidatorAbort::Check(AbortReason::WriteAfterRead)));
}

#[test]
fn keys_spread_over_the_validators() {
    let mut counts = [0u32; 5];
    for index in 0..5_000u64 {
        counts[validator_of(&key(index), 5) as usize] += 1;
    }
    assert!(counts.iter().all(|count| (800..1_200).contains(count)), "{counts:?}");
    assert_eq!(validator_of(b"x", 0), 0, "no validator count divides by zero");
}
