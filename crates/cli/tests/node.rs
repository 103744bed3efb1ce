//! RainBlock's roles as separate processes over gRPC on loopback (`virga node`), with a
//! storage node and the miner killed (SIGKILL) and restarted mid-run: every transfer still
//! commits, and the directory then passes `virga verify` (chain from genesis, every storage
//! node's log replayed to the head's root). `virga node ping` finds every role up (health
//! protocol, served beside RainBlock), and none once they have stopped.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{free_ports, stop};

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

fn role(dir: &Path, role: &str, id: &str) -> Child {
    let log = File::options().create(true).append(true).open(dir.join(format!("{id}.stderr"))).unwrap();
    Command::new(VIRGA)
        .args(["node", "--role", role, "--dir", dir.to_str().unwrap(), "--id", id])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Waits until `id`'s stderr says it is serving (its log replayed, or its top layer filled).
fn wait_ready(dir: &Path, id: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(dir.join(format!("{id}.stderr"))).unwrap_or_default();
        let ready = text.matches(": serving shards at ").count() + text.matches(": mining at ").count();
        if ready >= times {
            return;
        }
        assert!(Instant::now() < deadline, "{id} did not become ready:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until storage node `id` has logged at least `blocks` blocks: read-only, so a
/// torn record being written now is not counted. (A fixed sleep was not enough on a slow
/// machine: the node was killed before the first block reached it.)
fn wait_logged(dir: &Path, id: &str, blocks: usize) {
    let log = virga_node::storage::log_path(dir, id);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let logged = virga_log::read_all(&log, virga_node::storage::log_options()).map_or(0, |read| read.len());
        if logged >= blocks {
            return;
        }
        assert!(Instant::now() < deadline, "{id} logged {logged} of {blocks} blocks in time");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `virga node ping` of every role of the cluster in `dir`.
fn ping_all(dir: &Path) -> std::process::Output {
    Command::new(VIRGA)
        .args(["node", "ping", "--dir", dir.to_str().unwrap(), "--deadline-ms", "5000"])
        .output()
        .unwrap()
}

#[test]
fn a_cluster_of_processes_survives_sigkill_of_a_storage_node_and_the_miner() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("cluster");
    let base = free_ports(3);
    let init = Command::new(VIRGA)
        .args(["node", "init", "--dir", dir.to_str().unwrap(), "--accounts", "3000", "--storage-nodes", "2"])
        .args(["--block-transfers", "400", "-r", "2", "-c", "3", "--base-port", &base.to_string()])
        .args(["--contracts", "0.15", "--transfers", "6000"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));

    let mut storage0 = Some(role(&dir, "storage", "storage-0"));
    let mut storage1 = role(&dir, "storage", "storage-1");
    wait_ready(&dir, "storage-0", 1);
    wait_ready(&dir, "storage-1", 1);
    let mut miner = role(&dir, "miner", "miner-0");
    wait_ready(&dir, "miner-0", 1);

    let client_log = File::create(dir.join("client-0.stderr")).unwrap();
    let client = Command::new(VIRGA)
        .args(["node", "--role", "client", "--dir", dir.to_str().unwrap(), "--id", "client-0"])
        .args(["--transfers", "6000", "--rate", "1000", "--in-flight", "4", "--batch", "100", "--duration", "150"])
        .stdout(Stdio::piped())
        .stderr(client_log)
        .spawn()
        .unwrap();

    // A storage node dies mid-run and comes back from its log; the miner's block waits for it.
    wait_logged(&dir, "storage-1", 2);
    storage1.kill().unwrap();
    storage1.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    storage1 = role(&dir, "storage", "storage-1");
    wait_ready(&dir, "storage-1", 2);

    // Then the miner dies and comes back from its chain, refilling its top layer.
    std::thread::sleep(Duration::from_millis(1500));
    miner.kill().unwrap();
    miner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    miner = role(&dir, "miner", "miner-0");
    wait_ready(&dir, "miner-0", 2);

    // Every role hosts the health protocol beside RainBlock on its one gRPC server.
    let ping = ping_all(&dir);
    assert!(ping.status.success(), "{}", String::from_utf8_lossy(&ping.stdout));
    let answers = String::from_utf8_lossy(&ping.stdout).to_string();
    for (peer, role) in [("storage-0", "storage"), ("storage-1", "storage"), ("miner-0", "miner")] {
        assert!(answers.contains(&format!("up: {peer} ({role}), virga ")), "{answers}");
    }
    assert!(answers.contains("3 of 3 peers answered"), "{answers}");

    let output = client.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout).to_string();
    let client_log = std::fs::read_to_string(dir.join("client-0.stderr")).unwrap_or_default();
    assert!(output.status.success(), "the client did not see every transfer commit: {report}\n{client_log}");
    assert!(report.contains("committed 6000 of 6000"), "{report}");
    // About 15% of them call the token, through the restarts too (the miner's warm-up
    // brings the token's storage top back, and the clients' slot bags are compacted).
    let calls: u64 = report
        .split_once(" token calls)")
        .and_then(|(before, _)| before.rsplit_once('(').map(|(_, count)| count.trim().to_string()))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no token calls in the report: {report}"));
    assert!((600..=1_200).contains(&calls), "{calls} token calls of 6000: {report}");

    stop(miner);
    stop(storage1);
    stop(storage0.take().unwrap());

    let ping = ping_all(&dir);
    assert!(!ping.status.success(), "pings of stopped roles failed");
    assert!(String::from_utf8_lossy(&ping.stdout).contains("0 of 3 peers answered"));

    let storage1_log = std::fs::read_to_string(dir.join("storage-1.stderr")).unwrap();
    let replayed_on_restart = storage1_log.lines().filter(|line| line.contains("serving shards")).nth(1).unwrap();
    assert!(!replayed_on_restart.contains("(0 blocks replayed"), "the restarted node replayed nothing: {storage1_log}");

    let verify = Command::new(VIRGA).args(["verify", "--dir", dir.to_str().unwrap()]).output().unwrap();
    let verdict = String::from_utf8_lossy(&verify.stdout).to_string() + &String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "{verdict}");
    assert!(verdict.contains("6000 transactions"), "every transfer is in the chain exactly once: {verdict}");
    assert!(verdict.contains("agree with the head's root"), "{verdict}");
}
