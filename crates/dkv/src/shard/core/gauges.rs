//! A data node's shards as its metrics show them (see `crate::metrics`).

use super::DataCore;
use crate::layout::ShardId;
use crate::metrics::ShardGauges;

impl DataCore {
    /// Each shard this node holds a replica of: its role, epoch, lease, replication backlog
    /// and prepared transactions, as of the last step.
    pub fn shard_gauges(&self) -> Vec<ShardGauges> {
        self.replicas
            .iter()
            .map(|(&shard, replica)| {
                let group = self.map.group(ShardId(shard));
                let primary = group.is_some_and(|group| group.primary == self.config.node);
                ShardGauges {
                    shard,
                    primary,
                    epoch: group.map_or(0, |group| group.epoch),
                    lease_until: self.leases.until(shard).filter(|_| primary),
                    lease_heard_ago: (!primary)
                        .then(|| self.leases.primary_heard_at(shard).map(|heard| self.now.saturating_sub(heard)))
                        .flatten(),
                    replication_backlog: group.map_or(0, |group| self.replication.backlog(shard, group.backups.len())),
                    prepared: replica.prepared_count(),
                    txn_entries: replica.txn_entries(),
                    settled_entries: replica.settled_entries(),
                    cc_entries: replica.cc_entries(),
                }
            })
            .collect()
    }
}
