//! RainBlock's prefetching client: pre-executes transfers against the storage nodes, fetches
//! and verifies their witnesses, bags them, and submits transfers plus bag to the miner.
//!
//! A batch's witnesses are fetched at the miner's committed head, each storage node's bag
//! verified against that head's state root. A shard served by several storage nodes is
//! asked of each in turn, batch after batch; a refused witness is asked again of the
//! shard's next replica. The client then pre-executes the batch on the
//! witnessed accounts (and its own earlier transfers in the batch) and drops transfers that
//! would certainly fail, saying why. The surviving witnesses are merged into one bag with
//! every node once and the nodes above compaction level c left out. A sender has at most
//! one transfer in flight, so an abort never leaves a nonce gap behind it; aborted
//! transfers are retried with fresh witnesses.

use alloy_primitives::{keccak256, Address, B256};
use parking_lot::Mutex;
use std::collections::btree_map::{BTreeMap, Entry};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use virga_ledger::exec::{apply_transfer, ExecConfig, TransferView};
use virga_ledger::tx::SignedTransfer;
use virga_net::proto::{self, Submission};
use virga_net::{request, RequestBody, ResponseBody, Transport};
use virga_trie::account::Account;
use virga_trie::proof::NodeBag;

use crate::codec::{b256, bag_from_wire, bag_to_wire, block_id, parse_block_id};
use crate::storage::prefix_nibbles;

/// A user's transfer: signed, with the sender it claims (a hint for prefetching only; the
/// miner recovers the real sender from the signature).
#[derive(Clone, Debug)]
pub struct UserTransfer {
    pub tx: SignedTransfer,
    pub sender: Address,
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub id: String,
    pub miner: String,
    pub storage_nodes: Vec<(String, Vec<usize>)>,
    pub shard_count: usize,
    /// Compaction level c: bag nodes above this trie level are left out.
    pub compaction: usize,
    /// Transfers per submission.
    pub batch: usize,
    /// Submissions awaiting the miner's answer at once.
    pub in_flight: usize,
    pub exec: ExecConfig,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub submitted: u64,
    pub committed: u64,
    pub committed_ok: u64,
    /// Of `committed`: transfers whose answer was lost (the miner failed first) and that a
    /// later pre-execution found committed by their sender's nonce; their receipts are not
    /// known here, so they are not in `committed_ok`.
    pub confirmed_late: u64,
    pub submissions: u64,
    /// Transfers dropped before submission because they would certainly fail, by reason.
    pub filtered: HashMap<String, u64>,
    /// Transfers the miner left out and this client retried, by reason.
    pub retried: HashMap<String, u64>,
    /// Witnesses refused, by storage node and reason.
    pub bad_witnesses: Vec<(String, String)>,
    /// Bytes of each submitted transfer's own full witnesses (every node of both accounts'
    /// proofs, nothing shared).
    pub witness_bytes_full: u64,
    /// Bytes of the compacted, bagged witnesses actually sent.
    pub witness_bytes_compact: u64,
}

struct Shared {
    config: ClientConfig,
    transport: Arc<dyn Transport>,
    stats: Mutex<ClientStats>,
    busy_senders: Mutex<HashSet<Address>>,
    retry: Mutex<VecDeque<UserTransfer>>,
    /// Transfers submitted to a miner that failed before answering (by hash).
    uncertain: Mutex<HashSet<B256>>,
    /// Witness fetches so far: picks which replica of a shard is asked first.
    fetches: AtomicUsize,
}

pub struct Client {
    shared: Arc<Shared>,
}

impl Client {
    pub fn new(config: ClientConfig, transport: Arc<dyn Transport>) -> Client {
        Client {
            shared: Arc::new(Shared {
                config,
                transport,
                stats: Mutex::new(ClientStats::default()),
                busy_senders: Mutex::new(HashSet::new()),
                retry: Mutex::new(VecDeque::new()),
                uncertain: Mutex::new(HashSet::new()),
                fetches: AtomicUsize::new(0),
            }),
        }
    }

    pub fn stats(&self) -> ClientStats {
        self.shared.stats.lock().clone()
    }

    pub fn stats_handle(&self) -> impl Fn() -> ClientStats + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || shared.stats.lock().clone()
    }

    /// Takes transfers from `incoming` until it closes and everything taken is answered, or
    /// until `stop` fires.
    pub async fn run(self, mut incoming: mpsc::Receiver<UserTransfer>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let shared = self.shared;
        let mut waiting: VecDeque<UserTransfer> = VecDeque::new();
        let mut tasks = tokio::task::JoinSet::new();
        let mut closed = false;
        loop {
            if *stop.borrow() {
                break;
            }
            while !closed && waiting.len() < shared.config.batch * 2 {
                match incoming.try_recv() {
                    Ok(transfer) => waiting.push_back(transfer),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                }
            }
            let batch =
                if tasks.len() < shared.config.in_flight { take_batch(&shared, &mut waiting) } else { Vec::new() };
            if batch.is_empty() {
                if closed && waiting.is_empty() && tasks.is_empty() && shared.retry.lock().is_empty() {
                    break;
                }
                tokio::select! {
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                    received = incoming.recv(), if !closed && waiting.len() < shared.config.batch * 2 => match received {
                        Some(transfer) => waiting.push_back(transfer),
                        None => closed = true,
                    },
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
                continue;
            }
            let task_shared = Arc::clone(&shared);
            tasks.spawn(async move { submit_batch(&task_shared, batch).await });
        }
        tasks.shutdown().await;
    }
}

/// Up to `batch` transfers whose senders have nothing in flight (others keep their place).
fn take_batch(shared: &Shared, waiting: &mut VecDeque<UserTransfer>) -> Vec<UserTransfer> {
    let mut busy = shared.busy_senders.lock();
    // Retries first, in their order, taken under the busy lock: `retry` queues a transfer
    // before freeing its sender, so a freed sender's retry is always seen here and its later
    // transfers wait behind it (no nonce gap).
    {
        let mut retry = shared.retry.lock();
        while let Some(transfer) = retry.pop_back() {
            waiting.push_front(transfer);
        }
    }
    let mut batch = Vec::new();
    let mut kept = VecDeque::new();
    let mut blocked: HashSet<Address> = HashSet::new();
    while let Some(transfer) = waiting.pop_front() {
        if batch.len() < shared.config.batch && !busy.contains(&transfer.sender) && !blocked.contains(&transfer.sender)
        {
            busy.insert(transfer.sender);
            batch.push(transfer);
        } else {
            // Later transfers of a blocked sender wait behind its earlier one.
            blocked.insert(transfer.sender);
            kept.push_back(transfer);
        }
    }
    *waiting = kept;
    batch
}

fn release(shared: &Shared, transfers: &[UserTransfer]) {
    let mut busy = shared.busy_senders.lock();
    for transfer in transfers {
        busy.remove(&transfer.sender);
    }
}

fn retry(shared: &Shared, transfers: Vec<UserTransfer>, reason: &str) {
    *shared.stats.lock().retried.entry(reason.to_string()).or_default() += transfers.len() as u64;
    // Queued before its sender is free again, so the sender's next transfer cannot overtake it.
    shared.retry.lock().extend(transfers.iter().cloned());
    release(shared, &transfers);
}

/// Retries transfers the miner may or may not have included (it failed before answering).
fn retry_uncertain(shared: &Shared, transfers: Vec<UserTransfer>, reason: &str) {
    shared.uncertain.lock().extend(transfers.iter().map(|transfer| transfer.tx.hash()));
    retry(shared, transfers, reason);
}

/// Pauses a batch after a role could not be reached, so retries do not spin.
async fn back_off() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The miner's committed head.
async fn miner_head(shared: &Shared) -> Result<(u64, B256, B256), String> {
    let reply = shared
        .transport
        .call(&shared.config.id, &shared.config.miner, request(RequestBody::Head(proto::HeadRequest {})))
        .await
        .map_err(|error| error.to_string())?;
    let Some(ResponseBody::Head(head)) = reply.body else {
        return Err("the miner answered a head request with something else".to_string());
    };
    let (number, hash) = parse_block_id(head.head.as_ref(), "head")?.ok_or("the miner sent no head")?;
    Ok((number, hash, b256(&head.state_root, "state_root")?))
}

/// One shard's part of a witness fetch.
struct ShardFetch<'a> {
    keys: Vec<B256>,
    /// The storage nodes serving the shard.
    replicas: Vec<&'a str>,
    /// Replicas asked so far.
    asked: usize,
}

/// Fetches and verifies the witnesses of `keys` at a block; returns each key's value and the
/// full bags. Each shard's keys go to one storage node serving it, the replicas taken in
/// turn fetch after fetch. A witness that fails the checks is logged and recorded in
/// `bad_witnesses` with the node and the reason, and the keys asked of that node go to
/// their shards' next replicas (so do those of a node that cannot answer); the fetch fails
/// once a shard has no replica left to ask.
async fn fetch_witnesses(shared: &Shared, keys: &[B256], at: (u64, B256), root: B256) -> Result<Witnesses, String> {
    let prefix = prefix_nibbles(shared.config.shard_count).unwrap_or(0);
    let turn = shared.fetches.fetch_add(1, Ordering::Relaxed);
    let mut shards: BTreeMap<usize, ShardFetch> = BTreeMap::new();
    for key in keys {
        let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).map_err(|error| error.to_string())?;
        let fetch = match shards.entry(shard) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let replicas: Vec<&str> = shared
                    .config
                    .storage_nodes
                    .iter()
                    .filter(|(_, served)| served.contains(&shard))
                    .map(|(peer, _)| peer.as_str())
                    .collect();
                if replicas.is_empty() {
                    return Err(format!("no storage node serves shard {shard}"));
                }
                entry.insert(ShardFetch { keys: Vec::new(), replicas, asked: 0 })
            }
        };
        fetch.keys.push(*key);
    }
    let mut witnesses = Witnesses::default();
    let mut pending: Vec<usize> = shards.keys().copied().collect();
    while !pending.is_empty() {
        // One request per storage node: the keys of the pending shards it is next to answer for.
        let mut by_node: BTreeMap<&str, (Vec<usize>, Vec<B256>)> = BTreeMap::new();
        for shard in pending.drain(..) {
            let Some(fetch) = shards.get(&shard) else { continue };
            let peer = fetch.replicas[(turn + fetch.asked) % fetch.replicas.len()];
            let (asked_shards, asked_keys) = by_node.entry(peer).or_default();
            asked_shards.push(shard);
            asked_keys.extend(&fetch.keys);
        }
        let mut calls = tokio::task::JoinSet::new();
        for (peer, (asked_shards, asked_keys)) in by_node {
            let message = proto::WitnessRequest {
                keys: asked_keys.iter().map(|key| key.to_vec()).collect(),
                compaction: 0,
                at: Some(block_id(at.0, at.1)),
            };
            let (id, peer, transport) = (shared.config.id.clone(), peer.to_string(), Arc::clone(&shared.transport));
            calls.spawn(async move {
                let reply = transport.call(&id, &peer, request(RequestBody::Witness(message))).await;
                (peer, asked_shards, asked_keys, reply)
            });
        }
        while let Some(joined) = calls.join_next().await {
            let (peer, asked_shards, asked_keys, reply) = joined.map_err(|error| error.to_string())?;
            let failure = match reply {
                Err(error) => {
                    tracing::warn!(client = %shared.config.id, peer = %peer, %error, "witness unavailable");
                    error.to_string()
                }
                Ok(reply) => {
                    let checked = match reply.body {
                        Some(ResponseBody::Witness(witness)) => {
                            check_witness(witness, &asked_keys, at, root, shared.config.compaction)
                        }
                        _ => Err("answered a witness request with something else".to_string()),
                    };
                    match checked {
                        Ok((full, compact, key_values)) => {
                            witnesses.values.extend(key_values);
                            witnesses.full.push(full);
                            witnesses.compact.push(compact);
                            continue;
                        }
                        Err(reason) => {
                            tracing::warn!(client = %shared.config.id, peer = %peer, %reason, "witness refused");
                            shared.stats.lock().bad_witnesses.push((peer.clone(), reason.clone()));
                            reason
                        }
                    }
                }
            };
            for shard in asked_shards {
                let Some(fetch) = shards.get_mut(&shard) else { continue };
                fetch.asked += 1;
                if fetch.asked >= fetch.replicas.len() {
                    return Err(format!("{peer}: {failure}; no storage node serving shard {shard} is left to ask"));
                }
                pending.push(shard);
            }
        }
    }
    Ok(witnesses)
}

type KeyValues = Vec<(B256, (Option<Vec<u8>>, usize))>;

/// Verified witnesses of a batch's accounts, one bag per storage node asked.
#[derive(Default)]
struct Witnesses {
    /// Each key's value and the bytes of its own full witness.
    values: HashMap<B256, (Option<Vec<u8>>, usize)>,
    full: Vec<NodeBag>,
    /// The same bags compacted at c.
    compact: Vec<NodeBag>,
}

/// A storage node's witness must be for the block asked, about the keys asked, and verify
/// against the block's state root (every key proved, every node used). Returns it whole
/// and compacted at `compaction`.
fn check_witness(
    witness: proto::WitnessReply,
    keys: &[B256],
    at: (u64, B256),
    root: B256,
    compaction: usize,
) -> Result<(NodeBag, NodeBag, KeyValues), String> {
    let served_at = parse_block_id(witness.at.as_ref(), "at")?;
    if served_at != Some(at) {
        return Err(format!("witness is for block {served_at:?}, not the block asked for ({}, {})", at.0, at.1));
    }
    let bag = bag_from_wire(witness.bag);
    let asked: HashSet<&[u8]> = keys.iter().map(|key| key.as_slice()).collect();
    let proved: HashSet<&[u8]> = bag.keys.iter().map(Vec::as_slice).collect();
    if bag.keys.len() != keys.len() || proved != asked {
        return Err(format!("witness is about {} keys, not the {} asked for", bag.keys.len(), keys.len()));
    }
    let (values, sizes, compact) = bag
        .verify_compact(root, compaction)
        .map_err(|error| format!("witness does not verify against {root}: {error}"))?;
    let pairs = bag
        .keys
        .iter()
        .zip(values.into_iter().zip(sizes))
        .map(|(key, value)| Ok((b256(key, "key")?, value)))
        .collect::<Result<KeyValues, String>>()?;
    Ok((bag, compact, pairs))
}

async fn submit_batch(shared: &Shared, batch: Vec<UserTransfer>) {
    let (number, hash, root) = match miner_head(shared).await {
        Ok(head) => head,
        Err(reason) => {
            tracing::warn!(client = %shared.config.id, %reason, "miner head unavailable");
            back_off().await;
            return retry(shared, batch, "miner_unreachable");
        }
    };
    let mut keys: Vec<B256> = batch.iter().flat_map(|t| [keccak256(t.sender), keccak256(t.tx.to())]).collect();
    keys.sort_unstable();
    keys.dedup();
    let Witnesses { values, full, compact } = match fetch_witnesses(shared, &keys, (number, hash), root).await {
        Ok(fetched) => fetched,
        Err(_) => {
            back_off().await;
            return retry(shared, batch, "bad_witness");
        }
    };

    // Pre-execute on the witnessed accounts, each transfer seeing the batch's earlier ones.
    let mut accounts: HashMap<B256, Account> = HashMap::new();
    let mut kept = Vec::with_capacity(batch.len());
    let mut full_bytes = 0u64;
    let mut filtered: Vec<(UserTransfer, String)> = Vec::new();
    let mut confirmed_late = Vec::new();
    for transfer in batch {
        let view = TransferView::of(&transfer.tx, transfer.sender);
        let load = |key: &B256| -> Result<Account, String> {
            if let Some(account) = accounts.get(key) {
                return Ok(*account);
            }
            match values.get(key) {
                Some((Some(bytes), _)) => Account::decode_rlp(bytes).map_err(|error| error.to_string()),
                Some((None, _)) => Ok(Account::default()),
                None => Err("not witnessed".to_string()),
            }
        };
        let (sender, recipient) = match (load(&view.sender_key), load(&view.to_key)) {
            (Ok(sender), Ok(recipient)) => (sender, recipient),
            _ => {
                filtered.push((transfer, "unreadable_account".to_string()));
                continue;
            }
        };
        // The miner failed before answering for this transfer, and its sender's nonce has
        // moved past it: only this transfer has that sender and nonce, so it committed.
        if sender.nonce > transfer.tx.nonce() && shared.uncertain.lock().remove(&transfer.tx.hash()) {
            confirmed_late.push(transfer);
            continue;
        }
        match apply_transfer(&shared.config.exec, &view, &sender, &recipient) {
            Ok(effect) => {
                accounts.insert(effect.sender.0, effect.sender.1);
                if let Some((key, account)) = effect.recipient {
                    accounts.insert(key, account);
                }
                full_bytes += [view.sender_key, view.to_key]
                    .iter()
                    .map(|key| values.get(key).map_or(0, |(_, size)| *size as u64))
                    .sum::<u64>();
                kept.push(transfer);
            }
            Err(reason) => filtered.push((transfer, reason.name().to_string())),
        }
    }
    if !confirmed_late.is_empty() {
        let mut stats = shared.stats.lock();
        stats.committed += confirmed_late.len() as u64;
        stats.confirmed_late += confirmed_late.len() as u64;
        drop(stats);
        release(shared, &confirmed_late);
    }
    let some_filtered = !filtered.is_empty();
    if some_filtered {
        let mut stats = shared.stats.lock();
        for (_, reason) in &filtered {
            *stats.filtered.entry(reason.clone()).or_default() += 1;
        }
        drop(stats);
        release(shared, &filtered.into_iter().map(|(transfer, _)| transfer).collect::<Vec<_>>());
    }
    if kept.is_empty() {
        return;
    }
    // Bagging: one bag for the batch, each node once. When some transfers were filtered,
    // the bag is narrowed to the kept ones' accounts and compacted again.
    let bag = if some_filtered {
        let full_bag = NodeBag::merge(full);
        let kept_keys: HashSet<B256> = kept.iter().flat_map(|t| [keccak256(t.sender), keccak256(t.tx.to())]).collect();
        let narrowed = NodeBag {
            keys: full_bag
                .keys
                .into_iter()
                .filter(|key| B256::try_from(key.as_slice()).is_ok_and(|k| kept_keys.contains(&k)))
                .collect(),
            nodes: full_bag.nodes,
        };
        match narrowed.compact(root, shared.config.compaction) {
            Ok(bag) => bag,
            Err(error) => {
                tracing::error!(client = %shared.config.id, %error, "compacting a verified bag failed");
                return retry(shared, kept, "compaction_failed");
            }
        }
    } else {
        NodeBag::merge(compact)
    };
    {
        let mut stats = shared.stats.lock();
        stats.submitted += kept.len() as u64;
        stats.submissions += 1;
        stats.witness_bytes_full += full_bytes;
        stats.witness_bytes_compact += bag.node_bytes() as u64;
    }
    let submission = Submission {
        transactions: kept.iter().map(|t| t.tx.encode()).collect(),
        bag: Some(bag_to_wire(&bag)),
        witness_at: Some(block_id(number, hash)),
        witness_root: root.to_vec(),
    };
    let reply =
        shared.transport.call(&shared.config.id, &shared.config.miner, request(RequestBody::Submit(submission))).await;
    let outcomes = match reply {
        Ok(reply) => match reply.body {
            Some(ResponseBody::Submitted(submitted)) => submitted.outcomes,
            _ => Vec::new(),
        },
        Err(error) => {
            tracing::warn!(client = %shared.config.id, %error, "submission failed");
            back_off().await;
            return retry_uncertain(shared, kept, "submission_failed");
        }
    };
    if outcomes.len() != kept.len() {
        tracing::warn!(client = %shared.config.id, "the miner answered for {} of {} transfers", outcomes.len(), kept.len());
        return retry_uncertain(shared, kept, "unanswered");
    }
    let mut retries: HashMap<String, Vec<UserTransfer>> = HashMap::new();
    let mut done = Vec::new();
    {
        let mut stats = shared.stats.lock();
        for (transfer, outcome) in kept.into_iter().zip(outcomes) {
            if outcome.included {
                stats.committed += 1;
                stats.committed_ok += u64::from(outcome.succeeded);
                done.push(transfer);
            } else {
                retries.entry(outcome.reason).or_default().push(transfer);
            }
        }
    }
    release(shared, &done);
    for (reason, transfers) in retries {
        retry(shared, transfers, &reason);
    }
}
