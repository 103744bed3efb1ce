//! What handling an event and doing a device operation cost in virtual time.
//!
//! A node handles one event at a time: handling an event at `t` keeps the node busy until
//! `t + step_cost`, and an event that arrives meanwhile waits until then. What the step
//! emits leaves at the end of the step. A model calibrated from Virga's own measurements
//! then predicts throughput and latency under load; the default costs nothing, so a run
//! tests logic alone.

use virga_net::role::{Event, Role};

/// The event type of role `R`.
pub type RoleEvent<R> = Event<<R as Role>::Protocol, <R as Role>::IoDone, <R as Role>::Input>;

pub trait CostModel<R: Role> {
    /// Nanoseconds node `node` computes to handle `event`.
    fn step_cost(&self, node: &str, event: &RoleEvent<R>) -> u64 {
        let _ = (node, event);
        0
    }

    /// Nanoseconds the device of node `node` takes for `op`, on top of the simulator's
    /// fixed device latency.
    fn io_cost(&self, node: &str, op: &R::Io) -> u64 {
        let _ = (node, op);
        0
    }

    /// Nanoseconds of CPU `op` computes before its device time (a block a miner builds off
    /// its core, [`virga_net::role::IoExecutor::detach`]): it holds one of the node's
    /// machine's threads ([`crate::Sim::place`]) but not the node, which goes on handling
    /// events meanwhile.
    fn io_compute_cost(&self, node: &str, op: &R::Io) -> u64 {
        let _ = (node, op);
        0
    }
}

/// Everything is free.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZeroCost;

impl<R: Role> CostModel<R> for ZeroCost {}
