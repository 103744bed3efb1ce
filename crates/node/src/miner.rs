//! RainBlock's miner: executes against its private top layer with no state I/O.
//!
//! Clients submit transfers with node bags. The miner attaches a bag's nodes to its top
//! layer only where they hash to a hash node it holds (so a bag cannot change what the
//! miner believes), which also revises witnesses taken at an older root: nodes of unchanged
//! subtrees attach, nodes the miner already has newer versions of are ignored. A transfer
//! whose accounts still cannot be read aborts as `stale_witness`. Every signature is
//! recovered. The block is built with the ledger's builder on the top layer; its logical
//! updates and every shard's new hash go to the storage nodes, and the block commits once
//! all of them have logged it. Other miners receive the block with its bag and verify it
//! from their own top layers. The top layer is pruned to retention level r whenever it
//! outgrows its memory budget.

use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, B256};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::Path;
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
    refusal, request, response, BoxFuture, Handler, Request, RequestBody, Response, ResponseBody, Transport,
};
use virga_trie::proof::NodeBag;
use virga_trie::PartialTrie;

use crate::codec::{b256, bag_from_wire, bag_to_wire, block_id, decode_block};
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
    pub top_bytes: usize,
    pub peak_top_bytes: usize,
    /// Blocks from other miners verified (follower) and refused.
    pub verified_blocks: u64,
    pub refused_blocks: u64,
}

/// A transfer's place in the block being built (its index among the admitted), or why it was left out.
type AdmissionSlot = (B256, Result<usize, String>);

struct Pending {
    from: String,
    submission: Submission,
    reply: oneshot::Sender<Response>,
}

struct Head {
    header: Header,
    hash: B256,
    top: PartialTrie,
}

pub struct Miner {
    config: MinerConfig,
    inbox: Mutex<Vec<Pending>>,
    wake: Notify,
    head: Mutex<Head>,
    store: Mutex<Option<ChainStore>>,
    stats: Mutex<MinerStats>,
    pool: rayon::ThreadPool,
}

/// A built block ready to commit.
struct Built {
    block: Block,
    hash: B256,
    top: PartialTrie,
    updates: Vec<(String, BlockUpdates)>,
    bag: NodeBag,
    replies: Vec<(oneshot::Sender<Response>, Vec<TxOutcome>)>,
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
        Ok(Arc::new(Miner {
            config,
            inbox: Mutex::new(Vec::new()),
            wake: Notify::new(),
            head: Mutex::new(Head { header, hash, top }),
            store: Mutex::new(store),
            stats: Mutex::new(MinerStats::default()),
            pool,
        }))
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Counters, with the top layer's node count taken now.
    pub fn stats(&self) -> MinerStats {
        let top_nodes = self.head.lock().top.node_count();
        MinerStats { top_nodes, ..self.stats.lock().clone() }
    }

    pub fn head(&self) -> (u64, B256, B256) {
        let head = self.head.lock();
        (head.header.number, head.hash, head.header.state_root)
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
        let beneficiary = self.fetch_witness(transport, &[keccak256(self.config.beneficiary)], number, hash).await?;
        let mut head = self.head.lock();
        let attached = head.top.attach_nodes(&nodes).map_err(|error| format!("top-layer nodes: {error}"))?;
        head.top.apply_bag(&beneficiary).map_err(|error| format!("beneficiary witness: {error}"))?;
        if head.top.root_hash() != root {
            return Err("the top layer's root changed while warming up".to_string());
        }
        tracing::info!(miner = %self.config.id, attached = attached.attached, "top layer warmed up");
        let bytes = head.top.memory_bytes();
        let mut stats = self.stats.lock();
        stats.top_bytes = bytes;
        stats.peak_top_bytes = stats.peak_top_bytes.max(bytes);
        Ok(())
    }

    /// A full witness for `keys` at a block, from the storage nodes serving them.
    async fn fetch_witness(
        &self,
        transport: &dyn Transport,
        keys: &[B256],
        number: u64,
        hash: B256,
    ) -> Result<NodeBag, String> {
        let prefix = prefix_nibbles(self.config.shard_count).unwrap_or(0);
        let mut bags = Vec::new();
        for key in keys {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).map_err(|error| error.to_string())?;
            let Some((peer, _)) = self.config.storage_nodes.iter().find(|(_, shards)| shards.contains(&shard)) else {
                return Err(format!("no storage node serves shard {shard}"));
            };
            let witness =
                proto::WitnessRequest { keys: vec![key.to_vec()], compaction: 0, at: Some(block_id(number, hash)) };
            let reply = transport
                .call(&self.config.id, peer, request(RequestBody::Witness(witness)))
                .await
                .map_err(|error| error.to_string())?;
            match reply.body {
                Some(ResponseBody::Witness(witness)) => bags.push(bag_from_wire(witness.bag)),
                _ => return Err(format!("{peer} answered a witness request with something else")),
            }
        }
        Ok(NodeBag::merge(bags))
    }

    /// Mines blocks from submissions until `shutdown` fires.
    pub async fn run(self: Arc<Self>, transport: Arc<dyn Transport>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
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
            self.commit(&transport, built).await;
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

    fn abort(&self, reason: &str, count: u64) {
        *self.stats.lock().aborted.entry(reason.to_string()).or_default() += count;
    }

    /// Admits what can be executed from the batch and builds the block on the top layer.
    fn build(&self, batch: Vec<Pending>) -> Option<Built> {
        let head = self.head.lock();
        let mut top = head.top.clone();
        let parent = head.header.clone();
        drop(head);
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
            // Witness revision: unchanged subtrees attach by hash; what changed is ours already.
            let before = top.clone();
            if let Err(error) = top.apply_bag(&bag) {
                top = before;
                self.reject_submission(&from, reply, &format!("node bag refused: {error}"));
                continue;
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
        let hash = built.block.hash();
        let receipts = &built.outcome.receipts;
        let mut replies = Vec::with_capacity(slots.len());
        {
            let mut stats = self.stats.lock();
            stats.included += receipts.len() as u64;
            for receipt in receipts {
                match &receipt.outcome {
                    Ok(()) => stats.succeeded += 1,
                    Err(reason) => *stats.failed.entry(reason.name().to_string()).or_default() += 1,
                }
            }
        }
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

        let updates = match self.logical_updates(&top, touched) {
            Ok(updates) => updates,
            Err(reason) => {
                tracing::error!(miner = %self.config.id, %reason, "collecting updates failed");
                return None;
            }
        };
        Some(Built { block: built.block, hash, top, updates, bag: NodeBag::merge(bags), replies })
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
                (peer.clone(), BlockUpdates { block: Vec::new(), shard_hashes: shard_hashes.clone(), updates })
            })
            .collect())
    }

    /// Sends the block to every storage node (retrying until each has logged it) and to the
    /// other miners, then makes it the head, stores it and answers the submissions.
    async fn commit(&self, transport: &Arc<dyn Transport>, built: Built) {
        let Built { block, hash, mut top, updates, bag, replies } = built;
        let encoded = block.encode();
        let number = block.header.number;
        let mut calls = tokio::task::JoinSet::new();
        for (peer, mut message) in updates {
            message.block = encoded.clone();
            let (id, transport) = (self.config.id.clone(), Arc::clone(transport));
            calls.spawn(async move {
                let mut delay = Duration::from_millis(20);
                loop {
                    match transport.call(&id, &peer, request(RequestBody::ApplyBlock(message.clone()))).await {
                        Ok(_) => return,
                        Err(error) => {
                            tracing::warn!(miner = %id, peer = %peer, block = number, %error, "storage node has not logged the block; retrying");
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(1));
                        }
                    }
                }
            });
        }
        let announcement = proto::BlockAnnouncement { block: encoded.clone(), bag: Some(bag_to_wire(&bag)) };
        for peer in self.config.peers.clone() {
            let message = request(RequestBody::Announce(announcement.clone()));
            let (id, transport) = (self.config.id.clone(), Arc::clone(transport));
            calls.spawn(async move {
                match transport.call(&id, &peer, message).await {
                    Ok(reply) => {
                        if let Some(ResponseBody::Verdict(verdict)) = reply.body {
                            if !verdict.accepted {
                                tracing::warn!(miner = %id, peer = %peer, block = number, reason = %verdict.reason, "peer refused the block");
                            }
                        }
                    }
                    Err(error) => tracing::warn!(miner = %id, peer = %peer, block = number, %error, "gossip failed"),
                }
            });
        }
        while calls.join_next().await.is_some() {}
        if let Some(store) = self.store.lock().as_mut() {
            if let Err(error) = store.append(number, hash, &encoded) {
                tracing::error!(miner = %self.config.id, block = number, %error, "storing the block failed");
            }
        }
        self.maybe_prune(&mut top);
        *self.head.lock() = Head { header: block.header, hash, top };
        self.stats.lock().blocks += 1;
        for (reply, outcomes) in replies {
            let _ = reply.send(outcomes_reply(Some((number, hash)), outcomes));
        }
    }

    /// Prunes to level r when the top layer is over budget. One walk of the layer per block
    /// (the estimate encodes every node); a second only after a prune.
    fn maybe_prune(&self, top: &mut PartialTrie) {
        let mut bytes = top.memory_bytes();
        let over_budget = bytes > self.config.top_budget_bytes;
        let peak = bytes;
        if over_budget {
            top.prune_keeping(self.config.retention, &[keccak256(self.config.beneficiary)]);
            bytes = top.memory_bytes();
        }
        let mut stats = self.stats.lock();
        stats.peak_top_bytes = stats.peak_top_bytes.max(peak);
        stats.prunes += u64::from(over_budget);
        stats.top_bytes = bytes;
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
        let mut head = self.head.lock();
        let views = check_block(&self.config.chain, &head.header, &block, None, ExecMode::Staged, &self.pool)
            .map_err(|error| error.to_string())?;
        let mut top = head.top.clone();
        top.apply_bag(&bag).map_err(|error| format!("node bag refused: {error}"))?;
        let verified = execute_block(&self.config.chain, top, &block, views, ExecMode::Staged, &self.pool)
            .map_err(|error| error.to_string())?;
        let mut top = verified.state;
        self.maybe_prune(&mut top);
        let hash = block.hash();
        if let Some(store) = self.store.lock().as_mut() {
            store.append(block.header.number, hash, &announcement.block).map_err(|error| error.to_string())?;
        }
        *head = Head { header: block.header, hash, top };
        Ok(())
    }
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
        ChainStore::open(&dir.join("blocks"), StoreOptions::default()).map_err(|error| error.to_string())?;
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
