//! `virga chainify node`: ChainifyDB's servers as processes of their own over gRPC
//! (`virga_chainify::deploy`).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio::sync::watch;
use virga_chainify::deploy::{self, ClientOptions, InitOptions};
use virga_chainify::smallbank::Skew;

use crate::chainify::Policy;

#[derive(Subcommand)]
pub(crate) enum NodeCommand {
    /// Writes a deployment directory: the organizations (two PostgreSQL and one SQLite, or
    /// three SQLite), every server's loopback address, fresh keys and the settings.
    Init(InitArgs),
    /// Runs the named servers of a deployment (an orderer replica `orderer-N`, or an
    /// organization's `org-N/chainify`, `org-N/exec` or `org-N/commit`) until Ctrl-C or
    /// SIGTERM. What they must not lose is on disk, so a killed process can be restarted.
    Run(RunArgs),
    /// Runs SmallBank clients of a deployment until every proposal is answered; prints
    /// throughput and latency.
    Client(ClientArgs),
}

#[derive(Args)]
pub(crate) struct InitArgs {
    /// The directory to write (must not hold a consortium yet).
    #[arg(long)]
    dir: PathBuf,
    /// Three organizations on SQLite (no PostgreSQL needed).
    #[arg(long)]
    sqlite_only: bool,
    /// SmallBank's customers, loaded by the genesis block.
    #[arg(long, default_value_t = 10_000, value_parser = crate::limits::count_u64_between(10, 100_000))]
    customers: u64,
    /// Orderer replicas (a Raft group).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_between(1, 7))]
    orderers: usize,
    /// Clients to create keys for (client-1, client-2, …; dealt to the organizations in turn).
    #[arg(long, default_value_t = 6, value_parser = crate::limits::count_between(1, 1_000))]
    clients: usize,
    /// Host every server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Servers listen on consecutive ports from here (orderers, then each organization's
    /// chainify, exec and commit servers).
    #[arg(long, default_value_t = 7300, value_parser = clap::value_parser!(u16).range(1..))]
    base_port: u16,
    #[arg(long, value_enum, default_value_t = Policy::Any2)]
    policy: Policy,
    /// Transactions a block.
    #[arg(long, default_value_t = 256, value_parser = crate::limits::count_between(1, 65_536))]
    block_size: usize,
    /// Proposals a ChainifyServer gathers into one agreed batch.
    #[arg(long, default_value_t = 64, value_parser = crate::limits::count_between(1, 4_096))]
    batch_size: usize,
    /// A logical checkpoint after every K-th block (three kept).
    #[arg(long, default_value_t = 5, value_parser = crate::limits::count_u64_between(1, 1_000_000))]
    checkpoint_every: u64,
    /// Connections per organization running a block's stages in parallel (0: serially).
    #[arg(long, default_value_t = 0, value_parser = crate::limits::count_between(0, 64))]
    workers: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    /// The directory written by `virga chainify node init`.
    #[arg(long)]
    dir: PathBuf,
    /// A server to run (repeat it to run several in this process).
    #[arg(long = "name", required = true)]
    names: Vec<String>,
}

#[derive(Args)]
pub(crate) struct ClientArgs {
    #[arg(long)]
    dir: PathBuf,
    /// The clients to run (names from `init`: client-1, …); by default client-1.
    #[arg(long = "name")]
    names: Vec<String>,
    /// Proposals each client sends.
    #[arg(long, default_value_t = 1_000, value_parser = crate::limits::count_u64_between(1, 100_000_000))]
    transactions: u64,
    /// Proposals each client keeps in flight.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::count_between(1, 4_096))]
    window: usize,
    /// Draw customers from a Zipf distribution with this exponent instead of uniformly.
    #[arg(long, value_parser = crate::chainify::zipf_exponent)]
    zipf: Option<f64>,
    /// The longest the run may take, in seconds.
    #[arg(long, default_value_t = 600, value_parser = crate::limits::count_u64_between(1, 86_400))]
    limit: u64,
    /// Where the JSON report goes.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run(command: &NodeCommand) -> anyhow::Result<ExitCode> {
    match command {
        NodeCommand::Init(args) => init(args),
        NodeCommand::Run(args) => serve(args),
        NodeCommand::Client(args) => client(args),
    }
}

fn init(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let options = InitOptions {
        sqlite_only: args.sqlite_only,
        customers: args.customers,
        orderers: args.orderers,
        clients: args.clients,
        host: args.host.clone(),
        base_port: args.base_port,
        agree: match args.policy {
            Policy::Any2 => 2,
            Policy::All3 => 3,
        },
        block_size: args.block_size,
        batch_size: args.batch_size,
        checkpoint_every: args.checkpoint_every,
        workers: args.workers,
        seed: args.seed,
    };
    let deployment = deploy::init(&args.dir, &options)?;
    // PostgreSQL's server runs as the postgres user under root: it must be able to enter.
    std::fs::set_permissions(&args.dir, std::fs::Permissions::from_mode(0o755))?;
    let dir = args.dir.display();
    println!("deployment in {dir}: {} organizations, {} customers", deployment.organizations.len(), args.customers);
    println!("start each server (in its own terminal, or with &):");
    for (name, address) in &deployment.addresses {
        println!("  virga chainify node run --dir {dir} --name {name}    # at {address}");
    }
    println!("then run clients: virga chainify node client --dir {dir} --name client-1 --transactions 1000");
    println!("stop the servers (Ctrl-C) and check: virga chainify verify --dir {dir}");
    Ok(ExitCode::SUCCESS)
}

fn serve(args: &RunArgs) -> anyhow::Result<ExitCode> {
    crate::node::init_logging();
    // The databases open before the runtime starts and close after it is gone (see
    // `deploy::Databases`).
    let (servers, databases) = deploy::open_servers(&args.dir, &args.names)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let served: anyhow::Result<()> = runtime.block_on(async {
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(crate::node::stop_on_signal(stop));
        deploy::run_servers(servers, stopped, &mut |name, address| {
            eprintln!("{name}: serving at {address}");
        })
        .await?;
        Ok(())
    });
    drop(runtime);
    drop(databases);
    served?;
    eprintln!("{}: stopped", args.names.join(", "));
    Ok(ExitCode::SUCCESS)
}

fn client(args: &ClientArgs) -> anyhow::Result<ExitCode> {
    let names = if args.names.is_empty() { vec!["client-1".to_string()] } else { args.names.clone() };
    let options = ClientOptions {
        names,
        transactions: args.transactions,
        window: args.window,
        skew: args.zipf.map_or(Skew::Uniform, Skew::Zipf),
        limit: Duration::from_secs(args.limit),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let report = runtime.block_on(deploy::run_clients(&args.dir, &options, &mut |answered, sent| {
        eprint!("\r{answered} of {sent} proposals answered   ");
    }))?;
    eprintln!();
    println!(
        "{} clients: {} of {} proposals answered ({} successful) in {:.1} s: {:.0} transactions/s, p50 {:.1} ms, \
         p99 {:.1} ms; {} refused, {} timed out",
        report.clients,
        report.answered,
        report.sent,
        report.successful,
        report.seconds,
        report.tps,
        report.latency_p50_ms,
        report.latency_p99_ms,
        report.refused,
        report.timed_out
    );
    for refusal in &report.refusals {
        println!("refused: {refusal}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let everything = report.answered == args.transactions * report.clients as u64;
    Ok(if everything { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
