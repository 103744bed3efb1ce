//! `virga bench dkv`: the distributed store embedded in one process against the single-node
//! engine on the same transactions and durability, in interleaved runs (store, engine,
//! store, engine, …), with etcd in each round under `--peers`; reports medians and spread,
//! and writes JSON. `--figure` reproduces one of the seed's figures instead
//! (`dkv_figures`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use virga_bench::dkv::{run_store, run_store_sessions, DkvBenchConfig, DkvBenchReport, DkvNet};
use virga_bench::dkv_etcd::{etcd_available, run_etcd, EtcdReport};
use virga_bench::kv::retwis::{RetwisConfig, RetwisWorkload};
use virga_bench::kv::runner::{self, RunOptions, RunReport};
use virga_bench::kv::smallbank::{SmallBankConfig, SmallBankWorkload};
use virga_bench::kv::transfer::{self, TransferConfig, TransferWorkload};
use virga_bench::kv::virga::VirgaBackend;
use virga_bench::kv::ycsb_t::{YcsbT, YcsbTConfig};
use virga_bench::kv::KvWorkload;
use virga_core::clock::SkewProfile;
use virga_dkv::client::ReadOnlyValidation;
use virga_txn::{Durability, Engine, EngineConfig, SyncMode};

pub(crate) use crate::dkv_figures::DkvFigure;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DkvTransport {
    /// Every role in this process, on the in-process transport.
    Inproc,
    /// Every configuration replica and data node behind its own gRPC server on loopback.
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DkvSync {
    /// Group commit: each replica fsyncs a group of records before acknowledging them.
    Group,
    /// No fsync (a crash may lose acknowledged commits).
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DkvWorkload {
    /// Transactional YCSB: 4 keys per transaction, 90% read-only (Zipf 0.99), read-write
    /// ones read-modify-write (Zipf 0.75); client programs.
    YcsbT,
    /// SmallBank's six transactions over checking and savings accounts; sessions.
    Smallbank,
    /// Retwis's four transactions (seed 004 Table 3.3); sessions.
    Retwis,
    /// Transfers between accounts; the total is audited after every store run; sessions.
    Transfer,
}

impl DkvWorkload {
    fn name(self) -> &'static str {
        match self {
            DkvWorkload::YcsbT => "ycsb-t",
            DkvWorkload::Smallbank => "smallbank",
            DkvWorkload::Retwis => "retwis",
            DkvWorkload::Transfer => "transfer",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DkvValidation {
    /// Read-only transactions validate at the client (MILANA).
    Local,
    /// At the primaries, as read-write transactions with no writes.
    Remote,
    /// At the primaries in one round trip, nothing logged (KAIROS's way).
    Validate,
}

impl From<DkvValidation> for ReadOnlyValidation {
    fn from(validation: DkvValidation) -> Self {
        match validation {
            DkvValidation::Local => ReadOnlyValidation::Local,
            DkvValidation::Remote => ReadOnlyValidation::Remote,
            DkvValidation::Validate => ReadOnlyValidation::Validate,
        }
    }
}

#[derive(Args)]
pub(crate) struct DkvBenchArgs {
    #[arg(long, value_enum, default_value_t = DkvTransport::Inproc)]
    pub transport: DkvTransport,
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 64))]
    pub shards: usize,
    /// Replicas per shard: one primary and 2f backups (odd).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 9))]
    pub replicas: usize,
    #[arg(long, value_enum, default_value_t = DkvWorkload::YcsbT)]
    pub workload: DkvWorkload,
    /// Measured seconds of each run (after a 1 s warm-up of the store).
    #[arg(long, default_value_t = 5.0, value_parser = crate::limits::positive)]
    pub duration: f64,
    /// Clients of the store, and threads of the single-node engine.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::count_between(1, 1024))]
    pub clients: usize,
    /// Transactions each store client is kept ahead (ycsb-t).
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count_between(1, 1024))]
    pub window: usize,
    /// Transactions each store client runs at once (ycsb-t; the others run one a client).
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_between(1, 256))]
    pub in_flight: usize,
    #[arg(long, value_enum, default_value_t = DkvSync::Group)]
    pub sync: DkvSync,
    /// Records (ycsb-t), accounts (smallbank, transfer) or keys (retwis) loaded before the run.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64_between(16, 100_000_000))]
    pub records: u64,
    #[arg(long, default_value_t = 100, value_parser = crate::limits::count_between(1, 1 << 20))]
    pub value_size: usize,
    /// Zipf exponent of the key choice (ycsb-t: of both kinds; default: each workload's own).
    #[arg(long, value_parser = crate::limits::non_negative)]
    pub zipf: Option<f64>,
    /// Each store client's clock is off by an offset drawn from this profile (PTP-like:
    /// 53.2 µs mean, NTP-like: 1.51 ms mean).
    #[arg(long, value_enum, default_value_t = SkewProfile::None)]
    pub skew: SkewProfile,
    /// Where the store validates read-only transactions.
    #[arg(long, value_enum, default_value_t = DkvValidation::Local)]
    pub validation: DkvValidation,
    /// Runs of each system, interleaved.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 100))]
    pub runs: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also run etcd (a three-member cluster on loopback, fsync on, linearizable reads) on the
    /// same transactions in each round (ycsb-t); needs `etcd` on PATH (`apt-get install
    /// etcd-server`).
    #[arg(long)]
    pub peers: bool,
    /// Reproduce a figure of seed 004 instead (a sweep; JSON and an SVG plot beside --json).
    #[arg(long, value_enum)]
    pub figure: Option<DkvFigure>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seconds behind the newest commit for which versions stay readable: an older snapshot
    /// is refused as snapshot-too-old (0 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = crate::limits::snapshot_window)]
    pub snapshot_window: std::time::Duration,
}

impl DkvBenchArgs {
    /// The store's configuration for round `run`.
    pub(crate) fn store_config(&self, run: usize) -> DkvBenchConfig {
        DkvBenchConfig {
            net: match self.transport {
                DkvTransport::Inproc => DkvNet::InProc,
                DkvTransport::Grpc => DkvNet::Grpc,
            },
            shards: self.shards as u32,
            replicas: self.replicas,
            window: self.window,
            in_flight: self.in_flight,
            sync: self.sync == DkvSync::Group,
            skew: self.skew,
            validation: self.validation.into(),
            snapshot_window: self.snapshot_window,
            ..DkvBenchConfig::new(self.clients, Duration::from_secs_f64(self.duration), self.seed ^ run as u64)
        }
    }

    pub(crate) fn sync_name(&self) -> &'static str {
        match self.sync {
            DkvSync::Group => "group",
            DkvSync::None => "none",
        }
    }
}

/// A workload as both systems run it.
pub(crate) enum Workload {
    YcsbT(YcsbT),
    SmallBank(SmallBankWorkload),
    Retwis(RetwisWorkload),
    Transfer(TransferWorkload),
}

impl Workload {
    pub(crate) fn of(args: &DkvBenchArgs) -> Result<Workload> {
        Ok(match args.workload {
            DkvWorkload::YcsbT => {
                let defaults = YcsbTConfig::default();
                let (read_zipf, write_zipf) = args.zipf.map_or((defaults.read_zipf, defaults.write_zipf), |z| (z, z));
                Workload::YcsbT(YcsbT::new(YcsbTConfig {
                    records: args.records,
                    value_size: args.value_size,
                    read_zipf,
                    write_zipf,
                    ..defaults
                })?)
            }
            DkvWorkload::Smallbank => {
                let defaults = SmallBankConfig::default();
                let zipf = args.zipf.unwrap_or(defaults.zipf);
                Workload::SmallBank(SmallBankWorkload::new(SmallBankConfig {
                    accounts: args.records,
                    zipf,
                    ..defaults
                })?)
            }
            DkvWorkload::Retwis => {
                let zipf = args.zipf.unwrap_or(RetwisConfig::default().zipf);
                let config = RetwisConfig { keys: args.records, zipf, value_size: args.value_size };
                Workload::Retwis(RetwisWorkload::new(config)?)
            }
            DkvWorkload::Transfer => {
                let defaults = TransferConfig::default();
                let zipf = args.zipf.unwrap_or(defaults.zipf);
                Workload::Transfer(TransferWorkload::new(TransferConfig { accounts: args.records, zipf, ..defaults })?)
            }
        })
    }

    /// One run of the store.
    pub(crate) fn store(&self, config: &DkvBenchConfig) -> Result<StoreRun> {
        let sessions = |run: virga_bench::dkv::SessionRun| StoreRun { report: run.report, audit: None };
        Ok(match self {
            Workload::YcsbT(workload) => StoreRun { report: run_store(config, workload)?, audit: None },
            Workload::SmallBank(workload) => sessions(run_store_sessions(config, workload, None)?),
            Workload::Retwis(workload) => sessions(run_store_sessions(config, workload, None)?),
            Workload::Transfer(workload) => {
                let run = run_store_sessions(config, workload, Some(&[transfer::TAG]))?;
                let pairs = run.snapshot.unwrap_or_default();
                let audit = transfer::audit(pairs.iter().map(|(key, value)| (key.as_ref(), value.as_ref())));
                let conserved = audit.as_ref().is_ok_and(|audit| audit.total_balance == workload.expected_total());
                let detail = match &audit {
                    Ok(audit) => format!(
                        "{} accounts, total {} (expected {})",
                        audit.accounts,
                        audit.total_balance,
                        workload.expected_total()
                    ),
                    Err(error) => error.to_string(),
                };
                StoreRun { report: run.report, audit: Some((conserved, detail)) }
            }
        })
    }

    /// One run of the single-node engine.
    fn engine(&self, options: &RunOptions, backend: &VirgaBackend) -> Result<RunReport> {
        fn run<W: KvWorkload>(workload: &W, options: &RunOptions, backend: &VirgaBackend) -> Result<RunReport> {
            runner::load(workload, backend)?;
            Ok(runner::run(workload, backend, options))
        }
        match self {
            Workload::YcsbT(workload) => run(workload, options, backend),
            Workload::SmallBank(workload) => run(workload, options, backend),
            Workload::Retwis(workload) => run(workload, options, backend),
            Workload::Transfer(workload) => run(workload, options, backend),
        }
    }
}

/// A store run, and for transfers whether the money added up.
pub(crate) struct StoreRun {
    pub report: DkvBenchReport,
    pub audit: Option<(bool, String)>,
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
    /// Transfers: whether every store run's accounts held the exact total afterwards.
    #[serde(skip_serializing_if = "Option::is_none")]
    money_conserved: Option<bool>,
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
        let committed_per_sec = median(runs.iter().map(|r| r.committed_per_sec));
        EtcdOutput {
            etcd_committed_per_sec: committed_per_sec,
            etcd_abort_rate: median(runs.iter().map(|r| r.abort_rate)),
            store_over_etcd: store_committed_per_sec / committed_per_sec.max(1e-9),
            etcd: runs,
        }
    }

    fn print(&self) {
        println!(
            "etcd:   {:.0} committed/s (median; runs {}), abort rate {:.2}%",
            self.etcd_committed_per_sec,
            spread(self.etcd.iter().map(|r| r.committed_per_sec)),
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

pub(crate) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

pub(crate) fn spread(values: impl Iterator<Item = f64>) -> String {
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(low, high), v| (low.min(v), high.max(v)));
    format!("{low:.0}–{high:.0}")
}

fn single_node(args: &DkvBenchArgs, workload: &Workload, run: usize) -> Result<RunReport> {
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
    let options = RunOptions {
        threads: args.clients,
        duration: Duration::from_secs_f64(args.duration),
        seed: args.seed ^ run as u64,
        progress: false,
        durable_lines: false,
    };
    workload.engine(&options, &backend)
}

pub(crate) fn bench_dkv(args: &DkvBenchArgs) -> Result<ExitCode> {
    if args.replicas % 2 != 1 {
        bail!("--replicas {} is even: a shard has one primary and 2f backups", args.replicas);
    }
    if let Some(figure) = args.figure {
        return crate::dkv_figures::run(figure, args);
    }
    if args.peers && args.workload != DkvWorkload::YcsbT {
        bail!("--peers runs etcd on ycsb-t only, not {}", args.workload.name());
    }
    if args.peers {
        etcd_available()?;
    }
    let workload = Workload::of(args)?;
    eprintln!(
        "virga bench dkv: {}, {} shards x {} replicas, {} clients, --sync {}, {} runs of {} s each system, interleaved",
        args.workload.name(),
        args.shards,
        args.replicas,
        args.clients,
        args.sync_name(),
        args.runs,
        args.duration
    );
    let (mut store, mut engine, mut etcd, mut audits) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..args.runs {
        let config = args.store_config(run);
        let StoreRun { report, audit } = workload.store(&config)?;
        eprintln!(
            "  run {}: store  {:>9.0} committed/s, abort rate {:.2}%{}",
            run + 1,
            report.committed_per_sec,
            report.abort_rate * 100.0,
            audit.as_ref().map(|(_, detail)| format!(", {detail}")).unwrap_or_default()
        );
        store.push(report);
        audits.extend(audit.map(|(conserved, _)| conserved));
        let report = single_node(args, &workload, run)?;
        eprintln!(
            "  run {}: engine {:>9.0} committed/s, abort rate {:.2}%",
            run + 1,
            report.committed_per_sec,
            report.abort_rate * 100.0
        );
        engine.push(report);
        if let (true, Workload::YcsbT(ycsb_t)) = (args.peers, &workload) {
            etcd.push(etcd_run(&config, ycsb_t, run)?);
        }
    }
    let store_rate = median(store.iter().map(|r| r.committed_per_sec));
    let engine_rate = median(engine.iter().map(|r| r.committed_per_sec));
    let output = Output {
        workload: args.workload.name(),
        transport: match args.transport {
            DkvTransport::Inproc => "inproc",
            DkvTransport::Grpc => "grpc",
        },
        sync: args.sync_name(),
        shards: args.shards,
        replicas: args.replicas,
        clients: args.clients,
        runs: args.runs,
        committed_per_sec: store_rate,
        abort_rate: median(store.iter().map(|r| r.abort_rate)),
        single_node_committed_per_sec: engine_rate,
        single_node_abort_rate: median(engine.iter().map(|r| r.abort_rate)),
        ratio: store_rate / engine_rate.max(1e-9),
        money_conserved: (!audits.is_empty()).then(|| audits.iter().all(|conserved| *conserved)),
        etcd: args.peers.then(|| EtcdOutput::new(etcd, store_rate)),
        store,
        single_node: engine,
    };
    println!(
        "store:  {:.0} committed/s (median; runs {}), abort rate {:.2}%",
        output.committed_per_sec,
        spread(output.store.iter().map(|r| r.committed_per_sec)),
        output.abort_rate * 100.0
    );
    println!(
        "engine: {:.0} committed/s (median; runs {}), abort rate {:.2}%",
        output.single_node_committed_per_sec,
        spread(output.single_node.iter().map(|r| r.committed_per_sec)),
        output.single_node_abort_rate * 100.0
    );
    println!("store / engine: {:.2}", output.ratio);
    if let Some(etcd) = &output.etcd {
        etcd.print();
    }
    if let Some(conserved) = output.money_conserved {
        println!("money conserved in every store run: {conserved}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&output)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(if output.money_conserved == Some(false) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
