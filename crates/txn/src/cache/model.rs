//! KAIROS's ideal lease model (seed 004 §4.2.3, equations 4.1–4.6 and Algorithm 3).
//!
//! One cache reads a key as a Poisson process with mean inter-read time `R`; the key is
//! written (by anyone) as a Poisson process of rate `λ = 1 / W`. A read that finds no entry,
//! or an expired one, misses and fetches the current version with a lease of length `d`; the
//! reads inside the lease hit. A hit is fresh if no write came since the fetch, stale
//! otherwise. Every rate here is per read, misses included, so fresh + stale + miss = 1.
//!
//! Each fetch starts a cycle: one miss, then on average `d / R` hits (4.1). With `W` the
//! time to the first write after the fetch, the hits before `min(W, d)` are fresh. By the
//! renewal-reward theorem the long-run rates are exactly the ratios of these expectations,
//! so for truly Poisson reads and writes the model is exact (the Monte Carlo check agrees).

/// What the model expects of one lease length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseOutcome {
    /// The lease length, in the unit of `R` and `W`.
    pub lease: f64,
    /// Hits served before the key's first write since the fetch, per read.
    pub fresh_hit_rate: f64,
    /// Hits served after it (a stale value, which validation must abort), per read.
    pub stale_rate: f64,
    /// Reads that went to the server, per read.
    pub miss_rate: f64,
}

/// The model's expectations for a lease of length `lease` with mean inter-read time
/// `read_interval` and mean inter-write time `write_interval` (any one time unit; an
/// infinite `write_interval` is a key never written). Zero or negative intervals and leases
/// are clamped to the smallest positive value, so the function is total.
pub fn outcome(read_interval: f64, write_interval: f64, lease: f64) -> LeaseOutcome {
    let read_interval = positive(read_interval);
    let lease = lease.max(0.0);
    let lambda = 1.0 / positive(write_interval);
    // (4.1): expected hits in one lease; each cycle is those hits and one miss.
    let hits = lease / read_interval;
    let reads_per_cycle = hits + 1.0;
    // (4.2, 4.3): the lease outlives the first write, or not.
    let no_write = (-lambda * lease).exp();
    let some_write = -(-lambda * lease).exp_m1();
    // (4.4) times Pr(W ≤ d): E[W; W ≤ d], the fresh part of a lease a write cut short.
    let fresh_time_if_written = fresh_time_before_write(lambda, lease);
    // (4.5) and (4.6), with the fresh part weighted already.
    let fresh = (no_write * lease + fresh_time_if_written) / read_interval;
    let stale = (some_write * lease - fresh_time_if_written) / read_interval;
    LeaseOutcome {
        lease,
        fresh_hit_rate: fresh / reads_per_cycle,
        stale_rate: stale.max(0.0) / reads_per_cycle,
        miss_rate: 1.0 / reads_per_cycle,
    }
}

/// `Pr(W ≤ d) · E[W | W ≤ d]` for an exponential `W` of rate `lambda`: equation 4.4 times
/// 4.3, `(1 − (λd + 1)e^{−λd}) / λ`, computed without the cancellation that formula has
/// when `λd` is small.
fn fresh_time_before_write(lambda: f64, lease: f64) -> f64 {
    let x = lambda * lease;
    if x < 1e-4 {
        // The series of 1 − (1 + x)e^{−x} is x²/2 − x³/3 + …
        return lease * x * (0.5 - x / 3.0);
    }
    (1.0 - (x + 1.0) * (-x).exp()) / lambda
}

fn positive(value: f64) -> f64 {
    if value.is_nan() || value <= 0.0 {
        f64::MIN_POSITIVE
    } else {
        value
    }
}

/// The lease that maximises the fresh-hit rate, searched as Algorithm 3 does: lengths
/// `k·R` for k = 1, 2, …, stopping at the first that does worse than the one before, and no
/// longer than `max_lease` (a key never written would lease forever). The seed's servers
/// run this per read; a server should memoise it (`ideal_multiple` depends on `R / W` only).
pub fn ideal_lease(read_interval: f64, write_interval: f64, max_lease: f64) -> LeaseOutcome {
    let read_interval = positive(read_interval);
    let max_k = (max_lease / read_interval).floor().clamp(1.0, MAX_STEPS);
    let mut best = outcome(read_interval, write_interval, read_interval);
    let mut k = 2.0;
    while k <= max_k {
        let next = outcome(read_interval, write_interval, k * read_interval);
        if next.fresh_hit_rate < best.fresh_hit_rate {
            break;
        }
        best = next;
        k += 1.0;
    }
    best
}

/// Algorithm 3's steps at most: a read interval far below the cap (a key read every
/// nanosecond, leased for seconds) would otherwise search for billions of steps.
const MAX_STEPS: f64 = (1u64 << 20) as f64;

/// The static lease P(x) of the seed's baselines: the length whose chance of a write
/// inside it is `x` (`1 − e^{−λd} = x`), for `x` in (0, 1).
pub fn static_lease(write_interval: f64, write_probability: f64) -> f64 {
    let x = write_probability.clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON);
    -(-x).ln_1p() * positive(write_interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's Fig. 4.5 setting: R = 1 ms, W = 19 ms.
    #[test]
    fn the_seed_example_peaks_at_six_read_intervals() {
        let best = ideal_lease(1.0, 19.0, 5_000.0);
        assert_eq!(best.lease, 6.0);
        assert!((best.fresh_hit_rate - 0.735).abs() < 0.001, "{best:?}");
        assert!((best.stale_rate - 0.122).abs() < 0.001, "{best:?}");
        // One lease shorter and one longer both do worse.
        assert!(outcome(1.0, 19.0, 5.0).fresh_hit_rate < best.fresh_hit_rate);
        assert!(outcome(1.0, 19.0, 7.0).fresh_hit_rate < best.fresh_hit_rate);
    }

    #[test]
    fn the_rates_of_a_read_add_up_to_one() {
        for (r, w, d) in [(1.0, 19.0, 6.0), (0.01, 1000.0, 3.0), (5.0, 0.1, 40.0), (1.0, f64::INFINITY, 9.0)] {
            let o = outcome(r, w, d);
            let total = o.fresh_hit_rate + o.stale_rate + o.miss_rate;
            assert!((total - 1.0).abs() < 1e-9, "{r} {w} {d}: {o:?}");
            assert!(o.fresh_hit_rate >= 0.0 && o.stale_rate >= 0.0, "{o:?}");
        }
    }

    #[test]
    fn a_key_never_written_leases_up_to_the_cap_and_never_goes_stale() {
        let best = ideal_lease(2.0, f64::INFINITY, 100.0);
        assert_eq!(best.lease, 100.0);
        assert_eq!(best.stale_rate, 0.0);
    }

    #[test]
    fn a_hot_written_key_gets_the_shortest_lease() {
        // Written ten times per read: any lease is mostly stale.
        assert_eq!(ideal_lease(1.0, 0.1, 1_000.0).lease, 1.0);
    }

    #[test]
    fn the_ideal_lease_scales_with_the_read_interval() {
        let a = ideal_lease(1.0, 50.0, 1e9);
        let b = ideal_lease(3.0, 150.0, 1e9);
        assert!((b.lease - 3.0 * a.lease).abs() < 1e-9);
        assert!((a.fresh_hit_rate - b.fresh_hit_rate).abs() < 1e-12);
    }

    #[test]
    fn a_static_lease_has_the_chosen_chance_of_a_write() {
        let d = static_lease(19.0, 0.26);
        assert!((-(-d / 19.0_f64).exp_m1() - 0.26).abs() < 1e-12);
    }

    #[test]
    fn degenerate_inputs_give_finite_answers() {
        for (r, w, d) in [(0.0, 0.0, 0.0), (-1.0, 5.0, 1.0), (f64::NAN, 1.0, 1.0), (1.0, 1.0, -3.0)] {
            let o = outcome(r, w, d);
            assert!(o.fresh_hit_rate.is_finite() && o.stale_rate.is_finite() && o.miss_rate.is_finite(), "{o:?}");
        }
        let best = ideal_lease(0.0, 1.0, 10.0);
        assert!(best.lease.is_finite());
    }
}
