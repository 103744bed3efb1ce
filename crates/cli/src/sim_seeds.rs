//! `virga sim rainblock --seeds N`: RainBlock under the deterministic simulator, seed after
//! seed on every core, each failure printed with the command that replays it.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use virga_node::sim::{replay_command, run_seed, Broken, Faults, Length, RunOptions, RunOutcome};

use crate::limits;

#[derive(Args, Debug)]
pub(crate) struct SeedArgs {
    /// Seeds to run (full-length unless `--short`).
    #[arg(long, value_parser = limits::count_u64(1))]
    pub seeds: Option<u64>,
    /// The first seed; seeds run from here up.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Faults to inject: `all`, `none`, or a comma-separated list of `network`, `crashes`,
    /// `lying-storage`, `lying-miner`, `clocks`, `disk` (`all` is every one but `disk`:
    /// `all,disk` adds a media fault under the follower miner's chain store as it crashes; a
    /// follower whose store then refuses to open stays down).
    #[arg(long, default_value = "all", value_parser = parse_faults)]
    pub faults: String,
    /// Short seeds, as the default test suite runs them.
    #[arg(long)]
    pub short: bool,
    /// Run a deliberately broken variant (to see the checks catch it).
    #[arg(long, value_parser = parse_broken)]
    pub broken: Option<String>,
    /// Prints the roles' log at this level (`warn`, `info`, `debug`) while replaying a seed.
    #[arg(long)]
    pub log: Option<tracing::Level>,
    /// Threads running seeds (default: one per core).
    #[arg(long, value_parser = limits::count(1))]
    pub workers: Option<usize>,
}

fn parse_faults(text: &str) -> Result<String, virga_node::sim::UnknownFault> {
    Faults::parse(text).map(|_| text.to_string())
}

fn parse_broken(text: &str) -> Result<String, String> {
    broken_variant(text).map(|_| text.to_string())
}

fn broken_variant(text: &str) -> Result<Broken, String> {
    match text {
        "miner-skips-block-check" => Ok(Broken::MinerSkipsBlockCheck),
        "storage-acks-before-log" => Ok(Broken::StorageAcksBeforeLog),
        other => {
            Err(format!("unknown broken variant `{other}`: use miner-skips-block-check or storage-acks-before-log"))
        }
    }
}

#[derive(serde::Serialize)]
struct Failure {
    seed: u64,
    replay: String,
    problem: String,
}

#[derive(serde::Serialize)]
struct Timing {
    wall_seconds: f64,
    /// Events handled by the simulated cores per second of wall-clock time, over all threads.
    events_per_sec: f64,
    /// The event loop's own rate with cores that do nothing, on one core.
    null_core_events_per_sec: f64,
    threads: usize,
}

#[derive(serde::Serialize)]
struct Report {
    seeds: u64,
    first_seed: u64,
    faults: String,
    length: Length,
    failures: Vec<Failure>,
    events: u64,
    offered: u64,
    committed: u64,
    blocks: u64,
    crashes: u64,
    /// What the faults did, summed over the seeds.
    effects: virga_node::sim::run::Effects,
    /// Each seed's run (up to 1,000 seeds): events, virtual time and trace digest.
    runs: Option<Vec<RunOutcome>>,
    timing: Timing,
}

/// Runs the seeds; returns whether every one passed.
pub(crate) fn run(args: &SeedArgs, seeds: u64, json: Option<&PathBuf>) -> anyhow::Result<bool> {
    let faults = Faults::parse(&args.faults)?;
    let broken = args.broken.as_deref().map(broken_variant).transpose().map_err(anyhow::Error::msg)?;
    let length = if args.short { Length::Short } else { Length::Full };
    let last = args.first_seed.checked_add(seeds).context("--first-seed plus --seeds overflows")?;
    let threads = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "running {seeds} {} seed(s) from {} with faults `{}` on {threads} thread(s)",
        if args.short { "short" } else { "full-length" },
        args.first_seed,
        args.faults
    );
    if let Some(level) = args.log {
        let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level).try_init();
    }
    let started = Instant::now();
    let next = AtomicU64::new(args.first_seed);
    let outcomes = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= last {
                    break;
                }
                let outcome = run_seed(RunOptions { seed, faults, length, broken });
                for problem in &outcome.problems {
                    eprintln!(
                        "seed {seed} FAILED: {problem}\n  replay: {}",
                        replay_command(seed, &args.faults, length)
                    );
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if finished.is_multiple_of(100) {
                    eprintln!("{finished} of {seeds} seeds done");
                }
                outcomes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(outcome);
            });
        }
    });
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    outcomes.sort_by_key(|outcome| outcome.seed);
    let failures: Vec<Failure> = outcomes
        .iter()
        .flat_map(|outcome| {
            outcome.problems.iter().map(|problem| Failure {
                seed: outcome.seed,
                replay: replay_command(outcome.seed, &args.faults, length),
                problem: problem.clone(),
            })
        })
        .collect();
    let events: u64 = outcomes.iter().map(|outcome| outcome.events).sum();
    let null_core_events_per_sec = virga_sim::null_core_events_per_sec(8, 1_000_000);
    let report = Report {
        seeds,
        first_seed: args.first_seed,
        faults: args.faults.clone(),
        length,
        events,
        offered: outcomes.iter().map(|outcome| outcome.offered as u64).sum(),
        committed: outcomes.iter().map(|outcome| outcome.committed as u64).sum(),
        blocks: outcomes.iter().map(|outcome| outcome.blocks).sum(),
        crashes: outcomes.iter().map(|outcome| outcome.crashes as u64).sum(),
        effects: sum_effects(&outcomes),
        runs: (seeds <= 1000).then(|| outcomes.clone()),
        timing: Timing {
            wall_seconds,
            events_per_sec: events as f64 / wall_seconds.max(1e-9),
            null_core_events_per_sec,
            threads,
        },
        failures,
    };
    eprintln!(
        "{} seed(s), {} failure(s), {} events in {wall_seconds:.1} s ({:.0} events/s; null core {:.0} events/s)",
        seeds,
        report.failures.len(),
        events,
        report.timing.events_per_sec,
        null_core_events_per_sec
    );
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report.failures.is_empty())
}

fn sum_effects(outcomes: &[RunOutcome]) -> virga_node::sim::run::Effects {
    let mut sum = virga_node::sim::run::Effects::default();
    for outcome in outcomes {
        let e = &outcome.effects;
        sum.dropped += e.dropped;
        sum.duplicated += e.duplicated;
        sum.cut += e.cut;
        sum.lost_to_crash += e.lost_to_crash;
        sum.deadlines_exceeded += e.deadlines_exceeded;
        sum.crashes += e.crashes;
        sum.abandoned_blocks += e.abandoned_blocks;
        sum.refused_announcements += e.refused_announcements;
        sum.bad_witnesses += e.bad_witnesses;
    }
    sum
}
