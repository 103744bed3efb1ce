//! The command line end to end: real inputs give Ethereum's answers, bad inputs give a
//! clear error and a non-zero exit, never a panic.

use std::path::PathBuf;
use std::process::{Command, Output};

fn virga(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_virga")).args(args).output().expect("run virga")
}

fn testdata(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(path).display().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn state_root_of_mainnet_genesis() {
    let output = virga(&["state-root", &testdata("genesis/mainnet.json")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "0xd7f8974fb5ac78d9ac099b9ad5018bedc2ce0a72dad1827a1709da30580f0544");
}

#[test]
fn trie_test_passes_the_ethereum_vectors() {
    let output = virga(&["trie-test", &testdata("ethereum/trietest.json")]);
    assert!(output.status.success());
    let stdout = text(&output.stdout);
    assert!(stdout.lines().count() >= 5);
    assert!(stdout.lines().all(|l| l.starts_with("PASS ")), "{stdout}");
}

#[test]
fn trie_test_reports_a_wrong_root_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wrong.json");
    let zero_root = format!("0x{}", "00".repeat(32));
    std::fs::write(&file, format!(r#"{{"ok": {{"in": {{}}, "root": "0x56e81f171bcc55a6ff8345e692c0f86e5b48e01b996cadc001622fb5e363b421"}}, "bad": {{"in": [["a", "b"]], "root": "{zero_root}"}}}}"#)).unwrap();
    let output = virga(&["trie-test", file.to_str().unwrap()]);
    assert!(!output.status.success());
    let stdout = text(&output.stdout);
    assert!(stdout.contains("PASS ok"), "{stdout}");
    assert!(stdout.contains(&format!("FAIL bad: expected {zero_root}, got 0x")), "{stdout}");
}

#[test]
fn malformed_inputs_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "state-root",
            "genesis.json",
            r#"{"alloc": {"0x00000000000000000000000000000000000000aa": {"balance": "12x"}}}"#,
            "balance",
        ),
        ("state-root", "genesis.json", "{not json", "genesis.json"),
        ("trie-test", "cases.json", r#"{"c": {"in": [["a"]], "root": "0x00"}}"#, "in[0]"),
        ("trie-test", "cases.json", r#"{"c": {"in": {}, "root": "0x1234"}}"#, "32 bytes"),
        ("trie-test", "cases.json", "[1, 2]", "object"),
    ];
    for (command, name, content, expected) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, content).unwrap();
        let output = virga(&[command, file.to_str().unwrap()]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command} {content}: {stderr}");
        assert!(stderr.contains(expected), "{command} {content}: {stderr}");
        assert!(stderr.contains(name), "the error names the file: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let missing = virga(&["state-root", "/nonexistent/genesis.json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("/nonexistent/genesis.json"));
}

#[test]
fn demo_runs_small_and_reports() {
    let output = virga(&["demo", "--accounts", "2000", "--blocks", "3", "--transfers", "50"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for needle in ["accounts", "blocks with root", "proofs (verified)", "resident per account", "node bag"] {
        assert!(stdout.contains(needle), "missing {needle}: {stdout}");
    }
}

#[test]
fn bench_trie_writes_the_promised_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let output = virga(&[
        "bench",
        "trie",
        "--accounts",
        "3000",
        "--gets",
        "3000",
        "--blocks",
        "3",
        "--block-updates",
        "100",
        "--proofs",
        "300",
        "--transfers",
        "50",
        "--runs",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["accounts"], 3000);
    let results = report["results"].as_array().unwrap();
    for op in ["insert", "get", "block_with_root", "proof"] {
        let row = results.iter().find(|r| r["impl"] == "virga" && r["op"] == op).unwrap();
        assert!(row["ops_per_sec"].as_f64().unwrap() > 0.0, "{op}");
    }
    assert!(report["bytes_per_account"]["virga"].as_f64().is_some());
    assert_eq!(report["runs"], 2);
    assert!(report["keccak"]["address_ns"].as_f64().unwrap() > 0.0);
    // Every implementation measured built the same state (the benchmark refuses otherwise).
    let roots: Vec<_> = report["roots"].as_object().unwrap().values().collect();
    assert!(!roots.is_empty() && roots.windows(2).all(|w| w[0] == w[1]), "{roots:?}");
}

/// `virga up` with contract calls: the token calls commit (the report says how many, and
/// why the miner left any out), and the chain with its storage nodes passes `virga verify`.
#[test]
fn up_with_contract_calls_reports_them_and_the_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chain");
    let json = dir.path().join("up.json");
    let args = ["up", "--accounts", "3000", "--transfers", "600", "--contracts", "0.3", "--storage-nodes", "4"];
    let output = virga(&[&args[..], &["--dir", data.to_str().unwrap(), "--json", json.to_str().unwrap()]].concat());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["committed"], 600, "{report:#}");
    let calls = report["contract_calls"].as_u64().unwrap();
    assert!((100..=260).contains(&calls), "about 30% of 600 are token calls: {calls}");
    assert!(report["contract_calls_per_sec"].as_f64().unwrap() > 0.0);
    assert!(report["aborts_by_reason"].is_object());
    assert!(text(&output.stdout).contains("ERC-20 calls/s"), "{}", text(&output.stdout));
    let verified = virga(&["verify", "--dir", data.to_str().unwrap()]);
    assert!(verified.status.success(), "{}{}", text(&verified.stdout), text(&verified.stderr));
    assert!(text(&verified.stdout).starts_with("ok: "), "{}", text(&verified.stdout));
}

/// Each case: a command line with one option out of range, and the option it must name.
/// clap refuses them all before anything runs, with exit status 2.
#[test]
fn out_of_range_options_exit_2_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().display().to_string();
    let cases: &[(&[&str], &str)] = &[
        // These three used to panic, run one client, or run for no time.
        (&["up", "--accounts", "0"], "--accounts"),
        (&["up", "--clients", "0"], "--clients"),
        (&["up", "--duration", "0"], "--duration"),
        (&["up", "--accounts", "1"], "--accounts"),
        (&["up", "--rate=0"], "--rate"),
        (&["up", "--contracts", "1.5"], "--contracts"),
        (&["up", "--shards", "3"], "--shards"),
        (&["up", "-r", "65"], "--retention"),
        (&["up", "--batch", "0"], "--batch"),
        (&["up", "--transport", "udp"], "--transport"),
        (&["node", "init", "--dir", &dir, "--accounts", "1"], "--accounts"),
        (&["node", "init", "--dir", &dir, "--base-port", "0"], "--base-port"),
        (&["node", "init", "--dir", &dir, "--contracts", "1.5"], "--contracts"),
        (&["node", "init", "--dir", &dir, "--transfers", "0"], "--transfers"),
        (&["node", "--role", "client", "--dir", &dir, "--id", "c", "--in-flight", "0"], "--in-flight"),
        (&["demo", "--accounts", "1"], "--accounts"),
        (&["demo", "--blocks", "0"], "--blocks"),
        (&["bench", "trie", "--accounts", "0"], "--accounts"),
        (&["bench", "trie", "--runs", "0"], "--runs"),
        (&["bench", "kv", "--threads", "0"], "--threads"),
        (&["bench", "kv", "--duration", "0"], "--duration"),
        (&["bench", "kv", "--duration", "NaN"], "--duration"),
        (&["bench", "kv", "--zipf=-1"], "--zipf"),
        (&["bench", "kv", "--cc", "mvcc"], "--cc"),
        (&["bench", "clocks", "--zipf", "0.5,-1"], "--zipf"),
        (&["bench", "clocks", "--keys", "0"], "--keys"),
        (&["bench", "ledger", "--difficulty", "0"], "--difficulty"),
        (&["bench", "ledger", "--write-probabilities", "0.5,1.5"], "--write-probabilities"),
        (&["bench", "rainblock", "--accounts", "1000,1"], "--accounts"),
        (&["bench", "rainblock", "--fig", "10"], "--fig"),
        (&["bench", "evm", "--executors", "virga,evmone"], "--executors"),
        (&["verify", "--dir", &dir, "--threads", "0"], "--threads"),
        (&["schedule", "--input", &dir, "--scheduler", "fifo"], "--scheduler"),
    ];
    for (args, option) in cases {
        let output = virga(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(option), "{args:?} must name {option}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_client_index_past_the_client_count_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().display().to_string();
    let output = virga(&["node", "--role", "client", "--dir", &dir, "--id", "c", "--clients", "2", "--index", "2"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("--index 2 must be below --clients 2"), "{}", text(&output.stderr));
}

#[test]
fn option_names_have_their_aliases() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("block.json");
    std::fs::write(&input, r#"{"txs": [{"id": "T0", "reads": ["a"], "writes": ["b"]}]}"#).unwrap();
    for scheduler in ["fabricpp", "fabric++", "arrival"] {
        let output = virga(&["schedule", "--input", input.to_str().unwrap(), "--scheduler", scheduler]);
        assert!(output.status.success(), "{scheduler}: {}", text(&output.stderr));
    }
}

/// Files of the Ethereum test suite write zero header fields as empty hex (`"0x"`). The state
/// root reads `alloc` only, so they must not stop it; a malformed `alloc` still does.
#[test]
fn state_root_ignores_empty_hex_header_fields() {
    let source = std::fs::read_to_string(testdata("genesis/bc_initcollision_pre.json")).unwrap();
    let mut genesis: serde_json::Value = serde_json::from_str(&source).unwrap();
    for field in ["timestamp", "nonce", "gasLimit", "difficulty", "gasUsed", "number", "extraData", "mixHash"] {
        genesis[field] = "0x".into();
    }
    let roots: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(testdata("genesis/roots.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty_hex.json");
    std::fs::write(&file, genesis.to_string()).unwrap();
    let output = virga(&["state-root", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), roots["bc_initcollision_pre.json"]);

    let alloc = genesis["alloc"].as_object_mut().unwrap();
    let (_, account) = alloc.iter_mut().next().unwrap();
    account["nonce"] = "0x".into();
    std::fs::write(&file, genesis.to_string()).unwrap();
    let output = virga(&["state-root", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(r#"nonce "0x" is not a decimal or 0x-hex number"#),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn kairos_lease_prints_the_ideal_lease_and_its_rates() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lease.json");
    let args = ["kairos", "lease", "--read-interval-ms", "1", "--write-interval-ms", "19", "--json"];
    let output = virga(&[&args[..], &[file.to_str().unwrap()]].concat());
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("ideal lease: 6.000 ms"), "{}", text(&output.stdout));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(report["lease_ms"], 6.0);
    let fresh = report["fresh_hit_rate"].as_f64().unwrap();
    let stale = report["stale_rate"].as_f64().unwrap();
    assert!((fresh - 0.735).abs() < 0.001 && (stale - 0.122).abs() < 0.001, "{report}");
    let bad = virga(&["kairos", "lease", "--read-interval-ms", "-1", "--write-interval-ms", "19"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("--read-interval-ms"), "{}", text(&bad.stderr));
}
