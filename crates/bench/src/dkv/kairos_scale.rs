//! `virga bench kairos --figure scale`: Fig. 4.16's caching bar beyond this machine, from the
//! cost model (`virga_dkv::sim::txn::scale`): every step of the real cores timed here under
//! each cache mode, a gRPC call's cost probed through the real driver, a log append's on this
//! disk; then the seed's setting simulated (5 shards × 3 replicas, each data node on a
//! 4-thread machine as the seed's D4s_v3 VMs, 15 clients on machines of their own, 500 µs
//! one-way latency), with and without sharded validators on the clients' machines. This
//! machine's shape is simulated beside it, so the model's ratio can be read against the
//! measured one (`compare_modes`).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use virga_dkv::client::ReadOnlyValidation;
use virga_dkv::kairos::CacheMode;
use virga_dkv::sim::txn::scale::{self, probe, Placement, ScaleShape, StepCosts};

use super::kairos::{cache_config, SEED_CACHE_FRACTION};
use super::scale::{loader, programs, shape, simulate};
use crate::kv::ycsb_t::YcsbT;

/// One mode on one shape, in virtual time.
#[derive(Debug, Serialize)]
pub struct KairosScaleRow {
    pub shape: &'static str,
    /// `simulated` (this machine's shape) or `extrapolated` (the seed's).
    pub kind: &'static str,
    pub mode: String,
    /// KAIROS's sharded validators, co-located with the clients (0: none).
    pub validators: usize,
    pub committed_per_sec: f64,
    pub abort_rate: f64,
    pub speedup_over_none: f64,
}

/// One mode at one client count of the seed's setting, in virtual time.
#[derive(Debug, Serialize)]
pub struct KairosLoadRow {
    pub mode: String,
    pub clients: usize,
    pub committed_per_sec: f64,
    pub abort_rate: f64,
}

/// Client counts of the simulated load sweep (the seed ran up to 15).
pub const SEED_LOAD_CLIENTS: [usize; 5] = [3, 6, 9, 12, 15];

#[derive(Debug, Serialize)]
pub struct KairosScaleFigure {
    pub figure: &'static str,
    pub setting: String,
    pub call_ns_grpc: f64,
    pub append_ns: f64,
    pub rows: Vec<KairosScaleRow>,
    /// Fig. 4.11's shape at the seed's setting: each mode as the clients (the load) rise.
    pub load: Vec<KairosLoadRow>,
    /// The seed's reported speedups over no caching, for comparison.
    pub seed_caching_alone: f64,
    pub seed_caching_and_validators: f64,
}

/// The seed's setting, on the cost model: `mode`'s caches on 5 shards of 3 replicas.
fn seed_shape(workload: &YcsbT, mode: CacheMode, clients: usize, validators: usize, seed: u64) -> ScaleShape {
    let placement = Placement::Spread { storage_threads: 4, client_machines: 15, client_threads: 4 };
    ScaleShape {
        data_nodes: 5,
        in_flight: 8,
        window: 16,
        warmup: Duration::from_millis(300),
        measure: Duration::from_millis(800),
        cache: cache_config(workload, mode, SEED_CACHE_FRACTION),
        validation: ReadOnlyValidation::Validate,
        validators,
        ..shape(5, clients, placement, Duration::from_micros(500), seed)
    }
}

/// This machine's shape (every role on one 2-thread machine, 8 clients) under `mode`.
fn here_shape(workload: &YcsbT, mode: CacheMode, validators: usize, seed: u64) -> ScaleShape {
    ScaleShape {
        cache: cache_config(workload, mode, SEED_CACHE_FRACTION),
        validation: ReadOnlyValidation::Validate,
        validators,
        ..shape(3, 8, Placement::OneMachine { threads: 2 }, Duration::from_micros(2), seed)
    }
}

/// Calibrates each mode's step costs here, then simulates this machine's shape and the
/// seed's under each of `modes` (the first should be `none`, the baseline of the ratios);
/// with `validators`, each mode also with that many validators co-located with the clients
/// (Fig. 4.16's third bar).
pub fn kairos_scale(
    workload: &YcsbT,
    modes: &[CacheMode],
    validators: usize,
    seed: u64,
    scratch: &Path,
) -> Result<KairosScaleFigure> {
    eprintln!("  probing a gRPC call and a log append on this disk");
    let call_ns_grpc = probe::call_ns(true, Duration::from_secs(2)).context("the gRPC call probe")?;
    let call_ns_inproc = probe::call_ns(false, Duration::from_secs(2)).context("the in-process call probe")?;
    let (append_ns, append_cpu_ns) = probe::append_ns(scratch, 4, 200, 200).context("the log append probe")?;
    let mut rows = Vec::new();
    let mut load = Vec::new();
    let layouts: &[usize] = if validators == 0 { &[0] } else { &[0, validators] };
    for (mode, validators) in layouts.iter().flat_map(|validators| modes.iter().map(move |mode| (mode, *validators))) {
        let here = here_shape(workload, *mode, validators, seed);
        let calibration = ScaleShape { measure: Duration::from_millis(300), ..here.clone() };
        let mut next = programs(workload, here.clients, seed);
        let steps = scale::calibrate(&calibration, &loader(workload), &mut next).map_err(|error| anyhow!("{error}"))?;
        let inproc = StepCosts { steps, call_ns: call_ns_inproc, append_ns, append_cpu_ns };
        let grpc = StepCosts { call_ns: call_ns_grpc, ..inproc.clone() };
        // The load sweep (Fig. 4.11's shape) compares the cache modes alone.
        for clients in SEED_LOAD_CLIENTS.into_iter().filter(|_| validators == 0) {
            let run = simulate(&seed_shape(workload, *mode, clients, 0, seed), &grpc, workload)?;
            let attempts = run.committed + run.aborted;
            eprintln!("  extrapolated, {clients} clients, {}: {:.0} committed/s", mode.name(), run.committed_per_sec);
            load.push(KairosLoadRow {
                mode: mode.name(),
                clients,
                committed_per_sec: run.committed_per_sec,
                abort_rate: run.aborted as f64 / attempts.max(1) as f64,
            });
        }
        for (name, kind, shape, costs) in [
            ("this machine", "simulated", here, inproc),
            ("the seed's setting", "extrapolated", seed_shape(workload, *mode, 15, validators, seed), grpc),
        ] {
            let run = simulate(&shape, &costs, workload)?;
            let attempts = run.committed + run.aborted;
            eprintln!(
                "  {kind}, {name}, {} with {validators} validators: {:.0} committed/s",
                mode.name(),
                run.committed_per_sec
            );
            rows.push(KairosScaleRow {
                shape: name,
                kind,
                mode: mode.name(),
                validators,
                committed_per_sec: run.committed_per_sec,
                abort_rate: run.aborted as f64 / attempts.max(1) as f64,
                speedup_over_none: 0.0,
            });
        }
    }
    for index in 0..rows.len() {
        let baseline = rows
            .iter()
            .find(|row| row.shape == rows[index].shape && row.mode == CacheMode::None.name() && row.validators == 0)
            .map_or(0.0, |row| row.committed_per_sec);
        rows[index].speedup_over_none = rows[index].committed_per_sec / baseline.max(1e-9);
    }
    let config = workload.config();
    let setting = format!(
        "ycsb-t ({} records, {}% read-only, Zipf {} / {}), each client caching the hottest {}% of the keys, \
         read-only transactions validated at the primaries in one round; steps timed on this machine per mode; \
         extrapolated: 5 shards x 3 replicas, each data node on a 4-thread machine, 15 clients (8 transactions in \
         flight each) on 4-thread machines, gRPC calls, 500 µs one-way latency; validators (where a row has them) \
         on the clients' machines",
        config.records,
        config.read_only_percent,
        config.read_zipf,
        config.write_zipf,
        SEED_CACHE_FRACTION * 100.0
    );
    Ok(KairosScaleFigure {
        figure: "kairos-scale",
        setting,
        call_ns_grpc,
        append_ns,
        rows,
        load,
        seed_caching_alone: 1.86,
        seed_caching_and_validators: 2.28,
    })
}
