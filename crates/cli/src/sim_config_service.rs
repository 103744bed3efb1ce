//! `virga sim config-service --seeds N`: the distributed store's configuration service
//! (virga-dkv's Raft replicas and a client) under the deterministic simulator, seed after seed
//! on every core, each failure reported with the command that replays it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use virga_dkv::sim::{run_service, ServiceRunOptions, ServiceRunReport};

use crate::limits;

#[derive(Args, Debug)]
pub(crate) struct ConfigServiceArgs {
    /// Seeds to run, each a full run with faults (loss, duplication, partitions, crashes and
    /// power failures).
    #[arg(long, value_parser = limits::count_u64_between(1, 10_000_000))]
    pub seeds: u64,
    /// The first seed; seeds run from here up.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Replicas of the service.
    #[arg(long, default_value_t = 3, value_parser = replica_count)]
    pub replicas: usize,
    /// Run a deliberately broken variant (to see the checks catch it).
    #[arg(long, value_enum)]
    pub broken: Option<BrokenService>,
    /// Threads running seeds (default: one per core).
    #[arg(long, value_parser = limits::count_between(1, 1_024))]
    pub workers: Option<usize>,
    /// Write the seeds, the failures (each with its replay command) and the totals as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BrokenService {
    /// Replicas acknowledge votes and appends before their log write is durable.
    AckBeforeWrite,
}

/// The service runs 3 or 5 replicas (a majority survives one or two failures).
fn replica_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(replicas @ (3 | 5)) => Ok(replicas),
        _ => Err("the configuration service runs 3 or 5 replicas".to_owned()),
    }
}

#[derive(serde::Serialize)]
struct Failure {
    seed: u64,
    replay: String,
    problem: String,
}

/// One seed's run.
#[derive(serde::Serialize)]
struct Run {
    seed: u64,
    passed: bool,
    answered: usize,
    commands: usize,
    elections: usize,
    crashes: usize,
    power_failures: usize,
    partitions: usize,
    applied_index: u64,
    virtual_ms: u64,
    events: u64,
    trace_digest: u64,
}

#[derive(serde::Serialize)]
struct Timing {
    wall_seconds: f64,
    /// Wall-clock seconds per seed on one thread (wall time × busy threads / seeds).
    seconds_per_seed: f64,
    threads: usize,
}

#[derive(serde::Serialize)]
struct Report {
    seeds: u64,
    first_seed: u64,
    replicas: usize,
    broken: Option<BrokenService>,
    failures: Vec<Failure>,
    elections: u64,
    crashes: u64,
    power_failures: u64,
    partitions: u64,
    events: u64,
    /// Each seed's run (up to 1,000 seeds).
    runs: Option<Vec<Run>>,
    timing: Timing,
}

/// What one seed came to: its report, or why the simulation could not start.
type Outcome = (ServiceRunOptions, Result<ServiceRunReport, String>);

pub(crate) fn run(args: &ConfigServiceArgs) -> anyhow::Result<ExitCode> {
    let last = args.first_seed.checked_add(args.seeds).context("--first-seed plus --seeds overflows a u64")?;
    let threads = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "running {} seed(s) of the configuration service ({} replicas{}) from {} on {threads} thread(s)",
        args.seeds,
        args.replicas,
        if args.broken.is_some() { ", broken: acknowledging before the write" } else { "" },
        args.first_seed
    );
    let run_seed = |seed| {
        let options = ServiceRunOptions {
            replicas: args.replicas,
            unsafe_ack_before_write: args.broken == Some(BrokenService::AckBeforeWrite),
            ..ServiceRunOptions::new(seed)
        };
        let report = run_service(&options).map_err(|error| format!("the simulation did not start: {error}"));
        (options, report)
    };
    let (outcomes, wall_seconds) = crate::sim::run_seeds(
        "config-service",
        (args.first_seed, last),
        threads,
        run_seed,
        |report| problems(report).into_iter().next(),
        ServiceRunOptions::replay_command,
    );
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|(_, options, report)| (options, report)).collect();
    let report = summarize(args, &outcomes, wall_seconds, threads);
    eprintln!(
        "{} seed(s), {} failure(s); {} elections, {} crashes, {} power failures, {} partitions; {} events; \
         {wall_seconds:.1} s ({:.3} s per seed on {threads} thread(s))",
        report.seeds,
        report.failures.len(),
        report.elections,
        report.crashes,
        report.power_failures,
        report.partitions,
        report.events,
        report.timing.seconds_per_seed,
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// A seed's violations, or why it did not run.
fn problems(report: &Result<ServiceRunReport, String>) -> Vec<String> {
    match report {
        Ok(report) => report.violations.clone(),
        Err(problem) => vec![problem.clone()],
    }
}

fn summarize(args: &ConfigServiceArgs, outcomes: &[Outcome], wall_seconds: f64, threads: usize) -> Report {
    let failures = outcomes
        .iter()
        .flat_map(|(options, report)| {
            problems(report).into_iter().map(|problem| Failure {
                seed: options.seed,
                replay: options.replay_command(),
                problem,
            })
        })
        .collect();
    let reports: Vec<&ServiceRunReport> = outcomes.iter().filter_map(|(_, report)| report.as_ref().ok()).collect();
    let total = |count: fn(&ServiceRunReport) -> u64| reports.iter().map(|report| count(report)).sum::<u64>();
    let runs = reports
        .iter()
        .map(|report| Run {
            seed: report.seed,
            passed: report.passed(),
            answered: report.answered,
            commands: report.commands,
            elections: report.elections,
            crashes: report.crashes,
            power_failures: report.power_failures,
            partitions: report.partitions,
            applied_index: report.applied_index,
            virtual_ms: report.virtual_ms,
            events: report.events,
            trace_digest: report.trace_digest,
        })
        .collect();
    Report {
        seeds: args.seeds,
        first_seed: args.first_seed,
        replicas: args.replicas,
        broken: args.broken,
        failures,
        elections: total(|report| report.elections as u64),
        crashes: total(|report| report.crashes as u64),
        power_failures: total(|report| report.power_failures as u64),
        partitions: total(|report| report.partitions as u64),
        events: total(|report| report.events),
        runs: (args.seeds <= 1_000).then_some(runs),
        timing: Timing {
            wall_seconds,
            seconds_per_seed: wall_seconds * (threads as u64).min(args.seeds) as f64 / args.seeds as f64,
            threads,
        },
    }
}
