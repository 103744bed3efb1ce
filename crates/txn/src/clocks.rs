//! Where the engine reads time: a [`ClockSource`] hands each session (client) its own
//! clock. The engine never constructs a clock itself, so tests and simulations can run it
//! in virtual time ([`ManualClock`](virga_core::clock::ManualClock) as the base).

use virga_core::clock::{Clock, SkewProfile, SkewedClock, SystemClock};

/// Builds each client's clock. Clocks are per client because [`Clock`] readings are
/// monotonic per instance and skew is a property of a client's machine.
pub trait ClockSource: Send + Sync {
    /// The clock of client `client` (1-based, unique per engine).
    fn clock(&self, client: u32) -> Box<dyn Clock>;
}

/// Each client's clock is `base` skewed by an error drawn from `profile` (MILANA's PTP and
/// NTP measurements), deterministically from `seed` and the client's id.
#[derive(Clone, Debug)]
pub struct SkewedClocks<C = SystemClock> {
    base: C,
    profile: SkewProfile,
    seed: u64,
}

impl SkewedClocks<SystemClock> {
    /// Clients' clocks skewed from the machine's clock. The clients share one anchor, so
    /// with [`SkewProfile::None`] they agree exactly.
    pub fn system(profile: SkewProfile, seed: u64) -> SkewedClocks<SystemClock> {
        SkewedClocks { base: SystemClock::new(), profile, seed }
    }
}

impl<C: Clock + Clone + Sync + 'static> SkewedClocks<C> {
    /// Clients' clocks skewed from `base` (each client gets a clone of it).
    pub fn with_base(base: C, profile: SkewProfile, seed: u64) -> SkewedClocks<C> {
        SkewedClocks { base, profile, seed }
    }
}

impl<C: Clock + Clone + Sync + 'static> ClockSource for SkewedClocks<C> {
    fn clock(&self, client: u32) -> Box<dyn Clock> {
        Box::new(SkewedClock::with_base(self.base.clone(), self.profile, u64::from(client), self.seed))
    }
}
