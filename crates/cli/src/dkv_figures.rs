//! `virga bench dkv --figure NAME`: one of seed 004's figures on the store
//! (`virga_bench::dkv::figures`), printed as a table and written as JSON with SVG plots
//! beside `--json`.

use std::process::ExitCode;

use anyhow::Result;
use clap::ValueEnum;
use virga_bench::dkv::figures::{self, Figure};
use virga_bench::kv::ycsb_t::{YcsbT, YcsbTConfig};

use crate::dkv_bench::DkvBenchArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DkvFigure {
    /// SEMEL Table 3.2's shape: single-key gets and blind puts at 100/75/50/25% gets, 5
    /// clients x 32 in flight: throughput, mean get and put latency.
    SemelTable,
    /// MILANA Fig. 3.6: Retwis abort rates, PTP-like vs NTP-like clock skew, Zipf 0.2 to 1.4.
    MilanaSkew,
    /// MILANA Fig. 3.7: read-only transactions validated at the client vs at the primaries
    /// (ycsb-t, 1 to 64 clients): throughput, latency, requests per commit.
    MilanaValidation,
    /// The store beyond this machine: the cost model calibrated here, this machine's shape
    /// simulated beside its measurement, MILANA's setting and 2x and 4x it extrapolated.
    Scale,
}

pub(crate) fn run(figure: DkvFigure, args: &DkvBenchArgs) -> Result<ExitCode> {
    let base = args.store_config(0);
    eprintln!(
        "virga bench dkv --figure {}: {} shards x {} replicas, --sync {}, {} rounds of {} s a point",
        figure.to_possible_value().map(|value| value.get_name().to_string()).unwrap_or_default(),
        args.shards,
        args.replicas,
        args.sync_name(),
        args.runs,
        args.duration
    );
    let result = match figure {
        DkvFigure::SemelTable => figures::semel_table(&base, args.records, args.value_size, args.runs)?,
        DkvFigure::MilanaSkew => figures::milana_skew(&base, args.records, args.value_size, args.runs)?,
        DkvFigure::Scale => return scale(args, &base),
        DkvFigure::MilanaValidation => {
            let workload = YcsbT::new(YcsbTConfig {
                records: args.records,
                value_size: args.value_size,
                ..YcsbTConfig::default()
            })?;
            figures::milana_validation(&base, &workload, args.runs)?
        }
    };
    print_table(&result);
    if let Some(path) = &args.json {
        for written in result.write(path)? {
            eprintln!("wrote {}", written.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The scale figure: the cost model's inputs, this machine's shape measured and simulated,
/// larger ones extrapolated.
fn scale(args: &DkvBenchArgs, base: &virga_bench::dkv::DkvBenchConfig) -> Result<ExitCode> {
    let workload =
        YcsbT::new(YcsbTConfig { records: args.records, value_size: args.value_size, ..YcsbTConfig::default() })?;
    let scratch = tempfile::tempdir()?;
    let result = virga_bench::dkv::scale::scale_figure(base, &workload, args.runs, scratch.path())?;
    println!("{}", result.setting);
    println!(
        "{:>18} {:>13} {:>7} {:>8} {:>32} {:>14} {:>8}",
        "shape", "kind", "shards", "clients", "machines", "committed/s", "aborts"
    );
    for row in &result.rows {
        println!(
            "{:>18} {:>13} {:>7} {:>8} {:>32} {:>14.0} {:>7.2}%",
            row.shape,
            row.kind,
            row.shards,
            row.clients,
            row.machines,
            row.committed_per_sec,
            row.abort_rate * 100.0
        );
    }
    if let Some(path) = &args.json {
        for written in result.write(path)? {
            eprintln!("wrote {}", written.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(figure: &Figure) {
    println!("{}", figure.setting);
    println!(
        "{:>8} {:>8} {:>14} {:>8} {:>12} {:>12} {:>10}",
        "x", "series", "committed/s", "aborts", "ro mean µs", "rw mean µs", "req/commit"
    );
    for point in &figure.points {
        println!(
            "{:>8} {:>8} {:>14.0} {:>7.2}% {:>12.0} {:>12.0} {:>10.2}",
            point.x,
            point.series,
            point.committed_per_sec,
            point.abort_rate * 100.0,
            point.read_only_mean_us,
            point.read_write_mean_us,
            point.requests_per_commit
        );
    }
}
