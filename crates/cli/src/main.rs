//! `virga`: the command line of the Virga engine.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod chainify;
mod chainify_bench;
mod chainify_node;
mod demo;
mod dkv_bench;
mod dkv_figures;
mod evm_bench;
mod evm_test;
mod kairos;
mod kairos_bench;
mod kv;
mod kv_client;
mod kv_cluster;
mod ledger;
mod limits;
mod node;
mod rainblock_bench;
mod shape;
mod sim;
mod sim_chainify;
mod sim_config_service;
mod sim_dkv;
mod sim_seeds;
mod up;

// mimalloc keeps small node allocations tight (no per-block header) and is the
// allocator every implementation in `virga bench` runs under.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "virga", version, about = "Virga: fast, verifiable transaction processing")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Virga's main job: a RainBlock cluster (storage nodes, a miner, prefetching clients) on
    /// the embedded default, running the Ethereum-like workload, with a report at the end.
    Up(up::UpArgs),
    /// Runs one RainBlock role (storage node, miner or client) as a process of its own over
    /// gRPC; `virga node init` writes the cluster directory they share.
    Node(node::NodeArgs),
    /// Builds a realistic account state in the DSM-Tree and reports throughput, memory and witness sizes.
    Demo(demo::DemoArgs),
    /// Prints the state root of a geth-style genesis file's `alloc` (other fields are not read).
    StateRoot {
        /// Path to genesis.json.
        genesis: PathBuf,
    },
    /// Runs an Ethereum TrieTests file; prints PASS/FAIL per case, exits non-zero if any fails.
    TrieTest {
        file: PathBuf,
        /// Key the trie by keccak-256 of each key (Ethereum's secure trie).
        #[arg(long)]
        secure: bool,
    },
    /// Runs Ethereum GeneralStateTests files (or directories of them) through Virga's
    /// executor (revm over the DSM-Tree); prints PASS/FAIL/SKIP per case, exits non-zero if
    /// any fails.
    EvmTest(evm_test::EvmTestArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Protocols under the deterministic simulator (`--seeds N` with faults), and their cost
    /// model's predictions (`--predict`, `--validate`, `--seed-setups`).
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// The transactional key-value store: the distributed cluster (`virga kv cluster up`) and
    /// its shell (`virga kv --addr A get|put|delete|scan|txn`), and the single-node engine's
    /// audit.
    Kv(KvArgs),
    /// KAIROS's client caching: the ideal lease model (`virga kairos lease`).
    #[command(subcommand)]
    Kairos(kairos::KairosCommand),
    /// ChainifyDB: organizations on their own PostgreSQL and SQLite databases agreeing on
    /// each block's effects (`virga chainify up`, `virga chainify verify --dir D`).
    #[command(subcommand)]
    Chainify(chainify::ChainifyCommand),
    /// Orders a block's transactions (arrival order or Fabric++) and prints the schedule as JSON.
    Schedule(ledger::ScheduleArgs),
    /// Audits a chain directory: hash links, work, transaction roots, signatures, and
    /// re-execution from genesis to every state root.
    Verify(ledger::VerifyArgs),
    /// Prints a block of a chain directory and its transfers with their receipts (re-executed
    /// from genesis), as JSON.
    Block(ledger::BlockArgs),
}

#[derive(Args)]
struct KvArgs {
    /// The address of a `virga kv cluster up` server (host:port or a URL).
    #[arg(long, global = true, default_value = "127.0.0.1:7400")]
    addr: String,
    /// Seconds to wait for the server's answer to each request.
    #[arg(long, global = true, default_value_t = 30.0, value_parser = crate::limits::positive)]
    wait: f64,
    #[command(flatten)]
    tls: kv_cluster::TlsArgs,
    #[command(subcommand)]
    command: KvCommand,
}

#[derive(Subcommand)]
enum KvCommand {
    /// Recovers a store written by `virga bench kv --dir` and prints what it holds as JSON.
    Audit(kv::KvAuditArgs),
    /// The distributed store's cluster.
    #[command(subcommand)]
    Cluster(kv_cluster::ClusterCommand),
    #[command(flatten)]
    Client(kv_client::KvClientCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Virga's trie against peer tries on the same secure state trie.
    Trie(TrieBenchArgs),
    /// The transactional key-value engine on YCSB, SmallBank, Retwis or transfers.
    Kv(kv::KvBenchArgs),
    /// MILANA's clock result: Retwis abort rates with PTP-like vs NTP-like clock skew at rising contention.
    Clocks(kv::ClockSweepArgs),
    /// The ledger: Fabric++ scheduling, the SmallBank Fabric sweep, and chain build and verification.
    Ledger(ledger::LedgerBenchArgs),
    /// RainBlock's Figs. 8 and 9a: whole clusters swept over retention r, accounts and clients,
    /// with top-layer memory, witness bytes, abort rate and throughput; JSON and SVG plots.
    Rainblock(rainblock_bench::RainblockBenchArgs),
    /// The distributed transactional store (SEMEL/MILANA) embedded in one process against
    /// the single-node engine on the same ycsb-t transactions and durability.
    Dkv(dkv_bench::DkvBenchArgs),
    /// KAIROS's client caching on the distributed store: no caching, the ideal lease, naive
    /// and static leases in interleaved rounds (throughput, fresh-hit and stale rates,
    /// messages per transaction, lease lengths), or the hit rate against the cache size.
    Kairos(kairos_bench::KairosBenchArgs),
    /// ChainifyDB's pipeline servers (one process, every message on the wire encoding) over
    /// two PostgreSQL organizations and one SQLite (or three SQLite): throughput against 3, 6,
    /// 12 and 24 clients, Zipf and uniform, each point next to PostgreSQL alone.
    Chainify(chainify_bench::ChainifyBenchArgs),
    /// ERC-20 transfers executed by Virga's executor (revm over the DSM-Tree) and by revm
    /// alone over its in-memory CacheDB, on the same blocks over the same 1M-holder state.
    Evm(evm_bench::EvmBenchArgs),
}

#[derive(Args)]
struct TrieBenchArgs {
    /// Number of accounts in the state.
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::limits::count(1))]
    accounts: usize,
    /// Random lookups of existing accounts (0 skips them).
    #[arg(long, default_value_t = 1_000_000)]
    gets: usize,
    #[arg(long, default_value_t = 100)]
    blocks: usize,
    #[arg(long, default_value_t = 1_000)]
    block_updates: usize,
    #[arg(long, default_value_t = 100_000)]
    proofs: usize,
    /// Accounts inserted one at a time into the full trie (`insert_one`).
    #[arg(long, default_value_t = 100_000)]
    single_inserts: usize,
    /// Two-account transfers in the node-bag experiment.
    #[arg(long, default_value_t = 1_000)]
    transfers: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Runs of each implementation (each in a fresh process); rates are their medians.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count(1))]
    runs: usize,
    /// Writes the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runs only this implementation in this process and prints its JSON report (used
    /// by the benchmark itself to measure each implementation in a process of its own).
    #[arg(long, hide = true)]
    impl_only: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => up::run(&args),
        Command::Sim(command) => sim::run(&command),
        Command::Node(args) => node::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::StateRoot { genesis } => state_root(&genesis),
        Command::TrieTest { file, secure } => trie_test(&file, secure),
        Command::EvmTest(args) => evm_test::run(&args),
        Command::Bench(BenchCommand::Trie(args)) => bench_trie(&args),
        Command::Bench(BenchCommand::Kv(args)) => kv::bench_kv(&args),
        Command::Bench(BenchCommand::Clocks(args)) => kv::bench_clocks(&args),
        Command::Kv(KvArgs { command: KvCommand::Audit(args), .. }) => kv::kv_audit(&args),
        Command::Kv(KvArgs { command: KvCommand::Cluster(command), tls, .. }) => kv_cluster::run(&command, &tls),
        Command::Kv(KvArgs { command: KvCommand::Client(command), addr, wait, tls }) => {
            Ok(kv_client::run(&addr, wait, &tls, &command))
        }
        Command::Bench(BenchCommand::Ledger(args)) => ledger::bench_ledger(&args),
        Command::Bench(BenchCommand::Rainblock(args)) => rainblock_bench::bench_rainblock(&args),
        Command::Bench(BenchCommand::Dkv(args)) => dkv_bench::bench_dkv(&args),
        Command::Bench(BenchCommand::Kairos(args)) => kairos_bench::run(&args),
        Command::Bench(BenchCommand::Chainify(args)) => chainify_bench::run_bench(&args),
        Command::Bench(BenchCommand::Evm(args)) => evm_bench::run_bench(&args),
        Command::Kairos(command) => kairos::run(&command),
        Command::Chainify(command) => chainify::run(&command),
        Command::Schedule(args) => ledger::schedule_block(&args),
        Command::Verify(args) => ledger::verify(&args),
        Command::Block(args) => ledger::show_block(&args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn state_root(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    // Only `alloc` is read: the header fields do not enter the state root.
    let alloc = virga_trie::genesis::Genesis::alloc_from_file(path)?;
    println!("{}", virga_core::hex::encode_prefixed(virga_trie::account::alloc_state(&alloc).root()));
    Ok(ExitCode::SUCCESS)
}

fn trie_test(path: &std::path::Path, secure: bool) -> anyhow::Result<ExitCode> {
    let outcomes = virga_trie::trietest::run_file(path, secure)?;
    let mut failed = 0;
    for outcome in &outcomes {
        if outcome.passed() {
            println!("PASS {}", outcome.name);
        } else {
            failed += 1;
            println!("FAIL {}: expected {}, got {}", outcome.name, outcome.expected, outcome.actual);
        }
    }
    eprintln!("{} passed, {failed} failed", outcomes.len() - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Returns freed pages to the operating system, so resident memory counts live data.
fn release_free_memory() {
    // SAFETY: `mi_collect` only asks the allocator (installed above as the global one)
    // to purge its free lists; it takes no pointers.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn bench_trie(args: &TrieBenchArgs) -> anyhow::Result<ExitCode> {
    use virga_bench::trie::{self, TrieBenchConfig};
    let config = TrieBenchConfig {
        accounts: args.accounts,
        gets: args.gets,
        blocks: args.blocks,
        block_updates: args.block_updates,
        proofs: args.proofs,
        single_inserts: args.single_inserts,
        seed: args.seed,
    };
    if let Some(name) = &args.impl_only {
        let report = trie::run_single(name, &config, true, &release_free_memory)?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("locating the virga executable")?;
    let with_peers = cfg!(feature = "peers");
    if !with_peers {
        eprintln!("note: built without the `peers` feature; measuring Virga alone (cargo run --release --features peers -- bench trie …)");
    }
    let mut reports = Vec::new();
    for name in trie::implementation_names(with_peers) {
        eprintln!("measuring {name} …");
        reports.push(trie::run_median_in_children(&exe, name, &config, args.runs)?);
    }
    eprintln!("node-bag experiment …");
    let workload = trie::Workload::generate(config.accounts, config.seed);
    let virga = trie::build_virga(&workload);
    let bags = trie::node_bag_experiment(&virga, &workload, args.transfers, config.seed);
    let report = trie::TrieBenchReport::assemble(config.accounts, args.runs, reports, bags, trie::measure_keccak())?;
    print!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
