//! `virga bench kv` and `virga kv audit`: the transactional engine from the command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use virga_bench::kv::retwis::{RetwisConfig, RetwisWorkload};
use virga_bench::kv::runner::{self, RunOptions, RunReport};
use virga_bench::kv::smallbank::{SmallBankConfig, SmallBankWorkload};
use virga_bench::kv::transfer::{self, TransferConfig, TransferWorkload};
use virga_bench::kv::virga::VirgaBackend;
use virga_bench::kv::ycsb::{YcsbConfig, YcsbMix, YcsbWorkload};
use virga_bench::kv::KvBackend;
use virga_txn::{ConcurrencyControl, Durability, Engine, EngineConfig, SkewProfile, SyncMode, TimestampScheme};

/// Name of the file in `--dir` that says which workload the data belongs to.
const META_FILE: &str = "kv.json";
/// Subdirectory of `--dir` holding the write-ahead log.
const WAL_DIR: &str = "wal";

#[derive(Args, Clone, Debug)]
pub(crate) struct KvBenchArgs {
    /// ycsb-a … ycsb-f, smallbank, retwis or transfer.
    #[arg(long, default_value = "smallbank")]
    pub workload: String,
    /// Worker threads; each is one client with its own clock.
    #[arg(long, default_value_t = 2, value_parser = crate::limits::count(1))]
    pub threads: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0, value_parser = crate::limits::positive)]
    pub duration: f64,
    /// Concurrency control: occ or 2pl.
    #[arg(long, value_enum, ignore_case = true, default_value_t = ConcurrencyControl::Occ)]
    pub cc: ConcurrencyControl,
    /// Timestamps: clock (per-client skewed clocks), hlc or dst.
    #[arg(long, value_enum, ignore_case = true, default_value_t = TimestampScheme::Clock)]
    pub timestamps: TimestampScheme,
    /// Skew of each client's clock: none, ptp (~53 µs) or ntp (~1.5 ms).
    #[arg(long, value_enum, ignore_case = true, default_value_t = SkewProfile::None)]
    pub clock_skew: SkewProfile,
    /// Keep the data durably in this directory (resumes the data already there).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// With --dir: none, group or every.
    #[arg(long, default_value = "group")]
    pub sync: SyncMode,
    /// Size of the key space: YCSB records, Retwis keys, SmallBank customers or transfer
    /// accounts (default: the workload's own).
    #[arg(long, value_parser = crate::limits::count_u64(1))]
    pub keys: Option<u64>,
    /// Zipf exponent of key choice (default: the workload's own).
    #[arg(long, value_parser = crate::limits::non_negative)]
    pub zipf: Option<f64>,
    /// YCSB operations per transaction.
    #[arg(long, value_parser = crate::limits::count(1))]
    pub ops_per_txn: Option<usize>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Repeats each measurement (Virga's and every peer's) and reports the median run.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count(1))]
    pub runs: usize,
    /// Also run RocksDB's OptimisticTransactionDB and TransactionDB on the same workload,
    /// threads and durability (needs the `rocksdb` feature).
    #[arg(long)]
    pub peers: bool,
    /// Writes the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Clone, Debug)]
pub(crate) struct ClockSweepArgs {
    /// Zipf exponents (contention levels) to sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.6,0.8,1.0,1.2,1.4", value_parser = crate::limits::non_negative)]
    pub zipf: Vec<f64>,
    /// Worker threads; each is a client with its own skewed clock.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    pub threads: usize,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 3.0, value_parser = crate::limits::positive)]
    pub duration: f64,
    /// Retwis keys.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64(1))]
    pub keys: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Writes the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub(crate) struct KvAuditArgs {
    /// Directory written by `virga bench kv --dir`, or a stopped `virga kv cluster up`
    /// cluster's directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// For a cluster: sum the values (decimal integers) of the keys with this prefix.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// For a cluster: exit 1 unless the sum over the shards is this.
    #[arg(long)]
    pub expect_total: Option<u64>,
}

/// What is stored in `--dir` next to the log: the workload and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "workload", rename_all = "kebab-case")]
enum WorkloadSpec {
    Ycsb { mix: String, config: YcsbConfig },
    Smallbank { config: SmallBankConfig },
    Retwis { config: RetwisConfig },
    Transfer { config: TransferConfig },
}

impl WorkloadSpec {
    fn from_args(args: &KvBenchArgs) -> anyhow::Result<WorkloadSpec> {
        let name = args.workload.as_str();
        Ok(if let Some(mix) = YcsbMix::parse(name) {
            let mut config = YcsbConfig::default();
            config.records = args.keys.unwrap_or(config.records);
            config.zipf = args.zipf.unwrap_or(config.zipf);
            config.ops_per_txn = args.ops_per_txn.unwrap_or(config.ops_per_txn);
            WorkloadSpec::Ycsb { mix: mix.name().to_string(), config }
        } else {
            match name {
                "smallbank" => {
                    let mut config = SmallBankConfig::default();
                    config.accounts = args.keys.unwrap_or(config.accounts);
                    config.zipf = args.zipf.unwrap_or(config.zipf);
                    WorkloadSpec::Smallbank { config }
                }
                "retwis" => {
                    let mut config = RetwisConfig::default();
                    config.keys = args.keys.unwrap_or(config.keys);
                    config.zipf = args.zipf.unwrap_or(config.zipf);
                    WorkloadSpec::Retwis { config }
                }
                "transfer" => {
                    let mut config = TransferConfig::default();
                    config.accounts = args.keys.unwrap_or(config.accounts);
                    config.zipf = args.zipf.unwrap_or(config.zipf);
                    WorkloadSpec::Transfer { config }
                }
                other => bail!(
                    "unknown workload `{other}` (expected one of: {})",
                    virga_bench::kv::workload_names().join(", ")
                ),
            }
        })
    }

    fn name(&self) -> String {
        match self {
            WorkloadSpec::Ycsb { mix, .. } => mix.clone(),
            WorkloadSpec::Smallbank { .. } => "smallbank".into(),
            WorkloadSpec::Retwis { .. } => "retwis".into(),
            WorkloadSpec::Transfer { .. } => "transfer".into(),
        }
    }

    fn build(&self) -> anyhow::Result<AnyWorkload> {
        Ok(match self {
            WorkloadSpec::Ycsb { mix, config } => {
                let mix = YcsbMix::parse(mix).with_context(|| format!("unknown YCSB mix `{mix}`"))?;
                AnyWorkload::Ycsb(YcsbWorkload::new(mix, config.clone())?)
            }
            WorkloadSpec::Smallbank { config } => AnyWorkload::SmallBank(SmallBankWorkload::new(config.clone())?),
            WorkloadSpec::Retwis { config } => AnyWorkload::Retwis(RetwisWorkload::new(config.clone())?),
            WorkloadSpec::Transfer { config } => AnyWorkload::Transfer(TransferWorkload::new(config.clone())?),
        })
    }
}

enum AnyWorkload {
    Ycsb(YcsbWorkload),
    SmallBank(SmallBankWorkload),
    Retwis(RetwisWorkload),
    Transfer(TransferWorkload),
}

/// Calls a generic function with the concrete workload.
macro_rules! with_workload {
    ($workload:expr, $w:ident => $body:expr) => {
        match $workload {
            AnyWorkload::Ycsb($w) => $body,
            AnyWorkload::SmallBank($w) => $body,
            AnyWorkload::Retwis($w) => $body,
            AnyWorkload::Transfer($w) => $body,
        }
    };
}

fn engine_config(args: &KvBenchArgs) -> EngineConfig {
    EngineConfig {
        cc: args.cc,
        timestamps: args.timestamps,
        clock_skew: args.clock_skew,
        seed: args.seed,
        durability: match &args.dir {
            Some(dir) => Durability::Log { dir: dir.join(WAL_DIR), sync: args.sync },
            None => Durability::Off,
        },
        ..EngineConfig::default()
    }
}

fn read_meta(dir: &Path) -> anyhow::Result<Option<WorkloadSpec>> {
    let path = dir.join(META_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let spec = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not a workload description", path.display()))?;
            Ok(Some(spec))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_meta(dir: &Path, spec: &WorkloadSpec) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(META_FILE);
    let tmp = dir.join(format!("{META_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(spec)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Checks the options every run shares, before anything is loaded.
fn check_run_options(duration: f64, threads: usize) -> anyhow::Result<()> {
    if !(duration > 0.0 && duration <= 86_400.0) {
        bail!("--duration must be a number of seconds above 0 and at most 86400, not {duration}");
    }
    if threads == 0 || threads > virga_txn::MAX_SESSIONS {
        bail!("--threads must be between 1 and {}, not {threads}", virga_txn::MAX_SESSIONS);
    }
    Ok(())
}

pub(crate) fn bench_kv(args: &KvBenchArgs) -> anyhow::Result<ExitCode> {
    check_run_options(args.duration, args.threads)?;
    let mut spec = WorkloadSpec::from_args(args)?;
    if let Some(dir) = &args.dir {
        if let Some(stored) = read_meta(dir)? {
            if stored.name() != spec.name() {
                bail!("{} holds {} data; it cannot run {}", dir.display(), stored.name(), spec.name());
            }
            // The data decides the parameters (key space, skew) it was created with.
            spec = stored;
        }
    }
    let runs = args.runs.max(1);
    let mut reports = Vec::with_capacity(runs);
    for run in 0..runs {
        if runs > 1 {
            eprintln!("run {} of {runs}", run + 1);
        }
        reports.push(run_virga_once(args, &spec)?);
    }
    let report = median(reports);
    if runs > 1 {
        println!("median of {runs} runs:\n{}", report.summary());
    }

    let mut peers: Vec<RunReport> = Vec::new();
    if args.peers {
        peers = run_peers(args, &spec, &run_options(args))?;
        print_comparison(&report, &peers);
    }
    if let Some(path) = &args.json {
        let json = json_report(args, &report, &peers);
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_options(args: &KvBenchArgs) -> RunOptions {
    RunOptions {
        threads: args.threads,
        duration: Duration::from_secs_f64(args.duration),
        seed: args.seed,
        progress: !args.quiet,
        durable_lines: args.dir.is_some(),
    }
}

/// The run with the median throughput (its abort rate and latencies come with it).
fn median(mut reports: Vec<RunReport>) -> RunReport {
    reports.sort_by(|a, b| a.committed_per_sec.total_cmp(&b.committed_per_sec));
    let middle = reports.len() / 2;
    reports.swap_remove(middle)
}

/// Opens the engine (resuming the data in `--dir` if any, loading otherwise), runs the
/// workload once and prints the run's summary.
fn run_virga_once(args: &KvBenchArgs, spec: &WorkloadSpec) -> anyhow::Result<RunReport> {
    let resume = match &args.dir {
        Some(dir) => read_meta(dir)?.is_some(),
        None => false,
    };
    let workload = spec.build()?;
    let (engine, recovery) = Engine::open(engine_config(args))?;
    let backend = VirgaBackend::new(Arc::clone(&engine));
    if resume {
        eprintln!(
            "resuming {}: {} keys, {} committed transactions recovered{}",
            spec.name(),
            engine.store().len(),
            recovery.committed,
            if recovery.truncated_bytes > 0 {
                format!(", torn tail of {} bytes cut", recovery.truncated_bytes)
            } else {
                String::new()
            }
        );
    } else {
        let started = std::time::Instant::now();
        let loaded = with_workload!(&workload, w => runner::load(w, &backend))?;
        if let Some(dir) = &args.dir {
            // Written after the load is durable: a directory with a description always has
            // its initial data.
            write_meta(dir, spec)?;
        }
        eprintln!("loaded {loaded} pairs in {:.1} s", started.elapsed().as_secs_f64());
    }
    let options = run_options(args);
    eprintln!(
        "running {} on {} for {} s with {} threads (clock skew {}, durability {})",
        spec.name(),
        backend.name(),
        args.duration,
        options.threads,
        args.clock_skew,
        args.dir.as_ref().map_or("off".to_string(), |d| format!("{} in {}", args.sync, d.display()))
    );
    let report = with_workload!(&workload, w => runner::run(w, &backend, &options));
    engine.sync()?;
    println!("{}", report.summary());
    Ok(report)
}

/// MILANA's clock experiment on one node: Retwis under OCC with per-client clocks skewed
/// like PTP and like NTP, at rising contention; the abort rates side by side.
pub(crate) fn bench_clocks(args: &ClockSweepArgs) -> anyhow::Result<ExitCode> {
    check_run_options(args.duration, args.threads)?;
    if let Some(bad) = args.zipf.iter().find(|z| !(z.is_finite() && **z >= 0.0)) {
        bail!("--zipf values must be finite and at least 0, not {bad}");
    }
    let mut rows = Vec::new();
    println!(
        "{:>6} {:>12} {:>12} {:>14} {:>14} {:>10}",
        "zipf", "ptp aborts", "ntp aborts", "ptp commit/s", "ntp commit/s", "fewer"
    );
    for &zipf in &args.zipf {
        let mut point = Vec::new();
        for skew in [SkewProfile::Ptp, SkewProfile::Ntp] {
            let run = KvBenchArgs {
                workload: "retwis".into(),
                threads: args.threads,
                duration: args.duration,
                cc: ConcurrencyControl::Occ,
                timestamps: TimestampScheme::Clock,
                clock_skew: skew,
                dir: None,
                sync: SyncMode::None,
                keys: Some(args.keys),
                zipf: Some(zipf),
                ops_per_txn: None,
                seed: args.seed,
                peers: false,
                json: None,
                quiet: true,
                runs: 1,
            };
            point.push(run_virga(&run)?);
        }
        let (ptp, ntp) = (&point[0], &point[1]);
        let fewer = if ntp.abort_rate > 0.0 { 1.0 - ptp.abort_rate / ntp.abort_rate } else { 0.0 };
        println!(
            "{zipf:>6.2} {:>11.2}% {:>11.2}% {:>14.0} {:>14.0} {:>9.0}%",
            ptp.abort_rate * 100.0,
            ntp.abort_rate * 100.0,
            ptp.committed_per_sec,
            ntp.committed_per_sec,
            fewer * 100.0
        );
        rows.push(serde_json::json!({ "zipf": zipf, "ptp": ptp, "ntp": ntp, "fewer_aborts_with_ptp": fewer }));
    }
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "workload": "retwis",
            "threads": args.threads,
            "keys": args.keys,
            "duration_s": args.duration,
            "points": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and runs one in-memory configuration, without printing.
fn run_virga(args: &KvBenchArgs) -> anyhow::Result<RunReport> {
    let spec = WorkloadSpec::from_args(args)?;
    let workload = spec.build()?;
    let (engine, _) = Engine::open(engine_config(args))?;
    let backend = VirgaBackend::new(engine);
    with_workload!(&workload, w => runner::load(w, &backend))?;
    let options = RunOptions {
        threads: args.threads,
        duration: Duration::from_secs_f64(args.duration),
        seed: args.seed,
        progress: !args.quiet,
        durable_lines: false,
    };
    Ok(with_workload!(&workload, w => runner::run(w, &backend, &options)))
}

fn json_report(args: &KvBenchArgs, report: &RunReport, peers: &[RunReport]) -> serde_json::Value {
    let mut json = serde_json::to_value(report).unwrap_or_default();
    if let Some(object) = json.as_object_mut() {
        object.insert(
            "config".into(),
            serde_json::json!({
                "cc": args.cc.to_string(),
                "timestamps": args.timestamps.to_string(),
                "clock_skew": args.clock_skew.to_string(),
                "durability": if args.dir.is_some() { args.sync.to_string() } else { "off".into() },
            }),
        );
        object.insert(
            "machine".into(),
            serde_json::json!({ "cores": std::thread::available_parallelism().map_or(0, |n| n.get()) }),
        );
        object.insert("peers".into(), serde_json::to_value(peers).unwrap_or_default());
    }
    json
}

fn print_comparison(virga: &RunReport, peers: &[RunReport]) {
    println!("\n{:<28} {:>14} {:>10} {:>10} {:>10}", "engine", "committed/s", "aborts", "p50 us", "p99 us");
    for r in std::iter::once(virga).chain(peers) {
        println!(
            "{:<28} {:>14.0} {:>9.2}% {:>10.1} {:>10.1}",
            r.engine,
            r.committed_per_sec,
            r.abort_rate * 100.0,
            r.p50_us,
            r.p99_us
        );
    }
    for peer in peers {
        println!("virga / {}: {:.2}x", peer.engine, virga.committed_per_sec / peer.committed_per_sec.max(1e-9));
    }
}

#[cfg(not(feature = "rocksdb"))]
fn run_peers(_: &KvBenchArgs, _: &WorkloadSpec, _: &RunOptions) -> anyhow::Result<Vec<RunReport>> {
    bail!(
        "--peers needs RocksDB: build with `--features rocksdb` (cargo run --release --features rocksdb -- bench kv …)"
    )
}

#[cfg(feature = "rocksdb")]
fn run_peers(args: &KvBenchArgs, spec: &WorkloadSpec, options: &RunOptions) -> anyhow::Result<Vec<RunReport>> {
    use virga_bench::kv::rocksdb::{RocksDurability, RocksMode, RocksOptions, RocksPeer};
    let durability = match (&args.dir, args.sync) {
        (None, _) => RocksDurability::None,
        (Some(_), SyncMode::None) => RocksDurability::None,
        (Some(_), SyncMode::Group) => RocksDurability::Group,
        (Some(_), SyncMode::Every) => RocksDurability::Every,
    };
    let mut reports = Vec::new();
    for mode in [RocksMode::Optimistic, RocksMode::Pessimistic] {
        let rocks_options = RocksOptions { mode, durability, ..RocksOptions::default() };
        // Beside Virga's log when durable (same disk), otherwise in a temporary directory.
        let peer = match &args.dir {
            Some(dir) => {
                let path = dir.join(format!("peer-{}", mode.as_str()));
                if path.exists() {
                    std::fs::remove_dir_all(&path).with_context(|| format!("clearing {}", path.display()))?;
                }
                RocksPeer::open(&path, rocks_options)?
            }
            None => RocksPeer::open_temp(rocks_options)?,
        };
        let workload = spec.build()?;
        let started = std::time::Instant::now();
        let loaded = with_workload!(&workload, w => runner::load(w, &peer))?;
        eprintln!("{}: loaded {loaded} pairs in {:.1} s", peer.name(), started.elapsed().as_secs_f64());
        let quiet = RunOptions { durable_lines: false, ..options.clone() };
        let mut runs = Vec::new();
        for _ in 0..args.runs.max(1) {
            let report = with_workload!(&workload, w => runner::run(w, &peer, &quiet));
            println!("{}", report.summary());
            runs.push(report);
        }
        reports.push(median(runs));
    }
    Ok(reports)
}

/// The audit's findings, printed as JSON.
#[derive(Serialize)]
struct AuditReport {
    workload: String,
    keys: u64,
    committed: u64,
    loaded_pairs: u64,
    truncated_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    accounts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total_balance: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_total_balance: Option<u128>,
}

pub(crate) fn kv_audit(args: &KvAuditArgs) -> anyhow::Result<ExitCode> {
    if virga_dkv::deploy::is_cluster_dir(&args.dir) {
        return crate::kv_cluster::audit(args);
    }
    let spec = read_meta(&args.dir)?.with_context(|| {
        format!(
            "{} holds no Virga key-value data (no {META_FILE}); create it with `virga bench kv --dir`",
            args.dir.display()
        )
    })?;
    let config = EngineConfig {
        durability: Durability::Log { dir: args.dir.join(WAL_DIR), sync: SyncMode::None },
        ..EngineConfig::default()
    };
    let (engine, recovery) = Engine::open(config)?;
    let mut pairs: Vec<(bytes::Bytes, bytes::Bytes)> = Vec::new();
    engine.store().for_each(|state| {
        if let Some(value) = state.lock().latest().and_then(|v| v.value.clone()) {
            pairs.push((state.key().clone(), value));
        }
    });
    let mut report = AuditReport {
        workload: spec.name(),
        keys: pairs.len() as u64,
        committed: recovery.committed,
        loaded_pairs: recovery.loaded_pairs,
        truncated_bytes: recovery.truncated_bytes,
        accounts: None,
        total_balance: None,
        expected_total_balance: None,
    };
    let mut consistent = true;
    if let WorkloadSpec::Transfer { config } = &spec {
        let found = transfer::audit(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.dir.display()))?;
        let expected = u128::from(config.accounts) * u128::from(config.initial_balance);
        consistent = found.total_balance == expected && found.accounts == config.accounts;
        report.accounts = Some(found.accounts);
        report.total_balance = Some(found.total_balance);
        report.expected_total_balance = Some(expected);
    }
    println!("{}", serde_json::to_string(&report)?);
    if !consistent {
        eprintln!("error: the recovered balances do not add up to the initial total");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
