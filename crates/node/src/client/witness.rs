//! A batch's witness fetch: which storage node is asked for which keys, the checks every
//! witness must pass, and what a failed one leads to.

use alloy_primitives::B256;
use std::collections::{BTreeMap, HashMap, HashSet};
use virga_net::proto;
use virga_net::role::{CallId, Ids};
use virga_net::NetError;
use virga_trie::proof::{NodeBag, ProofError};

use crate::codec::{b256, bag_from_wire, block_id, parse_block_id};

/// Why a storage node's witness was not used, or why a fetch gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WitnessError {
    #[error("witness is for block {served:?}, not the block asked for ({}, {})", asked.0, asked.1)]
    WrongBlock { served: Option<(u64, B256)>, asked: (u64, B256) },
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
        )
    }
}

/// Each key's value (`None`: absent) and the bytes of its own full witness.
pub(super) type KeyValues = Vec<(B256, (Option<Vec<u8>>, usize))>;

/// A storage node's witness must be for the block asked, about the keys asked, and verify
/// against the block's state root (every key proved, every node used). Returns it whole,
/// compacted at `compaction`, and each key's value.
pub fn check_witness(
    witness: proto::WitnessReply,
    keys: &[B256],
    at: (u64, B256),
    root: B256,
    compaction: usize,
) -> Result<(NodeBag, NodeBag, KeyValues), WitnessError> {
    let served = parse_block_id(witness.at.as_ref(), "at").map_err(WitnessError::Malformed)?;
    if served != Some(at) {
        return Err(WitnessError::WrongBlock { served, asked: at });
    }
    let bag = bag_from_wire(witness.bag);
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

/// Verified witnesses of a batch's accounts, one bag per storage node answer.
#[derive(Debug, Default)]
pub(super) struct Witnesses {
    /// Each key's value and the bytes of its own full witness.
    pub(super) values: HashMap<B256, (Option<Vec<u8>>, usize)>,
    pub(super) full: Vec<NodeBag>,
    /// The same bags compacted at c.
    pub(super) compact: Vec<NodeBag>,
}

/// One shard's part of a fetch.
#[derive(Debug)]
struct ShardFetch {
    keys: Vec<B256>,
    /// The storage nodes serving the shard.
    replicas: Vec<String>,
    /// Replicas asked so far.
    asked: usize,
}

/// One witness request in flight: whom it went to, for which shards and keys.
#[derive(Debug)]
struct Asked {
    peer: String,
    shards: Vec<usize>,
    keys: Vec<B256>,
}

/// A witness request to send.
#[derive(Debug)]
pub(super) struct WitnessCall {
    pub(super) call: CallId,
    pub(super) peer: String,
    pub(super) request: proto::WitnessRequest,
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
        let mut shards: BTreeMap<usize, ShardFetch> = BTreeMap::new();
        for key in keys {
            let shard = virga_trie::shard::shard_of(key.as_slice(), prefix_nibbles)
                .map_err(|source| WitnessError::NoShard { key: *key, source })?;
            if let Some(fetch) = shards.get_mut(&shard) {
                fetch.keys.push(*key);
                continue;
            }
            let replicas: Vec<String> = storage_nodes
                .iter()
                .filter(|(_, served)| served.contains(&shard))
                .map(|(peer, _)| peer.clone())
                .collect();
            if replicas.is_empty() {
                return Err(WitnessError::NoStorageNode { shard });
            }
            shards.insert(shard, ShardFetch { keys: vec![*key], replicas, asked: 0 });
        }
        let pending = shards.keys().copied().collect();
        Ok(WitnessFetch {
            at,
            root,
            turn,
            shards,
            pending,
            outstanding: HashMap::new(),
            witnesses: Witnesses::default(),
        })
    }

    /// One request per storage node: the keys of the pending shards it is next to answer for.
    pub(super) fn dispatch(&mut self, ids: &mut Ids) -> Vec<WitnessCall> {
        let mut by_node: BTreeMap<&str, (Vec<usize>, Vec<B256>)> = BTreeMap::new();
        for shard in self.pending.drain(..) {
            let Some(fetch) = self.shards.get(&shard) else { continue };
            let peer = &fetch.replicas[(self.turn + fetch.asked) % fetch.replicas.len()];
            let (shards, keys) = by_node.entry(peer).or_default();
            shards.push(shard);
            keys.extend(&fetch.keys);
        }
        let mut calls = Vec::with_capacity(by_node.len());
        for (peer, (shards, keys)) in by_node {
            let call = ids.call();
            let request = proto::WitnessRequest {
                keys: keys.iter().map(|key| key.to_vec()).collect(),
                compaction: 0,
                at: Some(block_id(self.at.0, self.at.1)),
            };
            calls.push(WitnessCall { call, peer: peer.to_string(), request });
            self.outstanding.insert(call, Asked { peer: peer.to_string(), shards, keys });
        }
        calls
    }

    /// Takes the answer to `call` (one of [`Self::calls`]); a verified witness is kept.
    pub(super) fn answer(
        &mut self,
        call: CallId,
        result: Result<proto::Response, NetError>,
        compaction: usize,
    ) -> Option<Answered> {
        let asked = self.outstanding.remove(&call)?;
        let checked = match result {
            Err(error) => Err(WitnessError::Unavailable(error)),
            Ok(reply) => match reply.body {
                Some(virga_net::ResponseBody::Witness(witness)) => {
                    check_witness(witness, &asked.keys, self.at, self.root, compaction)
                }
                _ => Err(WitnessError::UnexpectedReply),
            },
        };
        match checked {
            Ok((full, compact, key_values)) => {
                self.witnesses.values.extend(key_values);
                self.witnesses.full.push(full);
                self.witnesses.compact.push(compact);
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
