//! The configuration replica's core: the configuration state machine replicated by
//! virga-raft's [`Replica`] (raft-rs's raw node with its Ready protocol done once for every
//! Raft group of Virga), driven as a Virga role.
//!
//! Events in (a tick timer, peers' Raft batches, proposals, map reads, device completions),
//! commands out (Raft batches to peers, replies, the tick timer, log appends). After every
//! event the replica hands out an [`Output`]: committed entries, applied here in order;
//! messages, sent as one batch per peer; and at most one device append, whose completion goes
//! back to the replica before the messages that promise it (votes, acknowledgements) leave.

use std::collections::{BTreeMap, HashMap};

use crate::messages::{MapReply, Proposed, RefusalKind, Request, Response};
use crate::proto;
use crate::Dkv;
use raft::eraftpb::{Entry, EntryType};
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_raft::{Output, Replica, ReplicaSettings};

use super::image::{check_image, decode_image, encode_image, ConfigImage};
use super::ConfigLog;
use super::{ConfigIo, ConfigIoDone, ReplicaConfig, ServiceError, ServiceStats};
use crate::config::{Applied, ConfigRefusal, ConfigState};
use crate::raft_wire;
use crate::wire::{self, Proposal};

/// What a proposal came to, kept per client so that a retried proposal is answered without
/// applying twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub index: u64,
    pub version: u64,
    /// Empty when applied; the configuration's refusal otherwise.
    pub refusal: String,
}

/// One replica of the configuration service.
pub struct ConfigCore {
    config: ReplicaConfig,
    replica: Replica,
    state: ConfigState,
    /// Per client: its highest applied sequence number and what it came to.
    sessions: BTreeMap<String, (u64, Outcome)>,
    ids: Ids,
    tick_timer: Option<TimerId>,
    /// The device append the replica waits for.
    writing: Option<IoId>,
    /// Proposals this leader made, by (client, seq): who waits for the outcome.
    waiting: HashMap<(String, u64), Vec<(String, CallId)>>,
    /// Raft batches in flight: to which Raft id.
    calls: HashMap<CallId, u64>,
    /// Hash chain over the applied entries (index, data): replicas at one applied index
    /// agree on it, or their states diverged.
    chain: u64,
    /// (index, chain) after each applied entry, when the configuration keeps a history.
    history: Vec<(u64, u64)>,
    stats: ServiceStats,
    /// Device appends issued and not yet completed.
    writes_in_flight: usize,
    /// A device write failed: the replica stops (it must not acknowledge what is not durable).
    failed: Option<String>,
    /// Terms of leadership already logged.
    terms_logged: usize,
}

impl ConfigCore {
    /// A replica over its recovered log (see [`super::open_replica`]): its state starts as
    /// the log's snapshot, if it was compacted, and the entries after it apply again.
    pub fn new(config: ReplicaConfig, log: ConfigLog) -> Result<ConfigCore, ServiceError> {
        let image = match log.snapshot_state() {
            Some((_, image)) => Some(decode_image(image)?),
            None => None,
        };
        let settings = ReplicaSettings {
            max_message_bytes: 256 << 10,
            snapshot_check: Some(check_image),
            #[cfg(any(test, feature = "sim"))]
            unsafe_ack_before_write: config.unsafe_ack_before_write,
            ..ReplicaSettings::new(config.id, config.election_ticks, config.heartbeat_ticks, config.seed)
        };
        let replica = Replica::new(&settings, log)?;
        let mut core = ConfigCore {
            config,
            replica,
            state: ConfigState::new(),
            sessions: BTreeMap::new(),
            ids: Ids::default(),
            tick_timer: None,
            writing: None,
            waiting: HashMap::new(),
            calls: HashMap::new(),
            chain: 0,
            history: Vec::new(),
            stats: ServiceStats::default(),
            writes_in_flight: 0,
            failed: None,
            terms_logged: 0,
        };
        if let Some(image) = image {
            core.restore(image);
        }
        Ok(core)
    }

    /// The state machine becomes a snapshot's image.
    fn restore(&mut self, image: ConfigImage) {
        self.state = image.state;
        self.sessions = image.sessions;
        self.chain = image.chain;
    }

    /// The log's first index (after its snapshot) and the entries it holds in memory.
    pub fn log_extent(&self) -> (u64, usize) {
        self.replica.log_extent()
    }

    /// Compacts the log behind a snapshot of the configuration once `compact_every`
    /// applied entries follow the last one.
    fn compact_if_due(&mut self) {
        let applied = self.state.applied_index();
        let (first, _) = self.replica.log_extent();
        if applied < first || applied - (first - 1) < self.config.compact_every {
            return;
        }
        let image = ConfigImage { state: self.state.clone(), sessions: self.sessions.clone(), chain: self.chain };
        match self.replica.compact(applied, encode_image(&image)) {
            Ok(()) => self.stats.compactions += 1,
            Err(error) => tracing::warn!(replica = self.config.id, %error, "the log was not compacted"),
        }
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    pub fn state(&self) -> &ConfigState {
        &self.state
    }

    pub fn is_leader(&self) -> bool {
        self.replica.is_leader()
    }

    pub fn term(&self) -> u64 {
        self.replica.term()
    }

    /// The Raft id of the leader this replica knows (0 = none).
    pub fn leader(&self) -> u64 {
        self.replica.leader()
    }

    pub fn last_index(&self) -> u64 {
        self.replica.last_index()
    }

    pub fn commit_index(&self) -> u64 {
        self.replica.commit_index()
    }

    /// The applied index and the hash chain over the entries applied up to it.
    pub fn applied(&self) -> (u64, u64) {
        (self.state.applied_index(), self.chain)
    }

    pub fn history(&self) -> &[(u64, u64)] {
        &self.history
    }

    pub fn led_terms(&self) -> &[u64] {
        self.replica.led_terms()
    }

    pub fn stats(&self) -> &ServiceStats {
        &self.stats
    }

    /// Device appends issued and not yet completed (a crash now may lose them).
    pub fn writes_in_flight(&self) -> usize {
        self.writes_in_flight
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn arm_tick(&mut self, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        let timer = self.ids.timer();
        self.tick_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.tick });
    }

    fn peer_name(&self, id: u64) -> Option<&str> {
        self.config.peers.iter().find(|(peer, _)| *peer == id).map(|(_, name)| name.as_str())
    }

    fn peer_id(&self, name: &str) -> Option<u64> {
        self.config.peers.iter().find(|(_, peer)| peer == name).map(|(id, _)| *id)
    }

    fn on_request(&mut self, from: String, call: CallId, request: Request, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        let response = match request {
            Request::Raft(batch) => self.on_raft_batch(&from, batch),
            Request::Propose(proposal) => match self.on_propose(&from, call, proposal) {
                Some(response) => response,
                None => return,
            },
            Request::GetMap => {
                Response::Map(MapReply { map: self.state.map().cloned(), applied: self.state.applied_index() })
            }
            _ => Response::refused(RefusalKind::WrongRole, "a configuration replica serves no shard requests"),
        };
        out.push(Command::Reply { to: from, call, response });
    }

    fn on_raft_batch(&mut self, from: &str, batch: proto::RaftBatch) -> Response {
        let Some(sender) = self.peer_id(from) else {
            self.stats.refused_messages += batch.messages.len() as u64;
            return Response::refused(
                RefusalKind::Invalid,
                format!("{from} is not a replica of the configuration service"),
            );
        };
        let refused_by_raft = self.replica.refused_by_raft();
        for error in self.replica.step_batch(sender, batch.messages, &raft_wire::check_proposal) {
            self.stats.refuse(&error);
        }
        self.stats.refused_messages += self.replica.refused_by_raft() - refused_by_raft;
        Response::Ack
    }

    /// Proposes a configuration change if this replica leads; the reply waits for the
    /// outcome (None) unless the proposal is refused or already applied.
    fn on_propose(&mut self, from: &str, call: CallId, proposal: Proposal) -> Option<Response> {
        if !self.is_leader() {
            let leader = self.peer_name(self.replica.leader()).map(str::to_string);
            return Some(Response::NotLeader(leader));
        }
        if let Some((seq, outcome)) = self.sessions.get(&proposal.client) {
            if proposal.seq == *seq {
                return Some(proposed(outcome));
            }
            if proposal.seq < *seq {
                return Some(Response::refused(
                    RefusalKind::Invalid,
                    format!(
                        "sequence number {} of client {} is older than its last applied one ({seq})",
                        proposal.seq, proposal.client
                    ),
                ));
            }
        }
        let key = (proposal.client.clone(), proposal.seq);
        if let Some(waiters) = self.waiting.get_mut(&key) {
            waiters.push((from.to_string(), call));
            return None;
        }
        match self.replica.propose(wire::encode_proposal(&proposal)) {
            Ok(()) => {
                self.stats.proposals += 1;
                self.waiting.insert(key, vec![(from.to_string(), call)]);
                None
            }
            Err(error) => {
                Some(Response::refused(RefusalKind::Unavailable, format!("the proposal was dropped ({error}); retry")))
            }
        }
    }

    fn on_response(&mut self, call: CallId, result: Result<Response, NetError>) {
        if let Some(to) = self.calls.remove(&call) {
            if result.is_err() {
                self.replica.unreachable(to);
            }
        }
    }

    /// A device append finished; returns whether the replica was waiting for it.
    fn on_written(&mut self, io: IoId, result: ConfigIoDone) -> bool {
        self.writes_in_flight = self.writes_in_flight.saturating_sub(1);
        if self.writing != Some(io) {
            return false;
        }
        self.writing = None;
        match result {
            ConfigIoDone::Appended(Ok(_)) => {
                self.stats.writes += 1;
                true
            }
            ConfigIoDone::Appended(Err(error)) => {
                tracing::error!(replica = self.config.id, %error, "a log append failed: the replica stops");
                self.failed = Some(format!("a log append failed: {error}"));
                false
            }
        }
    }

    /// Carries out what the replica handed out: applies the committed entries, sends the
    /// messages (one batch per peer) and starts the device append.
    fn carry_out(&mut self, output: Output, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        if let Some((index, image)) = output.restored {
            // The wire checks decoded it before raft-rs took it.
            match decode_image(&image) {
                Ok(image) => {
                    self.restore(image);
                    self.stats.snapshots_installed += 1;
                    tracing::info!(replica = self.config.id, index, "installed the leader's snapshot");
                }
                Err(error) => {
                    self.failed = Some(format!("the leader's snapshot at {index} does not decode: {error}"));
                    return;
                }
            }
        }
        for entry in output.committed {
            self.apply(entry, out);
        }
        self.send(output.messages, out);
        if let Some(records) = output.write {
            let io = self.ids.io();
            self.writes_in_flight += 1;
            #[cfg(any(test, feature = "sim"))]
            let waits = !self.config.unsafe_ack_before_write;
            #[cfg(not(any(test, feature = "sim")))]
            let waits = true;
            if waits {
                self.writing = Some(io);
            }
            let (sync, truncate_before) = (self.config.sync, output.truncate_before);
            out.push(Command::Io { io, op: ConfigIo::Append { records, sync, truncate_before } });
        }
        if self.replica.led_terms().len() > self.terms_logged {
            self.terms_logged = self.replica.led_terms().len();
            tracing::info!(replica = self.config.id, term = self.term(), "leads the configuration service");
        }
        if !self.is_leader() && !self.waiting.is_empty() {
            self.fail_waiting(out);
        }
    }

    /// Sends raft-rs's messages, one batch per receiver.
    fn send(&mut self, batches: BTreeMap<u64, Vec<proto::RaftMessage>>, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        for (to, messages) in batches {
            let Some(name) = self.peer_name(to).map(str::to_string) else { continue };
            let call = self.ids.call();
            self.calls.insert(call, to);
            self.stats.messages_sent += messages.len() as u64;
            out.push(Command::Call {
                to: name,
                call,
                request: Request::Raft(proto::RaftBatch { messages }),
                deadline: self.config.message_deadline,
            });
        }
    }

    /// Applies one committed entry to the configuration state.
    fn apply(&mut self, entry: Entry, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        let index = entry.index;
        self.chain = chain(self.chain, index, &entry.data);
        if self.config.keep_history {
            self.history.push((index, self.chain));
        }
        if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            self.state.skip_to(index);
            return;
        }
        let proposal = match wire::decode_proposal(&entry.data) {
            Ok(proposal) => proposal,
            Err(_) => {
                self.stats.undecodable_entries += 1;
                self.state.skip_to(index);
                return;
            }
        };
        if self.sessions.get(&proposal.client).is_some_and(|(seq, _)| *seq >= proposal.seq) {
            self.stats.duplicate_entries += 1;
            self.state.skip_to(index);
            return;
        }
        let outcome = outcome(index, self.state.apply(index, &proposal.command), &self.state);
        self.stats.applied += 1;
        self.answer(&proposal, &outcome, out);
        self.sessions.insert(proposal.client, (proposal.seq, outcome));
    }

    fn answer(&mut self, proposal: &Proposal, outcome: &Outcome, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        let Some(waiters) = self.waiting.remove(&(proposal.client.clone(), proposal.seq)) else { return };
        for (to, call) in waiters {
            out.push(Command::Reply { to, call, response: proposed(outcome) });
        }
    }

    /// Leadership was lost: the outcome of what this replica proposed is unknown here.
    fn fail_waiting(&mut self, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        for (_, waiters) in std::mem::take(&mut self.waiting) {
            for (to, call) in waiters {
                let response = Response::refused(
                    RefusalKind::Unavailable,
                    "leadership changed before the proposal applied; retry",
                );
                out.push(Command::Reply { to, call, response });
            }
        }
    }
}

fn proposed(outcome: &Outcome) -> Response {
    Response::Proposed(Proposed {
        index: outcome.index,
        version: outcome.version,
        refusal: (!outcome.refusal.is_empty()).then(|| outcome.refusal.clone()),
    })
}

fn outcome(index: u64, result: Result<Applied, ConfigRefusal>, state: &ConfigState) -> Outcome {
    let version = state.map().map_or(0, |map| map.version());
    let refusal = match result {
        Ok(_) => String::new(),
        Err(refusal) => refusal.to_string(),
    };
    Outcome { index, version, refusal }
}

/// FNV-1a over the previous link, the index and the data: cheap, deterministic, and enough to
/// tell two replicas' applied sequences apart.
fn chain(previous: u64, index: u64, data: &[u8]) -> u64 {
    let mut hash = previous ^ 0xcbf2_9ce4_8422_2325;
    for byte in index.to_le_bytes().iter().chain(data) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

impl Role for ConfigCore {
    type Protocol = Dkv;
    type Io = ConfigIo;
    type IoDone = ConfigIoDone;
    type Input = ();

    fn step(&mut self, _now: Nanos, event: Event<Dkv, ConfigIoDone, ()>, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        if self.failed.is_some() {
            return;
        }
        let mut output = Output::default();
        match event {
            Event::Start => self.arm_tick(out),
            Event::Timer(timer) if Some(timer) == self.tick_timer => {
                self.replica.tick();
                self.arm_tick(out);
            }
            Event::Timer(_) | Event::Input(()) => {}
            Event::Request { from, call, request } => self.on_request(from, call, request, out),
            Event::Response { call, result } => self.on_response(call, result),
            Event::IoDone { io, result } => {
                if self.on_written(io, result) {
                    self.replica.written(&mut output);
                }
            }
        }
        if self.failed.is_some() {
            return;
        }
        self.compact_if_due();
        self.replica.drain(&mut output);
        self.carry_out(output, out);
    }
}
