//! ycsb-t as client programs: each client core is kept `window` programs ahead and runs
//! `in_flight` of them at once; a program's reads go out together, its writes follow.

use std::time::Instant;

use anyhow::{Context, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use virga_dkv::client::{ClientInput, Program, TxnClient, TxnOp};

use super::{report, runtimes, start_store, stats_delta, DkvBenchConfig, DkvBenchReport, Runner};
use crate::kv::ycsb_t::{key, value, YcsbT, YcsbTTxn};

/// A generated transaction as a client program: its gets, then (read-write) its puts; a
/// blind write puts without reading.
pub fn program(txn: &YcsbTTxn, workload: &YcsbT) -> Program {
    let config = workload.config();
    let mut ops: Vec<TxnOp> = Vec::new();
    if !(txn.writes && config.blind_writes) {
        ops.extend(txn.ids.iter().map(|id| TxnOp::Get(Bytes::from(key(*id)))));
    }
    if txn.writes {
        for (position, id) in txn.ids.iter().enumerate() {
            let bytes = value(txn.seed.wrapping_add(position as u64), config.value_size);
            ops.push(TxnOp::Put(Bytes::from(key(*id)), Bytes::from(bytes)));
        }
    }
    Program::Ops(ops)
}

/// Keeps every client `window` programs ahead until `until`.
async fn feed(clients: &[Runner<TxnClient>], workload: &YcsbT, rngs: &mut [SmallRng], window: usize, until: Instant) {
    while Instant::now() < until {
        for (client, rng) in clients.iter().zip(rngs.iter_mut()) {
            let missing = window.saturating_sub(client.running.with_core(TxnClient::outstanding));
            if missing > 0 {
                let programs = (0..missing).map(|_| program(&workload.draw(rng), workload)).collect();
                client.running.input(ClientInput::Programs(programs));
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Runs the store embedded in this process on ycsb-t programs and reports.
pub fn run_store(config: &DkvBenchConfig, workload: &YcsbT) -> Result<DkvBenchReport> {
    let dir = tempfile::tempdir().context("a scratch directory for the store's logs")?;
    let (runtime, servers_runtime) = runtimes(config.placement)?;
    let servers = servers_runtime.as_ref().map(|servers| servers.handle().clone());
    runtime.block_on(async {
        let roles = start_store(config, dir.path(), workload, servers.as_ref()).await?;
        let mut rngs: Vec<SmallRng> =
            (0..config.clients).map(|index| SmallRng::seed_from_u64(config.seed ^ (index as u64 + 1) << 32)).collect();
        let window = config.window.max(config.in_flight);
        feed(&roles.clients, workload, &mut rngs, window, Instant::now() + config.warmup).await;
        let (before, cache_before) = (roles.client_stats(), roles.cache_stats());
        let started = Instant::now();
        feed(&roles.clients, workload, &mut rngs, window, started + config.duration).await;
        let after = roles.client_stats();
        let cache = roles.cache_delta(&cache_before);
        let duration_s = started.elapsed().as_secs_f64();
        roles.stop();
        let leases = roles.lease_lengths();
        Ok(report(config, "ycsb-t", roles.data_nodes, duration_s, &stats_delta(&before, &after), (&cache, &leases)))
    })
}
