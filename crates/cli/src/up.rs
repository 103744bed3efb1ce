//! `virga up`: RainBlock's cluster on the embedded default, with a progress bar and a report.

use crate::shape::ClusterShape;
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use virga_node::cluster::{up, Progress, TransportKind, UpConfig, UpReport};
use virga_node::topology::Topology;

#[derive(Args)]
pub(crate) struct UpArgs {
    /// Directory for the chain and the storage nodes' logs (must not hold a chain; `virga
    /// verify --dir D` audits it afterwards). Default: a temporary directory, removed at the end.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Accounts in the genesis state.
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::limits::count(2))]
    accounts: usize,
    /// Storage nodes (shards are dealt out round-robin).
    #[arg(long, default_value_t = 16, value_parser = crate::limits::count(1))]
    storage_nodes: usize,
    /// Prefetching clients.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    clients: usize,
    #[command(flatten)]
    shape: ClusterShape,
    /// Longest run, in seconds (the run also ends when every signed transfer has committed).
    #[arg(long, default_value_t = 30, value_parser = crate::limits::count_u64(1))]
    duration: u64,
    /// Transfers the users sign before the run.
    #[arg(long, default_value_t = 300_000, value_parser = crate::limits::count(1))]
    transfers: usize,
    /// Transfers offered per second (default: as fast as the clients take them).
    #[arg(long, value_parser = crate::limits::positive)]
    rate: Option<f64>,
    /// Share of the transactions that are ERC-20 token transfers (contract calls, executed
    /// with revm; clients pre-execute them and fetch their storage slots), from 0 to 1.
    /// The seed's workload has 10-15%; `--contracts 0` runs value transfers alone.
    #[arg(long, default_value_t = 0.15, value_parser = crate::limits::probability)]
    contracts: f64,
    /// Transfers per client submission.
    #[arg(long, default_value_t = 250, value_parser = crate::limits::count(1))]
    batch: usize,
    /// Submissions each client keeps in flight.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    in_flight: usize,
    /// `inproc` (one process, in-process calls) or `grpc` (every role behind a gRPC server on loopback).
    #[arg(long, value_enum, default_value_t = TransportKind::InProc)]
    transport: TransportKind,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Progress bars on stderr, one per phase. With `clear`, a finished phase's bar is erased
/// (sweeps keep only their table); `label` prefixes every phase's name.
pub(crate) struct Bars {
    bar: Mutex<Option<ProgressBar>>,
    pub label: Mutex<String>,
    clear: bool,
}

impl Bars {
    pub(crate) fn new(clear: bool) -> Bars {
        Bars { bar: Mutex::new(None), label: Mutex::new(String::new()), clear }
    }

    fn end(&self, bar: ProgressBar) {
        if self.clear {
            bar.finish_and_clear();
        } else {
            bar.finish();
        }
    }
}

impl Progress for Bars {
    fn phase(&self, name: &str, total: u64) {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>44} [{bar:30}] {pos}/{len} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let label = self.label.lock();
        bar.set_prefix(if label.is_empty() { name.to_string() } else { format!("{label}: {name}") });
        bar.enable_steady_tick(Duration::from_millis(200));
        if let Some(old) = self.bar.lock().replace(bar) {
            self.end(old);
        }
    }
    fn advance(&self, done: u64) {
        if let Some(bar) = self.bar.lock().as_ref() {
            bar.inc(done);
        }
    }
    fn set(&self, done: u64, message: String) {
        if let Some(bar) = self.bar.lock().as_ref() {
            bar.set_position(done);
            bar.set_message(message);
        }
    }
    fn finish(&self) {
        if let Some(bar) = self.bar.lock().take() {
            self.end(bar);
        }
    }
}

pub(crate) fn run(args: &UpArgs) -> Result<ExitCode> {
    let temporary = match &args.dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a temporary directory")?),
    };
    let dir = match (&args.dir, &temporary) {
        (Some(dir), _) => dir.clone(),
        (None, Some(temporary)) => temporary.path().to_path_buf(),
        (None, None) => unreachable!("a temporary directory exists when no --dir is given"),
    };
    let config = UpConfig {
        topology: Topology {
            clients: args.clients,
            batch: args.batch,
            in_flight: args.in_flight,
            ..args.shape.topology(args.accounts, args.storage_nodes)
        },
        dir: dir.clone(),
        duration: Duration::from_secs(args.duration),
        transfers: args.transfers,
        rate: args.rate,
        contracts: args.contracts,
        transport: args.transport,
    };
    let (nodes, replicas) = config.topology.storage_counts();
    eprintln!(
        "virga up: {} accounts, {:.0}% contract calls, {} shards on {} storage nodes ({} per shard), {} miner(s), {} clients, r={} c={}, transport {}, data in {}",
        args.accounts,
        100.0 * args.contracts,
        args.shape.shards,
        nodes,
        replicas,
        args.shape.miners,
        args.clients,
        args.shape.retention,
        args.shape.compaction,
        if args.transport == TransportKind::Grpc { "gRPC on loopback" } else { "in-process" },
        dir.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let bars = Bars::new(false);
    let report = match runtime.block_on(up(config, &bars)) {
        Ok(report) => report,
        Err(error) => {
            bars.finish();
            eprintln!("virga up: {error}");
            return Ok(ExitCode::FAILURE);
        }
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match &args.dir {
        Some(dir) => println!("\ndata kept in {}; audit it with: virga verify --dir {}", dir.display(), dir.display()),
        None => {
            println!("\n(temporary data removed; pass --dir D to keep it and audit it with `virga verify --dir D`)")
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &UpReport) {
    let join = |map: &std::collections::BTreeMap<String, u64>| {
        if map.is_empty() {
            "none".to_string()
        } else {
            map.iter().map(|(reason, count)| format!("{reason} {count}")).collect::<Vec<_>>().join(", ")
        }
    };
    println!();
    println!("RainBlock cluster ({} transport)", report.transport);
    println!("  setup                 {:.1} s (keys, genesis state, signing, top layer)", report.setup_seconds);
    println!(
        "  committed             {} of {} offered transfers in {:.1} s",
        report.committed, report.offered, report.run_seconds
    );
    println!("  throughput            {:.0} transactions/s", report.tps);
    if report.contract_share > 0.0 {
        println!(
            "  contract calls        {} committed, {:.0} ERC-20 calls/s ({:.0}% of the signed transactions; the seed: 17.9K/s), {} extra witness rounds, {:.0} bytes of slot bags and code per call",
            report.contract_calls,
            report.contract_calls_per_sec,
            100.0 * report.contract_share,
            report.extra_witness_rounds,
            report.contract_witness_bytes_per_call
        );
    }
    if let (Some(cpu), Some(per_tx)) = (report.run_cpu_seconds, report.cpu_us_per_tx) {
        println!("  cpu                   {cpu:.1} s over the run, {per_tx:.0} µs per transfer (all roles)");
    }
    println!("  blocks                {} (head {})", report.blocks, report.head_number);
    println!("  reverted              {}", join(&report.failed));
    println!("  aborted by the miner  {} (retried by the clients)", join(&report.aborts_by_reason));
    println!("  filtered by clients   {}", join(&report.filtered));
    println!(
        "  witness bytes per tx  {:.0} full, {:.0} compacted and bagged ({:.1}%)",
        report.witness_bytes_full_per_tx,
        report.witness_bytes_compact_per_tx,
        100.0 * report.witness_bytes_compact_per_tx / report.witness_bytes_full_per_tx.max(1e-9)
    );
    println!(
        "  messages per tx       {:.2} ({:.0} bytes on the wire per tx)",
        report.messages_per_tx, report.network_bytes_per_tx
    );
    println!(
        "  miner top layer       {} nodes now, peak {:.1} MiB, pruned {} times",
        report.top_layer_nodes,
        report.top_layer_peak_bytes as f64 / (1 << 20) as f64,
        report.prunes
    );
    if report.miners > 1 {
        println!(
            "  other miners          verified {} blocks, refused {}",
            report.follower_blocks_verified, report.follower_blocks_refused
        );
    }
    println!("  final state root      {}", report.state_root);
}
