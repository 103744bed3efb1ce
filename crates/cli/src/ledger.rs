//! `virga schedule`, `virga verify` and `virga bench ledger`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use virga_bench::ledger::{chain, fabric, schedule as micro};
use virga_ledger::chain::{audit, Chain, ChainOptions};
use virga_ledger::verify::ExecMode;
use virga_txn::schedule::{schedule, ScheduleConfig, Scheduler, TxAccess, Version};

#[derive(Args)]
pub(crate) struct ScheduleArgs {
    /// Block as JSON: {"txs":[{"id":"T0","reads":["k1"],"writes":["k2"]}, …]}; a transaction
    /// may carry "read_versions" ({"k1": [block, tx]} or a list parallel to "reads"; a bare
    /// number is a block) and "snapshot" (the block it simulated against).
    #[arg(long)]
    input: PathBuf,
    /// `arrival` (vanilla Fabric) or `fabricpp` (reordering and early abort).
    #[arg(long, value_enum, default_value_t = Scheduler::FabricPlusPlus)]
    scheduler: Scheduler,
    /// Turns Fabric++'s early-abort rules off (reordering only).
    #[arg(long)]
    no_early_abort: bool,
}

struct InputTx {
    id: String,
    access: TxAccess<String>,
}

fn parse_version(value: &Value, what: &str) -> Result<Version> {
    let number = |value: &Value, part: &str| {
        value.as_u64().with_context(|| format!("{what}: {part} must be a non-negative integer, found {value}"))
    };
    match value {
        Value::Number(_) => Ok(Version { block: number(value, "the block")?, tx: 0 }),
        Value::Array(parts) if parts.len() == 2 => {
            let tx = u32::try_from(number(&parts[1], "the transaction")?)
                .with_context(|| format!("{what}: the transaction index does not fit in 32 bits"))?;
            Ok(Version { block: number(&parts[0], "the block")?, tx })
        }
        Value::Object(fields) => {
            let block = fields.get("block").with_context(|| format!("{what}: missing \"block\""))?;
            let tx = match fields.get("tx") {
                Some(tx) => u32::try_from(number(tx, "the transaction")?)
                    .with_context(|| format!("{what}: the transaction index does not fit in 32 bits"))?,
                None => 0,
            };
            Ok(Version { block: number(block, "the block")?, tx })
        }
        other => bail!("{what}: a version is a block number, [block, tx] or {{\"block\":…,\"tx\":…}}, found {other}"),
    }
}

fn string_list(tx: &serde_json::Map<String, Value>, field: &str, id: &str) -> Result<Vec<String>> {
    match tx.get(field) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("transaction {id}: {field} must hold strings, found {item}"))
            })
            .collect(),
        Some(other) => bail!("transaction {id}: {field} must be a list of keys, found {other}"),
    }
}

fn parse_block(text: &str) -> Result<Vec<InputTx>> {
    let document: Value = serde_json::from_str(text).context("the block is not valid JSON")?;
    let txs =
        document.get("txs").and_then(Value::as_array).context("the block must be an object with a \"txs\" list")?;
    let mut seen = HashSet::new();
    let mut parsed = Vec::with_capacity(txs.len());
    for (index, tx) in txs.iter().enumerate() {
        let fields = tx.as_object().with_context(|| format!("txs[{index}] must be an object, found {tx}"))?;
        let id = match fields.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(id)) => id.to_string(),
            Some(other) => bail!("txs[{index}]: id must be a string, found {other}"),
            None => bail!("txs[{index}] has no \"id\""),
        };
        if !seen.insert(id.clone()) {
            bail!("transaction id {id:?} appears twice");
        }
        let reads = string_list(fields, "reads", &id)?;
        let writes = string_list(fields, "writes", &id)?;
        let read_versions = match fields.get("read_versions") {
            None => Vec::new(),
            Some(Value::Object(map)) => {
                if let Some(key) = map.keys().find(|key| !reads.contains(key)) {
                    bail!("transaction {id}: read_versions names {key:?}, which it does not read");
                }
                reads
                    .iter()
                    .map(|key| {
                        map.get(key)
                            .map(|v| parse_version(v, &format!("transaction {id}, version of {key}")))
                            .transpose()
                    })
                    .collect::<Result<_>>()?
            }
            Some(Value::Array(list)) => {
                if list.len() != reads.len() {
                    bail!("transaction {id}: read_versions has {} entries for {} reads", list.len(), reads.len());
                }
                list.iter()
                    .zip(&reads)
                    .map(|(v, key)| {
                        if v.is_null() {
                            Ok(None)
                        } else {
                            parse_version(v, &format!("transaction {id}, version of {key}")).map(Some)
                        }
                    })
                    .collect::<Result<_>>()?
            }
            Some(other) => bail!("transaction {id}: read_versions must be an object or a list, found {other}"),
        };
        let snapshot = match fields.get("snapshot") {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                value
                    .as_u64()
                    .with_context(|| format!("transaction {id}: snapshot must be a block number, found {value}"))?,
            ),
        };
        parsed.push(InputTx { id, access: TxAccess { reads, writes, read_versions, snapshot } });
    }
    Ok(parsed)
}

pub(crate) fn schedule_block(args: &ScheduleArgs) -> Result<ExitCode> {
    let text = std::fs::read_to_string(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let txs = parse_block(&text).with_context(|| format!("{}", args.input.display()))?;
    let accesses: Vec<TxAccess<String>> = txs.iter().map(|tx| tx.access.clone()).collect();
    let config =
        ScheduleConfig { scheduler: args.scheduler, early_abort: !args.no_early_abort, ..ScheduleConfig::default() };
    let result = schedule(&accesses, &config);
    let order: Vec<&str> = result.order.iter().map(|&index| txs[index].id.as_str()).collect();
    let aborted: Vec<Value> = result
        .aborted
        .iter()
        .map(|(index, cause)| json!({ "id": txs[*index].id, "reason": cause.name(), "detail": cause.to_string() }))
        .collect();
    let output = json!({
        "scheduler": args.scheduler.to_string(),
        "order": order,
        "aborted": aborted,
        "stats": {
            "conflict_edges": result.stats.conflict_edges,
            "cycles": result.stats.cycles,
            "budget_exhausted_rounds": result.stats.budget_exhausted_rounds,
        },
    });
    println!("{output}");
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// Chain directory (made by `virga bench ledger --dir D` or `virga up --dir D`).
    #[arg(long)]
    dir: PathBuf,
    /// Re-execute on one thread instead of in parallel stages.
    #[arg(long)]
    serial: bool,
    /// Threads for signature recovery and staged execution.
    #[arg(long, default_value_t = 2, value_parser = crate::limits::count(1))]
    threads: usize,
    /// Open the chain first, as a node restarting after a crash does: drop a torn tail (never
    /// a complete block) and bring the state store up to the last block. Without it the audit
    /// changes nothing and reports a torn tail as a problem.
    #[arg(long)]
    repair: bool,
}

fn bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_prefix(label.to_owned());
    bar
}

pub(crate) fn verify(args: &VerifyArgs) -> Result<ExitCode> {
    let pool =
        rayon::ThreadPoolBuilder::new().num_threads(args.threads.max(1)).build().context("building the thread pool")?;
    let mode = if args.serial { ExecMode::Serial } else { ExecMode::Parallel };
    if args.repair {
        match Chain::open(&args.dir, ChainOptions::default(), &pool) {
            Ok((_, report)) => eprintln!(
                "opened: {} blocks, dropped {} torn bytes, replayed {} blocks into the state store",
                report.blocks, report.truncated_bytes, report.replayed
            ),
            Err(error) => {
                eprintln!("virga verify: {}: {error}", args.dir.display());
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    if virga_node::audit::is_cluster_dir(&args.dir) {
        return verify_cluster(args, &pool);
    }
    let progress = bar("verifying");
    let started = Instant::now();
    let result = audit(&args.dir, mode, &pool, &mut |number| {
        if number % 16 == 0 {
            progress.set_message(format!("block {number}"));
            progress.tick();
        }
    });
    progress.finish_and_clear();
    match result {
        Ok(summary) => {
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "ok: {} blocks, {} transactions ({} reverted), head {} hash {} state root {}; state store at block {}; {:.2} s, {:.0} tx/s",
                summary.blocks,
                summary.transactions,
                summary.reverted_transactions,
                summary.head_number,
                summary.head_hash,
                summary.state_root,
                summary.state_store_block,
                seconds,
                summary.transactions as f64 / seconds.max(1e-9),
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("virga verify: {}: {error}", args.dir.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Audits a directory written by `virga up`: the chain from genesis, and every storage
/// node's log against the chain's head state root.
fn verify_cluster(args: &VerifyArgs, pool: &rayon::ThreadPool) -> Result<ExitCode> {
    let progress = bar("verifying");
    let started = Instant::now();
    let result = virga_node::audit::audit_cluster(&args.dir, pool, &mut |number| {
        if number % 16 == 0 {
            progress.set_message(format!("block {number}"));
            progress.tick();
        }
    });
    progress.finish_and_clear();
    match result {
        Ok(audit) => {
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "ok: {} blocks, {} transactions ({} reverted), head {} hash {} state root {}; {} storage nodes ({} from a checkpoint) replayed {} logged blocks and agree with the head's root; {:.2} s",
                audit.chain.blocks,
                audit.chain.transactions,
                audit.chain.reverted_transactions,
                audit.chain.head_number,
                audit.chain.head_hash,
                audit.chain.state_root,
                audit.storage_nodes,
                audit.from_checkpoints,
                audit.logged_blocks,
                seconds,
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("virga verify: {}: {error}", args.dir.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

#[derive(Args)]
pub(crate) struct LedgerBenchArgs {
    /// Which part: `schedule` (Figs. 3.6–3.7), `fabric` (the SmallBank sweep of Fig. 3.10),
    /// `chain` (build and verify signed transfers), or `all`.
    #[arg(long, default_value = "all")]
    suite: String,
    /// Keep the chain the `chain` suite builds in this directory (for `virga verify`).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Funded accounts of the chain.
    #[arg(long, default_value_t = 10_000, value_parser = crate::limits::count(2))]
    accounts: usize,
    /// Blocks of the chain.
    #[arg(long, default_value_t = 50, value_parser = crate::limits::count(1))]
    blocks: usize,
    /// Transfers per block of the chain.
    #[arg(long, default_value_t = 1_000, value_parser = crate::limits::count(1))]
    block_size: usize,
    /// Proof-of-work difficulty (expected hashes per block).
    #[arg(long, default_value_t = 4096, value_parser = crate::limits::count_u64(1))]
    difficulty: u64,
    /// Threads of the parallel verifier.
    #[arg(long, default_value_t = 2, value_parser = crate::limits::count(1))]
    threads: usize,
    /// Audits per mode (medians reported).
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count(1))]
    runs: usize,
    /// Transactions per block in the scheduling microbenchmarks.
    #[arg(long, default_value_t = 1_024, value_parser = crate::limits::count(1))]
    schedule_block: usize,
    /// Schedules per microbenchmark input (median reported).
    #[arg(long, default_value_t = 51, value_parser = crate::limits::count(1))]
    repetitions: usize,
    /// SmallBank customers in the Fabric sweep.
    #[arg(long, default_value_t = 100_000, value_parser = crate::limits::count_u64(2))]
    users: u64,
    /// Blocks per point of the Fabric sweep.
    #[arg(long, default_value_t = 20, value_parser = crate::limits::count(1))]
    sweep_blocks: usize,
    /// Zipf exponents of the sweep (comma-separated; default 0 to 2.0 in steps of 0.2).
    #[arg(long, value_delimiter = ',', value_parser = crate::limits::non_negative)]
    zipfs: Vec<f64>,
    /// Write probabilities of the sweep (comma-separated; default 0.05,0.5,0.95).
    #[arg(long, value_delimiter = ',', value_parser = crate::limits::probability)]
    write_probabilities: Vec<f64>,
    /// Writes all results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print `appended=N` on stdout once block N is durable (for crash tests).
    #[arg(long, hide = true)]
    acks: bool,
}

#[allow(clippy::too_many_lines)] // Predates the lint: a debt, to split.
pub(crate) fn bench_ledger(args: &LedgerBenchArgs) -> Result<ExitCode> {
    let suites: HashSet<&str> = match args.suite.as_str() {
        "all" => ["schedule", "fabric", "chain"].into_iter().collect(),
        "schedule" | "fabric" | "chain" => [args.suite.as_str()].into_iter().collect(),
        other => bail!("unknown suite {other:?}: expected schedule, fabric, chain or all"),
    };
    if args.block_size == 0 || args.blocks == 0 || args.accounts < 2 {
        bail!("--blocks and --block-size must be at least 1 and --accounts at least 2");
    }
    let mut results: HashMap<&str, Value> = HashMap::new();
    if suites.contains("schedule") {
        println!(
            "Fabric++ scheduling, {} transactions per block (median of {}):",
            args.schedule_block, args.repetitions
        );
        println!(
            "{:>12} {:>6} {:>8} {:>9} {:>7} {:>12} {:>12}",
            "workload", "param", "arrival", "fabric++", "cycles", "fabric++ µs", "arrival µs"
        );
        let cases = micro::run(args.schedule_block, args.repetitions, |case| {
            println!(
                "{:>12} {:>6} {:>8} {:>9} {:>7} {:>12.1} {:>12.1}{}",
                case.workload,
                case.parameter,
                case.kept_arrival,
                case.kept_fabricpp,
                case.cycles,
                case.fabricpp_median_us,
                case.arrival_median_us,
                if case.budget_exhausted { "  (cycle budget ran out)" } else { "" }
            );
        });
        results.insert("schedule", serde_json::to_value(&cases)?);
    }
    if suites.contains("fabric") {
        let defaults = fabric::SweepOptions::default();
        let options = fabric::SweepOptions {
            users: args.users,
            zipfs: if args.zipfs.is_empty() { defaults.zipfs.clone() } else { args.zipfs.clone() },
            write_probabilities: if args.write_probabilities.is_empty() {
                defaults.write_probabilities.clone()
            } else {
                args.write_probabilities.clone()
            },
            blocks: args.sweep_blocks,
            ..defaults
        };
        println!(
            "\nSmallBank through simulate-order-validate, {} users, {} blocks of {} (committed per block, per second):",
            options.users, options.blocks, options.block_size
        );
        println!(
            "{:>5} {:>5} {:>10} {:>10} {:>6} {:>12} {:>12} {:>6} {:>9} {:>9}",
            "P_w", "zipf", "arrival/b", "fabric++/b", "gain", "arrival/s", "fabric++/s", "gain", "early-ab", "sched µs"
        );
        let points = fabric::sweep(&options, |point| {
            println!(
                "{:>5.2} {:>5.1} {:>10.1} {:>10.1} {:>6.2} {:>12.0} {:>12.0} {:>6.2} {:>9} {:>9.0}",
                point.write_probability,
                point.zipf,
                point.arrival.committed_per_block,
                point.fabricpp.committed_per_block,
                point.gain_per_block,
                point.arrival.committed_per_sec,
                point.fabricpp.committed_per_sec,
                point.gain_per_sec,
                point.fabricpp.aborted_in_simulation + point.fabricpp.aborted_in_orderer,
                point.fabricpp.schedule_median_us,
            );
        })?;
        results.insert("fabric", serde_json::to_value(&points)?);
    }
    if suites.contains("chain") {
        let options = chain::ChainBenchOptions {
            accounts: args.accounts,
            blocks: args.blocks,
            block_size: args.block_size,
            difficulty: args.difficulty.max(1),
            threads: args.threads,
            runs: args.runs,
            dir: args.dir.clone(),
            ..chain::ChainBenchOptions::default()
        };
        println!(
            "\nChain of signed transfers: {} accounts, {} blocks of {}, difficulty {}:",
            options.accounts, options.blocks, options.block_size, options.difficulty
        );
        let progress = ProgressBar::new(options.blocks as u64);
        progress.set_style(
            ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let report = chain::run(&options, |phase, done, total| {
            if args.acks && phase == "build" {
                println!("appended={done}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
            progress.set_prefix(phase.to_owned());
            progress.set_length(total);
            progress.set_position(done);
        })?;
        progress.finish_and_clear();
        println!(
            "  built:   {:.0} tx/s (staged execution, roots, {:.0} mining attempts per block, then checked like any appended block)",
            report.build_tps, report.mining_attempts_per_block
        );
        println!(
            "  verify:  serial {:.0} tx/s, parallel stages on {} threads {:.0} tx/s ({:.2}x); every signature recovered, every block re-executed",
            report.verify_serial_tps, report.threads, report.verify_staged_tps, report.staged_speedup
        );
        println!(
            "  chain:   {} transactions ({} invalid left out), head {}, state root {}",
            report.transactions, report.left_out_transactions, report.head_hash, report.state_root
        );
        if let Some(dir) = &report.dir {
            println!("  kept in {dir}: audit it with `virga verify --dir {dir}`");
        }
        results.insert("chain", serde_json::to_value(&report)?);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub(crate) struct BlockArgs {
    /// Chain directory.
    #[arg(long)]
    dir: PathBuf,
    /// Block number.
    #[arg(long)]
    number: u64,
}

/// Prints a block's header fields and every transaction with its receipt, as JSON. The receipts
/// come from re-executing the chain up to the block, so they are verified, not trusted.
pub(crate) fn show_block(args: &BlockArgs) -> Result<ExitCode> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().context("building the thread pool")?;
    let (block, verified) = match virga_ledger::chain::block_with_receipts(&args.dir, args.number, &pool) {
        Ok(found) => found,
        Err(error) => {
            eprintln!("virga block: {}: {error}", args.dir.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    let header = &block.header;
    let transactions: Vec<Value> = match &verified {
        None => Vec::new(),
        Some(verified) => block
            .transactions
            .iter()
            .zip(&verified.transactions)
            .zip(verified.outcome.receipts())
            .map(|((tx, recovered), receipt)| {
                json!({
                    "hash": tx.hash().to_string(),
                    "type": tx.tx_type(),
                    "from": recovered.sender().to_string(),
                    "to": tx.to().map(|to| to.to_string()),
                    "nonce": tx.nonce(),
                    "value": tx.value().to_string(),
                    "status": if receipt.success { "ok" } else { "reverted" },
                    "gas_used": receipt.gas_used,
                    "cumulative_gas_used": receipt.cumulative_gas_used,
                    "logs": receipt.logs.len(),
                })
            })
            .collect(),
    };
    let output = json!({
        "number": header.number,
        "hash": block.hash().to_string(),
        "parent_hash": header.parent_hash.to_string(),
        "timestamp": header.timestamp,
        "beneficiary": header.beneficiary.to_string(),
        "state_root": header.state_root.to_string(),
        "transactions_root": header.transactions_root.to_string(),
        "receipts_root": header.receipts_root.to_string(),
        "difficulty": header.difficulty.to_string(),
        "nonce": header.nonce.to_string(),
        "gas_used": header.gas_used,
        "base_fee_per_gas": header.base_fee_per_gas,
        "logs_bloom": header.logs_bloom.to_string(),
        "transactions": transactions,
    });
    println!("{output}");
    Ok(ExitCode::SUCCESS)
}
