//! `virga bench dkv --figure scale`: the store's throughput beyond this machine, from the
//! protocol seam's cost model (`virga_dkv::sim::txn::scale`): every step of the real cores
//! timed on this machine, a call's cost through the real driver and transports, a log
//! append's on this disk; then ycsb-t's closed loop simulated on shapes with more machines.
//! The shape this machine runs for real (everything on one 2-thread machine) is simulated
//! and measured side by side, so the model's error is known before its extrapolations are
//! read.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use virga_dkv::client::Program;
use virga_dkv::sim::txn::scale::{self, probe, Placement, ScaleShape, StepCosts};

use super::{program, run_store, DkvBenchConfig};
use crate::kv::ycsb_t::YcsbT;
use crate::kv::KvWorkload;
use crate::median;
use crate::plot::{axis_number, draw, linear_axis, Chart, Line};

/// One shape's throughput.
#[derive(Debug, Serialize)]
pub struct ScaleRow {
    pub shape: String,
    /// `measured` (the real store on this machine), `simulated` (the same shape in the
    /// model), `fitted` (the model with its costs scaled to this machine's measurement), or
    /// `extrapolated` and `extrapolated, fitted` (a shape this machine cannot run, with the
    /// timed costs and with the fitted ones).
    pub kind: &'static str,
    pub shards: u32,
    pub data_nodes: usize,
    pub clients: usize,
    pub machines: String,
    pub committed_per_sec: f64,
    pub abort_rate: f64,
    /// Measured: each run's figure.
    pub runs: Vec<f64>,
}

/// The figure: the model's inputs and each shape's throughput.
#[derive(Debug, Serialize)]
pub struct ScaleFigure {
    pub figure: &'static str,
    pub setting: String,
    /// Nanoseconds of one worker thread per call, in process and over gRPC on loopback.
    pub call_ns_inproc: f64,
    pub call_ns_grpc: f64,
    /// A group of 4 records of 200 bytes appended and fsynced: wall and CPU nanoseconds.
    pub append_ns: f64,
    pub append_cpu_ns: f64,
    /// The mean CPU time of each kind of step (role/event), from the calibration run.
    pub steps_ns: std::collections::BTreeMap<String, f64>,
    /// The factor on every CPU cost that makes the model reproduce this machine's
    /// measurement (the timed steps miss what a loaded runtime adds: cache misses, wakeups,
    /// contention); the `fitted` rows use it.
    pub fitted_factor: f64,
    pub rows: Vec<ScaleRow>,
}

/// ycsb-t programs for each client, drawn from its own generator.
pub(super) fn programs<'a>(workload: &'a YcsbT, clients: usize, seed: u64) -> impl FnMut(usize) -> Program + 'a {
    let mut rngs: Vec<SmallRng> =
        (0..clients).map(|index| SmallRng::seed_from_u64(seed ^ (index as u64 + 1) << 32)).collect();
    move |client| {
        let count = rngs.len();
        program(&workload.draw(&mut rngs[client % count]), workload)
    }
}

pub(super) fn loader(workload: &YcsbT) -> impl Fn(&mut dyn FnMut(Bytes, Bytes)) + '_ {
    move |sink| workload.load(&mut |key, value| sink(Bytes::copy_from_slice(key), Bytes::copy_from_slice(value)))
}

pub(super) fn shape(shards: u32, clients: usize, placement: Placement, latency: Duration, seed: u64) -> ScaleShape {
    ScaleShape {
        shards,
        data_nodes: (shards as usize).max(3),
        clients,
        in_flight: 1,
        window: 4,
        placement,
        latency,
        warmup: Duration::from_millis(200),
        measure: Duration::from_millis(600),
        seed,
        cache: Default::default(),
        validation: virga_dkv::client::ReadOnlyValidation::Local,
        validators: 0,
    }
}

pub(super) fn simulate(shape: &ScaleShape, costs: &StepCosts, workload: &YcsbT) -> Result<scale::ScaleRun> {
    let mut next = programs(workload, shape.clients, shape.seed);
    scale::run_closed_loop(shape, costs.clone(), &loader(workload), &mut next).map_err(|error| anyhow!("{error}"))
}

fn row(name: &str, kind: &'static str, shape: &ScaleShape, machines: String, run: &scale::ScaleRun) -> ScaleRow {
    let attempts = run.committed + run.aborted;
    ScaleRow {
        shape: name.to_string(),
        kind,
        shards: shape.shards,
        data_nodes: shape.data_nodes,
        clients: shape.clients,
        machines,
        committed_per_sec: run.committed_per_sec,
        abort_rate: run.aborted as f64 / attempts.max(1) as f64,
        runs: Vec::new(),
    }
}

/// Calibrates, measures this machine's shape and simulates the others (`runs` measured
/// runs of the real store, interleaved with nothing else).
pub fn scale_figure(base: &DkvBenchConfig, workload: &YcsbT, runs: usize, scratch: &Path) -> Result<ScaleFigure> {
    eprintln!("  probing a call in process and over gRPC, and a log append on this disk");
    let call_ns_inproc = probe::call_ns(false, Duration::from_secs(2)).context("the in-process call probe")?;
    let call_ns_grpc = probe::call_ns(true, Duration::from_secs(2)).context("the gRPC call probe")?;
    let (append_ns, append_cpu_ns) = probe::append_ns(scratch, 4, 200, 200).context("the log append probe")?;
    eprintln!("  a call: {call_ns_inproc:.0} ns in process, {call_ns_grpc:.0} ns over gRPC; an append: {append_ns:.0} ns ({append_cpu_ns:.0} ns CPU)");
    let here = shape(3, 64, Placement::OneMachine { threads: 2 }, Duration::from_micros(2), base.seed);
    eprintln!("  timing every step of the cores in a run that charges nothing");
    let steps = {
        let calibration = ScaleShape { measure: Duration::from_millis(300), ..here.clone() };
        let mut next = programs(workload, here.clients, base.seed);
        scale::calibrate(&calibration, &loader(workload), &mut next).map_err(|error| anyhow!("{error}"))?
    };
    let inproc = StepCosts { steps: steps.clone(), call_ns: call_ns_inproc, append_ns, append_cpu_ns };
    let grpc = StepCosts { call_ns: call_ns_grpc, ..inproc.clone() };
    let mut rows = Vec::new();
    let mut measured = Vec::new();
    for round in 0..runs {
        let config = DkvBenchConfig { clients: here.clients, seed: base.seed ^ round as u64, ..base.clone() };
        let report = run_store(&config, workload)?;
        eprintln!("  round {}: the store on this machine: {:.0} committed/s", round + 1, report.committed_per_sec);
        measured.push(report);
    }
    let mut measured_row = row("this machine", "measured", &here, "1 x 2 cores".into(), &scale::ScaleRun::default());
    measured_row.runs = measured.iter().map(|report| report.committed_per_sec).collect();
    measured_row.committed_per_sec = median(&mut measured_row.runs.clone());
    measured_row.abort_rate = median(&mut measured.iter().map(|report| report.abort_rate).collect::<Vec<_>>());
    rows.push(measured_row);
    let target = rows[0].committed_per_sec;
    let run = simulate(&here, &inproc, workload)?;
    eprintln!("  simulated, this machine: {:.0} committed/s", run.committed_per_sec);
    rows.push(row("this machine", "simulated", &here, "1 x 2 threads".into(), &run));
    let fitted_factor = fit(&here, &inproc, workload, target, run.committed_per_sec)?;
    let fitted_run = simulate(&here, &inproc.scaled(fitted_factor), workload)?;
    eprintln!("  fitted (costs x {fitted_factor:.2}), this machine: {:.0} committed/s", fitted_run.committed_per_sec);
    rows.push(row("this machine", "fitted", &here, "1 x 2 threads".into(), &fitted_run));
    // The seed's setting: 3 storage VMs of 8 cores, 5 client VMs of 2; then twice and four
    // times as many shards, machines and clients. A datacenter's one-way latency, 100 µs.
    let spread =
        |storage_threads, client_machines| Placement::Spread { storage_threads, client_machines, client_threads: 2 };
    let latency = Duration::from_micros(100);
    for (name, shards, clients, client_machines) in
        [("MILANA's setting", 3, 80, 5), ("2x", 6, 160, 10), ("4x", 12, 320, 20)]
    {
        let extrapolated = shape(shards, clients, spread(8, client_machines), latency, base.seed);
        let machines = format!("{} x 8 threads + {client_machines} x 2 threads", extrapolated.data_nodes);
        for (kind, costs) in [("extrapolated", grpc.clone()), ("extrapolated, fitted", grpc.scaled(fitted_factor))] {
            let run = simulate(&extrapolated, &costs, workload)?;
            eprintln!(
                "  {kind}, {name} ({shards} shards, {clients} clients): {:.0} committed/s",
                run.committed_per_sec
            );
            rows.push(row(name, kind, &extrapolated, machines.clone(), &run));
        }
    }
    let steps_ns = steps.iter().map(|((role, kind), ns)| (format!("{}/{kind}", role.name()), *ns)).collect();
    let config = workload.config();
    let setting = format!(
        "ycsb-t ({} records, {}% read-only), 3 replicas a shard, group commit, one transaction in flight a client; \
         steps timed on this machine in a single-threaded simulated run, calls through the real driver on one worker \
         thread; extrapolated shapes: each data node on an 8-thread machine, clients on 2-thread machines, gRPC calls, \
         100 µs one-way latency",
        config.records, config.read_only_percent
    );
    Ok(ScaleFigure {
        figure: "scale",
        setting,
        call_ns_inproc,
        call_ns_grpc,
        append_ns,
        append_cpu_ns,
        steps_ns,
        fitted_factor,
        rows,
    })
}

/// The factor on the CPU costs whose simulation of `here` comes within 3% of `target`
/// (throughput falls about in proportion as the costs rise: a few secant steps).
fn fit(here: &ScaleShape, costs: &StepCosts, workload: &YcsbT, target: f64, unscaled: f64) -> Result<f64> {
    let mut factor = 1.0f64;
    let mut simulated = unscaled;
    for _ in 0..5 {
        if target <= 0.0 || (simulated - target).abs() <= 0.03 * target {
            break;
        }
        factor = (factor * simulated / target).clamp(0.05, 100.0);
        simulated = simulate(here, &costs.scaled(factor), workload)?.committed_per_sec;
    }
    Ok(factor)
}

impl ScaleFigure {
    /// Writes the JSON to `path` and a plot beside it (`-throughput.svg`).
    pub fn write(&self, path: &Path) -> Result<Vec<std::path::PathBuf>> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let svg = std::path::PathBuf::from(format!("{}-throughput.svg", path.with_extension("").display()));
        let points = |kind: &str| -> Vec<(f64, f64)> {
            self.rows
                .iter()
                .filter(|row| row.kind == kind)
                .map(|row| (f64::from(row.shards), row.committed_per_sec))
                .collect()
        };
        let chart = Chart {
            title: "The store at scale: ycsb-t committed/s against shards",
            x_label: "shards (3 replicas each)",
            x_step: 3.0,
            y_label: "committed transactions per second",
            lines: vec![
                Line { label: "measured on this machine".into(), colour: 0, dashed: false, points: points("measured") },
                Line { label: "simulated, this machine".into(), colour: 1, dashed: false, points: points("simulated") },
                Line { label: "fitted, this machine".into(), colour: 3, dashed: false, points: points("fitted") },
                Line {
                    label: "extrapolated (8-thread storage machines)".into(),
                    colour: 2,
                    dashed: true,
                    points: points("extrapolated"),
                },
                Line {
                    label: "extrapolated with the fitted costs".into(),
                    colour: 3,
                    dashed: true,
                    points: points("extrapolated, fitted"),
                },
            ],
        };
        draw(&svg, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
        Ok(vec![path.to_path_buf(), svg])
    }
}
