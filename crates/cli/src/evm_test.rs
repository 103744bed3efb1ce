//! `virga evm-test`: Ethereum's GeneralStateTests through Virga's executor.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use virga_evm::statetest::{run_file, Tally};
use virga_evm::Fork;

#[derive(Args)]
pub(crate) struct EvmTestArgs {
    /// GeneralStateTests files, or directories searched for `*.json` files.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Runs only this fork's cases (Berlin, London, Paris, Shanghai, Cancun, Prague).
    #[arg(long, value_parser = parse_fork)]
    fork: Option<Fork>,
    /// Prints only failures and the totals.
    #[arg(long)]
    quiet: bool,
}

fn parse_fork(name: &str) -> Result<Fork, String> {
    Fork::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Fork::ALL.iter().map(|fork| fork.name()).collect();
        format!("unknown fork {name:?}; Virga executes {}", known.join(", "))
    })
}

/// One line per case (`PASS`, `FAIL … expected …, got …`, `SKIP … reason`), the totals on
/// standard error; fails if any case or file failed.
pub(crate) fn run(args: &EvmTestArgs) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for path in &args.paths {
        collect_json_files(path, &mut files)?;
    }
    let mut tally = Tally::default();
    let mut broken_files = 0;
    for file in &files {
        match run_file(file, args.fork) {
            Ok(results) => {
                for result in &results {
                    tally.add(result);
                    if !args.quiet || tally_failed(result) {
                        println!("{result}");
                    }
                }
            }
            Err(error) => {
                broken_files += 1;
                println!("FAIL {}: {error}", file.display());
            }
        }
    }
    eprintln!(
        "{} passed, {} failed, {} skipped in {} file(s){}",
        tally.passed,
        tally.failed,
        tally.skipped,
        files.len(),
        if broken_files > 0 { format!("; {broken_files} file(s) could not be run") } else { String::new() }
    );
    Ok(if tally.failed == 0 && broken_files == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn tally_failed(result: &virga_evm::statetest::CaseResult) -> bool {
    matches!(result.verdict, virga_evm::statetest::Verdict::Fail(_))
}

fn collect_json_files(path: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if !path.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|error| anyhow::anyhow!("cannot list {}: {error}", path.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_json_files(&entry, files)?;
        } else if entry.extension().is_some_and(|ext| ext == "json") {
            files.push(entry);
        }
    }
    Ok(())
}
