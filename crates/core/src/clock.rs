//! Clocks that timestamp transactions: the system clock, per-client skewed clocks that
//! reproduce the clock synchronisation measured in the MILANA evaluation, a manual clock for
//! tests, and a hybrid logical clock (HLC) as used by DST.
//!
//! Every [`Clock`] is monotonic per instance: concurrency control built on timestamps
//! (watermarks, version ordering) relies on a client never seeing its own time go back, so
//! each clock remembers its last reading and never returns less, even when the time source
//! under it steps backwards.
//!
//! ```
//! use virga_core::clock::{Clock, HybridClock, SkewProfile, SkewedClock};
//!
//! let mut client = SkewedClock::new(SkewProfile::Ptp, 7, 42);
//! let a = client.now_ns();
//! assert!(client.now_ns() >= a);
//!
//! let mut hlc = HybridClock::new(client);
//! let t1 = hlc.now();
//! hlc.observe(t1 + 1_000);
//! assert!(hlc.now() > t1 + 1_000);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of timestamps: nanoseconds since the Unix epoch.
///
/// Implementations must be monotonic per instance: a call never returns less than an earlier
/// call on the same instance returned. `&mut self` lets a clock keep that memory (and any
/// random state) without synchronisation; give each thread or client its own instance.
pub trait Clock: Send {
    /// The current time in nanoseconds since the Unix epoch.
    fn now_ns(&mut self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now_ns(&mut self) -> u64 {
        (**self).now_ns()
    }
}

/// The machine's clock.
///
/// The wall-clock time is read once, at construction; later readings add the time elapsed
/// on the monotonic clock ([`Instant`]). That keeps readings cheap and immune to the wall
/// clock being stepped (by NTP or an administrator) while the process runs, at the price of
/// not following such steps. Clones share the anchor, so clones handed to different threads
/// agree with each other exactly.
#[derive(Clone, Debug)]
pub struct SystemClock {
    anchor_ns: u64,
    anchor: Instant,
    last: u64,
}

impl SystemClock {
    /// Anchors a new clock at the current wall-clock time. A wall clock set before 1970 is
    /// taken as the epoch itself.
    pub fn new() -> Self {
        let anchor = Instant::now();
        let anchor_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX));
        SystemClock { anchor_ns, anchor, last: 0 }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&mut self) -> u64 {
        let elapsed = u64::try_from(self.anchor.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // `Instant` is documented as monotonic, but platforms have shipped bugs there; the
        // comparison costs nothing next to the clock read.
        self.last = self.last.max(self.anchor_ns.saturating_add(elapsed));
        self.last
    }
}

/// A clock whose time is set by hand, for tests and simulations in virtual time.
///
/// Clones share the time: a test keeps one clone to [`set`](ManualClock::set) or
/// [`advance`](ManualClock::advance) it and hands others to the code under test. Each clone
/// still reads monotonically on its own, so setting the time back makes readers stall at
/// their last reading instead of going back.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    time: Arc<AtomicU64>,
    last: u64,
}

impl ManualClock {
    /// A clock reading `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        ManualClock { time: Arc::new(AtomicU64::new(start_ns)), last: 0 }
    }

    /// Sets the shared time, possibly backwards.
    pub fn set(&self, ns: u64) {
        self.time.store(ns, Ordering::SeqCst);
    }

    /// Moves the shared time forward by `delta_ns`, saturating at `u64::MAX`.
    pub fn advance(&self, delta_ns: u64) {
        // The closure always returns `Some`, so the update cannot fail.
        let _ = self.time.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(delta_ns)));
    }

    /// The shared time as last set, ignoring this clone's monotonic floor.
    pub fn get(&self) -> u64 {
        self.time.load(Ordering::SeqCst)
    }
}

impl Clock for ManualClock {
    fn now_ns(&mut self) -> u64 {
        self.last = self.last.max(self.time.load(Ordering::SeqCst));
        self.last
    }
}

/// Mean absolute clock offset with PTP software timestamping, in nanoseconds: 53.2 µs, as
/// measured among the MILANA clients (seed 004, Fig. 3.6).
pub const PTP_MEAN_SKEW_NS: u64 = 53_200;

/// Mean absolute clock offset with NTP, in nanoseconds: 1.51 ms, as measured among the
/// MILANA clients (seed 004, Fig. 3.6).
pub const NTP_MEAN_SKEW_NS: u64 = 1_510_000;

/// How well a simulated client's clock is synchronised.
///
/// Each profile defines the distribution a client's clock error is drawn from by
/// [`SkewProfile::draw`]:
///
/// * **offset**: uniform on `[-2m, +2m]`, where `m` is the profile's measured average skew
///   ([`mean_abs_offset_ns`](SkewProfile::mean_abs_offset_ns)), so that the mean absolute
///   offset from the true time is `m`. The seed reports only the average, so the uniform
///   shape (and its hard bound of `2m`) is an assumption. The seed's "average skew among
///   clients" is read as each client's distance from the true time; under this model two
///   clients are on average `4m/3` apart.
/// * **drift**: uniform on `[-d, +d]` parts per million, where `d` is
///   [`max_drift_ppm`](SkewProfile::max_drift_ppm). The seed does not measure drift; the
///   values (1 ppm for PTP, which keeps disciplining the clock tightly, 10 ppm for NTP) are
///   assumptions in line with commodity oscillators under each protocol.
/// * **jitter**: every reading adds noise uniform on `[-j, +j]` with `j` one tenth of `m`
///   ([`max_jitter_ns`](SkewProfile::max_jitter_ns)), also an assumption.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SkewProfile {
    /// Perfect synchronisation: every client reads the true time.
    #[default]
    None,
    /// PTP with software timestamping: 53.2 µs average skew.
    Ptp,
    /// NTP: 1.51 ms average skew.
    Ntp,
}

impl SkewProfile {
    /// Every profile, in order of increasing skew.
    pub const ALL: [SkewProfile; 3] = [SkewProfile::None, SkewProfile::Ptp, SkewProfile::Ntp];

    /// The profile's name, as the command line spells it: `none`, `ptp` or `ntp`.
    pub fn name(self) -> &'static str {
        match self {
            SkewProfile::None => "none",
            SkewProfile::Ptp => "ptp",
            SkewProfile::Ntp => "ntp",
        }
    }

    /// Mean absolute offset of a client clock from the true time, in nanoseconds.
    pub fn mean_abs_offset_ns(self) -> u64 {
        match self {
            SkewProfile::None => 0,
            SkewProfile::Ptp => PTP_MEAN_SKEW_NS,
            SkewProfile::Ntp => NTP_MEAN_SKEW_NS,
        }
    }

    /// Largest absolute offset the profile draws: twice the mean.
    pub fn max_offset_ns(self) -> u64 {
        2 * self.mean_abs_offset_ns()
    }

    /// Largest absolute drift the profile draws, in parts per million.
    pub fn max_drift_ppm(self) -> f64 {
        match self {
            SkewProfile::None => 0.0,
            SkewProfile::Ptp => 1.0,
            SkewProfile::Ntp => 10.0,
        }
    }

    /// Bound of the per-reading noise, in nanoseconds: a tenth of the mean offset.
    pub fn max_jitter_ns(self) -> u64 {
        self.mean_abs_offset_ns() / 10
    }

    /// The clock error of client `client_id` in the simulation seeded with `seed`.
    /// Deterministic: the same arguments always give the same error.
    pub fn draw(self, client_id: u64, seed: u64) -> Skew {
        let mut rng = SplitMix64::for_client(seed, client_id);
        let magnitude = rng.next_unit() * self.max_offset_ns() as f64;
        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        let drift = (2.0 * rng.next_unit() - 1.0) * self.max_drift_ppm();
        Skew { offset_ns: (sign * magnitude).round() as i64, drift_ppm: drift, jitter_ns: self.max_jitter_ns() }
    }
}

impl fmt::Display for SkewProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of one simulated clock relative to the true time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Skew {
    /// Constant offset, in nanoseconds; positive means the clock runs ahead.
    pub offset_ns: i64,
    /// Rate error in parts per million; positive means the clock runs fast. The error it
    /// causes grows with the time elapsed since the clock was created.
    pub drift_ppm: f64,
    /// Bound of the uniform noise added to every reading, in nanoseconds.
    pub jitter_ns: u64,
}

/// Largest jitter bound accepted; keeps `2 * jitter + 1` and the sums of a reading in range.
const MAX_JITTER_NS: u64 = 1 << 60;

/// Largest drift accepted, in ppm. Beyond a rate error of -100% the modelled clock would run
/// backwards; 10% is already far outside anything physical.
const MAX_DRIFT_PPM: f64 = 100_000.0;

/// A client clock that is off from its base clock by `offset + drift · elapsed + jitter`,
/// forced monotonic.
///
/// The base is the "true" time: the system clock by default, or any [`Clock`] (a
/// [`ManualClock`] to run in virtual time). Reading costs one base reading, a multiply and,
/// when jitter is on, a xorshift step: cheap enough for two readings per transaction at
/// millions of transactions per second.
///
/// Because readings are forced monotonic, a negative jitter draw right after a positive one
/// returns the previous reading again; readings closer together than the jitter bound can be
/// equal.
#[derive(Clone, Debug)]
pub struct SkewedClock<C: Clock = SystemClock> {
    base: C,
    skew: Skew,
    /// Base reading at construction; drift accumulates from here.
    start_ns: u64,
    /// `drift_ppm` as a fraction, precomputed for the hot path.
    drift: f64,
    /// Number of distinct jitter values, `2 * jitter_ns + 1`.
    jitter_span: u64,
    /// xorshift64 state; never zero.
    rng: u64,
    last: u64,
}

impl SkewedClock<SystemClock> {
    /// The clock of client `client_id` in a simulation seeded with `seed`, on top of the
    /// system clock, with an error drawn from `profile` (see [`SkewProfile::draw`]).
    pub fn new(profile: SkewProfile, client_id: u64, seed: u64) -> Self {
        Self::with_base(SystemClock::new(), profile, client_id, seed)
    }

    /// A clock on top of the system clock with an explicit error; `seed` drives the jitter.
    pub fn with_params(offset_ns: i64, drift_ppm: f64, jitter_ns: u64, seed: u64) -> Self {
        Self::with_skew(SystemClock::new(), Skew { offset_ns, drift_ppm, jitter_ns }, seed)
    }
}

impl<C: Clock> SkewedClock<C> {
    /// Like [`SkewedClock::new`], on top of `base`.
    pub fn with_base(base: C, profile: SkewProfile, client_id: u64, seed: u64) -> Self {
        let skew = profile.draw(client_id, seed);
        // A different stream than the one `draw` used, so jitter is independent of the offset.
        let jitter_seed = SplitMix64::for_client(seed ^ 0x6a09_e667_f3bc_c908, client_id).next_u64();
        Self::with_skew(base, skew, jitter_seed)
    }

    /// A clock on top of `base` with an explicit error; `seed` drives the jitter.
    ///
    /// A drift that is not finite counts as zero, and drifts beyond ±10% are clamped to it, so
    /// the modelled clock always moves forward with its base.
    pub fn with_skew(mut base: C, skew: Skew, seed: u64) -> Self {
        let drift_ppm =
            if skew.drift_ppm.is_finite() { skew.drift_ppm.clamp(-MAX_DRIFT_PPM, MAX_DRIFT_PPM) } else { 0.0 };
        let jitter_ns = skew.jitter_ns.min(MAX_JITTER_NS);
        let skew = Skew { offset_ns: skew.offset_ns, drift_ppm, jitter_ns };
        let start_ns = base.now_ns();
        SkewedClock {
            base,
            skew,
            start_ns,
            drift: drift_ppm * 1e-6,
            jitter_span: 2 * jitter_ns + 1,
            rng: SplitMix64::new(seed).next_u64() | 1,
            last: 0,
        }
    }

    /// The error this clock models.
    pub fn skew(&self) -> Skew {
        self.skew
    }

    /// The clock this one is skewed from.
    pub fn base(&self) -> &C {
        &self.base
    }

    /// Uniform on `[-jitter_ns, +jitter_ns]`.
    #[inline]
    fn next_jitter(&mut self) -> i64 {
        if self.jitter_span == 1 {
            return 0;
        }
        // xorshift64: a handful of instructions, plenty for noise.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        // Multiply-shift maps x onto [0, span) without a division.
        let draw = ((u128::from(x) * u128::from(self.jitter_span)) >> 64) as u64;
        draw as i64 - self.skew.jitter_ns as i64
    }
}

impl<C: Clock> Clock for SkewedClock<C> {
    #[inline]
    fn now_ns(&mut self) -> u64 {
        let true_ns = self.base.now_ns();
        let elapsed = true_ns.saturating_sub(self.start_ns);
        // The cast saturates; with |drift| ≤ 10% it cannot overflow anyway.
        let drift = (elapsed as f64 * self.drift).round() as i64;
        let jitter = self.next_jitter();
        let reading = i128::from(true_ns) + i128::from(self.skew.offset_ns) + i128::from(drift) + i128::from(jitter);
        let reading = u64::try_from(reading.max(0)).unwrap_or(u64::MAX);
        self.last = self.last.max(reading);
        self.last
    }
}

/// SplitMix64: a tiny, well-mixed generator for the deterministic per-client draws.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A stream for `client_id` that differs from every other client's under the same seed.
    fn for_client(seed: u64, client_id: u64) -> Self {
        let client = SplitMix64::new(client_id ^ 0x9e37_79b9_7f4a_7c15).next_u64();
        SplitMix64::new(seed ^ client)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform on `[0, 1)` with 53 random bits.
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Bits of an HLC timestamp holding the logical counter.
pub const HLC_LOGICAL_BITS: u32 = 16;

const HLC_LOGICAL_MASK: u64 = (1 << HLC_LOGICAL_BITS) - 1;

const NANOS_PER_MILLI: u64 = 1_000_000;

/// A hybrid logical clock, with timestamps laid out as in DST: the upper 48 bits are physical
/// time in milliseconds since the Unix epoch, the lower 16 bits a logical counter.
///
/// Timestamps order events causally: every [`now`](HybridClock::now) is larger than every
/// earlier `now` of the same clock and than every timestamp passed to
/// [`observe`](HybridClock::observe) before it. While the physical clock advances they track
/// it; when events come faster than one per millisecond, or a remote clock is ahead, the
/// logical counter takes over. A counter overflow carries into the physical part, which
/// then runs ahead of the physical clock until the latter catches up: the order is never
/// broken.
///
/// 48 bits of milliseconds last until the year 10889. Past that (or after observing a
/// timestamp of `u64::MAX`) the clock saturates and `now` stops increasing; use
/// [`observe_bounded`](HybridClock::observe_bounded) for timestamps from untrusted peers.
#[derive(Clone, Debug)]
pub struct HybridClock<C: Clock = SystemClock> {
    physical: C,
    /// The largest timestamp issued or observed.
    last: u64,
}

/// Timestamp helpers. They do not depend on the physical clock, and live on the default
/// instantiation only so that `HybridClock::physical_ms(ts)` needs no type annotation.
impl HybridClock {
    /// Physical part of `ts`: milliseconds since the Unix epoch.
    #[inline]
    pub fn physical_ms(ts: u64) -> u64 {
        ts >> HLC_LOGICAL_BITS
    }

    /// Logical counter of `ts`.
    #[inline]
    pub fn logical(ts: u64) -> u16 {
        (ts & HLC_LOGICAL_MASK) as u16
    }

    /// The timestamp with physical part `physical_ms` (truncated to 48 bits) and counter
    /// `logical`.
    #[inline]
    pub fn compose(physical_ms: u64, logical: u16) -> u64 {
        (physical_ms << HLC_LOGICAL_BITS) | u64::from(logical)
    }
}

impl<C: Clock> HybridClock<C> {
    /// A clock reading its physical time from `physical`.
    pub fn new(physical: C) -> Self {
        HybridClock { physical, last: 0 }
    }

    /// Timestamp of a local or send event: larger than anything this clock issued or observed
    /// before, and at least the physical time with a zero counter.
    #[inline]
    pub fn now(&mut self) -> u64 {
        // 2^64 ns is about 1.8e13 ms, well inside 48 bits: the shift cannot lose bits.
        let wall = (self.physical.now_ns() / NANOS_PER_MILLI) << HLC_LOGICAL_BITS;
        // Adding one to the packed value increments the counter and, when the counter is
        // full, carries into the milliseconds: both orders agree.
        self.last = if wall > self.last { wall } else { self.last.saturating_add(1) };
        self.last
    }

    /// Records a receive event carrying `remote`: every later [`now`](HybridClock::now) is
    /// larger than `remote`.
    #[inline]
    pub fn observe(&mut self, remote: u64) {
        self.last = self.last.max(remote);
    }

    /// Like [`observe`](HybridClock::observe), but refuses a timestamp whose physical part is
    /// more than `max_ahead` ahead of the local physical clock. A peer with a broken clock
    /// (or a forged message) could otherwise drag this clock arbitrarily far into the future.
    pub fn observe_bounded(&mut self, remote: u64, max_ahead: Duration) -> Result<(), HlcError> {
        let local_ms = self.physical.now_ns() / NANOS_PER_MILLI;
        let remote_ms = HybridClock::physical_ms(remote);
        let max_ahead_ms = u64::try_from(max_ahead.as_millis()).unwrap_or(u64::MAX);
        if remote_ms > local_ms.saturating_add(max_ahead_ms) {
            return Err(HlcError::RemoteTooFarAhead { remote_ms, local_ms, max_ahead_ms });
        }
        self.observe(remote);
        Ok(())
    }

    /// The largest timestamp issued or observed so far (0 initially).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The physical clock.
    pub fn physical_clock(&self) -> &C {
        &self.physical
    }
}

/// Errors of [`HybridClock`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HlcError {
    /// [`HybridClock::observe_bounded`] got a timestamp too far in the future.
    #[error(
        "remote timestamp is at {remote_ms} ms, more than {max_ahead_ms} ms ahead of the local clock at {local_ms} ms"
    )]
    RemoteTooFarAhead {
        /// Physical part of the remote timestamp, in ms since the Unix epoch.
        remote_ms: u64,
        /// Local physical time, in ms since the Unix epoch.
        local_ms: u64,
        /// The bound that was exceeded.
        max_ahead_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A base clock that replays a script, including steps backwards, to check that the
    /// clocks built on top of it stay monotonic. It deliberately breaks the `Clock` contract.
    struct Script {
        readings: Vec<u64>,
        next: usize,
    }

    impl Script {
        fn new(readings: &[u64]) -> Self {
            Script { readings: readings.to_vec(), next: 0 }
        }
    }

    impl Clock for Script {
        fn now_ns(&mut self) -> u64 {
            let reading = self.readings[self.next.min(self.readings.len() - 1)];
            self.next += 1;
            reading
        }
    }

    fn assert_non_decreasing(readings: &[u64]) {
        for pair in readings.windows(2) {
            assert!(pair[0] <= pair[1], "clock went back from {} to {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn system_clock_tracks_wall_time_and_never_goes_back() {
        let mut clock = SystemClock::new();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        let first = clock.now_ns();
        assert!(first.abs_diff(wall) < 1_000_000_000, "system clock {first} is far from the wall clock {wall}");
        let readings: Vec<u64> = (0..10_000).map(|_| clock.now_ns()).collect();
        assert_non_decreasing(&readings);
        assert!(readings[0] >= first);
    }

    #[test]
    fn manual_clock_is_shared_between_clones_and_monotonic_per_clone() {
        let control = ManualClock::new(100);
        let mut reader = control.clone();
        assert_eq!(reader.now_ns(), 100);
        control.advance(50);
        assert_eq!(reader.now_ns(), 150);
        control.set(20);
        assert_eq!(reader.now_ns(), 150, "a step back must not show");
        assert_eq!(control.get(), 20);
        // A clone made now has no reading history, so it sees the raw time.
        assert_eq!(control.clone().now_ns(), 20);
        control.set(u64::MAX - 1);
        control.advance(10);
        assert_eq!(reader.now_ns(), u64::MAX);
    }

    #[test]
    fn skewed_clock_stays_monotonic_when_its_base_jumps_back() {
        let script = Script::new(&[1_000_000, 2_000_000, 500_000, 400_000, 3_000_000, 0, 3_000_001]);
        let mut clock = SkewedClock::with_skew(script, Skew { offset_ns: -250_000, drift_ppm: 0.0, jitter_ns: 0 }, 1);
        // The first script entry went to the constructor as the drift origin.
        let readings: Vec<u64> = (0..8).map(|_| clock.now_ns()).collect();
        assert_eq!(
            readings,
            vec![1_750_000, 1_750_000, 1_750_000, 2_750_000, 2_750_000, 2_750_001, 2_750_001, 2_750_001]
        );
    }

    #[test]
    fn skewed_clock_applies_offset_and_drift() {
        let base = ManualClock::new(1_000_000_000);
        let mut clock =
            SkewedClock::with_skew(base.clone(), Skew { offset_ns: 5_000, drift_ppm: 10.0, jitter_ns: 0 }, 9);
        assert_eq!(clock.now_ns(), 1_000_005_000);
        base.advance(1_000_000_000); // one second: 10 ppm is 10 µs
        assert_eq!(clock.now_ns(), 2_000_015_000);
        let mut slow = SkewedClock::with_skew(base.clone(), Skew { offset_ns: 0, drift_ppm: -10.0, jitter_ns: 0 }, 9);
        let start = slow.now_ns();
        base.advance(1_000_000_000);
        assert_eq!(slow.now_ns() - start, 999_990_000);
    }

    #[test]
    fn skewed_clock_negative_offset_saturates_at_zero() {
        let mut clock = SkewedClock::with_skew(ManualClock::new(10), Skew { offset_ns: -1_000, ..Skew::default() }, 0);
        assert_eq!(clock.now_ns(), 0);
    }

    #[test]
    fn jitter_stays_within_bounds_and_readings_stay_monotonic() {
        let base = ManualClock::new(1_000_000_000);
        let jitter = 5_000;
        let mut clock =
            SkewedClock::with_skew(base.clone(), Skew { offset_ns: 0, drift_ppm: 0.0, jitter_ns: jitter }, 3);
        let mut previous = 0;
        let mut raised = 0;
        for step in 0..100_000u64 {
            base.advance(1_000);
            let reading = clock.now_ns();
            let true_ns = base.get();
            assert!(reading >= previous);
            assert!(reading <= true_ns + jitter, "step {step}: {reading} beyond +jitter of {true_ns}");
            // Monotonic clamping can hold a reading above the truth, never more than the bound.
            assert!(reading + jitter >= true_ns, "step {step}: {reading} beyond -jitter of {true_ns}");
            if reading > true_ns {
                raised += 1;
            }
            previous = reading;
        }
        assert!(raised > 10_000, "jitter seems inactive: only {raised} readings above the true time");
    }

    #[test]
    fn jitter_draws_cover_the_whole_range() {
        let mut clock = SkewedClock::with_skew(ManualClock::new(0), Skew { jitter_ns: 3, ..Skew::default() }, 77);
        let mut seen = [false; 7];
        for _ in 0..10_000 {
            let draw = clock.next_jitter();
            assert!((-3..=3).contains(&draw));
            seen[(draw + 3) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }

    #[test]
    fn profile_offsets_match_the_measured_average_skew() {
        const CLIENTS: u64 = 20_000;
        for profile in [SkewProfile::Ptp, SkewProfile::Ntp] {
            let target = profile.mean_abs_offset_ns() as f64;
            let skews: Vec<Skew> = (0..CLIENTS).map(|client| profile.draw(client, 2024)).collect();
            let mean_abs = skews.iter().map(|s| s.offset_ns.unsigned_abs() as f64).sum::<f64>() / CLIENTS as f64;
            assert!((mean_abs - target).abs() < 0.03 * target, "{profile}: mean |offset| {mean_abs} vs {target}");
            let mean = skews.iter().map(|s| s.offset_ns as f64).sum::<f64>() / CLIENTS as f64;
            assert!(mean.abs() < 0.05 * target, "{profile}: offsets are biased, mean {mean}");
            let ahead = skews.iter().filter(|s| s.offset_ns > 0).count() as f64 / CLIENTS as f64;
            assert!((0.47..0.53).contains(&ahead), "{profile}: {ahead} of the clients run ahead");
            for skew in &skews {
                assert!(skew.offset_ns.unsigned_abs() <= profile.max_offset_ns());
                assert!(skew.drift_ppm.abs() <= profile.max_drift_ppm());
                assert_eq!(skew.jitter_ns, profile.mean_abs_offset_ns() / 10);
            }
            let mean_abs_drift = skews.iter().map(|s| s.drift_ppm.abs()).sum::<f64>() / CLIENTS as f64;
            let expected_drift = profile.max_drift_ppm() / 2.0;
            assert!(
                (mean_abs_drift - expected_drift).abs() < 0.05 * expected_drift,
                "{profile}: drift {mean_abs_drift}"
            );
        }
        assert_eq!(SkewProfile::None.draw(5, 5), Skew::default());
    }

    #[test]
    fn draws_are_deterministic_and_differ_between_clients_and_seeds() {
        let a = SkewProfile::Ntp.draw(1, 99);
        assert_eq!(a, SkewProfile::Ntp.draw(1, 99));
        assert_ne!(a, SkewProfile::Ntp.draw(2, 99));
        assert_ne!(a, SkewProfile::Ntp.draw(1, 100));
    }

    #[test]
    fn skewed_clocks_over_a_shared_base_disagree_by_their_offsets() {
        let base = ManualClock::new(10_000_000_000);
        let mut clocks: Vec<_> = (0..8).map(|c| SkewedClock::with_base(base.clone(), SkewProfile::Ntp, c, 1)).collect();
        for clock in &mut clocks {
            let error = clock.now_ns() as i64 - base.get() as i64;
            let skew = clock.skew();
            assert!((error - skew.offset_ns).unsigned_abs() <= skew.jitter_ns, "{error} vs {skew:?}");
        }
    }

    #[test]
    fn invalid_drift_is_neutralised() {
        let base = ManualClock::new(0);
        let mut clock = SkewedClock::with_skew(base.clone(), Skew { drift_ppm: f64::NAN, ..Skew::default() }, 0);
        base.set(1_000);
        assert_eq!(clock.now_ns(), 1_000);
        let mut clock = SkewedClock::with_skew(base.clone(), Skew { drift_ppm: -1e12, ..Skew::default() }, 0);
        base.set(2_000);
        assert!(clock.now_ns() > 1_000);
    }

    #[test]
    fn hlc_is_strictly_increasing_and_tracks_physical_time() {
        let physical = ManualClock::new(5 * NANOS_PER_MILLI);
        let mut hlc = HybridClock::new(physical.clone());
        let first = hlc.now();
        assert_eq!(first, HybridClock::compose(5, 0));
        let mut previous = first;
        for _ in 0..1_000 {
            let ts = hlc.now();
            assert!(ts > previous);
            previous = ts;
        }
        assert_eq!(HybridClock::physical_ms(previous), 5);
        assert_eq!(HybridClock::logical(previous), 1_000);
        physical.advance(3 * NANOS_PER_MILLI);
        let later = hlc.now();
        assert_eq!(later, HybridClock::compose(8, 0), "the counter resets when physical time moves on");
    }

    #[test]
    fn hlc_ignores_a_physical_clock_going_back() {
        let mut hlc = HybridClock::new(Script::new(&[9 * NANOS_PER_MILLI, 2 * NANOS_PER_MILLI, 0]));
        let a = hlc.now();
        let b = hlc.now();
        let c = hlc.now();
        assert_eq!(a, HybridClock::compose(9, 0));
        assert_eq!((b, c), (a + 1, a + 2));
    }

    #[test]
    fn hlc_observe_orders_later_events_after_the_remote_one() {
        let physical = ManualClock::new(100 * NANOS_PER_MILLI);
        let mut hlc = HybridClock::new(physical.clone());
        let local = hlc.now();
        let remote = HybridClock::compose(250, 7);
        hlc.observe(remote);
        let after = hlc.now();
        assert!(after > remote && after > local);
        assert_eq!(after, HybridClock::compose(250, 8));
        // An older remote timestamp changes nothing.
        hlc.observe(HybridClock::compose(1, 0));
        assert_eq!(hlc.now(), after + 1);
        // Once physical time passes the remote one, it takes over again.
        physical.set(300 * NANOS_PER_MILLI);
        assert_eq!(hlc.now(), HybridClock::compose(300, 0));
    }

    #[test]
    fn hlc_counter_overflow_carries_into_the_milliseconds() {
        let physical = ManualClock::new(42 * NANOS_PER_MILLI);
        let mut hlc = HybridClock::new(physical);
        hlc.observe(HybridClock::compose(42, u16::MAX - 1));
        let a = hlc.now();
        let b = hlc.now();
        let c = hlc.now();
        assert_eq!(a, HybridClock::compose(42, u16::MAX));
        assert_eq!(b, HybridClock::compose(43, 0));
        assert_eq!(c, HybridClock::compose(43, 1));
        assert!(a < b && b < c);
        // A full millisecond of events per millisecond of physical time keeps carrying.
        let mut previous = c;
        for _ in 0..(3 << HLC_LOGICAL_BITS) {
            let ts = hlc.now();
            assert!(ts > previous);
            previous = ts;
        }
        assert_eq!(HybridClock::physical_ms(previous), 46);
    }

    #[test]
    fn hlc_saturates_instead_of_wrapping() {
        let mut hlc = HybridClock::new(ManualClock::new(0));
        hlc.observe(u64::MAX);
        assert_eq!(hlc.now(), u64::MAX);
        assert_eq!(hlc.now(), u64::MAX);
    }

    #[test]
    fn hlc_bounded_observe_rejects_timestamps_from_the_far_future() {
        let mut hlc = HybridClock::new(ManualClock::new(1_000 * NANOS_PER_MILLI));
        let near = HybridClock::compose(1_400, 3);
        assert_eq!(hlc.observe_bounded(near, Duration::from_millis(500)), Ok(()));
        assert!(hlc.now() > near);
        let far = HybridClock::compose(1_600, 0);
        let error = hlc.observe_bounded(far, Duration::from_millis(500)).unwrap_err();
        assert_eq!(error, HlcError::RemoteTooFarAhead { remote_ms: 1_600, local_ms: 1_000, max_ahead_ms: 500 });
        assert!(hlc.now() < far, "a refused timestamp must not move the clock");
        assert!(hlc.observe_bounded(u64::MAX, Duration::MAX).is_ok());
    }

    #[test]
    fn hlc_over_the_system_clock_is_near_wall_time() {
        let mut hlc = HybridClock::new(Box::new(SystemClock::new()) as Box<dyn Clock>);
        let wall_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let ts = hlc.now();
        assert!(HybridClock::physical_ms(ts).abs_diff(wall_ms) < 1_000);
    }

    #[test]
    fn clocks_are_send() {
        fn assert_send<T: Send>() {}
        assert_send::<SystemClock>();
        assert_send::<SkewedClock>();
        assert_send::<HybridClock<SkewedClock>>();
        assert_send::<HybridClock<Box<dyn Clock>>>();
    }
}
