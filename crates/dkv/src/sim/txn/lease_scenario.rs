//! The seed's failover anomaly, scripted (MILANA §3.3): a read at t2 returns version t0;
//! the primary fails; after failover a write at t1, t0 < t1 ≤ t2, commits; a read at t2
//! then returns t1: the first read's snapshot was not one. With leases the new primary
//! refuses commit timestamps at or below the leases its predecessor held, so the write
//! commits above t2 (or not at all) and the second read returns what the first did.
//!
//! One shard of three replicas (`data-0` primary), the configuration service, a reader with
//! a true clock and a writer whose clock is 2.2 s behind.

use std::time::Duration;

use bytes::Bytes;
use virga_core::clock::{Skew, SkewProfile};
use virga_sim::{Sim, SimConfig, SimError};
use virga_storage::Timestamp;

use super::{cluster, ns, open_node, Disks, DkvInput, DkvNode, Restarts, TxnRunOptions, ADMIN};
use crate::client::{Program, ProgramOutcome, TxnOp};
use crate::config::ConfigCommand;

/// What the scenario saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseScenario {
    /// The first read: its timestamp (t2) and the value it returned.
    pub first_read: Option<(Timestamp, Option<Bytes>)>,
    /// The writer's commit timestamp, if it committed.
    pub write_committed_at: Option<Timestamp>,
    /// The second read, at t2 again, after the failover and the write.
    pub second_read: Option<Option<Bytes>>,
    /// Shards whose primary changed.
    pub failovers: u64,
}

impl LeaseScenario {
    /// The anomaly: the same snapshot read returned two different values.
    pub fn anomaly(&self) -> bool {
        match (&self.first_read, &self.second_read) {
            (Some((_, first)), Some(second)) => first != second,
            _ => false,
        }
    }
}

const KEY: &str = "acct-000";

/// Runs the scenario with leases on or off.
pub fn lease_scenario(leases: bool) -> Result<LeaseScenario, SimError> {
    let options = TxnRunOptions {
        shards: 1,
        data_nodes: 3,
        clients: 2,
        // Both clients run the scripted programs.
        session_clients: 0,
        accounts: 1,
        faults: false,
        clock: SkewProfile::None,
        leases,
        ..TxnRunOptions::new(1)
    };
    let cluster = cluster(&options)
        .map_err(|error| SimError::InvalidConfig { field: "layout".into(), reason: error.to_string() })?;
    let config = SimConfig { seed: 1, device_latency: Duration::from_millis(1), ..SimConfig::default() };
    let mut sim: Sim<DkvNode> = Sim::new(config)?;
    let disks = Disks::default();
    let restarts = Restarts::default();
    for id in cluster.config.iter().chain([&ADMIN.to_string()]).chain(&cluster.data) {
        let (core, io) = open_node(&options, &cluster, &disks, &Default::default(), &restarts, id);
        sim.add_node(id.clone(), core, io)?;
    }
    let (reader, writer) = (cluster.clients[0].clone(), cluster.clients[1].clone());
    let (core, io) = open_node(&options, &cluster, &disks, &Default::default(), &restarts, &reader);
    sim.add_node_with_skew(reader.clone(), core, io, Skew::default())?;
    let behind = Skew { offset_ns: -(ns(Duration::from_millis(2200)) as i64), ..Skew::default() };
    let (core, io) = open_node(&options, &cluster, &disks, &Default::default(), &restarts, &writer);
    sim.add_node_with_skew(writer.clone(), core, io, behind)?;

    let key = Bytes::from_static(KEY.as_bytes());
    sim.input_at(1, ADMIN, DkvInput::Commands(vec![ConfigCommand::Install(cluster.map.clone())]))?;
    sim.input_at(
        ns(Duration::from_millis(500)),
        &reader,
        DkvInput::Programs(vec![Program::Ops(vec![TxnOp::Get(key.clone())])]),
    )?;
    let primary = cluster.map.groups()[0].primary.clone();
    sim.crash_at(ns(Duration::from_millis(600)), &primary)?;
    let write = Program::Ops(vec![TxnOp::Put(key.clone(), Bytes::from_static(b"written"))]);
    sim.input_at(ns(Duration::from_millis(2500)), &writer, DkvInput::Programs(vec![write]))?;
    sim.run_until(ns(Duration::from_secs(6)));

    let first_read = match sim.core(&reader).and_then(|node| node.role::<crate::client::TxnClient>()) {
        Some(client) => client.results().first().and_then(|result| match result.outcome {
            ProgramOutcome::Committed { commit_ts, .. } => {
                Some((commit_ts, result.reads.first().and_then(|(_, value)| value.clone())))
            }
            ProgramOutcome::Aborted { .. } => None,
        }),
        _ => None,
    };
    if let Some((at, _)) = first_read {
        sim.input(&reader, DkvInput::Programs(vec![Program::SnapshotAt { keys: vec![key], at }]))?;
    }
    sim.run_until(ns(Duration::from_secs(8)));
    let write_committed_at = match sim.core(&writer).and_then(|node| node.role::<crate::client::TxnClient>()) {
        Some(client) => client.results().first().and_then(|result| match result.outcome {
            ProgramOutcome::Committed { commit_ts, read_only: false, .. } => Some(commit_ts),
            _ => None,
        }),
        _ => None,
    };
    let second_read = match sim.core(&reader).and_then(|node| node.role::<crate::client::TxnClient>()) {
        Some(client) => client.results().get(1).and_then(|result| match result.outcome {
            ProgramOutcome::Committed { .. } => Some(result.reads.first().and_then(|(_, value)| value.clone())),
            ProgramOutcome::Aborted { .. } => None,
        }),
        _ => None,
    };
    let failovers = match sim.core("config-1").and_then(|node| node.role::<crate::service::ConfigCore>()) {
        Some(core) => core.state().map().map_or(0, |map| map.groups().iter().map(|group| group.epoch - 1).sum()),
        _ => 0,
    };
    Ok(LeaseScenario { first_read, write_committed_at, second_read, failovers })
}
