//! An organization's CommitServer: signs its execution server's LedgerBlock hash, exchanges
//! signed votes with the other organizations' commit servers, and decides by the c-of-k
//! policy (the LedgerConsensus phase).
//!
//! A vote is logged on the commit server's device before anyone sees it, so a restarted
//! commit server still answers for the blocks it voted on and never votes two ways. While
//! a block is undecided, the server asks every peer whose vote it lacks, again after each
//! retry interval; the answer carries the peer's vote if it has one, and the request
//! carries this server's, so whichever of two organizations votes later learns the other's
//! vote however many messages are lost or servers restarted.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Refusal;
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{Hash, SignedVote, VoteOutcome};
use virga_net::role::{CallId, Command, Event, Ids, Nanos, TimerId};
use virga_net::NetError;

use super::{
    node_name, organization_of, Decision, PipelineCommand, PipelineConfig, PipelineEvent, PipelineIo, PipelineIoDone,
    Request, Response,
};

/// How many blocks of votes are kept below the block being decided.
const KEPT_BLOCKS: u64 = 1024;

/// A commit server's deliberate fault, for the simulator's checks to catch. Its variants
/// exist only in test builds and under the `sim` feature; elsewhere it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitWeakness {
    /// Commit on its own hash without waiting for the policy.
    #[cfg(any(test, feature = "sim"))]
    CommitWithoutQuorum,
}

#[derive(Debug, Clone, Default)]
pub struct CommitStats {
    pub commits: u64,
    pub recoveries: u64,
    /// Votes refused, with the reason.
    pub refused: Vec<String>,
}

struct Deciding {
    block: u64,
    own: Option<Hash>,
    call: CallId,
    /// Whether the own vote is logged (and so may be sent).
    logged: bool,
}

pub struct CommitServer {
    org: String,
    key: SigningKey,
    config: Arc<PipelineConfig>,
    weakness: Option<CommitWeakness>,
    ids: Ids,
    loaded: bool,
    /// Checked votes heard, by block and organization (the first of each counts).
    heard: BTreeMap<u64, BTreeMap<String, Hash>>,
    own: BTreeMap<u64, SignedVote>,
    /// Peers that asked for this server's vote on a block before it had one: they have
    /// nothing to ask it again for, so its vote is sent to them once it has one.
    owed: BTreeMap<u64, std::collections::BTreeSet<String>>,
    deciding: Option<Deciding>,
    /// Vote requests in flight, by peer.
    asking: BTreeMap<CallId, String>,
    pull_timer: Option<TimerId>,
    stats: CommitStats,
}

impl CommitServer {
    pub fn new(
        org: &str,
        key: SigningKey,
        config: Arc<PipelineConfig>,
        weakness: Option<CommitWeakness>,
    ) -> CommitServer {
        CommitServer {
            org: org.to_string(),
            key,
            config,
            weakness,
            ids: Ids::default(),
            loaded: false,
            heard: BTreeMap::new(),
            own: BTreeMap::new(),
            owed: BTreeMap::new(),
            deciding: None,
            asking: BTreeMap::new(),
            pull_timer: None,
            stats: CommitStats::default(),
        }
    }

    pub fn stats(&self) -> &CommitStats {
        &self.stats
    }

    pub fn step(&mut self, _now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        match event {
            Event::Start => out.push(Command::Io { io: self.ids.io(), op: PipelineIo::LoadVotes }),
            Event::IoDone { result: PipelineIoDone::LoadedVotes(votes), .. } => {
                self.own = votes.into_iter().map(|vote| (vote.block, vote)).collect();
                self.loaded = true;
            }
            Event::IoDone { result: PipelineIoDone::VoteLogged(block), .. } => {
                if let Some(deciding) = self.deciding.as_mut().filter(|deciding| deciding.block == block) {
                    deciding.logged = true;
                    self.ask_peers(out);
                }
            }
            Event::IoDone { .. } | Event::Input(()) => {}
            Event::Request { from, call, request } => {
                let response = match self.request(&from, call, request, out) {
                    Ok(None) => return,
                    Ok(Some(response)) => response,
                    Err(reason) => {
                        let reason = reason.to_string();
                        self.stats.refused.push(reason.clone());
                        Response::Refused(reason)
                    }
                };
                out.push(Command::Reply { to: from, call, response });
            }
            Event::Response { call, result } => {
                let Some(peer) = self.asking.remove(&call) else {
                    return;
                };
                match result {
                    Ok(Response::VoteAck(Some(vote))) => {
                        let block = vote.block;
                        if let Err(reason) = self.hear(&peer, block, vote) {
                            self.stats.refused.push(reason.to_string());
                        }
                    }
                    Ok(_) => {}
                    Err(NetError::Refused { reason, .. }) => {
                        self.stats.refused.push(format!("{peer} refused our vote: {reason}"));
                    }
                    Err(_) => {}
                }
            }
            Event::Timer(timer) => {
                if self.pull_timer == Some(timer) {
                    self.pull_timer = None;
                    self.ask_peers(out);
                }
            }
        }
        self.evaluate(out);
    }

    /// A request's answer now (Some), later (None: a decision), or its refusal.
    fn request(
        &mut self,
        from: &str,
        call: CallId,
        request: Request,
        out: &mut Vec<PipelineCommand>,
    ) -> Result<Option<Response>, Refusal> {
        if !self.loaded {
            return Err(Refusal::Loading { server: "commit server", log: "vote log" });
        }
        match request {
            Request::Decide { block, hash } if from == node_name(&self.org, "exec") => {
                self.decide(block, hash, call, out);
                Ok(None)
            }
            Request::Vote { block, vote } => {
                let peer = organization_of(from).unwrap_or_default().to_string();
                if from != node_name(&peer, "commit")
                    || peer == self.org
                    || !self.config.organizations.contains_key(&peer)
                {
                    return Err(Refusal::NotACommitPeer { from: from.to_string() });
                }
                if let Some(vote) = vote {
                    self.hear(&peer, block, vote)?;
                }
                let own = self.own.get(&block).cloned();
                if own.is_none() {
                    self.owed.entry(block).or_default().insert(peer);
                }
                Ok(Some(Response::VoteAck(own)))
            }
            other => Err(Refusal::NotServed {
                server: "a commit server",
                kind: <super::ChainifyProtocol as virga_net::role::Protocol>::request_kind(&other),
                from: from.to_string(),
            }),
        }
    }

    /// The execution server's hash for `block` (None: its database failed). A hash is
    /// signed and logged before it is sent; a block voted on before keeps its first vote.
    fn decide(&mut self, block: u64, hash: Option<Hash>, call: CallId, out: &mut Vec<PipelineCommand>) {
        let logged = match (hash, self.own.get(&block)) {
            (None, _) => true,
            (Some(hash), Some(vote)) if vote.ledger_block_hash == hash => true,
            (Some(hash), Some(_)) => {
                // A restarted execution server got other effects this time: its first vote
                // stands for the others, and its own outcome follows from theirs.
                self.deciding = Some(Deciding { block, own: Some(hash), call, logged: true });
                self.ask_peers(out);
                return;
            }
            (Some(hash), None) => {
                let vote = SignedVote::sign(&self.key, &self.org, block, hash);
                self.own.insert(block, vote.clone());
                out.push(Command::Io { io: self.ids.io(), op: PipelineIo::LogVote(vote) });
                false
            }
        };
        self.deciding = Some(Deciding { block, own: hash, call, logged });
        if logged {
            self.ask_peers(out);
        }
    }

    /// Asks every peer whose vote for the block being decided is missing (sending this
    /// server's own), unless a request to it is in flight, and sends the vote to every peer
    /// it is owed to; and asks again after a while.
    fn ask_peers(&mut self, out: &mut Vec<PipelineCommand>) {
        let Some(deciding) = self.deciding.as_ref().filter(|deciding| deciding.logged) else {
            return;
        };
        let block = deciding.block;
        let heard = self.heard.get(&block);
        let owed = self.owed.remove(&block).unwrap_or_default();
        let missing: Vec<String> = self
            .config
            .peers_of(&self.org)
            .filter(|peer| !heard.is_some_and(|heard| heard.contains_key(*peer)) || owed.contains(*peer))
            .filter(|peer| !self.asking.values().any(|asked| asked == peer))
            .map(str::to_string)
            .collect();
        let vote = self.own.get(&block).cloned();
        for peer in missing {
            let call = self.ids.call();
            self.asking.insert(call, peer.clone());
            out.push(Command::Call {
                to: node_name(&peer, "commit"),
                call,
                request: Request::Vote { block, vote: vote.clone() },
                deadline: self.config.call_deadline,
            });
        }
        if self.pull_timer.is_none() {
            let timer = self.ids.timer();
            self.pull_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.retry_after });
        }
    }

    /// A peer's vote, counted once checked (signature, signer, block).
    fn hear(&mut self, peer: &str, block: u64, vote: SignedVote) -> Result<(), Refusal> {
        if vote.organization != peer {
            return Err(Refusal::VoteInAnotherName { peer: peer.to_string(), organization: vote.organization });
        }
        let around =
            self.deciding.as_ref().map(|deciding| deciding.block).or(self.own.keys().next_back().copied()).unwrap_or(0);
        if block + KEPT_BLOCKS < around || block > around + KEPT_BLOCKS {
            return Err(Refusal::VoteTooFar { peer: peer.to_string(), block, around });
        }
        vote.check(&self.config.organizations, block)?;
        self.heard.entry(block).or_default().entry(vote.organization).or_insert(vote.ledger_block_hash);
        Ok(())
    }

    fn commits_without_quorum(&self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self.weakness == Some(CommitWeakness::CommitWithoutQuorum);
        #[cfg(not(any(test, feature = "sim")))]
        return self.weakness.is_some();
    }

    fn evaluate(&mut self, out: &mut Vec<PipelineCommand>) {
        let Some(deciding) = self.deciding.as_ref().filter(|deciding| deciding.logged) else {
            return;
        };
        let heard = self.heard.get(&deciding.block);
        let votes = heard.into_iter().flatten().map(|(name, hash)| (name.as_str(), *hash));
        let decision = match deciding.own {
            Some(_) if self.commits_without_quorum() => Some(Decision::Commit),
            Some(own) => match self.config.policy.decide(&self.org, own, votes) {
                VoteOutcome::Commit { .. } => Some(Decision::Commit),
                VoteOutcome::Recover { consensus, .. } => Some(Decision::Recover { consensus }),
                VoteOutcome::Undecided { .. } => None,
            },
            None => {
                let mut counts: BTreeMap<Hash, usize> = BTreeMap::new();
                for (_, hash) in votes {
                    *counts.entry(hash).or_default() += 1;
                }
                counts
                    .into_iter()
                    .find(|(_, count)| *count >= self.config.policy.agree)
                    .map(|(consensus, _)| Decision::Recover { consensus })
            }
        };
        let Some(decision) = decision else {
            return;
        };
        let Some(deciding) = self.deciding.take() else {
            return;
        };
        match decision {
            Decision::Commit => self.stats.commits += 1,
            Decision::Recover { .. } => self.stats.recoveries += 1,
        }
        let floor = deciding.block.saturating_sub(KEPT_BLOCKS);
        self.heard = self.heard.split_off(&floor);
        self.own = self.own.split_off(&floor);
        self.owed = self.owed.split_off(&floor);
        out.push(Command::Reply {
            to: node_name(&self.org, "exec"),
            call: deciding.call,
            response: Response::Decided(decision),
        });
    }
}
