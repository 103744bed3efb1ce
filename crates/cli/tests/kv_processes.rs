//! The store with every role a process of its own (`virga kv cluster init` and `node`):
//! during transfers through the API server, SIGKILL the primary of a shard (a backup takes
//! over through the configuration service), a backup of another shard, and the API server
//! (its client core: the primaries terminate what it left prepared); after each restart the
//! transfers resume, nothing acknowledged is lost, the money adds up, and once stopped every
//! replica of every shard's group holds the same state (`virga kv audit`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;
use virga_dkv::api::grpc::RemoteKv;
use virga_dkv::api::{Kv, KvError};
use virga_dkv::deploy::{initial_map, ClusterShape};

use crate::support::text;

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");
const ACCOUNTS: usize = 8;
const INITIAL: u64 = 100;

fn shape() -> ClusterShape {
    ClusterShape { shards: 3, replicas: 3, data_nodes: 4 }
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

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn terminate(child: &mut Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success(), "a role stops cleanly on SIGTERM");
}

fn account(index: usize) -> Bytes {
    Bytes::from(format!("acct-{index}"))
}

fn balance(value: Option<&Bytes>) -> u64 {
    value.and_then(|value| std::str::from_utf8(value).ok()).and_then(|text| text.parse().ok()).unwrap_or(0)
}

async fn transfer(kv: &Kv<RemoteKv>, from: usize, to: usize, mark: String) -> Result<(), KvError> {
    let txn = kv.begin().await?;
    let (a, b) = (txn.get(account(from)).await?, txn.get(account(to)).await?);
    let (a, b) = (balance(a.as_ref()), balance(b.as_ref()));
    if a > 0 {
        txn.put(account(from), (a - 1).to_string()).await?;
        txn.put(account(to), (b + 1).to_string()).await?;
    }
    txn.put(mark, "done").await?;
    txn.commit().await.map(|_| ())
}

/// Transfers until `stop`, through every fault (an error means "try the next one"); the
/// marks of those acknowledged, with when.
async fn keep_transferring(address: String, client: usize, stop: Arc<AtomicBool>) -> Vec<(Instant, String)> {
    let kv = Kv::new(RemoteKv::connect(&address, Duration::from_secs(20)).unwrap());
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

async fn audit_once(kv: &Kv<RemoteKv>, marks: &[String]) -> Result<(u64, Vec<String>), KvError> {
    let txn = kv.begin().await?;
    let mut total = 0;
    for index in 0..ACCOUNTS {
        total += balance(txn.get(account(index)).await?.as_ref());
    }
    let mut missing = Vec::new();
    for mark in marks {
        if txn.get(mark.clone()).await?.is_none() {
            missing.push(mark.clone());
        }
    }
    txn.commit().await?;
    Ok((total, missing))
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
    let mut roles: Vec<(&str, Child)> = names.iter().map(|name| (*name, start(dir.path(), name))).collect();
    let address = format!("http://127.0.0.1:{}", base + 7);
    let map = initial_map(&shape()).unwrap();
    let primary = map.groups()[0].primary.clone();
    let backup = map.groups()[1].backups.iter().find(|node| **node != primary).unwrap().clone();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let kv = Kv::new(RemoteKv::connect(&address, Duration::from_secs(30)).unwrap());
        for index in 0..ACCOUNTS {
            kv.put(account(index), INITIAL.to_string()).await.unwrap();
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> =
        (0..4).map(|client| runtime.spawn(keep_transferring(address.clone(), client, Arc::clone(&stop)))).collect();

    let restart = |name: &str, down: Duration, roles: &mut Vec<(&str, Child)>| {
        let position = roles.iter().position(|(role, _)| *role == name).unwrap();
        kill(&mut roles[position].1);
        std::thread::sleep(down);
        roles[position].1 = start(dir.path(), name);
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
    let acknowledged: Vec<(Instant, String)> =
        clients.into_iter().flat_map(|client| runtime.block_on(client).unwrap()).collect();
    let after_faults = acknowledged.iter().filter(|(at, _)| *at > api_back).count();
    assert!(after_faults > 0, "transfers resumed after the last restart ({} in all)", acknowledged.len());
    let marks: Vec<String> = acknowledged.into_iter().map(|(_, mark)| mark).collect();

    let (total, missing) = runtime.block_on(async {
        let kv = Kv::new(RemoteKv::connect(&address, Duration::from_secs(30)).unwrap());
        for _ in 0..100 {
            match audit_once(&kv, &marks).await {
                Ok(found) => return found,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("the audit through the API never committed");
    });
    assert_eq!(total, INITIAL * ACCOUNTS as u64, "money is conserved");
    assert!(missing.is_empty(), "acknowledged transfers lost: {missing:?}");

    // Stopped once the backups caught up: the replicas of each shard's group agree, and the
    // accounts hold the exact total.
    std::thread::sleep(Duration::from_secs(1));
    for (_, child) in roles.iter_mut().rev() {
        terminate(child);
    }
    let total = (INITIAL * ACCOUNTS as u64).to_string();
    let audit = Command::new(VIRGA)
        .args(["kv", "audit", "--dir", &dir_arg, "--prefix", "acct-", "--expect-total", &total])
        .output()
        .unwrap();
    let report = text(&audit.stdout);
    assert!(audit.status.success(), "{report}{}", text(&audit.stderr));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(report["map_version"].as_u64().unwrap() >= 2, "shard 0 failed over: {report}");
    let departed: Vec<&serde_json::Value> =
        report["replicas"].as_array().unwrap().iter().filter(|replica| replica["member"] == false).collect();
    assert!(
        departed.iter().any(|replica| replica["node"] == primary.as_str() && replica["shard"] == 0),
        "the killed primary left shard 0's group: {report}"
    );
}
