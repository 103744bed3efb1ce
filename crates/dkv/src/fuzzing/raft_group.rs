//! A raft-rs group of three voters in one process, every message carried over Virga's wire
//! (`message_to_wire`, prost encoding and decoding, `message_from_wire` with the receiver's
//! view at delivery): the honest traffic the tests check `raft_wire` against, and the live
//! replicas the `raft_wire` fuzz target steps forged messages into.
//!
//! Deterministic: every replica's election timeout is pinned after each call into it (raft-rs
//! draws it from `thread_rng` otherwise), so a script of ticks, proposals and partitions gives
//! the same states and messages every run.

use std::collections::VecDeque;

use crate::proto;
use prost::Message as _;
use raft::eraftpb;
use raft::storage::MemStorage;
use raft::{Config, RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::raft_wire::{message_from_wire, message_to_wire, Receiver};
use crate::wire::{self, Proposal};
use crate::{ConfigCommand, ShardId};

/// Raft ids of the group.
pub const VOTERS: [u64; 3] = [1, 2, 3];
/// Ticks without a leader before a follower campaigns (raft-rs's usual 10).
pub const ELECTION_TICK: usize = 10;
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICK: usize = 3;
/// Rounds of Ready handling and delivery `settle` runs before it gives up on quiet: honest
/// traffic quiets in a few dozen.
const MAX_SETTLE_ROUNDS: usize = 500;

/// What a delivery does with a message `message_from_wire` refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Honest traffic only: a refusal, a conversion that changes the message or a step error
    /// is a bug, and panics naming the message and the receiver's view.
    Honest,
    /// After a forged message: a replica may now send what the checks refuse; drop it.
    Lenient,
}

/// A delivered message as it arrived on the wire, with the view it was checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub message: proto::RaftMessage,
    pub view: Receiver,
}

pub struct RaftGroup {
    /// Raft id `i + 1` at position `i`.
    nodes: Vec<RawNode<MemStorage>>,
    /// Entries each replica has applied, in order.
    applied: Vec<Vec<eraftpb::Entry>>,
    in_flight: VecDeque<eraftpb::Message>,
    /// A replica cut off from the others: messages to and from it are lost.
    isolated: Option<u64>,
    pub delivery: Delivery,
    /// Every delivered message, when `Some`.
    pub record: Option<Vec<Delivered>>,
    /// Messages the checks refused (only in `Delivery::Lenient`).
    pub refused: usize,
    /// When set, the network delivers in-flight messages in random order, and loses or
    /// duplicates some, as a real one may.
    chaos: Option<StdRng>,
}

impl RaftGroup {
    /// Three fresh voters sharing the founding configuration, each with a hard state at term
    /// 1 as Virga bootstraps them (no replica ever answers at term 0).
    pub fn new() -> RaftGroup {
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let nodes = VOTERS
            .iter()
            .map(|&id| {
                let storage = MemStorage::new_with_conf_state((VOTERS.to_vec(), Vec::new()));
                storage.wl().mut_hard_state().term = 1;
                let config = Config {
                    id,
                    election_tick: ELECTION_TICK,
                    heartbeat_tick: HEARTBEAT_TICK,
                    check_quorum: true,
                    pre_vote: true,
                    // Several entries per append once a follower catches up (raft-rs's
                    // default of 0 sends one at a time).
                    max_size_per_msg: 1 << 20,
                    ..Config::default()
                };
                RawNode::new(&config, storage, &logger)
                    .unwrap_or_else(|error| unreachable!("replica {id} of the sample group: {error}"))
            })
            .collect();
        let mut group = RaftGroup {
            nodes,
            applied: vec![Vec::new(); VOTERS.len()],
            in_flight: VecDeque::new(),
            isolated: None,
            delivery: Delivery::Honest,
            record: None,
            refused: 0,
            chaos: None,
        };
        for id in VOTERS {
            group.pin_timeout(id);
        }
        group
    }

    pub fn node(&self, id: u64) -> &RawNode<MemStorage> {
        &self.nodes[position(id)]
    }

    pub fn node_mut(&mut self, id: u64) -> &mut RawNode<MemStorage> {
        &mut self.nodes[position(id)]
    }

    /// The entries replica `id` has applied.
    pub fn applied(&self, id: u64) -> &[eraftpb::Entry] {
        &self.applied[position(id)]
    }

    /// The replica that leads in the highest term any replica knows, if one does.
    pub fn leader(&self) -> Option<u64> {
        let top = self.nodes.iter().map(|node| node.raft.term).max()?;
        self.nodes.iter().find(|node| node.raft.term == top && node.raft.state == StateRole::Leader).map(|n| n.raft.id)
    }

    /// Cuts `id` off from the others (`None` heals the partition). Messages already in flight
    /// are lost too, as on a real link going down.
    pub fn isolate(&mut self, id: Option<u64>) {
        self.isolated = id;
        self.in_flight.retain(|message| id.is_none_or(|cut| message.from != cut && message.to != cut));
    }

    /// From now on, messages go in an order drawn from `seed`; 1 in 20 is lost and 1 in 10
    /// delivered twice.
    pub fn reorder_lose_and_duplicate(&mut self, seed: u64) {
        self.chaos = Some(StdRng::seed_from_u64(seed));
    }

    /// One tick on every replica, then `settle`.
    pub fn tick(&mut self) {
        for id in VOTERS {
            self.node_mut(id).tick();
            self.pin_timeout(id);
        }
        self.settle();
    }

    /// Ticks until some replica leads at a higher term than `above` (at most `limit` ticks).
    pub fn tick_until_leader(&mut self, above: u64, limit: usize) -> Option<u64> {
        for _ in 0..limit {
            self.tick();
            if let Some(leader) = self.leader().filter(|&id| self.node(id).raft.term > above) {
                return Some(leader);
            }
        }
        None
    }

    /// Proposes `proposal` at replica `id`, then settles.
    pub fn propose(&mut self, id: u64, proposal: &Proposal) -> Result<(), raft::Error> {
        let outcome = self.node_mut(id).propose(Vec::new(), wire::encode_proposal(proposal));
        self.pin_timeout(id);
        self.settle();
        outcome
    }

    /// Asks leader `id` to hand leadership to `transferee`, then settles.
    pub fn transfer_leader(&mut self, id: u64, transferee: u64) {
        self.node_mut(id).transfer_leader(transferee);
        self.pin_timeout(id);
        self.settle();
    }

    /// Steps `message`, already checked, into replica `to`.
    pub fn step(&mut self, to: u64, message: eraftpb::Message) -> Result<(), raft::Error> {
        let outcome = self.node_mut(to).step(message);
        self.pin_timeout(to);
        outcome
    }

    /// Handles every replica's Ready and delivers every message until nothing is left, or
    /// `MAX_SETTLE_ROUNDS` rounds pass.
    pub fn settle(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            let mut busy = false;
            for id in VOTERS {
                while self.node(id).has_ready() {
                    self.handle_ready(id);
                    busy = true;
                }
            }
            while let Some(message) = self.next_in_flight() {
                self.deliver(message);
                busy = true;
            }
            if !busy {
                return;
            }
        }
    }

    fn next_in_flight(&mut self) -> Option<eraftpb::Message> {
        let Some(rng) = &mut self.chaos else { return self.in_flight.pop_front() };
        loop {
            if self.in_flight.is_empty() {
                return None;
            }
            let message = self.in_flight.swap_remove_back(rng.random_range(0..self.in_flight.len()))?;
            match rng.random_range(0..20) {
                0 => continue,
                1 | 2 => self.in_flight.push_back(message.clone()),
                _ => {}
            }
            return Some(message);
        }
    }

    /// Persists a Ready synchronously (entries, then hard state), sends its messages and
    /// applies its committed entries.
    fn handle_ready(&mut self, id: u64) {
        let index = position(id);
        let mut ready = self.nodes[index].ready();
        self.in_flight.extend(ready.take_messages());
        let committed = ready.take_committed_entries();
        self.applied[index].extend(committed);
        let storage = self.nodes[index].store().clone();
        storage
            .wl()
            .append(ready.entries())
            .unwrap_or_else(|error| unreachable!("replica {id} appends its Ready's entries: {error}"));
        if let Some(state) = ready.hs() {
            storage.wl().set_hardstate(state.clone());
        }
        self.in_flight.extend(ready.take_persisted_messages());
        let mut light = self.nodes[index].advance(ready);
        if let Some(commit) = light.commit_index() {
            storage.wl().mut_hard_state().commit = commit;
        }
        self.in_flight.extend(light.take_messages());
        self.applied[index].extend(light.take_committed_entries());
        self.nodes[index].advance_apply();
        self.pin_timeout(id);
    }

    /// Carries `message` over the wire to its receiver, checked against the receiver's view.
    fn deliver(&mut self, message: eraftpb::Message) {
        if self.isolated.is_some_and(|cut| message.from == cut || message.to == cut) {
            return;
        }
        let (to, from) = (message.to, message.from);
        if !VOTERS.contains(&to) {
            unreachable!("a replica sent {message:?} to unknown Raft id {to}");
        }
        let view = Receiver::of(self.node(to), from);
        let bytes = message_to_wire(message.clone()).encode_to_vec();
        let decoded = proto::RaftMessage::decode(bytes.as_slice())
            .unwrap_or_else(|error| unreachable!("{message:?} did not decode after encoding: {error}"));
        if let Some(record) = &mut self.record {
            record.push(Delivered { message: decoded.clone(), view });
        }
        let checked = match message_from_wire(decoded, &view) {
            Ok(checked) => checked,
            Err(error) if self.delivery == Delivery::Lenient => {
                let _ = error;
                self.refused += 1;
                return;
            }
            Err(error) => panic!("honest {message:?} refused at {view:?}: {error}"),
        };
        if self.delivery == Delivery::Honest {
            assert_eq!(checked, message, "the wire changed a message (receiver {view:?})");
        }
        let outcome = self.step(to, checked);
        if self.delivery == Delivery::Honest {
            if let Err(error) = outcome {
                panic!("replica {to} refused honest {message:?}: {error}");
            }
        }
    }

    /// Pins replica `id`'s randomized election timeout to a value of its own, so elections
    /// run the same way every time and replica 1 times out first.
    fn pin_timeout(&mut self, id: u64) {
        let timeout = ELECTION_TICK + 2 * id as usize;
        self.node_mut(id).raft.set_randomized_election_timeout(timeout);
    }
}

impl Default for RaftGroup {
    fn default() -> Self {
        RaftGroup::new()
    }
}

fn position(id: u64) -> usize {
    VOTERS.iter().position(|&voter| voter == id).unwrap_or_else(|| unreachable!("Raft id {id} is not in the group"))
}

/// The `seq`th proposal of client `client`: a failover, as a configuration entry carries.
pub fn sample_proposal(client: &str, seq: u64) -> Proposal {
    Proposal {
        client: client.to_string(),
        seq,
        command: ConfigCommand::Failover { shard: ShardId((seq % 3) as u32), epoch: seq, new_primary: "node-2".into() },
    }
}

/// States of the group a forged message may meet, built by a fixed script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Replica 1 leads term 2; three proposals committed on all.
    Steady,
    /// As `Steady`, then replica 3 cut off while two more commit, then healed with no tick:
    /// replica 3 lags.
    Lagging,
    /// As `Steady`, then leader 1 cut off with one proposal of its own, replica 2 elected at
    /// term 3 and two more committed, then healed with no tick: replica 1 is stale (term 2,
    /// stepped down for want of a quorum) and holds an entry that never commits.
    StaleLeader,
    /// As `Steady`, then replica 3 cut off until it pre-campaigns, then healed with no tick.
    PreCandidate,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [Scenario::Steady, Scenario::Lagging, Scenario::StaleLeader, Scenario::PreCandidate];

    /// Runs the script on a fresh group, in `delivery` mode, recording deliveries if asked.
    pub fn build(self, delivery: Delivery, record: bool) -> RaftGroup {
        let mut group = RaftGroup::new();
        group.delivery = delivery;
        group.record = record.then(Vec::new);
        let expect_leader = |leader: Option<u64>, wanted: u64| {
            if leader != Some(wanted) {
                unreachable!("the {self:?} script expected replica {wanted} to lead, got {leader:?}");
            }
        };
        expect_leader(group.tick_until_leader(1, 4 * ELECTION_TICK), 1);
        for seq in 1..=3 {
            expect_ok(group.propose(1, &sample_proposal("steady", seq)));
        }
        for _ in 0..HEARTBEAT_TICK {
            group.tick();
        }
        match self {
            Scenario::Steady => {}
            Scenario::Lagging => {
                group.isolate(Some(3));
                for seq in 1..=2 {
                    expect_ok(group.propose(1, &sample_proposal("lagging", seq)));
                }
                group.isolate(None);
            }
            Scenario::StaleLeader => {
                group.isolate(Some(1));
                expect_ok(group.propose(1, &sample_proposal("lost", 1)));
                expect_leader(group.tick_until_leader(2, 4 * ELECTION_TICK), 2);
                for seq in 1..=2 {
                    expect_ok(group.propose(2, &sample_proposal("stale", seq)));
                }
                group.isolate(None);
            }
            Scenario::PreCandidate => {
                group.isolate(Some(3));
                for _ in 0..4 * ELECTION_TICK {
                    if group.node(3).raft.state == StateRole::PreCandidate {
                        break;
                    }
                    group.tick();
                }
                if group.node(3).raft.state != StateRole::PreCandidate {
                    unreachable!("replica 3 never pre-campaigned");
                }
                group.isolate(None);
            }
        }
        group
    }
}

fn expect_ok(outcome: Result<(), raft::Error>) {
    if let Err(error) = outcome {
        unreachable!("a scripted proposal was dropped: {error}");
    }
}
