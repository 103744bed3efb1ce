//! The store with every role a process of its own (`virga kv cluster init` and `node`):
//! during transfers through the API server, SIGKILL the primary of a shard (a backup takes
//! over through the configuration service), a backup of another shard, and the API server
//! (its client core: the primaries terminate what it left prepared); after each restart the
//! transfers resume, nothing acknowledged is lost, the money adds up, and once stopped every
//! replica of every shard's group holds the same state (`virga kv audit`). Every role and
//! client speaks mutual TLS, and the shell without the cluster's certificate is refused.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rand::Rng;
use virga_dkv::api::grpc::RemoteKv;
use virga_dkv::api::{Kv, KvError};
use virga_dkv::deploy::{initial_map, ClusterShape};
use virga_dkv::kairos::validator::validator_of;

use crate::kv_money::{audit, offline_audit, open_accounts, transfer, ACCOUNTS, INITIAL};
use crate::support::text;

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

fn tls_file(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tls").join(name).display().to_string()
}

/// The options giving a process certificate `cert` (`node`: the cluster's CA's; `stranger`:
/// another CA's).
fn tls_args(cert: &str) -> Vec<String> {
    let (cert, key) = (tls_file(&format!("{cert}.pem")), tls_file(&format!("{cert}-key.pem")));
    ["--tls-cert".to_string(), cert, "--tls-key".to_string(), key, "--tls-ca".to_string(), tls_file("ca.pem")].into()
}

fn connect(address: &str, wait: Duration) -> Kv<RemoteKv> {
    let tls = virga_net::Tls::load(
        Path::new(&tls_file("node.pem")),
        Path::new(&tls_file("node-key.pem")),
        Path::new(&tls_file("ca.pem")),
    )
    .unwrap();
    Kv::new(RemoteKv::connect_tls(address, wait, &tls).unwrap())
}

/// `virga kv --addr address get acct-0` with `extra` options: its exit status and stderr.
fn shell_get(address: &str, extra: &[String]) -> (Option<i32>, String) {
    let output =
        Command::new(VIRGA).args(["kv", "--addr", address]).args(extra).args(["get", "acct-0"]).output().unwrap();
    (output.status.code(), text(&output.stderr))
}

fn shape() -> ClusterShape {
    ClusterShape { shards: 3, replicas: 3, data_nodes: 4, validators: 0 }
}

/// A base port with the next `count` ports free on loopback, below Linux's ephemeral range
/// (32768 and up), so no outgoing connection takes a stopped role's port.
fn free_ports(count: u16) -> u16 {
    let mut rng = rand::rng();
    loop {
        let base = rng.random_range(12_000..32_000);
        let free = (base..base + count).all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        if free {
            return base;
        }
    }
}

/// Starts role `id` and waits for its `serving on` line (its stderr goes to `id.stderr`).
fn start(dir: &Path, id: &str) -> Child {
    let log = dir.join(format!("{id}.stderr"));
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
    let mut child = Command::new(VIRGA)
        .args(["kv", "cluster", "node", "--dir", &dir.display().to_string(), "--id", id])
        .args(tls_args("node"))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start a role");
    let stdout = child.stdout.take().unwrap();
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains("serving on") => return child,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{id} did not start: {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
        }
    }
}

/// A role's process, killed and reaped if the test ends (or fails) while it runs.
struct RoleProcess(Child);

impl Drop for RoleProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn terminate(child: &mut Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success(), "a role stops cleanly on SIGTERM");
}

/// Transfers until `stop`, through every fault (an error means "try the next one"); the
/// marks of those acknowledged, with when.
async fn keep_transferring(address: String, client: usize, stop: Arc<AtomicBool>) -> Vec<(Instant, String)> {
    let kv = connect(&address, Duration::from_secs(20));
    let mut acknowledged = Vec::new();
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (from, to) = ((client + n) % ACCOUNTS, (client + 3 * n + 1) % ACCOUNTS);
        let mark = format!("mark/{client}/{n}");
        match transfer(&kv, from, to, mark.clone()).await {
            Ok(()) => acknowledged.push((Instant::now(), mark)),
            Err(KvError::Aborted { .. }) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    acknowledged
}

/// Collects the stopped transfer clients' acknowledgements and checks them: some came after
/// `since` (the last restart), the money adds up, and every acknowledged transfer is there.
/// Returns them, each with when it was acknowledged.
fn audit_transfers(
    runtime: &tokio::runtime::Runtime,
    address: &str,
    clients: Vec<tokio::task::JoinHandle<Vec<(Instant, String)>>>,
    since: Instant,
) -> Vec<(Instant, String)> {
    let acknowledged: Vec<(Instant, String)> =
        clients.into_iter().flat_map(|client| runtime.block_on(client).unwrap()).collect();
    let after = acknowledged.iter().filter(|(at, _)| *at > since).count();
    assert!(after > 0, "transfers resumed after the last restart ({} in all)", acknowledged.len());
    let marks: Vec<String> = acknowledged.iter().map(|(_, mark)| mark.clone()).collect();
    let (total, missing) = runtime.block_on(async { audit(&connect(address, Duration::from_secs(30)), &marks).await });
    assert_eq!(total, INITIAL * ACCOUNTS as u64, "money is conserved");
    assert!(missing.is_empty(), "acknowledged transfers lost: {missing:?}");
    acknowledged
}

/// The keys the transfer that wrote `mark` ("mark/CLIENT/N", as `keep_transferring` names
/// it) read and wrote.
fn transfer_keys(mark: &str) -> Vec<Vec<u8>> {
    let numbers: Vec<usize> = mark.split('/').skip(1).filter_map(|part| part.parse().ok()).collect();
    let [client, n] = numbers[..] else { panic!("not a transfer's mark: {mark}") };
    let (from, to) = ((client + n) % ACCOUNTS, (client + 3 * n + 1) % ACCOUNTS);
    vec![format!("acct-{from}").into_bytes(), format!("acct-{to}").into_bytes(), mark.as_bytes().to_vec()]
}

#[test]
fn roles_killed_one_by_one_during_transfers_lose_nothing_and_the_replicas_agree() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    let base = free_ports(8);
    let init = Command::new(VIRGA)
        .args(["kv", "cluster", "init", "--dir", &dir_arg, "--shards", "3", "--replicas", "3", "--data-nodes", "4"])
        .args(["--base-port", &base.to_string()])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init.stderr));
    let names = ["config-1", "config-2", "config-3", "data-0", "data-1", "data-2", "data-3", "api"];
    let mut roles: Vec<(&str, RoleProcess)> =
        names.iter().map(|name| (*name, RoleProcess(start(dir.path(), name)))).collect();
    let address = format!("http://127.0.0.1:{}", base + 7);
    let map = initial_map(&shape()).unwrap();
    let primary = map.groups()[0].primary.clone();
    let backup = map.groups()[1].backups.iter().find(|node| **node != primary).unwrap().clone();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async { open_accounts(&connect(&address, Duration::from_secs(30))).await });
    // The shell reads with the cluster's certificate, and is refused without it.
    let (status, stderr) = shell_get(&address, &tls_args("node"));
    assert_eq!(status, Some(0), "{stderr}");
    for refused in [tls_args("stranger"), Vec::new()] {
        let (status, stderr) = shell_get(&address, &refused);
        assert_eq!(status, Some(2), "{refused:?}: {stderr}");
        assert!(stderr.contains("error:"), "{stderr}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> =
        (0..4).map(|client| runtime.spawn(keep_transferring(address.clone(), client, Arc::clone(&stop)))).collect();

    let restart = |name: &str, down: Duration, roles: &mut Vec<(&str, RoleProcess)>| {
        let position = roles.iter().position(|(role, _)| *role == name).unwrap();
        kill(&mut roles[position].1 .0);
        std::thread::sleep(down);
        roles[position].1 = RoleProcess(start(dir.path(), name));
        Instant::now()
    };
    std::thread::sleep(Duration::from_millis(1500));
    restart(&primary, Duration::from_secs(3), &mut roles);
    std::thread::sleep(Duration::from_millis(1500));
    restart(&backup, Duration::from_millis(500), &mut roles);
    std::thread::sleep(Duration::from_millis(1000));
    let api_back = restart("api", Duration::from_millis(200), &mut roles);
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    audit_transfers(&runtime, &address, clients, api_back);

    // Stopped once the backups caught up: the replicas of each shard's group agree, and the
    // accounts hold the exact total.
    std::thread::sleep(Duration::from_secs(1));
    for (_, role) in roles.iter_mut().rev() {
        terminate(&mut role.0);
    }
    let report = offline_audit(dir.path());
    assert!(report["map_version"].as_u64().unwrap() >= 2, "shard 0 failed over: {report}");
    let departed: Vec<&serde_json::Value> =
        report["replicas"].as_array().unwrap().iter().filter(|replica| replica["member"] == false).collect();
    assert!(
        departed.iter().any(|replica| replica["node"] == primary.as_str() && replica["shard"] == 0),
        "the killed primary left shard 0's group: {report}"
    );
}

/// KAIROS's validators as processes: SIGKILL one during transfers (which validate there
/// before they prepare at the primaries). It comes back above its old lease, the transfers
/// go on, and nothing acknowledged is lost.
#[test]
fn a_validator_killed_during_transfers_is_taken_over_by_the_primaries_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    let base = free_ports(10);
    let init = Command::new(VIRGA)
        .args(["kv", "cluster", "init", "--dir", &dir_arg, "--shards", "3", "--replicas", "3", "--data-nodes", "4"])
        .args(["--validators", "2", "--base-port", &base.to_string()])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init.stderr));
    let names = [
        "config-1",
        "config-2",
        "config-3",
        "data-0",
        "data-1",
        "data-2",
        "data-3",
        "validator-0",
        "validator-1",
        "api",
    ];
    let mut roles: Vec<(&str, RoleProcess)> =
        names.iter().map(|name| (*name, RoleProcess(start(dir.path(), name)))).collect();
    let address = format!("http://127.0.0.1:{}", base + 9);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async { open_accounts(&connect(&address, Duration::from_secs(30))).await });
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> =
        (0..4).map(|client| runtime.spawn(keep_transferring(address.clone(), client, Arc::clone(&stop)))).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let position = roles.iter().position(|(role, _)| *role == "validator-0").unwrap();
    kill(&mut roles[position].1 .0);
    let killed = Instant::now();
    // Down for 3 s: transfers touching its keys go on, validated by the primaries in its
    // place once its lease has run out.
    std::thread::sleep(Duration::from_secs(3));
    roles[position].1 = RoleProcess(start(dir.path(), "validator-0"));
    let back = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let acknowledged = audit_transfers(&runtime, &address, clients, back);
    // Transfers with a key of validator-0's, acknowledged while it was down: the primaries
    // validated them in its place.
    let owned_by_0 = |mark: &str| transfer_keys(mark).iter().any(|key| validator_of(key, 2) == 0);
    let taken_over = acknowledged
        .iter()
        .filter(|(at, mark)| *at > killed + Duration::from_secs(1) && *at < back && owned_by_0(mark))
        .count();
    assert!(
        taken_over > 0,
        "no transfer of validator-0's keys committed while it was down ({} in all)",
        acknowledged.len()
    );
    let log = std::fs::read_to_string(dir.path().join("validator-0.stderr")).unwrap();
    assert!(log.contains("validator restarted above its old lease"), "{log}");
    for (_, role) in roles.iter_mut().rev() {
        terminate(&mut role.0);
    }
}
