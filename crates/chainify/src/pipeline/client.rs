//! A client: signs SmallBank transactions as proposals and keeps a window of them in flight
//! at its organization's ChainifyServer, each answered when its block is decided there.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::Proposal;
use virga_net::role::{CallId, Command, Event, Ids, Nanos};

use super::{node_name, Outcome, PipelineCommand, PipelineEvent, Request, Response};
use crate::smallbank::{random_block_skewed, Skew};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub name: String,
    pub organization: String,
    /// Proposals in flight at once.
    pub window: usize,
    /// How many proposals the client sends in all.
    pub transactions: u64,
    pub customers: u64,
    pub skew: Skew,
    pub seed: u64,
    /// How long the client waits for its transaction's outcome.
    pub deadline: Duration,
    /// The sequence number of its first proposal (a client that runs again under the same
    /// name starts above its last run's, or its proposals would be refused as replays).
    pub first_seq: u64,
}

/// What a client saw.
#[derive(Debug, Clone, Default)]
pub struct ClientStats {
    pub sent: u64,
    pub outcomes: Vec<Outcome>,
    /// Proposals refused (with the reason) or unanswered within the deadline.
    pub refused: Vec<String>,
    pub timed_out: u64,
    /// Nanoseconds from sending to the outcome, per answered proposal.
    pub latencies: Vec<u64>,
}

pub struct ClientCore {
    config: ClientConfig,
    key: SigningKey,
    rng: StdRng,
    ids: Ids,
    next_seq: u64,
    in_flight: BTreeMap<CallId, (u64, Nanos)>,
    stats: ClientStats,
}

impl ClientCore {
    pub fn new(config: ClientConfig, key: SigningKey) -> ClientCore {
        let rng = StdRng::seed_from_u64(config.seed);
        ClientCore {
            next_seq: config.first_seq.max(1),
            config,
            key,
            rng,
            ids: Ids::default(),
            in_flight: BTreeMap::new(),
            stats: ClientStats::default(),
        }
    }

    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// Whether every proposal has been sent and answered (or given up on).
    pub fn is_done(&self) -> bool {
        self.stats.sent >= self.config.transactions && self.in_flight.is_empty()
    }

    pub fn step(&mut self, now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        match event {
            Event::Start | Event::Input(()) => {}
            Event::Response { call, result } => {
                let Some((seq, sent)) = self.in_flight.remove(&call) else {
                    return;
                };
                match result {
                    Ok(Response::Done(outcome)) if outcome.seq == seq && outcome.client == self.config.name => {
                        self.stats.latencies.push(now.saturating_sub(sent));
                        self.stats.outcomes.push(outcome);
                    }
                    Ok(other) => self.stats.refused.push(format!("proposal {seq}: unexpected answer {other:?}")),
                    Err(virga_net::NetError::DeadlineExceeded { .. }) => self.stats.timed_out += 1,
                    Err(error) => self.stats.refused.push(format!("proposal {seq}: {error}")),
                }
            }
            Event::Request { from, call, .. } => out.push(Command::Reply {
                to: from,
                call,
                response: Response::Refused("a client serves no requests".to_string()),
            }),
            Event::Timer(_) | Event::IoDone { .. } => {}
        }
        self.fill(now, out);
    }

    fn fill(&mut self, now: Nanos, out: &mut Vec<PipelineCommand>) {
        while self.in_flight.len() < self.config.window && self.stats.sent < self.config.transactions {
            let transaction = random_block_skewed(&mut self.rng, self.config.customers, 1, self.config.skew)
                .pop()
                .map(|transaction| transaction.statements)
                .unwrap_or_default();
            let seq = self.next_seq;
            self.next_seq += 1;
            let proposal = Proposal::sign(&self.key, &self.config.name, seq, transaction);
            let call = self.ids.call();
            self.in_flight.insert(call, (seq, now));
            self.stats.sent += 1;
            out.push(Command::Call {
                to: node_name(&self.config.organization, "chainify"),
                call,
                request: Request::Propose(proposal),
                deadline: self.config.deadline,
            });
        }
    }
}
