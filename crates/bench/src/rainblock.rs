//! RainBlock's cache-retention experiments (seed 003, §8.3–8.4) as sweeps of `virga up`.
//!
//! - [`fig8`]: for every account count N and retention level r, one cluster run, recording the
//!   miner's top-layer memory (Fig. 8a), witness bytes per transfer, full against compacted
//!   and bagged (Fig. 8b), and the miner's abort rate (Fig. 8c).
//! - [`fig9a`]: for every client count and retention level, at one N, one run recording
//!   committed transfers per second (Fig. 9a).
//!
//! Every point is a fresh cluster ([`virga_node::cluster::up`]) in a scratch directory that is
//! removed afterwards. The compaction level c follows r unless the sweep fixes it. By default
//! the miner's top-layer budget is 0, so it prunes back to level r after every block: r is
//! then the size of its cache, as in the paper, and witnesses taken before a block whose
//! pruned subtrees that block changed make transfers abort and be retried.
//!
//! [`RainblockResults`] holds the machine, the sweep and every point; [`RainblockResults::write`]
//! writes it as JSON beside one SVG plot per panel (drawn with `plotters`: text is written as
//! SVG `<text>` elements for the viewer to render, so no font is read at any point).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::plot::{axis_number, draw, linear_axis, Chart, Line};
use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use serde::Serialize;
use virga_node::cluster::{up, Progress, TransportKind, UpConfig, UpReport};
use virga_node::topology::Topology;

/// Name of the results file in the output directory.
pub const RESULTS_FILE: &str = "rainblock.json";
/// Plot files, by panel.
pub const FIG8A_FILE: &str = "fig8a-memory.svg";
pub const FIG8B_FILE: &str = "fig8b-witness.svg";
pub const FIG8C_FILE: &str = "fig8c-aborts.svg";
pub const FIG9A_FILE: &str = "fig9a-throughput.svg";

/// Which figures a sweep runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Figure {
    #[cfg_attr(feature = "clap", value(name = "8", alias = "fig8"))]
    Fig8,
    #[cfg_attr(feature = "clap", value(name = "9a", alias = "fig9a"))]
    Fig9a,
    All,
}

impl Figure {
    pub fn includes_fig8(self) -> bool {
        matches!(self, Figure::Fig8 | Figure::All)
    }

    pub fn includes_fig9a(self) -> bool {
        matches!(self, Figure::Fig9a | Figure::All)
    }
}

/// A sweep: the clusters to run and how each is configured.
#[derive(Clone, Debug, Serialize)]
pub struct SweepConfig {
    /// Account counts N (Fig. 8: one line each).
    pub accounts: Vec<usize>,
    /// Retention levels r.
    pub retention: Vec<usize>,
    /// Compaction level c for every point (`None`: c = r + 1 at each point).
    pub compaction: Option<usize>,
    /// Client counts of Fig. 9a.
    pub clients: Vec<usize>,
    /// Clients of every Fig. 8 point (the paper uses enough to saturate the miner).
    pub fig8_clients: usize,
    /// N of Fig. 9a (`None`: the largest of `accounts`).
    pub fig9a_accounts: Option<usize>,
    /// Longest run of a point (a point also ends once every signed transfer has committed).
    #[serde(rename = "duration_seconds", serialize_with = "as_seconds")]
    pub duration: Duration,
    /// Transfers signed before each point's run.
    pub transfers: usize,
    pub shards: usize,
    pub storage_nodes: usize,
    /// Transfers per client submission.
    pub batch: usize,
    /// Submissions each client keeps in flight.
    pub in_flight: usize,
    /// Transfers per block at most.
    pub block_transfers: usize,
    /// The miner prunes its top layer to level r whenever it holds more than this (0: after
    /// every block).
    pub top_budget_bytes: usize,
    #[serde(serialize_with = "transport_name")]
    pub transport: TransportKind,
    pub seed: u64,
    /// Share of the transactions that are ERC-20 token transfers (contract calls).
    pub contracts: f64,
}

fn as_seconds<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

fn transport_name<S: serde::Serializer>(transport: &TransportKind, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(match transport {
        TransportKind::InProc => "inproc",
        TransportKind::Grpc => "grpc",
    })
}

impl Default for SweepConfig {
    /// The paper's sweep: N from 10^4 to 10^6, r from 1 to 5, 1 to 8 clients, 16 shards on
    /// 16 storage nodes, one miner whose cache is r levels.
    fn default() -> Self {
        SweepConfig {
            accounts: vec![10_000, 100_000, 1_000_000],
            retention: vec![1, 2, 3, 4, 5],
            compaction: None,
            clients: vec![1, 2, 4, 8],
            fig8_clients: 4,
            fig9a_accounts: None,
            duration: Duration::from_secs(20),
            transfers: 100_000,
            shards: 16,
            storage_nodes: 16,
            batch: 250,
            in_flight: 4,
            block_transfers: 4_000,
            top_budget_bytes: 0,
            transport: TransportKind::InProc,
            seed: 7,
            contracts: 0.0,
        }
    }
}

impl SweepConfig {
    /// Refuses sweeps that could not run or would never finish, naming the setting.
    pub fn validate(&self, figure: Figure) -> Result<()> {
        if self.retention.is_empty() {
            bail!("no retention level given");
        }
        if let Some(r) = self.retention.iter().find(|&&r| r > 63) {
            bail!("retention level {r} is deeper than a 64-nibble key path");
        }
        if let Some(c) = self.compaction {
            // Witnesses must carry every node below what a pruned top layer keeps (levels 0..=r).
            if let Some(r) = self.retention.iter().find(|&&r| c > r + 1) {
                bail!("compaction level {c} would leave out level {} the miner prunes at r = {r} (c ≤ r + 1)", r + 1);
            }
        }
        if figure.includes_fig8() && self.accounts.is_empty() {
            bail!("no account count given for Fig. 8");
        }
        if figure.includes_fig9a() {
            if self.clients.is_empty() {
                bail!("no client count given for Fig. 9a");
            }
            self.fig9a_accounts()?;
        }
        let accounts = self.accounts.iter().chain(self.fig9a_accounts.iter());
        if let Some(n) = accounts.into_iter().find(|&&n| n < 2) {
            bail!("{n} accounts: a transfer needs at least 2");
        }
        if self.clients.contains(&0) || self.fig8_clients == 0 {
            bail!("a cluster needs at least one client");
        }
        if ![1, 16, 256].contains(&self.shards) {
            bail!("{} shards: the bottom layer is split into 1, 16 or 256", self.shards);
        }
        if self.storage_nodes == 0 {
            bail!("a cluster needs at least one storage node");
        }
        if self.transfers == 0 {
            bail!("no transfers to run");
        }
        if self.duration.is_zero() {
            bail!("a point's duration must be positive");
        }
        if self.batch == 0 || self.in_flight == 0 || self.block_transfers == 0 {
            bail!("batch, in-flight submissions and block transfers must be positive");
        }
        Ok(())
    }

    /// The compaction level used with retention level `retention`: by default r + 1, the
    /// first level a miner that keeps levels 0..=r may lack.
    pub fn compaction_for(&self, retention: usize) -> usize {
        self.compaction.unwrap_or(retention + 1)
    }

    /// N of Fig. 9a.
    pub fn fig9a_accounts(&self) -> Result<usize> {
        self.fig9a_accounts
            .or_else(|| self.accounts.iter().copied().max())
            .ok_or_else(|| anyhow!("Fig. 9a needs an account count (none given)"))
    }

    /// The cluster of one point, with its data in `dir`.
    pub fn up_config(&self, dir: &Path, accounts: usize, retention: usize, clients: usize) -> UpConfig {
        UpConfig {
            topology: Topology {
                accounts,
                shards: self.shards,
                storage_nodes: self.storage_nodes,
                replicas: 1,
                miners: 1,
                clients,
                retention,
                compaction: self.compaction_for(retention),
                batch: self.batch,
                in_flight: self.in_flight,
                max_block_transfers: self.block_transfers,
                top_budget_bytes: self.top_budget_bytes,
                seed: self.seed,
            },
            dir: dir.to_path_buf(),
            duration: self.duration,
            transfers: self.transfers,
            rate: None,
            contracts: self.contracts,
            transport: self.transport,
        }
    }
}

/// Transfers the miner left out (`aborts`, by reason) and their share of the transfers it
/// decided on: `aborted / (committed + aborted)`. Aborted transfers are retried, so one
/// transfer can count more than once.
pub fn abort_rate(committed: u64, aborts: &BTreeMap<String, u64>) -> (u64, f64) {
    let aborted: u64 = aborts.values().sum();
    let decided = committed + aborted;
    (aborted, if decided == 0 { 0.0 } else { aborted as f64 / decided as f64 })
}

/// What every point takes from its run's report.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub offered: usize,
    pub committed: u64,
    /// Committed with a successful receipt.
    pub succeeded: u64,
    /// Dropped by clients before submission as certain to fail, all reasons.
    pub filtered: u64,
    pub aborted: u64,
    pub abort_rate: f64,
    pub tps: f64,
    pub run_seconds: f64,
    /// The whole report, as `virga up --json` writes it.
    pub report: serde_json::Value,
}

impl RunSummary {
    pub fn of(report: &UpReport) -> Result<RunSummary> {
        let (aborted, abort_rate) = abort_rate(report.committed, &report.aborts_by_reason);
        Ok(RunSummary {
            offered: report.offered,
            committed: report.committed,
            succeeded: report.succeeded,
            filtered: report.filtered.values().sum(),
            aborted,
            abort_rate,
            tps: report.tps,
            run_seconds: report.run_seconds,
            report: serde_json::to_value(report).context("encoding the cluster's report")?,
        })
    }
}

/// A point of Fig. 8.
#[derive(Clone, Debug, Serialize)]
pub struct Fig8Point {
    pub accounts: usize,
    pub retention: usize,
    pub compaction: usize,
    pub clients: usize,
    /// The largest the miner's top layer was (estimated bytes, measured before each prune).
    pub top_layer_peak_bytes: usize,
    /// Nodes of the top layer at the end (hash nodes included).
    pub top_layer_nodes: usize,
    pub prunes: u64,
    pub blocks: u64,
    /// Each submitted transfer's own full witnesses, nothing shared.
    pub witness_bytes_full_per_tx: f64,
    /// What clients actually sent per transfer: bagged, above level c left out.
    pub witness_bytes_compact_per_tx: f64,
    /// compact / full (0 if nothing was submitted).
    pub witness_compact_ratio: f64,
    #[serde(flatten)]
    pub run: RunSummary,
}

impl Fig8Point {
    pub fn from_report(report: &UpReport) -> Result<Fig8Point> {
        let ratio = if report.witness_bytes_full_per_tx > 0.0 {
            report.witness_bytes_compact_per_tx / report.witness_bytes_full_per_tx
        } else {
            0.0
        };
        Ok(Fig8Point {
            accounts: report.accounts,
            retention: report.retention,
            compaction: report.compaction,
            clients: report.clients,
            top_layer_peak_bytes: report.top_layer_peak_bytes,
            top_layer_nodes: report.top_layer_nodes,
            prunes: report.prunes,
            blocks: report.blocks,
            witness_bytes_full_per_tx: report.witness_bytes_full_per_tx,
            witness_bytes_compact_per_tx: report.witness_bytes_compact_per_tx,
            witness_compact_ratio: ratio,
            run: RunSummary::of(report)?,
        })
    }

    /// The header of [`Fig8Point::row`]'s table.
    pub fn header() -> String {
        format!(
            "{:>9} {:>3} {:>3} {:>11} {:>9} {:>10} {:>10} {:>7} {:>8} {:>9} {:>15}",
            "N", "r", "c", "peak KiB", "top nodes", "full B/tx", "compact", "ratio", "aborts", "tx/s", "committed"
        )
    }

    /// One line of the table.
    pub fn row(&self) -> String {
        format!(
            "{:>9} {:>3} {:>3} {:>11.1} {:>9} {:>10.0} {:>10.0} {:>6.1}% {:>7.2}% {:>9.0} {:>15}",
            self.accounts,
            self.retention,
            self.compaction,
            self.top_layer_peak_bytes as f64 / 1024.0,
            self.top_layer_nodes,
            self.witness_bytes_full_per_tx,
            self.witness_bytes_compact_per_tx,
            100.0 * self.witness_compact_ratio,
            100.0 * self.run.abort_rate,
            self.run.tps,
            format!("{}/{}", self.run.committed, self.run.offered)
        )
    }
}

/// A point of Fig. 9a.
#[derive(Clone, Debug, Serialize)]
pub struct Fig9aPoint {
    pub accounts: usize,
    pub clients: usize,
    pub retention: usize,
    pub compaction: usize,
    #[serde(flatten)]
    pub run: RunSummary,
}

impl Fig9aPoint {
    pub fn from_report(report: &UpReport) -> Result<Fig9aPoint> {
        Ok(Fig9aPoint {
            accounts: report.accounts,
            clients: report.clients,
            retention: report.retention,
            compaction: report.compaction,
            run: RunSummary::of(report)?,
        })
    }

    /// The header of [`Fig9aPoint::row`]'s table.
    pub fn header() -> String {
        format!(
            "{:>9} {:>7} {:>3} {:>3} {:>9} {:>8} {:>8} {:>15}",
            "N", "clients", "r", "c", "tx/s", "aborts", "run s", "committed"
        )
    }

    /// One line of the table.
    pub fn row(&self) -> String {
        format!(
            "{:>9} {:>7} {:>3} {:>3} {:>9.0} {:>7.2}% {:>8.1} {:>15}",
            self.accounts,
            self.clients,
            self.retention,
            self.compaction,
            self.run.tps,
            100.0 * self.run.abort_rate,
            self.run.run_seconds,
            format!("{}/{}", self.run.committed, self.run.offered)
        )
    }
}

/// What a sweep reports as it goes.
pub enum SweepEvent<'a, P> {
    /// Point `index` (from 0) of `total` is starting; `label` describes it.
    Starting {
        index: usize,
        total: usize,
        label: &'a str,
    },
    Finished {
        index: usize,
        total: usize,
        point: &'a P,
    },
}

/// Runs one cluster in a scratch directory (removed afterwards) on a runtime of its own.
fn run_cluster(
    config: &SweepConfig,
    accounts: usize,
    retention: usize,
    clients: usize,
    progress: &dyn Progress,
) -> Result<UpReport> {
    let scratch = tempfile::Builder::new()
        .prefix("virga-rainblock-")
        .tempdir()
        .context("creating a scratch directory for the cluster")?;
    let up_config = config.up_config(scratch.path(), accounts, retention, clients);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let report = runtime.block_on(up(up_config, progress)).map_err(|error| {
        anyhow!(
            "the cluster with N = {accounts}, r = {retention}, c = {}, {clients} clients failed: {error}",
            config.compaction_for(retention)
        )
    })?;
    drop(runtime);
    Ok(report)
}

/// One point of a sweep: its label, and the cluster's N, r and client count.
struct PlannedPoint {
    label: String,
    accounts: usize,
    retention: usize,
    clients: usize,
}

/// Runs a cluster per planned point, in order, telling `on_event` as each starts and ends.
fn run_points<P>(
    config: &SweepConfig,
    plan: Vec<PlannedPoint>,
    point_of: fn(&UpReport) -> Result<P>,
    progress: &dyn Progress,
    on_event: &mut dyn FnMut(SweepEvent<'_, P>),
) -> Result<Vec<P>> {
    let total = plan.len();
    let mut points = Vec::with_capacity(total);
    for (index, planned) in plan.into_iter().enumerate() {
        on_event(SweepEvent::Starting { index, total, label: &planned.label });
        let report = run_cluster(config, planned.accounts, planned.retention, planned.clients, progress)?;
        let point = point_of(&report)?;
        on_event(SweepEvent::Finished { index, total, point: &point });
        points.push(point);
    }
    Ok(points)
}

/// Fig. 8: one cluster per account count and retention level (in that order).
pub fn fig8(
    config: &SweepConfig,
    progress: &dyn Progress,
    on_event: &mut dyn FnMut(SweepEvent<'_, Fig8Point>),
) -> Result<Vec<Fig8Point>> {
    config.validate(Figure::Fig8)?;
    let clients = config.fig8_clients;
    let plan = config
        .accounts
        .iter()
        .flat_map(|&accounts| {
            config.retention.iter().map(move |&retention| PlannedPoint {
                label: format!("N={accounts} r={retention} c={} clients={clients}", config.compaction_for(retention)),
                accounts,
                retention,
                clients,
            })
        })
        .collect();
    run_points(config, plan, Fig8Point::from_report, progress, on_event)
}

/// Fig. 9a: one cluster per client count and retention level (in that order), at one N.
pub fn fig9a(
    config: &SweepConfig,
    progress: &dyn Progress,
    on_event: &mut dyn FnMut(SweepEvent<'_, Fig9aPoint>),
) -> Result<Vec<Fig9aPoint>> {
    config.validate(Figure::Fig9a)?;
    let accounts = config.fig9a_accounts()?;
    let plan = config
        .clients
        .iter()
        .flat_map(|&clients| {
            config.retention.iter().map(move |&retention| PlannedPoint {
                label: format!("N={accounts} clients={clients} r={retention} c={}", config.compaction_for(retention)),
                accounts,
                retention,
                clients,
            })
        })
        .collect();
    run_points(config, plan, Fig9aPoint::from_report, progress, on_event)
}

/// The machine a sweep ran on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    /// From /proc/cpuinfo, where readable.
    pub cpu_model: Option<String>,
}

impl Machine {
    pub fn detect() -> Machine {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|cpuinfo| {
            cpuinfo.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_string())
            })
        });
        Machine { cores, cpu_model }
    }
}

/// A sweep's results: what ran where, and every point.
#[derive(Clone, Debug, Serialize)]
pub struct RainblockResults {
    pub machine: Machine,
    /// The command line that ran the sweep, if it came from one.
    pub command: Option<String>,
    pub config: SweepConfig,
    pub fig8: Vec<Fig8Point>,
    pub fig9a: Vec<Fig9aPoint>,
}

impl RainblockResults {
    pub fn new(config: SweepConfig) -> RainblockResults {
        RainblockResults { machine: Machine::detect(), command: None, config, fig8: Vec::new(), fig9a: Vec::new() }
    }

    /// Writes [`RESULTS_FILE`] into `dir` (created if missing); returns its path.
    pub fn write_json(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(RESULTS_FILE);
        let json = serde_json::to_string_pretty(self).context("encoding the results as JSON")?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Writes the JSON and the plots of every figure that has points; returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut written = vec![self.write_json(dir)?];
        if !self.fig8.is_empty() {
            written.extend(plot_fig8(&self.fig8, dir)?);
        }
        if !self.fig9a.is_empty() {
            written.push(plot_fig9a(&self.fig9a, dir)?);
        }
        Ok(written)
    }
}

/// The unit bytes up to `largest` read best in: its name and size.
fn bytes_unit(largest: f64) -> (&'static str, f64) {
    match largest {
        b if b >= 10.0 * (1u64 << 30) as f64 => ("GiB", (1u64 << 30) as f64),
        b if b >= 10.0 * (1u64 << 20) as f64 => ("MiB", (1u64 << 20) as f64),
        b if b >= 10.0 * 1024.0 => ("KiB", 1024.0),
        _ => ("bytes", 1.0),
    }
}

/// Fig. 8's three panels in `dir`: top-layer memory, witness bytes and abort rate against r,
/// one line per N.
pub fn plot_fig8(points: &[Fig8Point], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let accounts: BTreeSet<usize> = points.iter().map(|point| point.accounts).collect();
    let per_n = |n: usize, value: &dyn Fn(&Fig8Point) -> f64| -> Vec<(f64, f64)> {
        let mut line: Vec<(f64, f64)> = points
            .iter()
            .filter(|point| point.accounts == n)
            .map(|point| (point.retention as f64, value(point)))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        line
    };

    let largest = points.iter().map(|point| point.top_layer_peak_bytes).max().unwrap_or(0) as f64;
    let (unit, unit_bytes) = bytes_unit(largest);
    let memory_label = format!("top-layer peak memory ({unit})");
    let memory = Chart {
        title: "Fig. 8a: miner's top-layer memory (peak) vs retention r",
        x_label: "retention level r",
        x_step: 1.0,
        y_label: &memory_label,
        lines: accounts
            .iter()
            .enumerate()
            .map(|(colour, &n)| Line {
                label: format!("N = {n}"),
                colour,
                dashed: false,
                points: per_n(n, &|point| point.top_layer_peak_bytes.max(1) as f64 / unit_bytes),
            })
            .collect(),
    };
    let memory_path = dir.join(FIG8A_FILE);
    let (low, high) = memory.ys().fold((f64::INFINITY, 0.0f64), |(low, high), y| (low.min(y), high.max(y)));
    if low.is_finite() && low > 0.0 && high / low >= 20.0 {
        // Memories that span orders of magnitude (small r against large N) on a log axis, with
        // the legend's room above the lines as a share of the decades shown.
        let bottom = low / 2.0;
        let decades = (high / bottom).log10() / (1.0 - memory.legend_share());
        let top = bottom * 10f64.powf(decades);
        draw(&memory_path, &memory, (bottom..top).log_scale(), &|y| axis_number(*y))?;
    } else {
        draw(&memory_path, &memory, linear_axis(&memory), &|y| axis_number(*y))?;
    }

    let mut witness_lines = Vec::new();
    for (colour, &n) in accounts.iter().enumerate() {
        witness_lines.push(Line {
            label: format!("N = {n}, compacted + bagged"),
            colour,
            dashed: false,
            points: per_n(n, &|point| point.witness_bytes_compact_per_tx),
        });
        witness_lines.push(Line {
            label: format!("N = {n}, full (dashed)"),
            colour,
            dashed: true,
            points: per_n(n, &|point| point.witness_bytes_full_per_tx),
        });
    }
    let compactions: BTreeSet<Option<usize>> =
        points.iter().map(|point| (point.compaction != point.retention).then_some(point.compaction)).collect();
    let witness_title = match compactions.iter().collect::<Vec<_>>().as_slice() {
        [None] => "Fig. 8b: witness bytes per transfer vs retention r (c = r + 1)".to_string(),
        [Some(c)] => format!("Fig. 8b: witness bytes per transfer vs retention r (c = {c})"),
        _ => "Fig. 8b: witness bytes per transfer vs retention r".to_string(),
    };
    let witness = Chart {
        title: &witness_title,
        x_label: "retention level r",
        x_step: 1.0,
        y_label: "witness bytes per transfer",
        lines: witness_lines,
    };
    let witness_path = dir.join(FIG8B_FILE);
    draw(&witness_path, &witness, linear_axis(&witness), &|y| axis_number(*y))?;

    let aborts = Chart {
        title: "Fig. 8c: miner's abort rate vs retention r",
        x_label: "retention level r",
        x_step: 1.0,
        y_label: "aborted / (committed + aborted), %",
        lines: accounts
            .iter()
            .enumerate()
            .map(|(colour, &n)| Line {
                label: format!("N = {n}"),
                colour,
                dashed: false,
                points: per_n(n, &|point| 100.0 * point.run.abort_rate),
            })
            .collect(),
    };
    let aborts_path = dir.join(FIG8C_FILE);
    draw(&aborts_path, &aborts, linear_axis(&aborts), &|y| axis_number(*y))?;
    Ok(vec![memory_path, witness_path, aborts_path])
}

/// Fig. 9a in `dir`: committed transfers per second against clients, one line per r.
pub fn plot_fig9a(points: &[Fig9aPoint], dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let levels: BTreeSet<usize> = points.iter().map(|point| point.retention).collect();
    let accounts: BTreeSet<usize> = points.iter().map(|point| point.accounts).collect();
    let title = match accounts.iter().collect::<Vec<_>>().as_slice() {
        [n] => format!("Fig. 9a: throughput vs clients (N = {n})"),
        _ => "Fig. 9a: throughput vs clients".to_string(),
    };
    let chart = Chart {
        title: &title,
        x_label: "prefetching clients",
        x_step: 1.0,
        y_label: "committed transfers per second",
        lines: levels
            .iter()
            .enumerate()
            .map(|(colour, &r)| {
                let mut line: Vec<(f64, f64)> = points
                    .iter()
                    .filter(|point| point.retention == r)
                    .map(|point| (point.clients as f64, point.run.tps))
                    .collect();
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                Line { label: format!("r = {r}"), colour, dashed: false, points: line }
            })
            .collect(),
    };
    let path = dir.join(FIG9A_FILE);
    draw(&path, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run of `accounts` at retention `retention` might give, without running one.
    fn run(clients: usize, retention: usize, aborted: u64) -> RunSummary {
        RunSummary {
            offered: 1_000,
            committed: 1_000,
            succeeded: 1_000,
            filtered: 0,
            aborted,
            abort_rate: abort_rate(1_000, &BTreeMap::from([("stale_witness".to_string(), aborted)])).1,
            tps: 500.0 * clients as f64 + 100.0 * retention as f64,
            run_seconds: 2.0,
            report: serde_json::Value::Null,
        }
    }

    #[test]
    fn abort_rate_counts_every_reason_against_committed_plus_aborted() {
        let aborts =
            BTreeMap::from([("stale_witness".to_string(), 250), ("earlier_transfer_aborted".to_string(), 750)]);
        assert_eq!(abort_rate(1_000, &aborts), (1_000, 0.5));
        assert_eq!(abort_rate(0, &BTreeMap::new()), (0, 0.0));
        assert_eq!(abort_rate(0, &aborts), (1_000, 1.0));
    }

    #[test]
    fn plots_with_many_lines_and_memory_over_decades_render_with_their_labels() {
        let mut fig8 = Vec::new();
        for (index, accounts) in [10_000usize, 100_000, 1_000_000].into_iter().enumerate() {
            for retention in 1..=5 {
                let full = 3_000.0 + accounts as f64 / 1_000.0;
                let compact = 1_500.0 / retention as f64;
                fig8.push(Fig8Point {
                    accounts,
                    retention,
                    compaction: retention,
                    clients: 4,
                    // From KiB to hundreds of MiB: the memory axis goes logarithmic.
                    top_layer_peak_bytes: 4_096usize << (3 * retention + 2 * index),
                    top_layer_nodes: 17usize.pow(retention as u32),
                    prunes: 10,
                    blocks: 10,
                    witness_bytes_full_per_tx: full,
                    witness_bytes_compact_per_tx: compact,
                    witness_compact_ratio: compact / full,
                    run: run(4, retention, 100 / retention as u64),
                });
            }
        }
        let header = Fig8Point::header().split_whitespace().count();
        // "peak KiB", "top nodes" and "full B/tx" are two words each in the header.
        assert_eq!(fig8[0].row().split_whitespace().count() + 3, header);
        let fig9a: Vec<Fig9aPoint> = [1, 2, 4, 8]
            .into_iter()
            .flat_map(|clients| {
                (1..=5).map(move |retention| Fig9aPoint {
                    accounts: 1_000_000,
                    clients,
                    retention,
                    compaction: retention,
                    run: run(clients, retention, 0),
                })
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let mut results = RainblockResults::new(SweepConfig::default());
        results.fig8 = fig8;
        results.fig9a = fig9a;
        let written = results.write(dir.path()).unwrap();
        assert_eq!(written.len(), 5);
        let read = |file: &str| std::fs::read_to_string(dir.path().join(file)).unwrap();
        let memory = read(FIG8A_FILE);
        assert!(memory.contains("<svg") && memory.contains("top-layer peak memory (MiB)"));
        for n in ["N = 10000", "N = 100000", "N = 1000000"] {
            assert!(memory.contains(n), "{n}");
            assert!(read(FIG8B_FILE).contains(&format!("{n}, full (dashed)")));
            assert!(read(FIG8C_FILE).contains(n));
        }
        assert!(read(FIG8B_FILE).contains("(c = r + 1)"));
        let throughput = read(FIG9A_FILE);
        assert!(throughput.contains("N = 1000000"));
        for r in 1..=5 {
            assert!(throughput.contains(&format!("r = {r}")));
        }
        let json: serde_json::Value = serde_json::from_str(&read(RESULTS_FILE)).unwrap();
        assert_eq!(json["fig8"].as_array().unwrap().len(), 15);
        let rate = json["fig8"][0]["abort_rate"].as_f64().unwrap();
        assert!((rate - 100.0 / 1_100.0).abs() < 1e-12, "{rate}");
        assert_eq!(json["fig9a"].as_array().unwrap().len(), 20);
        assert_eq!(json["config"]["duration_seconds"], 20.0);
    }
}
