//! `virga bench dkv --peers` on a machine without etcd: it refuses before measuring anything
//! and names the package to install. (The benchmark itself never runs in the test suite.)

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
