//! The distributed store as a process: `virga kv cluster up` serving the client API, the
//! `virga kv` shell with its exit codes, a clean stop by SIGTERM and a restart from the
//! directory, and SIGKILLs during transfers that lose no acknowledged commit and no money.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use virga_dkv::api::grpc::RemoteKv;
use virga_dkv::api::{Kv, KvError};

use crate::kv_money::{audit, offline_audit, open_accounts, transfer, ACCOUNTS, INITIAL};
use crate::support::text;

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

/// A running `virga kv cluster up`, the address it serves and where its metrics are.
struct Server {
    child: Child,
    address: String,
    metrics: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let mut child = Command::new(VIRGA)
            .args(["kv", "cluster", "up", "--dir", &dir.display().to_string(), "--listen", "127.0.0.1:0"])
            .args(["--shards", "3", "--replicas", "3", "--data-nodes", "4", "--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start virga kv cluster up");
        let stdout = child.stdout.take().unwrap();
        let (address, metrics) = serving_addresses(stdout);
        Server { child, address, metrics }
    }

    fn kv(&self, args: &[&str]) -> Output {
        Command::new(VIRGA).args(["kv", "--addr", &self.address]).args(args).output().expect("run virga kv")
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The addresses of the `metrics on URL` and `serving virga.kv.v1 on ADDR` lines (within a
/// minute).
fn serving_addresses(stdout: ChildStdout) -> (String, String) {
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let mut metrics = String::new();
    loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).expect("the server says where it serves");
        if let Some(url) = line.strip_prefix("metrics on ") {
            metrics = url.to_string();
        }
        if let Some(address) = line.strip_prefix("serving virga.kv.v1 on ") {
            return (address.to_string(), metrics);
        }
    }
}

/// `GET url` (`http://host:port/path`) over a plain TCP connection: the status line and body.
fn http_get(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(stream, "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample named `name` with exactly these labels, in a text exposition.
fn sample(exposition: &str, name_and_labels: &str) -> Option<f64> {
    exposition.lines().find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

fn out(output: &Output) -> String {
    text(&output.stdout)
}

#[test]
fn the_shell_reads_writes_and_exits_with_the_promised_codes_and_a_restart_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());

    assert_eq!(server.kv(&["put", "k1", "v1"]).status.code(), Some(0));
    assert_eq!(server.kv(&["put", "k2", "v 2"]).status.code(), Some(0));
    let get = server.kv(&["get", "k1"]);
    assert_eq!((get.status.code(), out(&get)), (Some(0), "v1\n".to_string()));
    let missing = server.kv(&["get", "nothing"]);
    assert_eq!((missing.status.code(), out(&missing)), (Some(1), String::new()));
    assert_eq!(server.kv(&["put", "gone", "x"]).status.code(), Some(0));
    assert_eq!(server.kv(&["delete", "gone"]).status.code(), Some(0));
    assert_eq!(server.kv(&["get", "gone"]).status.code(), Some(1));
    let scan = server.kv(&["scan", "k", "l"]);
    assert_eq!((scan.status.code(), out(&scan)), (Some(0), "k1 v1\nk2 v 2\n".to_string()));

    let txn = run_txn(&server, "get k1\nput k1 x\nscan k l\n");
    assert_eq!(txn.status.code(), Some(0), "{}", text(&txn.stderr));
    let lines: Vec<String> = out(&txn).lines().map(str::to_string).collect();
    assert_eq!(lines[..3], ["v1", "ok", "k1=x k2=v 2"]);
    assert!(lines[3].starts_with("committed at "), "{lines:?}");
    let aborted = run_txn(&server, "put k1 never\nabort\n");
    assert_eq!((aborted.status.code(), out(&aborted)), (Some(0), "ok\naborted\n".to_string()));

    // A write committed between this transaction's read and its commit aborts it: 3.
    let mut child = spawn_txn(&server);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"get k2\nput k2 mine\n").unwrap();
    let mut line = String::new();
    for expected in ["v 2\n", "ok\n"] {
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, expected);
    }
    assert_eq!(server.kv(&["put", "k2", "theirs"]).status.code(), Some(0));
    stdin.write_all(b"commit\n").unwrap();
    drop(stdin);
    let conflict = child.wait_with_output().unwrap();
    assert_eq!(conflict.status.code(), Some(3), "{}", text(&conflict.stderr));
    assert!(text(&conflict.stderr).contains("aborted: read-stale"), "{}", text(&conflict.stderr));

    // Bad input is 2, with the problem named; nothing of the transaction is written.
    let bad = run_txn(&server, "put k1 y\nput lonely\n");
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("line 2: `put` takes a key and a value"), "{}", text(&bad.stderr));
    let empty = server.kv(&["get", ""]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(text(&empty.stderr).contains("an empty key"), "{}", text(&empty.stderr));
    assert_eq!(out(&server.kv(&["get", "k1"])), "x\n");

    // Every role's metrics, as Prometheus reads them.
    let (status, metrics) = http_get(&server.metrics);
    assert!(status.contains("200"), "{status}");
    let committed = sample(&metrics, r#"virga_dkv_txn_committed_total{role="api",kind="read_write"}"#);
    assert!(committed.is_some_and(|count| count >= 6.0), "{committed:?}\n{metrics}");
    let stale = sample(&metrics, r#"virga_dkv_txn_aborted_total{role="api",reason="read-stale"}"#);
    assert_eq!(stale, Some(1.0), "{metrics}");
    let leaders: f64 =
        (1..=3).filter_map(|i| sample(&metrics, &format!(r#"virga_dkv_raft_leader{{role="config-{i}"}}"#))).sum();
    assert_eq!(leaders, 1.0, "one configuration replica leads");
    let leases: Vec<f64> = metrics
        .lines()
        .filter(|line| line.starts_with("virga_dkv_lease_remaining_seconds{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(leases.len(), 3, "a lease per shard primary: {metrics}");
    assert!(leases.iter().all(|remaining| *remaining > 0.0), "{leases:?}");
    assert!(metrics.contains("virga_dkv_prepare_seconds_bucket{"), "{metrics}");
    assert!(metrics.contains("virga_dkv_txn_commit_seconds_count{"), "{metrics}");
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    assert!(http_get(&server.metrics.replace("/metrics", "/nothing")).0.contains("404"));

    // SIGTERM stops it cleanly; the same command brings the data back.
    server.signal("-TERM");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let server = Server::start(dir.path());
    assert_eq!(out(&server.kv(&["get", "k1"])), "x\n");
    assert_eq!(out(&server.kv(&["get", "k2"])), "theirs\n");
    let unreachable = Command::new(VIRGA).args(["kv", "--addr", "127.0.0.1:1", "get", "k1"]).output().unwrap();
    assert_eq!(unreachable.status.code(), Some(2));
}

/// `virga kv txn` with its standard streams piped.
fn spawn_txn(server: &Server) -> Child {
    Command::new(VIRGA)
        .args(["kv", "--addr", &server.address, "txn"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_txn(server: &Server, input: &str) -> Output {
    let mut child = spawn_txn(server);
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Transfers from `clients` tasks until the server dies; the marks of those acknowledged.
async fn transfer_until_killed(address: &str, clients: usize, round: usize) -> Vec<String> {
    let mut tasks = Vec::new();
    for client in 0..clients {
        let kv = Kv::new(RemoteKv::connect(address, Duration::from_secs(10)).unwrap());
        tasks.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for n in 0.. {
                let (from, to) = ((client + n) % ACCOUNTS, (client + 3 * n + 1) % ACCOUNTS);
                let mark = format!("mark/{round}/{client}/{n}");
                match transfer(&kv, from, to, mark.clone()).await {
                    Ok(()) => acknowledged.push(mark),
                    Err(KvError::Aborted { .. }) => {}
                    // The server is gone (or the outcome is unknown): stop.
                    Err(_) => break,
                }
            }
            acknowledged
        }));
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.extend(task.await.unwrap());
    }
    acknowledged
}

#[test]
fn sigkill_during_transfers_loses_no_acknowledged_commit_and_no_money() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = Server::start(dir.path());
    runtime.block_on(async {
        open_accounts(&Kv::new(RemoteKv::connect(&server.address, Duration::from_secs(30)).unwrap())).await
    });
    let mut server = server;
    let mut marks = Vec::new();
    for round in 0..2 {
        let address = server.address.clone();
        let running = runtime.spawn(async move { transfer_until_killed(&address, 4, round).await });
        std::thread::sleep(Duration::from_millis(1500 + 500 * round as u64));
        server.signal("-KILL");
        let _ = server.child.wait();
        let acknowledged = runtime.block_on(running).unwrap();
        assert!(!acknowledged.is_empty(), "round {round}: transfers were acknowledged before the kill");
        marks.extend(acknowledged);
        server = Server::start(dir.path());
        let (total, missing) = runtime.block_on(async {
            audit(&Kv::new(RemoteKv::connect(&server.address, Duration::from_secs(30)).unwrap()), &marks).await
        });
        assert_eq!(total, INITIAL * ACCOUNTS as u64, "round {round}: money is conserved");
        assert!(missing.is_empty(), "round {round}: acknowledged transfers lost: {missing:?}");
    }

    // Stopped cleanly once the backups have caught up, every replica of every shard holds
    // the same state, and the accounts the exact total.
    std::thread::sleep(Duration::from_secs(1));
    server.signal("-TERM");
    assert!(server.child.wait().unwrap().success());
    let report = offline_audit(dir.path());
    let replicas = report["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 9, "3 shards × 3 replicas: {report}");
    let marks_committed: u64 = marks.len() as u64;
    let committed: u64 = replicas.iter().map(|replica| replica["committed"].as_u64().unwrap()).sum();
    assert!(committed >= 3 * marks_committed, "every replica holds the acknowledged transfers: {report}");
}
