//! An organization's ChainifyServer: authenticates its clients' proposals, gathers them
//! into batches, collects the other organizations' agreements on each batch, hands agreed
//! batches to the orderer, and answers each client once its transaction's block is decided
//! at this organization.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Refusal;
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{Agreement, ChainedTx, Hash, Proposal, ProposalBatch};
use virga_net::role::{CallId, Command, Event, Ids, Nanos, TimerId};
use virga_net::NetError;

use super::seq_window::SeqWindow;
use super::{
    node_name, organization_of, OrdererTarget, PipelineCommand, PipelineConfig, PipelineEvent, Request, Response,
};

/// How many agreed batches a server remembers; a retry of an older one is checked afresh
/// (and refused as a replay, its proposals being seen).
const KEPT_AGREED_BATCHES: usize = 65_536;

/// What a ChainifyServer counted.
#[derive(Debug, Clone, Default)]
pub struct ChainifyStats {
    pub proposals: u64,
    /// Proposals and peers' batches refused, with the reason.
    pub refused: Vec<String>,
    pub batches: u64,
    pub ordered_batches: u64,
    /// Batches other organizations asked this one to agree to, and those it signed.
    pub agreed_for_peers: u64,
}

/// A batch waiting for agreements or for the orderer's acknowledgement.
struct Pending {
    batch: ProposalBatch,
    agreements: Vec<Agreement>,
    /// Peers that refused the batch: they will not agree on a retry.
    refused_by: BTreeSet<String>,
    ordering: bool,
}

enum CallFor {
    Agree { batch: Hash, peer: String },
    Order { batch: Hash },
}

enum TimerFor {
    CutBatch,
    Retry(CallFor),
}

pub struct ChainifyServer {
    org: String,
    key: SigningKey,
    config: Arc<PipelineConfig>,
    ids: Ids,
    /// Sequence numbers accepted from this organization's clients, and agreed for other
    /// organizations' clients.
    accepted: SeqWindow,
    agreed: SeqWindow,
    /// Batches this server agreed to, so that a retried request gets the same answer (the
    /// newest ones, oldest first in `agreed_order`).
    agreed_batches: BTreeSet<Hash>,
    agreed_order: std::collections::VecDeque<Hash>,
    forming: Vec<Proposal>,
    cut_timer: Option<TimerId>,
    next_batch: u64,
    pending: BTreeMap<Hash, Pending>,
    /// The clients' calls waiting for their outcome, by (client, seq).
    waiting: BTreeMap<(String, u64), (String, CallId)>,
    calls: BTreeMap<CallId, CallFor>,
    timers: BTreeMap<TimerId, TimerFor>,
    orderer: OrdererTarget,
    stats: ChainifyStats,
}

impl ChainifyServer {
    pub fn new(org: &str, key: SigningKey, config: Arc<PipelineConfig>) -> ChainifyServer {
        ChainifyServer {
            org: org.to_string(),
            key,
            config,
            ids: Ids::default(),
            accepted: SeqWindow::default(),
            agreed: SeqWindow::default(),
            agreed_batches: BTreeSet::new(),
            agreed_order: std::collections::VecDeque::new(),
            forming: Vec::new(),
            cut_timer: None,
            next_batch: 0,
            pending: BTreeMap::new(),
            waiting: BTreeMap::new(),
            calls: BTreeMap::new(),
            timers: BTreeMap::new(),
            orderer: OrdererTarget::default(),
            stats: ChainifyStats::default(),
        }
    }

    pub fn stats(&self) -> &ChainifyStats {
        &self.stats
    }

    pub fn step(&mut self, _now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        match event {
            Event::Start | Event::Input(()) | Event::IoDone { .. } => {}
            Event::Request { from, call, request } => {
                let response = match request {
                    Request::Propose(proposal) => match self.propose(&from, call, proposal, out) {
                        Ok(()) => return,
                        Err(reason) => reason.to_string(),
                    },
                    Request::Agree(batch) => match self.agree(&from, batch) {
                        Ok(agreement) => {
                            out.push(Command::Reply { to: from, call, response: Response::Agreed(agreement) });
                            return;
                        }
                        Err(reason) => reason.to_string(),
                    },
                    Request::Committed(outcomes) if from == node_name(&self.org, "exec") => {
                        for outcome in outcomes {
                            if let Some((client, client_call)) =
                                self.waiting.remove(&(outcome.client.clone(), outcome.seq))
                            {
                                out.push(Command::Reply {
                                    to: client,
                                    call: client_call,
                                    response: Response::Done(outcome),
                                });
                            }
                        }
                        out.push(Command::Reply { to: from, call, response: Response::Ack });
                        return;
                    }
                    other => format!("a ChainifyServer does not serve {other:?} from {from}"),
                };
                self.stats.refused.push(response.clone());
                out.push(Command::Reply { to: from, call, response: Response::Refused(response) });
            }
            Event::Response { call, result } => {
                if let Some(purpose) = self.calls.remove(&call) {
                    self.answered(purpose, result, out);
                }
            }
            Event::Timer(timer) => match self.timers.remove(&timer) {
                Some(TimerFor::CutBatch) => {
                    self.cut_timer = None;
                    self.cut(out);
                }
                Some(TimerFor::Retry(purpose)) => self.resend(purpose, out),
                None => {}
            },
        }
    }

    /// A client's proposal: it must come from the client it names, one of this
    /// organization's, signed by it, with a sequence number not seen before.
    fn propose(
        &mut self,
        from: &str,
        call: CallId,
        proposal: Proposal,
        out: &mut Vec<PipelineCommand>,
    ) -> Result<(), Refusal> {
        if proposal.client != from || self.config.client_org(from) != Some(self.org.as_str()) {
            return Err(Refusal::ForeignProposal {
                from: from.to_string(),
                client: proposal.client,
                org: self.org.clone(),
            });
        }
        proposal.check(&self.config.clients)?;
        if !self.accepted.is_new(&proposal.client, proposal.seq) {
            return Err(Refusal::ReplayedProposal { client: proposal.client, seq: proposal.seq });
        }
        self.accepted.insert(&proposal.client, proposal.seq);
        self.stats.proposals += 1;
        self.waiting.insert((proposal.client.clone(), proposal.seq), (from.to_string(), call));
        self.forming.push(proposal);
        if self.forming.len() >= self.config.batch_size {
            self.cut(out);
        } else if self.cut_timer.is_none() {
            let timer = self.ids.timer();
            self.timers.insert(timer, TimerFor::CutBatch);
            self.cut_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.batch_wait });
        }
        Ok(())
    }

    fn cut(&mut self, out: &mut Vec<PipelineCommand>) {
        if self.forming.is_empty() {
            return;
        }
        let batch = ProposalBatch {
            origin: self.org.clone(),
            number: self.next_batch,
            proposals: std::mem::take(&mut self.forming),
        };
        self.next_batch += 1;
        self.stats.batches += 1;
        let hash = batch.hash();
        let own = Agreement::sign(&self.key, &self.org, hash);
        self.pending
            .insert(hash, Pending { batch, agreements: vec![own], refused_by: BTreeSet::new(), ordering: false });
        if self.config.agreements <= 1 {
            self.order(hash, out);
            return;
        }
        let peers: Vec<String> = self.config.peers_of(&self.org).map(str::to_string).collect();
        for peer in peers {
            self.send(CallFor::Agree { batch: hash, peer }, out);
        }
    }

    fn order(&mut self, hash: Hash, out: &mut Vec<PipelineCommand>) {
        if let Some(pending) = self.pending.get_mut(&hash) {
            if !pending.ordering {
                pending.ordering = true;
                self.send(CallFor::Order { batch: hash }, out);
            }
        }
    }

    /// Sends the call `purpose` names, if its batch still waits for it.
    fn send(&mut self, purpose: CallFor, out: &mut Vec<PipelineCommand>) {
        let (to, request) = match &purpose {
            CallFor::Agree { batch, peer } => {
                let Some(pending) = self.pending.get(batch).filter(|pending| !pending.ordering) else {
                    return;
                };
                (node_name(peer, "chainify"), Request::Agree(pending.batch.clone()))
            }
            CallFor::Order { batch } => {
                let Some(pending) = self.pending.get(batch) else {
                    return;
                };
                let chained = ChainedTx { batch: pending.batch.clone(), agreements: pending.agreements.clone() };
                (self.orderer.name(&self.config).to_string(), Request::Order(chained))
            }
        };
        let call = self.ids.call();
        self.calls.insert(call, purpose);
        out.push(Command::Call { to, call, request, deadline: self.config.call_deadline });
    }

    fn resend(&mut self, purpose: CallFor, out: &mut Vec<PipelineCommand>) {
        self.send(purpose, out);
    }

    fn retry_later(&mut self, purpose: CallFor, out: &mut Vec<PipelineCommand>) {
        let timer = self.ids.timer();
        self.timers.insert(timer, TimerFor::Retry(purpose));
        out.push(Command::SetTimer { timer, after: self.config.retry_after });
    }

    fn answered(&mut self, purpose: CallFor, result: Result<Response, NetError>, out: &mut Vec<PipelineCommand>) {
        match (purpose, result) {
            (CallFor::Agree { batch, peer }, Ok(Response::Agreed(agreement))) => {
                let Some(pending) = self.pending.get_mut(&batch) else {
                    return;
                };
                if agreement.organization != peer || agreement.check(&self.config.organizations, &batch).is_err() {
                    self.stats.refused.push(format!("{peer} answered batch with a bad agreement"));
                    return;
                }
                if !pending.agreements.iter().any(|held| held.organization == peer) {
                    pending.agreements.push(agreement);
                }
                if pending.agreements.len() >= self.config.agreements {
                    self.order(batch, out);
                }
            }
            (CallFor::Agree { batch, peer }, Err(NetError::Refused { reason, .. })) => {
                self.stats.refused.push(format!("{peer} refused to agree: {reason}"));
                let Some(pending) = self.pending.get_mut(&batch) else {
                    return;
                };
                pending.refused_by.insert(peer);
                let could_agree = self.config.organizations.len() - pending.refused_by.len();
                if could_agree < self.config.agreements {
                    self.abandon(batch, &format!("the other organizations refused the batch: {reason}"), out);
                }
            }
            (CallFor::Order { batch }, Ok(Response::Ordered)) => {
                self.stats.ordered_batches += 1;
                // Its proposals now wait for their outcomes, answered through `waiting`.
                self.pending.remove(&batch);
            }
            (CallFor::Order { batch }, Ok(Response::NotLeader(leader))) => {
                self.orderer.redirect(&self.config, &leader);
                self.retry_later(CallFor::Order { batch }, out);
            }
            (CallFor::Order { batch }, Err(NetError::Refused { reason, .. })) => {
                self.abandon(batch, &format!("the orderer refused the batch: {reason}"), out);
            }
            (CallFor::Order { batch }, Err(_)) => {
                self.orderer.rotate(&self.config);
                self.retry_later(CallFor::Order { batch }, out);
            }
            (purpose, _) => self.retry_later(purpose, out),
        }
    }

    /// Gives up on a batch: its clients are told why.
    fn abandon(&mut self, batch: Hash, reason: &str, out: &mut Vec<PipelineCommand>) {
        let Some(pending) = self.pending.remove(&batch) else {
            return;
        };
        for proposal in pending.batch.proposals {
            if let Some((client, call)) = self.waiting.remove(&(proposal.client, proposal.seq)) {
                out.push(Command::Reply { to: client, call, response: Response::Refused(reason.to_string()) });
            }
        }
    }

    /// Another organization's batch: it must come from that organization's ChainifyServer,
    /// and every proposal must be from one of its clients, signed, and not a replay.
    fn agree(&mut self, from: &str, batch: ProposalBatch) -> Result<Agreement, Refusal> {
        let origin = organization_of(from).unwrap_or_default();
        if from != node_name(origin, "chainify") || batch.origin != origin || origin == self.org {
            return Err(Refusal::ForeignBatch { from: from.to_string(), origin: batch.origin });
        }
        let hash = batch.hash();
        if !self.agreed_batches.contains(&hash) {
            let mut in_batch = BTreeSet::new();
            for proposal in &batch.proposals {
                if !in_batch.insert((proposal.client.as_str(), proposal.seq)) {
                    return Err(Refusal::DuplicateInBatch { client: proposal.client.clone(), seq: proposal.seq });
                }
                if self.config.client_org(&proposal.client) != Some(origin) {
                    return Err(Refusal::StrangerInBatch {
                        client: proposal.client.clone(),
                        origin: origin.to_string(),
                    });
                }
                proposal.check(&self.config.clients)?;
                if !self.agreed.is_new(&proposal.client, proposal.seq) {
                    return Err(Refusal::ReplayedInBatch { client: proposal.client.clone(), seq: proposal.seq });
                }
            }
            for proposal in &batch.proposals {
                self.agreed.insert(&proposal.client, proposal.seq);
            }
            self.agreed_batches.insert(hash);
            self.agreed_order.push_back(hash);
            while self.agreed_order.len() > KEPT_AGREED_BATCHES {
                if let Some(oldest) = self.agreed_order.pop_front() {
                    self.agreed_batches.remove(&oldest);
                }
            }
            self.stats.agreed_for_peers += 1;
        }
        Ok(Agreement::sign(&self.key, &self.org, hash))
    }
}
