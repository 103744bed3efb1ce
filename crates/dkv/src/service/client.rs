//! A client of the configuration service: proposes commands one at a time, follows the
//! leader, and retries with the same sequence number until it learns the outcome, so each
//! command applies exactly once whatever is lost or duplicated on the way.

use std::collections::VecDeque;
use std::time::Duration;

use crate::messages::{RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Event, Ids, Nanos, Role, TimerId};
use virga_net::NetError;

use crate::config::ConfigCommand;
use crate::wire::Proposal;

/// A client's settings.
#[derive(Debug, Clone)]
pub struct ConfigClientConfig {
    /// The client's id: its session at the service (1 to 64 bytes, unique per client).
    pub id: String,
    /// The service's replicas, by peer name.
    pub replicas: Vec<String>,
    /// Deadline of one proposal.
    pub deadline: Duration,
    /// Wait before retrying when no leader is known.
    pub retry_after: Duration,
}

impl ConfigClientConfig {
    pub fn new(id: impl Into<String>, replicas: Vec<String>) -> ConfigClientConfig {
        ConfigClientConfig {
            id: id.into(),
            replicas,
            deadline: Duration::from_secs(1),
            retry_after: Duration::from_millis(50),
        }
    }
}

/// The outcome of one command, as the service reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOutcome {
    pub seq: u64,
    pub command: ConfigCommand,
    /// The log index it applied at.
    pub index: u64,
    pub version: u64,
    /// Empty when applied; the configuration's refusal otherwise.
    pub refusal: String,
}

/// The command being proposed.
struct InFlight {
    seq: u64,
    command: ConfigCommand,
    call: Option<CallId>,
    attempts: u32,
}

pub struct ConfigClient {
    config: ConfigClientConfig,
    /// Index into `replicas` of the replica believed to lead.
    target: usize,
    next_seq: u64,
    pending: VecDeque<ConfigCommand>,
    in_flight: Option<InFlight>,
    retry_timer: Option<TimerId>,
    ids: Ids,
    outcomes: Vec<ClientOutcome>,
}

impl ConfigClient {
    pub fn new(config: ConfigClientConfig) -> ConfigClient {
        ConfigClient {
            config,
            target: 0,
            next_seq: 1,
            pending: VecDeque::new(),
            in_flight: None,
            retry_timer: None,
            ids: Ids::default(),
            outcomes: Vec::new(),
        }
    }

    /// The outcomes so far, in the order the commands were given.
    pub fn outcomes(&self) -> &[ClientOutcome] {
        &self.outcomes
    }

    /// Commands given and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.pending.len() + usize::from(self.in_flight.is_some())
    }

    fn next(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        if self.in_flight.is_none() {
            if let Some(command) = self.pending.pop_front() {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.in_flight = Some(InFlight { seq, command, call: None, attempts: 0 });
            }
        }
        self.send(out);
    }

    fn send(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let Some(in_flight) = &mut self.in_flight else { return };
        if in_flight.call.is_some() || self.config.replicas.is_empty() {
            return;
        }
        let call = self.ids.call();
        in_flight.call = Some(call);
        in_flight.attempts += 1;
        let proposal =
            Proposal { client: self.config.id.clone(), seq: in_flight.seq, command: in_flight.command.clone() };
        out.push(Command::Call {
            to: self.config.replicas[self.target].clone(),
            call,
            request: Request::Propose(proposal),
            deadline: self.config.deadline,
        });
    }

    fn on_response(
        &mut self,
        call: CallId,
        result: Result<Response, NetError>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let Some(in_flight) = &mut self.in_flight else { return };
        if in_flight.call != Some(call) {
            return;
        }
        in_flight.call = None;
        match result {
            Ok(Response::Proposed(proposed)) => {
                let Some(done) = self.in_flight.take() else { return };
                self.outcomes.push(ClientOutcome {
                    seq: done.seq,
                    command: done.command,
                    index: proposed.index,
                    version: proposed.version,
                    refusal: proposed.refusal.unwrap_or_default(),
                });
                self.next(out);
            }
            Ok(Response::NotLeader(hint)) => {
                match hint.and_then(|leader| self.config.replicas.iter().position(|replica| *replica == leader)) {
                    Some(leader) if leader != self.target => {
                        self.target = leader;
                        self.send(out);
                    }
                    _ => self.retry_later(out),
                }
            }
            // Unreachable, refused, an unexpected answer or no answer in time: try the next
            // replica after a pause.
            _ => self.retry_later(out),
        }
    }

    fn retry_later(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        self.target = (self.target + 1) % self.config.replicas.len().max(1);
        let timer = self.ids.timer();
        self.retry_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.retry_after });
    }
}

impl Role for ConfigClient {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = Vec<ConfigCommand>;

    fn step(
        &mut self,
        _now: Nanos,
        event: Event<Dkv, std::convert::Infallible, Vec<ConfigCommand>>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        match event {
            Event::Input(commands) => {
                self.pending.extend(commands);
                self.next(out);
            }
            Event::Response { call, result } => self.on_response(call, result, out),
            Event::Timer(timer) if Some(timer) == self.retry_timer => {
                self.retry_timer = None;
                self.send(out);
            }
            Event::Request { from, call, .. } => {
                let response = Response::refused(RefusalKind::WrongRole, "a configuration client serves no requests");
                out.push(Command::Reply { to: from, call, response });
            }
            Event::Start | Event::Timer(_) | Event::IoDone { .. } => {}
        }
    }
}
