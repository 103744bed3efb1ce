//! `virga bench kairos`: KAIROS's cache modes on the store in interleaved rounds
//! (`virga_bench::dkv::kairos`), or Fig. 4.8's sweep of cache sizes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use virga_bench::dkv::kairos::{
    by_load, compare_modes, hit_rate_by_cache_size, write_hit_rate, write_load, SEED_CACHE_FRACTION,
};
use virga_bench::dkv::{DkvBenchConfig, DkvNet, Placement};
use virga_bench::kv::ycsb_t::{YcsbT, YcsbTConfig};
use virga_core::clock::SkewProfile;
use virga_dkv::kairos::CacheMode;

use crate::dkv_bench::{DkvSync, DkvTransport};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KairosFigure {
    /// Fig. 4.8: the ideal lease's hit rate at cache sizes of 0.02% to 0.5% of the keys.
    HitRate,
    /// Fig. 4.11's shape: each of --modes at 2 to 32 clients (rising load): throughput and
    /// messages to and from the primaries per transaction.
    Load,
    /// Fig. 4.16's caching bar from the cost model: each of --modes (put none first) on this
    /// machine's shape and extrapolated to the seed's setting (5 shards x 3 replicas, 15
    /// clients, 4-thread machines, 500 µs latency).
    Scale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KairosPlacement {
    Shared,
    Split,
}

#[derive(Args)]
pub(crate) struct KairosBenchArgs {
    /// The cache modes to run, each once a round: none (no caching: MILANA with read-only
    /// transactions validated at the primaries), lease (the ideal lease model), naive
    /// (leases longer than the run), static:X (the lease with chance X of a write inside),
    /// ei (explicit invalidation: the primaries call the holders back on a write).
    #[arg(long, value_delimiter = ',', default_value = "none,lease,naive,static:0.1", value_parser = cache_mode)]
    pub modes: Vec<CacheMode>,
    #[arg(long, value_enum, default_value_t = DkvTransport::Inproc)]
    pub transport: DkvTransport,
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 64))]
    pub shards: usize,
    /// Replicas per shard: one primary and 2f backups (odd).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 9))]
    pub replicas: usize,
    #[arg(long, default_value_t = 8, value_parser = crate::limits::count_between(1, 1024))]
    pub clients: usize,
    /// Transactions each client runs at once.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_between(1, 256))]
    pub in_flight: usize,
    /// Measured seconds of each run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5.0, value_parser = crate::limits::positive)]
    pub duration: f64,
    /// Rounds; each runs every mode once.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 100))]
    pub runs: usize,
    /// Records loaded (ycsb-t: 4 keys a transaction, 90% read-only, Zipf 0.99 / 0.75).
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64_between(16, 100_000_000))]
    pub records: u64,
    #[arg(long, default_value_t = 100, value_parser = crate::limits::count_between(1, 1 << 20))]
    pub value_size: usize,
    /// The share of the keys each client caches (the hottest ones).
    #[arg(long, default_value_t = SEED_CACHE_FRACTION, value_parser = fraction)]
    pub cache_fraction: f64,
    /// Each client's clock is off by an offset drawn from this profile, which moves its
    /// lease checks too.
    #[arg(long, value_enum, default_value_t = SkewProfile::None)]
    pub skew: SkewProfile,
    #[arg(long, value_enum, default_value_t = DkvSync::Group)]
    pub sync: DkvSync,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Fig. 4.16's third bar: every mode also runs with this many sharded validators in the
    /// same rounds (standing alone, each a role of its own; with --figure scale, co-located
    /// with the clients, as the seed's). 0: none. Not with --figure hit-rate or load.
    #[arg(long, default_value_t = 0, value_parser = crate::limits::count_between(0, 16))]
    pub validators: usize,
    /// Where the roles run: shared (every role on both cores) or split (the servers on one
    /// core, the clients and validators on the other: the seed's servers saturating on
    /// machines of their own, scaled down).
    #[arg(long, value_enum, default_value_t = KairosPlacement::Shared)]
    pub placement: KairosPlacement,
    /// Reproduce one of the seed's figures instead of comparing --modes.
    #[arg(long, value_enum)]
    pub figure: Option<KairosFigure>,
    /// Where the JSON goes (the plots go beside it).
    #[arg(long)]
    pub json: PathBuf,
}

fn cache_mode(text: &str) -> Result<CacheMode, String> {
    CacheMode::from_name(text).map_err(|error| error.to_string())
}

fn fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value > 0.0 && value <= 1.0 => Ok(value),
        _ => Err("must be a number above 0 and at most 1".to_owned()),
    }
}

#[allow(clippy::too_many_lines)] // Predates the lint: a debt, to split.
pub(crate) fn run(args: &KairosBenchArgs) -> Result<ExitCode> {
    if args.replicas % 2 != 1 {
        anyhow::bail!("--replicas {} is even: a shard has one primary and 2f backups", args.replicas);
    }
    let workload =
        YcsbT::new(YcsbTConfig { records: args.records, value_size: args.value_size, ..Default::default() })?;
    let base = DkvBenchConfig {
        net: match args.transport {
            DkvTransport::Inproc => DkvNet::InProc,
            DkvTransport::Grpc => DkvNet::Grpc,
        },
        shards: args.shards as u32,
        replicas: args.replicas,
        in_flight: args.in_flight,
        window: args.in_flight.max(4),
        sync: args.sync == DkvSync::Group,
        skew: args.skew,
        placement: match args.placement {
            KairosPlacement::Shared => Placement::Shared,
            KairosPlacement::Split => Placement::Split,
        },
        ..DkvBenchConfig::new(args.clients, Duration::from_secs_f64(args.duration), args.seed)
    };
    let sweeps = matches!(args.figure, Some(KairosFigure::HitRate | KairosFigure::Load));
    if sweeps && args.validators > 0 {
        eprintln!("error: --validators goes with the mode comparison or --figure scale, not --figure hit-rate or load");
        return Ok(ExitCode::from(2));
    }
    if args.figure == Some(KairosFigure::HitRate) {
        eprintln!("virga bench kairos --figure hit-rate: {} rounds of {} s a cache size", args.runs, args.duration);
        let points = hit_rate_by_cache_size(&base, &workload, args.runs)?;
        for point in &points {
            println!(
                "cache {:>5.2}% ({:>4} keys): hit rate {:.3} of cached keys' reads, {:.3} of all reads, {:.0} committed/s",
                point.fraction * 100.0,
                point.keys_cached,
                point.hit_rate,
                point.hits_of_all_reads,
                point.committed_per_sec
            );
        }
        for written in write_hit_rate(&points, &workload, &args.json)? {
            eprintln!("wrote {}", written.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.figure == Some(KairosFigure::Scale) {
        eprintln!("virga bench kairos --figure scale: the cost model, calibrated on this machine");
        let scratch = tempfile::tempdir()?;
        let figure = virga_bench::dkv::kairos_scale::kairos_scale(
            &workload,
            &args.modes,
            args.validators,
            args.seed,
            scratch.path(),
        )?;
        for row in &figure.rows {
            println!(
                "{:<20} {:<13} {:<11} {:>2} validators {:>9.0} committed/s, x none {:.2}, aborts {:.1}%",
                row.shape,
                row.kind,
                row.mode,
                row.validators,
                row.committed_per_sec,
                row.speedup_over_none,
                row.abort_rate * 100.0
            );
        }
        for row in &figure.load {
            println!(
                "the seed's setting, {:>2} clients, {:<11} {:>9.0} committed/s, aborts {:.1}%",
                row.clients,
                row.mode,
                row.committed_per_sec,
                row.abort_rate * 100.0
            );
        }
        println!(
            "the seed: caching alone {:.2}x, with 5 sharded validators {:.2}x",
            figure.seed_caching_alone, figure.seed_caching_and_validators
        );
        std::fs::write(&args.json, serde_json::to_string_pretty(&figure)?)?;
        eprintln!("wrote {}", args.json.display());
        return Ok(ExitCode::SUCCESS);
    }
    if args.figure == Some(KairosFigure::Load) {
        eprintln!("virga bench kairos --figure load: {} rounds of {} s a point", args.runs, args.duration);
        let points = by_load(&base, &workload, &args.modes, args.cache_fraction, args.runs)?;
        for point in &points {
            println!(
                "{:>2} clients, {:<10} {:>8.0} committed/s, {:.2} messages a txn, hit rate {:.3}, {:.0} µs",
                point.clients,
                point.mode,
                point.committed_per_sec,
                point.server_messages_per_txn,
                point.hit_rate,
                point.mean_latency_us
            );
        }
        for written in write_load(&points, &workload, &args.json)? {
            eprintln!("wrote {}", written.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "virga bench kairos: {} on {} shards x {} replicas, {} clients, cache {:.2}% of {} keys, {} rounds of {} s, \
         {:?} placement",
        args.modes.iter().map(CacheMode::name).collect::<Vec<_>>().join(", "),
        args.shards,
        args.replicas,
        args.clients,
        args.cache_fraction * 100.0,
        args.records,
        args.runs,
        args.duration,
        args.placement
    );
    let comparison = compare_modes(&base, &workload, &args.modes, args.cache_fraction, args.validators, args.runs)?;
    println!(
        "{:<11} {:>10} {:>12} {:>13} {:>7} {:>7} {:>7} {:>9} {:>10} {:>8}",
        "mode", "validators", "committed/s", "runs", "hits", "fresh", "stale", "msgs/txn", "val. msgs", "x none"
    );
    for mode in &comparison.modes {
        println!(
            "{:<11} {:>10} {:>12.0} {:>13} {:>7.3} {:>7.3} {:>7.3} {:>9.2} {:>10.2} {:>8}",
            mode.mode,
            mode.validators,
            mode.committed_per_sec,
            format!("{:.0}–{:.0}", mode.committed_per_sec_spread.0, mode.committed_per_sec_spread.1),
            mode.hit_rate,
            mode.fresh_hit_rate,
            mode.stale_rate,
            mode.server_messages_per_txn,
            mode.validator_messages_per_txn,
            mode.speedup_over_none.map_or("-".to_string(), |speedup| format!("{speedup:.2}")),
        );
    }
    for written in comparison.write(&args.json)? {
        eprintln!("wrote {}", written.display());
    }
    Ok(ExitCode::SUCCESS)
}
