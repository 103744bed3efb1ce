//! `virga sim dkv --seeds N`: the whole distributed store (virga-dkv's configuration service,
//! sharded replicated data nodes and clients moving money) under the deterministic simulator,
//! seed after seed on every core, each failure reported with the command that replays it.
//! `--lease-scenario` runs the scripted failover anomaly instead, without and with leases.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use virga_core::clock::SkewProfile;
use virga_dkv::client::ClientClock;
use virga_dkv::kairos::CacheMode;
use virga_dkv::sim::txn::lease_scenario::{lease_scenario, LeaseScenario};
use virga_dkv::sim::txn::{run_txn, TxnRunOptions, TxnRunReport, Weakening};
use virga_txn::Timestamp;

use crate::limits;

/// Options of a seed run, refused by clap (exit 2) when out of range. `--lease-scenario`
/// replaces the seeds, so it takes none of their options.
#[derive(Args, Debug)]
pub(crate) struct DkvArgs {
    /// Seeds to run, each a full run: 3 shards of 3 replicas, 3 clients, 60 programs each
    /// (the last client's run as interactive sessions, see --session-clients).
    #[arg(long, value_parser = limits::count_u64_between(1, 10_000_000), required_unless_present = "lease_scenario")]
    pub seeds: Option<u64>,
    /// The first seed; seeds run from here up.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// `all`: message loss, duplication and reordering, partitions, and crashes of backups,
    /// primaries (which fail over) and clients (whose transactions the primaries terminate).
    /// `disk`: all of those, and one data node that crashes meets a media fault (a latent
    /// sector error, or writes lost or misdirected just before it crashes); a node whose
    /// storage then refuses to open stays down. `none`: a reliable network and no crash.
    #[arg(long, value_enum, default_value_t = Faults::All)]
    pub faults: Faults,
    /// Run a deliberately weakened variant, to see the checks catch it: skip-latest-read,
    /// skip-local-validation, terminate-ignoring-missing-prepare or
    /// skip-cached-latest-committed (with --cache), validator-skip-freshness or
    /// validator-skip-cached-latest-committed (with --validators), skip-resync (with --faults
    /// disk), settle-early (with a short --snapshot-window).
    #[arg(long, value_parser = weakening)]
    pub weaken: Option<Weakening>,
    /// The clients' timestamps: their physical clocks, or hybrid logical clocks.
    #[arg(long, value_enum, default_value_t = Clock::Physical)]
    pub clock: Clock,
    /// Where read-only transactions validate: at the client (MILANA), at the primaries by
    /// two-phase commit (remote), or at the primaries in one round, nothing logged (validate).
    #[arg(long, value_enum, default_value_t = crate::dkv_bench::DkvValidation::Local)]
    pub validation: crate::dkv_bench::DkvValidation,
    /// KAIROS: the clients cache the hottest third of the accounts across transactions under
    /// soft leases: `none`, `lease` (the ideal lease model), `naive` (leases longer than the
    /// run), `static:X` (the lease with chance X of a write inside it) or `ei` (explicit
    /// invalidation: the primaries call the holders back on a write).
    #[arg(long, default_value = "none", value_parser = cache_mode)]
    pub cache: CacheMode,
    /// KAIROS: this many sharded validators judge the transactions (Algorithm 5), with the
    /// primaries taking over read-only validation while one is down; with --faults all one
    /// of them may crash and restart. 0: validation at the primaries.
    #[arg(long, value_parser = limits::count_between(0, 8), default_value_t = 0)]
    pub validators: usize,
    /// Seconds behind the newest commit for which versions stay readable: an older snapshot
    /// is refused as snapshot-too-old (0 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = limits::snapshot_window)]
    pub snapshot_window: std::time::Duration,
    /// Clock skew of the nodes: PTP-like, NTP-like or none.
    #[arg(long, value_enum, default_value_t = SkewProfile::Ntp)]
    pub skew: SkewProfile,
    /// UNSAFE: primaries serve reads without leases from their backups, so a failover can
    /// commit a write below a read the old primary served (the anomaly --lease-scenario shows).
    #[arg(long)]
    pub no_leases: bool,
    /// How many of the 3 clients (the last ones) run their work as interactive sessions
    /// (begin, get, put, commit, one operation at a time) instead of programs.
    #[arg(long, value_parser = limits::count_between(0, 3), default_value_t = 1)]
    pub session_clients: usize,
    /// Threads running seeds (default: one per core).
    #[arg(long, value_parser = limits::count_between(1, 1_024))]
    pub workers: Option<usize>,
    /// Write the seeds, the failures (each with its replay command), the totals and the
    /// timing as JSON (with --lease-scenario: what each run of the scenario saw).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Instead of seeds, run the scripted failover anomaly without leases and with them, and
    /// print what each saw; exit 0 only if it appears without leases and not with them.
    #[arg(
        long,
        conflicts_with_all = [
            "seeds", "first_seed", "faults", "weaken", "clock", "skew", "no_leases", "session_clients", "workers",
            "cache", "validators"
        ]
    )]
    pub lease_scenario: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Faults {
    All,
    Disk,
    None,
}

impl Faults {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Faults::All => "all",
            Faults::Disk => "disk",
            Faults::None => "none",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Clock {
    Physical,
    Hybrid,
}

impl Clock {
    fn name(self) -> &'static str {
        match self {
            Clock::Physical => "physical",
            Clock::Hybrid => "hybrid",
        }
    }
}

fn cache_mode(text: &str) -> Result<CacheMode, String> {
    CacheMode::from_name(text).map_err(|error| error.to_string())
}

fn weakening(text: &str) -> Result<Weakening, String> {
    Weakening::from_name(text).map_err(|error| error.to_string())
}

#[derive(serde::Serialize)]
struct Failure {
    seed: u64,
    replay: String,
    violations: Vec<String>,
}

/// One seed's run.
#[derive(serde::Serialize)]
struct Run {
    seed: u64,
    passed: bool,
    programs: usize,
    committed: u64,
    committed_read_only: u64,
    aborted_attempts: u64,
    gave_up: usize,
    crashes: usize,
    client_crashes: usize,
    primary_crashes: usize,
    failovers: u64,
    terminations: u64,
    committed_by_termination: usize,
    versions_collected: u64,
    too_old: u64,
    entries_settled: u64,
    partitions: usize,
    session_committed: u64,
    session_gave_up: u64,
    session_unavailable: u64,
    session_stale_map: u64,
    session_outcome_unknown: u64,
    session_aborted_attempts: u64,
    /// `--faults disk`: the media fault planted, how often it fired, and the data nodes
    /// whose storage then refused to open.
    media_fault: Option<String>,
    media_faults_fired: u64,
    unopened: Vec<String>,
    virtual_ms: u64,
    events: u64,
    trace_digest: u64,
}

/// Sums over the seeds that ran.
#[derive(serde::Serialize, Default)]
struct Totals {
    programs: u64,
    committed: u64,
    committed_read_only: u64,
    aborted_attempts: u64,
    gave_up: u64,
    /// Every crash; backups' are the crashes neither of a client nor of a primary.
    crashes: u64,
    backup_crashes: u64,
    client_crashes: u64,
    primary_crashes: u64,
    failovers: u64,
    terminations: u64,
    committed_by_termination: u64,
    versions_collected: u64,
    too_old: u64,
    entries_settled: u64,
    partitions: u64,
    /// The session clients' work: committed, given up after every attempt aborted, ended
    /// unavailable, by a stale map or with its commit's outcome unknown; aborted attempts.
    session_committed: u64,
    session_gave_up: u64,
    session_unavailable: u64,
    session_stale_map: u64,
    session_outcome_unknown: u64,
    session_aborted_attempts: u64,
    /// KAIROS: reads of cached keys, those the cache served, and hits found stale.
    cache_reads: u64,
    cache_hits: u64,
    stale_hits: u64,
    /// KAIROS's validators: crashes, validations judged, held transactions decided from the
    /// primaries' answers, read-only validations the primaries took over, and read-write
    /// transactions they validated in a validator's place.
    validator_crashes: u64,
    validator_votes: u64,
    validator_terminations: u64,
    validator_fallbacks: u64,
    validator_takeovers: u64,
    /// `--faults disk`: seeds whose media fault hit a read or a write, and data nodes whose
    /// storage then refused to open.
    media_faults_fired: u64,
    unopened_nodes: u64,
    events: u64,
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
    faults: &'static str,
    weaken: Option<&'static str>,
    clock: &'static str,
    skew: &'static str,
    leases: bool,
    session_clients: usize,
    cache: String,
    validators: usize,
    failures: Vec<Failure>,
    totals: Totals,
    /// Each seed's run (up to 1,000 seeds).
    runs: Option<Vec<Run>>,
    timing: Timing,
}

/// What one seed came to: its report, or why it did not run to its end.
type Outcome = (TxnRunOptions, Result<TxnRunReport, String>);

pub(crate) fn run(args: &DkvArgs) -> anyhow::Result<ExitCode> {
    let Some(seeds) = args.seeds.filter(|_| !args.lease_scenario) else {
        return run_lease_scenario(args.json.as_deref());
    };
    let Some(last) = args.first_seed.checked_add(seeds) else {
        eprintln!("error: --first-seed {} plus --seeds {seeds} overflows a u64", args.first_seed);
        return Ok(ExitCode::from(2));
    };
    let threads = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let weakening = args.weaken.unwrap_or_default();
    eprintln!(
        "running {seeds} seed(s) of the distributed store (faults {}, skew {}, {} clocks, {} session client(s), \
         cache {}, {} validator(s){}{}) from {} on {threads} thread(s)",
        args.faults.name(),
        args.skew.name(),
        args.clock.name(),
        args.session_clients,
        args.cache.name(),
        args.validators,
        if args.no_leases { ", NO LEASES" } else { "" },
        weakening.name().map(|name| format!(", weakened: {name}")).unwrap_or_default(),
        args.first_seed
    );
    let run_one = |seed| {
        let options = seed_options(args, seed);
        let report = run_seed(&options);
        (options, report)
    };
    let (outcomes, wall_seconds) = crate::sim::run_seeds(
        "dkv",
        (args.first_seed, last),
        threads,
        run_one,
        |report| problems(report).into_iter().next(),
        TxnRunOptions::replay_command,
    );
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|(_, options, report)| (options, report)).collect();
    let report = summarize(args, seeds, &outcomes, wall_seconds, threads);
    print_summary(&report);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn seed_options(args: &DkvArgs, seed: u64) -> TxnRunOptions {
    let faults = args.faults != Faults::None;
    TxnRunOptions {
        faults,
        media_faults: args.faults == Faults::Disk,
        client_crashes: faults,
        primary_crashes: faults,
        weakening: args.weaken.unwrap_or_default(),
        client_clock: match args.clock {
            Clock::Physical => ClientClock::Physical,
            Clock::Hybrid => ClientClock::Hybrid,
        },
        clock: args.skew,
        read_only_validation: args.validation.into(),
        leases: !args.no_leases,
        session_clients: args.session_clients,
        cache: args.cache,
        validators: args.validators,
        snapshot_window: args.snapshot_window,
        ..TxnRunOptions::new(seed)
    }
}

/// Runs one seed. A panic in the simulated cores is a bug the seed found: it becomes the
/// seed's failure (with its replay command) instead of ending the whole soak.
fn run_seed(options: &TxnRunOptions) -> Result<TxnRunReport, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| run_txn(options))) {
        Ok(Ok(report)) => Ok(report),
        Ok(Err(error)) => Err(format!("the simulation did not start: {error}")),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Err(format!("the simulation panicked: {message}"))
        }
    }
}

/// A seed's violations, or why it did not run to its end.
fn problems(report: &Result<TxnRunReport, String>) -> Vec<String> {
    match report {
        Ok(report) => report.violations.clone(),
        Err(problem) => vec![problem.clone()],
    }
}

fn summarize(args: &DkvArgs, seeds: u64, outcomes: &[Outcome], wall_seconds: f64, threads: usize) -> Report {
    let failures = outcomes
        .iter()
        .filter_map(|(options, report)| {
            let violations = problems(report);
            (!violations.is_empty()).then(|| Failure {
                seed: options.seed,
                replay: options.replay_command(),
                violations,
            })
        })
        .collect();
    let reports: Vec<&TxnRunReport> = outcomes.iter().filter_map(|(_, report)| report.as_ref().ok()).collect();
    let runs = (seeds <= 1_000).then(|| reports.iter().map(|report| run_of(report)).collect());
    Report {
        seeds,
        first_seed: args.first_seed,
        faults: args.faults.name(),
        weaken: args.weaken.and_then(|weakening| weakening.name()),
        clock: args.clock.name(),
        skew: args.skew.name(),
        leases: !args.no_leases,
        session_clients: args.session_clients,
        cache: args.cache.name(),
        validators: args.validators,
        failures,
        totals: totals(&reports),
        runs,
        timing: Timing {
            wall_seconds,
            seconds_per_seed: wall_seconds * (threads as u64).min(seeds) as f64 / seeds as f64,
            threads,
        },
    }
}

fn run_of(report: &TxnRunReport) -> Run {
    Run {
        seed: report.seed,
        passed: report.passed(),
        programs: report.programs,
        committed: report.committed,
        committed_read_only: report.committed_read_only,
        aborted_attempts: report.aborted_attempts,
        gave_up: report.gave_up,
        crashes: report.crashes,
        client_crashes: report.client_crashes,
        primary_crashes: report.primary_crashes,
        failovers: report.failovers,
        terminations: report.terminations,
        committed_by_termination: report.committed_by_termination,
        versions_collected: report.versions_collected,
        too_old: report.too_old,
        entries_settled: report.entries_settled,
        partitions: report.partitions,
        session_committed: report.session_committed,
        session_gave_up: report.session_gave_up,
        session_unavailable: report.session_unavailable,
        session_stale_map: report.session_stale_map,
        session_outcome_unknown: report.session_outcome_unknown,
        session_aborted_attempts: report.session_aborted_attempts,
        media_fault: report.media_fault.clone(),
        media_faults_fired: report.media_faults_fired,
        unopened: report.unopened.clone(),
        virtual_ms: report.virtual_ms,
        events: report.events,
        trace_digest: report.trace_digest,
    }
}

fn totals(reports: &[&TxnRunReport]) -> Totals {
    let mut totals = Totals::default();
    for report in reports {
        totals.programs += report.programs as u64;
        totals.committed += report.committed;
        totals.committed_read_only += report.committed_read_only;
        totals.aborted_attempts += report.aborted_attempts;
        totals.gave_up += report.gave_up as u64;
        totals.crashes += report.crashes as u64;
        totals.media_faults_fired += u64::from(report.media_faults_fired > 0);
        totals.unopened_nodes += report.unopened.len() as u64;
        totals.backup_crashes +=
            (report.crashes - report.client_crashes - report.primary_crashes - report.validator_crashes) as u64;
        totals.validator_crashes += report.validator_crashes as u64;
        totals.validator_votes += report.validator_votes;
        totals.validator_terminations += report.validator_terminations;
        totals.validator_fallbacks += report.validator_fallbacks;
        totals.validator_takeovers += report.validator_takeovers;
        totals.client_crashes += report.client_crashes as u64;
        totals.primary_crashes += report.primary_crashes as u64;
        totals.failovers += report.failovers;
        totals.terminations += report.terminations;
        totals.committed_by_termination += report.committed_by_termination as u64;
        totals.versions_collected += report.versions_collected;
        totals.too_old += report.too_old;
        totals.entries_settled += report.entries_settled;
        totals.partitions += report.partitions as u64;
        totals.session_committed += report.session_committed;
        totals.session_gave_up += report.session_gave_up;
        totals.session_unavailable += report.session_unavailable;
        totals.session_stale_map += report.session_stale_map;
        totals.session_outcome_unknown += report.session_outcome_unknown;
        totals.session_aborted_attempts += report.session_aborted_attempts;
        totals.cache_reads += report.cache_reads;
        totals.cache_hits += report.cache_hits;
        totals.stale_hits += report.stale_hits;
        totals.events += report.events;
    }
    totals
}

fn print_summary(report: &Report) {
    let totals = &report.totals;
    eprintln!(
        "{} seed(s), {} failure(s); {} committed ({} read-only), {} aborted attempts, {} programs gave up; \
         crashes: {} backup, {} client, {} primary; {} failovers, {} terminations; {} versions collected, {} entries settled; \
         sessions: {} committed, {} gave up, {} unavailable, {} stale map, {} outcome unknown; \
         cache: {} reads, {} hits, {} stale; validators: {} crashes, {} votes, {} terminations, \
         {} read-only and {} read-write taken over; media faults: {} seed(s) hit, {} node(s) refused to open; \
         {} events; {:.1} s ({:.3} s per seed on {} thread(s))",
        report.seeds,
        report.failures.len(),
        totals.committed,
        totals.committed_read_only,
        totals.aborted_attempts,
        totals.gave_up,
        totals.backup_crashes,
        totals.client_crashes,
        totals.primary_crashes,
        totals.failovers,
        totals.terminations,
        totals.versions_collected,
        totals.entries_settled,
        totals.session_committed,
        totals.session_gave_up,
        totals.session_unavailable,
        totals.session_stale_map,
        totals.session_outcome_unknown,
        totals.cache_reads,
        totals.cache_hits,
        totals.stale_hits,
        totals.validator_crashes,
        totals.validator_votes,
        totals.validator_terminations,
        totals.validator_fallbacks,
        totals.validator_takeovers,
        totals.media_faults_fired,
        totals.unopened_nodes,
        totals.events,
        report.timing.wall_seconds,
        report.timing.seconds_per_seed,
        report.timing.threads,
    );
}

/// What one run of the lease scenario saw, as JSON.
#[derive(serde::Serialize)]
struct ScenarioRun {
    leases: bool,
    /// The first read's timestamp t2 and the value it returned (null: the key was absent).
    first_read_at: Option<At>,
    first_read_value: Option<String>,
    /// The late write's commit timestamp t1, if it committed.
    write_committed_at: Option<At>,
    /// Whether the second read (at t2 again, after the failover and the write) ran, and its value.
    second_read_ran: bool,
    second_read_value: Option<String>,
    failovers: u64,
    anomaly: bool,
    /// Whether the run showed what it must: the anomaly without leases, and with them a
    /// second read that returned what the first did.
    as_expected: bool,
}

/// A version timestamp `<time, client>`.
#[derive(serde::Serialize, Clone, Copy)]
struct At {
    time: u64,
    client: u32,
}

impl From<Timestamp> for At {
    fn from(at: Timestamp) -> At {
        At { time: at.time, client: at.client }
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Timestamp::new(self.time, self.client).fmt(f)
    }
}

fn run_lease_scenario(json: Option<&Path>) -> anyhow::Result<ExitCode> {
    eprintln!(
        "the failover anomaly, scripted: a read at t2 returns t0's value, the primary crashes, a writer 2.2 s \
         behind commits at t1 (t0 < t1 <= t2) after the failover, and the same read at t2 runs again"
    );
    let mut runs = Vec::new();
    for leases in [false, true] {
        let seen =
            lease_scenario(leases).with_context(|| format!("the lease scenario (leases {leases}) did not start"))?;
        let run = scenario_run(leases, &seen);
        println!(
            "{:<15} first read at t2 = {} returned {}; the write {}; the second read at t2 {}; {} failover(s): {}",
            if leases { "with leases:" } else { "without leases:" },
            run.first_read_at.map_or_else(|| "-".to_owned(), |at| at.to_string()),
            shown(run.first_read_value.as_deref()),
            match (&run.write_committed_at, &run.first_read_at) {
                (Some(t1), Some(t2)) if (t1.time, t1.client) < (t2.time, t2.client) => {
                    format!("committed at t1 = {t1}, below t2")
                }
                (Some(t1), _) => format!("committed at t1 = {t1}"),
                (None, _) => "did not commit".to_owned(),
            },
            if run.second_read_ran {
                format!("returned {}", shown(run.second_read_value.as_deref()))
            } else {
                "did not run".to_owned()
            },
            run.failovers,
            match (run.anomaly, run.as_expected) {
                (true, true) => "the anomaly, as expected without leases",
                (false, true) => "no anomaly",
                (true, false) => "THE ANOMALY, WITH LEASES",
                (false, false) if leases => "NO SECOND READ",
                (false, false) => "NO ANOMALY WITHOUT LEASES (the scenario no longer shows it)",
            }
        );
        runs.push(run);
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&runs)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if runs.iter().all(|run| run.as_expected) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn scenario_run(leases: bool, seen: &LeaseScenario) -> ScenarioRun {
    let text = |value: &bytes::Bytes| String::from_utf8_lossy(value).into_owned();
    let anomaly = seen.anomaly();
    let second_read_ran = seen.second_read.is_some();
    ScenarioRun {
        leases,
        first_read_at: seen.first_read.as_ref().map(|(at, _)| At::from(*at)),
        first_read_value: seen.first_read.as_ref().and_then(|(_, value)| value.as_ref().map(text)),
        write_committed_at: seen.write_committed_at.map(At::from),
        second_read_ran,
        second_read_value: seen.second_read.as_ref().and_then(|value| value.as_ref().map(text)),
        failovers: seen.failovers,
        anomaly,
        as_expected: if leases { !anomaly && second_read_ran && seen.first_read.is_some() } else { anomaly },
    }
}

fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "nothing (absent)".to_owned(), |value| format!("{value:?}"))
}
