//! What a step, a call and a log append cost, as the simulator charges them.

use std::collections::HashMap;

use crate::Dkv;
use virga_net::role::{Event, Protocol};
use virga_sim::{CostModel, RoleEvent, SimError};

use super::{run_closed_loop, Loader, RoleKind, ScaleShape, Timed};
use crate::client::Program;
use crate::sim::txn::node::{DkvInput, DkvIoDone};

/// The kind of an event, as costs are keyed: a request's or a response's kind, or what else
/// woke the core.
pub fn event_kind(event: &Event<Dkv, DkvIoDone, DkvInput>) -> &'static str {
    match event {
        Event::Start => "start",
        Event::Request { request, .. } => Dkv::request_kind(request),
        Event::Response { result: Ok(response), .. } => Dkv::response_kind(response),
        Event::Response { result: Err(_), .. } => "failed",
        Event::Timer(_) => "timer",
        Event::IoDone { .. } => "io_done",
        Event::Input(_) => "input",
    }
}

/// The costs the simulator charges, in nanoseconds.
#[derive(Debug, Clone, Default)]
pub struct StepCosts {
    /// The mean CPU time of a core's step, by role and event kind.
    pub steps: HashMap<(RoleKind, &'static str), f64>,
    /// What a call costs the drivers and the transport beyond the two cores' steps (half at
    /// the callee's request, half at the caller's response).
    pub call_ns: f64,
    /// A log append's device time (its fsync), and the CPU it holds a thread for.
    pub append_ns: f64,
    pub append_cpu_ns: f64,
}

impl StepCosts {
    /// Every CPU cost times `factor` (the disk's latency as it is).
    pub fn scaled(&self, factor: f64) -> StepCosts {
        StepCosts {
            steps: self.steps.iter().map(|(key, ns)| (*key, ns * factor)).collect(),
            call_ns: self.call_ns * factor,
            append_ns: self.append_ns,
            append_cpu_ns: self.append_cpu_ns * factor,
        }
    }
}

impl CostModel<Timed> for StepCosts {
    fn step_cost(&self, node: &str, event: &RoleEvent<Timed>) -> u64 {
        let step = self.steps.get(&(RoleKind::of(node), event_kind(event))).copied().unwrap_or(0.0);
        let transport = match event {
            Event::Request { .. } | Event::Response { .. } => self.call_ns / 2.0,
            _ => 0.0,
        };
        (step + transport) as u64
    }

    fn io_cost(&self, _node: &str, _op: &crate::sim::txn::node::DkvIo) -> u64 {
        self.append_ns as u64
    }

    fn io_compute_cost(&self, _node: &str, _op: &crate::sim::txn::node::DkvIo) -> u64 {
        self.append_cpu_ns as u64
    }
}

/// The mean CPU time of each kind of step, from a run of `shape` that charges nothing
/// (single-threaded: the run's wall time per step is its CPU time).
pub fn calibrate(
    shape: &ScaleShape,
    load: &Loader<'_>,
    next: &mut dyn FnMut(usize) -> Program,
) -> Result<HashMap<(RoleKind, &'static str), f64>, SimError> {
    let run = run_closed_loop(shape, StepCosts::default(), load, next)?;
    Ok(run.steps.into_iter().map(|(key, (count, total))| (key, total as f64 / count.max(1) as f64)).collect())
}
