//! `virga kv audit` on a cluster's directory: every data node's log replayed offline (the
//! cluster stopped), and per replica of every shard what it holds: its live keys, its
//! committed and still-prepared transactions, a digest of its newest committed state, and
//! the sum of the decimal values under a key prefix (the money of a transfer workload).
//! Replicas of a shard that hold the same committed transactions hold the same digest.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use alloy_primitives::keccak256;
use virga_storage::{Timestamp, VersionedStore};

use super::{initial_map, read_layout, storage, DeployError};
use crate::shard::{open_data_node, DataConfig};

/// What one replica of one shard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaAudit {
    pub node: String,
    pub shard: u32,
    /// The node is in the shard's group in the configuration's newest map (a primary that
    /// failed over left it; its replica stays as it was).
    pub member: bool,
    pub keys: u64,
    pub committed: u64,
    pub prepared: u64,
    /// keccak-256 over the live keys and values in key order (length-prefixed).
    pub digest: String,
    /// The sum of the values that parse as decimal integers under the audit's key prefix.
    pub total: u128,
}

/// Every replica of the cluster, by shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterAudit {
    /// The newest map the configuration replicas' logs hold committed.
    pub map_version: u64,
    pub replicas: Vec<ReplicaAudit>,
}

impl ClusterAudit {
    /// Shards whose replicas hold different committed states.
    pub fn disagreeing_shards(&self) -> Vec<u32> {
        let mut digests: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for replica in self.replicas.iter().filter(|replica| replica.member) {
            digests.entry(replica.shard).or_default().push(&replica.digest);
        }
        digests
            .into_iter()
            .filter(|(_, digests)| digests.windows(2).any(|pair| pair[0] != pair[1]))
            .map(|(shard, _)| shard)
            .collect()
    }

    /// The sum over shards of the total of each shard's most advanced replica (most
    /// transactions committed).
    pub fn total(&self) -> u128 {
        let mut best: BTreeMap<u32, &ReplicaAudit> = BTreeMap::new();
        for replica in self.replicas.iter().filter(|replica| replica.member) {
            let entry = best.entry(replica.shard).or_insert(replica);
            if replica.committed > entry.committed {
                *entry = replica;
            }
        }
        best.values().map(|replica| replica.total).sum()
    }
}

/// Audits the stopped cluster in `dir`, summing the values under `prefix`.
pub fn audit_cluster(dir: &Path, prefix: &[u8]) -> Result<ClusterAudit, DeployError> {
    let layout = read_layout(dir)?;
    let map = initial_map(&layout.shape)?;
    // No role may be running: replaying a live log would race its writer.
    let _locks = super::role_names(&layout.shape)
        .iter()
        .map(|role| super::lock_role(dir, role))
        .collect::<Result<Vec<_>, _>>()?;
    let mut newest = map.clone();
    for (_, name) in super::config_peers() {
        let path = dir.join(&name);
        if !path.is_dir() {
            continue;
        }
        let state = crate::service::read_committed_state(&path)
            .map_err(|error| DeployError::Open { role: name.clone(), error: error.to_string() })?;
        if let Some(map) = state.map().filter(|map| map.version() > newest.version()) {
            newest = map.clone();
        }
    }
    let mut replicas = Vec::new();
    for index in 0..layout.shape.data_nodes {
        let name = format!("data-{index}");
        let (core, _disk) = open_data_node(DataConfig::new(&name, map.clone()), storage(dir, &name)?)
            .map_err(|error| DeployError::Open { role: name.clone(), error: error.to_string() })?;
        for shard in 0..map.shard_count() {
            let Some(replica) = core.replica(shard) else { continue };
            let rows = replica.store().scan_at(Bound::Unbounded, Bound::Unbounded, Timestamp::MAX, usize::MAX);
            let mut encoded = Vec::new();
            let mut total: u128 = 0;
            for (key, value) in &rows {
                for part in [key, value] {
                    encoded.extend_from_slice(&(part.len() as u64).to_be_bytes());
                    encoded.extend_from_slice(part);
                }
                if key.starts_with(prefix) {
                    let parsed = std::str::from_utf8(value).ok().and_then(|text| text.parse::<u64>().ok());
                    total += u128::from(parsed.unwrap_or(0));
                }
            }
            let member = newest.group(crate::layout::ShardId(shard)).is_some_and(|group| group.contains(&name));
            replicas.push(ReplicaAudit {
                node: name.clone(),
                shard,
                member,
                keys: rows.len() as u64,
                committed: replica.committed_count() as u64,
                prepared: replica.prepared_count() as u64,
                digest: keccak256(&encoded).to_string(),
                total,
            });
        }
    }
    Ok(ClusterAudit { map_version: newest.version(), replicas })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(node: &str, shard: u32, committed: u64, digest: &str, total: u128) -> ReplicaAudit {
        let (node, digest) = (node.to_string(), digest.to_string());
        ReplicaAudit { node, shard, member: true, keys: 1, committed, prepared: 0, digest, total }
    }

    #[test]
    fn a_replica_that_differs_is_named_and_the_total_takes_each_shards_most_advanced() {
        let mut audit = ClusterAudit {
            map_version: 1,
            replicas: vec![
                replica("data-0", 0, 5, "a", 70),
                replica("data-1", 0, 5, "a", 70),
                replica("data-1", 1, 4, "b", 30),
                replica("data-2", 1, 4, "b", 30),
            ],
        };
        assert_eq!((audit.disagreeing_shards(), audit.total()), (vec![], 100));
        // A backup that missed a commit: its shard is named, and the total is the newest.
        audit.replicas[3] = replica("data-2", 1, 3, "c", 29);
        assert_eq!((audit.disagreeing_shards(), audit.total()), (vec![1], 100));
        // A replica whose node left the group (a failed-over primary) counts for nothing.
        audit.replicas[3].member = false;
        audit.replicas.push(replica("data-0", 1, 9, "d", 1));
        audit.replicas[4].member = false;
        assert_eq!((audit.disagreeing_shards(), audit.total()), (vec![], 100));
    }
}
