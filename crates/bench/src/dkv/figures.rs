//! Seed 004's figures on the store (`virga bench dkv --figure …`), each a sweep of
//! interleaved runs (every point once per round, `runs` rounds, medians), written as JSON
//! with an SVG plot:
//!
//! - [`semel_table`]: Table 3.2's shape, its in-memory column: single-key gets and blind
//!   puts at 100/75/50/25% gets from asynchronous clients (5 clients × 32 in flight, as the
//!   seed), throughput and the mean get and put latency.
//! - [`milana_skew`]: Fig. 3.6: Retwis abort rates with every client's clock off by a
//!   PTP-like or an NTP-like offset, across Zipf exponents.
//! - [`milana_validation`]: Fig. 3.7: read-only transactions validated at the client
//!   (MILANA) or at the primaries, ycsb-t at rising client counts: throughput, latency and
//!   requests per commit.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use virga_core::clock::SkewProfile;
use virga_dkv::client::ReadOnlyValidation;

use super::{run_store, run_store_sessions, DkvBenchConfig, DkvBenchReport};
use crate::kv::retwis::{RetwisConfig, RetwisWorkload};
use crate::kv::ycsb_t::{YcsbT, YcsbTConfig};
use crate::median;
use crate::plot::{axis_number, draw, linear_axis, Chart, Line};

/// Gets' shares of SEMEL's Table 3.2, in percent.
pub const SEMEL_GET_PERCENTS: [u32; 4] = [100, 75, 50, 25];
/// Zipf exponents of MILANA's skew sweep.
pub const MILANA_ZIPFS: [f64; 7] = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4];
/// Client counts of the validation sweep.
pub const VALIDATION_CLIENTS: [usize; 4] = [1, 4, 16, 64];

/// One point of a sweep: its runs and their medians.
#[derive(Debug, Serialize)]
pub struct Point {
    /// What varies (the get percent, the Zipf exponent, the client count).
    pub x: f64,
    /// Which line it belongs to (`store`, `ptp`, `ntp`, `local`, `remote`).
    pub series: String,
    pub committed_per_sec: f64,
    pub abort_rate: f64,
    pub read_only_mean_us: f64,
    pub read_write_mean_us: f64,
    pub mean_latency_us: f64,
    pub requests_per_commit: f64,
    pub runs: Vec<DkvBenchReport>,
}

impl Point {
    fn new(x: f64, series: &str, runs: Vec<DkvBenchReport>) -> Point {
        let of = |value: fn(&DkvBenchReport) -> f64| median(&mut runs.iter().map(value).collect::<Vec<_>>());
        Point {
            x,
            series: series.to_string(),
            committed_per_sec: of(|r| r.committed_per_sec),
            abort_rate: of(|r| r.abort_rate),
            read_only_mean_us: of(|r| r.read_only_mean_us),
            read_write_mean_us: of(|r| r.read_write_mean_us),
            mean_latency_us: of(|r| r.mean_latency_us),
            requests_per_commit: of(|r| r.requests_per_commit),
            runs,
        }
    }
}

/// A figure's points and how they were made.
#[derive(Debug, Serialize)]
pub struct Figure {
    pub figure: &'static str,
    pub shards: u32,
    pub replicas: usize,
    pub sync: &'static str,
    pub runs: usize,
    pub duration_s: f64,
    /// What the figure's runs hold fixed that the command line does not say.
    pub setting: String,
    pub points: Vec<Point>,
}

impl Figure {
    /// The points of `series`, in sweep order.
    pub fn series<'a>(&'a self, series: &'a str) -> impl Iterator<Item = &'a Point> + 'a {
        self.points.iter().filter(move |point| point.series == series)
    }

    /// Writes the JSON to `path` and the plots beside it (`path` without `.json`, plus
    /// `-NAME.svg`); returns the files written.
    pub fn write(&self, path: &Path) -> Result<Vec<std::path::PathBuf>> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let stem = path.with_extension("");
        let svg = |name: &str| std::path::PathBuf::from(format!("{}-{name}.svg", stem.display()));
        let mut written = vec![path.to_path_buf()];
        for (name, chart) in self.charts() {
            let file = svg(name);
            draw(&file, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
            written.push(file);
        }
        Ok(written)
    }

    fn line(&self, series: &str, label: &str, colour: usize, value: fn(&Point) -> f64) -> Line {
        Line {
            label: label.to_string(),
            colour,
            dashed: false,
            points: self.series(series).map(|point| (point.x, value(point))).collect(),
        }
    }

    fn charts(&self) -> Vec<(&'static str, Chart<'_>)> {
        match self.figure {
            "semel-table" => vec![
                (
                    "throughput",
                    Chart {
                        title: "SEMEL Table 3.2 (in memory): throughput vs gets",
                        x_label: "gets, % of operations",
                        x_step: 25.0,
                        y_label: "operations per second",
                        lines: vec![self.line("store", "3 shards x 3 replicas", 0, |p| p.committed_per_sec)],
                    },
                ),
                (
                    "latency",
                    Chart {
                        title: "SEMEL Table 3.2 (in memory): mean latency vs gets",
                        x_label: "gets, % of operations",
                        x_step: 25.0,
                        y_label: "mean latency, µs",
                        lines: vec![
                            self.line("store", "get", 0, |p| p.read_only_mean_us),
                            self.line("store", "put", 1, |p| p.read_write_mean_us),
                        ],
                    },
                ),
            ],
            "milana-skew" => vec![(
                "aborts",
                Chart {
                    title: "MILANA Fig. 3.6: Retwis abort rate vs contention",
                    x_label: "Zipf exponent",
                    x_step: 0.2,
                    y_label: "aborted / (committed + aborted), %",
                    lines: vec![
                        self.line("ptp", "PTP-like skew (53 µs)", 0, |p| p.abort_rate * 100.0),
                        self.line("ntp", "NTP-like skew (1.5 ms)", 1, |p| p.abort_rate * 100.0),
                    ],
                },
            )],
            _ => vec![
                (
                    "throughput",
                    Chart {
                        title: "MILANA Fig. 3.7: local vs remote validation, throughput",
                        x_label: "clients",
                        x_step: 1.0,
                        y_label: "committed transactions per second",
                        lines: vec![
                            self.line("local", "local (at the client)", 0, |p| p.committed_per_sec),
                            self.line("remote", "remote (at the primaries)", 1, |p| p.committed_per_sec),
                        ],
                    },
                ),
                (
                    "latency",
                    Chart {
                        title: "MILANA Fig. 3.7: local vs remote validation, read-only latency",
                        x_label: "clients",
                        x_step: 1.0,
                        y_label: "mean latency of read-only transactions, µs",
                        lines: vec![
                            self.line("local", "local (at the client)", 0, |p| p.read_only_mean_us),
                            self.line("remote", "remote (at the primaries)", 1, |p| p.read_only_mean_us),
                        ],
                    },
                ),
            ],
        }
    }
}

fn figure(name: &'static str, base: &DkvBenchConfig, runs: usize, setting: String, points: Vec<Point>) -> Figure {
    Figure {
        figure: name,
        shards: base.shards,
        replicas: base.replicas,
        sync: if base.sync { "group" } else { "none" },
        runs,
        duration_s: base.duration.as_secs_f64(),
        setting,
        points,
    }
}

/// Runs `point(index, round)` for every index in every round, interleaved; returns each
/// index's runs.
fn interleaved(
    count: usize,
    runs: usize,
    mut point: impl FnMut(usize, usize) -> Result<DkvBenchReport>,
) -> Result<Vec<Vec<DkvBenchReport>>> {
    let mut results: Vec<Vec<DkvBenchReport>> = (0..count).map(|_| Vec::new()).collect();
    for round in 0..runs {
        for (index, runs) in results.iter_mut().enumerate() {
            runs.push(point(index, round)?);
        }
    }
    Ok(results)
}

/// SEMEL Table 3.2's shape (see the module's documentation).
pub fn semel_table(base: &DkvBenchConfig, records: u64, value_size: usize, runs: usize) -> Result<Figure> {
    let workloads: Vec<YcsbT> = SEMEL_GET_PERCENTS
        .iter()
        .map(|&percent| {
            YcsbT::new(YcsbTConfig {
                records,
                value_size,
                keys_per_txn: 1,
                read_only_percent: percent,
                read_zipf: 0.0,
                write_zipf: 0.0,
                blind_writes: true,
            })
        })
        .collect::<Result<_>>()?;
    let config = DkvBenchConfig { clients: 5, in_flight: 32, window: 64, ..base.clone() };
    let results = interleaved(workloads.len(), runs, |index, round| {
        let report =
            run_store(&DkvBenchConfig { seed: base.seed ^ round as u64, ..config.clone() }, &workloads[index])?;
        eprintln!(
            "  round {}: {:>3}% gets: {:>9.0} ops/s, get {:.0} µs, put {:.0} µs",
            round + 1,
            SEMEL_GET_PERCENTS[index],
            report.committed_per_sec,
            report.read_only_mean_us,
            report.read_write_mean_us
        );
        Ok(report)
    })?;
    let points = results
        .into_iter()
        .zip(SEMEL_GET_PERCENTS)
        .map(|(runs, percent)| Point::new(f64::from(percent), "store", runs))
        .collect();
    let setting = format!(
        "5 clients x 32 operations in flight; uniform keys over {records} records of {value_size} bytes; a get is a \
         read-only transaction of one key (validated at the client), a put a one-key blind write committed in one \
         round trip (the primary logs it and waits for f backups)"
    );
    Ok(figure("semel-table", &config, runs, setting, points))
}

/// MILANA Fig. 3.6 (see the module's documentation).
pub fn milana_skew(base: &DkvBenchConfig, keys: u64, value_size: usize, runs: usize) -> Result<Figure> {
    let workloads: Vec<RetwisWorkload> = MILANA_ZIPFS
        .iter()
        .map(|&zipf| RetwisWorkload::new(RetwisConfig { keys, zipf, value_size }))
        .collect::<Result<_>>()?;
    let skews = [SkewProfile::Ptp, SkewProfile::Ntp];
    let results = interleaved(workloads.len() * skews.len(), runs, |index, round| {
        let (zipf, skew) = (index / skews.len(), skews[index % skews.len()]);
        let config = DkvBenchConfig { skew, seed: base.seed ^ round as u64, ..base.clone() };
        let run = run_store_sessions(&config, &workloads[zipf], None)?;
        eprintln!(
            "  round {}: zipf {:.1} {}: abort rate {:.2}%, {:.0} committed/s",
            round + 1,
            MILANA_ZIPFS[zipf],
            skew.name(),
            run.report.abort_rate * 100.0,
            run.report.committed_per_sec
        );
        Ok(run.report)
    })?;
    let points = results
        .into_iter()
        .enumerate()
        .map(|(index, runs)| Point::new(MILANA_ZIPFS[index / skews.len()], skews[index % skews.len()].name(), runs))
        .collect();
    let setting = format!(
        "Retwis (5/10/35/50 mix) over {keys} keys through interactive sessions, {} clients, each client's clock off by \
         an offset drawn from the profile; an abort runs again at once with the same keys",
        base.clients
    );
    Ok(figure("milana-skew", base, runs, setting, points))
}

/// MILANA Fig. 3.7 (see the module's documentation).
pub fn milana_validation(base: &DkvBenchConfig, workload: &YcsbT, runs: usize) -> Result<Figure> {
    let modes = [(ReadOnlyValidation::Local, "local"), (ReadOnlyValidation::Remote, "remote")];
    let results = interleaved(VALIDATION_CLIENTS.len() * modes.len(), runs, |index, round| {
        let (clients, (validation, name)) = (VALIDATION_CLIENTS[index / modes.len()], modes[index % modes.len()]);
        let config = DkvBenchConfig { clients, validation, seed: base.seed ^ round as u64, ..base.clone() };
        let report = run_store(&config, workload)?;
        eprintln!(
            "  round {}: {clients} clients, {name}: {:.0} committed/s, read-only {:.0} µs, {:.2} requests a commit",
            round + 1,
            report.committed_per_sec,
            report.read_only_mean_us,
            report.requests_per_commit
        );
        Ok(report)
    })?;
    let points = results
        .into_iter()
        .enumerate()
        .map(|(index, runs)| {
            Point::new(VALIDATION_CLIENTS[index / modes.len()] as f64, modes[index % modes.len()].1, runs)
        })
        .collect();
    let config = workload.config();
    let setting = format!(
        "ycsb-t ({} keys a transaction, {}% read-only, Zipf {} / {}) over {} records; remote: read-only transactions \
         prepare at every participant and then decide, as read-write ones",
        config.keys_per_txn, config.read_only_percent, config.read_zipf, config.write_zipf, config.records
    );
    Ok(figure("milana-validation", base, runs, setting, points))
}
