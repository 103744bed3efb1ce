//! KAIROS's inter-transaction caching (seed 004 ch. 4) on the store: clients cache a fixed
//! set of hot keys across transactions under **soft leases** the primaries hand out without
//! keeping any per-client state, and OCC validation at commit aborts a transaction that read
//! a stale cached value.
//!
//! - [`CacheMode`] picks the lease rule, the same at clients and primaries: none (MILANA as
//!   built), the ideal lease of the model (`virga_txn::cache`), naïve caching (leases longer
//!   than any run), static leases P(x), or explicit invalidation (EI: the primaries track
//!   who holds a copy and call them back on a write, the seed's baseline).
//! - [`ClientCache`] is a client's look-through cache: the cacheable keys, each entry's
//!   value, version, lease end and freshness, and each key's mean inter-read time, which
//!   its gets carry to the primary.
//! - [`LeaseGrants`] is a primary's side: each cached key's write rate, measured from the
//!   commits it installs, and the lease end it attaches to a read; under EI alone, the
//!   clients holding each key.
//! - [`validator`] is a sharded validator's state (Algorithm 5 with `ts_GC`), built and
//!   tested as a pure state machine; validation itself still runs at the shard primaries
//!   (`docs/kairos-validators.md` is the design of the rest).

mod client_cache;
mod grants;
pub mod validator;
mod validator_core;
mod wire;

use std::time::Duration;

use virga_net::role::Nanos;

pub use self::client_cache::{CacheConfig, CacheStats, CachedRead, ClientCache};
pub use self::grants::LeaseGrants;
pub use self::validator_core::{
    validator_index, validator_name, ValidatorConfig, ValidatorCore, ValidatorStats, BEYOND_LEASE,
};
pub use self::wire::{validate_from_wire, validate_to_wire, ValidateRequest, ValidateWireError};

/// How (and whether) clients cache keys across transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum CacheMode {
    /// No inter-transaction caching: every read goes to its primary (MILANA as built).
    #[default]
    None,
    /// Leases from the ideal lease model: per key, the length that maximises the expected
    /// fresh hits for the cache's inter-read time and the key's write rate.
    Lease,
    /// Leases longer than any run: a cached value is served until validation finds it stale.
    Naive,
    /// Static leases P(x): the length with chance `x` of a write inside it.
    Static(f64),
    /// Explicit invalidation (callbacks, as Thor): a copy is valid until its primary, which
    /// tracks every client holding one, tells the client that a write committed.
    Ei,
}

impl CacheMode {
    /// The name `--cache` takes: `none`, `lease`, `naive`, `static:X`.
    pub fn name(&self) -> String {
        match self {
            CacheMode::None => "none".to_string(),
            CacheMode::Lease => "lease".to_string(),
            CacheMode::Naive => "naive".to_string(),
            CacheMode::Static(x) => format!("static:{x}"),
            CacheMode::Ei => "ei".to_string(),
        }
    }

    /// The mode a name gives (the inverse of [`CacheMode::name`]).
    pub fn from_name(name: &str) -> Result<CacheMode, UnknownCacheMode> {
        let unknown = || UnknownCacheMode { name: name.to_string() };
        match name {
            "none" => Ok(CacheMode::None),
            "lease" => Ok(CacheMode::Lease),
            "naive" => Ok(CacheMode::Naive),
            "ei" => Ok(CacheMode::Ei),
            _ => {
                let x = name.strip_prefix("static:").ok_or_else(unknown)?;
                match x.parse::<f64>() {
                    Ok(x) if x > 0.0 && x < 1.0 => Ok(CacheMode::Static(x)),
                    _ => Err(unknown()),
                }
            }
        }
    }

    /// Whether clients cache at all.
    pub fn caches(&self) -> bool {
        *self != CacheMode::None
    }
}

/// A `--cache` value that names no mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no cache mode is called {name:?}: the modes are none, lease, naive, static:X with X in (0, 1), and ei")]
pub struct UnknownCacheMode {
    pub name: String,
}

/// The mean time between one key's events (a client's reads, a primary's installed writes):
/// an exponentially weighted average of the gaps, the newest weighing 1/8, so the estimate
/// follows a workload that changes; and the time of the last event.
#[derive(Debug, Clone, Copy)]
struct MeanGap {
    last: Nanos,
    /// None until a second event.
    mean: Option<f64>,
}

impl MeanGap {
    const NEWEST_WEIGHT: f64 = 0.125;

    /// Counting from an event (or the start of tracking) at `now`.
    fn starting(now: Nanos) -> MeanGap {
        MeanGap { last: now, mean: None }
    }

    /// Another event at `now`.
    fn tick(&mut self, now: Nanos) {
        let gap = now.saturating_sub(self.last) as f64;
        self.mean = Some(self.mean.map_or(gap, |mean| mean + MeanGap::NEWEST_WEIGHT * (gap - mean)));
        self.last = now;
    }

    /// Nanoseconds since the last event.
    fn since_last(&self, now: Nanos) -> f64 {
        now.saturating_sub(self.last) as f64
    }
}

/// The longest lease a primary hands out under the model or a static rule (the seed's
/// leases reached 5 s).
pub const MAX_LEASE: Duration = Duration::from_secs(5);
/// A naïve lease: longer than any run.
pub const NAIVE_LEASE: Duration = Duration::from_secs(24 * 3600);
