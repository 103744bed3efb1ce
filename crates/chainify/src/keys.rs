//! The keys of a consortium whose servers run the pipeline (the benchmark's, in one
//! process, and a deployment's, one process per server): the organizations', the clients'
//! with the organization each belongs to, and the ordering service's; and what follows
//! from them, the pipeline's configuration and the genesis block (the customers, loaded by
//! the loader client and agreed by every organization).

use std::collections::BTreeMap;
use std::time::Duration;

use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{Agreement, AgreementPolicy, BlockCut, ChainedTx, Proposal, ProposalBatch};

use crate::pipeline::{orderer_names, PipelineConfig, RaftTiming};
use crate::run::OrganizationInfo;
use crate::smallbank;

/// The client whose proposals load the customers in the genesis block.
pub const LOADER: &str = "loader";

#[derive(Clone)]
pub struct Keys {
    pub orgs: BTreeMap<String, SigningKey>,
    /// Each client's key and organization.
    pub clients: BTreeMap<String, (SigningKey, String)>,
    pub orderer: SigningKey,
}

/// The pipeline settings a consortium chooses (the rest are fixed: see [`Keys::pipeline_config`]).
#[derive(Debug, Clone, Copy)]
pub struct PipelineSettings {
    pub orderers: usize,
    pub policy: AgreementPolicy,
    pub batch_size: usize,
    pub block_size: usize,
    pub checkpoint_every: u64,
}

impl Keys {
    /// Keys derived from fixed seeds (the same on every run), with clients dealt to the
    /// organizations in turn and the loader at the first.
    pub fn from_seeds(infos: &[OrganizationInfo], client_names: &[String]) -> Keys {
        let orgs = infos
            .iter()
            .enumerate()
            .map(|(at, info)| (info.name.clone(), SigningKey::from_seed(0x5749_0000 + at as u64)))
            .collect();
        let mut clients = BTreeMap::new();
        let first = infos.first().map(|info| info.name.clone()).unwrap_or_default();
        clients.insert(LOADER.to_string(), (SigningKey::from_seed(0x5749_1000), first));
        for (at, name) in client_names.iter().enumerate() {
            let org = infos.get(at % infos.len().max(1)).map(|info| info.name.clone()).unwrap_or_default();
            clients.insert(name.clone(), (SigningKey::from_seed(0x5749_2000 + at as u64), org));
        }
        Keys { orgs, clients, orderer: SigningKey::from_seed(0x5749_3000) }
    }

    /// What every server of this consortium is configured with.
    pub fn pipeline_config(&self, settings: PipelineSettings) -> PipelineConfig {
        PipelineConfig {
            organizations: self.orgs.iter().map(|(name, key)| (name.clone(), key.address())).collect(),
            clients: self.clients.iter().map(|(name, (key, _))| (name.clone(), key.address())).collect(),
            client_orgs: self.clients.iter().map(|(name, (_, org))| (name.clone(), org.clone())).collect(),
            orderer: self.orderer.address(),
            orderers: orderer_names(settings.orderers.max(1)),
            raft: RaftTiming::default(),
            policy: settings.policy,
            agreements: settings.policy.agree,
            batch_size: settings.batch_size,
            batch_wait: Duration::from_millis(2),
            block_size: settings.block_size,
            block_wait: Duration::from_millis(10),
            checkpoint_every: settings.checkpoint_every,
            keep_checkpoints: 3,
            call_deadline: Duration::from_secs(5),
            retry_after: Duration::from_millis(50),
        }
    }

    /// The customers as ordered block 0: one batch of the loader's proposals from `origin`,
    /// agreed by every organization. Deterministic (signatures use RFC 6979 nonces), so
    /// every orderer replica founds the same log.
    pub fn genesis(&self, customers: u64, origin: &str) -> Option<BlockCut> {
        let loader = &self.clients.get(LOADER)?.0;
        let proposals = smallbank::load_blocks(customers, 256)
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(at, transaction)| Proposal::sign(loader, LOADER, at as u64 + 1, transaction.statements))
            .collect();
        let batch = ProposalBatch { origin: origin.to_string(), number: u64::MAX, proposals };
        let hash = batch.hash();
        let agreements = self.orgs.iter().map(|(name, key)| Agreement::sign(key, name, hash)).collect();
        Some(BlockCut { batches: vec![ChainedTx { batch, agreements }] })
    }
}
