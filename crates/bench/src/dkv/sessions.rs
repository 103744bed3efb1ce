//! Any [`KvWorkload`] on the store through the client library ([`Kv`] over each client
//! core): the runner's threads run the workload's transactions as interactive ones, one
//! operation at a time, retried when they abort, exactly as they run on the single-node
//! engine.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use std::sync::Mutex;
use tokio::runtime::Handle;
use virga_dkv::api::{Kv, KvError, LocalKv, Transaction};

use super::{report, start_store, stats_delta, DkvBenchConfig, DkvBenchReport};
use crate::kv::runner::{self, RunOptions, RunReport};
use crate::kv::{Ack, KvBackend, KvSession, KvTx, KvWorkload, TxAbort};

/// What a sessions run measured.
#[derive(Debug)]
pub struct SessionRun {
    /// The store's counts (from its clients' counters).
    pub report: DkvBenchReport,
    /// The runner's view: latency from a transaction's first attempt to its commit.
    pub runner: RunReport,
    /// With a snapshot prefix: every pair under it, read in one transaction after the run.
    pub snapshot: Option<Vec<(Bytes, Bytes)>>,
}

/// The store as a [`KvBackend`]: session `i` runs on client core `i mod cores`.
struct DkvBackend {
    kvs: Vec<Kv<LocalKv>>,
    handle: Handle,
}

impl KvBackend for DkvBackend {
    type Session = DkvSession;

    fn name(&self) -> String {
        "virga-dkv".to_string()
    }

    /// The data nodes load the workload's data before they start.
    fn load(&self, _pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> Result<()> {
        Ok(())
    }

    fn session(&self, client: usize) -> DkvSession {
        DkvSession { kv: self.kvs[client % self.kvs.len()].clone(), handle: self.handle.clone() }
    }
}

struct DkvSession {
    kv: Kv<LocalKv>,
    handle: Handle,
}

/// A name for the runner's counts, which take `&'static str`: the store's reasons are a
/// small fixed vocabulary, each leaked once.
fn intern(reason: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(name) = names.get(reason) {
        return name;
    }
    let name: &'static str = Box::leak(reason.to_string().into_boxed_str());
    names.insert(name);
    name
}

fn abort_of(error: KvError) -> TxAbort {
    match error {
        KvError::Aborted { reason } => TxAbort { reason: intern(&reason) },
        // Not an abort of the protocol (no fault is injected here), but the runner retries.
        other => TxAbort { reason: intern(other.kind()) },
    }
}

impl KvSession for DkvSession {
    fn run(
        &mut self,
        _read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort> {
        let handle = self.handle.clone();
        let txn = handle.block_on(self.kv.begin()).map_err(abort_of)?;
        let result = body(&mut DkvTx { txn: &txn, handle: &handle });
        match result {
            Ok(()) => handle.block_on(txn.commit()).map(|_| Ack::Now).map_err(abort_of),
            Err(abort) => {
                let _ = handle.block_on(txn.abort());
                Err(abort)
            }
        }
    }

    fn durable_ticket(&self) -> u64 {
        0
    }
}

struct DkvTx<'a> {
    txn: &'a Transaction<LocalKv>,
    handle: &'a Handle,
}

impl KvTx for DkvTx<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        self.handle.block_on(self.txn.get(Bytes::copy_from_slice(key))).map_err(abort_of)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        let (key, value) = (Bytes::copy_from_slice(key), Bytes::copy_from_slice(value));
        self.handle.block_on(self.txn.put(key, value)).map_err(abort_of)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort> {
        self.handle.block_on(self.txn.delete(Bytes::copy_from_slice(key))).map_err(abort_of)
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        let limit = limit.clamp(1, 4096) as u32;
        self.handle.block_on(self.txn.scan(Bytes::copy_from_slice(start), None, limit)).map_err(abort_of)
    }
}

/// Every pair whose key starts with `prefix`, at one snapshot: a transaction reads at most
/// 4096 keys of a shard, so each page is a read-only transaction of its own at the first
/// one's timestamp.
async fn read_prefix(kv: &Kv<LocalKv>, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, KvError> {
    let first = kv.begin().await?;
    let at = first.ts_begin();
    first.abort().await?;
    let mut end = prefix.to_vec();
    // The first key past the prefix (a prefix of 0xff bytes reads to the end).
    while end.last() == Some(&0xff) {
        end.pop();
    }
    let end = end.last_mut().map(|last| *last += 1).map(|()| Bytes::from(end.clone()));
    let mut pairs = Vec::new();
    let mut start = Bytes::copy_from_slice(prefix);
    loop {
        let txn = kv.begin_at(at).await?;
        let rows = txn.scan(start.clone(), end.clone(), 1024).await?;
        txn.commit().await?;
        let Some((last, _)) = rows.last() else { break };
        let mut next = last.to_vec();
        next.push(0);
        start = Bytes::from(next);
        let full = rows.len() == 1024;
        pairs.extend(rows);
        if !full {
            break;
        }
    }
    Ok(pairs)
}

/// Runs `workload` on the store through sessions, `config.clients` runner threads over as
/// many client cores; with `snapshot`, reads every pair under that prefix afterwards.
pub fn run_store_sessions<W: KvWorkload>(
    config: &DkvBenchConfig,
    workload: &W,
    snapshot: Option<&[u8]>,
) -> Result<SessionRun> {
    let dir = tempfile::tempdir().context("a scratch directory for the store's logs")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let roles = runtime.block_on(start_store(config, dir.path(), workload, None))?;
    let wait = Duration::from_secs(30);
    let kvs = roles.clients.iter().map(|client| Kv::new(LocalKv::new(client.running.input_sender(), wait))).collect();
    let backend = DkvBackend { kvs, handle: runtime.handle().clone() };
    let options =
        |duration, seed| RunOptions { threads: config.clients, duration, seed, progress: false, durable_lines: false };
    runner::run(workload, &backend, &options(config.warmup, config.seed ^ 0x5eed));
    let (before, cache_before) = (roles.client_stats(), roles.cache_stats());
    let run = runner::run(workload, &backend, &options(config.duration, config.seed));
    let after = roles.client_stats();
    let cache = roles.cache_delta(&cache_before);
    let snapshot = match snapshot {
        Some(prefix) => {
            let read = runtime.block_on(read_prefix(&backend.kvs[0], prefix));
            Some(read.map_err(|error| anyhow::anyhow!("reading the store after the run: {error}"))?)
        }
        None => None,
    };
    roles.stop();
    let leases = roles.lease_lengths();
    let delta = stats_delta(&before, &after);
    let mut report = report(config, workload.name(), roles.data_nodes, run.duration_s, &delta, (&cache, &leases));
    report.mean_latency_us = run.mean_us;
    Ok(SessionRun { report, runner: run, snapshot })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::transfer::{self, TransferConfig, TransferWorkload};
    use crate::kv::ycsb_t::{YcsbT, YcsbTConfig};

    fn tiny(clients: usize) -> DkvBenchConfig {
        DkvBenchConfig {
            shards: 2,
            warmup: Duration::from_millis(200),
            ..DkvBenchConfig::new(clients, Duration::from_millis(700), 11)
        }
    }

    #[test]
    fn transfers_through_sessions_commit_and_the_money_adds_up_afterwards() {
        // More accounts than one transaction may read of a shard: the audit reads in pages.
        let workload = TransferWorkload::new(TransferConfig { accounts: 9000, ..TransferConfig::default() }).unwrap();
        let run = run_store_sessions(&tiny(3), &workload, Some(&[transfer::TAG])).unwrap();
        assert!(run.report.committed > 10, "{:?}", run.report);
        assert_eq!(run.runner.committed, run.report.committed, "the runner and the clients count the same commits");
        let pairs = run.snapshot.unwrap();
        let audit = transfer::audit(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))).unwrap();
        assert_eq!((audit.accounts, audit.total_balance), (9000, workload.expected_total()));
    }

    #[test]
    fn the_split_placement_runs_servers_and_clients_on_runtimes_of_their_own() {
        let workload = YcsbT::new(YcsbTConfig { records: 1000, ..YcsbTConfig::default() }).unwrap();
        let cache = crate::dkv::kairos::cache_config(&workload, virga_dkv::kairos::CacheMode::Lease, 0.01);
        let split = DkvBenchConfig {
            placement: crate::dkv::Placement::Split,
            validation: virga_dkv::client::ReadOnlyValidation::Validate,
            cache,
            validators: 2,
            ..tiny(2)
        };
        let report = crate::dkv::run_store(&split, &workload).unwrap();
        // Calls, timers and the validators' lease renewals cross between the two runtimes.
        assert!(report.committed_read_only > 0 && report.committed > report.committed_read_only, "{report:?}");
        assert!(report.validator_requests_per_commit > 0.5, "{report:?}");
        assert!(report.cache_hits > 0, "{report:?}");
    }

    #[test]
    fn remote_validation_sends_read_only_transactions_through_the_primaries() {
        let workload = YcsbT::new(YcsbTConfig { records: 1000, ..YcsbTConfig::default() }).unwrap();
        let local = crate::dkv::run_store(&tiny(2), &workload).unwrap();
        let remote = DkvBenchConfig { validation: virga_dkv::client::ReadOnlyValidation::Remote, ..tiny(2) };
        let remote = crate::dkv::run_store(&remote, &workload).unwrap();
        assert!(local.committed_read_only > 0 && remote.committed_read_only > 0, "{local:?}\n{remote:?}");
        // Local: a read-only transaction's gets and nothing more; remote adds a prepare per
        // participant (and a decision when there are several).
        assert!(local.requests_per_commit < 3.0, "{local:?}");
        assert!(remote.requests_per_commit > local.requests_per_commit + 0.8, "{local:?}\n{remote:?}");
        assert_eq!((local.validation, remote.validation), ("local", "remote"));
    }
}
