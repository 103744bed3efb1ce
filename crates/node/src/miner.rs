//! RainBlock's miner: executes against its private top layer with no state I/O.
//!
//! Clients submit transfers with node bags. The miner attaches a bag's nodes to its top
//! layer only where they hash to a hash node it holds (so a bag cannot change what the
//! miner believes), which also revises witnesses taken at an older root: nodes of unchanged
//! subtrees attach, nodes the miner already has newer versions of are ignored. A transfer
//! whose accounts still cannot be read aborts as `stale_witness`. Every signature is
//! recovered. The block is built with the ledger's builder on the top layer; its logical
//! updates and every shard's new hash go to the storage nodes, and the block commits once
//! all of them have logged it; if one refuses it, the block (and any built on it) is
//! dropped and its transfers answered `block_refused`. Once committed, the block goes with
//! its bag to the other miners, which verify it from their own top layers (so a follower
//! never adopts a block the storage nodes refused). The top layer is pruned to retention
//! level r whenever it outgrows its memory budget.

use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, B256};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use virga_ledger::block::Block;
use virga_ledger::builder::build_block;
use virga_ledger::exec::AccountState;
use virga_ledger::store::{ChainStore, StoreOptions};
use virga_ledger::tx::{RecoveredTransfer, SignedTransfer};
use virga_ledger::verify::{check_block, execute_block, max_transfers, ChainConfig, ExecMode};
use virga_net::proto::{self, BlockUpdates, KeyUpdate, Submission, TxOutcome};
use virga_net::{
    refusal, request, response, BoxFuture, Handler, NetError, Request, RequestBody, Response, ResponseBody, Transport,
};
use virga_trie::proof::NodeBag;
use virga_trie::PartialTrie;

use crate::codec::{b256, bag_from_wire, bag_to_wire, block_id, check_keys, decode_block, parse_block_id};
use crate::storage::prefix_nibbles;

#[derive(Clone, Debug)]
pub struct MinerConfig {
    pub id: String,
    pub chain: ChainConfig,
    pub shard_count: usize,
    /// Storage nodes by peer id, with the shards each serves.
    pub storage_nodes: Vec<(String, Vec<usize>)>,
    /// Other miners that verify this miner's blocks.
    pub peers: Vec<String>,
    /// Retention level r: the top layer keeps trie levels 0..=r when pruned.
    pub retention: usize,
    /// The top layer is pruned once its estimated memory exceeds this.
    pub top_budget_bytes: usize,
    /// Transfers per block at most (also bounded by the gas limit).
    pub max_block_transfers: usize,
    pub beneficiary: Address,
}

/// Why transfers did not make it into a block, and other counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MinerStats {
    pub blocks: u64,
    pub included: u64,
    pub succeeded: u64,
    /// Transfers left out, by reason (`stale_witness`, `bad_signature`, …).
    pub aborted: HashMap<String, u64>,
    /// Receipts of failed transfers, by reason.
    pub failed: HashMap<String, u64>,
    /// Submissions whose witness was taken at an older root than the miner's.
    pub revised_submissions: u64,
    pub rejected_submissions: u64,
    pub prunes: u64,
    /// Nodes of the top layer (hash nodes included) when the stats were read.
    pub top_nodes: usize,
    /// The top layer's memory: its bound after the last prune, measured when the stats are read.
    pub top_bytes: usize,
    /// The largest measured (at whole prunes and when the stats were read).
    pub peak_top_bytes: usize,
    /// Blocks from other miners verified (follower) and refused.
    pub verified_blocks: u64,
    pub refused_blocks: u64,
    /// This miner's blocks dropped uncommitted: refused by a storage node, or built on one
    /// that was. Their transfers count in `aborted` as `block_refused`.
    pub abandoned_blocks: u64,
    /// Refusals of this miner's blocks: the storage node or follower miner, and its reason.
    pub block_refusals: Vec<(String, String)>,
    /// Witnesses from storage nodes refused while warming up: the node, and why.
    pub bad_witnesses: Vec<(String, String)>,
}

/// A miner's deliberate misbehaviour, for the trust tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinerFault {
    /// Honest.
    #[default]
    None,
    /// Every block built announces a state root with one byte flipped; its work is then
    /// done again, so the header is otherwise valid.
    WrongRoot,
}

/// Why a transfer of a dropped block was not included: its client submits it again.
pub const BLOCK_REFUSED: &str = "block_refused";

/// A transfer's place in the block being built (its index among the admitted), or why it was left out.
type AdmissionSlot = (B256, Result<usize, String>);

struct Pending {
    from: String,
    submission: Submission,
    reply: oneshot::Sender<Response>,
}

/// The block the next one builds on, with the top layer after it. Blocks are built ahead
/// of their commit, so the tip may be up to [`COMMIT_QUEUE`] + 1 blocks past the committed head.
struct Tip {
    header: Header,
    top: PartialTrie,
    /// An upper bound of `top.memory_bytes()`, so the layer is walked only when it may be
    /// over budget.
    estimated_bytes: usize,
    unpruned: Unpruned,
    /// Raised each time the tip goes back to the committed head because a block was
    /// refused: a block built in an older epoch descends from the refused one.
    epoch: u64,
}

/// The newest block every storage node has logged, with the top layer after it: what
/// clients take witnesses at, and where the tip returns when a block is refused.
#[derive(Clone)]
struct Committed {
    header: Header,
    hash: B256,
    top: PartialTrie,
    estimated_bytes: usize,
    unpruned: Unpruned,
}

/// The keys whose paths in the top layer grew (bags attached, accounts written) since it
/// was last pruned, so a prune walks only those; `None` when unknown or too many to be
/// worth it (after a warm-up, or past [`UNPRUNED_PATHS_LIMIT`]): the next prune walks the
/// whole layer.
type Unpruned = Option<Vec<B256>>;

/// Past this many recorded paths the next prune walks the whole top layer instead.
const UNPRUNED_PATHS_LIMIT: usize = 1 << 16;

/// Every this many prunes, the prune walks the whole top layer and measures it: that
/// removes what pruning along paths leaves (the subtree an insert moves down beside its
/// path) and brings the memory bound (an allowance per write) back to the truth.
const WHOLE_PRUNE_EVERY: u64 = 16;

/// Records keys whose paths grew since the last prune.
fn record_paths(unpruned: &mut Unpruned, keys: impl IntoIterator<Item = B256>) {
    if let Some(paths) = unpruned {
        paths.extend(keys);
        if paths.len() > UNPRUNED_PATHS_LIMIT {
            *unpruned = None;
        }
    }
}

/// Built blocks waiting for the block before them to commit.
const COMMIT_QUEUE: usize = 1;

/// What one written account may add to the top layer at most: a new leaf and the branch
/// that splits the slot it lands in, each with its struct.
const WRITE_ALLOWANCE_BYTES: usize = 1024;

pub struct Miner {
    config: MinerConfig,
    inbox: Mutex<Vec<Pending>>,
    wake: Notify,
    tip: Mutex<Tip>,
    committed: Mutex<Committed>,
    store: Mutex<Option<ChainStore>>,
    stats: Mutex<MinerStats>,
    /// The top layer's size just after the last whole prune (0 before any).
    pruned_bytes: std::sync::atomic::AtomicUsize,
    pool: rayon::ThreadPool,
    #[cfg(feature = "fault-injection")]
    fault: Mutex<MinerFault>,
}

/// Submissions' answer channels with the outcomes of their transfers.
type Replies = Vec<(oneshot::Sender<Response>, Vec<TxOutcome>)>;

/// A built block ready to commit.
struct Built {
    block: Block,
    hash: B256,
    updates: Vec<(String, BlockUpdates)>,
    bag: NodeBag,
    replies: Replies,
    /// The top layer after the block, and its memory bound.
    top: PartialTrie,
    estimated_bytes: usize,
    unpruned: Unpruned,
    /// The tip's epoch the block was built in.
    epoch: u64,
}

impl Miner {
    /// A miner whose committed chain is in `store` (head `header`), with an empty top layer
    /// (call [`Miner::warm_up`] before mining).
    pub fn new(config: MinerConfig, header: Header, store: Option<ChainStore>) -> Result<Arc<Miner>, String> {
        prefix_nibbles(config.shard_count)
            .ok_or_else(|| format!("shard count {} is not 1, 16 or 256", config.shard_count))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|index| format!("miner-exec-{index}"))
            .build()
            .map_err(|error| error.to_string())?;
        let hash = header.hash_slow();
        let top = PartialTrie::from_root_hash(header.state_root);
        let estimated_bytes = top.memory_bytes();
        Ok(Arc::new(Miner {
            config,
            inbox: Mutex::new(Vec::new()),
            wake: Notify::new(),
            committed: Mutex::new(Committed {
                header: header.clone(),
                hash,
                top: top.clone(),
                estimated_bytes,
                unpruned: None,
            }),
            tip: Mutex::new(Tip { header, top, estimated_bytes, unpruned: None, epoch: 0 }),
            store: Mutex::new(store),
            stats: Mutex::new(MinerStats::default()),
            pruned_bytes: std::sync::atomic::AtomicUsize::new(0),
            pool,
            #[cfg(feature = "fault-injection")]
            fault: Mutex::new(MinerFault::None),
        }))
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Makes this miner misbehave (or behave again) from the next block it builds on.
    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&self, fault: MinerFault) {
        tracing::info!(miner = %self.config.id, ?fault, "fault injected");
        *self.fault.lock() = fault;
    }

    /// Under [`MinerFault::WrongRoot`], flips a byte of the block's state root and does the
    /// work again: the block is then valid in every respect but its root.
    #[cfg(feature = "fault-injection")]
    fn misbuild(&self, mut built: virga_ledger::builder::Built) -> virga_ledger::builder::Built {
        if *self.fault.lock() == MinerFault::WrongRoot {
            let header = &mut built.block.header;
            header.state_root.0[31] ^= 0x01;
            virga_ledger::pow::mine(header, 0);
        }
        built
    }

    /// Counters, with the top layer's size measured now.
    pub fn stats(&self) -> MinerStats {
        let top = self.tip.lock().top.clone();
        let (top_nodes, top_bytes) = (top.node_count(), top.memory_bytes());
        let mut stats = self.stats.lock();
        stats.peak_top_bytes = stats.peak_top_bytes.max(top_bytes);
        MinerStats { top_nodes, top_bytes, ..stats.clone() }
    }

    /// The committed head: number, hash and state root.
    pub fn head(&self) -> (u64, B256, B256) {
        let committed = self.committed.lock();
        (committed.header.number, committed.hash, committed.header.state_root)
    }

    /// Fills the top layer with levels 0..=r from the storage nodes (checked by hash against
    /// the head's root) and the path of the beneficiary, which every block credits.
    pub async fn warm_up(&self, transport: &dyn Transport) -> Result<(), String> {
        let (number, hash, root) = self.head();
        let levels = self.config.retention.saturating_add(1).min(64) as u32;
        let mut nodes = Vec::new();
        for (peer, _) in &self.config.storage_nodes {
            let top = proto::TopRequest { levels, at: Some(block_id(number, hash)) };
            let reply = transport
                .call(&self.config.id, peer, request(RequestBody::Top(top)))
                .await
                .map_err(|error| error.to_string())?;
            match reply.body {
                Some(ResponseBody::Top(top)) => nodes.extend(top.nodes),
                _ => return Err(format!("{peer} answered a top request with something else")),
            }
        }
        let beneficiary =
            self.fetch_witness(transport, &[keccak256(self.config.beneficiary)], (number, hash), root).await?;
        let mut tip = self.tip.lock();
        let attached = tip.top.attach_nodes(&nodes).map_err(|error| format!("top-layer nodes: {error}"))?;
        tip.top.apply_bag(&beneficiary).map_err(|error| format!("beneficiary witness: {error}"))?;
        if tip.top.root_hash() != root {
            return Err("the top layer's root changed while warming up".to_string());
        }
        tracing::info!(miner = %self.config.id, attached = attached.attached, "top layer warmed up");
        let bytes = tip.top.memory_bytes();
        tip.estimated_bytes = bytes;
        // The storage nodes' top nodes may reach below r, off any recorded path.
        tip.unpruned = None;
        {
            let mut committed = self.committed.lock();
            if committed.hash == hash {
                committed.top = tip.top.clone();
                committed.estimated_bytes = bytes;
                committed.unpruned = None;
            }
        }
        let mut stats = self.stats.lock();
        stats.top_bytes = bytes;
        stats.peak_top_bytes = stats.peak_top_bytes.max(bytes);
        Ok(())
    }

    /// A full witness for `keys` at block `at` (state root `root`), from the storage nodes
    /// serving them. Each key's witness must be for that block and verify against `root`;
    /// a storage node whose witness does not is logged and counted, and the shard's next
    /// replica is asked.
    async fn fetch_witness(
        &self,
        transport: &dyn Transport,
        keys: &[B256],
        at: (u64, B256),
        root: B256,
    ) -> Result<NodeBag, String> {
        let prefix = prefix_nibbles(self.config.shard_count).unwrap_or(0);
        let mut bags = Vec::new();
        for key in keys {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).map_err(|error| error.to_string())?;
            let mut failures = Vec::new();
            let mut witnessed = None;
            for (peer, _) in self.config.storage_nodes.iter().filter(|(_, shards)| shards.contains(&shard)) {
                let witness =
                    proto::WitnessRequest { keys: vec![key.to_vec()], compaction: 0, at: Some(block_id(at.0, at.1)) };
                let reply = match transport.call(&self.config.id, peer, request(RequestBody::Witness(witness))).await {
                    Ok(reply) => reply,
                    Err(error) => {
                        tracing::warn!(miner = %self.config.id, peer = %peer, %error, "witness unavailable");
                        failures.push(format!("{peer}: {error}"));
                        continue;
                    }
                };
                match check_witness(reply, key, at, root) {
                    Ok(bag) => {
                        witnessed = Some(bag);
                        break;
                    }
                    Err(reason) => {
                        tracing::warn!(miner = %self.config.id, peer = %peer, %reason, "witness refused");
                        self.stats.lock().bad_witnesses.push((peer.clone(), reason.clone()));
                        failures.push(format!("{peer}: {reason}"));
                    }
                }
            }
            match witnessed {
                Some(bag) => bags.push(bag),
                None if failures.is_empty() => return Err(format!("no storage node serves shard {shard}")),
                None => {
                    return Err(format!(
                        "no valid witness for shard {shard} at block {}: {}",
                        at.0,
                        failures.join("; ")
                    ))
                }
            }
        }
        Ok(NodeBag::merge(bags))
    }

    /// Mines blocks from submissions until `shutdown` fires. A block is built while the one
    /// before it commits; blocks commit in order.
    pub async fn run(self: Arc<Self>, transport: Arc<dyn Transport>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let (to_commit, mut commits) = tokio::sync::mpsc::channel::<Built>(COMMIT_QUEUE);
        let committer = {
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                while let Some(built) = commits.recv().await {
                    this.commit(&transport, built).await;
                }
            })
        };
        loop {
            if *shutdown.borrow() {
                break;
            }
            if self.inbox.lock().is_empty() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                continue;
            }
            let batch = self.take_batch();
            let this = Arc::clone(&self);
            let built = match tokio::task::spawn_blocking(move || this.build(batch)).await {
                Ok(Some(built)) => built,
                Ok(None) => continue,
                Err(error) => {
                    tracing::error!(miner = %self.config.id, %error, "block building panicked");
                    continue;
                }
            };
            if to_commit.send(built).await.is_err() {
                tracing::error!(miner = %self.config.id, "the commit task stopped");
                break;
            }
        }
        drop(to_commit);
        if let Err(error) = committer.await {
            tracing::error!(miner = %self.config.id, %error, "the commit task panicked");
        }
        let pending: Vec<Pending> = std::mem::take(&mut *self.inbox.lock());
        for pending in pending {
            let _ = pending.reply.send(refusal("the miner is shutting down"));
        }
    }

    /// Submissions for the next block, up to the block's transfer bound.
    fn take_batch(&self) -> Vec<Pending> {
        let limit = self.config.max_block_transfers.min(max_transfers(self.config.chain.gas_limit)).max(1);
        let mut inbox = self.inbox.lock();
        let mut taken = 0;
        let mut count = 0;
        for pending in inbox.iter() {
            let size = pending.submission.transactions.len();
            if count > 0 && taken + size > limit {
                break;
            }
            taken += size;
            count += 1;
        }
        inbox.drain(..count).collect()
    }

    /// Builds a block from the queued submissions and drops it at once, answering them as
    /// for a refused block: the fuzz target's way through submission decoding and
    /// verification with no transport. The tip stays where it was.
    pub(crate) fn build_queued(&self) {
        let batch = self.take_batch();
        if batch.is_empty() {
            return;
        }
        if let Some(built) = self.build(batch) {
            self.abandon(built.block.header.number, built.epoch, built.replies, Vec::new());
        }
    }

    fn abort(&self, reason: &str, count: u64) {
        *self.stats.lock().aborted.entry(reason.to_string()).or_default() += count;
    }

    /// Admits what can be executed from the batch and builds the block on the top layer.
    fn build(&self, batch: Vec<Pending>) -> Option<Built> {
        let tip = self.tip.lock();
        let mut top = tip.top.clone();
        let parent = tip.header.clone();
        let mut estimated_bytes = tip.estimated_bytes;
        let mut unpruned = tip.unpruned.clone();
        let epoch = tip.epoch;
        drop(tip);
        let current_root = parent.state_root;

        // Decode and recover every transfer of the batch in parallel.
        let decoded: Vec<Vec<Result<RecoveredTransfer, String>>> = self.pool.install(|| {
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
                            let tx = SignedTransfer::decode(bytes).map_err(|_| "malformed_transaction".to_string())?;
                            RecoveredTransfer::recover(tx).map_err(|_| "bad_signature".to_string())
                        })
                        .collect()
                })
                .collect()
        });

        let mut admitted: Vec<RecoveredTransfer> = Vec::new();
        let mut slots: Vec<(oneshot::Sender<Response>, Vec<AdmissionSlot>)> = Vec::new();
        let mut bags = Vec::new();
        let mut blocked_senders: HashSet<Address> = HashSet::new();
        for (pending, transfers) in batch.into_iter().zip(decoded) {
            let Pending { from, submission, reply } = pending;
            let bag = bag_from_wire(submission.bag);
            let witness_root = match b256(&submission.witness_root, "witness_root") {
                Ok(root) => root,
                Err(reason) => {
                    self.reject_submission(&from, reply, &reason);
                    continue;
                }
            };
            // Bags attach along their keys' paths; pruning later walks those paths only.
            if let Err(reason) = check_keys(&bag.keys) {
                self.reject_submission(&from, reply, &format!("node bag refused: {reason}"));
                continue;
            }
            // Witness revision: unchanged subtrees attach by hash; what changed is ours already.
            match top.apply_bag(&bag) {
                Ok(applied) => {
                    estimated_bytes += applied.grown_bytes;
                    record_paths(&mut unpruned, bag.keys.iter().map(|key| B256::from_slice(key)));
                }
                Err(error) => {
                    self.reject_submission(&from, reply, &format!("node bag refused: {error}"));
                    continue;
                }
            }
            if witness_root != current_root {
                self.stats.lock().revised_submissions += 1;
            }
            let mut outcomes = Vec::with_capacity(transfers.len());
            let mut used_bag = false;
            for (bytes, transfer) in submission.transactions.iter().zip(transfers) {
                let tx_hash = keccak256(bytes);
                let transfer = match transfer {
                    Ok(transfer) => transfer,
                    Err(reason) => {
                        self.abort(&reason, 1);
                        outcomes.push((tx_hash, Err(reason)));
                        continue;
                    }
                };
                let (sender, to) = (transfer.sender, transfer.tx.to());
                let reason = if blocked_senders.contains(&sender) {
                    Some("earlier_transfer_aborted")
                } else if top.read_account(&keccak256(sender)).is_err() || top.read_account(&keccak256(to)).is_err() {
                    Some("stale_witness")
                } else {
                    None
                };
                match reason {
                    Some(reason) => {
                        // Later transfers of this sender would fail on their nonce: hold them back too.
                        blocked_senders.insert(sender);
                        self.abort(reason, 1);
                        outcomes.push((transfer.tx.hash(), Err(reason.to_string())));
                    }
                    None => {
                        used_bag = true;
                        outcomes.push((transfer.tx.hash(), Ok(admitted.len())));
                        admitted.push(transfer);
                    }
                }
            }
            if used_bag {
                bags.push(bag);
            }
            slots.push((reply, outcomes));
        }

        let touched: Vec<B256> =
            admitted.iter().flat_map(|transfer| [keccak256(transfer.sender), keccak256(transfer.tx.to())]).collect();
        let timestamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
        let built = match build_block(
            &self.config.chain,
            &parent,
            &mut top,
            admitted,
            self.config.beneficiary,
            timestamp,
            &self.pool,
        ) {
            Ok(built) => built,
            Err(error) => {
                // Every account was checked readable, so this is a bug; nothing is committed.
                tracing::error!(miner = %self.config.id, %error, "building the block failed");
                for (reply, outcomes) in slots {
                    let outcomes = outcomes
                        .into_iter()
                        .map(|(tx_hash, _)| TxOutcome {
                            tx_hash: tx_hash.to_vec(),
                            included: false,
                            succeeded: false,
                            reason: "block_build_failed".to_string(),
                        })
                        .collect();
                    let _ = reply.send(outcomes_reply(None, outcomes));
                }
                return None;
            }
        };
        #[cfg(feature = "fault-injection")]
        let built = self.misbuild(built);
        let hash = built.block.hash();
        let receipts = &built.outcome.receipts;
        let mut replies = Vec::with_capacity(slots.len());
        for (reply, outcomes) in slots {
            let outcomes = outcomes
                .into_iter()
                .map(|(tx_hash, slot)| match slot {
                    Ok(index) => match receipts.get(index).map(|receipt| &receipt.outcome) {
                        Some(Ok(())) => TxOutcome {
                            tx_hash: tx_hash.to_vec(),
                            included: true,
                            succeeded: true,
                            reason: String::new(),
                        },
                        Some(Err(reason)) => TxOutcome {
                            tx_hash: tx_hash.to_vec(),
                            included: true,
                            succeeded: false,
                            reason: reason.name().to_string(),
                        },
                        // Left out by the builder's gas bound: the client resubmits it.
                        None => TxOutcome {
                            tx_hash: tx_hash.to_vec(),
                            included: false,
                            succeeded: false,
                            reason: "block_full".to_string(),
                        },
                    },
                    Err(reason) => TxOutcome { tx_hash: tx_hash.to_vec(), included: false, succeeded: false, reason },
                })
                .collect();
            replies.push((reply, outcomes));
        }

        estimated_bytes += touched.len().saturating_add(1).saturating_mul(WRITE_ALLOWANCE_BYTES);
        record_paths(&mut unpruned, touched.iter().copied());
        let updates = match self.logical_updates(&top, touched) {
            Ok(updates) => updates,
            Err(reason) => {
                tracing::error!(miner = %self.config.id, %reason, "collecting updates failed");
                return None;
            }
        };
        let estimated_bytes = self.maybe_prune(&mut top, estimated_bytes, &mut unpruned);
        let mut tip = self.tip.lock();
        if tip.epoch != epoch {
            // The parent was refused while this block was built: it goes too.
            drop(tip);
            self.abandon(built.block.header.number, epoch, replies, Vec::new());
            return None;
        }
        *tip = Tip {
            header: built.block.header.clone(),
            top: top.clone(),
            estimated_bytes,
            unpruned: unpruned.clone(),
            epoch,
        };
        drop(tip);
        Some(Built {
            block: built.block,
            hash,
            updates,
            bag: NodeBag::merge(bags),
            replies,
            top,
            estimated_bytes,
            unpruned,
            epoch,
        })
    }

    /// Each touched account's new value, grouped for the storage node serving its shard, and
    /// every shard's new subtree hash.
    fn logical_updates(&self, top: &PartialTrie, mut keys: Vec<B256>) -> Result<Vec<(String, BlockUpdates)>, String> {
        let prefix = prefix_nibbles(self.config.shard_count).unwrap_or(0);
        keys.push(keccak256(self.config.beneficiary));
        keys.sort_unstable();
        keys.dedup();
        let mut by_shard: HashMap<usize, Vec<KeyUpdate>> = HashMap::new();
        for key in keys {
            let value = top.get(key.as_slice()).map_err(|stopped| format!("written account not held: {stopped}"))?;
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).map_err(|error| error.to_string())?;
            by_shard
                .entry(shard)
                .or_default()
                .push(KeyUpdate { key: key.to_vec(), value: value.map(|v| v.into_owned()).unwrap_or_default() });
        }
        let shard_hashes = (0..self.config.shard_count)
            .map(|index| {
                let path: Vec<u8> = (0..prefix).map(|i| ((index >> (4 * (prefix - 1 - i))) & 15) as u8).collect();
                top.subtree_hash_at(&path).map(|hash| hash.to_vec()).map_err(|error| format!("shard {index}: {error}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self
            .config
            .storage_nodes
            .iter()
            .map(|(peer, shards)| {
                let updates =
                    shards.iter().flat_map(|shard| by_shard.get(shard).cloned().unwrap_or_default()).collect();
                (peer.clone(), BlockUpdates { header: Vec::new(), shard_hashes: shard_hashes.clone(), updates })
            })
            .collect())
    }

    /// Sends the block to every storage node and to the other miners. Once every storage
    /// node has logged it, it becomes the committed head, is stored and its submissions are
    /// answered. A storage node that cannot be reached is asked again until it answers; an
    /// answer refusing the block (or acknowledging another) is final, and the block is
    /// abandoned (see [`Miner::abandon`]). Other miners' verdicts are logged and recorded.
    async fn commit(&self, transport: &Arc<dyn Transport>, built: Built) {
        let Built { block, hash, updates, bag, replies, top, estimated_bytes, unpruned, epoch } = built;
        let number = block.header.number;
        if self.tip.lock().epoch != epoch {
            // Built on a block refused since: never sent anywhere.
            return self.abandon(number, epoch, replies, Vec::new());
        }
        let encoded = block.encode();
        let header = alloy_rlp::encode(&block.header);
        // Set by the first refusal: the calls still retrying an unreachable node stop.
        let refused = Arc::new(AtomicBool::new(false));
        let mut storage_calls = tokio::task::JoinSet::new();
        for (peer, mut message) in updates {
            message.header = header.clone();
            let (id, transport, refused) = (self.config.id.clone(), Arc::clone(transport), Arc::clone(&refused));
            storage_calls.spawn(async move {
                let mut delay = Duration::from_millis(20);
                loop {
                    let call = transport.call(&id, &peer, request(RequestBody::ApplyBlock(message.clone())));
                    let reason = match call.await {
                        Ok(reply) => match acknowledged(reply, number, hash) {
                            Ok(()) => return None,
                            Err(reason) => reason,
                        },
                        Err(NetError::Refused { reason, .. }) => reason,
                        Err(error) => {
                            if refused.load(Ordering::Acquire) {
                                return None;
                            }
                            tracing::warn!(
                                miner = %id, peer = %peer, block = number, %error,
                                "storage node has not logged the block; retrying"
                            );
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(1));
                            continue;
                        }
                    };
                    refused.store(true, Ordering::Release);
                    return Some((peer, reason));
                }
            });
        }
        // An honest miner gossips a block once it has committed, so a follower never adopts
        // one that a storage node then refuses; a lying miner does not wait.
        let announcement = proto::BlockAnnouncement { block: encoded.clone(), bag: Some(bag_to_wire(&bag)) };
        let announces_early = self.announces_before_commit();
        let early_gossip = announces_early.then(|| self.gossip(transport, number, announcement.clone()));
        let mut refusals = Vec::new();
        while let Some(joined) = storage_calls.join_next().await {
            match joined {
                Ok(None) => {}
                Ok(Some(refusal)) => refusals.push(refusal),
                Err(error) => {
                    // Whether that node logged the block is unknown: do not commit it.
                    refused.store(true, Ordering::Release);
                    refusals.push(("a storage node".to_string(), format!("the call to it failed: {error}")));
                }
            }
        }
        if let Some(gossip) = early_gossip {
            self.await_gossip(number, gossip).await;
        }
        if !refusals.is_empty() {
            for (peer, reason) in &refusals {
                tracing::warn!(
                    miner = %self.config.id, peer = %peer, block = number, %reason,
                    "storage node refused the block; abandoning it"
                );
            }
            return self.abandon(number, epoch, replies, refusals);
        }
        if let Some(store) = self.store.lock().as_mut() {
            if let Err(error) = store.append(number, hash, &encoded) {
                tracing::error!(miner = %self.config.id, block = number, %error, "storing the block failed");
            }
        }
        *self.committed.lock() = Committed { header: block.header, hash, top, estimated_bytes, unpruned };
        {
            let mut stats = self.stats.lock();
            stats.blocks += 1;
            for outcome in replies.iter().flat_map(|(_, outcomes)| outcomes).filter(|outcome| outcome.included) {
                stats.included += 1;
                if outcome.succeeded {
                    stats.succeeded += 1;
                } else {
                    *stats.failed.entry(outcome.reason.clone()).or_default() += 1;
                }
            }
        }
        for (reply, outcomes) in replies {
            let _ = reply.send(outcomes_reply(Some((number, hash)), outcomes));
        }
        if !announces_early {
            // Awaited before the next block commits, so followers receive blocks in order.
            let gossip = self.gossip(transport, number, announcement);
            self.await_gossip(number, gossip).await;
        }
    }

    /// Under [`MinerFault::WrongRoot`] blocks are gossiped before the storage nodes answer.
    fn announces_before_commit(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if *self.fault.lock() == MinerFault::WrongRoot {
            return true;
        }
        false
    }

    /// Sends block `number` to every peer miner; each call answers with the peer's refusal, if any.
    fn gossip(
        &self,
        transport: &Arc<dyn Transport>,
        number: u64,
        announcement: proto::BlockAnnouncement,
    ) -> tokio::task::JoinSet<Option<(String, String)>> {
        let mut gossip = tokio::task::JoinSet::new();
        for peer in self.config.peers.clone() {
            let message = request(RequestBody::Announce(announcement.clone()));
            let (id, transport) = (self.config.id.clone(), Arc::clone(transport));
            gossip.spawn(async move {
                match transport.call(&id, &peer, message).await {
                    Ok(reply) => match reply.body {
                        Some(ResponseBody::Verdict(verdict)) if verdict.accepted => None,
                        Some(ResponseBody::Verdict(verdict)) => Some((peer, verdict.reason)),
                        _ => Some((peer, "answered an announcement with something else".to_string())),
                    },
                    Err(error) => {
                        tracing::warn!(miner = %id, peer = %peer, block = number, %error, "gossip failed");
                        None
                    }
                }
            });
        }
        gossip
    }

    /// Waits for every peer's verdict on block `number` and records the refusals.
    async fn await_gossip(&self, number: u64, mut gossip: tokio::task::JoinSet<Option<(String, String)>>) {
        while let Some(joined) = gossip.join_next().await {
            if let Ok(Some((peer, reason))) = joined {
                tracing::warn!(
                    miner = %self.config.id, peer = %peer, block = number, %reason,
                    "peer refused the block"
                );
                self.stats.lock().block_refusals.push((peer, reason));
            }
        }
    }

    /// Drops block `number`, built in `epoch`, uncommitted: a storage node refused it or a
    /// block it builds on. If the tip is still in that epoch it goes back to the committed
    /// head in a new epoch, so that blocks built on the dropped one (queued or being built)
    /// are dropped in turn. Its transfers are answered as not included (`block_refused`)
    /// for their clients to submit them again.
    ///
    /// The refusals that caused it (if any) are recorded with the abandonment, under one
    /// lock and before any client hears of it, so that stats never show one without the other.
    fn abandon(&self, number: u64, epoch: u64, replies: Replies, refusals: Vec<(String, String)>) {
        let dropped = replies.iter().flat_map(|(_, outcomes)| outcomes).filter(|outcome| outcome.included).count();
        {
            let mut stats = self.stats.lock();
            stats.block_refusals.extend(refusals);
            stats.abandoned_blocks += 1;
            *stats.aborted.entry(BLOCK_REFUSED.to_string()).or_default() += dropped as u64;
        }
        tracing::warn!(miner = %self.config.id, block = number, transfers = dropped, "block abandoned");
        let committed = self.committed.lock().clone();
        {
            let mut tip = self.tip.lock();
            if tip.epoch == epoch {
                *tip = Tip {
                    header: committed.header,
                    top: committed.top,
                    estimated_bytes: committed.estimated_bytes,
                    unpruned: committed.unpruned,
                    epoch: epoch + 1,
                };
            }
        }
        for (reply, outcomes) in replies {
            let outcomes = outcomes
                .into_iter()
                .map(|outcome| {
                    if outcome.included {
                        TxOutcome { included: false, succeeded: false, reason: BLOCK_REFUSED.to_string(), ..outcome }
                    } else {
                        outcome
                    }
                })
                .collect();
            let _ = reply.send(outcomes_reply(None, outcomes));
        }
    }

    /// Prunes to level r when the top layer is over budget, and returns the new upper bound
    /// of its memory. While a layer pruned to r fits the budget, a bound past it is first
    /// checked by a walk (the bound counts an allowance per write, so it runs ahead); once
    /// even the pruned layer is over budget, a prune is certain and the walk is skipped.
    /// The prune walks (and copies) only the paths recorded in `unpruned`, except every
    /// [`WHOLE_PRUNE_EVERY`] prunes or when they are unknown.
    fn maybe_prune(&self, top: &mut PartialTrie, estimated_bytes: usize, unpruned: &mut Unpruned) -> usize {
        let budget = self.config.top_budget_bytes;
        if estimated_bytes <= budget {
            return estimated_bytes;
        }
        if self.pruned_bytes.load(Ordering::Relaxed) <= budget {
            let measured = top.memory_bytes();
            let mut stats = self.stats.lock();
            stats.peak_top_bytes = stats.peak_top_bytes.max(measured);
            if measured <= budget {
                stats.top_bytes = measured;
                return measured;
            }
        }
        let prunes = {
            let mut stats = self.stats.lock();
            stats.prunes += 1;
            stats.prunes
        };
        let keep = [keccak256(self.config.beneficiary)];
        let bytes = match unpruned.replace(Vec::new()) {
            Some(paths) if prunes % WHOLE_PRUNE_EVERY != 0 => {
                estimated_bytes.saturating_sub(top.prune_paths(self.config.retention, &paths, &keep))
            }
            _ => {
                top.prune_keeping(self.config.retention, &keep);
                let measured = top.memory_bytes();
                self.pruned_bytes.store(measured, Ordering::Relaxed);
                let mut stats = self.stats.lock();
                stats.peak_top_bytes = stats.peak_top_bytes.max(measured);
                measured
            }
        };
        self.stats.lock().top_bytes = bytes;
        bytes
    }

    fn reject_submission(&self, from: &str, reply: oneshot::Sender<Response>, reason: &str) {
        tracing::warn!(miner = %self.config.id, peer = %from, %reason, "submission refused");
        self.stats.lock().rejected_submissions += 1;
        let _ = reply.send(refusal(reason.to_string()));
    }

    /// A block from another miner: verified from this miner's top layer and the block's bag.
    fn verify_announced(&self, announcement: proto::BlockAnnouncement) -> Result<(), String> {
        let block = decode_block(&announcement.block)?;
        let bag = bag_from_wire(announcement.bag);
        check_keys(&bag.keys).map_err(|reason| format!("node bag refused: {reason}"))?;
        let mut tip = self.tip.lock();
        let views = check_block(&self.config.chain, &tip.header, &block, None, ExecMode::Staged, &self.pool)
            .map_err(|error| error.to_string())?;
        let mut top = tip.top.clone();
        let mut unpruned = tip.unpruned.clone();
        let applied = top.apply_bag(&bag).map_err(|error| format!("node bag refused: {error}"))?;
        record_paths(&mut unpruned, bag.keys.iter().map(|key| B256::from_slice(key)));
        let written = views.iter().flat_map(|view| [view.sender_key, view.to_key]);
        record_paths(&mut unpruned, written.chain([keccak256(block.header.beneficiary)]));
        let verified = execute_block(&self.config.chain, top, &block, views, ExecMode::Staged, &self.pool)
            .map_err(|error| error.to_string())?;
        let mut top = verified.state;
        let written = 2 * block.transactions.len() + 1;
        let estimated_bytes = self.maybe_prune(
            &mut top,
            tip.estimated_bytes + applied.grown_bytes + written.saturating_mul(WRITE_ALLOWANCE_BYTES),
            &mut unpruned,
        );
        let hash = block.hash();
        if let Some(store) = self.store.lock().as_mut() {
            store.append(block.header.number, hash, &announcement.block).map_err(|error| error.to_string())?;
        }
        *self.committed.lock() = Committed {
            header: block.header.clone(),
            hash,
            top: top.clone(),
            estimated_bytes,
            unpruned: unpruned.clone(),
        };
        *tip = Tip { header: block.header, top, estimated_bytes, unpruned, epoch: tip.epoch };
        Ok(())
    }
}

/// A storage node's answer to `ApplyBlock` must acknowledge that very block.
fn acknowledged(reply: Response, number: u64, hash: B256) -> Result<(), String> {
    let Some(ResponseBody::BlockAck(ack)) = reply.body else {
        return Err("answered a block with something other than an acknowledgement".to_string());
    };
    match parse_block_id(ack.block.as_ref(), "block")? {
        Some(acked) if acked == (number, hash) => Ok(()),
        Some((other, other_hash)) => {
            Err(format!("acknowledged block {other} ({other_hash}) instead of block {number} ({hash})"))
        }
        None => Err(format!("acknowledged no block instead of block {number} ({hash})")),
    }
}

/// A storage node's answer to a one-key witness request: a witness for block `at`, about
/// exactly `key`, verifying against `root`.
fn check_witness(reply: Response, key: &B256, at: (u64, B256), root: B256) -> Result<NodeBag, String> {
    let Some(ResponseBody::Witness(witness)) = reply.body else {
        return Err("answered a witness request with something else".to_string());
    };
    let served_at = parse_block_id(witness.at.as_ref(), "at")?;
    if served_at != Some(at) {
        return Err(format!("witness is for block {served_at:?}, not the block asked for ({}, {})", at.0, at.1));
    }
    let bag = bag_from_wire(witness.bag);
    if bag.keys != [key.to_vec()] {
        return Err(format!("witness is about {} keys, not the one asked for ({key})", bag.keys.len()));
    }
    bag.verify(root).map_err(|error| format!("witness does not verify against {root}: {error}"))?;
    Ok(bag)
}

fn outcomes_reply(block: Option<(u64, B256)>, outcomes: Vec<TxOutcome>) -> Response {
    response(ResponseBody::Submitted(proto::SubmissionReply {
        block: block.map(|(number, hash)| block_id(number, hash)),
        outcomes,
    }))
}

/// Opens (creating) the miner's block store in `dir/blocks`, storing the genesis block first.
pub fn open_store(dir: &Path, genesis: &Header) -> Result<(ChainStore, Header), String> {
    let (mut store, _) =
        ChainStore::open(dir.join("blocks"), StoreOptions::default()).map_err(|error| error.to_string())?;
    let genesis_hash = genesis.hash_slow();
    match store.hash_of(0) {
        None => {
            let block = Block { header: genesis.clone(), transactions: Vec::new() };
            store.append(0, genesis_hash, &block.encode()).map_err(|error| error.to_string())?;
        }
        Some(stored) if stored != genesis_hash => {
            return Err(format!("stored genesis {stored} is not this genesis {genesis_hash}"))
        }
        Some(_) => {}
    }
    let head = match store.head() {
        Some((number, _)) if number > 0 => {
            let bytes = store
                .get_by_number(number)
                .map_err(|error| error.to_string())?
                .ok_or_else(|| format!("block {number} is indexed but not readable"))?;
            decode_block(&bytes)?.header
        }
        _ => genesis.clone(),
    };
    Ok((store, head))
}

impl Handler for Miner {
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
        match request.body {
            Some(RequestBody::Submit(submission)) => {
                let (reply, receive) = oneshot::channel();
                self.inbox.lock().push(Pending { from, submission, reply });
                self.wake.notify_one();
                Box::pin(async move { receive.await.unwrap_or_else(|_| refusal("the miner stopped before answering")) })
            }
            Some(RequestBody::Head(_)) => {
                let (number, hash, root) = self.head();
                Box::pin(std::future::ready(response(ResponseBody::Head(proto::HeadReply {
                    head: Some(block_id(number, hash)),
                    state_root: root.to_vec(),
                }))))
            }
            Some(RequestBody::Announce(announcement)) => {
                let verdict = match self.verify_announced(announcement) {
                    Ok(()) => {
                        self.stats.lock().verified_blocks += 1;
                        proto::Verdict { accepted: true, reason: String::new() }
                    }
                    Err(reason) => {
                        tracing::warn!(miner = %self.config.id, peer = %from, %reason, "announced block refused");
                        self.stats.lock().refused_blocks += 1;
                        proto::Verdict { accepted: false, reason }
                    }
                };
                Box::pin(std::future::ready(response(ResponseBody::Verdict(verdict))))
            }
            _ => Box::pin(std::future::ready(refusal("miners serve submit, head and announce requests"))),
        }
    }
}
