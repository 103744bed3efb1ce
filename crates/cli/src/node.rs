//! `virga node`: RainBlock's roles as processes of their own over gRPC.

use crate::shape::ClusterShape;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::sync::watch;
use virga_node::process::{self, ClientJob, ClusterPlan, PlanOptions};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct NodeArgs {
    #[command(subcommand)]
    init: Option<NodeCommand>,
    /// Which role this process plays.
    #[arg(long, required = true)]
    role: Option<Role>,
    /// The cluster directory written by `virga node init`.
    #[arg(long, required = true)]
    dir: Option<PathBuf>,
    /// This process's id in the plan: storage-i, miner-i; any name for a client.
    #[arg(long, required = true)]
    id: Option<String>,
    /// Client: transfers signed for all clients together (this one submits its share).
    #[arg(long, default_value_t = 20_000, value_parser = crate::limits::count(1))]
    transfers: usize,
    /// Client: this is client `index` of `clients` (clients never share a sender).
    #[arg(long, default_value_t = 0)]
    index: usize,
    /// Client: clients in the cluster.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count(1))]
    clients: usize,
    /// Client: transfers offered per second (default: as fast as they are taken).
    #[arg(long, value_parser = crate::limits::positive)]
    rate: Option<f64>,
    /// Client: longest run in seconds.
    #[arg(long, default_value_t = 120, value_parser = crate::limits::count_u64(1))]
    duration: u64,
    /// Client: transfers per submission.
    #[arg(long, default_value_t = 250, value_parser = crate::limits::count(1))]
    batch: usize,
    /// Client: submissions kept in flight.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::count(1))]
    in_flight: usize,
    /// Client: also write its report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Writes a cluster directory: the genesis and the plan every role reads (ids, shards, addresses).
    Init(InitArgs),
    /// Pings every storage node and miner of a cluster directory's plan (the health
    /// protocol): who answers, its role and its version; fails if any does not answer.
    Ping(PingArgs),
}

#[derive(Args)]
struct PingArgs {
    /// The cluster directory written by `virga node init`.
    #[arg(long)]
    dir: PathBuf,
    /// Longest wait for each peer, in milliseconds.
    #[arg(long, default_value_t = 2_000, value_parser = crate::limits::count_u64(1))]
    deadline_ms: u64,
}

#[derive(Args)]
struct InitArgs {
    /// The cluster directory to write (must not hold a cluster yet).
    #[arg(long)]
    dir: PathBuf,
    /// Accounts in the genesis state.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count(2))]
    accounts: usize,
    /// Storage nodes (shards are dealt out round-robin), one process each.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::count(1))]
    storage_nodes: usize,
    #[command(flatten)]
    shape: ClusterShape,
    /// Host every role listens on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Storage node i listens on base-port + i, miner j after the storage nodes.
    #[arg(long, default_value_t = 7100, value_parser = clap::value_parser!(u16).range(1..))]
    base_port: u16,
    /// Share of the clients' transactions that call an ERC-20 token deployed in the genesis,
    /// from 0 to 1 (`virga up`'s default); 0 runs value transfers alone.
    #[arg(long, default_value_t = 0.15, value_parser = crate::limits::probability)]
    contracts: f64,
    /// Transactions the clients will sign in all (their `--transfers`): the token's callers
    /// among them are given tokens in the genesis.
    #[arg(long, default_value_t = 20_000, value_parser = crate::limits::count(1))]
    transfers: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum Role {
    Storage,
    Miner,
    Client,
}

pub(crate) fn run(args: &NodeArgs) -> Result<ExitCode> {
    init_logging();
    match &args.init {
        Some(NodeCommand::Init(init)) => return init_cluster(init),
        Some(NodeCommand::Ping(ping)) => return ping_cluster(ping),
        None => {}
    }
    let (Some(role), Some(dir), Some(id)) = (args.role, args.dir.as_ref(), args.id.as_ref()) else {
        bail!("virga node needs --role, --dir and --id (or the `init` subcommand)");
    };
    if args.index >= args.clients {
        // A usage error like clap's own: this client would own no sender.
        eprintln!("error: --index {} must be below --clients {}", args.index, args.clients);
        return Ok(ExitCode::from(2));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async {
        match role {
            Role::Storage => {
                let (stop, stopped) = watch::channel(false);
                tokio::spawn(stop_on_signal(stop));
                let shutdown = async move {
                    let mut stopped = stopped;
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                process::run_storage(dir, id, shutdown).await.map_err(anyhow::Error::msg)?;
                eprintln!("{id}: stopped");
            }
            Role::Miner => {
                let index = id
                    .strip_prefix("miner-")
                    .and_then(|index| index.parse().ok())
                    .with_context(|| format!("a miner's id is miner-<index>, not {id:?}"))?;
                let (stop, stopped) = watch::channel(false);
                tokio::spawn(stop_on_signal(stop));
                let stats = process::run_miner(dir, index, stopped).await.map_err(anyhow::Error::msg)?;
                eprintln!(
                    "{id}: stopped after {} blocks, {} transfers included, aborted {:?}",
                    stats.blocks, stats.included, stats.aborted
                );
            }
            Role::Client => {
                let job = ClientJob {
                    id: id.clone(),
                    index: args.index,
                    clients: args.clients,
                    transfers: args.transfers,
                    rate: args.rate,
                    duration: Duration::from_secs(args.duration),
                    batch: args.batch,
                    in_flight: args.in_flight,
                };
                let report = process::run_client(dir, &job, &|committed, offered| {
                    eprint!("\r{id}: {committed} of {offered} transfers committed   ");
                })
                .await
                .map_err(anyhow::Error::msg)?;
                eprintln!();
                println!(
                    "{id}: committed {} of {} transfers ({} token calls) in {:.1} s ({:.0} tx/s); filtered {:?}; \
                     retried {:?}; witness bytes per tx {:.0} full, {:.0} compacted",
                    report.committed,
                    report.offered,
                    report.calls_committed,
                    report.seconds,
                    report.tps,
                    report.filtered,
                    report.retried,
                    report.witness_bytes_full_per_tx,
                    report.witness_bytes_compact_per_tx
                );
                if let Some(path) = &args.json {
                    std::fs::write(path, serde_json::to_string_pretty(&report)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                if (report.committed as usize) < report.offered {
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn init_cluster(args: &InitArgs) -> Result<ExitCode> {
    let options = PlanOptions {
        topology: args.shape.topology(args.accounts, args.storage_nodes),
        host: args.host.clone(),
        base_port: args.base_port,
        contracts: args.contracts,
        transfers: args.transfers,
    };
    let plan = process::init(&args.dir, &options, &|_| {}).map_err(anyhow::Error::msg)?;
    let dir = args.dir.display();
    println!(
        "cluster in {dir}: {} accounts, {} shards, {:.0}% token calls",
        plan.accounts,
        plan.shards,
        100.0 * plan.contracts
    );
    println!("start each role in its own terminal (or with &):");
    for (id, shards) in &plan.storage_nodes {
        let address = plan.addresses.get(id).map_or("?", String::as_str);
        println!("  virga node --role storage --dir {dir} --id {id}    # shards {shards:?} at {address}");
    }
    for index in 0..plan.miners {
        let id = ClusterPlan::miner_id(index);
        let address = plan.addresses.get(&id).map_or("?", String::as_str);
        println!("  virga node --role miner --dir {dir} --id {id}    # at {address}");
    }
    println!("  virga node --role client --dir {dir} --id client-0 --transfers {}", args.transfers);
    println!("then stop the servers (Ctrl-C) and audit: virga verify --dir {dir}");
    Ok(ExitCode::SUCCESS)
}

/// Fires `stop` on Ctrl-C or SIGTERM.
fn ping_cluster(args: &PingArgs) -> Result<ExitCode> {
    let plan = process::read_plan(&args.dir).map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let answers = runtime.block_on(plan.ping(Duration::from_millis(args.deadline_ms)));
    let mut silent = 0;
    for (peer, answer) in &answers {
        let address = plan.addresses.get(peer).map_or("", String::as_str);
        match answer {
            Ok(pong) => println!("{peer:<12} {address:<24} up: {} ({}), virga {}", pong.node, pong.role, pong.version),
            Err(error) => {
                silent += 1;
                println!("{peer:<12} {address:<24} down: {error}");
            }
        }
    }
    println!("{} of {} peers answered", answers.len() - silent, answers.len());
    Ok(if silent == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub(crate) async fn stop_on_signal(stop: watch::Sender<bool>) {
    let interrupted = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminated = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupted.await;
                let _ = stop.send(true);
                return;
            }
        };
        tokio::select! {
            _ = interrupted => {}
            _ = terminated.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupted.await;
    let _ = stop.send(true);
}

/// Warnings (refused witnesses, blocks, submissions: with peer and reason) and role
/// lifecycle events go to stderr.
pub(crate) fn init_logging() {
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(tracing::Level::INFO).try_init();
}
