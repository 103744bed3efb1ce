//! A batch's witness fetch: which storage node is asked for which keys, the checks every
//! witness must pass, and what a failed one leads to.

use crate::messages::{BlockId, Response, SlotKeys, StorageBag, WitnessReply, WitnessRequest};
use alloy_primitives::{B256, U256};
use std::collections::{BTreeMap, HashMap, HashSet};
use virga_net::role::{CallId, Ids};
use virga_net::NetError;
use virga_trie::proof::{NodeBag, ProofError};

use crate::codec::b256;

/// Why a storage node's witness was not used, or why a fetch gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WitnessError {
    #[error("witness is for block {served:?}, not the block asked for ({}, {})", asked.0, asked.1)]
    WrongBlock { served: (u64, B256), asked: (u64, B256) },
    #[error("witness is about {proved} keys, not the {asked} asked for")]
    WrongKeys { proved: usize, asked: usize },
    #[error("witness does not verify against {root}: {source}")]
    DoesNotVerify { root: B256, source: ProofError },
    #[error("malformed witness: {0}")]
    Malformed(crate::codec::WireError),
    #[error("answered a witness request with something else")]
    UnexpectedReply,
    #[error("witness unavailable: {0}")]
    Unavailable(NetError),
    #[error("no storage node serves shard {shard}")]
    NoStorageNode { shard: usize },
    #[error("key {key} has no shard: {source}")]
    NoShard { key: B256, source: virga_trie::shard::ShardError },
    #[error("{served} slot witnesses for the {asked} accounts asked")]
    SlotWitnessCount { served: usize, asked: usize },
    #[error("slot witness of account {account}, whose own witness was not verified")]
    SlotsUnanchored { account: B256 },
    #[error("slot witness of account {account} is about other slots than those asked")]
    WrongSlots { account: B256 },
    #[error("slot witness of account {account} does not verify against its storage root {root}: {source}")]
    SlotsDoNotVerify { account: B256, root: B256, source: Box<ProofError> },
    #[error("slot {slot} of account {account} holds a value that is not an RLP integer")]
    SlotValue { account: B256, slot: B256 },
    #[error("{served} pieces of code for the {asked} asked")]
    CodeCount { served: usize, asked: usize },
    #[error("code asked by hash {asked} hashes to {got}")]
    WrongCode { asked: B256, got: B256 },
    #[error("{peer}: {cause}; no storage node serving shard {shard} is left to ask")]
    NoReplicaLeft { shard: usize, peer: String, cause: Box<WitnessError> },
}

impl WitnessError {
    /// The node answered, and what it sent fails the checks (as opposed to no answer).
    pub fn is_bad_witness(&self) -> bool {
        matches!(
            self,
            WitnessError::WrongBlock { .. }
                | WitnessError::WrongKeys { .. }
                | WitnessError::DoesNotVerify { .. }
                | WitnessError::Malformed(_)
                | WitnessError::UnexpectedReply
                | WitnessError::SlotWitnessCount { .. }
                | WitnessError::SlotsUnanchored { .. }
                | WitnessError::WrongSlots { .. }
                | WitnessError::SlotsDoNotVerify { .. }
                | WitnessError::SlotValue { .. }
                | WitnessError::CodeCount { .. }
                | WitnessError::WrongCode { .. }
        )
    }
}

/// Each key's value (`None`: absent) and the bytes of its own full witness.
pub(super) type KeyValues = Vec<(B256, (Option<Vec<u8>>, usize))>;

/// A storage node's witness must be for the block asked, about the keys asked, and verify
/// against the block's state root (every key proved, every node used). Returns it whole,
/// compacted at `compaction`, and each key's value.
pub fn check_witness(
    witness: WitnessReply,
    keys: &[B256],
    at: (u64, B256),
    root: B256,
    compaction: usize,
) -> Result<(NodeBag, NodeBag, KeyValues), WitnessError> {
    if witness.at.pair() != at {
        return Err(WitnessError::WrongBlock { served: witness.at.pair(), asked: at });
    }
    let bag = witness.bag;
    let asked: HashSet<&[u8]> = keys.iter().map(|key| key.as_slice()).collect();
    let proved: HashSet<&[u8]> = bag.keys.iter().map(Vec::as_slice).collect();
    if bag.keys.len() != keys.len() || proved != asked {
        return Err(WitnessError::WrongKeys { proved: bag.keys.len(), asked: keys.len() });
    }
    let (values, sizes, compact) =
        bag.verify_compact(root, compaction).map_err(|source| WitnessError::DoesNotVerify { root, source })?;
    let pairs = bag
        .keys
        .iter()
        .zip(values.into_iter().zip(sizes))
        .map(|(key, value)| Ok((b256(key, "key").map_err(WitnessError::Malformed)?, value)))
        .collect::<Result<KeyValues, WitnessError>>()?;
    Ok((bag, compact, pairs))
}

/// Contract storage and code a witness brought, every piece checked.
#[derive(Debug, Default)]
pub struct ContractWitness {
    /// (account key, slot key, value; zero where the slot is empty).
    pub slots: Vec<(B256, B256, U256)>,
    /// Each account's slot bag, as served (whole proofs), with the storage root it
    /// verified against.
    pub bags: Vec<(B256, B256, NodeBag)>,
    /// The code asked for, by hash.
    pub codes: Vec<(B256, Vec<u8>)>,
}

/// A witness's contract part must answer the slots and code asked, in their order: each
/// account's bag proves exactly the slots asked from the storage root `storage_root_of` the
/// account (whose own witness was verified first), and each code hashes to the hash asked.
pub fn check_contract_witness(
    storage: Vec<StorageBag>,
    codes: Vec<Vec<u8>>,
    asked_slots: &[SlotKeys],
    asked_codes: &[B256],
    storage_root_of: impl Fn(&B256) -> Option<B256>,
) -> Result<ContractWitness, WitnessError> {
    if storage.len() != asked_slots.len() {
        return Err(WitnessError::SlotWitnessCount { served: storage.len(), asked: asked_slots.len() });
    }
    if codes.len() != asked_codes.len() {
        return Err(WitnessError::CodeCount { served: codes.len(), asked: asked_codes.len() });
    }
    let mut checked = ContractWitness::default();
    for (served, asked) in storage.into_iter().zip(asked_slots) {
        let account = asked.account;
        if served.account != account {
            return Err(WitnessError::WrongSlots { account });
        }
        let root = storage_root_of(&account).ok_or(WitnessError::SlotsUnanchored { account })?;
        let bag = served.bag;
        if bag.keys.len() != asked.slots.len()
            || bag.keys.iter().zip(&asked.slots).any(|(key, slot)| key[..] != slot[..])
        {
            return Err(WitnessError::WrongSlots { account });
        }
        let values = bag.verify(root).map_err(|source| WitnessError::SlotsDoNotVerify {
            account,
            root,
            source: Box::new(source),
        })?;
        for (slot, value) in bag.keys.iter().zip(values) {
            let slot = b256(slot, "slot key").map_err(WitnessError::Malformed)?;
            let value = match value {
                None => U256::ZERO,
                Some(raw) => alloy_rlp::Decodable::decode(&mut raw.as_slice())
                    .map_err(|_| WitnessError::SlotValue { account, slot })?,
            };
            checked.slots.push((account, slot, value));
        }
        checked.bags.push((account, root, bag));
    }
    for (code, asked) in codes.into_iter().zip(asked_codes) {
        let got = alloy_primitives::keccak256(&code);
        if got != *asked {
            return Err(WitnessError::WrongCode { asked: *asked, got });
        }
        checked.codes.push((*asked, code));
    }
    Ok(checked)
}

/// The storage root of the account with key `key` among verified values (absent: empty).
fn storage_root(values: &KeyValues, key: &B256) -> Option<B256> {
    let (_, (value, _)) = values.iter().find(|(k, _)| k == key)?;
    match value {
        None => Some(virga_core::EMPTY_ROOT),
        Some(raw) => virga_trie::account::Account::decode_rlp(raw).ok().map(|account| account.storage_root),
    }
}

/// Verified witnesses of a batch's accounts, one bag per storage node answer, and of its
/// contracts' slots and code.
#[derive(Debug, Default)]
pub(super) struct Witnesses {
    /// Each key's value and the bytes of its own full witness.
    pub(super) values: HashMap<B256, (Option<Vec<u8>>, usize)>,
    pub(super) full: Vec<NodeBag>,
    /// The same bags compacted at c.
    pub(super) compact: Vec<NodeBag>,
    pub(super) contracts: ContractWitness,
}

/// What a fetch asks of contracts, by the secure-trie key of their account: slot keys
/// (keccak of the slot), and code by hash. Both go to a node serving the account's shard,
/// with the account itself, whose storage root and code hash anchor them.
#[derive(Clone, Debug, Default)]
pub(super) struct ContractAsk {
    pub(super) slots: BTreeMap<B256, Vec<B256>>,
    pub(super) codes: BTreeMap<B256, B256>,
}

impl ContractAsk {
    /// The accounts asked about.
    pub(super) fn accounts(&self) -> impl Iterator<Item = B256> + '_ {
        self.slots.keys().chain(self.codes.keys()).copied()
    }
}

/// One shard's part of a fetch.
#[derive(Debug)]
struct ShardFetch {
    keys: Vec<B256>,
    contracts: ContractAsk,
    /// The storage nodes serving the shard.
    replicas: Vec<String>,
    /// Replicas asked so far.
    asked: usize,
}

/// One witness request in flight: whom it went to, for which shards, keys and contracts.
#[derive(Debug)]
struct Asked {
    peer: String,
    shards: Vec<usize>,
    keys: Vec<B256>,
    slots: Vec<SlotKeys>,
    codes: Vec<B256>,
}

/// A witness request to send.
#[derive(Debug)]
pub(super) struct WitnessCall {
    pub(super) call: CallId,
    pub(super) peer: String,
    pub(super) request: WitnessRequest,
}

/// What became of a witness answer.
#[derive(Debug)]
pub(super) enum Answered {
    /// Checked and kept.
    Verified,
    /// Unusable: the node's shards go to their next replicas.
    Failed { peer: String, error: WitnessError },
}

/// The witnesses of a batch's keys at one block: each shard's keys go to one storage node
/// serving it, the replicas taken in turn fetch after fetch; keys asked of a node whose
/// answer fails go to their shards' next replicas, until a shard has none left.
#[derive(Debug)]
pub(super) struct WitnessFetch {
    pub(super) at: (u64, B256),
    pub(super) root: B256,
    /// This fetch's number among the client's fetches: picks the replica asked first.
    turn: usize,
    /// Fetch rounds of the batch so far (this one included): a contract call may learn of
    /// more slots to fetch once it runs on what the last round brought.
    pub(super) round: usize,
    shards: BTreeMap<usize, ShardFetch>,
    /// Shards to ask (again) at the next dispatch.
    pending: Vec<usize>,
    outstanding: HashMap<CallId, Asked>,
    pub(super) witnesses: Witnesses,
}

impl WitnessFetch {
    pub(super) fn new(
        keys: &[B256],
        at: (u64, B256),
        root: B256,
        turn: usize,
        storage_nodes: &[(String, Vec<usize>)],
        prefix_nibbles: usize,
    ) -> Result<WitnessFetch, WitnessError> {
        let mut fetch = WitnessFetch {
            at,
            root,
            turn,
            round: 1,
            shards: BTreeMap::new(),
            pending: Vec::new(),
            outstanding: HashMap::new(),
            witnesses: Witnesses::default(),
        };
        fetch.add_keys(keys, &ContractAsk::default(), storage_nodes, prefix_nibbles)?;
        Ok(fetch)
    }

    /// The next round of a batch's fetch, at the same block: `keys` and `contracts` more,
    /// kept beside what earlier rounds verified.
    pub(super) fn next_round(
        previous: WitnessFetch,
        keys: &[B256],
        contracts: &ContractAsk,
        storage_nodes: &[(String, Vec<usize>)],
        prefix_nibbles: usize,
    ) -> Result<WitnessFetch, WitnessError> {
        let mut fetch = WitnessFetch {
            round: previous.round + 1,
            shards: BTreeMap::new(),
            pending: Vec::new(),
            outstanding: HashMap::new(),
            ..previous
        };
        fetch.add_keys(keys, contracts, storage_nodes, prefix_nibbles)?;
        Ok(fetch)
    }

    /// Puts keys (and contracts, each with its account) in their shards' parts.
    fn add_keys(
        &mut self,
        keys: &[B256],
        contracts: &ContractAsk,
        storage_nodes: &[(String, Vec<usize>)],
        prefix_nibbles: usize,
    ) -> Result<(), WitnessError> {
        let mut all: Vec<B256> = keys.iter().copied().chain(contracts.accounts()).collect();
        all.sort_unstable();
        all.dedup();
        for key in all {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix_nibbles)
                .map_err(|source| WitnessError::NoShard { key, source })?;
            let part = match self.shards.entry(shard) {
                std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    let replicas: Vec<String> = storage_nodes
                        .iter()
                        .filter(|(_, served)| served.contains(&shard))
                        .map(|(peer, _)| peer.clone())
                        .collect();
                    if replicas.is_empty() {
                        return Err(WitnessError::NoStorageNode { shard });
                    }
                    self.pending.push(shard);
                    entry.insert(ShardFetch { keys: Vec::new(), contracts: ContractAsk::default(), replicas, asked: 0 })
                }
            };
            part.keys.push(key);
            if let Some(slots) = contracts.slots.get(&key) {
                part.contracts.slots.insert(key, slots.clone());
            }
            if let Some(code) = contracts.codes.get(&key) {
                part.contracts.codes.insert(key, *code);
            }
        }
        Ok(())
    }

    /// One request per storage node: the keys of the pending shards it is next to answer for.
    pub(super) fn dispatch(&mut self, ids: &mut Ids) -> Vec<WitnessCall> {
        let mut by_node: BTreeMap<&str, (Vec<usize>, Vec<B256>, ContractAsk)> = BTreeMap::new();
        for shard in self.pending.drain(..) {
            let Some(fetch) = self.shards.get(&shard) else { continue };
            let peer = &fetch.replicas[(self.turn + fetch.asked) % fetch.replicas.len()];
            let (shards, keys, contracts) = by_node.entry(peer).or_default();
            shards.push(shard);
            keys.extend(&fetch.keys);
            contracts.slots.extend(fetch.contracts.slots.iter().map(|(account, slots)| (*account, slots.clone())));
            contracts.codes.extend(fetch.contracts.codes.iter().map(|(account, code)| (*account, *code)));
        }
        let mut calls = Vec::with_capacity(by_node.len());
        for (peer, (shards, keys, contracts)) in by_node {
            let call = ids.call();
            let slots: Vec<SlotKeys> = contracts
                .slots
                .iter()
                .map(|(account, slots)| SlotKeys { account: *account, slots: slots.clone() })
                .collect();
            let codes: Vec<B256> = contracts.codes.values().copied().collect();
            let request = WitnessRequest {
                keys: keys.clone(),
                compaction: 0,
                at: Some(BlockId::new(self.at.0, self.at.1)),
                slots: slots.clone(),
                code_hashes: codes.clone(),
            };
            calls.push(WitnessCall { call, peer: peer.to_string(), request });
            self.outstanding.insert(call, Asked { peer: peer.to_string(), shards, keys, slots, codes });
        }
        calls
    }

    /// Takes the answer to `call` (one of [`Self::calls`]); a verified witness is kept.
    pub(super) fn answer(
        &mut self,
        call: CallId,
        result: Result<Response, NetError>,
        compaction: usize,
    ) -> Option<Answered> {
        let asked = self.outstanding.remove(&call)?;
        let checked = match result {
            Err(error) => Err(WitnessError::Unavailable(error)),
            Ok(reply) => match reply {
                Response::Witness(mut witness) => {
                    let (storage, codes) = (std::mem::take(&mut witness.storage), std::mem::take(&mut witness.codes));
                    check_witness(witness, &asked.keys, self.at, self.root, compaction).and_then(|checked| {
                        let storage_root_of = |key: &B256| storage_root(&checked.2, key);
                        let contracts =
                            check_contract_witness(storage, codes, &asked.slots, &asked.codes, storage_root_of)?;
                        Ok((checked, contracts))
                    })
                }
                _ => Err(WitnessError::UnexpectedReply),
            },
        };
        match checked {
            Ok(((full, compact, key_values), contracts)) => {
                self.witnesses.values.extend(key_values);
                self.witnesses.full.push(full);
                self.witnesses.compact.push(compact);
                let held = &mut self.witnesses.contracts;
                held.slots.extend(contracts.slots);
                held.bags.extend(contracts.bags);
                held.codes.extend(contracts.codes);
                Some(Answered::Verified)
            }
            Err(error) => {
                self.pending.extend(&asked.shards);
                for shard in &asked.shards {
                    if let Some(fetch) = self.shards.get_mut(shard) {
                        fetch.asked += 1;
                    }
                }
                Some(Answered::Failed { peer: asked.peer, error })
            }
        }
    }

    /// After a failed answer: the first shard every replica of which has failed, if any.
    pub(super) fn exhausted(&self, peer: &str, cause: &WitnessError) -> Option<WitnessError> {
        self.pending.iter().find_map(|shard| {
            let fetch = self.shards.get(shard)?;
            (fetch.asked >= fetch.replicas.len()).then(|| WitnessError::NoReplicaLeft {
                shard: *shard,
                peer: peer.to_string(),
                cause: Box::new(cause.clone()),
            })
        })
    }

    /// The calls still unanswered.
    pub(super) fn calls(&self) -> impl Iterator<Item = CallId> + '_ {
        self.outstanding.keys().copied()
    }

    /// Every shard's witness is in.
    pub(super) fn is_complete(&self) -> bool {
        self.outstanding.is_empty() && self.pending.is_empty()
    }
}
