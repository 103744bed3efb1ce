//! Warming up: the top layer is filled with levels 0..=r from the storage nodes (checked by
//! hash against the head's root) and the path of the beneficiary, which every block
//! credits. A round that fails (a node unreachable, a witness refused) is tried again after
//! [`WARM_UP_RETRY`]; the miner builds nothing until a round succeeds.

use crate::messages::{BlockId, Request, TopRequest, WitnessRequest};
use crate::protocol::{Rainblock, Response};
use alloy_primitives::{keccak256, B256};
use std::time::Duration;
use virga_net::role::Command;
use virga_net::NetError;
use virga_trie::proof::NodeBag;

use super::{MinerCore, MinerIo, Outstanding, TimerPurpose, WarmUpFailure};
use crate::client::WitnessError;
use crate::storage::prefix_nibbles;

/// The pause before a failed warm-up round is tried again.
pub const WARM_UP_RETRY: Duration = Duration::from_millis(200);

/// One warm-up round's progress.
#[derive(Default)]
pub(crate) struct WarmUp {
    pub(crate) round: u64,
    pub(crate) done: bool,
    tops_awaited: usize,
    nodes: Vec<Vec<u8>>,
    /// The top levels of contracts' storage tries, by account key.
    storage_tops: Vec<(B256, Vec<Vec<u8>>)>,
    /// The beneficiary's witness, once one verified.
    witness: Option<NodeBag>,
    /// The replicas of the beneficiary's shard asked so far this round.
    witness_asked: usize,
    failed: bool,
    /// The last round that failed, and why.
    pub(crate) last_failure: Option<(u64, WarmUpFailure)>,
}

impl MinerCore {
    /// Starts a warm-up round at the committed head.
    pub(crate) fn start_warm_up(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let round = self.warm.round + 1;
        let last_failure = self.warm.last_failure.take();
        self.warm = WarmUp { round, last_failure, ..WarmUp::default() };
        let (number, hash, _) = self.layer.head();
        let levels = self.config.retention.saturating_add(1).min(64) as u32;
        for (peer, _) in self.config.storage_nodes.clone() {
            let call = self.ids.call();
            self.calls.insert(call, Outstanding::Top { round });
            self.warm.tops_awaited += 1;
            let top = TopRequest { levels, at: Some(BlockId::new(number, hash)) };
            out.push(Command::Call { to: peer, call, request: Request::Top(top), deadline: self.deadline });
        }
        self.ask_beneficiary_witness(out);
    }

    /// Asks the next replica of the beneficiary's shard for its witness.
    fn ask_beneficiary_witness(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let (number, hash, _) = self.layer.head();
        let key = keccak256(self.config.beneficiary);
        let prefix = prefix_nibbles(self.config.shard_count).unwrap_or(0);
        let shard = virga_trie::shard::shard_of(key.as_slice(), prefix).unwrap_or(0);
        let replicas: Vec<String> = self
            .config
            .storage_nodes
            .iter()
            .filter(|(_, shards)| shards.contains(&shard))
            .map(|(peer, _)| peer.clone())
            .collect();
        let Some(peer) = replicas.get(self.warm.witness_asked).cloned() else {
            return self.warm_up_failed(WarmUpFailure::NoReplicaLeft { shard }, out);
        };
        self.warm.witness_asked += 1;
        let call = self.ids.call();
        self.calls.insert(call, Outstanding::BeneficiaryWitness { round: self.warm.round, peer: peer.clone() });
        let witness = WitnessRequest {
            keys: vec![key],
            compaction: 0,
            at: Some(BlockId::new(number, hash)),
            ..Default::default()
        };
        out.push(Command::Call { to: peer, call, request: Request::Witness(witness), deadline: self.deadline });
    }

    pub(crate) fn top_answered(
        &mut self,
        round: u64,
        result: Result<Response, NetError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        if round != self.warm.round || self.warm.done {
            return;
        }
        self.warm.tops_awaited -= 1;
        match result {
            Ok(Response::Top(top)) => {
                self.warm.nodes.extend(top.nodes);
                for entry in top.storage {
                    self.warm.storage_tops.push((entry.account, entry.bag.nodes));
                }
            }
            Ok(_) => return self.warm_up_failed(WarmUpFailure::UnexpectedTopReply, out),
            Err(error) => return self.warm_up_failed(WarmUpFailure::Top(error), out),
        }
        self.warm_up_progress(out);
    }

    pub(crate) fn witness_answered(
        &mut self,
        round: u64,
        peer: String,
        result: Result<Response, NetError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        if round != self.warm.round || self.warm.done {
            return;
        }
        let (number, hash, root) = self.layer.head();
        let key = keccak256(self.config.beneficiary);
        let checked = result
            .map_err(WitnessError::Unavailable)
            .and_then(|reply| check_witness(reply, &key, (number, hash), root));
        match checked {
            Ok(bag) => {
                self.warm.witness = Some(bag);
                self.warm_up_progress(out);
            }
            Err(reason) => {
                tracing::warn!(miner = %self.config.id, peer = %peer, %reason, "witness refused");
                self.stats.bad_witnesses.push((peer, reason));
                self.ask_beneficiary_witness(out);
            }
        }
    }

    fn warm_up_failed(&mut self, reason: WarmUpFailure, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if self.warm.failed {
            return;
        }
        tracing::warn!(miner = %self.config.id, %reason, "warm-up failed; trying again");
        self.warm.failed = true;
        self.warm.last_failure = Some((self.warm.round, reason));
        let timer = self.ids.timer();
        self.timers.insert(timer, TimerPurpose::RetryWarmUp);
        out.push(Command::SetTimer { timer, after: WARM_UP_RETRY });
    }

    fn warm_up_progress(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if self.warm.failed || self.warm.tops_awaited > 0 || self.warm.witness.is_none() {
            return;
        }
        let root = self.layer.head().2;
        let nodes = std::mem::take(&mut self.warm.nodes);
        let witness = self.warm.witness.take().unwrap_or_default();
        let mut top = self.layer.committed.top.accounts.clone();
        let attached = match top.attach_nodes(&nodes) {
            Ok(attached) => attached,
            Err(error) => return self.warm_up_failed(WarmUpFailure::TopNodes(error), out),
        };
        if let Err(error) = top.apply_bag(&witness) {
            return self.warm_up_failed(WarmUpFailure::BeneficiaryWitness(error), out);
        }
        if top.root_hash() != root {
            return self.warm_up_failed(WarmUpFailure::RootChanged, out);
        }
        let mut state = virga_evm::PartialState::new(top);
        for (account, nodes) in std::mem::take(&mut self.warm.storage_tops) {
            if let Err(error) = state.attach_storage_top(account, &nodes) {
                return self.warm_up_failed(WarmUpFailure::StorageTop(error), out);
            }
        }
        tracing::info!(miner = %self.config.id, attached = attached.attached, "top layer warmed up");
        let bytes = state.memory_bytes();
        // The storage nodes' top nodes may reach below r, off any recorded path.
        self.layer.committed.top = state.clone();
        self.layer.tip.top = state;
        for layer in [&mut self.layer.committed, &mut self.layer.tip] {
            layer.estimated_bytes = bytes;
            layer.unpruned = None;
        }
        self.stats.top_bytes = bytes;
        self.stats.peak_top_bytes = self.stats.peak_top_bytes.max(bytes);
        self.warm.done = true;
        self.warm.last_failure = None;
        self.pump(out);
    }
}

/// A storage node's answer to a one-key witness request: a witness for block `at`, about
/// exactly `key`, verifying against `root`.
fn check_witness(reply: Response, key: &B256, at: (u64, B256), root: B256) -> Result<NodeBag, WitnessError> {
    let Response::Witness(witness) = reply else {
        return Err(WitnessError::UnexpectedReply);
    };
    if witness.at.pair() != at {
        return Err(WitnessError::WrongBlock { served: witness.at.pair(), asked: at });
    }
    let bag = witness.bag;
    if bag.keys != [key.to_vec()] {
        return Err(WitnessError::WrongKeys { proved: bag.keys.len(), asked: 1 });
    }
    bag.verify(root).map_err(|source| WitnessError::DoesNotVerify { root, source })?;
    Ok(bag)
}
