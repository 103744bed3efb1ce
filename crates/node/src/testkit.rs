//! A RainBlock network's genesis built in memory (no files): funded accounts, the chain's
//! rules, the genesis header and its sharded state, and the storage layout. The simulator
//! and the cores' unit tests start from it.

use alloy_consensus::Header;
use alloy_primitives::U256;
use virga_ledger::chain::{chain_config, genesis_header, genesis_json};
use virga_ledger::verify::ChainConfig;
use virga_trie::account::StateTrie;
use virga_trie::genesis::Genesis;
use virga_trie::shard::ShardedTrie;

use crate::cluster::{beneficiary, replicated_layout};
use crate::miner::MinerConfig;
use crate::storage::{shard_state, Served, DEFAULT_RETAINED_VERSIONS};
use crate::workload::{Accounts, GENESIS_BALANCE};

/// The shape of a small network.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub accounts: usize,
    pub shards: usize,
    pub storage_nodes: usize,
    pub replicas: usize,
    pub max_block_transfers: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape { accounts: 64, shards: 16, storage_nodes: 4, replicas: 1, max_block_transfers: 64 }
    }
}

pub struct Fixture {
    pub shape: Shape,
    pub config: ChainConfig,
    pub header: Header,
    /// The genesis state, whole (for replays).
    pub state: StateTrie,
    pub sharded: ShardedTrie,
    pub accounts: Accounts,
    /// Storage node ids with the shards each serves.
    pub layout: Vec<(String, Vec<usize>)>,
}

impl Fixture {
    pub fn new(shape: Shape) -> Result<Fixture, String> {
        if shape.accounts < 2 {
            return Err(format!("{} accounts: a transfer needs at least 2", shape.accounts));
        }
        let accounts = Accounts::generate(shape.accounts, &|_| {});
        let chain_id = virga_ledger::exec::ExecConfig::default().chain_id;
        let gas_limit = 21_000 * shape.max_block_transfers.max(1) as u64;
        let json =
            genesis_json(chain_id, U256::from(16u64), gas_limit, &accounts.addresses, U256::from(GENESIS_BALANCE));
        let genesis = Genesis::from_json_str(&json).map_err(|error| error.to_string())?;
        let config = chain_config(&genesis).map_err(|error| error.to_string())?;
        let mut state = genesis.state();
        let header = genesis_header(&genesis, state.root());
        let sharded = shard_state(state.accounts().as_trie(), shape.shards).map_err(|error| error.to_string())?;
        let layout = replicated_layout(shape.storage_nodes, shape.shards, shape.replicas);
        Ok(Fixture { shape, config, header, state, sharded, accounts, layout })
    }

    /// What storage node `id` serves.
    pub fn served(&self, id: &str) -> Option<Served> {
        let (_, shards) = self.layout.iter().find(|(node, _)| node == id)?;
        Some(Served {
            shards: shards.clone(),
            shard_count: self.shape.shards,
            config: self.config,
            retained: DEFAULT_RETAINED_VERSIONS,
        })
    }

    /// Miner `index`'s configuration; miner 0 produces and gossips to the `followers` others.
    pub fn miner_config(
        &self,
        index: usize,
        followers: usize,
        retention: usize,
        top_budget_bytes: usize,
    ) -> MinerConfig {
        MinerConfig {
            id: format!("miner-{index}"),
            chain: self.config,
            shard_count: self.shape.shards,
            storage_nodes: self.layout.clone(),
            peers: if index == 0 { (1..=followers).map(|i| format!("miner-{i}")).collect() } else { Vec::new() },
            retention,
            top_budget_bytes,
            max_block_transfers: self.shape.max_block_transfers,
            beneficiary: beneficiary(0),
        }
    }
}
