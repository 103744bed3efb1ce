//! The ledger from the command line: `virga schedule` reproduces the thesis's examples and
//! names malformed input; a chain built by `virga bench ledger --dir` passes `virga verify`,
//! any flipped byte of its blocks or state is caught with the block named, and a build
//! killed with SIGKILL keeps every acknowledged block.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

fn virga(args: &[&str]) -> Output {
    Command::new(VIRGA).args(args).output().expect("run virga")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn schedule(dir: &Path, name: &str, block: &Value, scheduler: &str) -> Value {
    let path = dir.join(name);
    std::fs::write(&path, block.to_string()).unwrap();
    let output = virga(&["schedule", "--input", path.to_str().unwrap(), "--scheduler", scheduler]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn aborted(result: &Value) -> Vec<(String, String)> {
    result["aborted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["id"].as_str().unwrap().to_owned(), a["reason"].as_str().unwrap().to_owned()))
        .collect()
}

fn ids(result: &Value) -> Vec<&str> {
    result["order"].as_array().unwrap().iter().map(|id| id.as_str().unwrap()).collect()
}

#[test]
fn schedule_reproduces_the_thesis_examples() {
    let dir = tempfile::tempdir().unwrap();
    // Seed 002, Table 3.3: six transactions over keys K0..K9.
    let table_3_3 = json!({"txs": [
        {"id": "T0", "reads": ["K0", "K1"], "writes": ["K2"]},
        {"id": "T1", "reads": ["K3", "K4", "K5"], "writes": ["K0"]},
        {"id": "T2", "reads": ["K6", "K7"], "writes": ["K3", "K9"]},
        {"id": "T3", "reads": ["K2", "K8"], "writes": ["K1", "K4"]},
        {"id": "T4", "reads": ["K9"], "writes": ["K5", "K6", "K8"]},
        {"id": "T5", "reads": [], "writes": ["K7"]},
    ]});
    let result = schedule(dir.path(), "table-3-3.json", &table_3_3, "fabricpp");
    assert_eq!(ids(&result), ["T5", "T1", "T3", "T4"]);
    assert_eq!(
        aborted(&result),
        [("T0".to_owned(), "conflict_cycle".to_owned()), ("T2".to_owned(), "conflict_cycle".to_owned())]
    );
    assert_eq!(result["stats"]["cycles"], 3);

    // Tables 3.1 and 3.2: arrival order keeps one transaction, a reordering keeps all four.
    let table_3_1 = json!({"txs": [
        {"id": "T1", "reads": [], "writes": ["k1"]},
        {"id": "T2", "reads": ["k1", "k2"], "writes": ["k2"]},
        {"id": "T3", "reads": ["k1", "k3"], "writes": ["k3"]},
        {"id": "T4", "reads": ["k1", "k3"], "writes": ["k4"]},
    ]});
    let arrival = schedule(dir.path(), "table-3-1.json", &table_3_1, "arrival");
    assert_eq!(ids(&arrival), ["T1"]);
    assert!(aborted(&arrival).iter().all(|(_, reason)| reason == "reads_earlier_write"));
    let reordered = schedule(dir.path(), "table-3-1.json", &table_3_1, "fabricpp");
    let order = ids(&reordered);
    assert_eq!(order.len(), 4, "{reordered}");
    assert_eq!(order.last(), Some(&"T1"), "the writer of k1 goes last: {reordered}");

    // Early abort: a read newer than the snapshot, and two reads of different versions.
    let early = json!({"txs": [
        {"id": "A", "reads": ["x"], "writes": ["y"], "read_versions": {"x": [5, 0]}, "snapshot": 4},
        {"id": "B", "reads": ["z"], "writes": [], "read_versions": {"z": 3}, "snapshot": 4},
        {"id": "C", "reads": ["z"], "writes": [], "read_versions": [[4, 2]], "snapshot": 4},
    ]});
    let result = schedule(dir.path(), "early.json", &early, "fabricpp");
    assert_eq!(ids(&result), ["C"]);
    assert_eq!(
        aborted(&result),
        [("A".to_owned(), "stale_read".to_owned()), ("B".to_owned(), "version_mismatch".to_owned())]
    );
}

#[test]
fn schedule_names_what_is_wrong_with_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        ("{\"txs\": [", "not valid JSON"),
        ("{\"transactions\": []}", "\"txs\" list"),
        ("{\"txs\": [{\"id\": \"a\"}, {\"id\": \"a\"}]}", "appears twice"),
        ("{\"txs\": [{\"id\": \"a\", \"reads\": [1]}]}", "reads must hold strings"),
        ("{\"txs\": [{\"id\": \"a\", \"reads\": [\"k\"], \"read_versions\": {\"q\": 1}}]}", "does not read"),
        ("{\"txs\": [{\"id\": \"a\", \"reads\": [\"k\"], \"read_versions\": {\"k\": -1}}]}", "non-negative integer"),
        ("{\"txs\": [{\"reads\": []}]}", "has no \"id\""),
    ];
    for (index, (body, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{index}.json"));
        std::fs::write(&path, body).unwrap();
        let output = virga(&["schedule", "--input", path.to_str().unwrap()]);
        assert!(!output.status.success(), "{body}");
        assert!(text(&output.stderr).contains(expected), "{body}: {}", text(&output.stderr));
    }
    let output = virga(&["schedule", "--input", "/nonexistent/block.json"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("/nonexistent/block.json"));
}

fn build_chain(dir: &Path) {
    let dir = dir.to_str().unwrap();
    let output = virga(&[
        "bench",
        "ledger",
        "--suite",
        "chain",
        "--dir",
        dir,
        "--accounts",
        "64",
        "--blocks",
        "6",
        "--block-size",
        "40",
        "--difficulty",
        "64",
        "--runs",
        "1",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("verify:") && stdout.contains("tx/s"), "{stdout}");
}

fn verify(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["verify", "--dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    virga(&args)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_built_chain_verifies_and_every_flipped_byte_is_caught() {
    let root = tempfile::tempdir().unwrap();
    let chain = root.path().join("chain");
    build_chain(&chain);
    let output = verify(&chain, &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let summary = text(&output.stdout);
    assert!(summary.starts_with("ok: 7 blocks, "), "{summary}");
    let count: u64 = summary.split(", ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap().parse().unwrap();
    assert!((230..240).contains(&count), "one transfer in a hundred is left out: {summary}");
    let serial = verify(&chain, &["--serial"]);
    assert!(serial.status.success(), "{}", text(&serial.stderr));

    // Every block's receipts, re-executed: the transfers each block kept, all successful;
    // they add up to the audit's count.
    let mut included = 0;
    for number in 1..=6u64 {
        let output = virga(&["block", "--dir", chain.to_str().unwrap(), "--number", &number.to_string()]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let block: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(block["number"], number);
        assert_eq!(block["base_fee_per_gas"], 1);
        let transactions = block["transactions"].as_array().unwrap();
        assert!(transactions.len() <= 40);
        for tx in transactions {
            assert_eq!(tx["status"], "ok", "{tx}");
            assert_eq!(tx["gas_used"], 21_000, "{tx}");
        }
        included += transactions.len() as u64;
    }
    assert_eq!(included, count, "{summary}");
    let missing = virga(&["block", "--dir", chain.to_str().unwrap(), "--number", "7"]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("block 7 is not in the chain"), "{}", text(&missing.stderr));

    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut flips = 0;
    for file in files_under(&chain) {
        let relative = file.strip_prefix(&chain).unwrap().to_path_buf();
        let bytes = std::fs::read(&file).unwrap();
        if bytes.is_empty() {
            continue;
        }
        // Every file: its first and last byte and a dozen in between.
        let mut positions = vec![0, bytes.len() - 1];
        positions.extend((0..12).map(|_| rng.random_range(0..bytes.len())));
        for position in positions {
            let tampered = root.path().join(format!("tampered-{flips}"));
            copy_tree(&chain, &tampered);
            let mut changed = bytes.clone();
            changed[position] ^= 1 << rng.random_range(0..8);
            std::fs::write(tampered.join(&relative), &changed).unwrap();
            let output = verify(&tampered, &[]);
            let stderr = text(&output.stderr);
            assert!(
                !output.status.success(),
                "flipping byte {position} of {} went unnoticed: {}",
                relative.display(),
                text(&output.stdout)
            );
            let named = ["block ", "genesis", "state store", "chain format"].iter().any(|name| stderr.contains(name));
            assert!(named, "{} byte {position}: {stderr}", relative.display());
            std::fs::remove_dir_all(&tampered).unwrap();
            flips += 1;
        }
    }
    assert!(flips >= 40, "only {flips} flips");
}

/// Damage inside the state store's log (not a torn tail) is named by the chain's own file,
/// the block from which the state is lost, and the remedy; `--repair` then rebuilds the
/// state store from the blocks, and the chain verifies again.
#[test]
fn a_damaged_state_store_is_named_by_its_own_file_and_block_and_repair_rebuilds_it() {
    let root = tempfile::tempdir().unwrap();
    let chain = root.path().join("chain");
    build_chain(&chain);
    let wal = chain.join("state").join("wal");
    let segment = files_under(&wal).pop().unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();

    let output = verify(&chain, &[]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{}", text(&output.stdout));
    assert!(stderr.contains(&segment.display().to_string()), "names the chain's own file: {stderr}");
    assert!(stderr.contains("damaged from the state of block "), "names the block: {stderr}");
    assert!(stderr.contains("--repair` rebuilds the state store"), "names the remedy: {stderr}");

    let repaired = verify(&chain, &["--repair"]);
    assert!(repaired.status.success(), "{}", text(&repaired.stderr));
    let again = verify(&chain, &[]);
    assert!(again.status.success(), "{}", text(&again.stderr));
}

#[test]
fn a_build_killed_with_sigkill_keeps_every_acknowledged_block() {
    let root = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    for round in 0..4 {
        let chain = root.path().join(format!("chain-{round}"));
        let mut child = Command::new(VIRGA)
            .args([
                "bench",
                "ledger",
                "--suite",
                "chain",
                "--dir",
                chain.to_str().unwrap(),
                "--accounts",
                "32",
                "--blocks",
                "100000",
                "--block-size",
                "20",
                "--difficulty",
                "16",
                "--acks",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let target = rng.random_range(3..40u64);
        let mut acknowledged = 0u64;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(number) = line.strip_prefix("appended=") {
                acknowledged = number.parse().unwrap();
                if acknowledged >= target {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(acknowledged >= target, "round {round}: the build stopped early");
        let output = verify(&chain, &["--repair"]);
        assert!(output.status.success(), "round {round}: {}", text(&output.stderr));
        let summary = text(&output.stdout);
        let blocks: u64 = summary
            .strip_prefix("ok: ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|count| count.parse().ok())
            .unwrap_or_else(|| panic!("round {round}: {summary}"));
        assert!(blocks > acknowledged, "round {round}: {blocks} blocks (with genesis) but {acknowledged} acknowledged");
        // A second audit, without repair, finds nothing to repair.
        let again = verify(&chain, &[]);
        assert!(again.status.success(), "round {round}: {}", text(&again.stderr));
    }
}
