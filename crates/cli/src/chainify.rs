//! `virga chainify`: ChainifyDB's consortium over real databases (`virga_chainify::run`).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use virga_chainify::run::{up, verify, UpConfig, UpReport};
use virga_chainify::smallbank::Skew;
use virga_ledger::wlc::AgreementPolicy;

#[derive(Subcommand)]
pub(crate) enum ChainifyCommand {
    /// Runs three organizations (two on PostgreSQL, one on SQLite; or three on SQLite) on
    /// SmallBank: each executes every block on its own database, and they agree on the
    /// effects (trigger digests hashed into LedgerBlocks) by a c-of-3 vote. The same
    /// transactions then run on one PostgreSQL alone, for comparison. PostgreSQL's server
    /// programs must be installed unless --sqlite-only (apt-get install postgresql); each
    /// PostgreSQL organization gets a private instance listening on a socket in its directory.
    Up(ChainifyUpArgs),
    /// Checks a directory kept by `up --dir`: every organization's ledger chains and agrees
    /// with the others', replays to the effects it records, and leaves exactly the database
    /// the organization holds; prints `ok: …` or names the organization, table and block.
    Verify {
        #[arg(long)]
        dir: PathBuf,
    },
    /// The servers as processes over gRPC: `init` a deployment directory, `run` named
    /// servers of it, and run `client`s against them.
    #[command(subcommand)]
    Node(crate::chainify_node::NodeCommand),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Policy {
    /// Any two of the three organizations must hold the same effects.
    Any2,
    /// All three.
    All3,
}

#[derive(Args)]
pub(crate) struct ChainifyUpArgs {
    /// Three organizations on SQLite (no PostgreSQL needed; no PostgreSQL-alone figure).
    #[arg(long)]
    pub sqlite_only: bool,
    /// Keep every organization's database and ledger here (a new directory); by default a
    /// scratch directory, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// SmallBank blocks after the load.
    #[arg(long, default_value_t = 40, value_parser = crate::limits::count_u64_between(1, 1_000_000))]
    pub blocks: u64,
    /// Transactions a block.
    #[arg(long, default_value_t = 256, value_parser = crate::limits::count_between(1, 65_536))]
    pub block_size: usize,
    /// SmallBank's customers (each with an account, savings and checking row).
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64_between(10, 10_000_000))]
    pub customers: u64,
    #[arg(long, value_enum, default_value_t = Policy::Any2)]
    pub policy: Policy,
    /// A logical checkpoint of every shared table after every K-th block (three kept).
    #[arg(long, default_value_t = 5, value_parser = crate::limits::count_u64_between(1, 1_000_000))]
    pub checkpoint_every: u64,
    /// Before this SmallBank block (from 0), the last organization's administrator changes a
    /// balance outside the chain: it is outvoted and recovers (shown in the report).
    #[arg(long)]
    pub tamper_before: Option<u64>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Connections per organization that run each block's stages (from the semantic
    /// analysis of its SQL) in parallel; 0 runs every block serially.
    #[arg(long, default_value_t = 0, value_parser = crate::limits::count_between(0, 64))]
    pub workers: usize,
    /// Draw customers from a Zipf distribution with this exponent (the seed's hot setting:
    /// 1.1) instead of uniformly.
    #[arg(long, value_parser = zipf_exponent)]
    pub zipf: Option<f64>,
    /// Where the JSON report goes.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub(crate) fn zipf_exponent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(exponent) if exponent > 0.0 && exponent <= 5.0 => Ok(exponent),
        _ => Err("must be a number above 0 and at most 5".to_string()),
    }
}

pub(crate) fn run(command: &ChainifyCommand) -> anyhow::Result<ExitCode> {
    match command {
        ChainifyCommand::Up(args) => run_up(args),
        ChainifyCommand::Node(command) => crate::chainify_node::run(command),
        ChainifyCommand::Verify { dir } => match verify(dir) {
            Ok(report) => {
                println!(
                    "ok: {} organizations, {} agreed blocks, every database equals its ledger's replay",
                    report.organizations, report.blocks
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(problem) => {
                println!("differs: {problem}");
                Ok(ExitCode::FAILURE)
            }
        },
    }
}

fn run_up(args: &ChainifyUpArgs) -> anyhow::Result<ExitCode> {
    let policy = match args.policy {
        Policy::Any2 => AgreementPolicy::new(2, 3),
        Policy::All3 => AgreementPolicy::new(3, 3),
    }?;
    if let Some(tamper) = args.tamper_before {
        anyhow::ensure!(tamper < args.blocks, "--tamper-before {tamper} is not one of the {} blocks", args.blocks);
    }
    // A scratch directory the postgres user can enter when this runs as root.
    let scratch = tempfile::Builder::new().prefix("virga-chainify-").tempdir().context("a scratch directory")?;
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))?;
    let dir = args.dir.clone().unwrap_or_else(|| scratch.path().join("consortium"));
    let config = UpConfig {
        dir: dir.clone(),
        sqlite_only: args.sqlite_only,
        blocks: args.blocks,
        block_size: args.block_size,
        customers: args.customers,
        policy,
        checkpoint_every: args.checkpoint_every,
        tamper_before: args.tamper_before,
        seed: args.seed,
        workers: args.workers,
        skew: args.zipf.map_or(Skew::Uniform, Skew::Zipf),
    };
    eprintln!(
        "virga chainify up: {} organizations, {} customers, {} blocks of {} (loading first)",
        if args.sqlite_only { "3 SQLite" } else { "2 PostgreSQL + 1 SQLite" },
        args.customers,
        args.blocks,
        args.block_size
    );
    let bar = ProgressBar::new(args.blocks);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} blocks {msg}")?);
    let report = up(&config, &mut |_, transactions| {
        bar.inc(1);
        bar.set_message(format!("{transactions} transactions"));
    })?;
    bar.finish_and_clear();
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if args.dir.is_some() {
        eprintln!("kept in {}: check it with `virga chainify verify --dir {}`", dir.display(), dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &UpReport) {
    let names: Vec<String> =
        report.organizations.iter().map(|org| format!("{} ({:?})", org.name, org.database).to_lowercase()).collect();
    println!("organizations      {}", names.join(", "));
    println!("policy             {}", report.policy);
    println!("customers drawn    {}", report.skew);
    println!("loaded             {} customers in {:.1} s", report.customers, report.load_seconds);
    println!(
        "ran                {} blocks of {}: {} transactions ({} successful) in {:.1} s",
        report.blocks, report.block_size, report.transactions, report.successful, report.seconds
    );
    println!("throughput         {:.0} transactions/s", report.tps);
    if let Some(alone) = report.postgres_alone_tps {
        println!(
            "PostgreSQL alone   {alone:.0} transactions/s (the consortium: {:.0}% of it)",
            100.0 * report.tps / alone.max(1e-9)
        );
    }
    println!("agreed blocks      {} (the load's included)", report.agreed_blocks);
    println!(
        "time               execute {:.1} s, vote and ledgers {:.1} s (signatures {:.3} s), checkpoints {:.1} s, \
         recovery {:.1} s",
        report.execute_seconds,
        report.agree_seconds,
        report.crypto_seconds,
        report.checkpoint_seconds,
        report.recover_seconds
    );
    for recovery in &report.recoveries {
        println!(
            "recovered          {} at block {} after {} attempt(s), {:.2} s",
            recovery.organization, recovery.block, recovery.attempts, recovery.seconds
        );
    }
    for (block, org, why) in &report.failed {
        println!("not recovered      {org} at block {block}: {why}");
    }
    println!("durability         {}", report.durability);
    println!(
        "execution          {}",
        match report.workers {
            0 => "serial, block order".to_string(),
            workers => format!("staged by semantic analysis, {workers} connections per organization"),
        }
    );
}
