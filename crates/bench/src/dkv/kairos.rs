//! `virga bench kairos`: KAIROS's inter-transaction caching on the store, at the seed's
//! setting scaled to this machine (ycsb-t: 4 keys a transaction, 90% read-only, Zipf 0.99
//! reads and 0.75 read-writes; each client caches the hottest 0.1% of the keys).
//!
//! - [`compare_modes`]: the cache modes (no caching, the ideal lease, naïve, static P(x)) in
//!   interleaved rounds: throughput, fresh-hit and stale rates, requests to the primaries
//!   per committed transaction, and the lease lengths the primaries chose (Figs. 4.9, 4.10
//!   and 4.16's caching bar). Every mode validates read-only transactions at the primaries
//!   in one round with nothing logged (`ReadOnlyValidation::Validate`), as KAIROS does, so
//!   no caching is the seed's baseline: the same code with caching off and the same
//!   validation path.
//! - [`hit_rate_by_cache_size`]: Fig. 4.8, the hit rate of the ideal lease against the
//!   share of keys cached.
//! - [`by_load`]: Fig. 4.11's shape, explicit invalidation against the ideal lease (and no
//!   caching) as the offered load rises with the clients: throughput and messages to and
//!   from the primaries per transaction (EI's callbacks included).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;
use virga_dkv::client::ReadOnlyValidation;
use virga_dkv::kairos::{CacheConfig, CacheMode};

use super::{run_store, DkvBenchConfig, DkvBenchReport};
use crate::kv::ycsb_t::{key, YcsbT};
use crate::median;
use crate::plot::{axis_number, draw, linear_axis, Chart, Line};

/// The seed's cache size: 0.1% of the keys.
pub const SEED_CACHE_FRACTION: f64 = 0.001;
/// Fig. 4.8's cache sizes, as fractions of the keys.
pub const CACHE_FRACTIONS: [f64; 5] = [0.0002, 0.0005, 0.001, 0.002, 0.005];

/// What each client may cache: the hottest `fraction` of `workload`'s keys (at least one).
pub fn cache_config(workload: &YcsbT, mode: CacheMode, fraction: f64) -> CacheConfig {
    let count = ((workload.config().records as f64 * fraction).round() as u64).max(1);
    CacheConfig::new(mode, workload.hottest(count).into_iter().map(|id| Bytes::from(key(id))))
}

/// One point of a sweep: how many clients, which mode, what share of the keys cached.
#[derive(Debug, Clone, Copy)]
struct Cell {
    clients: usize,
    mode: CacheMode,
    fraction: f64,
    /// Sharded validators (0: validation at the primaries).
    validators: usize,
}

/// Runs every cell once a round, `rounds` rounds, interleaved (read-only transactions
/// validated at the primaries in one round, as KAIROS does); returns each cell's runs.
fn run_cells(
    base: &DkvBenchConfig,
    workload: &YcsbT,
    cells: &[Cell],
    rounds: usize,
) -> Result<Vec<Vec<DkvBenchReport>>> {
    let mut runs: Vec<Vec<DkvBenchReport>> = cells.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (cell, runs) in cells.iter().zip(runs.iter_mut()) {
            let config = DkvBenchConfig {
                clients: cell.clients,
                cache: cache_config(workload, cell.mode, cell.fraction),
                validation: ReadOnlyValidation::Validate,
                validators: cell.validators,
                seed: base.seed ^ round as u64,
                ..base.clone()
            };
            let report = run_store(&config, workload)?;
            eprintln!(
                "  round {}: {:>2} clients, {:<11} {} validators, cache {:.2}%: {:>8.0} committed/s, hits {:.3} (fresh \
                 {:.3}, stale {:.3}), {:.2} messages a txn",
                round + 1,
                cell.clients,
                cell.mode.name(),
                cell.validators,
                cell.fraction * 100.0,
                report.committed_per_sec,
                report.hit_rate,
                report.fresh_hit_rate,
                report.stale_rate,
                report.requests_per_commit
            );
            runs.push(report);
        }
    }
    Ok(runs)
}

/// The median of `value` over `runs`.
fn median_of(runs: &[DkvBenchReport], value: fn(&DkvBenchReport) -> f64) -> f64 {
    median(&mut runs.iter().map(value).collect::<Vec<_>>())
}

/// Writes a sweep's points as JSON, with the figure's name and the workload's setting.
fn write_points<T: Serialize>(path: &Path, figure: &'static str, workload: &YcsbT, points: &[T]) -> Result<()> {
    #[derive(Serialize)]
    struct Output<'a, T> {
        figure: &'static str,
        setting: String,
        points: &'a [T],
    }
    let output = Output { figure, setting: setting(workload), points };
    std::fs::write(path, serde_json::to_string_pretty(&output)?).with_context(|| format!("writing {}", path.display()))
}

/// One cache mode over its runs: medians, and the runs.
#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub mode: String,
    /// Sharded validators (0: validation at the primaries).
    pub validators: usize,
    pub committed_per_sec: f64,
    /// The lowest and highest run.
    pub committed_per_sec_spread: (f64, f64),
    /// Over no caching's median in the same rounds (when it ran).
    pub speedup_over_none: Option<f64>,
    pub abort_rate: f64,
    /// Per read of a cacheable key: served from the cache (fresh, or found stale).
    pub hit_rate: f64,
    pub fresh_hit_rate: f64,
    pub stale_rate: f64,
    /// Requests the clients sent to primaries (gets, prepares, decisions) per committed
    /// transaction.
    pub server_messages_per_txn: f64,
    /// Requests the clients sent to validators (validations, releases) per committed
    /// transaction.
    pub validator_messages_per_txn: f64,
    pub runs: Vec<DkvBenchReport>,
}

impl ModeResult {
    fn new(mode: CacheMode, validators: usize, runs: Vec<DkvBenchReport>) -> ModeResult {
        let of = |value| median_of(&runs, value);
        let rates = runs.iter().map(|run| run.committed_per_sec);
        let spread = rates.fold((f64::MAX, f64::MIN), |(low, high), rate| (low.min(rate), high.max(rate)));
        ModeResult {
            mode: mode.name(),
            validators,
            committed_per_sec: of(|r| r.committed_per_sec),
            committed_per_sec_spread: spread,
            speedup_over_none: None,
            abort_rate: of(|r| r.abort_rate),
            hit_rate: of(|r| r.hit_rate),
            fresh_hit_rate: of(|r| r.fresh_hit_rate),
            stale_rate: of(|r| r.stale_rate),
            server_messages_per_txn: of(|r| r.requests_per_commit),
            validator_messages_per_txn: of(|r| r.validator_requests_per_commit),
            runs,
        }
    }
}

/// The modes compared, and how.
#[derive(Debug, Serialize)]
pub struct ModeComparison {
    pub setting: String,
    pub transport: &'static str,
    pub shards: u32,
    pub replicas: usize,
    pub clients: usize,
    pub rounds: usize,
    pub duration_s: f64,
    pub cache_fraction: f64,
    pub placement: super::Placement,
    pub modes: Vec<ModeResult>,
}

/// Runs every mode once a round, `rounds` rounds, interleaved (see the module's
/// documentation).
pub fn compare_modes(
    base: &DkvBenchConfig,
    workload: &YcsbT,
    modes: &[CacheMode],
    fraction: f64,
    validators: usize,
    rounds: usize,
) -> Result<ModeComparison> {
    // Fig. 4.16: with validators, every mode runs both ways in the same rounds.
    let layouts: &[usize] = if validators == 0 { &[0] } else { &[0, validators] };
    let cells: Vec<Cell> = layouts
        .iter()
        .flat_map(|validators| {
            modes.iter().map(|mode| Cell { clients: base.clients, mode: *mode, fraction, validators: *validators })
        })
        .collect();
    let runs = run_cells(base, workload, &cells, rounds)?;
    let mut results: Vec<ModeResult> =
        cells.iter().zip(runs).map(|(cell, runs)| ModeResult::new(cell.mode, cell.validators, runs)).collect();
    let baseline = results
        .iter()
        .find(|result| result.mode == CacheMode::None.name() && result.validators == 0)
        .map(|r| r.committed_per_sec);
    for result in &mut results {
        result.speedup_over_none = baseline.map(|none| result.committed_per_sec / none.max(1e-9));
    }
    Ok(ModeComparison {
        setting: setting(workload),
        transport: match base.net {
            super::DkvNet::InProc => "inproc",
            super::DkvNet::Grpc => "grpc",
        },
        shards: base.shards,
        replicas: base.replicas,
        clients: base.clients,
        rounds,
        duration_s: base.duration.as_secs_f64(),
        cache_fraction: fraction,
        placement: base.placement,
        modes: results,
    })
}

fn setting(workload: &YcsbT) -> String {
    let config = workload.config();
    format!(
        "ycsb-t ({} keys a transaction, {}% read-only, Zipf {} reads / {} read-writes) over {} records; read-only \
         transactions validate in one round (nothing logged) in every mode, at the primaries or, with validators, \
         at the validators alone",
        config.keys_per_txn, config.read_only_percent, config.read_zipf, config.write_zipf, config.records
    )
}

impl ModeComparison {
    /// Writes the JSON to `path` and, beside it, the lease lengths each mode's primaries
    /// chose (`-leases.svg`: Fig. 4.10's distribution); returns the files written.
    pub fn write(&self, path: &Path) -> Result<Vec<PathBuf>> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let mut written = vec![path.to_path_buf()];
        let lines: Vec<Line> = self
            .modes
            .iter()
            .enumerate()
            .filter_map(|(colour, mode)| {
                let run = mode.runs.first()?;
                let total: u64 = run.lease_lengths.iter().map(|(_, count)| count).sum();
                let points = run
                    .lease_lengths
                    .iter()
                    .map(|(ms, count)| ((ms * 1000.0).log2(), *count as f64 / total.max(1) as f64 * 100.0))
                    .collect::<Vec<_>>();
                (!points.is_empty()).then(|| Line { label: mode.mode.clone(), colour, dashed: false, points })
            })
            .collect();
        if !lines.is_empty() {
            let chart = Chart {
                title: "KAIROS Fig. 4.10: lease lengths the primaries chose (first round)",
                x_label: "log2 of the lease length in µs",
                x_step: 1.0,
                y_label: "share of leases, %",
                lines,
            };
            let file = PathBuf::from(format!("{}-leases.svg", path.with_extension("").display()));
            draw(&file, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
            written.push(file);
        }
        Ok(written)
    }
}

/// Client counts of the load sweep.
pub const LOAD_CLIENTS: [usize; 5] = [2, 4, 8, 16, 32];

/// One mode at one client count.
#[derive(Debug, Serialize)]
pub struct LoadPoint {
    pub mode: String,
    pub clients: usize,
    pub committed_per_sec: f64,
    pub server_messages_per_txn: f64,
    pub hit_rate: f64,
    pub stale_rate: f64,
    pub mean_latency_us: f64,
    pub runs: Vec<DkvBenchReport>,
}

/// Fig. 4.11's shape: every mode at every client count of [`LOAD_CLIENTS`], interleaved
/// rounds.
pub fn by_load(
    base: &DkvBenchConfig,
    workload: &YcsbT,
    modes: &[CacheMode],
    fraction: f64,
    rounds: usize,
) -> Result<Vec<LoadPoint>> {
    let cells: Vec<Cell> = LOAD_CLIENTS
        .iter()
        .flat_map(|clients| {
            modes.iter().map(move |mode| Cell { clients: *clients, mode: *mode, fraction, validators: 0 })
        })
        .collect();
    let runs = run_cells(base, workload, &cells, rounds)?;
    Ok(cells
        .into_iter()
        .zip(runs)
        .map(|(cell, runs)| LoadPoint {
            mode: cell.mode.name(),
            clients: cell.clients,
            committed_per_sec: median_of(&runs, |r| r.committed_per_sec),
            server_messages_per_txn: median_of(&runs, |r| r.requests_per_commit),
            hit_rate: median_of(&runs, |r| r.hit_rate),
            stale_rate: median_of(&runs, |r| r.stale_rate),
            mean_latency_us: median_of(&runs, |r| r.mean_latency_us),
            runs,
        })
        .collect())
}

/// Writes the load sweep as JSON to `path` and its plots beside it (`-throughput.svg`,
/// `-messages.svg`).
pub fn write_load(points: &[LoadPoint], workload: &YcsbT, path: &Path) -> Result<Vec<PathBuf>> {
    write_points(path, "kairos-load", workload, points)?;
    let mut modes: Vec<&str> = points.iter().map(|point| point.mode.as_str()).collect();
    modes.dedup();
    let lines = |value: fn(&LoadPoint) -> f64| -> Vec<Line> {
        modes
            .iter()
            .enumerate()
            .map(|(colour, mode)| Line {
                label: mode.to_string(),
                colour,
                dashed: false,
                points: points
                    .iter()
                    .filter(|point| point.mode == *mode)
                    .map(|point| (point.clients as f64, value(point)))
                    .collect(),
            })
            .collect()
    };
    let mut written = vec![path.to_path_buf()];
    let charts = [
        (
            "throughput",
            "KAIROS Fig. 4.11: throughput as the load rises",
            "committed per second",
            lines(|p| p.committed_per_sec),
        ),
        (
            "messages",
            "KAIROS Fig. 4.11: messages to and from the primaries",
            "messages per committed transaction",
            lines(|p| p.server_messages_per_txn),
        ),
    ];
    for (name, title, y_label, lines) in charts {
        let chart = Chart { title, x_label: "clients", x_step: 1.0, y_label, lines };
        let file = PathBuf::from(format!("{}-{name}.svg", path.with_extension("").display()));
        draw(&file, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
        written.push(file);
    }
    Ok(written)
}

/// One cache size's runs of the ideal lease.
#[derive(Debug, Serialize)]
pub struct SizePoint {
    /// Keys cached, as a fraction of all keys.
    pub fraction: f64,
    pub keys_cached: usize,
    pub hit_rate: f64,
    /// Hits over every read, cached key or not.
    pub hits_of_all_reads: f64,
    pub committed_per_sec: f64,
    pub runs: Vec<DkvBenchReport>,
}

/// Fig. 4.8: the ideal lease at each of [`CACHE_FRACTIONS`], interleaved rounds.
pub fn hit_rate_by_cache_size(base: &DkvBenchConfig, workload: &YcsbT, rounds: usize) -> Result<Vec<SizePoint>> {
    let cells: Vec<Cell> = CACHE_FRACTIONS
        .iter()
        .map(|fraction| Cell { clients: base.clients, mode: CacheMode::Lease, fraction: *fraction, validators: 0 })
        .collect();
    let runs = run_cells(base, workload, &cells, rounds)?;
    Ok(cells
        .into_iter()
        .zip(runs)
        .map(|(cell, runs)| SizePoint {
            fraction: cell.fraction,
            keys_cached: cache_config(workload, CacheMode::Lease, cell.fraction).keys.len(),
            hit_rate: median_of(&runs, |r| r.hit_rate),
            hits_of_all_reads: median_of(&runs, |r| r.hits_of_all_reads),
            committed_per_sec: median_of(&runs, |r| r.committed_per_sec),
            runs,
        })
        .collect())
}

/// Writes Fig. 4.8's points as JSON to `path` and its plot beside it (`-hit-rate.svg`).
pub fn write_hit_rate(points: &[SizePoint], workload: &YcsbT, path: &Path) -> Result<Vec<PathBuf>> {
    write_points(path, "kairos-hit-rate", workload, points)?;
    let line = |label: &str, colour, value: fn(&SizePoint) -> f64| Line {
        label: label.to_string(),
        colour,
        dashed: false,
        points: points.iter().map(|point| (point.fraction * 100.0, value(point) * 100.0)).collect(),
    };
    let chart = Chart {
        title: "KAIROS Fig. 4.8: hit rate vs cache size (ideal lease)",
        x_label: "keys cached, % of all keys",
        x_step: 0.1,
        y_label: "hits, %",
        lines: vec![
            line("of the cached keys' reads", 0, |p| p.hit_rate),
            line("of all reads", 1, |p| p.hits_of_all_reads),
        ],
    };
    let file = PathBuf::from(format!("{}-hit-rate.svg", path.with_extension("").display()));
    draw(&file, &chart, linear_axis(&chart), &|y| axis_number(*y))?;
    Ok(vec![path.to_path_buf(), file])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::ycsb_t::YcsbTConfig;

    #[test]
    fn the_cacheable_keys_are_the_hottest_reads() {
        let workload = YcsbT::new(YcsbTConfig { records: 10_000, ..YcsbTConfig::default() }).unwrap();
        let config = cache_config(&workload, CacheMode::Lease, SEED_CACHE_FRACTION);
        assert_eq!(config.keys.len(), 10);
        // The 10 keys drawn most often in 20,000 read-only draws are the ones cached.
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..20_000 {
            let txn = workload.draw(&mut rng);
            if !txn.writes {
                for id in txn.ids {
                    *counts.entry(id).or_insert(0u32) += 1;
                }
            }
        }
        let mut by_count: Vec<(u64, u32)> = counts.into_iter().collect();
        by_count.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
        let top: Vec<u64> = by_count.iter().take(5).map(|(id, _)| *id).collect();
        for id in top {
            assert!(config.keys.contains(key(id).as_slice()), "key {id} is among the five hottest");
        }
    }
}
