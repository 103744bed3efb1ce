//! A RainBlock network's genesis built in memory (no files) for a [`Topology`]: funded
//! accounts, the chain's rules, the genesis header and its sharded state, and the layout. The simulator
//! and the cores' unit tests start from it.

use alloy_consensus::Header;
use alloy_primitives::{Address, B256, U256};
use virga_ledger::chain::{chain_config, genesis_header, genesis_json};
use virga_ledger::verify::ChainConfig;
use virga_trie::account::StateTrie;
use virga_trie::genesis::Genesis;

use crate::client::ClientConfig;
use crate::miner::MinerConfig;
use crate::storage::{shard_genesis, Served, ShardedState, StorageError, DEFAULT_RETAINED_VERSIONS};
use crate::topology::{Topology, TopologyError};
use crate::workload::{Accounts, GENESIS_BALANCE};

/// Why a network's genesis could not be built for a topology.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("the genesis: {0}")]
    Genesis(#[from] virga_trie::genesis::GenesisError),
    #[error("the chain's rules: {0}")]
    Chain(#[from] virga_ledger::chain::ChainError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub struct Fixture {
    pub topology: Topology,
    pub config: ChainConfig,
    pub header: Header,
    /// The genesis state, whole (for replays).
    pub state: StateTrie,
    pub sharded: ShardedState,
    pub accounts: Accounts,
    /// Storage node ids with the shards each serves.
    pub layout: Vec<(String, Vec<usize>)>,
}

impl Fixture {
    pub fn new(topology: Topology) -> Result<Fixture, FixtureError> {
        topology.validate()?;
        let accounts = Accounts::generate(topology.accounts, &|_| {});
        let chain_id = virga_ledger::exec::ExecConfig::default().chain_id;
        let gas_limit = crate::cluster::block_gas_limit(topology.max_block_transfers);
        let json =
            genesis_json(chain_id, U256::from(16u64), gas_limit, &accounts.addresses, U256::from(GENESIS_BALANCE));
        let genesis = Genesis::from_json_str(&json)?;
        let config = chain_config(&genesis)?;
        let mut state = genesis.state();
        let header = genesis_header(&genesis, state.root());
        let sharded = shard_genesis(&state, topology.shards)?;
        let layout = topology.layout();
        Ok(Fixture { topology, config, header, state, sharded, accounts, layout })
    }

    /// Deploys a contract in the genesis: `code` at `address` with storage `slots`; the
    /// genesis header and the sharded state follow.
    pub fn deploy(&mut self, address: Address, code: &[u8], slots: &[(B256, U256)]) -> Result<(), FixtureError> {
        let code_hash = self.state.insert_code(code);
        self.state.set_account(address, virga_trie::account::Account { code_hash, ..Default::default() });
        for (slot, value) in slots {
            self.state.set_storage(address, *slot, *value);
        }
        self.header.state_root = self.state.root();
        self.sharded = shard_genesis(&self.state, self.topology.shards)?;
        Ok(())
    }

    /// What storage node `id` serves.
    pub fn served(&self, id: &str) -> Option<Served> {
        let (_, shards) = self.layout.iter().find(|(node, _)| node == id)?;
        Some(Served {
            shards: shards.clone(),
            shard_count: self.topology.shards,
            config: self.config,
            retained: DEFAULT_RETAINED_VERSIONS,
        })
    }

    /// Miner `index`'s configuration (miner 0 produces and gossips to the others).
    pub fn miner_config(&self, index: usize) -> MinerConfig {
        self.topology.miner_config(index, self.config)
    }

    /// Client `index`'s configuration.
    pub fn client_config(&self, index: usize) -> ClientConfig {
        self.topology.client_config(index, self.config.exec)
    }
}
