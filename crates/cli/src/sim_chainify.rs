//! `virga sim chainify --seeds N`: ChainifyDB's pipeline (three organizations on in-memory
//! SQLite, an orderer, clients) in the deterministic simulator under lost and duplicated
//! messages, a lagging organization, crashed servers, and an organization that lies about
//! its effects or whose database is changed outside the chain; every seed checked against
//! a serial replay, each failure printed with the command that replays it.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use virga_chainify::sim::{run_seed, SimOptions, SimReport, Weakening};

use crate::limits;
use crate::sim_dkv::Faults;

#[derive(Args, Debug)]
pub(crate) struct ChainifySimArgs {
    /// Seeds to run, each a full run.
    #[arg(long, value_parser = limits::count_u64_between(1, 10_000_000))]
    pub seeds: u64,
    /// The first seed; seeds run from here up.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Clients, spread over the three organizations in turn.
    #[arg(long, value_parser = limits::count_between(1, 64), default_value_t = 3)]
    pub clients: usize,
    /// Proposals each client sends.
    #[arg(long, value_parser = limits::count_u64_between(1, 100_000), default_value_t = 40)]
    pub transactions: u64,
    /// `all`: lost and duplicated messages, a lagging organization, crashes (a crash loses
    /// what a server's logs had not synced), and a lying or tampered organization. `disk`:
    /// all of those, and one orderer replica that crashes meets a media fault (a latent
    /// sector error while it is down, or a write that lands before its offset just before it
    /// crashes); a replica whose log then refuses to open stays down. `none`: a reliable
    /// network and no crash, lie or tampering.
    #[arg(long, value_enum, default_value = "all")]
    pub faults: Faults,
    /// Always change the faulty organization's database outside the chain.
    #[arg(long)]
    pub tamper: bool,
    /// Every message crosses the wire encoding and is decoded before a core sees it.
    #[arg(long)]
    pub wire: bool,
    /// Run a deliberately weakened protocol, to see the checks catch it.
    #[arg(long, value_enum)]
    pub weaken: Option<WeakenArg>,
    /// Threads to run seeds on (default: every core).
    #[arg(long, value_parser = limits::count_between(1, 1024))]
    pub workers: Option<usize>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum WeakenArg {
    /// Commit servers commit their own effects without waiting for the vote.
    CommitWithoutQuorum,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    seeds: u64,
    first_seed: u64,
    failures: Vec<Failure>,
    ordered_blocks: u64,
    answered: u64,
    timed_out: u64,
    refused: u64,
    recoveries: u64,
    recovery_attempts: u64,
    seeds_with_liar: u64,
    seeds_with_tamper: u64,
    undetected_tampers: u64,
    crashes: u64,
    /// `--faults disk`: seeds whose media fault met a read or write, and orderer replicas
    /// whose log refused to open.
    media_faults_hit: u64,
    unopened: u64,
    wall_seconds: f64,
}

#[derive(Debug, serde::Serialize)]
struct Failure {
    seed: u64,
    problem: String,
    replay: String,
}

fn run_one(options: &SimOptions) -> Result<SimReport, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| run_seed(options))) {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(payload) => Err(payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .map_or_else(|| "a panic without a message".to_owned(), |message| format!("panicked: {message}"))),
    }
}

fn problem(report: &Result<SimReport, String>) -> Option<String> {
    match report {
        Ok(report) => report.violations.first().map(ToString::to_string),
        Err(error) => Some(error.clone()),
    }
}

pub(crate) fn run(args: &ChainifySimArgs) -> anyhow::Result<ExitCode> {
    let Some(last) = args.first_seed.checked_add(args.seeds) else {
        eprintln!("error: --first-seed {} plus --seeds {} overflows a u64", args.first_seed, args.seeds);
        return Ok(ExitCode::from(2));
    };
    let threads = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let weakening = args.weaken.map(|WeakenArg::CommitWithoutQuorum| Weakening::CommitWithoutQuorum);
    eprintln!(
        "running {} seed(s) of ChainifyDB's pipeline (3 organizations on SQLite, {} client(s) × {} proposals, {}{}) from {} on {threads} thread(s)",
        args.seeds,
        args.clients,
        args.transactions,
        match args.faults {
            Faults::None => "no faults",
            Faults::All => "every fault",
            Faults::Disk => "every fault and media faults",
        },
        weakening.map(|weakening| format!(", weakened: {}", weakening.name())).unwrap_or_default(),
        args.first_seed,
    );
    let options = |seed| SimOptions {
        clients: args.clients,
        transactions: args.transactions,
        faults: args.faults != Faults::None,
        media_faults: args.faults == Faults::Disk,
        force_tamper: args.tamper,
        weakening,
        wire: args.wire,
        ..SimOptions::new(seed)
    };
    let (outcomes, wall_seconds) = crate::sim::run_seeds(
        "chainify",
        (args.first_seed, last),
        threads,
        |seed| {
            let options = options(seed);
            let report = run_one(&options);
            (options, report)
        },
        problem,
        SimOptions::replay_command,
    );
    let summary = summarize(args, &outcomes, wall_seconds);
    println!(
        "chainify sim: {} of {} seed(s) passed in {:.1} s\n  ordered blocks {}, answered proposals {}, timed out {}, refused {}\n  \
         faults: {} seed(s) with a lying organization, {} with a tampered database ({} never touched again, so never detected), {} crashes\n  \
         media faults: {} seed(s) hit, {} replica(s) refused to open\n  \
         recoveries {} ({} rebuild attempts)",
        args.seeds - summary.failures.len() as u64,
        args.seeds,
        wall_seconds,
        summary.ordered_blocks,
        summary.answered,
        summary.timed_out,
        summary.refused,
        summary.seeds_with_liar,
        summary.seeds_with_tamper,
        summary.undetected_tampers,
        summary.crashes,
        summary.media_faults_hit,
        summary.unopened,
        summary.recoveries,
        summary.recovery_attempts,
    );
    for failure in summary.failures.iter().take(10) {
        println!("  seed {} FAILED: {}\n    replay: {}", failure.seed, failure.problem, failure.replay);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if summary.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The totals of the seeds' reports, with every failure and its replay command.
fn summarize(
    args: &ChainifySimArgs,
    outcomes: &[(u64, SimOptions, Result<SimReport, String>)],
    wall_seconds: f64,
) -> Summary {
    let mut summary = Summary {
        seeds: args.seeds,
        first_seed: args.first_seed,
        failures: Vec::new(),
        ordered_blocks: 0,
        answered: 0,
        timed_out: 0,
        refused: 0,
        recoveries: 0,
        recovery_attempts: 0,
        seeds_with_liar: 0,
        seeds_with_tamper: 0,
        undetected_tampers: 0,
        crashes: 0,
        media_faults_hit: 0,
        unopened: 0,
        wall_seconds,
    };
    for (seed, options, report) in outcomes {
        if let Some(problem) = problem(report) {
            summary.failures.push(Failure { seed: *seed, problem, replay: options.replay_command() });
        }
        let Ok(report) = report else {
            continue;
        };
        summary.ordered_blocks += report.ordered_blocks;
        summary.answered += report.answered;
        summary.timed_out += report.timed_out;
        summary.refused += report.refused;
        summary.recoveries += report.recoveries;
        summary.recovery_attempts += report.recovery_attempts;
        summary.seeds_with_liar += u64::from(report.faults.lies);
        summary.seeds_with_tamper += u64::from(report.faults.tamper.is_some());
        summary.undetected_tampers += u64::from(report.undetected_tamper);
        summary.crashes += report.faults.crashes.len() as u64;
        summary.media_faults_hit += u64::from(report.media_faults_fired > 0);
        summary.unopened += report.unopened.len() as u64;
    }
    summary
}
