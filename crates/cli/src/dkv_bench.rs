//! `virga bench dkv`: the distributed store embedded in one process against the single-node
//! engine on the same ycsb-t transactions and durability, in interleaved runs (store, engine,
//! store, engine, …); reports medians and spread, and writes JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use virga_bench::dkv::{run_store, DkvBenchConfig, DkvBenchReport, DkvNet};
use virga_bench::dkv_etcd::{etcd_available, run_etcd, EtcdReport};
use virga_bench::kv::runner::{self, RunOptions, RunReport};
use virga_bench::kv::virga::VirgaBackend;
use virga_bench::kv::ycsb_t::{YcsbT, YcsbTConfig};
use virga_txn::{Durability, Engine, EngineConfig, SyncMode};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DkvTransport {
    /// Every role in this process, on the in-process transport.
    Inproc,
    /// Every configuration replica and data node behind its own gRPC server on loopback.
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DkvSync {
    /// Group commit: each replica fsyncs a group of records before acknowledging them.
    Group,
    /// No fsync (a crash may lose acknowledged commits).
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DkvWorkload {
    /// Transactional YCSB: 4 keys per transaction, 90% read-only (Zipf 0.99), read-write
    /// ones read-modify-write (Zipf 0.75).
    YcsbT,
}

#[derive(Args)]
pub struct DkvBenchArgs {
    #[arg(long, value_enum, default_value_t = DkvTransport::Inproc)]
    transport: DkvTransport,
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 64))]
    shards: usize,
    /// Replicas per shard: one primary and 2f backups (odd).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 9))]
    replicas: usize,
    #[arg(long, value_enum, default_value_t = DkvWorkload::YcsbT)]
    workload: DkvWorkload,
    /// Measured seconds of each run (after a 1 s warm-up of the store).
    #[arg(long, default_value_t = 5.0, value_parser = crate::limits::positive)]
    duration: f64,
    /// Clients of the store, and threads of the single-node engine.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::count_between(1, 1024))]
    clients: usize,
    /// Transactions each store client is kept ahead.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count_between(1, 1024))]
    window: usize,
    #[arg(long, value_enum, default_value_t = DkvSync::Group)]
    sync: DkvSync,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64_between(4, 100_000_000))]
    records: u64,
    #[arg(long, default_value_t = 100, value_parser = crate::limits::count_between(1, 1 << 20))]
    value_size: usize,
    /// Runs of each system, interleaved.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 100))]
    runs: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also run etcd (a three-member cluster on loopback, fsync on, linearizable reads) on the
    /// same transactions in each round; needs `etcd` on PATH (`apt-get install etcd-server`).
    #[arg(long)]
    peers: bool,
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Output {
    workload: &'static str,
    transport: &'static str,
    sync: &'static str,
    shards: usize,
    replicas: usize,
    clients: usize,
    runs: usize,
    /// Medians over the runs.
    committed_per_sec: f64,
    abort_rate: f64,
    single_node_committed_per_sec: f64,
    single_node_abort_rate: f64,
    /// The store's median over the engine's.
    ratio: f64,
    store: Vec<DkvBenchReport>,
    single_node: Vec<RunReport>,
    /// With `--peers`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    etcd: Option<EtcdOutput>,
}

/// etcd's figures with `--peers`.
#[derive(Serialize)]
struct EtcdOutput {
    /// Medians over the runs.
    etcd_committed_per_sec: f64,
    etcd_abort_rate: f64,
    /// The store's median over etcd's.
    store_over_etcd: f64,
    etcd: Vec<EtcdReport>,
}

impl EtcdOutput {
    fn new(runs: Vec<EtcdReport>, store_committed_per_sec: f64) -> EtcdOutput {
        let committed_per_sec = median(&mut runs.iter().map(|r| r.committed_per_sec).collect::<Vec<_>>());
        EtcdOutput {
            etcd_committed_per_sec: committed_per_sec,
            etcd_abort_rate: median(&mut runs.iter().map(|r| r.abort_rate).collect::<Vec<_>>()),
            store_over_etcd: store_committed_per_sec / committed_per_sec.max(1e-9),
            etcd: runs,
        }
    }

    fn print(&self) {
        println!(
            "etcd:   {:.0} committed/s (median; runs {}), abort rate {:.2}%",
            self.etcd_committed_per_sec,
            spread(&self.etcd.iter().map(|r| r.committed_per_sec).collect::<Vec<_>>()),
            self.etcd_abort_rate * 100.0
        );
        println!("store / etcd: {:.2}", self.store_over_etcd);
    }
}

/// One etcd run of round `run`, printed as it ends.
fn etcd_run(config: &DkvBenchConfig, workload: &YcsbT, run: usize) -> Result<EtcdReport> {
    let report = run_etcd(config, workload)?;
    eprintln!(
        "  run {}: etcd   {:>9.0} committed/s, abort rate {:.2}%{}",
        run + 1,
        report.committed_per_sec,
        report.abort_rate * 100.0,
        if report.errors > 0 {
            format!(", {} failed calls ({:?})", report.errors, report.first_error)
        } else {
            String::new()
        }
    );
    Ok(report)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn spread(values: &[f64]) -> String {
    let (low, high) = values.iter().fold((f64::MAX, f64::MIN), |(low, high), v| (low.min(*v), high.max(*v)));
    format!("{low:.0}–{high:.0}")
}

fn single_node(args: &DkvBenchArgs, workload: &YcsbT, run: usize) -> Result<RunReport> {
    let dir = tempfile::tempdir()?;
    let sync = match args.sync {
        DkvSync::Group => SyncMode::Group,
        DkvSync::None => SyncMode::None,
    };
    let config = EngineConfig {
        durability: Durability::Log { dir: dir.path().join("wal"), sync },
        seed: args.seed,
        ..EngineConfig::default()
    };
    let (engine, _) = Engine::open(config)?;
    let backend = VirgaBackend::new(Arc::clone(&engine));
    runner::load(workload, &backend)?;
    let options = RunOptions {
        threads: args.clients,
        duration: Duration::from_secs_f64(args.duration),
        seed: args.seed ^ run as u64,
        progress: false,
        durable_lines: false,
    };
    Ok(runner::run(workload, &backend, &options))
}

pub fn bench_dkv(args: &DkvBenchArgs) -> Result<ExitCode> {
    if args.replicas % 2 != 1 {
        bail!("--replicas {} is even: a shard has one primary and 2f backups", args.replicas);
    }
    if args.peers {
        etcd_available().map_err(anyhow::Error::msg)?;
    }
    let workload =
        YcsbT::new(YcsbTConfig { records: args.records, value_size: args.value_size, ..YcsbTConfig::default() })?;
    let sync = match args.sync {
        DkvSync::Group => "group",
        DkvSync::None => "none",
    };
    eprintln!(
        "virga bench dkv: ycsb-t, {} shards x {} replicas, {} clients, --sync {sync}, {} runs of {} s each system, interleaved",
        args.shards, args.replicas, args.clients, args.runs, args.duration
    );
    let mut store = Vec::new();
    let mut engine = Vec::new();
    let mut etcd = Vec::new();
    for run in 0..args.runs {
        let config = DkvBenchConfig {
            net: match args.transport {
                DkvTransport::Inproc => DkvNet::InProc,
                DkvTransport::Grpc => DkvNet::Grpc,
            },
            shards: args.shards as u32,
            replicas: args.replicas,
            clients: args.clients,
            window: args.window,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs_f64(args.duration),
            sync: args.sync == DkvSync::Group,
            seed: args.seed ^ run as u64,
        };
        let report = run_store(&config, &workload)?;
        eprintln!(
            "  run {}: store  {:>9.0} committed/s, abort rate {:.2}%",
            run + 1,
            report.committed_per_sec,
            report.abort_rate * 100.0
        );
        store.push(report);
        let report = single_node(args, &workload, run)?;
        eprintln!(
            "  run {}: engine {:>9.0} committed/s, abort rate {:.2}%",
            run + 1,
            report.committed_per_sec,
            report.abort_rate * 100.0
        );
        engine.push(report);
        if args.peers {
            etcd.push(etcd_run(&config, &workload, run)?);
        }
    }
    let mut store_rates: Vec<f64> = store.iter().map(|r| r.committed_per_sec).collect();
    let mut engine_rates: Vec<f64> = engine.iter().map(|r| r.committed_per_sec).collect();
    let output = Output {
        workload: "ycsb-t",
        transport: match args.transport {
            DkvTransport::Inproc => "inproc",
            DkvTransport::Grpc => "grpc",
        },
        sync,
        shards: args.shards,
        replicas: args.replicas,
        clients: args.clients,
        runs: args.runs,
        committed_per_sec: median(&mut store_rates.clone()),
        abort_rate: median(&mut store.iter().map(|r| r.abort_rate).collect::<Vec<_>>()),
        single_node_committed_per_sec: median(&mut engine_rates.clone()),
        single_node_abort_rate: median(&mut engine.iter().map(|r| r.abort_rate).collect::<Vec<_>>()),
        ratio: median(&mut store_rates) / median(&mut engine_rates).max(1e-9),
        etcd: args.peers.then(|| EtcdOutput::new(etcd, median(&mut store_rates.clone()))),
        store,
        single_node: engine,
    };
    println!(
        "store:  {:.0} committed/s (median; runs {}), abort rate {:.2}%",
        output.committed_per_sec,
        spread(&output.store.iter().map(|r| r.committed_per_sec).collect::<Vec<_>>()),
        output.abort_rate * 100.0
    );
    println!(
        "engine: {:.0} committed/s (median; runs {}), abort rate {:.2}%",
        output.single_node_committed_per_sec,
        spread(&output.single_node.iter().map(|r| r.committed_per_sec).collect::<Vec<_>>()),
        output.single_node_abort_rate * 100.0
    );
    println!("store / engine: {:.2}", output.ratio);
    if let Some(etcd) = &output.etcd {
        etcd.print();
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&output)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
