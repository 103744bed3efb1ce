//! `virga sim rainblock`: RainBlock's cost model. `--predict` calibrates on this machine (or
//! loads a frozen calibration) and predicts a shape's throughput and commit latency;
//! `--validate` sets predictions beside real embedded clusters; `--seed-setups` predicts the
//! seed's own deployments beside the figures it reported. `virga sim config-service` is in
//! `sim_config_service.rs`, `virga sim dkv` in `sim_dkv.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use virga_node::cost::calibrate::{calibrate, Calibration, CalibrationSetup};
use virga_node::cost::model::{predict, Link, Links, Prediction, Shape};
use virga_node::cost::validate::{validate, RunShape, ValidationRow};

#[derive(Subcommand)]
pub(crate) enum SimCommand {
    /// RainBlock's roles: `--seeds N` runs N seeds under faults in the simulator and checks
    /// each (a failure prints the command that replays it); otherwise the cost model's
    /// predictions (`--predict`), checked against real clusters (`--validate`), and the seed's
    /// deployments (`--seed-setups`).
    Rainblock(Box<RainblockSimArgs>),
    /// The distributed store's configuration service (Raft replicas and a client): `--seeds N`
    /// runs N seeds under loss, partitions, crashes and power failures and checks each
    /// (elections, state-machine safety, durability, every command answered); a failure
    /// prints the command that replays it.
    ConfigService(crate::sim_config_service::ConfigServiceArgs),
    /// The whole distributed store (configuration service, 3 shards of 3 replicas, clients
    /// moving money): `--seeds N` runs N seeds under loss, partitions, skew and crashes of
    /// backups, primaries and clients and checks each (serializability across shards, money
    /// conserved, nothing acknowledged lost); a failure prints the command that replays it.
    /// `--lease-scenario` runs the scripted failover anomaly without and with leases.
    Dkv(crate::sim_dkv::DkvArgs),
    /// ChainifyDB's pipeline (three organizations on in-memory SQLite, an orderer, clients):
    /// `--seeds N` runs N seeds under lost and duplicated messages, a lagging organization,
    /// crashed servers, and an organization that lies about its effects or whose database is
    /// changed outside the chain, each checked against a serial replay of the orderer's
    /// blocks; a failure prints the command that replays it.
    Chainify(crate::sim_chainify::ChainifySimArgs),
}

#[derive(Args)]
pub(crate) struct RainblockSimArgs {
    #[command(flatten)]
    pub seeds: crate::sim_seeds::SeedArgs,
    #[command(flatten)]
    pub predict: PredictArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SimTransport {
    /// One process, in-process calls.
    Inproc,
    /// gRPC on loopback.
    Grpc,
    /// gRPC over a network with the given latency and bandwidth.
    Network,
}

#[derive(Args)]
pub(crate) struct PredictArgs {
    /// Predict the shape given by the options below (the default when no mode is given).
    #[arg(long)]
    pub predict: bool,
    /// Run real embedded clusters of a few shapes (child processes of this binary, pinned
    /// with taskset) and set each beside its prediction. Takes minutes.
    #[arg(long)]
    pub validate: bool,
    /// Predict the seed's own deployments (21 machines of 48 threads; four regions) and print
    /// them beside the seed's figures.
    #[arg(long)]
    pub seed_setups: bool,
    /// A frozen calibration to use (JSON written by --save-calibration); default: calibrate now.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Write the calibration used to this file.
    #[arg(long)]
    pub save_calibration: Option<PathBuf>,
    /// Machines of the predicted cluster: 1 puts every role on one machine; at least one per
    /// role gives each its own.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_between(1, 100_000))]
    pub machines: usize,
    /// Hardware threads per machine (default: this machine's).
    #[arg(long, value_parser = crate::limits::count_between(1, 4_096))]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count_between(1, 10_000))]
    pub clients: usize,
    /// Miners: the first builds, the others verify each block before it commits.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_between(1, 1_000))]
    pub miners: usize,
    #[arg(long, default_value_t = 16, value_parser = crate::limits::count_between(1, 10_000))]
    pub storage_nodes: usize,
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::limits::count_between(2, 10_000_000_000))]
    pub accounts: usize,
    /// Retention level r of the miner's top layer.
    #[arg(short = 'r', long = "retention", default_value_t = 4, value_parser = crate::limits::trie_level())]
    pub retention: usize,
    /// Transfers per client submission.
    #[arg(long, default_value_t = 250, value_parser = crate::limits::count_between(1, 1_000_000))]
    pub batch: usize,
    /// Submissions each client keeps in flight.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count_between(1, 10_000))]
    pub in_flight: usize,
    /// Transfers per block at most.
    #[arg(long, default_value_t = 4_000, value_parser = crate::limits::count_between(1, 10_000_000))]
    pub block_transfers: usize,
    /// Also predict by simulation: the real cores in virtual time under the calibrated costs,
    /// offering `--simulate-transfers` at once (one machine, or one per role with `--machines`
    /// above 1; gRPC costs with `--transport grpc`).
    #[arg(long)]
    pub simulate: bool,
    #[arg(long, default_value_t = 50_000, value_parser = crate::limits::count_between(1, 10_000_000))]
    pub simulate_transfers: usize,
    /// How the roles talk (default: in-process on one machine, a network on more).
    #[arg(long, value_enum)]
    pub transport: Option<SimTransport>,
    /// One-way latency within a region, milliseconds (network only).
    #[arg(long, default_value_t = 0.05, value_parser = crate::limits::latency_ms)]
    pub latency_ms: f64,
    /// One-way latency between regions, milliseconds (network only).
    #[arg(long, default_value_t = 50.0, value_parser = crate::limits::latency_ms)]
    pub wan_latency_ms: f64,
    /// Link bandwidth, Mbit/s (network only).
    #[arg(long, default_value_t = 10_000.0, value_parser = crate::limits::bandwidth_mbit)]
    pub bandwidth_mbit: f64,
    /// Regions the roles are spread over (the building miner in the first).
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_between(1, 100))]
    pub regions: usize,
    /// Runs of each validation shape (interleaved; figures are medians).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 100))]
    pub rounds: usize,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Prints the share of the cores this process gets with this many busy threads and the
    /// latency of a log append with fsync now, and exits (run pinned by the calibration
    /// itself, once per core set, and beside each validation run).
    #[arg(long, hide = true, value_parser = crate::limits::count_between(1, 4_096))]
    pub measure_cpu_share: Option<usize>,
}

/// A seed deployment predicted beside what the seed reported.
#[derive(Serialize)]
struct SeedSetup {
    name: String,
    seed_reported_tps: f64,
    shape: Shape,
    prediction: Prediction,
}

#[derive(Serialize)]
struct SimReport {
    predicted_tps: Option<f64>,
    predicted_latency_ms: Option<f64>,
    extrapolated: Option<bool>,
    shape: Option<Shape>,
    prediction: Option<Prediction>,
    calibration: Calibration,
    #[serde(skip_serializing_if = "Option::is_none")]
    validation: Option<Vec<ValidationEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed_setups: Option<Vec<SeedSetup>>,
    /// The same shape predicted by simulation (`--simulate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    simulated: Option<virga_node::sim::predict::Simulated>,
}

/// A validation row with the fields the issue names first: `predicted_tps` is the analytic
/// model's, `simulated_tps` the simulation's, both from the same frozen calibration.
#[derive(Serialize)]
struct ValidationEntry {
    shape: String,
    predicted_tps: f64,
    measured_tps: f64,
    error: f64,
    simulated_tps: Option<f64>,
    simulated_error: Option<f64>,
    detail: ValidationRow,
}

pub(crate) fn run(command: &SimCommand) -> Result<ExitCode> {
    match command {
        SimCommand::Rainblock(args) => match args.seeds.seeds {
            Some(seeds) => {
                let passed = crate::sim_seeds::run(&args.seeds, seeds, args.predict.json.as_ref())?;
                Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
            }
            None => predict_and_validate(&args.predict),
        },
        SimCommand::ConfigService(args) => crate::sim_config_service::run(args),
        SimCommand::Dkv(args) => crate::sim_dkv::run(args),
        SimCommand::Chainify(args) => crate::sim_chainify::run(args),
    }
}

fn load_or_calibrate(args: &PredictArgs) -> Result<Calibration> {
    let calibration = match &args.calibration {
        Some(path) => Calibration::load(path)?,
        None => {
            eprintln!("calibrating on this machine (a few seconds) …");
            let mut calibration = calibrate(&CalibrationSetup::standard())?;
            calibration.machine.cpu_share = pinned_cpu_shares(calibration.machine.cores)?;
            calibration
        }
    };
    if let Some(path) = &args.save_calibration {
        calibration.save(path)?;
        eprintln!("calibration written to {}", path.display());
    }
    Ok(calibration)
}

/// The share of its cores a process pinned to cores 0..k gets, for each k, each measured in a
/// child process of this binary under `taskset` (empty where taskset is missing).
fn pinned_cpu_shares(cores: usize) -> Result<BTreeMap<String, f64>> {
    let mut shares = BTreeMap::new();
    if !taskset_installed() {
        return Ok(shares);
    }
    let virga = std::env::current_exe().context("locating the virga executable")?;
    for count in 1..=cores.min(64) {
        let cpus = (0..count).map(|cpu| cpu.to_string()).collect::<Vec<_>>().join(",");
        let output = std::process::Command::new("taskset")
            .args(["-c", &cpus])
            .arg(&virga)
            .args(["sim", "rainblock", "--measure-cpu-share", &count.to_string()])
            .output()
            .context("running taskset")?;
        let text = String::from_utf8_lossy(&output.stdout);
        match text.split_whitespace().next().unwrap_or_default().parse::<f64>() {
            Ok(share) if output.status.success() => {
                shares.insert(cpus, share);
            }
            _ => bail!("measuring the CPU share on cores {cpus} failed: {}", String::from_utf8_lossy(&output.stderr)),
        }
    }
    Ok(shares)
}

fn taskset_installed() -> bool {
    ["/usr/bin/taskset", "/bin/taskset"].iter().any(|path| Path::new(path).exists())
}

/// The shape the options describe.
pub(crate) fn shape_of(args: &PredictArgs, calibration: &Calibration) -> Shape {
    let transport =
        args.transport.unwrap_or(if args.machines > 1 { SimTransport::Network } else { SimTransport::Inproc });
    let links = match transport {
        SimTransport::Inproc => Links::InProc,
        SimTransport::Grpc => Links::GrpcLoopback,
        SimTransport::Network => Links::Network {
            local: Link { latency_ms: args.latency_ms, bandwidth_mbit: args.bandwidth_mbit },
            wide: Link { latency_ms: args.wan_latency_ms, bandwidth_mbit: args.bandwidth_mbit },
        },
    };
    let this_machine = args.machines == 1 && args.threads.is_none_or(|threads| threads == calibration.machine.cores);
    Shape {
        machines: args.machines,
        threads: args.threads.unwrap_or(calibration.machine.cores),
        effective_cores: this_machine.then_some(calibration.machine.effective_cores),
        clients: args.clients,
        miners: args.miners,
        storage_nodes: args.storage_nodes,
        accounts: args.accounts,
        retention: args.retention,
        batch: args.batch,
        in_flight: args.in_flight,
        max_block_transfers: args.block_transfers,
        links,
        regions: args.regions,
    }
}

/// The seed's deployments (seed 000 §6.7.4, Fig. 6.9): every role on its own machine of 48
/// threads, Virga's own batch, in-flight and block bounds.
fn seed_shapes() -> Vec<(String, f64, Shape)> {
    let lan = Link { latency_ms: 0.05, bandwidth_mbit: 10_000.0 };
    let region = |regions: usize, retention: usize, wan_one_way_ms: f64| Shape {
        machines: 21 * regions,
        threads: 48,
        effective_cores: None,
        clients: 4 * regions,
        miners: regions,
        storage_nodes: 16 * regions,
        accounts: 1_000_000,
        retention,
        batch: 250,
        in_flight: 4,
        max_block_transfers: 4_000,
        links: Links::Network { local: lan, wide: Link { latency_ms: wan_one_way_ms, bandwidth_mbit: 1_000.0 } },
        regions,
    };
    vec![
        (
            "Fig. 6.9a: 21 machines × 48 threads, 4 clients, 1 miner, 16 storage nodes, r = 7, LAN".into(),
            30_000.0,
            region(1, 7, 0.05),
        ),
        ("a single miner (headline)".into(), 27_400.0, region(1, 7, 0.05)),
        ("Fig. 6.9b: one region, r = 8".into(), 25_000.0, region(1, 8, 0.05)),
        ("Fig. 6.9b: four regions, WAN RTT 40 ms".into(), 20_000.0, region(4, 8, 20.0)),
        ("Fig. 6.9b: four regions, WAN RTT 150 ms".into(), 20_000.0, region(4, 8, 75.0)),
    ]
}

pub(crate) fn predict_and_validate(args: &PredictArgs) -> Result<ExitCode> {
    if let Some(threads) = args.measure_cpu_share {
        let share = virga_node::cost::calibrate::cpu_share(threads, 1.0).context("reading /proc/self/stat")?;
        let fsync = virga_node::cost::calibrate::fsync_latency_us(20)?;
        println!("{share} {fsync}");
        return Ok(ExitCode::SUCCESS);
    }
    let calibration = load_or_calibrate(args)?;
    print_calibration(&calibration);
    let predicting = args.predict || !(args.validate || args.seed_setups);
    let mut report = SimReport {
        predicted_tps: None,
        predicted_latency_ms: None,
        extrapolated: None,
        shape: None,
        prediction: None,
        calibration: calibration.clone(),
        validation: None,
        seed_setups: None,
        simulated: None,
    };
    if predicting {
        let shape = shape_of(args, &calibration);
        let prediction = predict(&calibration, &shape);
        println!(
            "\nprediction: {:.0} tx/s, commit latency {:.1} ms, bound by {:?}{}",
            prediction.predicted_tps,
            prediction.predicted_latency_ms,
            prediction.bottleneck,
            if prediction.extrapolated { " (extrapolated beyond this machine)" } else { "" }
        );
        for (bound, tps) in &prediction.bounds {
            println!("  {:<16} {:>12.0} tx/s", format!("{bound:?}"), tps);
        }
        report.predicted_tps = Some(prediction.predicted_tps);
        report.predicted_latency_ms = Some(prediction.predicted_latency_ms);
        report.extrapolated = Some(prediction.extrapolated);
        report.shape = Some(shape);
        report.prediction = Some(prediction);
        if args.simulate {
            report.simulated = Some(simulate_shape(args, &calibration)?);
        }
    }
    if args.seed_setups {
        report.seed_setups = Some(seed_setups(&calibration));
    }
    if args.validate {
        report.validation = Some(run_validation(&calibration, args.rounds)?);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The shape predicted by simulation (see `virga_node::sim::predict`).
fn simulate_shape(args: &PredictArgs, calibration: &Calibration) -> Result<virga_node::sim::predict::Simulated> {
    use virga_node::sim::predict::{simulate, Placement};
    let topology = virga_node::topology::Topology {
        accounts: args.accounts,
        storage_nodes: args.storage_nodes,
        clients: args.clients,
        miners: args.miners,
        retention: args.retention,
        compaction: args.retention + 1,
        batch: args.batch,
        in_flight: args.in_flight,
        max_block_transfers: args.block_transfers,
        top_budget_bytes: 256 << 20,
        ..virga_node::topology::Topology::small()
    };
    let threads = args.threads.unwrap_or(calibration.machine.cores);
    let placement =
        if args.machines > 1 { Placement::MachinePerRole { threads } } else { Placement::OneMachine { threads } };
    let grpc = matches!(args.transport, Some(SimTransport::Grpc | SimTransport::Network));
    let limit = std::time::Duration::from_secs(3_600);
    let simulated = simulate(calibration, &topology, args.simulate_transfers, grpc, placement, limit)
        .map_err(anyhow::Error::msg)?;
    println!(
        "simulated: {:.0} tx/s ({} of {} committed in {:.2} s of virtual time, {} events)",
        simulated.tps, simulated.committed, simulated.offered, simulated.virtual_seconds, simulated.events
    );
    Ok(simulated)
}

fn seed_setups(calibration: &Calibration) -> Vec<SeedSetup> {
    println!("\nthe seed's deployments (every role on its own 48-thread machine; extrapolated):");
    println!("  {:<84} {:>10} {:>10} {:>10}  bound", "setup", "seed tx/s", "predicted", "latency");
    seed_shapes()
        .into_iter()
        .map(|(name, reported, shape)| {
            let prediction = predict(calibration, &shape);
            println!(
                "  {:<84} {:>10.0} {:>10.0} {:>8.0}ms  {:?}",
                name, reported, prediction.predicted_tps, prediction.predicted_latency_ms, prediction.bottleneck
            );
            SeedSetup { name, seed_reported_tps: reported, shape, prediction }
        })
        .collect()
}

fn run_validation(calibration: &Calibration, rounds: usize) -> Result<Vec<ValidationEntry>> {
    let virga = std::env::current_exe().context("locating the virga executable")?;
    if !taskset_installed() {
        bail!("--validate pins runs to cores with taskset, which is not installed");
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let shapes = RunShape::defaults();
    eprintln!("simulating {} shapes, then running each {rounds} times, interleaved …", shapes.len());
    let rows = validate(calibration, &virga, &shapes, rounds, scratch.path(), &|shape, round, run| {
        let share = run.cpu_share_before.map_or("-".to_string(), |share| format!("{share:.2}"));
        let fsync = run.fsync_us_before.map_or("-".to_string(), |fsync| format!("{fsync:.0} µs"));
        eprintln!(
            "  round {}: {:<32} {:>8.0} tx/s (before it: cores' share {share}, fsync {fsync})",
            round + 1,
            shape.name,
            run.tps
        )
    })?;
    println!(
        "\n  {:<32} {:>10} {:>10} {:>18} {:>8} {:>7} {:>10} {:>8} {:>14} {:>8} {:>10} {:>8}  bound",
        "shape",
        "predicted",
        "measured",
        "(min–max)",
        "error",
        "share",
        "at share",
        "error",
        "µs/tx pred/meas",
        "error",
        "simulated",
        "error"
    );
    let entries = rows
        .into_iter()
        .map(|row| {
            println!(
                "  {:<32} {:>10.0} {:>10.0} {:>8.0}–{:<8.0} {:>+7.1}% {:>7} {:>10} {:>8} {:>6.0}/{:<7} {:>8} {:>10} {:>8}  {:?}",
                row.shape.name,
                row.predicted_tps,
                row.measured_tps,
                row.measured_tps_min,
                row.measured_tps_max,
                row.error * 100.0,
                row.cpu_share_at_runs.map_or("-".to_string(), |share| format!("{share:.2}")),
                row.predicted_tps_at_share.map_or("-".to_string(), |tps| format!("{tps:.0}")),
                row.error_at_share.map_or("-".to_string(), |error| format!("{:+.1}%", error * 100.0)),
                row.predicted_cpu_us_per_tx,
                row.measured_cpu_us_per_tx.map_or("-".to_string(), |cpu| format!("{cpu:.0}")),
                row.cpu_error.map_or("-".to_string(), |error| format!("{:+.1}%", error * 100.0)),
                row.simulated_tps.map_or("-".to_string(), |tps| format!("{tps:.0}")),
                row.simulated_error.map_or("-".to_string(), |error| format!("{:+.1}%", error * 100.0)),
                row.bottleneck
            );
            ValidationEntry {
                shape: row.shape.name.clone(),
                predicted_tps: row.predicted_tps,
                measured_tps: row.measured_tps,
                error: row.error,
                simulated_tps: row.simulated_tps,
                simulated_error: row.simulated_error,
                detail: row,
            }
        })
        .collect();
    Ok(entries)
}

fn print_calibration(calibration: &Calibration) {
    let machine = &calibration.machine;
    let (miner, storage, client, messages) =
        (&calibration.miner, &calibration.storage, &calibration.client, &calibration.messages);
    println!(
        "calibration: {} ({} cores, {:.2} effective, pinned shares {:?}, {} build)",
        machine.cpu_model, machine.cores, machine.effective_cores, machine.cpu_share, machine.build
    );
    println!(
        "  miner    recover {:.1} µs/tx, admit {:.1} µs/tx, build {:.1} µs/tx + {:.0} µs/block, other {:.1} µs/tx + {:.0} µs/block, commit {:.0} µs/block",
        miner.recover_us, miner.admit_us, miner.build_us, miner.build_block_us, miner.other_us, miner.other_block_us, miner.commit_block_us
    );
    println!(
        "  storage  apply {:.0} µs/call + {:.1} µs/update, log append+fsync {:.0} µs ({:.0} µs CPU), witness {:.0} µs/call + {:.1} µs/key",
        storage.apply_call_us, storage.apply_update_us, storage.log_append_fsync_us, storage.log_append_cpu_us, storage.witness_call_us, storage.witness_key_us
    );
    println!(
        "  client   verify {:.1} µs/key, pre-execute {:.1} µs/tx, bag {:.1} µs/tx",
        client.verify_key_us, client.preexec_us, client.bag_us
    );
    println!(
        "  messages encode {:.2} ns/B, decode {:.2} ns/B, keccak {:.0} ns/node, in-process call {:.1} µs, gRPC call {} µs + {} ns/B",
        messages.encode_ns_per_byte,
        messages.decode_ns_per_byte,
        messages.keccak_ns_per_node,
        messages.inproc_call_us,
        messages.grpc_call_us.map_or("-".to_string(), |us| format!("{us:.0}")),
        messages.grpc_ns_per_byte.map_or("-".to_string(), |ns| format!("{ns:.2}")),
    );
}

/// A progress bar over `seeds` seeds, labelled `prefix`.
fn seed_progress_bar(prefix: &'static str, seeds: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(seeds);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>16} [{bar:40}] {pos}/{len} seeds ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    bar
}

/// Runs seeds `first..last` on `threads` threads with a progress bar labelled `prefix`:
/// `run` gives each seed's options and report, `problem` a failed report's first problem,
/// printed with `replay`'s command as it happens. Returns the outcomes in seed order and the
/// wall-clock seconds.
pub(crate) fn run_seeds<O: Send, R: Send>(
    prefix: &'static str,
    (first, last): (u64, u64),
    threads: usize,
    run: impl Fn(u64) -> (O, R) + Sync,
    problem: impl Fn(&R) -> Option<String> + Sync,
    replay: impl Fn(&O) -> String + Sync,
) -> (Vec<(u64, O, R)>, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let bar = seed_progress_bar(prefix, last - first);
    let started = std::time::Instant::now();
    let next = AtomicU64::new(first);
    let outcomes = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= last {
                    break;
                }
                let (options, report) = run(seed);
                if let Some(problem) = problem(&report) {
                    // Printed with the bar out of the way, and also when there is none (no terminal).
                    bar.suspend(|| eprintln!("seed {seed} FAILED: {problem}\n  replay: {}", replay(&options)));
                }
                bar.inc(1);
                outcomes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push((seed, options, report));
            });
        }
    });
    bar.finish_and_clear();
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    outcomes.sort_by_key(|(seed, _, _)| *seed);
    (outcomes, wall_seconds)
}
