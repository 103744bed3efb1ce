//! The cooperative termination's rule 2, scripted: a client prepares a transaction at two
//! shards, the prepare to the second is lost (the client is cut off from that primary), and
//! the client crashes before it retries. The first shard's primary terminates the
//! transaction: the second answers that it never received the prepare, so the transaction
//! must abort. A terminator that takes "never prepared" for a vote (the weakened variant)
//! commits it at the first shard alone.
//!
//! Random seeds reach this only where a lost message and a client crash meet, too rarely to
//! count on; the scenario makes it happen every time.

use std::time::Duration;

use bytes::Bytes;
use virga_core::clock::SkewProfile;
use virga_sim::{NetConfig, Partition, Sim, SimConfig, SimError};

use super::{cluster, ns, open_node, Disks, DkvInput, DkvNode, Restarts, TxnRunOptions, Weakening, ADMIN};
use crate::client::{Program, TxnOp};
use crate::config::ConfigCommand;
use crate::layout::ShardId;
use crate::shard::{ShardRecord, TxnStatus};

/// What each shard's primary holds of the transaction at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingPrepare {
    /// At the shard that got the prepare, and at the one that did not.
    pub prepared_shard: Option<TxnStatus>,
    pub missing_shard: Option<TxnStatus>,
}

impl MissingPrepare {
    /// Committed at one shard and not at the other: atomicity broken.
    pub fn split(&self) -> bool {
        (self.prepared_shard == Some(TxnStatus::Committed)) != (self.missing_shard == Some(TxnStatus::Committed))
    }
}

/// A key of `shard` under `map`.
fn key_of(map: &crate::ShardMap, shard: u32) -> Bytes {
    (0..)
        .map(|index| Bytes::from(format!("key-{index}")))
        .find(|key| map.shard_of(key) == ShardId(shard))
        .unwrap_or_default()
}

/// Runs the scenario, the terminator weakened or not.
pub fn missing_prepare_scenario(weakened: bool) -> Result<MissingPrepare, SimError> {
    let options = TxnRunOptions {
        shards: 2,
        data_nodes: 3,
        clients: 1,
        session_clients: 0,
        accounts: 0,
        faults: false,
        clock: SkewProfile::None,
        weakening: Weakening { terminate_ignoring_missing_prepare: weakened, ..Weakening::default() },
        ..TxnRunOptions::new(1)
    };
    let cluster = cluster(&options)
        .map_err(|error| SimError::InvalidConfig { field: "layout".into(), reason: error.to_string() })?;
    let client = cluster.clients[0].clone();
    let (first, second) = (cluster.map.groups()[0].primary.clone(), cluster.map.groups()[1].primary.clone());
    // The client cannot reach the second shard's primary from just before its prepares.
    let cut = Partition {
        start_ns: ns(Duration::from_millis(400)),
        end_ns: ns(Duration::from_secs(60)),
        side_a: vec![client.clone()],
        side_b: vec![second.clone()],
    };
    let net = NetConfig { partitions: vec![cut], ..NetConfig::default() };
    let config = SimConfig { seed: 1, net, device_latency: Duration::from_millis(1), ..SimConfig::default() };
    let mut sim: Sim<DkvNode> = Sim::new(config)?;
    let (disks, restarts) = (Disks::default(), Restarts::default());
    for id in cluster.config.iter().chain([&ADMIN.to_string()]).chain(&cluster.data).chain(&cluster.clients) {
        let (core, io) = open_node(&options, &cluster, &disks, &Default::default(), &restarts, id);
        sim.add_node(id.clone(), core, io)?;
    }
    sim.input_at(1, ADMIN, DkvInput::Commands(vec![ConfigCommand::Install(cluster.map.clone())]))?;
    // Blind writes: the prepares go out at once, in the step that takes the program.
    let writes = vec![
        TxnOp::Put(key_of(&cluster.map, 0), Bytes::from_static(b"a")),
        TxnOp::Put(key_of(&cluster.map, 1), Bytes::from_static(b"b")),
    ];
    sim.input_at(ns(Duration::from_millis(500)), &client, DkvInput::Programs(vec![Program::Ops(writes)]))?;
    // Before its lost prepare's deadline, so it never sends it again.
    sim.crash_at(ns(Duration::from_millis(520)), &client)?;
    sim.run_until(ns(Duration::from_secs(8)));
    let status = |node: &str, shard: u32| -> Option<TxnStatus> {
        let core = sim.core(node).and_then(|node| node.role::<crate::shard::DataCore>())?;
        let replica = core.replica(shard)?;
        // The client's only transaction, found where it prepared.
        let txn = match sim.core(&first).and_then(|node| node.role::<crate::shard::DataCore>()) {
            Some(first) => first.replica(0)?.records().into_iter().find_map(|record| match record {
                ShardRecord::Prepared { txn, .. } => Some(txn),
                _ => None,
            })?,
            _ => return None,
        };
        replica.txn(txn).map(|entry| entry.status)
    };
    Ok(MissingPrepare { prepared_shard: status(&first, 0), missing_shard: status(&second, 1) })
}
