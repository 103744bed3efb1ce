//! Admission and block building: a batch of submissions becomes a block on the tip.
//!
//! Building is a [`BuildJob`] the core hands out as a device operation
//! ([`super::MinerIo::Build`]): it carries a copy of everything it reads, so the driver runs
//! it on its execution pool, on a thread of its own, while the core goes on committing the
//! previous block, and the simulator runs it deterministically. The core keeps one build in
//! flight and takes the block on its completion unless the tip's epoch changed meanwhile.
//! This module is the job's body, which only the driver runs; it is no part of the core.
//!
//! A bag's nodes attach to the top layer only where they hash to a hash node it holds (so a
//! bag cannot change what the miner believes), which also revises witnesses taken at an
//! older root. A transfer whose accounts still cannot be read aborts as `stale_witness`;
//! every signature is recovered.

use crate::messages::{BlockUpdates, KeyUpdate, SlotUpdate, TxOutcome};
use crate::protocol::Rainblock;
use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, B256};
use std::collections::{HashMap, HashSet};
use virga_core::KECCAK_EMPTY;
use virga_evm::BlockWrites;
use virga_ledger::builder::{build_block, Built as BuiltBlock};
use virga_ledger::exec::StateSource;
use virga_ledger::tx::{RecoveredTx, SignedTx};
use virga_net::role::{Command, Nanos};
use virga_trie::account::storage_value_rlp;
use virga_trie::proof::NodeBag;
use virga_trie::PartialTrie;

use std::sync::Arc;

use super::contract_bags::{ContractBagError, ContractBags};
use super::top_layer::{kept_through_prune, record_paths, Layer, Pruning, WRITE_ALLOWANCE_BYTES};
use super::{refuse_submission, Built, LeftOut, MinerConfig, MinerIo, MinerStats, Pending, Replies, UpdatesError};
use crate::codec::check_keys;
use crate::storage::prefix_nibbles;

/// Why a transfer whose nonce its sender has used already is left out.
pub const NONCE_USED: &str = LeftOut::NonceUsed.code();

/// A transfer's place in the block being built (its index among the admitted), or why it was left out.
type AdmissionSlot = (B256, Result<usize, LeftOut>);

/// The admitted transfers of a batch, each submission's slots, and the bags used.
struct Admitted {
    transfers: Vec<RecoveredTx>,
    slots: Vec<(String, virga_net::role::CallId, Vec<AdmissionSlot>)>,
    bags: Vec<NodeBag>,
    contracts: ContractBags,
}

/// Building one block: a batch of submissions and a copy of the tip it builds on.
pub struct BuildJob {
    config: Arc<MinerConfig>,
    tip: Layer,
    /// The tip's epoch when the job was handed out.
    epoch: u64,
    /// The clock reading the block's timestamp comes from.
    now: Nanos,
    batch: Vec<Pending>,
    pruning: Pruning,
    /// [`super::MinerFault::WrongRoot`]: the block announces a wrong state root.
    wrong_root: bool,
    /// Counters of this build, added to the core's on completion.
    stats: MinerStats,
    /// Answers to submissions refused whole, or whose block failed to build.
    answers: Vec<Command<Rainblock, MinerIo>>,
}

/// What a [`BuildJob`] hands back to the core.
pub struct BuildOutcome {
    pub(crate) built: Option<Built>,
    pub(crate) answers: Vec<Command<Rainblock, MinerIo>>,
    pub(crate) stats: MinerStats,
    pub(crate) pruning: Pruning,
}

impl std::fmt::Debug for BuildJob {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let transfers: usize = self.batch.iter().map(|pending| pending.submission.transactions.len()).sum();
        formatter
            .debug_struct("BuildJob")
            .field("parent", &self.tip.header.number)
            .field("epoch", &self.epoch)
            .field("submissions", &self.batch.len())
            .field("transfers", &transfers)
            .finish()
    }
}

impl std::fmt::Debug for BuildOutcome {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BuildOutcome")
            .field("block", &self.built.as_ref().map(|built| (built.block.header.number, built.hash)))
            .field("answers", &self.answers.len())
            .finish()
    }
}

impl BuildJob {
    /// The transfers the job builds from (the simulator's cost model charges per transfer).
    pub fn transfers(&self) -> usize {
        self.batch.iter().map(|pending| pending.submission.transactions.len()).sum()
    }

    pub fn submissions(&self) -> usize {
        self.batch.len()
    }

    /// Builds the block on `pool`.
    pub fn run(mut self, pool: &rayon::ThreadPool) -> BuildOutcome {
        let built = self.build(pool);
        BuildOutcome { built, answers: self.answers, stats: self.stats, pruning: self.pruning }
    }
}

impl BuildJob {
    /// The job that builds `batch` on `tip` (in `epoch`), timestamped from `now`.
    pub(crate) fn new(
        config: Arc<MinerConfig>,
        tip: Layer,
        epoch: u64,
        now: Nanos,
        batch: Vec<Pending>,
        pruning: Pruning,
        wrong_root: bool,
    ) -> BuildJob {
        BuildJob {
            config,
            tip,
            epoch,
            now,
            batch,
            pruning,
            wrong_root,
            stats: MinerStats::default(),
            answers: Vec::new(),
        }
    }
}

impl BuildJob {
    fn abort(&mut self, reason: &str, count: u64) {
        *self.stats.aborted.entry(reason.to_string()).or_default() += count;
    }

    /// Decodes and recovers every transfer of the batch, in parallel.
    fn recover_batch(batch: &[Pending], pool: &rayon::ThreadPool) -> Vec<Vec<Result<RecoveredTx, LeftOut>>> {
        pool.install(|| {
            use rayon::prelude::*;
            batch
                .par_iter()
                .map(|pending| {
                    pending
                        .submission
                        .transactions
                        .par_iter()
                        .with_min_len(8)
                        .map(|bytes| {
                            let tx = SignedTx::decode(bytes).map_err(|_| LeftOut::MalformedTransaction)?;
                            RecoveredTx::recover(tx).map_err(|_| LeftOut::BadSignature)
                        })
                        .collect()
                })
                .collect()
        })
    }

    /// Attaches the batch's bags to `layer` and admits each transfer whose accounts it can read.
    fn admit(&mut self, batch: Vec<Pending>, layer: &mut Layer, pool: &rayon::ThreadPool) -> Admitted {
        let decoded = Self::recover_batch(&batch, pool);
        let current_root = layer.header.state_root;
        let mut admitted =
            Admitted { transfers: Vec::new(), slots: Vec::new(), bags: Vec::new(), contracts: ContractBags::default() };
        let mut blocked_senders: HashSet<Address> = HashSet::new();
        // Each admitted sender's next nonce, so a transfer is never admitted twice in a batch.
        let mut next_nonces: HashMap<Address, u64> = HashMap::new();
        for (pending, transfers) in batch.into_iter().zip(decoded) {
            let Pending { from, call, submission } = pending;
            let (bag, witness_root) = (submission.bag, submission.witness_root);
            let contracts = match attach_bags(layer, &bag, submission.storage, submission.codes) {
                Ok(contracts) => contracts,
                Err(reason) => {
                    let reason = reason.to_string();
                    refuse_submission(&self.config.id, &mut self.stats, from, call, &reason, &mut self.answers);
                    continue;
                }
            };
            if witness_root != current_root {
                self.stats.revised_submissions += 1;
            }
            let mut outcomes = Vec::with_capacity(transfers.len());
            let mut used_bag = false;
            for (bytes, transfer) in submission.transactions.iter().zip(transfers) {
                let transfer = match transfer {
                    Ok(transfer) => transfer,
                    Err(reason) => {
                        self.abort(reason.code(), 1);
                        outcomes.push((keccak256(bytes), Err(reason)));
                        continue;
                    }
                };
                let sender = transfer.sender;
                let to = transfer.tx.to().unwrap_or_else(|| sender.create(transfer.tx.nonce()));
                let sender_account = layer.top.account(&sender);
                let reason = if blocked_senders.contains(&sender) {
                    Some(LeftOut::EarlierTransferAborted)
                } else if sender_account.is_err() || layer.top.account(&to).is_err() {
                    Some(LeftOut::StaleWitness)
                } else if transfer.tx.nonce()
                    < next_nonces
                        .get(&sender)
                        .copied()
                        .unwrap_or_else(|| sender_account.ok().flatten().map_or(0, |account| account.nonce))
                {
                    // Already in a block or this batch (a duplicated or retried submission): never twice.
                    Some(LeftOut::NonceUsed)
                } else {
                    None
                };
                match reason {
                    Some(reason) => {
                        // Later transfers of this sender would fail on their nonce: hold them back too.
                        blocked_senders.insert(sender);
                        self.abort(reason.code(), 1);
                        outcomes.push((transfer.tx.hash(), Err(reason)));
                    }
                    None => {
                        next_nonces.insert(sender, transfer.tx.nonce().saturating_add(1));
                        used_bag = true;
                        outcomes.push((transfer.tx.hash(), Ok(admitted.transfers.len())));
                        admitted.transfers.push(transfer);
                    }
                }
            }
            if used_bag {
                admitted.bags.push(bag);
                admitted.contracts.extend(contracts);
            }
            admitted.slots.push((from, call, outcomes));
        }
        admitted
    }

    /// Admits what can be executed from the batch and builds the block on the tip.
    fn build(&mut self, pool: &rayon::ThreadPool) -> Option<Built> {
        let mut layer = self.tip.clone();
        let parent = layer.header.clone();
        let batch = std::mem::take(&mut self.batch);
        let Admitted { transfers, slots, bags, contracts } = self.admit(batch, &mut layer, pool);
        let timestamp = self.now / 1_000_000_000;
        let config = Arc::clone(&self.config);
        let built = build_block(
            &config.chain,
            &parent,
            &mut layer.top,
            &layer.hashes,
            transfers,
            config.beneficiary,
            timestamp,
            pool,
        );
        let built = match built {
            Ok(built) => misbuild(built, self.wrong_root),
            Err(error) => {
                // Every account was checked readable, so this is a bug; nothing is committed.
                tracing::error!(miner = %config.id, %error, "building the block failed");
                let slots = slots.into_iter().map(|(to, call, outcomes)| {
                    (to, call, outcomes.into_iter().map(|(tx_hash, _)| left_out(tx_hash, String::new())).collect())
                });
                self.answer_unbuilt(slots.collect());
                return None;
            }
        };
        let hash = built.block.hash();
        let touched: Vec<B256> = built.outcome.touched_keys().collect();
        self.count_refused(&built.refused);
        let replies = outcomes_of(slots, &built);
        layer.estimated_bytes += touched.len().saturating_add(1).saturating_mul(WRITE_ALLOWANCE_BYTES);
        record_paths(&mut layer.unpruned, touched.iter().copied());
        let updates =
            match logical_updates(&config, &built.block.header, &layer.top.accounts, touched, &built.outcome.writes) {
                Ok(updates) => updates,
                Err(reason) => {
                    // The tip stays where it was; the block's submissions are answered as left out.
                    tracing::error!(miner = %config.id, %reason, "collecting updates failed");
                    self.answer_unbuilt(replies);
                    return None;
                }
            };
        let keep = kept_through_prune(config.beneficiary, &built.outcome.writes);
        layer.estimated_bytes = self.pruning.maybe_prune(
            &mut layer.top,
            layer.estimated_bytes,
            &mut layer.unpruned,
            config.top_budget_bytes,
            config.retention,
            &keep,
            &mut self.stats,
        );
        layer.advance(built.block.header.clone(), hash);
        let bag = NodeBag::merge(bags);
        Some(Built { block: built.block, hash, updates, bag, contracts, replies, layer, epoch: self.epoch })
    }

    /// Counts the admitted transactions execution refused, by reason.
    fn count_refused(&mut self, refused: &[virga_ledger::exec::Refused]) {
        for refused in refused {
            self.abort(refused.reason.name(), 1);
        }
    }

    /// Answers the submissions of a block that could not be built: nothing was included.
    fn answer_unbuilt(&mut self, replies: Replies) {
        for (to, call, outcomes) in replies {
            let outcomes = outcomes
                .into_iter()
                .map(|outcome| TxOutcome {
                    included: false,
                    succeeded: false,
                    reason: "block_build_failed".to_string(),
                    ..outcome
                })
                .collect();
            self.answers.push(Command::Reply { to, call, response: super::outcomes_reply(None, outcomes) });
        }
    }
}

/// Under [`super::MinerFault::WrongRoot`], the block announces a state root with one byte
/// flipped and is sealed again, so its header is otherwise valid.
fn misbuild(mut built: BuiltBlock, wrong_root: bool) -> BuiltBlock {
    if wrong_root {
        let header = &mut built.block.header;
        header.state_root.0[31] ^= 0x01;
        virga_ledger::pow::mine(header, 0);
    }
    built
}

/// Why a submission's bags do not attach to the top layer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BagRefusal {
    #[error("node bag refused: {0}")]
    Keys(#[source] crate::codec::WireError),
    #[error("node bag refused: {0}")]
    Bag(#[from] virga_trie::partial::BagError),
    #[error("node bag refused: {0}")]
    Contracts(#[from] ContractBagError),
}

/// Attaches a submission's account bag, then its slot bags (to the storage roots of the
/// accounts the bag just brought) and code, to `layer`; returns the contract part, or why
/// the submission is refused.
fn attach_bags(
    layer: &mut Layer,
    bag: &NodeBag,
    storage: Vec<crate::messages::StorageBag>,
    codes: Vec<Vec<u8>>,
) -> Result<ContractBags, BagRefusal> {
    // Bags attach along their keys' paths; pruning later walks those paths only.
    check_keys(&bag.keys).map_err(BagRefusal::Keys)?;
    // Witness revision: unchanged subtrees attach by hash; what changed is ours already.
    let grown = attach_bag(&mut layer.top.accounts, bag)?;
    layer.estimated_bytes += grown;
    record_paths(&mut layer.unpruned, bag.keys.iter().map(|key| B256::from_slice(key)));
    let contracts = ContractBags::from_messages(storage, codes).map_err(ContractBagError::from)?;
    layer.estimated_bytes += contracts.attach(&mut layer.top)?;
    Ok(contracts)
}

/// Attaches a bag's nodes where they hash to hash nodes the layer holds; returns the bytes
/// the layer grew by.
pub(crate) fn attach_bag(top: &mut PartialTrie, bag: &NodeBag) -> Result<usize, virga_trie::partial::BagError> {
    top.apply_bag(bag).map(|applied| applied.grown_bytes)
}

/// Each touched account's new value and its contract's storage changes and new code,
/// grouped for the storage node serving its shard, and every shard's new subtree hash.
fn logical_updates(
    config: &MinerConfig,
    header: &Header,
    top: &PartialTrie,
    mut keys: Vec<B256>,
    writes: &BlockWrites,
) -> Result<Vec<(String, BlockUpdates)>, UpdatesError> {
    let prefix = prefix_nibbles(config.shard_count).unwrap_or(0);
    keys.push(keccak256(config.beneficiary));
    keys.sort_unstable();
    keys.dedup();
    let mut by_shard: HashMap<usize, Vec<KeyUpdate>> = HashMap::new();
    for key in keys {
        let value = top.get(key.as_slice()).map_err(UpdatesError::NotHeld)?;
        let shard = virga_trie::shard::shard_of(key.as_slice(), prefix)?;
        by_shard
            .entry(shard)
            .or_default()
            .push(KeyUpdate { key, value: value.map(|v| v.into_owned()).unwrap_or_default() });
    }
    let shard_hashes = (0..config.shard_count)
        .map(|index| {
            let path: Vec<u8> = (0..prefix).map(|i| ((index >> (4 * (prefix - 1 - i))) & 15) as u8).collect();
            top.subtree_hash_at(&path).map_err(|source| UpdatesError::ShardHash { shard: index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let contracts = contract_updates(writes, prefix)?;
    Ok(config
        .storage_nodes
        .iter()
        .map(|(peer, shards)| {
            let updates = shards.iter().flat_map(|shard| by_shard.get(shard).cloned().unwrap_or_default()).collect();
            let mut message = BlockUpdates {
                header: header.clone(),
                shard_hashes: shard_hashes.clone(),
                updates,
                slots: Vec::new(),
                cleared: Vec::new(),
                codes: Vec::new(),
            };
            for shard in shards {
                if let Some(contract) = contracts.get(shard) {
                    message.slots.extend(contract.slots.iter().cloned());
                    message.cleared.extend(contract.cleared.iter().cloned());
                    message.codes.extend(contract.codes.iter().cloned());
                }
            }
            (peer.clone(), message)
        })
        .collect())
}

/// One shard's contract changes in a block.
#[derive(Default)]
struct ContractUpdates {
    slots: Vec<SlotUpdate>,
    cleared: Vec<B256>,
    codes: Vec<Vec<u8>>,
}

/// The block's storage changes (wipes, slots) and deployed code, by the shard of their
/// account. Code goes with a created account only: existing contracts' code is held.
fn contract_updates(writes: &BlockWrites, prefix: usize) -> Result<HashMap<usize, ContractUpdates>, UpdatesError> {
    let mut by_shard: HashMap<usize, ContractUpdates> = HashMap::new();
    for (address, write) in &writes.accounts {
        let key = keccak256(address);
        let deleted = write.info.is_none();
        if !deleted && !write.storage_cleared && write.slots.is_empty() {
            continue;
        }
        let shard = by_shard.entry(virga_trie::shard::shard_of(key.as_slice(), prefix)?).or_default();
        if deleted || write.storage_cleared {
            shard.cleared.push(key);
        }
        for (slot, value) in &write.slots {
            let value = if value.is_zero() { Vec::new() } else { storage_value_rlp(*value) };
            let slot = keccak256(B256::from(*slot));
            shard.slots.push(SlotUpdate { account: key, slot, value });
        }
        let created = write.info.as_ref().filter(|info| write.storage_cleared && info.code_hash != KECCAK_EMPTY);
        if let Some(code) = created.and_then(|info| info.code.as_ref()) {
            shard.codes.push(code.original_bytes().to_vec());
        }
    }
    Ok(by_shard)
}

fn left_out(tx_hash: B256, reason: String) -> TxOutcome {
    TxOutcome { tx_hash, included: false, succeeded: false, reason }
}

/// Each submission's outcomes from the block's receipts and refusals (`Ok(index)` is a
/// position among the candidates the block was built from).
fn outcomes_of(slots: Vec<(String, virga_net::role::CallId, Vec<AdmissionSlot>)>, built: &BuiltBlock) -> Replies {
    let receipt_of = |index: usize| {
        built.outcome.executed.included.binary_search(&index).ok().and_then(|at| built.outcome.receipts().get(at))
    };
    let refusal_of = |index: usize| built.refused.iter().find(|refused| refused.index == index);
    slots
        .into_iter()
        .map(|(to, call, outcomes)| {
            let outcomes = outcomes
                .into_iter()
                .map(|(tx_hash, slot)| match slot {
                    Ok(index) => match (receipt_of(index), refusal_of(index)) {
                        (Some(receipt), _) => TxOutcome {
                            tx_hash,
                            included: true,
                            succeeded: receipt.success,
                            reason: if receipt.success { String::new() } else { "reverted".to_string() },
                        },
                        (None, Some(refused)) => left_out(tx_hash, refused.reason.name().to_string()),
                        // Left out by the builder's gas bound: the client resubmits it.
                        (None, None) => left_out(tx_hash, "block_full".to_string()),
                    },
                    Err(reason) => left_out(tx_hash, reason.code().to_string()),
                })
                .collect();
            (to, call, outcomes)
        })
        .collect()
}
