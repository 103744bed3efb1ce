//! Validation: predictions from a frozen calibration against the real embedded cluster.
//!
//! Each shape runs as a child process (`virga up --json`), optionally pinned with `taskset`
//! to some of the cores, so shapes never share a process and one-core runs really have one
//! core. Shapes run interleaved (round by round, every shape once per round) so slow spells
//! of a shared machine fall on all of them alike; each shape's figure is the median of its
//! rounds, with the spread.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

use super::calibrate::{median, Calibration};
use super::model::{predict, Links, Prediction, Shape};

/// A cluster this machine can run, and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunShape {
    pub name: String,
    pub clients: usize,
    pub storage_nodes: usize,
    pub accounts: usize,
    pub transfers: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub retention: usize,
    pub compaction: usize,
    pub block_transfers: usize,
    /// `in-proc` or `grpc` (`virga up --transport`).
    pub transport: String,
    /// Cores the run may use (`taskset -c`), e.g. "0" or "0,1"; `None`: all.
    pub cpus: Option<String>,
}

impl RunShape {
    /// The small cluster validation runs (a few seconds each).
    pub fn small(name: &str, clients: usize, transport: &str, cpus: Option<&str>) -> RunShape {
        RunShape {
            name: name.to_string(),
            clients,
            storage_nodes: 16,
            accounts: 20_000,
            transfers: 50_000,
            batch: 100,
            in_flight: 4,
            retention: 4,
            compaction: 5,
            block_transfers: 4_000,
            transport: transport.to_string(),
            cpus: cpus.map(str::to_string),
        }
    }

    /// The shapes validated by default: two clients against four; in-process against gRPC;
    /// one core against two.
    pub fn defaults() -> Vec<RunShape> {
        vec![
            RunShape::small("inproc, 2 clients, 2 cores", 2, "in-proc", Some("0,1")),
            RunShape::small("inproc, 4 clients, 2 cores", 4, "in-proc", Some("0,1")),
            RunShape::small("grpc, 2 clients, 2 cores", 2, "grpc", Some("0,1")),
            RunShape::small("inproc, 2 clients, 1 core", 2, "in-proc", Some("0")),
        ]
    }

    fn cores(&self, machine_cores: usize) -> usize {
        self.cpus.as_ref().map_or(machine_cores, |cpus| cpus.split(',').filter(|cpu| !cpu.is_empty()).count())
    }

    /// The model's shape for this run on the calibrated machine: its cores get the same
    /// share of a core as the calibration measured for all of them.
    pub fn model_shape(&self, calibration: &Calibration) -> Shape {
        self.model_shape_with(calibration, None)
    }

    /// [`Self::model_shape`], with the cores' share measured at the time of the runs
    /// instead of the calibration's when given.
    pub fn model_shape_with(&self, calibration: &Calibration, share: Option<f64>) -> Shape {
        let machine = &calibration.machine;
        let cores = self.cores(machine.cores).clamp(1, machine.cores.max(1));
        // The share measured for these cores, else the whole machine's share, pro rata.
        let proportional = machine.effective_cores / machine.cores.max(1) as f64 * cores as f64;
        let measured = self.cpus.as_ref().and_then(|cpus| machine.cpu_share.get(cpus)).copied();
        Shape {
            machines: 1,
            threads: cores,
            effective_cores: Some(share.or(measured).unwrap_or(proportional)),
            clients: self.clients,
            miners: 1,
            storage_nodes: self.storage_nodes,
            accounts: self.accounts,
            retention: self.retention,
            batch: self.batch,
            in_flight: self.in_flight,
            max_block_transfers: self.block_transfers,
            links: if self.transport == "grpc" { Links::GrpcLoopback } else { Links::InProc },
            regions: 1,
        }
    }
}

impl RunShape {
    /// The cluster this run starts, for the simulator.
    pub fn topology(&self) -> crate::topology::Topology {
        crate::topology::Topology {
            accounts: self.accounts,
            storage_nodes: self.storage_nodes,
            clients: self.clients,
            miners: 1,
            retention: self.retention,
            compaction: self.compaction,
            batch: self.batch,
            in_flight: self.in_flight,
            max_block_transfers: self.block_transfers,
            // `virga up`'s default budget for the miner's top layer.
            top_budget_bytes: 256 << 20,
            ..crate::topology::Topology::small()
        }
    }

    /// The run predicted by simulation: the real cores in virtual time under the
    /// calibration's per-event costs, on one machine of this run's cores
    /// ([`crate::sim::predict`]). Deterministic, so it runs once, before the real runs.
    pub fn simulate(&self, calibration: &Calibration) -> Result<f64, ValidationError> {
        use crate::sim::predict::{simulate, Placement};
        let threads = self.cores(calibration.machine.cores).max(1);
        let limit = std::time::Duration::from_secs(3_600);
        let grpc = self.transport == "grpc";
        let simulated =
            simulate(calibration, &self.topology(), self.transfers, grpc, Placement::OneMachine { threads }, limit)
                .map_err(|source| ValidationError::Simulation { shape: self.name.clone(), source: Box::new(source) })?;
        if simulated.committed < simulated.offered as u64 {
            return Err(ValidationError::SimulationUnfinished {
                shape: self.name.clone(),
                committed: simulated.committed,
                offered: simulated.offered,
            });
        }
        Ok(simulated.tps)
    }
}

/// Transfers per second a run of `transfers` reports when the cluster runs at `prediction`:
/// a finite run also has a start (the first batches' round before anything commits), and
/// `virga up` notices the last commit within its 200 ms polling period (100 ms on average).
///
/// (A bound from each sender's transfers going one round after another, the busiest
/// sender's count times the loaded round, was tried and dropped: it predicted four clients
/// slower than two, and the runs measured them as fast or faster.)
pub fn finite_run_tps(prediction: &Prediction, shape: &RunShape) -> f64 {
    let tps = prediction.predicted_tps.max(1e-9);
    let start = prediction.batch_round_ms / 1e3;
    let seconds = shape.transfers as f64 / tps + start + 0.1;
    shape.transfers as f64 / seconds
}

/// What one run of `virga up` reported, with the share of its cores a busy process got
/// just before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub tps: f64,
    /// Cores' worth of CPU a CPU-bound process pinned like the run got in the second before
    /// it (`virga sim rainblock --measure-cpu-share`): the machine's other load at the time.
    pub cpu_share_before: Option<f64>,
    /// A log append with fsync just before it, microseconds: the disk's other load.
    pub fsync_us_before: Option<f64>,
    pub cpu_us_per_tx: Option<f64>,
    pub committed: u64,
    pub run_seconds: f64,
}

/// One shape's prediction (for a run of its transfers: [`finite_run_tps`]) beside its measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationRow {
    pub shape: RunShape,
    pub predicted_tps: f64,
    pub predicted_latency_ms: f64,
    pub predicted_cpu_us_per_tx: f64,
    pub bottleneck: super::model::Bottleneck,
    /// Median of the runs, and their lowest and highest.
    pub measured_tps: f64,
    pub measured_tps_min: f64,
    pub measured_tps_max: f64,
    pub measured_cpu_us_per_tx: Option<f64>,
    pub runs: Vec<Run>,
    /// (predicted − measured) / measured.
    pub error: f64,
    /// The prediction again with the machine's conditions measured beside the runs (the
    /// medians of the cores' share and of the fsync latency) instead of the frozen
    /// calibration's, every event cost unchanged, and its error: how much of the error is
    /// the machine's other load moving between the calibration and the runs.
    /// (predicted − measured) / measured CPU per transfer: the event costs' own check, which
    /// the machine's other load hardly moves (it takes cores, not work per transfer).
    pub cpu_error: Option<f64>,
    pub cpu_share_at_runs: Option<f64>,
    pub predicted_tps_at_share: Option<f64>,
    pub error_at_share: Option<f64>,
    /// The same run predicted by simulation ([`RunShape::simulate`]) from the same frozen
    /// calibration, and its error against the measured median.
    pub simulated_tps: Option<f64>,
    pub simulated_error: Option<f64>,
}

/// Why a validation run failed.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("starting {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("shape {shape}: `virga up` failed ({status}): {stderr}")]
    Failed { shape: String, status: String, stderr: String },
    #[error("shape {shape}: reading its report {path}: {reason}")]
    Report { shape: String, path: String, reason: String },
    #[error("shape {shape}: simulating it: {source}")]
    Simulation { shape: String, source: Box<crate::sim::predict::SimulateError> },
    #[error("shape {shape}: only {committed} of {offered} transfers committed in the simulation")]
    SimulationUnfinished { shape: String, committed: u64, offered: usize },
}

/// The machine's conditions now for `shape`: the share of its cores a busy process pinned
/// like it gets (one second), and the latency of a log append with fsync, microseconds.
pub fn conditions_now(virga: &Path, shape: &RunShape) -> Option<(f64, f64)> {
    let cpus = shape.cpus.as_ref()?;
    let threads = cpus.split(',').filter(|cpu| !cpu.is_empty()).count().max(1);
    let output = Command::new("taskset")
        .args(["-c", cpus])
        .arg(virga)
        .args(["sim", "rainblock", "--measure-cpu-share", &threads.to_string()])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut numbers = text.split_whitespace().map(str::parse::<f64>);
    Some((numbers.next()?.ok()?, numbers.next()?.ok()?))
}

/// Runs `shape` once: `virga up` in a child process (under `taskset` when it names cores).
pub fn run_once(virga: &Path, shape: &RunShape, scratch: &Path) -> Result<Run, ValidationError> {
    let conditions = conditions_now(virga, shape);
    let (cpu_share_before, fsync_us_before) = (conditions.map(|c| c.0), conditions.map(|c| c.1));
    let report = scratch.join(format!("up-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let mut arguments: Vec<String> = vec![
        "up".into(),
        "--accounts".into(),
        shape.accounts.to_string(),
        "--storage-nodes".into(),
        shape.storage_nodes.to_string(),
        "--clients".into(),
        shape.clients.to_string(),
        "--transfers".into(),
        shape.transfers.to_string(),
        "--batch".into(),
        shape.batch.to_string(),
        "--in-flight".into(),
        shape.in_flight.to_string(),
        "--retention".into(),
        shape.retention.to_string(),
        "--compaction".into(),
        shape.compaction.to_string(),
        "--block-transfers".into(),
        shape.block_transfers.to_string(),
        "--transport".into(),
        shape.transport.clone(),
        "--duration".into(),
        "120".into(),
        "--json".into(),
        report.display().to_string(),
    ];
    let mut command = match &shape.cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(virga);
            command
        }
        None => Command::new(virga),
    };
    let program = if shape.cpus.is_some() { "taskset".to_string() } else { virga.display().to_string() };
    let output =
        command.args(arguments.drain(..)).output().map_err(|source| ValidationError::Spawn { program, source })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(ValidationError::Failed {
            shape: shape.name.clone(),
            status: output.status.to_string(),
            stderr: tail,
        });
    }
    let bad = |reason: String| ValidationError::Report {
        shape: shape.name.clone(),
        path: report.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(&report).map_err(|error| bad(error.to_string()))?;
    let _ = std::fs::remove_file(&report);
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|error| bad(error.to_string()))?;
    let number = |field: &str| json.get(field).and_then(serde_json::Value::as_f64);
    Ok(Run {
        tps: number("tps").ok_or_else(|| bad("no tps".to_string()))?,
        cpu_share_before,
        fsync_us_before,
        cpu_us_per_tx: number("cpu_us_per_tx"),
        committed: json.get("committed").and_then(serde_json::Value::as_u64).unwrap_or(0),
        run_seconds: number("run_seconds").unwrap_or(0.0),
    })
}

/// Predicts every shape from `calibration`, then runs each `rounds` times interleaved.
/// `progress` hears each run as it ends.
pub fn validate(
    calibration: &Calibration,
    virga: &Path,
    shapes: &[RunShape],
    rounds: usize,
    scratch: &Path,
    progress: &dyn Fn(&RunShape, usize, &Run),
) -> Result<Vec<ValidationRow>, ValidationError> {
    let predictions: Vec<Prediction> = shapes
        .iter()
        .map(|shape| {
            let mut prediction = predict(calibration, &shape.model_shape(calibration));
            prediction.predicted_tps = finite_run_tps(&prediction, shape);
            prediction
        })
        .collect();
    let simulated =
        shapes.iter().map(|shape| shape.simulate(calibration)).collect::<Result<Vec<f64>, ValidationError>>()?;
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); shapes.len()];
    for round in 0..rounds {
        for (index, shape) in shapes.iter().enumerate() {
            let run = run_once(virga, shape, scratch)?;
            progress(shape, round, &run);
            runs[index].push(run);
        }
    }
    Ok(shapes
        .iter()
        .zip(predictions)
        .zip(runs)
        .zip(simulated)
        .map(|(((shape, prediction), runs), simulated)| {
            let mut row = row(calibration, shape, &prediction, runs);
            row.simulated_tps = Some(simulated);
            row.simulated_error = (row.measured_tps > 0.0).then(|| (simulated - row.measured_tps) / row.measured_tps);
            row
        })
        .collect())
}

/// A shape's row from its prediction and runs.
pub fn row(calibration: &Calibration, shape: &RunShape, prediction: &Prediction, runs: Vec<Run>) -> ValidationRow {
    let rates: Vec<f64> = runs.iter().map(|run| run.tps).collect();
    let cpu: Vec<f64> = runs.iter().filter_map(|run| run.cpu_us_per_tx).collect();
    let shares: Vec<f64> = runs.iter().filter_map(|run| run.cpu_share_before).collect();
    let measured = median(&rates);
    let error = |predicted: f64| if measured > 0.0 { (predicted - measured) / measured } else { f64::INFINITY };
    let share = (!shares.is_empty()).then(|| median(&shares));
    let fsyncs: Vec<f64> = runs.iter().filter_map(|run| run.fsync_us_before).collect();
    let at_share = share.map(|share| {
        let mut at_runs = calibration.clone();
        if !fsyncs.is_empty() {
            at_runs.storage.log_append_fsync_us = median(&fsyncs).max(at_runs.storage.log_append_cpu_us);
        }
        finite_run_tps(&predict(&at_runs, &shape.model_shape_with(&at_runs, Some(share))), shape)
    });
    let measured_cpu = (!cpu.is_empty()).then(|| median(&cpu));
    ValidationRow {
        cpu_error: measured_cpu.map(|cpu| (prediction.cpu_us_per_tx - cpu) / cpu),
        cpu_share_at_runs: share,
        predicted_tps_at_share: at_share,
        error_at_share: at_share.map(error),
        shape: shape.clone(),
        predicted_tps: prediction.predicted_tps,
        predicted_latency_ms: prediction.predicted_latency_ms,
        predicted_cpu_us_per_tx: prediction.cpu_us_per_tx,
        bottleneck: prediction.bottleneck,
        measured_tps: measured,
        measured_tps_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        measured_tps_max: rates.iter().copied().fold(0.0, f64::max),
        measured_cpu_us_per_tx: measured_cpu,
        runs,
        error: error(prediction.predicted_tps),
        simulated_tps: None,
        simulated_error: None,
    }
}
