//! The configuration replica's core: raft-rs's `RawNode` driven as a Virga role.
//!
//! Events in (a tick timer, peers' Raft batches, proposals, map reads, device completions),
//! commands out (Raft batches to peers, replies, the tick timer, log appends). Persistence
//! follows raft-rs's asynchronous Ready protocol: each Ready's entries and hard state go into
//! the in-memory [`ConfigLog`] at once and into a queue; one device append at a time writes
//! every queued Ready (group commit) and only once it is durable does the core tell raft-rs
//! (`on_persist_ready`) and send the messages that promised it (votes, acknowledgements).
//! A leader's own appends go out before its write, as Raft allows: an entry counts toward the
//! commit only once the leader's own write is done too.
//!
//! Elections are deterministic: raft-rs draws its randomized election timeout from the
//! thread's RNG whenever its role or term changes; after every call into the `RawNode` the
//! core overwrites it with a draw from its own seeded RNG when (term, role) changed, and only
//! ticks ever read it.

use std::collections::{BTreeMap, HashMap};

use crate::proto::{self as proto, request::Body as RequestBody, response::Body as ResponseBody};
use crate::Dkv;
use raft::eraftpb::{Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role, TimerId};
use virga_net::NetError;

use super::ConfigLog;
use super::{ConfigIo, ConfigIoDone, ReplicaConfig, ServiceStats};
use crate::config::{Applied, ConfigRefusal, ConfigState};
use crate::raft_wire::{self, Receiver};
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

/// A Ready whose writes wait for the device.
struct Queued {
    number: u64,
    record: Option<Vec<u8>>,
    messages: Vec<Message>,
}

/// The device append in flight: the newest Ready it covers and the messages held for it.
struct Writing {
    io: IoId,
    number: u64,
    messages: Vec<Message>,
}

/// One replica of the configuration service.
pub struct ConfigCore {
    config: ReplicaConfig,
    raw: RawNode<ConfigLog>,
    state: ConfigState,
    /// Per client: its highest applied sequence number and what it came to.
    sessions: BTreeMap<String, (u64, Outcome)>,
    rng: StdRng,
    /// (term, role) after the last call into the RawNode.
    seen: (u64, StateRole),
    ids: Ids,
    tick_timer: Option<TimerId>,
    queued: Vec<Queued>,
    writing: Option<Writing>,
    /// Proposals this leader made, by (client, seq): who waits for the outcome.
    waiting: HashMap<(String, u64), Vec<(String, CallId)>>,
    /// Raft batches in flight: to which Raft id.
    calls: HashMap<CallId, u64>,
    /// Hash chain over the applied entries (index, data): replicas at one applied index
    /// agree on it, or their states diverged.
    chain: u64,
    /// (index, chain) after each applied entry, when the configuration keeps a history.
    history: Vec<(u64, u64)>,
    /// Terms in which this replica became leader.
    led_terms: Vec<u64>,
    stats: ServiceStats,
    /// Device appends issued and not yet completed.
    writes_in_flight: usize,
    /// A device write failed: the replica stops (it must not acknowledge what is not durable).
    failed: Option<String>,
}

impl ConfigCore {
    /// A replica over its recovered log (see [`super::open_replica`]).
    pub fn new(config: ReplicaConfig, log: ConfigLog) -> Result<ConfigCore, raft::Error> {
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            // The state machine is rebuilt by applying every committed entry again.
            applied: 0,
            max_size_per_msg: 256 << 10,
            max_inflight_msgs: 64,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, log, &logger)?;
        let seen = (raw.raft.term, raw.raft.state);
        let mut core = ConfigCore {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            raw,
            state: ConfigState::new(),
            sessions: BTreeMap::new(),
            seen,
            ids: Ids::default(),
            tick_timer: None,
            queued: Vec::new(),
            writing: None,
            waiting: HashMap::new(),
            calls: HashMap::new(),
            chain: 0,
            history: Vec::new(),
            led_terms: Vec::new(),
            stats: ServiceStats::default(),
            writes_in_flight: 0,
            failed: None,
        };
        core.draw_election_timeout();
        Ok(core)
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
        self.raw.raft.state == StateRole::Leader
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The Raft id of the leader this replica knows (0 = none).
    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The applied index and the hash chain over the entries applied up to it.
    pub fn applied(&self) -> (u64, u64) {
        (self.state.applied_index(), self.chain)
    }

    pub fn history(&self) -> &[(u64, u64)] {
        &self.history
    }

    pub fn led_terms(&self) -> &[u64] {
        &self.led_terms
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

    /// Calls into the RawNode, then redraws the election timeout if (term, role) changed.
    fn raft<T>(&mut self, call: impl FnOnce(&mut RawNode<ConfigLog>) -> T) -> T {
        let result = call(&mut self.raw);
        let now = (self.raw.raft.term, self.raw.raft.state);
        if now != self.seen {
            if now.1 == StateRole::Leader {
                self.led_terms.push(now.0);
                tracing::info!(replica = self.raw.raft.id, term = now.0, "leads the configuration service");
            }
            self.seen = now;
            self.draw_election_timeout();
        }
        result
    }

    fn draw_election_timeout(&mut self) {
        let low = self.config.election_ticks;
        let timeout = self.rng.random_range(low..2 * low);
        self.raw.raft.set_randomized_election_timeout(timeout);
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

    fn on_request(
        &mut self,
        from: String,
        call: CallId,
        request: proto::Request,
        out: &mut Vec<Command<Dkv, ConfigIo>>,
    ) {
        let response = match request.body {
            Some(RequestBody::Raft(batch)) => self.on_raft_batch(&from, batch),
            Some(RequestBody::Propose(proposal)) => match self.on_propose(&from, call, proposal) {
                Some(response) => response,
                None => return,
            },
            Some(RequestBody::GetMap(_)) => ResponseBody::Map(proto::MapReply {
                map: self.state.map().map(wire::map_to_proto),
                applied: self.state.applied_index(),
            }),
            None => ResponseBody::Error("an empty dkv request".to_string()),
            Some(_) => ResponseBody::Error("a configuration replica serves no shard requests".to_string()),
        };
        out.push(Command::Reply { to: from, call, response: proto::Response { body: Some(response) } });
    }

    fn on_raft_batch(&mut self, from: &str, batch: proto::RaftBatch) -> ResponseBody {
        let Some(sender) = self.peer_id(from) else {
            self.stats.refused_messages += batch.messages.len() as u64;
            return ResponseBody::Error(format!("{from} is not a replica of the configuration service"));
        };
        for message in batch.messages {
            let at = Receiver {
                me: self.config.id,
                sender,
                term: self.raw.raft.term,
                is_leader: self.is_leader(),
                leader: self.raw.raft.leader_id,
                last_index: self.raw.raft.raft_log.last_index(),
            };
            match raft_wire::message_from_wire(message, &at) {
                Ok(message) => {
                    if self.raft(|raw| raw.step(message)).is_err() {
                        self.stats.refused_messages += 1;
                    }
                }
                Err(error) => self.stats.refuse(&error),
            }
        }
        ResponseBody::Ack(proto::Ack {})
    }

    /// Proposes a configuration change if this replica leads; the reply waits for the
    /// outcome (None) unless the proposal is refused or already applied.
    fn on_propose(&mut self, from: &str, call: CallId, proposal: proto::ConfigProposal) -> Option<ResponseBody> {
        let proposal = match wire::proposal_from_proto(proposal) {
            Ok(proposal) => proposal,
            Err(error) => return Some(ResponseBody::Error(format!("a malformed proposal: {error}"))),
        };
        if !self.is_leader() {
            let leader = self.peer_name(self.raw.raft.leader_id).unwrap_or_default().to_string();
            return Some(ResponseBody::NotLeader(proto::NotLeader { leader }));
        }
        if let Some((seq, outcome)) = self.sessions.get(&proposal.client) {
            if proposal.seq == *seq {
                return Some(proposed(outcome));
            }
            if proposal.seq < *seq {
                return Some(ResponseBody::Error(format!(
                    "sequence number {} of client {} is older than its last applied one ({seq})",
                    proposal.seq, proposal.client
                )));
            }
        }
        let key = (proposal.client.clone(), proposal.seq);
        if let Some(waiters) = self.waiting.get_mut(&key) {
            waiters.push((from.to_string(), call));
            return None;
        }
        let data = wire::encode_proposal(&proposal);
        match self.raft(|raw| raw.propose(Vec::new(), data)) {
            Ok(()) => {
                self.stats.proposals += 1;
                self.waiting.insert(key, vec![(from.to_string(), call)]);
                None
            }
            Err(error) => Some(ResponseBody::Error(format!("the proposal was dropped ({error}); retry"))),
        }
    }

    fn on_response(&mut self, call: CallId, result: Result<proto::Response, NetError>) {
        if let Some(to) = self.calls.remove(&call) {
            if result.is_err() {
                self.raft(|raw| raw.report_unreachable(to));
            }
        }
    }

    fn on_written(&mut self, io: IoId, result: ConfigIoDone, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        self.writes_in_flight = self.writes_in_flight.saturating_sub(1);
        let writing = match self.writing.take() {
            Some(writing) if writing.io == io => writing,
            other => {
                self.writing = other;
                return;
            }
        };
        match result {
            ConfigIoDone::Appended(Ok(_)) => {
                self.stats.writes += 1;
                self.raft(|raw| raw.on_persist_ready(writing.number));
                self.send(writing.messages, out);
            }
            ConfigIoDone::Appended(Err(error)) => {
                tracing::error!(replica = self.raw.raft.id, %error, "a log append failed: the replica stops");
                self.failed = Some(format!("a log append failed: {error}"));
            }
        }
    }

    /// Hands out every Ready: messages that need no durability at once, the rest queued
    /// behind the device write that makes them durable.
    fn drain_ready(&mut self, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        loop {
            while self.raw.has_ready() {
                let mut ready = self.raw.ready();
                let messages = ready.take_messages();
                self.send(messages, out);
                let record = ConfigLog::record(ready.entries(), ready.hs());
                let store = self.raw.mut_store();
                store.append(ready.entries());
                if let Some(hard_state) = ready.hs() {
                    store.set_hard_state(hard_state.clone());
                }
                for entry in ready.take_committed_entries() {
                    self.apply(entry, out);
                }
                self.queued.push(Queued { number: ready.number(), record, messages: ready.take_persisted_messages() });
                self.raft(|raw| raw.advance_append_async(ready));
                let applied = self.state.applied_index();
                self.raft(|raw| raw.advance_apply_to(applied));
            }
            if !self.start_write(out) {
                break;
            }
        }
        if !self.is_leader() && !self.waiting.is_empty() {
            self.fail_waiting(out);
        }
    }

    /// Starts the device append of every queued Ready, unless one is in flight. Returns
    /// whether the queue was persisted at once (nothing to write), so more may be ready.
    fn start_write(&mut self, out: &mut Vec<Command<Dkv, ConfigIo>>) -> bool {
        if self.writing.is_some() || self.queued.is_empty() {
            return false;
        }
        let queued = std::mem::take(&mut self.queued);
        let number = queued.last().map_or(0, |ready| ready.number);
        let mut records = Vec::new();
        let mut messages = Vec::new();
        for ready in queued {
            records.extend(ready.record);
            messages.extend(ready.messages);
        }
        if records.is_empty() || self.config.unsafe_ack_before_write {
            self.raft(|raw| raw.on_persist_ready(number));
            self.send(messages, out);
            if !records.is_empty() {
                let io = self.ids.io();
                self.writes_in_flight += 1;
                out.push(Command::Io { io, op: ConfigIo::Append { records, sync: self.config.sync } });
            }
            return true;
        }
        let io = self.ids.io();
        self.writes_in_flight += 1;
        out.push(Command::Io { io, op: ConfigIo::Append { records, sync: self.config.sync } });
        self.writing = Some(Writing { io, number, messages });
        false
    }

    /// Sends raft-rs's messages, one batch per receiver.
    fn send(&mut self, messages: Vec<Message>, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        let mut batches: BTreeMap<u64, Vec<proto::RaftMessage>> = BTreeMap::new();
        for message in messages {
            batches.entry(message.to).or_default().push(raft_wire::message_to_wire(message));
        }
        for (to, messages) in batches {
            let Some(name) = self.peer_name(to).map(str::to_string) else { continue };
            let call = self.ids.call();
            self.calls.insert(call, to);
            self.stats.messages_sent += messages.len() as u64;
            out.push(Command::Call {
                to: name,
                call,
                request: proto::Request { body: Some(RequestBody::Raft(proto::RaftBatch { messages })) },
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
            out.push(Command::Reply { to, call, response: proto::Response { body: Some(proposed(outcome)) } });
        }
    }

    /// Leadership was lost: the outcome of what this replica proposed is unknown here.
    fn fail_waiting(&mut self, out: &mut Vec<Command<Dkv, ConfigIo>>) {
        for (_, waiters) in std::mem::take(&mut self.waiting) {
            for (to, call) in waiters {
                let response = ResponseBody::Error("leadership changed before the proposal applied; retry".to_string());
                out.push(Command::Reply { to, call, response: proto::Response { body: Some(response) } });
            }
        }
    }
}

fn proposed(outcome: &Outcome) -> ResponseBody {
    ResponseBody::Proposed(proto::Proposed {
        index: outcome.index,
        version: outcome.version,
        refusal: outcome.refusal.clone(),
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
        match event {
            Event::Start => self.arm_tick(out),
            Event::Timer(timer) if Some(timer) == self.tick_timer => {
                self.raft(|raw| raw.tick());
                self.arm_tick(out);
            }
            Event::Timer(_) | Event::Input(()) => {}
            Event::Request { from, call, request } => self.on_request(from, call, request, out),
            Event::Response { call, result } => self.on_response(call, result),
            Event::IoDone { io, result } => self.on_written(io, result, out),
        }
        self.drain_ready(out);
    }
}
