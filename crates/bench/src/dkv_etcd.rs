//! The etcd peer of `virga bench dkv --peers`: a three-member etcd cluster on loopback, started
//! by the benchmark from the `etcd` on `PATH` (Debian's `etcd-server` package), running the
//! same ycsb-t transactions as the store, as etcd transactions over its own gRPC API.
//!
//! Every transaction first reads its keys in one `Txn` of linearizable `Range`s, which returns
//! each key's value and `mod_revision`. A read-only transaction is then done. A read-write one
//! sends a second `Txn` whose compares check that every key's `mod_revision` is still the one
//! read and whose success branch puts the new values: optimistic concurrency control with
//! validation on etcd's leader, as the store validates at its primaries. A failed compare is
//! an aborted attempt, and the transaction runs again after a pause, up to the store clients'
//! number of attempts, so committed and aborted counts compare like for like.
//!
//! etcd keeps its defaults: every write is fsynced by each member before it counts towards a
//! Raft majority (`--unsafe-no-fsync` is never passed), and reads are linearizable (the leader
//! confirms its leadership through Raft before answering).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::dkv::DkvBenchConfig;
use crate::kv::ycsb_t::{key, value, YcsbT, YcsbTTxn};
use proto::kv_client::KvClient;

/// etcd's v3 key-value messages and tonic's client, generated from `proto/etcd_kv.proto`.
#[allow(clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// What a machine without etcd must install (Debian and Ubuntu).
pub const INSTALL_COMMAND: &str = "apt-get install etcd-server";

/// Members of the cluster: one leader and two followers, a majority of two.
pub const MEMBERS: usize = 3;

/// etcd's default `--max-txn-ops`: the most operations one `Txn` may carry.
const MAX_TXN_OPS: usize = 128;

/// Runs of one transaction before its abort is final, and the pause before a rerun (times its
/// attempts so far, up to 10): the store's clients' settings (`TxnClientConfig`).
const MAX_ATTEMPTS: u32 = 20;
const RERUN_AFTER: Duration = Duration::from_millis(2);

/// HTTP/2 connections to each member; clients take them round robin.
const CHANNELS_PER_MEMBER: usize = 2;

/// How long the cluster may take to serve its first linearizable read.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long one call may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Load transactions in flight at once.
const LOADERS: usize = 8;

/// What one run of etcd measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EtcdReport {
    /// `etcd --version`'s version line.
    pub version: String,
    pub members: usize,
    pub clients: usize,
    /// Transactions each client has in flight: 1, as each of the store's clients and each of
    /// the engine's threads, so abort rates and throughput compare at the same concurrency.
    pub in_flight_per_client: usize,
    pub duration_s: f64,
    pub committed: u64,
    pub committed_read_only: u64,
    pub committed_per_sec: f64,
    /// Attempts whose compares failed, and their share of all attempts.
    pub aborts: u64,
    pub abort_rate: f64,
    /// Transactions given up after their last aborted attempt.
    pub gave_up: u64,
    /// Calls that failed (gRPC status, timeout or a malformed answer); the transaction was
    /// dropped and counts neither as committed nor aborted.
    pub errors: u64,
    pub first_error: Option<String>,
}

/// etcd is missing; the message says what to install.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "etcd is not installed (no `etcd` executable on PATH): `virga bench dkv --peers` starts a three-member etcd \
     cluster as the store's peer; install it with `{INSTALL_COMMAND}` (Debian's etcd 3.4), or leave out --peers"
)]
pub struct EtcdMissing;

/// The `etcd` executable on `PATH`, or a message saying what to install.
pub fn etcd_available() -> Result<PathBuf, EtcdMissing> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| is_executable(candidate))
        .ok_or(EtcdMissing)
}

/// What is wrong with etcd's answer to a transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdAnswerError {
    #[error("a read Txn of {keys} ranges answered succeeded={succeeded} with {responses} responses")]
    ReadShape { keys: usize, succeeded: bool, responses: usize },
    #[error("a read Txn answered {0} where a range was expected")]
    NotARange(String),
    #[error("read Txn: {0}")]
    Read(String),
    #[error("write Txn: {0}")]
    Write(String),
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `etcd --version`'s first line (`etcd Version: 3.4.23`).
fn version(binary: &Path) -> Result<String> {
    let output = Command::new(binary).arg("--version").output().with_context(|| format!("running {binary:?}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or("etcd (no version printed)").trim().to_string())
}

struct Member {
    name: String,
    client_url: String,
    log: PathBuf,
    child: Child,
}

/// A running cluster in a scratch directory; dropping it kills and reaps every member (also
/// on an error or a panic), then removes the directory.
struct EtcdCluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

/// `count` distinct loopback ports that were free a moment ago (all bound at once, so no two
/// are the same; released just before etcd binds them).
fn free_ports(count: usize) -> Result<Vec<u16>> {
    let listeners: Vec<TcpListener> =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    listeners.iter().map(|listener| Ok(listener.local_addr()?.port())).collect()
}

/// The last `max_bytes` of a member's log, for an error message.
fn log_tail(path: &Path, max_bytes: u64) -> String {
    let mut tail = String::new();
    if let Ok(mut file) = File::open(path) {
        let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(length.saturating_sub(max_bytes)));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        tail = String::from_utf8_lossy(&bytes).into_owned();
    }
    tail
}

impl EtcdCluster {
    fn start(binary: &Path) -> Result<EtcdCluster> {
        let dir = tempfile::tempdir().context("a scratch directory for etcd's data")?;
        let ports = free_ports(2 * MEMBERS)?;
        let names: Vec<String> = (1..=MEMBERS).map(|index| format!("virga-etcd-{index}")).collect();
        let peer_url = |index: usize| format!("http://127.0.0.1:{}", ports[MEMBERS + index]);
        let initial_cluster: Vec<String> =
            names.iter().enumerate().map(|(index, name)| format!("{name}={}", peer_url(index))).collect();
        let mut cluster = EtcdCluster { members: Vec::new(), _dir: dir };
        for (index, name) in names.iter().enumerate() {
            let client_url = format!("http://127.0.0.1:{}", ports[index]);
            let log = cluster._dir.path().join(format!("{name}.log"));
            let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
            let mut command = Command::new(binary);
            // An ETCD_* variable of the caller's environment would override these flags.
            for (variable, _) in std::env::vars_os() {
                if variable.to_string_lossy().starts_with("ETCD_") {
                    command.env_remove(&variable);
                }
            }
            command
                .arg(format!("--name={name}"))
                .arg(format!("--data-dir={}", cluster._dir.path().join(name).display()))
                .arg(format!("--listen-client-urls={client_url}"))
                .arg(format!("--advertise-client-urls={client_url}"))
                .arg(format!("--listen-peer-urls={}", peer_url(index)))
                .arg(format!("--initial-advertise-peer-urls={}", peer_url(index)))
                .arg(format!("--initial-cluster={}", initial_cluster.join(",")))
                .arg("--initial-cluster-token=virga-bench-dkv")
                .arg("--initial-cluster-state=new")
                .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"])
                .current_dir(cluster._dir.path())
                .stdin(Stdio::null())
                .stdout(log_file.try_clone()?)
                .stderr(log_file);
            let child = command.spawn().with_context(|| format!("starting {}", binary.display()))?;
            cluster.members.push(Member { name: name.clone(), client_url, log, child });
        }
        Ok(cluster)
    }

    /// An error naming the first member that exited, with the end of its log.
    fn check_running(&mut self) -> Result<()> {
        for member in &mut self.members {
            if let Some(status) = member.child.try_wait()? {
                bail!(
                    "etcd member {} exited ({status}); the end of its log:\n{}",
                    member.name,
                    log_tail(&member.log, 2048)
                );
            }
        }
        Ok(())
    }

    /// Waits until every member answers a linearizable read (a leader is elected and each
    /// member reaches it), and returns `CHANNELS_PER_MEMBER` channels to each.
    async fn ready(&mut self) -> Result<Vec<Channel>> {
        let started = Instant::now();
        let mut channels = Vec::new();
        for index in 0..self.members.len() {
            loop {
                self.check_running()?;
                let member = &self.members[index];
                let answered = match connect(&member.client_url).await {
                    Ok(channel) => {
                        let request = proto::RangeRequest { key: b"virga-bench-ready".to_vec(), ..Default::default() };
                        let mut client = KvClient::new(channel.clone());
                        client.range(request).await.map(|_| channel).map_err(|status| status.to_string())
                    }
                    Err(error) => Err(error.to_string()),
                };
                match answered {
                    Ok(channel) => {
                        channels.push(channel);
                        break;
                    }
                    Err(error) if started.elapsed() > READY_WITHIN => bail!(
                        "etcd member {} served no linearizable read within {} s (last error: {error}); the end of its log:\n{}",
                        member.name,
                        READY_WITHIN.as_secs(),
                        log_tail(&member.log, 2048)
                    ),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            for _ in 1..CHANNELS_PER_MEMBER {
                channels.push(connect(&self.members[index].client_url).await?);
            }
        }
        Ok(channels)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.child.kill();
            let _ = member.child.wait();
        }
    }
}

async fn connect(url: &str) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(url.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(1))
        .timeout(CALL_TIMEOUT);
    Ok(endpoint.connect().await?)
}

fn put_op(key: Vec<u8>, value: Vec<u8>) -> proto::RequestOp {
    let put = proto::PutRequest { key, value, ..Default::default() };
    proto::RequestOp { request: Some(proto::request_op::Request::RequestPut(put)) }
}

/// A linearizable read of one key.
fn range_op(key: Vec<u8>) -> proto::RequestOp {
    let range = proto::RangeRequest { key, serializable: false, ..Default::default() };
    proto::RequestOp { request: Some(proto::request_op::Request::RequestRange(range)) }
}

/// Holds if `key` was last written at `mod_revision` (0: the key does not exist).
fn unchanged_since(key: Vec<u8>, mod_revision: i64) -> proto::Compare {
    proto::Compare {
        result: proto::compare::CompareResult::Equal as i32,
        target: proto::compare::CompareTarget::Mod as i32,
        key,
        target_union: Some(proto::compare::TargetUnion::ModRevision(mod_revision)),
        range_end: Vec::new(),
    }
}

/// The reads of `txn`: one `Txn` with a linearizable `Range` per key.
pub fn read_request(txn: &YcsbTTxn) -> proto::TxnRequest {
    proto::TxnRequest { success: txn.ids.iter().map(|id| range_op(key(*id))).collect(), ..Default::default() }
}

/// The writes of read-write `txn`, applied only if every key's `mod_revision` is still the one
/// read (`revisions`, in the order of `txn.ids`); the values are those the store writes.
pub fn write_request(txn: &YcsbTTxn, revisions: &[i64], value_size: usize) -> proto::TxnRequest {
    let compare = txn.ids.iter().zip(revisions).map(|(id, revision)| unchanged_since(key(*id), *revision)).collect();
    let success = txn
        .ids
        .iter()
        .enumerate()
        .map(|(position, id)| put_op(key(*id), value(txn.seed.wrapping_add(position as u64), value_size)))
        .collect();
    proto::TxnRequest { compare, success, failure: Vec::new() }
}

/// The `mod_revision` of each key a read `Txn` answered (0 for a missing key), or what is
/// wrong with the answer.
pub fn read_revisions(response: &proto::TxnResponse, keys: usize) -> Result<Vec<i64>, EtcdAnswerError> {
    if !response.succeeded || response.responses.len() != keys {
        return Err(EtcdAnswerError::ReadShape {
            keys,
            succeeded: response.succeeded,
            responses: response.responses.len(),
        });
    }
    response
        .responses
        .iter()
        .map(|op| match &op.response {
            Some(proto::response_op::Response::ResponseRange(range)) => {
                Ok(range.kvs.first().map_or(0, |kv| kv.mod_revision))
            }
            other => Err(EtcdAnswerError::NotARange(format!("{other:?}"))),
        })
        .collect()
}

/// Loads every record, `MAX_TXN_OPS` puts per `Txn`, `LOADERS` of them in flight.
async fn load(channels: &[Channel], workload: &YcsbT) -> Result<()> {
    let records = workload.config().records;
    let value_size = workload.config().value_size;
    let batches: Vec<(u64, u64)> =
        (0..records).step_by(MAX_TXN_OPS).map(|first| (first, (first + MAX_TXN_OPS as u64).min(records))).collect();
    let mut loaders = JoinSet::new();
    for loader in 0..LOADERS {
        let mut client = KvClient::new(channels[loader % channels.len()].clone());
        let mine: Vec<(u64, u64)> = batches.iter().skip(loader).step_by(LOADERS).copied().collect();
        loaders.spawn(async move {
            for (first, end) in mine {
                let success = (first..end).map(|id| put_op(key(id), value(id, value_size))).collect();
                let request = proto::TxnRequest { success, ..Default::default() };
                client.txn(request).await.map_err(|status| anyhow!("loading records {first}..{end}: {status}"))?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(result) = loaders.join_next().await {
        result??;
    }
    Ok(())
}

#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    read_only: AtomicU64,
    aborts: AtomicU64,
    gave_up: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Counters {
    fn snapshot(&self) -> [u64; 5] {
        [&self.committed, &self.read_only, &self.aborts, &self.gave_up, &self.errors].map(|c| c.load(Ordering::Relaxed))
    }

    fn error(&self, error: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        first.get_or_insert(error);
    }
}

enum Attempt {
    Committed { read_only: bool },
    Aborted,
}

async fn attempt(
    client: &mut KvClient<Channel>,
    txn: &YcsbTTxn,
    value_size: usize,
) -> Result<Attempt, EtcdAnswerError> {
    let reads = client.txn(read_request(txn)).await.map_err(|status| EtcdAnswerError::Read(status.to_string()))?;
    let revisions = read_revisions(reads.get_ref(), txn.ids.len())?;
    if !txn.writes {
        return Ok(Attempt::Committed { read_only: true });
    }
    let writes = client
        .txn(write_request(txn, &revisions, value_size))
        .await
        .map_err(|status| EtcdAnswerError::Write(status.to_string()))?;
    Ok(if writes.get_ref().succeeded { Attempt::Committed { read_only: false } } else { Attempt::Aborted })
}

/// One transaction in flight at a time until told to stop; an aborted one runs again.
async fn run_client(mut client: KvClient<Channel>, workload: Arc<YcsbT>, mut rng: SmallRng, counters: Arc<Counters>) {
    let value_size = workload.config().value_size;
    while !counters.stop.load(Ordering::Relaxed) {
        let txn = workload.draw(&mut rng);
        for attempts in 1..=MAX_ATTEMPTS {
            match attempt(&mut client, &txn, value_size).await {
                Ok(Attempt::Committed { read_only }) => {
                    counters.committed.fetch_add(1, Ordering::Relaxed);
                    if read_only {
                        counters.read_only.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
                Ok(Attempt::Aborted) => {
                    counters.aborts.fetch_add(1, Ordering::Relaxed);
                    if attempts == MAX_ATTEMPTS {
                        counters.gave_up.fetch_add(1, Ordering::Relaxed);
                    } else if counters.stop.load(Ordering::Relaxed) {
                        break;
                    } else {
                        tokio::time::sleep(RERUN_AFTER * attempts.min(10)).await;
                    }
                }
                Err(error) => {
                    counters.error(error.to_string());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    break;
                }
            }
        }
    }
}

/// Starts a three-member etcd cluster on loopback, loads `workload`'s records and runs its
/// transactions from `config.clients` clients, one transaction in flight each, for
/// `config.duration` after `config.warmup`. `config.sync` is not consulted: etcd fsyncs.
pub fn run_etcd(config: &DkvBenchConfig, workload: &YcsbT) -> Result<EtcdReport> {
    let binary = etcd_available()?;
    let etcd_version = version(&binary)?;
    // The clients' tasks outlive this borrow; the generator is rebuilt from the same
    // configuration, so it draws the same transactions.
    let workload = Arc::new(YcsbT::new(workload.config().clone())?);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut cluster = EtcdCluster::start(&binary)?;
    let report = runtime.block_on(async {
        let channels = cluster.ready().await?;
        load(&channels, &workload).await?;
        let counters = Arc::new(Counters::default());
        let mut clients = JoinSet::new();
        for index in 0..config.clients {
            let client = KvClient::new(channels[index % channels.len()].clone());
            let rng = SmallRng::seed_from_u64(config.seed ^ (index as u64 + 1) << 32);
            clients.spawn(run_client(client, Arc::clone(&workload), rng, Arc::clone(&counters)));
        }
        tokio::time::sleep(config.warmup).await;
        let before = counters.snapshot();
        let started = Instant::now();
        tokio::time::sleep(config.duration).await;
        let after = counters.snapshot();
        let duration_s = started.elapsed().as_secs_f64();
        counters.stop.store(true, Ordering::Relaxed);
        if tokio::time::timeout(CALL_TIMEOUT * 2, async { while clients.join_next().await.is_some() {} }).await.is_err()
        {
            clients.abort_all();
        }
        let [committed, read_only, aborts, gave_up, errors] =
            std::array::from_fn(|index| after[index].saturating_sub(before[index]));
        let first_error = counters.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if committed == 0 {
            bail!("etcd committed no transaction in {duration_s:.1} s (first error: {first_error:?})");
        }
        Ok(EtcdReport {
            version: etcd_version,
            members: MEMBERS,
            clients: config.clients,
            in_flight_per_client: 1,
            duration_s,
            committed,
            committed_read_only: read_only,
            committed_per_sec: committed as f64 / duration_s.max(1e-9),
            aborts,
            abort_rate: aborts as f64 / (committed + aborts) as f64,
            gave_up,
            errors,
            first_error,
        })
    });
    // A member that died during the run makes the figure meaningless.
    cluster.check_running()?;
    drop(cluster);
    report
}

#[cfg(test)]
#[path = "dkv_etcd_tests.rs"]
mod tests;
