//! What every run of the distributed store must show:
//!
//! - the committed history is serializable: virga-txn's dependency-graph checker over every
//!   client's committed transactions across shards, plus the transactions a primary's
//!   termination committed without word from their (crashed) client;
//! - money is conserved: every committed audit (by gets or by a scan, run as a program or as
//!   a session), and the primaries at the end, hold the initial total;
//! - committed means durable: every committed write is installed at its shard's primary at
//!   the end (after failovers too), and every backup holds every committed transaction;
//! - nothing stays prepared, and every live client finishes its programs or its sessions'
//!   work, each session operation answered as asked.

use std::collections::HashMap;

use virga_sim::Sim;
use virga_storage::VersionedStore;
use virga_txn::checker;

use super::{Cluster, DkvNode, SessionCounts, TxnRunOptions, TxnRunReport, INITIAL_BALANCE};
use crate::client::{ProgramOutcome, ProgramResult};
use crate::layout::ShardMap;
use crate::shard::TxnStatus;

/// What each client had done, as last seen before it crashed (or at the end).
#[derive(Default)]
pub(super) struct ClientViews {
    views: HashMap<String, ClientView>,
}

#[derive(Default)]
struct ClientView {
    results: Vec<ProgramResult>,
    /// A session client's: its committed and abandoned work, its counts and the answers it
    /// did not expect.
    session_results: Vec<ProgramResult>,
    sessions: SessionCounts,
    session_errors: Vec<String>,
    history: Vec<checker::TxnRecord>,
    attempts: Vec<checker::TxnRecord>,
    committed: u64,
    committed_read_only: u64,
    aborts: u64,
    cache: crate::kairos::CacheStats,
    validator_fallbacks: u64,
    validator_takeovers: u64,
    outstanding: usize,
    up: bool,
}

impl ClientViews {
    pub(super) fn observe(&mut self, sim: &Sim<DkvNode>, clients: &[String]) {
        for id in clients {
            let view = self.views.entry(id.clone()).or_default();
            let Some(client) = sim.core(id).and_then(super::node::txn_client) else {
                view.up = false;
                continue;
            };
            view.up = true;
            view.outstanding = client.outstanding();
            if let Some(session) = sim.core(id).and_then(|node| node.role::<super::session::SessionClient>()) {
                let driver = &session.driver;
                view.session_results.extend_from_slice(&driver.results()[view.session_results.len()..]);
                view.session_errors.extend_from_slice(&driver.errors()[view.session_errors.len()..]);
                view.sessions = driver.counts().clone();
                view.outstanding += driver.remaining();
            }
            view.results.extend_from_slice(&client.results()[view.results.len()..]);
            view.history.extend_from_slice(&client.history()[view.history.len()..]);
            view.attempts.extend_from_slice(&client.attempts()[view.attempts.len()..]);
            view.committed = client.stats().committed;
            view.committed_read_only = client.stats().committed_read_only;
            view.aborts = client.stats().aborts.values().sum();
            view.cache = *client.cache_stats();
            view.validator_fallbacks = client.stats().validator_fallbacks;
            view.validator_takeovers = client.stats().validator_takeovers;
        }
    }
}

/// Every client has finished its programs and decisions, and every primary has replicated
/// all it holds.
pub(super) fn settled(sim: &Sim<DkvNode>, cluster: &Cluster) -> bool {
    let clients_done = cluster.clients.iter().all(|id| {
        let Some(node) = sim.core(id) else { return true };
        match node.role::<super::session::SessionClient>() {
            Some(session) => session.outstanding() == 0,
            None => node.role::<crate::client::TxnClient>().is_none_or(|client| client.outstanding() == 0),
        }
    });
    // Every live node also holds the newest map the service committed: a backup added just
    // now gets its primary's records only once the primary has learned of it.
    let newest = final_map(sim, cluster).version();
    let nodes_done =
        cluster.data.iter().all(|id| match sim.core(id).and_then(|node| node.role::<crate::shard::DataCore>()) {
            Some(core) => {
                core.replicating() == 0
                    && core.unlogged() == 0
                    && core.undecided() == 0
                    && core.resyncs_waiting() == 0
                    && core.map().version() >= newest
            }
            _ => true,
        });
    clients_done && nodes_done
}

pub(super) fn check_run(
    sim: &Sim<DkvNode>,
    cluster: &Cluster,
    options: &TxnRunOptions,
    seen: &ClientViews,
    report: &mut TxnRunReport,
) {
    let total = INITIAL_BALANCE * options.accounts as u64;
    for id in &cluster.validators {
        if let Some(validator) = sim.core(id).and_then(|node| node.role::<crate::kairos::ValidatorCore>()) {
            report.validator_votes += validator.stats().validations;
            report.validator_terminations += validator.stats().terminations;
        }
    }
    let mut history = Vec::new();
    let mut attempts = Vec::new();
    for id in &cluster.clients {
        let Some(view) = seen.views.get(id) else { continue };
        let sessions = &view.sessions;
        report.programs += view.results.len() + view.session_results.len();
        report.programs += (sessions.unavailable + sessions.stale_map + sessions.outcome_unknown) as usize;
        report.committed += view.committed;
        report.committed_read_only += view.committed_read_only;
        report.aborted_attempts += view.aborts;
        report.cache_reads += view.cache.reads;
        report.cache_hits += view.cache.hits;
        report.stale_hits += view.cache.stale;
        report.validator_fallbacks += view.validator_fallbacks;
        report.validator_takeovers += view.validator_takeovers;
        report.session_committed += sessions.committed;
        report.session_gave_up += sessions.gave_up;
        report.session_unavailable += sessions.unavailable;
        report.session_stale_map += sessions.stale_map;
        report.session_outcome_unknown += sessions.outcome_unknown;
        report.session_aborted_attempts += sessions.aborted_attempts;
        if view.up && view.outstanding > 0 {
            report.violations.push(format!(
                "liveness: {id} has {} programs, session work or decisions outstanding",
                view.outstanding
            ));
        }
        for error in &view.session_errors {
            report.violations.push(format!("session: {id}: {error}"));
        }
        check_results(id, "program", &view.results, options.accounts, total, report);
        check_results(id, "session", &view.session_results, options.accounts, total, report);
        history.extend(view.history.iter().cloned());
        attempts.extend(view.attempts.iter().cloned());
    }
    // Attempts their clients never heard the end of, committed by a primary's termination.
    let map = final_map(sim, cluster);
    let known: std::collections::HashSet<u64> = history.iter().map(|txn| txn.id).collect();
    for attempt in attempts.into_iter().filter(|attempt| !known.contains(&attempt.id)) {
        if committed_at_a_primary(sim, &map, attempt.id) {
            report.committed_by_termination += 1;
            history.push(attempt);
        }
    }
    for id in &cluster.data {
        if let Some(core) = sim.core(id).and_then(|node| node.role::<crate::shard::DataCore>()) {
            report.versions_collected += core.stats().versions_collected;
            report.entries_settled += core.stats().settled;
            report.too_old += core.stats().too_old;
        }
    }
    report.failovers = map.groups().iter().map(|group| group.epoch.saturating_sub(1)).sum();
    report.backups_added = cluster
        .map
        .groups()
        .iter()
        .zip(map.groups())
        .filter(|(before, after)| after.backups.contains(&before.primary))
        .count();
    report.terminations = cluster
        .data
        .iter()
        .filter_map(|id| sim.core(id).and_then(|node| node.role::<crate::shard::DataCore>()))
        .map(|core| core.stats().terminations)
        .sum();
    if let Err(violation) = checker::check(&history) {
        report.violations.push(format!("serializability: {violation}"));
    }
    check_stores(sim, cluster, &history, total, report);
}

/// Every committed audit (by gets of every account, or by scans of their range) read the
/// total; every scan saw every account (none is ever deleted). Gives up are counted.
fn check_results(
    id: &str,
    kind: &str,
    results: &[ProgramResult],
    accounts: usize,
    total: u64,
    report: &mut TxnRunReport,
) {
    for result in results {
        let (txn, read_only) = match &result.outcome {
            ProgramOutcome::Aborted { .. } => {
                report.gave_up += 1;
                continue;
            }
            ProgramOutcome::Committed { txn, read_only, .. } => (*txn, *read_only),
        };
        if result.scans.iter().any(|rows| rows.len() != accounts) {
            report.violations.push(format!("scan: {kind} {txn:x} of {id} missed accounts: {:?}", result.scans));
            continue;
        }
        if !read_only {
            continue;
        }
        let mut sums: Vec<u64> = result
            .scans
            .iter()
            .map(|rows| rows.iter().map(|(_, value)| crate::client::balance(Some(value))).sum())
            .collect();
        if result.reads.len() == accounts {
            sums.push(result.reads.iter().map(|(_, value)| crate::client::balance(value.as_ref())).sum());
        }
        if let Some(sum) = sums.into_iter().find(|sum| *sum != total) {
            report
                .violations
                .push(format!("money: audit {txn:x} of {id} (a {kind}) read a total of {sum}, not {total}"));
        }
    }
}

/// Whether some shard primary holds `txn` as committed.
fn committed_at_a_primary(sim: &Sim<DkvNode>, map: &ShardMap, txn: u64) -> bool {
    map.groups().iter().enumerate().any(|(shard, group)| {
        matches!(sim.core(&group.primary).and_then(|node| node.role::<crate::shard::DataCore>()), Some(core)
            if core.replica(shard as u32).and_then(|replica| replica.status(txn)) == Some(TxnStatus::Committed))
    })
}

/// The primaries hold every committed write and the total; the backups every committed
/// transaction; nothing is left prepared.
fn check_stores(
    sim: &Sim<DkvNode>,
    cluster: &Cluster,
    history: &[checker::TxnRecord],
    total: u64,
    report: &mut TxnRunReport,
) {
    let map = &final_map(sim, cluster);
    let mut sum = 0;
    for (index, group) in map.groups().iter().enumerate() {
        let shard = index as u32;
        let Some(primary) = sim.core(&group.primary).and_then(|node| node.role::<crate::shard::DataCore>()) else {
            report.violations.push(format!("primary {} is down at the end", group.primary));
            continue;
        };
        let Some(replica) = primary.replica(shard) else { continue };
        replica.store().visit_range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, &mut |_, entry| {
            let newest = replica.store().read_at(entry, virga_storage::Timestamp::MAX);
            sum += crate::client::balance(newest.visible.and_then(|version| version.value).as_ref());
            true
        });
        for txn in history.iter().filter(|txn| !txn.writes.is_empty()) {
            for key in txn.writes.iter().filter(|key| map.shard_of(key).0 == shard) {
                let store = replica.store();
                let installed = store.find(key).and_then(|entry| store.read_at(&entry, txn.commit_ts).visible);
                // Garbage collection keeps, at or below the watermark, only each key's
                // youngest version: an older one may be gone, superseded.
                let superseded = txn.commit_ts <= replica.watermark()
                    && store
                        .find(key)
                        .and_then(|entry| store.read_at(&entry, replica.watermark()).visible)
                        .is_some_and(|kept| kept.ts >= txn.commit_ts);
                if installed.map(|version| version.writer) != Some(txn.id) && !superseded {
                    report.violations.push(format!(
                        "durability: committed transaction {:x} is not installed on {key:?} at shard {shard}",
                        txn.id
                    ));
                }
            }
            let committed_here = txn.writes.iter().any(|key| map.shard_of(key).0 == shard);
            for backup in group.backups.iter().filter(|_| committed_here) {
                if let Some(core) = sim.core(backup).and_then(|node| node.role::<crate::shard::DataCore>()) {
                    let status = core.replica(shard).and_then(|replica| replica.status(txn.id));
                    if status != Some(TxnStatus::Committed) {
                        report.violations.push(format!(
                            "replication: backup {backup} of shard {shard} has transaction {:x} as {status:?}",
                            txn.id
                        ));
                    }
                }
            }
        }
        if replica.prepared_count() > 0 {
            report
                .violations
                .push(format!("shard {shard}: {} transactions still prepared at the end", replica.prepared_count()));
        }
    }
    if sum != total {
        report.violations.push(format!("money: the primaries end with a total of {sum}, not {total}"));
    }
    report.violations.truncate(20);
}

/// The map as the configuration service ends with (the layout installed, after any
/// failovers), or the initial one if no replica has it.
fn final_map(sim: &Sim<DkvNode>, cluster: &Cluster) -> ShardMap {
    let mut newest = cluster.map.clone();
    for id in &cluster.config {
        if let Some(core) = sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>()) {
            if let Some(map) = core.state().map().filter(|map| map.version() > newest.version()) {
                newest = map.clone();
            }
        }
    }
    newest
}
