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
    // Every implementation measured built the same state.
    let roots = report["roots"].as_object().unwrap();
    let ethereum_roots: Vec<_> =
        roots.iter().filter(|(name, _)| name.as_str() != "trie_db").map(|(_, r)| r.clone()).collect();
    assert!(ethereum_roots.windows(2).all(|w| w[0] == w[1]), "{roots:?}");
}
