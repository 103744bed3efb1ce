//! `virga sim config-service --seeds N`: the distributed store's configuration service
//! (virga-dkv's Raft replicas and a client) under the deterministic simulator, seed after seed
//! on every core, each failure reported with the command that replays it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use virga_dkv::sim::{run_service, ServiceRunOptions, ServiceRunReport};

use crate::limits;
use crate::sim_dkv::Faults;

#[derive(Args, Debug)]
pub(crate) struct ConfigServiceArgs {
    /// Seeds to run, each a full run under `--faults`.
    #[arg(long, value_parser = limits::count_u64_between(1, 10_000_000))]
    pub seeds: u64,
    /// The first seed; seeds run from here up.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Replicas of the service.
    #[arg(long, default_value_t = 3, value_parser = replica_count)]
    pub replicas: usize,
    /// `all`: message loss and duplication, partitions, crashes of replicas and power failures
    /// of all of them. `disk`: all of those, and one replica that crashes meets a media fault
    /// (a latent sector error while it is down, or writes that land before their offset just
    /// before it crashes); a replica whose storage then refuses to open stays down. `none`: a
    /// reliable network and no crash.
    #[arg(long, value_enum, default_value = "all")]
    pub faults: Faults,
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
    /// With `--faults disk`: a replica whose log refuses to open starts over on an empty one
    /// (as if its disk were replaced), forgetting what it voted and acknowledged.
    RejoinEmpty,
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
    media_fault: Option<String>,
    media_faults_fired: u64,
    unopened: Vec<String>,
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
    faults: &'static str,
    broken: Option<BrokenService>,
    failures: Vec<Failure>,
    /// `--faults disk`: seeds whose media fault met a read or write, and replicas whose
    /// storage refused to open.
    media_faults_hit: u64,
    unopened: u64,
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
        "running {} seed(s) of the configuration service ({} replicas, faults `{}`{}) from {} on {threads} thread(s)",
        args.seeds,
        args.replicas,
        args.faults.name(),
        match args.broken {
            Some(BrokenService::AckBeforeWrite) => ", broken: acknowledging before the write",
            Some(BrokenService::RejoinEmpty) => ", broken: a damaged replica rejoining empty",
            None => "",
        },
        args.first_seed
    );
    let run_seed = |seed| {
        let options = ServiceRunOptions {
            replicas: args.replicas,
            faults: args.faults != Faults::None,
            media_faults: args.faults == Faults::Disk,
            unsafe_ack_before_write: args.broken == Some(BrokenService::AckBeforeWrite),
            unsafe_rejoin_empty: args.broken == Some(BrokenService::RejoinEmpty),
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
        "{} seed(s), {} failure(s); {} elections, {} crashes, {} power failures, {} partitions; \
         media faults: {} seed(s) hit, {} replica(s) refused to open; {} events; \
         {wall_seconds:.1} s ({:.3} s per seed on {threads} thread(s))",
        report.seeds,
        report.failures.len(),
        report.elections,
        report.crashes,
        report.power_failures,
        report.partitions,
        report.media_faults_hit,
        report.unopened,
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
            media_fault: report.media_fault.clone(),
            media_faults_fired: report.media_faults_fired,
            unopened: report.unopened.clone(),
            virtual_ms: report.virtual_ms,
            events: report.events,
            trace_digest: report.trace_digest,
        })
        .collect();
    Report {
        seeds: args.seeds,
        first_seed: args.first_seed,
        replicas: args.replicas,
        faults: args.faults.name(),
        broken: args.broken,
        failures,
        media_faults_hit: total(|report| u64::from(report.media_faults_fired > 0)),
        unopened: total(|report| report.unopened.len() as u64),
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
