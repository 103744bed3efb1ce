//! Every server role's metrics in Prometheus's text format, on an HTTP endpoint
//! (`GET /metrics`): read from the running cores at each scrape (counters, the latency
//! histograms the cores keep, and gauges of each shard, lease and Raft replica), labelled
//! with the role's name. A process registers the roles it runs: all of them for `virga kv
//! cluster up`, one for `virga kv cluster node`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use virga_net::driver::{system_now, CoreReader};

use crate::client::{ClientStats, TxnClient};
use crate::kairos::{ValidatorCore, ValidatorStats};
use crate::metrics::{LatencyHistogram, ShardGauges};
use crate::service::ConfigCore;
use crate::shard::{DataCore, DataStats};

/// A running role, as the exporter reads it.
#[derive(Clone)]
pub enum RoleReader {
    Config(CoreReader<ConfigCore>),
    Data(CoreReader<DataCore>),
    Client(CoreReader<TxnClient>),
    Validator(CoreReader<ValidatorCore>),
}

/// The roles a process exports, by name.
#[derive(Clone, Default)]
pub struct RoleMetrics {
    roles: Vec<(String, RoleReader)>,
}

impl std::fmt::Debug for RoleMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.roles.iter().map(|(name, _)| name)).finish()
    }
}

impl RoleMetrics {
    pub fn add(&mut self, name: impl Into<String>, role: RoleReader) {
        self.roles.push((name.into(), role));
    }

    /// The exposition of every role's metrics now.
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut text = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// What one scrape read of the roles.
#[derive(Default)]
struct Snapshot {
    clients: Vec<(String, ClientStats)>,
    data: Vec<(String, DataStats, Vec<ShardGauges>)>,
    config: Vec<(String, ConfigGauges)>,
    /// Each validator's counters and the transactions it holds.
    validators: Vec<(String, ValidatorStats, usize)>,
}

struct ConfigGauges {
    term: u64,
    leader: bool,
    commit_index: u64,
    applied_index: u64,
    map_version: u64,
}

impl Snapshot {
    fn take(roles: &[(String, RoleReader)]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for (name, role) in roles {
            match role {
                RoleReader::Client(reader) => {
                    snapshot.clients.push((name.clone(), reader.with_core(|c| c.stats().clone())))
                }
                RoleReader::Data(reader) => {
                    let (stats, shards) = reader.with_core(|core| (core.stats().clone(), core.shard_gauges()));
                    snapshot.data.push((name.clone(), stats, shards));
                }
                RoleReader::Validator(reader) => {
                    let (stats, held) = reader.with_core(|core| (core.stats().clone(), core.held()));
                    snapshot.validators.push((name.clone(), stats, held));
                }
                RoleReader::Config(reader) => snapshot.config.push((
                    name.clone(),
                    reader.with_core(|core| ConfigGauges {
                        term: core.term(),
                        leader: core.is_leader(),
                        commit_index: core.commit_index(),
                        applied_index: core.applied().0,
                        map_version: core.state().map().map_or(0, |map| map.version()),
                    }),
                )),
            }
        }
        snapshot
    }
}

type Labels = Vec<(&'static str, String)>;

fn role(name: &str) -> Labels {
    vec![("role", name.to_string())]
}

fn with(mut labels: Labels, key: &'static str, value: impl ToString) -> Labels {
    labels.push((key, value.to_string()));
    labels
}

/// One family of samples of one type.
struct Family<'a> {
    name: &'a str,
    help: &'a str,
}

impl Family<'_> {
    fn counters(&self, encoder: &mut DescriptorEncoder, samples: &[(Labels, u64)]) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(self.name, self.help, None, MetricType::Counter)?;
        for (labels, value) in samples {
            ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn gauges(&self, encoder: &mut DescriptorEncoder, samples: &[(Labels, f64)]) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        for (labels, value) in samples {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn histograms(&self, encoder: &mut DescriptorEncoder, samples: &[(Labels, &LatencyHistogram)]) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(self.name, self.help, None, MetricType::Histogram)?;
        for (labels, histogram) in samples {
            let buckets = histogram.cumulative_buckets();
            family.encode_family(labels)?.encode_histogram::<Labels>(
                histogram.sum_seconds(),
                histogram.count(),
                &buckets,
                None,
            )?;
        }
        Ok(())
    }
}

impl Collector for RoleMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let snapshot = Snapshot::take(&self.roles);
        encode_clients(&mut encoder, &snapshot.clients)?;
        encode_data(&mut encoder, &snapshot.data)?;
        encode_validators(&mut encoder, &snapshot.validators)?;
        encode_config(&mut encoder, &snapshot.config)
    }
}

fn encode_clients(encoder: &mut DescriptorEncoder, clients: &[(String, ClientStats)]) -> std::fmt::Result {
    let mut committed = Vec::new();
    let mut aborted = Vec::new();
    let mut requests = Vec::new();
    let mut latency = Vec::new();
    for (name, stats) in clients {
        committed.push((with(role(name), "kind", "read_only"), stats.committed_read_only));
        committed.push((with(role(name), "kind", "read_write"), stats.committed - stats.committed_read_only));
        for (reason, count) in &stats.aborts {
            aborted.push((with(role(name), "reason", reason), *count));
        }
        for (request, count) in [
            ("get", stats.gets),
            ("scan", stats.scans),
            ("prepare", stats.prepares),
            ("validation", stats.validations),
            ("decision", stats.decisions),
            ("retry", stats.retries),
            ("reread", stats.rereads),
        ] {
            requests.push((with(role(name), "request", request), count));
        }
        latency.push((with(role(name), "kind", "read_only"), &stats.commit_latency_read_only));
        latency.push((with(role(name), "kind", "read_write"), &stats.commit_latency_read_write));
    }
    let family = |name, help| Family { name, help };
    family("virga_dkv_txn_committed", "Transactions committed, by kind.").counters(encoder, &committed)?;
    family("virga_dkv_txn_aborted", "Transaction attempts aborted, by reason.").counters(encoder, &aborted)?;
    family("virga_dkv_client_requests", "Requests a client sent to primaries, by kind.")
        .counters(encoder, &requests)?;
    family("virga_dkv_txn_commit_seconds", "From an attempt's start to its commit, by kind.")
        .histograms(encoder, &latency)
}

fn encode_data(encoder: &mut DescriptorEncoder, nodes: &[(String, DataStats, Vec<ShardGauges>)]) -> std::fmt::Result {
    let now = system_now() as f64;
    let (mut events, mut latency) = (Vec::new(), Vec::new());
    let (mut primary, mut epoch, mut lease, mut heard, mut backlog, mut prepared) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut tables = Vec::new();
    for (name, stats, shards) in nodes {
        for (event, count) in [
            ("get", stats.gets),
            ("scan", stats.scans),
            ("prepare_voted_commit", stats.prepares),
            ("prepare_voted_abort", stats.aborts),
            ("validation", stats.validations),
            ("invalidation_sent", stats.invalidations),
            ("decision", stats.decisions),
            ("replicated", stats.replicated),
            ("replication_retry", stats.replication_retries),
            ("termination", stats.terminations),
            ("failover_proposed", stats.failovers_proposed),
            ("takeover", stats.takeovers),
            ("map_adopted", stats.maps_adopted),
            ("lease_refusal", stats.lease_refusals),
            ("too_old", stats.too_old),
            ("refusal", stats.refusals),
            ("versions_collected", stats.versions_collected),
            ("entry_settled", stats.settled),
            ("log_append", stats.writes),
        ] {
            events.push((with(role(name), "event", event), count));
        }
        latency.push((role(name), &stats.prepare_latency));
        for shard in shards {
            let labels = with(role(name), "shard", shard.shard);
            primary.push((labels.clone(), f64::from(u8::from(shard.primary))));
            epoch.push((labels.clone(), shard.epoch as f64));
            if let Some(until) = shard.lease_until {
                lease.push((labels.clone(), (until.time as f64 - now) / 1e9));
            }
            if let Some(ago) = shard.lease_heard_ago {
                heard.push((labels.clone(), ago as f64 / 1e9));
            }
            backlog.push((labels.clone(), shard.replication_backlog as f64));
            prepared.push((labels.clone(), shard.prepared as f64));
            for (table, size) in
                [("txns", shard.txn_entries), ("settled", shard.settled_entries), ("cc", shard.cc_entries)]
            {
                tables.push((with(labels.clone(), "table", table), size as f64));
            }
        }
    }
    let family = |name, help| Family { name, help };
    family("virga_dkv_data_events", "What a data node did or refused, by event.").counters(encoder, &events)?;
    family("virga_dkv_prepare_seconds", "From a prepare's arrival to its commit vote (logged, held by f backups).")
        .histograms(encoder, &latency)?;
    family("virga_dkv_shard_primary", "1 where the node is the shard's primary, 0 a backup.")
        .gauges(encoder, &primary)?;
    family("virga_dkv_shard_epoch", "The shard group's epoch the node knows.").gauges(encoder, &epoch)?;
    family("virga_dkv_lease_remaining_seconds", "A primary's read lease, ahead of this clock (negative: lapsed).")
        .gauges(encoder, &lease)?;
    family("virga_dkv_lease_heard_seconds", "A backup: since its primary last asked for a lease.")
        .gauges(encoder, &heard)?;
    family("virga_dkv_replication_backlog_records", "A primary's records not yet held by every backup.")
        .gauges(encoder, &backlog)?;
    family("virga_dkv_prepared_transactions", "Transactions prepared at the replica, undecided.")
        .gauges(encoder, &prepared)?;
    family(
        "virga_dkv_replica_entries",
        "A replica's table sizes: transaction entries, settled transactions (ids only), keys with concurrency-control state.",
    )
    .gauges(encoder, &tables)
}

fn encode_validators(
    encoder: &mut DescriptorEncoder,
    validators: &[(String, ValidatorStats, usize)],
) -> std::fmt::Result {
    let (mut events, mut aborted, mut held, mut keys) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, stats, holding) in validators {
        for (event, count) in [
            ("validation", stats.validations),
            ("commit_vote", stats.commit_votes),
            ("release", stats.releases),
            ("termination", stats.terminations),
        ] {
            events.push((with(role(name), "event", event), count));
        }
        for (reason, count) in &stats.aborts {
            aborted.push((with(role(name), "reason", reason), *count));
        }
        held.push((role(name), *holding as f64));
        keys.push((role(name), stats.keys as f64));
    }
    let family = |name, help| Family { name, help };
    family("virga_dkv_validator_events", "What a KAIROS validator did, by event.").counters(encoder, &events)?;
    family("virga_dkv_validator_aborts", "A validator's abort votes, by reason.").counters(encoder, &aborted)?;
    family("virga_dkv_validator_held_transactions", "Transactions voted commit whose outcome the validator awaits.")
        .gauges(encoder, &held)?;
    family("virga_dkv_validator_keys", "Keys the validator keeps state of (above its floor).").gauges(encoder, &keys)
}

fn encode_config(encoder: &mut DescriptorEncoder, replicas: &[(String, ConfigGauges)]) -> std::fmt::Result {
    let gauge = |read: fn(&ConfigGauges) -> f64| -> Vec<(Labels, f64)> {
        replicas.iter().map(|(name, gauges)| (role(name), read(gauges))).collect()
    };
    let family = |name, help| Family { name, help };
    family("virga_dkv_raft_term", "The configuration replica's Raft term.")
        .gauges(encoder, &gauge(|g| g.term as f64))?;
    family("virga_dkv_raft_leader", "1 on the configuration service's leader.")
        .gauges(encoder, &gauge(|g| f64::from(u8::from(g.leader))))?;
    family("virga_dkv_raft_commit_index", "The replica's Raft commit index.")
        .gauges(encoder, &gauge(|g| g.commit_index as f64))?;
    family("virga_dkv_raft_applied_index", "The last entry the replica applied.")
        .gauges(encoder, &gauge(|g| g.applied_index as f64))?;
    family("virga_dkv_map_version", "The version of the shard map the replica holds.")
        .gauges(encoder, &gauge(|g| g.map_version as f64))
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes; returns the bound address
/// and the server's future (spawn it).
pub fn serve_metrics(
    listener: TcpListener,
    metrics: RoleMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = std::io::Result<()>> + Send)> {
    let address = listener.local_addr()?;
    let metrics = Arc::new(metrics);
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                ([(axum::http::header::CONTENT_TYPE, content_type)], metrics.render())
            }
        }),
    );
    let server = axum::serve(listener, router).with_graceful_shutdown(shutdown);
    Ok((address, async move { server.await }))
}
