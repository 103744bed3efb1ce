//! `virga bench dkv`: without etcd, `--peers` refuses before measuring anything and names the
//! package to install; a tiny transfer run measures both systems and audits the store's money.

use std::process::Command;

use crate::support::text;

#[test]
fn bench_dkv_peers_without_etcd_names_the_package_to_install() {
    let empty = tempfile::tempdir().unwrap();
    let json = empty.path().join("dkv.json");
    let output = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "dkv", "--peers", "--records", "16", "--duration", "0.2", "--runs", "1", "--clients", "1"])
        .arg("--json")
        .arg(&json)
        .env("PATH", empty.path())
        .output()
        .expect("run virga");
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "exited {:?}: {stderr}", output.status);
    assert!(stderr.contains("apt-get install etcd-server"), "{stderr}");
    assert!(!stderr.contains("run 1:"), "it measured before refusing: {stderr}");
    assert!(!json.exists());
}

#[test]
fn bench_dkv_runs_transfers_on_the_store_and_the_engine_and_audits_the_money() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("dkv.json");
    let output = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "dkv", "--workload", "transfer", "--records", "64", "--duration", "0.3", "--runs", "1"])
        .args(["--clients", "2", "--shards", "2"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run virga");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "exited {:?}: {stderr}", output.status);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["workload"], "transfer");
    assert_eq!(report["money_conserved"], true, "{report}");
    assert!(report["committed_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["single_node_committed_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["abort_rate"].as_f64().is_some(), "{report}");
    // etcd runs ycsb-t only: asked for another workload it refuses before measuring.
    let refused = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "dkv", "--peers", "--workload", "retwis", "--duration", "0.2", "--runs", "1"])
        .output()
        .expect("run virga");
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("ycsb-t only"), "{}", text(&refused.stderr));
}
