//! One description of a RainBlock cluster: who runs, how the shards are laid out, and how
//! each role is configured. `virga up`, `virga node init`, the sweeps of `virga bench
//! rainblock`, the simulator and the tests describe their clusters with a [`Topology`], and
//! its methods make every role's configuration, so no caller wires one by hand.

use alloy_primitives::Address;
use virga_ledger::exec::ExecConfig;
use virga_ledger::verify::ChainConfig;

use crate::client::{ClientConfig, DEFAULT_BACK_OFF, DEFAULT_CALL_DEADLINE};
use crate::miner::MinerConfig;
use crate::storage::prefix_nibbles;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    /// Accounts of the genesis state; key `i` is the workload's deterministic key `i`.
    pub accounts: usize,
    /// Shards of the state trie: 1, 16 or 256.
    pub shards: usize,
    pub storage_nodes: usize,
    /// Storage nodes serving each shard (see [`replicated_layout`]).
    pub replicas: usize,
    /// Miners: miner 0 produces, the others follow and verify.
    pub miners: usize,
    pub clients: usize,
    /// Retention level r: the miners' top layer keeps levels 0..=r when pruned.
    pub retention: usize,
    /// Compaction level c: the clients leave bag nodes above it out.
    pub compaction: usize,
    /// Transfers per client submission.
    pub batch: usize,
    /// Batches each client has under way at once.
    pub in_flight: usize,
    /// Transfers per block at most (the genesis gas limit is set from it).
    pub max_block_transfers: usize,
    /// The miners' top layer is pruned once its estimated memory exceeds this.
    pub top_budget_bytes: usize,
    /// Seeds the workload.
    pub seed: u64,
}

/// What is wrong with a topology.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("{0} accounts: a transfer needs at least 2")]
    TooFewAccounts(usize),
    #[error("shard count {0} is not 1, 16 or 256")]
    ShardCount(usize),
    #[error("a cluster needs at least one {0}")]
    NoRole(&'static str),
}

impl Topology {
    /// A cluster small enough for tests: 2,000 accounts, 16 shards on 16 storage nodes, one
    /// miner, two clients, r = 2, c = 3.
    pub fn small() -> Topology {
        Topology {
            accounts: 2_000,
            shards: 16,
            storage_nodes: 16,
            replicas: 1,
            miners: 1,
            clients: 2,
            retention: 2,
            compaction: 3,
            batch: 100,
            in_flight: 4,
            max_block_transfers: 2_000,
            top_budget_bytes: 1 << 20,
            seed: 7,
        }
    }

    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.accounts < 2 {
            return Err(TopologyError::TooFewAccounts(self.accounts));
        }
        prefix_nibbles(self.shards).ok_or(TopologyError::ShardCount(self.shards))?;
        for (count, role) in [(self.storage_nodes, "storage node"), (self.miners, "miner"), (self.clients, "client")] {
            if count == 0 {
                return Err(TopologyError::NoRole(role));
            }
        }
        Ok(())
    }

    /// The storage nodes and replicas actually run (see [`storage_counts`]).
    pub fn storage_counts(&self) -> (usize, usize) {
        storage_counts(self.storage_nodes, self.shards, self.replicas)
    }

    /// Storage node ids with the shards each serves.
    pub fn layout(&self) -> Vec<(String, Vec<usize>)> {
        let (nodes, replicas) = self.storage_counts();
        replicated_layout(nodes, self.shards, replicas)
    }

    pub fn miner_id(index: usize) -> String {
        format!("miner-{index}")
    }

    pub fn client_id(index: usize) -> String {
        format!("client-{index}")
    }

    pub fn miner_ids(&self) -> Vec<String> {
        (0..self.miners.max(1)).map(Self::miner_id).collect()
    }

    /// Miner `index`'s configuration: miner 0 gossips its blocks to the others.
    pub fn miner_config(&self, index: usize, chain: ChainConfig) -> MinerConfig {
        MinerConfig {
            id: Self::miner_id(index),
            chain,
            shard_count: self.shards,
            storage_nodes: self.layout(),
            peers: if index == 0 { (1..self.miners.max(1)).map(Self::miner_id).collect() } else { Vec::new() },
            retention: self.retention,
            top_budget_bytes: self.top_budget_bytes,
            max_block_transfers: self.max_block_transfers,
            beneficiary: beneficiary(0),
        }
    }

    /// Client `index`'s configuration: it submits to miner 0.
    pub fn client_config(&self, index: usize, exec: ExecConfig) -> ClientConfig {
        ClientConfig {
            id: Self::client_id(index),
            miner: Self::miner_id(0),
            storage_nodes: self.layout(),
            shard_count: self.shards,
            compaction: self.compaction,
            batch: self.batch,
            in_flight: self.in_flight,
            exec,
            deadline: DEFAULT_CALL_DEADLINE,
            back_off: DEFAULT_BACK_OFF,
        }
    }
}

/// How many storage nodes, and replicas of each shard, a cluster asked for `storage_nodes`
/// and `replicas` runs: at least one node and no more than there are copies of shards (more
/// would idle), and at least one replica and no more than there are nodes.
pub fn storage_counts(storage_nodes: usize, shards: usize, replicas: usize) -> (usize, usize) {
    let nodes = storage_nodes.clamp(1, shards.saturating_mul(replicas.max(1)).max(1));
    (nodes, replicas.clamp(1, nodes))
}

/// Storage node ids with their shards, each shard served by `replicas` distinct nodes
/// (`replicas` clamped to 1..=`nodes`). The shards' copies are dealt out round-robin: copy
/// k of shard s goes to node (s · replicas + k) mod `nodes`. A shard's copies are
/// consecutive deals, hence on distinct nodes, and no two nodes' shard counts differ by
/// more than one. With one replica, shard s is on node s mod `nodes`.
pub fn replicated_layout(nodes: usize, shards: usize, replicas: usize) -> Vec<(String, Vec<usize>)> {
    let nodes = nodes.max(1);
    let replicas = replicas.clamp(1, nodes);
    let mut served = vec![Vec::new(); nodes];
    for shard in 0..shards {
        for copy in 0..replicas {
            served[(shard * replicas + copy) % nodes].push(shard);
        }
    }
    served.into_iter().enumerate().map(|(node, shards)| (format!("storage-{node}"), shards)).collect()
}

/// The beneficiary of miner `index`'s blocks.
pub fn beneficiary(index: usize) -> Address {
    let mut bytes = [0u8; 20];
    bytes[..6].copy_from_slice(b"miner-");
    bytes[12..].copy_from_slice(&(index as u64).to_be_bytes());
    Address::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_is_configured_from_the_one_layout() {
        let topology = Topology { miners: 3, storage_nodes: 5, replicas: 2, ..Topology::small() };
        let chain = ChainConfig::default();
        let layout = topology.layout();
        assert_eq!(layout.len(), 5);
        let producer = topology.miner_config(0, chain);
        assert_eq!(producer.peers, ["miner-1", "miner-2"]);
        assert_eq!(producer.storage_nodes, layout);
        assert!(topology.miner_config(1, chain).peers.is_empty());
        let client = topology.client_config(1, chain.exec);
        assert_eq!((client.id.as_str(), client.miner.as_str()), ("client-1", "miner-0"));
        assert_eq!(client.storage_nodes, layout);
        assert_eq!(Topology { shards: 12, ..Topology::small() }.validate(), Err(TopologyError::ShardCount(12)));
        assert_eq!(Topology { clients: 0, ..Topology::small() }.validate(), Err(TopologyError::NoRole("client")));
    }
}
