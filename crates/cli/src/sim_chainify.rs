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
    /// A reliable network and no crash, lie or tampering.
    #[arg(long)]
    pub no_faults: bool,
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
        if args.no_faults { "no faults" } else { "every fault" },
        weakening.map(|weakening| format!(", weakened: {}", weakening.name())).unwrap_or_default(),
        args.first_seed,
    );
    let options = |seed| SimOptions {
        clients: args.clients,
        transactions: args.transactions,
        faults: !args.no_faults,
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
        wall_seconds,
    };
    for (seed, options, report) in &outcomes {
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
    }
    println!(
        "chainify sim: {} of {} seed(s) passed in {:.1} s\n  ordered blocks {}, answered proposals {}, timed out {}, refused {}\n  \
         faults: {} seed(s) with a lying organization, {} with a tampered database ({} never touched again, so never detected), {} crashes\n  \
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
