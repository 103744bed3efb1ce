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

#[test]
fn bench_kairos_runs_every_mode_and_writes_its_rates() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("kairos.json");
    let output = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "kairos", "--modes", "none,lease,ei", "--records", "2000", "--duration", "0.3", "--runs", "1"])
        .args(["--clients", "2", "--cache-fraction", "0.005", "--validators", "2"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run virga");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "exited {:?}: {stderr}", output.status);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes = report["modes"].as_array().unwrap();
    let names: Vec<(&str, u64)> =
        modes.iter().map(|mode| (mode["mode"].as_str().unwrap(), mode["validators"].as_u64().unwrap())).collect();
    assert_eq!(names, [("none", 0), ("lease", 0), ("ei", 0), ("none", 2), ("lease", 2), ("ei", 2)]);
    // With validators, read-only transactions leave the primaries: fewer messages there, and
    // the validators get theirs.
    for (alone, with) in modes[..3].iter().zip(&modes[3..]) {
        let primaries = |mode: &serde_json::Value| mode["server_messages_per_txn"].as_f64().unwrap();
        assert!(primaries(with) < primaries(alone), "{alone}\n{with}");
        assert!(with["validator_messages_per_txn"].as_f64().unwrap() > 0.5, "{with}");
        assert_eq!(alone["validator_messages_per_txn"].as_f64(), Some(0.0), "{alone}");
    }
    for mode in modes {
        assert!(mode["committed_per_sec"].as_f64().unwrap() > 0.0, "{mode}");
        assert!(mode["server_messages_per_txn"].as_f64().unwrap() > 0.5, "{mode}");
        for rate in ["fresh_hit_rate", "stale_rate"] {
            assert!((0.0..=1.0).contains(&mode[rate].as_f64().unwrap()), "{rate}: {mode}");
        }
    }
    assert_eq!(modes[0]["runs"][0]["cache_reads"], 0, "no caching reads nothing from a cache");
    assert!(modes[1]["runs"][0]["cache_reads"].as_u64().unwrap() > 0, "{}", modes[1]);
    let bad = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "kairos", "--modes", "none,lru", "--json", "x.json"])
        .output()
        .expect("run virga");
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("\"lru\""), "{}", text(&bad.stderr));
    let sweep = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["bench", "kairos", "--figure", "load", "--validators", "2", "--json", "x.json"])
        .output()
        .expect("run virga");
    assert_eq!(sweep.status.code(), Some(2));
    assert!(text(&sweep.stderr).contains("--validators"), "{}", text(&sweep.stderr));
}
