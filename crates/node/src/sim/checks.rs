//! What every simulated run must show, checked once it has settled:
//!
//! 1. the chain verifies (re-executed from genesis, every block's root and receipts);
//! 2. every storage node holds the chain's head, its served shards hashing as a serial
//!    replay's, and still does after a crash of every node at the end (nothing acknowledged
//!    was only in memory);
//! 3. no block acknowledged to a client is lost: each acknowledged transfer is in the
//!    chain, in the block it was acknowledged in;
//! 4. no wrong root is accepted: every follower miner's own chain verifies as well;
//! 5. every transfer offered is committed or refused with a reason.

use alloy_primitives::B256;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use virga_core::device::Storage;
use virga_ledger::block::Block;
use virga_ledger::store::{ChainStore, StoreError, StoreOptions};
use virga_ledger::verify::{verify_block, ExecMode};
use virga_sim::Sim;

use super::node::RainblockNode;
use super::run::Disks;
use crate::client::UserTransfer;
use crate::storage::{log_options, open_core, shard_state, NodeStorage};
use crate::testkit::Fixture;

/// What the users were told, gathered as the run goes (a crashed client forgets).
#[derive(Default)]
pub struct UserView {
    /// Per client, how many acknowledgements, refusals and late confirmations of its
    /// current incarnation were seen.
    seen: HashMap<String, (usize, usize, usize)>,
    /// Transfers found committed after their answer was lost (block unknown).
    pub confirmed_late: HashSet<B256>,
    /// Transfer hash → (block number, block hash) it was acknowledged in.
    pub acknowledged: HashMap<B256, (u64, B256)>,
    /// Transfer hash → why it was refused.
    pub refused: HashMap<B256, String>,
}

fn client<'a>(sim: &'a Sim<RainblockNode>, id: &str) -> Option<&'a crate::client::ClientCore> {
    sim.core(id)?.role()
}

impl UserView {
    /// Takes in what the clients have told their users since the last look.
    pub fn observe(&mut self, sim: &Sim<RainblockNode>, clients: &[String]) {
        for id in clients {
            let Some(outcomes) = client(sim, id).and_then(|core| core.outcomes()) else { continue };
            let seen = self.seen.entry(id.clone()).or_default();
            if outcomes.acknowledged.len() < seen.0
                || outcomes.refused.len() < seen.1
                || outcomes.confirmed_late.len() < seen.2
            {
                *seen = (0, 0, 0); // a new incarnation
            }
            self.confirmed_late.extend(outcomes.confirmed_late[seen.2..].iter().copied());
            for (tx, number, hash) in &outcomes.acknowledged[seen.0..] {
                self.acknowledged.insert(*tx, (*number, *hash));
            }
            for (tx, reason) in &outcomes.refused[seen.1..] {
                self.refused.insert(*tx, reason.clone());
            }
            *seen = (outcomes.acknowledged.len(), outcomes.refused.len(), outcomes.confirmed_late.len());
        }
    }

    fn answered(&self, hash: &B256) -> bool {
        self.acknowledged.contains_key(hash) || self.refused.contains_key(hash) || self.confirmed_late.contains(hash)
    }

    /// Every client is up and idle with each of its transfers answered one way or another.
    pub fn settled(&self, sim: &Sim<RainblockNode>, clients: &[String], offered: &[Vec<UserTransfer>]) -> bool {
        clients.iter().zip(offered).all(|(id, transfers)| {
            client(sim, id).is_some_and(|core| core.is_idle() && core.accepted() > 0)
                && transfers.iter().all(|t| self.answered(&t.tx.hash()))
        })
    }

    /// Why the run has not settled, for the failure report.
    pub fn unsettled(&self, sim: &Sim<RainblockNode>, clients: &[String], offered: &[Vec<UserTransfer>]) -> String {
        let open: usize = offered.iter().flatten().filter(|t| !self.answered(&t.tx.hash())).count();
        let idle: Vec<String> = clients
            .iter()
            .map(|id| {
                format!("{id} {}", client(sim, id).map_or("down".to_string(), |c| format!("idle={}", c.is_idle())))
            })
            .collect();
        let miner = match sim.core("miner-0").and_then(|node| node.role::<crate::miner::MinerCore>()) {
            Some(core) => {
                let (warm, failure) = core.warm_up_state();
                format!("miner-0 head {} warm={warm} last warm-up failure {failure:?}", core.head().0)
            }
            _ => "miner-0 down".to_string(),
        };
        format!("{open} transfers unanswered; {}; {miner}", idle.join(", "))
    }
}

pub struct Checked {
    pub problems: Vec<String>,
    pub committed: usize,
    pub blocks: u64,
}

/// Runs every check on a settled run.
#[allow(clippy::too_many_arguments)]
pub fn check(
    fixture: &Fixture,
    sim: &mut Sim<RainblockNode>,
    disks: &Disks,
    view: &UserView,
    offered: &[UserTransfer],
    storage_ids: &[String],
    miner_ids: &[String],
    seed: u64,
) -> Checked {
    let mut problems = Vec::new();
    let chain = match replay_chain(fixture, disks, "miner-0") {
        Ok(chain) => chain,
        Err(problem) => {
            return Checked { problems: vec![problem.to_string()], committed: 0, blocks: 0 };
        }
    };
    let head = chain.hashes.len() as u64 - 1;
    let expected_shards = match shard_state(chain.state.accounts().as_trie(), fixture.topology.shards) {
        Ok(shards) => shards,
        Err(error) => {
            return Checked {
                problems: vec![format!("sharding the replayed state: {error}")],
                committed: 0,
                blocks: head,
            }
        }
    };
    // 2. Storage nodes, live and after a crash.
    for id in storage_ids {
        problems.extend(check_storage_node(fixture, sim, disks, id, &chain, &expected_shards, seed));
    }
    // 3. Acknowledged transfers are in the chain where they were acknowledged.
    for (tx, (number, hash)) in &view.acknowledged {
        match chain.transfers.get(tx) {
            Some(&at) if at == *number && chain.hashes.get(at as usize) == Some(hash) => {}
            Some(&at) => {
                problems.push(format!("transfer {tx} was acknowledged in block {number} ({hash}) but is in block {at}"))
            }
            None => problems
                .push(format!("transfer {tx} was acknowledged in block {number} ({hash}) and is not in the chain")),
        }
    }
    for tx in &view.confirmed_late {
        if !chain.transfers.contains_key(tx) {
            problems.push(format!("transfer {tx} was confirmed committed by its nonce and is not in the chain"));
        }
    }
    // 4. No wrong root accepted: every follower's own chain verifies too (a follower may
    // hold a valid block the producer then lost, announced early by a lying producer).
    for id in miner_ids.iter().filter(|id| id.as_str() != "miner-0") {
        // A follower whose chain store refused to open (a media fault) accepted nothing.
        let unopened = sim
            .core(id)
            .is_some_and(|node| node.role::<virga_sim::media::Unopened<crate::protocol::Rainblock>>().is_some());
        if unopened {
            continue;
        }
        match replay_chain(fixture, disks, id) {
            // Damage a media fault did since the follower last opened its store: found when
            // the store is opened, never a block it accepted.
            Ok(_) | Err(ChainProblem::Open(_)) => {}
            Err(problem) => problems.push(format!("{id} accepted a block that does not verify: {problem}")),
        }
    }
    // 5. Every offered transfer committed or refused with a reason.
    let mut committed = 0;
    let mut unanswered = Vec::new();
    for transfer in offered {
        let hash = transfer.tx.hash();
        if chain.transfers.contains_key(&hash) {
            committed += 1;
        } else if !view.refused.contains_key(&hash) {
            unanswered.push(hash);
        }
    }
    if let Some(first) = unanswered.first() {
        problems.push(format!("{} transfers were neither committed nor refused, {first} first", unanswered.len()));
    }
    let unique: HashSet<B256> = offered.iter().map(|t| t.tx.hash()).collect();
    if unique.len() != offered.len() {
        problems.push("the workload offered a transfer twice".to_string());
    }
    Checked { problems, committed, blocks: head }
}

/// Check 2: storage node `id` holds the chain's head with its served shards hashing as the
/// serial replay's, and still does after its memory device crashes now.
fn check_storage_node(
    fixture: &Fixture,
    sim: &Sim<RainblockNode>,
    disks: &Disks,
    id: &str,
    chain: &Replayed,
    expected_shards: &virga_trie::ShardedTrie,
    seed: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let head = chain.hashes.len() as u64 - 1;
    let head_hash = chain.hashes[head as usize];
    let served = fixture.served(id).map(|served| served.shards).unwrap_or_default();
    let expected: Vec<(usize, B256)> =
        served.iter().filter_map(|&i| expected_shards.shard(i).map(|s| (i, s.subtree_hash()))).collect();
    match sim.core(id).and_then(|node| node.role::<crate::storage::StorageCore>()) {
        Some(core) => match core.shard_hashes(&head_hash) {
            Some(hashes) if hashes == expected => {}
            Some(hashes) => problems.push(format!("{id}'s shards at the head differ from a serial replay: {hashes:?}")),
            None => problems.push(format!("{id} does not hold the chain's head, block {head} ({head_hash})")),
        },
        _ => problems.push(format!("{id} is down at the end")),
    }
    let crashed = disks.borrow().get(id).map(|storage| storage.crash(seed ^ 0xc4a5));
    let Some(crashed) = crashed else { return problems };
    let storage: Arc<dyn Storage> = Arc::new(crashed);
    let reopened = NodeStorage::on(storage, log_options()).map_err(|e| e.to_string()).and_then(|storage| {
        let served = fixture.served(id).ok_or("not a storage node")?;
        open_core(id, served, fixture.header.clone(), &fixture.sharded, storage).map_err(|e| e.to_string())
    });
    match reopened {
        Ok(opened) if opened.core.shard_hashes(&head_hash).as_ref() == Some(&expected) => {}
        Ok(_) => problems.push(format!(
            "{id} loses the chain's head, block {head}, in a crash: a block acknowledged to the miner was not durable"
        )),
        Err(error) => problems.push(format!("{id} does not recover after a crash: {error}")),
    }
    problems
}

/// The producing miner's chain, replayed serially from genesis.
struct Replayed {
    hashes: Vec<B256>,
    roots: Vec<B256>,
    /// Transfer hash → block number.
    transfers: HashMap<B256, u64>,
    state: virga_trie::account::StateTrie,
}

/// Why a miner's chain does not replay (a problem the run reports).
#[derive(Debug, thiserror::Error)]
enum ChainProblem {
    #[error("{0} has no disk")]
    NoDisk(String),
    #[error("the chain store does not open: {0}")]
    Open(#[source] StoreError),
    #[error("{0}")]
    Pool(#[from] rayon::ThreadPoolBuildError),
    #[error("block {number}: {source}")]
    Read {
        number: u64,
        #[source]
        source: StoreError,
    },
    #[error("block {0} is missing from the chain")]
    Missing(u64),
    #[error("block {number} does not decode: {source}")]
    Decode {
        number: u64,
        #[source]
        source: virga_ledger::block::BlockError,
    },
    #[error("the chain does not verify at block {number}: {source}")]
    Invalid {
        number: u64,
        #[source]
        source: virga_ledger::verify::VerifyError,
    },
    #[error("transfer {tx} is in the chain twice, in blocks {earlier} and {number}")]
    Twice { tx: B256, earlier: u64, number: u64 },
}

/// 1. The chain verifies: every block on its parent, re-executed.
fn replay_chain(fixture: &Fixture, disks: &Disks, miner: &str) -> Result<Replayed, ChainProblem> {
    let storage: Arc<dyn Storage> =
        Arc::new(disks.borrow().get(miner).cloned().ok_or_else(|| ChainProblem::NoDisk(miner.to_string()))?);
    let (store, _) = ChainStore::open_read_only(storage, StoreOptions::default()).map_err(ChainProblem::Open)?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut parent = fixture.header.clone();
    let mut state = fixture.state.clone();
    let mut replayed = Replayed {
        hashes: vec![parent.hash_slow()],
        roots: vec![parent.state_root],
        transfers: HashMap::new(),
        state: fixture.state.clone(),
    };
    let head = store.head().map_or(0, |(number, _)| number);
    let mut hashes = virga_ledger::exec::RecentHashes::default();
    hashes.push(parent.number, parent.hash_slow());
    for number in 1..=head {
        let bytes = store
            .get_by_number(number)
            .map_err(|source| ChainProblem::Read { number, source })?
            .ok_or(ChainProblem::Missing(number))?;
        let block = Block::decode(&bytes).map_err(|source| ChainProblem::Decode { number, source })?;
        let verified = verify_block(&fixture.config, &parent, &state, &hashes, &block, None, ExecMode::Serial, &pool)
            .map_err(|source| ChainProblem::Invalid { number, source })?;
        state = verified.state;
        hashes.push(number, block.hash());
        for tx in &block.transactions {
            if let Some(earlier) = replayed.transfers.insert(tx.hash(), number) {
                return Err(ChainProblem::Twice { tx: tx.hash(), earlier, number });
            }
        }
        replayed.hashes.push(block.hash());
        replayed.roots.push(block.header.state_root);
        parent = block.header;
    }
    replayed.state = state;
    Ok(replayed)
}
