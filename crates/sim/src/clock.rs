//! Each node's own clock, derived from virtual time.
//!
//! A node reads `EPOCH_BASE_NS + t + offset + drift · (t − t₀) + jitter`, where `t` is virtual
//! time and `t₀` the instant the node was added, forced monotonic: a core never sees its
//! clock go back, across restarts too (the machine's clock outlives the process).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_core::clock::Skew;

/// Where virtual time 0 sits on the Unix time line: 2023-11-14, so that timestamps a core
/// writes look like real ones.
pub const EPOCH_BASE_NS: u64 = 1_700_000_000_000_000_000;

/// Largest drift accepted, in ppm: beyond a rate error of ±10% nothing is physical.
pub const MAX_DRIFT_PPM: f64 = 100_000.0;

/// Largest offset or jitter accepted: an hour either way.
pub const MAX_OFFSET_NS: u64 = 3_600_000_000_000;

pub(crate) struct NodeClock {
    skew: Skew,
    drift: f64,
    added_at: u64,
    last: u64,
    /// Drawn from only when the skew has jitter.
    jitter_rng: StdRng,
}

/// Why a clock cannot follow a skew.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkewProblem {
    /// The drift as given (a float, possibly NaN, kept as its text).
    #[error("drift {0} ppm is not within ±{MAX_DRIFT_PPM}")]
    Drift(String),
    #[error("offset {0} ns is beyond ±{MAX_OFFSET_NS}")]
    Offset(i64),
    #[error("jitter {0} ns is beyond {MAX_OFFSET_NS}")]
    Jitter(u64),
}

impl NodeClock {
    pub(crate) fn new(skew: Skew, added_at: u64, jitter_seed: u64) -> Self {
        NodeClock {
            skew,
            drift: skew.drift_ppm * 1e-6,
            added_at,
            last: 0,
            jitter_rng: StdRng::seed_from_u64(jitter_seed),
        }
    }

    /// Whether `skew` is one a clock can follow; the reason if not.
    pub(crate) fn check(skew: &Skew) -> Result<(), SkewProblem> {
        if !skew.drift_ppm.is_finite() || skew.drift_ppm.abs() > MAX_DRIFT_PPM {
            return Err(SkewProblem::Drift(skew.drift_ppm.to_string()));
        }
        if skew.offset_ns.unsigned_abs() > MAX_OFFSET_NS {
            return Err(SkewProblem::Offset(skew.offset_ns));
        }
        if skew.jitter_ns > MAX_OFFSET_NS {
            return Err(SkewProblem::Jitter(skew.jitter_ns));
        }
        Ok(())
    }

    pub(crate) fn skew(&self) -> Skew {
        self.skew
    }

    /// The node's reading at virtual time `time`.
    pub(crate) fn read(&mut self, time: u64) -> u64 {
        let elapsed = time.saturating_sub(self.added_at);
        let drift = (elapsed as f64 * self.drift).round() as i64;
        let jitter = if self.skew.jitter_ns == 0 {
            0
        } else {
            let bound = self.skew.jitter_ns as i64;
            self.jitter_rng.random_range(-bound..=bound)
        };
        let reading = i128::from(EPOCH_BASE_NS)
            + i128::from(time)
            + i128::from(self.skew.offset_ns)
            + i128::from(drift)
            + i128::from(jitter);
        let reading = u64::try_from(reading.max(0)).unwrap_or(u64::MAX);
        self.last = self.last.max(reading);
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_and_drift_apply_from_the_time_the_node_was_added() {
        let skew = Skew { offset_ns: -500, drift_ppm: 10.0, jitter_ns: 0 };
        let mut clock = NodeClock::new(skew, 1_000, 1);
        assert_eq!(clock.read(1_000), EPOCH_BASE_NS + 1_000 - 500);
        // 1 s after being added, 10 ppm is 10 µs fast.
        assert_eq!(clock.read(1_000_001_000), EPOCH_BASE_NS + 1_000_001_000 - 500 + 10_000);
    }

    #[test]
    fn readings_never_go_back_under_jitter() {
        let skew = Skew { offset_ns: 0, drift_ppm: 0.0, jitter_ns: 1_000 };
        let mut clock = NodeClock::new(skew, 0, 7);
        let mut last = 0;
        for time in (0..10_000).map(|step| step * 10) {
            let reading = clock.read(time);
            assert!(reading >= last);
            assert!(reading.abs_diff(EPOCH_BASE_NS + time) <= 1_000 || reading == last);
            last = reading;
        }
    }

    #[test]
    fn wild_skews_are_refused() {
        assert!(NodeClock::check(&Skew { offset_ns: 0, drift_ppm: f64::NAN, jitter_ns: 0 }).is_err());
        assert!(NodeClock::check(&Skew { offset_ns: 0, drift_ppm: 2e5, jitter_ns: 0 }).is_err());
        assert!(NodeClock::check(&Skew { offset_ns: i64::MIN, drift_ppm: 0.0, jitter_ns: 0 }).is_err());
        assert!(NodeClock::check(&Skew { offset_ns: 5, drift_ppm: -3.0, jitter_ns: 10 }).is_ok());
    }
}
