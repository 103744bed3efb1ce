//! `virga kairos`: KAIROS's ideal lease model from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;
use virga_txn::cache::{ideal_lease, simulate};

#[derive(Subcommand)]
pub(crate) enum KairosCommand {
    /// The ideal lease of a cached key (seed 004 §4.2.3, Algorithm 3), and the fresh-hit
    /// and stale rates the model expects for it.
    ///
    /// Reads of the key by one client cache and writes to it by anyone are taken as Poisson
    /// processes. R is the cache's mean time between two of its reads of the key (hits and
    /// misses alike); W is the mean time between two committed writes of the key (its write
    /// rate is 1/W). A miss fetches the key with a lease of d; the reads within d hit, fresh
    /// if no write came since the fetch and stale otherwise (validation then aborts the
    /// transaction). The rates are per read, misses included: fresh + stale + miss = 1.
    /// The lease searched is d = k·R for k = 1, 2, …, stopping at the first k whose fresh-hit
    /// rate falls, and never above --max-lease-ms.
    Lease(LeaseArgs),
}

#[derive(Args)]
pub(crate) struct LeaseArgs {
    /// R: the cache's mean inter-read time of the key, in ms.
    #[arg(long, value_parser = crate::limits::positive)]
    read_interval_ms: f64,
    /// W: the key's mean inter-write time, in ms.
    #[arg(long, value_parser = crate::limits::positive)]
    write_interval_ms: f64,
    /// The longest lease handed out, in ms.
    #[arg(long, default_value_t = 5_000.0, value_parser = crate::limits::positive)]
    max_lease_ms: f64,
    /// Also runs this many simulated Poisson reads at the chosen lease and prints their
    /// rates beside the model's (0: none).
    #[arg(long, default_value_t = 0, value_parser = crate::limits::count_u64_between(0, 1_000_000_000))]
    simulate_reads: u64,
    /// Writes the answer as JSON: `lease_ms`, `fresh_hit_rate`, `stale_rate`, `miss_rate`.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct LeaseReport {
    read_interval_ms: f64,
    write_interval_ms: f64,
    lease_ms: f64,
    fresh_hit_rate: f64,
    stale_rate: f64,
    miss_rate: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    simulated: Option<SimulatedRates>,
}

#[derive(Serialize)]
struct SimulatedRates {
    reads: u64,
    fresh_hit_rate: f64,
    stale_rate: f64,
    miss_rate: f64,
}

pub(crate) fn run(command: &KairosCommand) -> anyhow::Result<ExitCode> {
    match command {
        KairosCommand::Lease(args) => lease(args),
    }
}

fn lease(args: &LeaseArgs) -> anyhow::Result<ExitCode> {
    let (r, w) = (args.read_interval_ms, args.write_interval_ms);
    let best = ideal_lease(r, w, args.max_lease_ms);
    let simulated = (args.simulate_reads > 0).then(|| {
        let run = simulate(r, w, best.lease, args.simulate_reads, 1);
        SimulatedRates {
            reads: args.simulate_reads,
            fresh_hit_rate: run.fresh_hit_rate,
            stale_rate: run.stale_rate,
            miss_rate: run.miss_rate,
        }
    });
    println!("ideal lease: {:.3} ms ({} read intervals)", best.lease, (best.lease / r).round());
    println!(
        "model:     fresh-hit rate {:.4}, stale rate {:.4}, miss rate {:.4} (per read)",
        best.fresh_hit_rate, best.stale_rate, best.miss_rate
    );
    if let Some(sim) = &simulated {
        println!(
            "simulated: fresh-hit rate {:.4}, stale rate {:.4}, miss rate {:.4} ({} Poisson reads)",
            sim.fresh_hit_rate, sim.stale_rate, sim.miss_rate, sim.reads
        );
    }
    if let Some(path) = &args.json {
        let report = LeaseReport {
            read_interval_ms: r,
            write_interval_ms: w,
            lease_ms: best.lease,
            fresh_hit_rate: best.fresh_hit_rate,
            stale_rate: best.stale_rate,
            miss_rate: best.miss_rate,
            simulated,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
