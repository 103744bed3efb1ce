//! A Monte Carlo run of one cache and one key, beside the lease model: Poisson reads and
//! writes drawn from a seeded generator, a fixed lease, and the hits counted as they happen.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::LeaseOutcome;

/// Simulates `reads` Poisson reads (mean gap `read_interval`) of a key written as a Poisson
/// process (mean gap `write_interval`; infinite: never), each miss fetching with a lease of
/// `lease`; returns the rates per read as [`super::outcome`] predicts them.
pub fn simulate(read_interval: f64, write_interval: f64, lease: f64, reads: u64, seed: u64) -> LeaseOutcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut exponential = |mean: f64| {
        let u: f64 = rng.random();
        -mean * (-u).ln_1p()
    };
    let never_written = !write_interval.is_finite();
    let mut now = 0.0;
    let mut next_write = if never_written { f64::INFINITY } else { exponential(write_interval) };
    let mut last_write = f64::NEG_INFINITY;
    // The cached entry: when it was fetched and when its lease ends.
    let mut entry: Option<(f64, f64)> = None;
    let (mut fresh, mut stale, mut misses) = (0u64, 0u64, 0u64);
    for _ in 0..reads {
        now += exponential(read_interval);
        while next_write <= now {
            last_write = next_write;
            next_write += exponential(write_interval);
        }
        match entry {
            Some((fetched, lease_end)) if now < lease_end => {
                if last_write < fetched {
                    fresh += 1;
                } else {
                    stale += 1;
                }
            }
            _ => {
                misses += 1;
                entry = Some((now, now + lease));
            }
        }
    }
    let per_read = |count: u64| count as f64 / reads.max(1) as f64;
    LeaseOutcome { lease, fresh_hit_rate: per_read(fresh), stale_rate: per_read(stale), miss_rate: per_read(misses) }
}

#[cfg(test)]
mod tests {
    use super::super::model::{ideal_lease, outcome};
    use super::*;

    /// The model against 10^7 simulated reads a point: for Poisson arrivals it is exact in
    /// the long run, so the two agree to well within 0.005 (the sampling error at this count
    /// is about 0.0003).
    #[test]
    fn the_model_matches_ten_million_simulated_reads() {
        let points = [
            (1.0, 19.0, ideal_lease(1.0, 19.0, 5_000.0).lease),
            (1.0, 19.0, 15.0),
            (2.0, 500.0, ideal_lease(2.0, 500.0, 5_000.0).lease),
            (1.0, 3.0, 1.0),
        ];
        for (seed, (r, w, d)) in points.into_iter().enumerate() {
            let model = outcome(r, w, d);
            let simulated = simulate(r, w, d, 10_000_000, seed as u64);
            let fresh = (model.fresh_hit_rate - simulated.fresh_hit_rate).abs();
            let stale = (model.stale_rate - simulated.stale_rate).abs();
            assert!(fresh < 0.005 && stale < 0.005, "R={r} W={w} d={d}: model {model:?}, simulated {simulated:?}");
        }
    }

    /// The checker of the model must be able to fail: a model that forgets stale hits are
    /// not fresh (counting every hit fresh) is far off the simulation.
    #[test]
    fn a_model_that_counts_every_hit_fresh_is_caught() {
        let model = outcome(1.0, 19.0, 6.0);
        let broken_fresh = model.fresh_hit_rate + model.stale_rate;
        let simulated = simulate(1.0, 19.0, 6.0, 1_000_000, 7);
        assert!((broken_fresh - simulated.fresh_hit_rate).abs() > 0.05);
    }

    #[test]
    fn a_key_never_written_has_no_stale_hit() {
        let simulated = simulate(1.0, f64::INFINITY, 10.0, 100_000, 3);
        assert_eq!(simulated.stale_rate, 0.0);
        assert!(simulated.fresh_hit_rate > 0.85);
    }
}
