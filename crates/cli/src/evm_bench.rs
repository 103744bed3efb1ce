//! `virga bench evm`: ERC-20 transfers executed by Virga's executor and by revm alone over
//! its `CacheDB`, on the same blocks, interleaved.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use virga_bench::evm::{run, EvmBenchConfig, EXECUTORS};

#[derive(Args)]
pub(crate) struct EvmBenchArgs {
    /// Token holders in the state (each also an account with ether).
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::limits::count(1))]
    accounts: usize,
    /// Holders with keys, who send the transfers (at most `--accounts`).
    #[arg(long, default_value_t = 10_000, value_parser = crate::limits::count(1))]
    senders: usize,
    /// ERC-20 transfers in all.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count(1))]
    transactions: usize,
    /// Transfers per block.
    #[arg(long, default_value_t = 1_000, value_parser = crate::limits::count(1))]
    block_size: usize,
    /// Interleaved runs of each executor; rates are their medians.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count(1))]
    runs: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Measures only these executors, comma-separated (default: all of them); the rates of
    /// the others are reported as 0.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(EXECUTORS))]
    executors: Vec<String>,
    /// Writes the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run_bench(args: &EvmBenchArgs) -> anyhow::Result<ExitCode> {
    if args.senders > args.accounts {
        anyhow::bail!("--senders {} exceeds --accounts {}: senders are holders", args.senders, args.accounts);
    }
    let config = EvmBenchConfig {
        accounts: args.accounts,
        senders: args.senders,
        transactions: args.transactions,
        block_size: args.block_size,
        runs: args.runs,
        seed: args.seed,
        executors: args.executors.clone(),
    };
    let report = run(&config, &|message| eprintln!("bench evm: {message}"));
    println!(
        "ERC-20 transfers over {} holders, {} blocks of up to {} ({} included), {} run(s) each, interleaved",
        config.accounts, report.blocks, config.block_size, report.included, config.runs
    );
    println!(
        "  Virga, execution alone (revm over a flat copy beside the DSM-Tree, trie updated at the root): {:>9.0} tx/s ({:.2} of revm)",
        report.virga_tx_per_sec, report.virga_over_revm
    );
    println!(
        "  Virga, the same reading the DSM-Tree itself through a cache of what blocks read:     {:>9.0} tx/s ({:.2} of revm)",
        report.virga_trie_reads_tx_per_sec, report.virga_trie_reads_over_revm
    );
    println!(
        "  Virga, every block's writes put into the trie as it ends:                            {:>9.0} tx/s ({:.2} of revm)",
        report.virga_write_through_tx_per_sec, report.virga_write_through_over_revm
    );
    println!(
        "  Virga, execution alone, parallel executor ({} cores):                                {:>9.0} tx/s ({:.2} of revm, {:.2}x serial)",
        report.machine.cores, report.virga_parallel_tx_per_sec, report.virga_parallel_over_revm, report.parallel_speedup
    );
    println!(
        "    {:.2} stages per block, {:.2} re-executions per transaction, {} block(s) run serially",
        report.parallel_rounds_per_block, report.parallel_reexecuted_share, report.parallel_serial_blocks
    );
    println!(
        "    this machine's ceiling: two threads of revm alone sharing nothing run {:.2}x one thread",
        report.independent_two_thread_scaling
    );
    println!(
        "  revm alone over its in-memory CacheDB:                                               {:>9.0} tx/s",
        report.revm_tx_per_sec
    );
    println!("  state roots agree: {} ({})", report.roots_agree, report.virga_root);
    println!("With the state root hashed after every block:");
    println!(
        "  Virga (DSM-Tree, storage roots of the changed accounts, then the account trie):     {:>9.0} tx/s",
        report.virga_root_per_block_tx_per_sec
    );
    match (report.revm_eth_trie_root_per_block_tx_per_sec, report.block_roots_agree) {
        (Some(peer), Some(agree)) => println!(
            "  revm alone with eth_trie keeping the same tries:                                     {peer:>9.0} tx/s (every block's root agrees: {agree})"
        ),
        _ => println!("  revm with eth_trie: not measured (build with `--features peers`)"),
    }
    let witnesses = &report.witnesses;
    println!(
        "Witnesses of the first block's {} calls, from pre-execution with a guessed block ({:.1} accounts, {:.1} slots per call):",
        witnesses.calls, witnesses.accounts_per_call, witnesses.slots_per_call
    );
    println!(
        "  full: {:.0} bytes per call ({:.0} of them code); compacted and bagged (batches of {}, c={}): {:.0} bytes per call",
        witnesses.full_per_call, witnesses.code_per_call, witnesses.batch, witnesses.compaction, witnesses.bagged_per_call
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        println!("  report: {}", path.display());
    }
    let agree = report.roots_agree && report.block_roots_agree != Some(false);
    Ok(if agree { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
