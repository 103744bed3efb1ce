//! `virga bench rainblock`: the RainBlock paper's Fig. 8 (cache retention r against memory,
//! witness bytes and aborts, per account count) and Fig. 9a (throughput against clients, per
//! r) as sweeps of whole clusters, with a table as it goes, JSON and SVG plots.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use virga_bench::rainblock::{self, Fig8Point, Fig9aPoint, Figure, RainblockResults, SweepConfig, SweepEvent};
use virga_node::cluster::TransportKind;

use crate::up::Bars;

#[derive(Args)]
pub(crate) struct RainblockBenchArgs {
    /// Account counts N (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000", value_parser = crate::limits::count(2))]
    accounts: Vec<usize>,
    /// Retention levels r of the miner's top layer (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5", value_parser = crate::limits::trie_level())]
    retention: Vec<usize>,
    /// Compaction level c of every point (default: c = r + 1 at each point, the most a miner keeping levels 0..=r allows).
    #[arg(long, value_parser = crate::limits::trie_level())]
    compaction: Option<usize>,
    /// Client counts of Fig. 9a (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = crate::limits::count(1))]
    clients: Vec<usize>,
    /// Which figure: 8, 9a or all.
    #[arg(long, value_enum, ignore_case = true, default_value_t = Figure::All)]
    fig: Figure,
    /// Clients of every Fig. 8 point.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    fig8_clients: usize,
    /// N of Fig. 9a (default: the largest of --accounts).
    #[arg(long, value_parser = crate::limits::count(2))]
    fig9a_accounts: Option<usize>,
    /// Longest run of each point, in seconds (a point also ends once all its transfers commit).
    #[arg(long, default_value_t = 20, value_parser = crate::limits::count_u64(1))]
    duration: u64,
    /// Transfers the users sign before each point's run.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count(1))]
    transfers: usize,
    /// Shards of the bottom layer (1, 16 or 256).
    #[arg(long, default_value_t = 16, value_parser = crate::limits::shards)]
    shards: usize,
    /// Storage nodes (shards are dealt out round-robin).
    #[arg(long, default_value_t = 16, value_parser = crate::limits::count(1))]
    storage_nodes: usize,
    /// Transfers per client submission.
    #[arg(long, default_value_t = 250, value_parser = crate::limits::count(1))]
    batch: usize,
    /// Submissions each client keeps in flight.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    in_flight: usize,
    /// Transfers per block at most.
    #[arg(long, default_value_t = 4_000, value_parser = crate::limits::count(1))]
    block_transfers: usize,
    /// Memory budget of the miner's top layer in MiB; beyond it the miner prunes to level r
    /// (0: after every block, so the cache is exactly r levels).
    #[arg(long, default_value_t = 0)]
    top_budget_mib: usize,
    /// Directory for rainblock.json and the SVG plots (created if missing).
    #[arg(long, default_value = "docs/bench-rainblock")]
    out: PathBuf,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Share of the transactions that are ERC-20 token transfers (contract calls), 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = crate::limits::probability)]
    contracts: f64,
    /// `inproc` (in-process calls) or `grpc` (every role behind a gRPC server on loopback).
    #[arg(long, value_enum, default_value_t = TransportKind::InProc)]
    transport: TransportKind,
}

impl RainblockBenchArgs {
    fn sweep(&self) -> SweepConfig {
        SweepConfig {
            accounts: self.accounts.clone(),
            retention: self.retention.clone(),
            compaction: self.compaction,
            clients: self.clients.clone(),
            fig8_clients: self.fig8_clients,
            fig9a_accounts: self.fig9a_accounts,
            duration: Duration::from_secs(self.duration),
            transfers: self.transfers,
            shards: self.shards,
            storage_nodes: self.storage_nodes,
            batch: self.batch,
            in_flight: self.in_flight,
            block_transfers: self.block_transfers,
            top_budget_bytes: self.top_budget_mib.saturating_mul(1 << 20),
            transport: self.transport,
            seed: self.seed,
            contracts: self.contracts,
        }
    }
}

pub(crate) fn bench_rainblock(args: &RainblockBenchArgs) -> Result<ExitCode> {
    let config = args.sweep();
    config.validate(args.fig)?;
    let mut results = RainblockResults::new(config.clone());
    results.command = Some(std::env::args().collect::<Vec<_>>().join(" "));
    let machine = &results.machine;
    eprintln!(
        "virga bench rainblock: {} cores ({}), transport {}, results in {}",
        machine.cores,
        machine.cpu_model.as_deref().unwrap_or("unknown CPU"),
        if config.transport == TransportKind::Grpc { "gRPC on loopback" } else { "in-process" },
        args.out.display()
    );
    // One bar for the running point's phase, cleared when it ends: the terminal keeps the table.
    let bar = Bars::new(true);

    if args.fig.includes_fig8() {
        println!(
            "\nFig. 8: retention r against top-layer memory, witness bytes and aborts ({} clients, c {})",
            config.fig8_clients,
            config.compaction.map_or("= r + 1".to_string(), |c| format!("= {c}"))
        );
        println!("{}", Fig8Point::header());
        let mut on_event = |event: SweepEvent<'_, Fig8Point>| match event {
            SweepEvent::Starting { index, total, label } => {
                *bar.label.lock() = format!("fig 8 [{}/{total}] {label}", index + 1);
            }
            SweepEvent::Finished { index, total, point } => {
                println!("{}", point.row());
                eprintln!(
                    "fig 8 [{}/{total}] done: N={} r={}: {:.0} tx/s, {:.2}% aborts, {:.0} of {:.0} witness bytes per tx",
                    index + 1,
                    point.accounts,
                    point.retention,
                    point.run.tps,
                    100.0 * point.run.abort_rate,
                    point.witness_bytes_compact_per_tx,
                    point.witness_bytes_full_per_tx
                );
                results.fig8.push(point.clone());
                // Keep what is done on disk, so a long sweep that stops leaves its points.
                if let Err(error) = results.write_json(&args.out) {
                    eprintln!("warning: {error:#}");
                }
            }
        };
        rainblock::fig8(&config, &bar, &mut on_event)?;
    }

    if args.fig.includes_fig9a() {
        println!(
            "\nFig. 9a: throughput against clients, per retention r (N = {}, c {})",
            config.fig9a_accounts()?,
            config.compaction.map_or("= r + 1".to_string(), |c| format!("= {c}"))
        );
        println!("{}", Fig9aPoint::header());
        let mut on_event = |event: SweepEvent<'_, Fig9aPoint>| match event {
            SweepEvent::Starting { index, total, label } => {
                *bar.label.lock() = format!("fig 9a [{}/{total}] {label}", index + 1);
            }
            SweepEvent::Finished { index, total, point } => {
                println!("{}", point.row());
                eprintln!(
                    "fig 9a [{}/{total}] done: {} clients r={}: {:.0} tx/s",
                    index + 1,
                    point.clients,
                    point.retention,
                    point.run.tps
                );
                results.fig9a.push(point.clone());
                if let Err(error) = results.write_json(&args.out) {
                    eprintln!("warning: {error:#}");
                }
            }
        };
        rainblock::fig9a(&config, &bar, &mut on_event)?;
    }

    println!();
    for path in results.write(&args.out)? {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
