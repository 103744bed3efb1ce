//! KAIROS's inter-transaction caching, as pure functions (seed 004 ch. 4): the ideal lease
//! model and Algorithm 3 ([`outcome`], [`ideal_lease`], [`static_lease`]) and a Monte Carlo
//! run beside it ([`simulate`]). The distributed store's caches and servers (virga-dkv) use
//! them to choose each key's lease.

mod model;
mod monte_carlo;

pub use self::model::{ideal_lease, outcome, static_lease, LeaseOutcome};
pub use self::monte_carlo::simulate;
