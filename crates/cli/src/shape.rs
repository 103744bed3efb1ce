//! The flags that shape a RainBlock cluster, shared by `virga up` and `virga node init` so
//! that one flag means the same thing, with the same default, in both.

use clap::Args;
use virga_node::topology::Topology;

#[derive(Args)]
pub(crate) struct ClusterShape {
    /// Shards of the bottom layer (1, 16 or 256).
    #[arg(long, default_value_t = 16, value_parser = crate::limits::shards)]
    pub shards: usize,
    /// Storage nodes serving each shard: with 2 or more, a client refused a witness by one
    /// node asks another.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count(1))]
    pub replicas: usize,
    /// Miners: the first builds blocks, the others verify them from their own top layers.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count(1))]
    pub miners: usize,
    /// Retention level r: trie levels the miners keep when they prune their top layer.
    #[arg(short = 'r', long = "retention", default_value_t = 4, value_parser = crate::limits::trie_level())]
    pub retention: usize,
    /// Compaction level c: witness nodes above this trie level are not sent. Up to r + 1: the
    /// miner keeps levels 0..=r, so the default sends accounts' leaves (and rare deeper nodes) only.
    #[arg(short = 'c', long = "compaction", default_value_t = 5, value_parser = crate::limits::trie_level())]
    pub compaction: usize,
    /// Transfers per block at most.
    #[arg(long, default_value_t = 4_000, value_parser = crate::limits::count(1))]
    pub block_transfers: usize,
    /// Memory budget of a miner's top layer, in MiB; beyond it the miner prunes to level r.
    #[arg(long, default_value_t = 256)]
    pub top_budget_mib: usize,
    /// Seed of the accounts' keys (and, for `virga up`, of the workload).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

impl ClusterShape {
    /// The cluster these flags shape, with `accounts` and `storage_nodes` (flags of each
    /// command's own); clients, batch and in-flight from `Topology::small` until set.
    pub(crate) fn topology(&self, accounts: usize, storage_nodes: usize) -> Topology {
        Topology {
            accounts,
            shards: self.shards,
            storage_nodes,
            replicas: self.replicas,
            miners: self.miners,
            retention: self.retention,
            compaction: self.compaction,
            max_block_transfers: self.max_block_transfers(),
            top_budget_bytes: self.top_budget_bytes(),
            seed: self.seed,
            ..Topology::small()
        }
    }

    pub(crate) fn max_block_transfers(&self) -> usize {
        self.block_transfers
    }

    pub(crate) fn top_budget_bytes(&self) -> usize {
        self.top_budget_mib.saturating_mul(1 << 20)
    }
}
