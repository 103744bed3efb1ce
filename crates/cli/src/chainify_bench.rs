//! `virga bench chainify`: ChainifyDB's pipeline servers over real databases against the
//! number of clients, each point next to PostgreSQL alone (`virga_chainify::bench`).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use virga_chainify::bench::{run, BenchConfig, BenchPoint, BenchReport};
use virga_chainify::smallbank::Skew;
use virga_ledger::wlc::AgreementPolicy;

use crate::chainify::Policy;
use crate::limits;

#[derive(Args)]
pub(crate) struct ChainifyBenchArgs {
    /// Three organizations on SQLite (no PostgreSQL needed, no PostgreSQL-alone figure).
    #[arg(long)]
    pub sqlite_only: bool,
    /// Where the databases go (a new directory); by default a scratch directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The numbers of clients, one point each (the seed's Table 4.2: 3,6,12,24).
    #[arg(long, value_delimiter = ',', default_value = "3,6,12,24", value_parser = limits::count_between(1, 256))]
    pub clients: Vec<usize>,
    /// How the clients pick customers: `zipf` (exponent 1.1, the seed's hot setting) or
    /// `uniform`; a list runs both.
    #[arg(long, value_delimiter = ',', default_value = "zipf,uniform", value_parser = skew)]
    pub skew: Vec<SkewArg>,
    #[arg(long, value_enum, default_value_t = Policy::Any2)]
    pub policy: Policy,
    /// SmallBank's customers.
    #[arg(long, default_value_t = 100_000, value_parser = limits::count_u64_between(10, 10_000_000))]
    pub customers: u64,
    /// Rounds of every point, interleaved (report medians of at least three).
    #[arg(long, default_value_t = 1, value_parser = limits::count_between(1, 100))]
    pub runs: usize,
    /// Seconds each point runs before and while it is measured.
    #[arg(long, default_value_t = 2, value_parser = limits::count_u64_between(0, 600))]
    pub warmup: u64,
    #[arg(long, default_value_t = 10, value_parser = limits::count_u64_between(1, 3600))]
    pub duration: u64,
    /// Proposals each client keeps in flight.
    #[arg(long, default_value_t = 8, value_parser = limits::count_between(1, 1024))]
    pub window: usize,
    /// The orderer cuts a block at this many transactions (or after 10 ms).
    #[arg(long, default_value_t = 256, value_parser = limits::count_between(1, 4096))]
    pub block_size: usize,
    /// A ChainifyServer batches this many proposals (or what 2 ms brings) per agreement.
    #[arg(long, default_value_t = 32, value_parser = limits::count_between(1, 4096))]
    pub batch_size: usize,
    /// Connections per organization that run each block's stages in parallel; 0: serial.
    #[arg(long, default_value_t = 0, value_parser = limits::count_between(0, 64))]
    pub workers: usize,
    /// Replicas of the ordering service (a Raft group; 1 is a single orderer).
    #[arg(long, default_value_t = 3, value_parser = limits::count_between(1, 7))]
    pub orderers: usize,
    /// Skip the last phase, which changes org-3's database outside the chain while the most
    /// clients run and times its recovery.
    #[arg(long)]
    pub no_tamper: bool,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the JSON report goes.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SkewArg(Skew);

fn skew(text: &str) -> Result<SkewArg, String> {
    match text {
        "zipf" => Ok(SkewArg(Skew::Zipf(1.1))),
        "uniform" => Ok(SkewArg(Skew::Uniform)),
        other => Err(format!("{other:?} is not a skew: use zipf or uniform")),
    }
}

pub(crate) fn run_bench(args: &ChainifyBenchArgs) -> anyhow::Result<ExitCode> {
    let policy = match args.policy {
        Policy::Any2 => AgreementPolicy::new(2, 3),
        Policy::All3 => AgreementPolicy::new(3, 3),
    }?;
    let scratch = tempfile::Builder::new().prefix("virga-chainify-bench-").tempdir().context("a scratch directory")?;
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))?;
    let dir = args.dir.clone().unwrap_or_else(|| scratch.path().join("consortium"));
    let config = BenchConfig {
        dir,
        sqlite_only: args.sqlite_only,
        customers: args.customers,
        clients: args.clients.clone(),
        skews: args.skew.iter().map(|skew| skew.0).collect(),
        policy,
        runs: args.runs,
        warmup: Duration::from_secs(args.warmup),
        duration: Duration::from_secs(args.duration),
        window: args.window,
        block_size: args.block_size,
        batch_size: args.batch_size,
        workers: args.workers,
        alone_transactions: 4_000,
        orderers: args.orderers,
        tamper: !args.no_tamper,
        seed: args.seed,
    };
    eprintln!(
        "virga bench chainify: {} organizations, {} customers, clients {:?}, {} round(s) of {} s each (loading first)",
        if args.sqlite_only { "3 SQLite" } else { "2 PostgreSQL + 1 SQLite" },
        args.customers,
        args.clients,
        args.runs,
        args.duration
    );
    let report = run(&config, &mut |point| eprintln!("  {}", line(point)))?;
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let svg = PathBuf::from(format!("{}-tps.svg", path.with_extension("").display()));
        plot(&report, &svg)?;
        eprintln!("wrote {} and {}", path.display(), svg.display());
    }
    Ok(if report.recovery_failed.is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn line(point: &BenchPoint) -> String {
    let alone = point
        .postgres_alone_tps
        .map(|alone| format!(", PostgreSQL alone {alone:.0} tps ({:.0}%)", 100.0 * point.tps / alone.max(1e-9)))
        .unwrap_or_default();
    format!(
        "round {} {:>8} {:>3} clients: {:>6.0} tps (p50 {:.0} ms, p99 {:.0} ms; execute {:.0}%, vote {:.0}%, append {:.0}%; signatures {:.1}% of the machine){alone}",
        point.round,
        point.skew,
        point.clients,
        point.tps,
        point.latency_p50_ms,
        point.latency_p99_ms,
        100.0 * point.execute_share,
        100.0 * point.decide_share,
        100.0 * point.apply_share,
        100.0 * point.crypto_share,
    )
}

fn print_report(report: &BenchReport) {
    let names: Vec<String> =
        report.organizations.iter().map(|org| format!("{} ({:?})", org.name, org.database).to_lowercase()).collect();
    println!("organizations  {}", names.join(", "));
    println!(
        "policy         {}; blocks of up to {}; {} in flight per client",
        report.policy, report.block_size, report.window
    );
    println!("loaded         {} customers through the pipeline in {:.1} s", report.customers, report.load_seconds);
    println!("durability     {}", report.durability);
    let costs = &report.signature_costs;
    println!(
        "signatures     secp256k1: {:.0} µs to sign, {:.0} µs to check on this machine ({} cores)",
        costs.sign_us, costs.check_us, costs.cores
    );
    for point in &report.points {
        println!("{}", line(point));
    }
    if let Some(recovery) = &report.recovery {
        println!(
            "tampering      {}: checkpoint taken in {:.2} s; `{}` outside the chain {} blocks after it, recovered {:.2} s later ({} attempt(s)); {:.0} tps before, {:.0} tps while it recovered",
            recovery.organization,
            recovery.checkpoint_seconds,
            virga_chainify::bench::TAMPER_SQL,
            recovery.blocks_since_checkpoint,
            recovery.recovered_seconds,
            recovery.attempts,
            recovery.tps_before,
            recovery.tps_while_recovering
        );
    }
    if let Some(why) = &report.recovery_skipped {
        println!("tampering      not measured: {why}");
    }
    if let Some(error) = &report.recovery_failed {
        println!("tampering      FAILED: {error}");
    }
}

/// Throughput against clients, one line a skew, the medians over rounds; PostgreSQL alone
/// dashed in the same colour.
fn plot(report: &BenchReport, path: &std::path::Path) -> anyhow::Result<()> {
    use virga_bench::plot::{line_chart, Series};
    let mut skews: Vec<&str> = report.points.iter().map(|point| point.skew.as_str()).collect();
    skews.sort_unstable();
    skews.dedup();
    let mut series = Vec::new();
    for (colour, skew) in skews.iter().enumerate() {
        let mut clients: Vec<usize> =
            report.points.iter().filter(|point| point.skew == *skew).map(|point| point.clients).collect();
        clients.sort_unstable();
        clients.dedup();
        let medians = |value: &dyn Fn(&BenchPoint) -> Option<f64>| -> Vec<(f64, f64)> {
            clients
                .iter()
                .filter_map(|count| {
                    let mut values: Vec<f64> = report
                        .points
                        .iter()
                        .filter(|point| point.skew == *skew && point.clients == *count)
                        .filter_map(value)
                        .collect();
                    (!values.is_empty()).then(|| (*count as f64, virga_bench::median(&mut values)))
                })
                .collect()
        };
        series.push(Series {
            label: format!("consortium, {skew}"),
            colour,
            dashed: false,
            points: medians(&|point| Some(point.tps)),
        });
        let alone = medians(&|point| point.postgres_alone_tps);
        if !alone.is_empty() {
            series.push(Series { label: format!("PostgreSQL alone, {skew}"), colour, dashed: true, points: alone });
        }
    }
    let step = report.points.iter().map(|point| point.clients).fold(0, gcd).max(1);
    line_chart(
        path,
        &format!("ChainifyDB, SmallBank, {}: transactions per second", report.policy),
        "clients",
        step as f64,
        "answered transactions per second (medians over rounds)",
        series,
    )
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
