//! raft-rs's `RawNode` driven the way every Virga core drives it: time as ticks, messages in
//! as checked wire batches, and each Ready's writes group-committed to the core's device
//! before the messages that promise them leave.
//!
//! A core owns a [`Replica`] and moves bytes and device operations for it: after every call
//! it asks [`Replica::drain`] for an [`Output`] (batches per receiver, committed entries to
//! apply, and at most one device write at a time), and reports the write's completion with
//! [`Replica::written`]. Only once a write is durable does raft-rs hear of it
//! (`on_persist_ready`) and do the messages held for it (votes, acknowledgements) go out. A
//! leader's own appends go out before its write, as Raft allows: an entry counts toward the
//! commit only once the leader's own write is done too.
//!
//! Elections are deterministic: raft-rs draws its randomized election timeout from the
//! thread's RNG whenever its role or term changes; after every call into the `RawNode` the
//! replica overwrites it with a draw from its own seeded RNG when (term, role) changed, and
//! only ticks ever read it.

use std::collections::BTreeMap;

use crate::proto;
use raft::eraftpb::{Entry, Message};
use raft::{RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::log::RaftLog;
use crate::wire::{self, EntryCheck, RaftWireError, Receiver};

/// One replica's Raft settings.
#[derive(Debug, Clone)]
pub struct ReplicaSettings {
    /// This replica's Raft id (from 1).
    pub id: u64,
    /// Ticks without a leader before a follower campaigns (randomized in [n, 2n)).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Seeds the election timeouts.
    pub seed: u64,
    /// Largest batch of entries in one append message, in bytes.
    pub max_message_bytes: u64,
    /// A deliberately broken variant, for the checkers to catch: acknowledge (votes,
    /// appends) before the log write is durable. Only in test builds and under `sim`.
    #[cfg(any(test, feature = "sim"))]
    pub unsafe_ack_before_write: bool,
}

impl ReplicaSettings {
    /// Replica `id` with `election_ticks`, `heartbeat_ticks` and `seed`, 1 MiB appends and
    /// acknowledgements only of what is durable.
    pub fn new(id: u64, election_ticks: usize, heartbeat_ticks: usize, seed: u64) -> ReplicaSettings {
        ReplicaSettings {
            id,
            election_ticks,
            heartbeat_ticks,
            seed,
            max_message_bytes: 1 << 20,
            #[cfg(any(test, feature = "sim"))]
            unsafe_ack_before_write: false,
        }
    }
}

/// What the core does after a call: send these batches, apply these entries (in order, at
/// once: the replica counts them applied), and start this device write if there is one.
#[derive(Debug, Default)]
pub struct Output {
    /// Raft messages per receiving Raft id.
    pub messages: BTreeMap<u64, Vec<proto::RaftMessage>>,
    pub committed: Vec<Entry>,
    /// Records to append to the replica's log (then [`Replica::written`]).
    pub write: Option<Vec<Vec<u8>>>,
}

/// A Ready whose writes wait for the device.
struct Queued {
    number: u64,
    record: Option<Vec<u8>>,
    messages: Vec<Message>,
}

/// The device write in flight: the newest Ready it covers and the messages held for it.
struct Writing {
    number: u64,
    messages: Vec<Message>,
}

/// raft-rs's `RawNode` over a [`RaftLog`], with the Ready protocol done once.
pub struct Replica {
    raw: RawNode<RaftLog>,
    rng: StdRng,
    election_ticks: usize,
    /// (term, role) after the last call into the RawNode.
    seen: (u64, StateRole),
    queued: Vec<Queued>,
    writing: Option<Writing>,
    /// Terms in which this replica became leader.
    led_terms: Vec<u64>,
    /// Peer messages raft-rs itself refused after they passed the wire checks.
    refused_by_raft: u64,
    #[cfg(any(test, feature = "sim"))]
    unsafe_ack_before_write: bool,
}

impl Replica {
    /// A replica over its recovered log; every committed entry is applied again (the core's
    /// state is rebuilt from the log).
    pub fn new(settings: &ReplicaSettings, log: RaftLog) -> Result<Replica, raft::Error> {
        let config = raft::Config {
            id: settings.id,
            election_tick: settings.election_ticks,
            heartbeat_tick: settings.heartbeat_ticks,
            applied: 0,
            max_size_per_msg: settings.max_message_bytes,
            max_inflight_msgs: 64,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, log, &logger)?;
        let seen = (raw.raft.term, raw.raft.state);
        let mut replica = Replica {
            raw,
            rng: StdRng::seed_from_u64(settings.seed),
            election_ticks: settings.election_ticks,
            seen,
            queued: Vec::new(),
            writing: None,
            led_terms: Vec::new(),
            refused_by_raft: 0,
            #[cfg(any(test, feature = "sim"))]
            unsafe_ack_before_write: settings.unsafe_ack_before_write,
        };
        replica.draw_election_timeout();
        Ok(replica)
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
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

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// Peer messages that passed the wire checks and raft-rs itself refused.
    pub fn refused_by_raft(&self) -> u64 {
        self.refused_by_raft
    }

    pub fn led_terms(&self) -> &[u64] {
        &self.led_terms
    }

    /// Whether a device write is in flight.
    pub fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    pub fn tick(&mut self) {
        self.raft(|raw| raw.tick());
    }

    /// Steps a peer's batch into Raft, each message checked first (`check_entry` is what an
    /// appended entry's data must pass). Returns the refused messages' reasons; a refused
    /// message changes nothing. Messages raft-rs itself refuses (one for a peer it does not
    /// know) change nothing either, and are counted ([`Replica::refused_by_raft`]).
    pub fn step_batch(
        &mut self,
        sender: u64,
        messages: Vec<proto::RaftMessage>,
        check_entry: EntryCheck<'_>,
    ) -> Vec<RaftWireError> {
        let mut refused = Vec::new();
        for message in messages {
            let at = Receiver::of(&self.raw, sender);
            match wire::message_from_wire(message, &at, check_entry) {
                Ok(message) => {
                    if self.raft(|raw| raw.step(message)).is_err() {
                        self.refused_by_raft += 1;
                    }
                }
                Err(error) => refused.push(error),
            }
        }
        refused
    }

    /// Proposes `data` as a new entry. The leader only: raft-rs would forward a follower's
    /// proposal to the leader, whose wire checks refuse forwarded proposals.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), raft::Error> {
        if !self.is_leader() {
            return Err(raft::Error::ProposalDropped);
        }
        self.raft(|raw| raw.propose(Vec::new(), data))
    }

    /// A batch to `peer` was not delivered: raft-rs probes it again.
    pub fn unreachable(&mut self, peer: u64) {
        self.raft(|raw| raw.report_unreachable(peer));
    }

    /// The device write handed out in the last [`Output`] is durable (or failed: then the
    /// core must stop, since it cannot promise what it did not write).
    pub fn written(&mut self, out: &mut Output) {
        if let Some(writing) = self.writing.take() {
            self.raft(|raw| raw.on_persist_ready(writing.number));
            self.send(writing.messages, out);
        }
        self.drain(out);
    }

    /// Hands out every Ready: messages that need no durability at once, the rest held
    /// behind the device write that makes them durable; committed entries to apply.
    pub fn drain(&mut self, out: &mut Output) {
        loop {
            while self.raw.has_ready() {
                let mut ready = self.raw.ready();
                self.send(ready.take_messages(), out);
                let record = RaftLog::record(ready.entries(), ready.hs());
                let store = self.raw.mut_store();
                store.append(ready.entries());
                if let Some(hard_state) = ready.hs() {
                    store.set_hard_state(hard_state.clone());
                }
                let committed = ready.take_committed_entries();
                let applied = committed.last().map(|entry| entry.index);
                out.committed.extend(committed);
                self.queued.push(Queued { number: ready.number(), record, messages: ready.take_persisted_messages() });
                self.raft(|raw| raw.advance_append_async(ready));
                if let Some(applied) = applied {
                    self.raft(|raw| raw.advance_apply_to(applied));
                }
            }
            if !self.start_write(out) {
                break;
            }
        }
    }

    /// Starts the device write of every queued Ready, unless one is in flight. Returns
    /// whether the queue was persisted at once (nothing to write), so more may be ready.
    fn start_write(&mut self, out: &mut Output) -> bool {
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
        #[cfg(any(test, feature = "sim"))]
        let ack_before_write = self.unsafe_ack_before_write;
        #[cfg(not(any(test, feature = "sim")))]
        let ack_before_write = false;
        if records.is_empty() || ack_before_write {
            self.raft(|raw| raw.on_persist_ready(number));
            self.send(messages, out);
            if !records.is_empty() {
                out.write.get_or_insert_with(Vec::new).extend(records);
            }
            return true;
        }
        out.write = Some(records);
        self.writing = Some(Writing { number, messages });
        false
    }

    fn send(&mut self, messages: Vec<Message>, out: &mut Output) {
        for message in messages {
            out.messages.entry(message.to).or_default().push(wire::message_to_wire(message));
        }
    }

    /// Calls into the RawNode, then redraws the election timeout if (term, role) changed.
    fn raft<T>(&mut self, call: impl FnOnce(&mut RawNode<RaftLog>) -> T) -> T {
        let result = call(&mut self.raw);
        let now = (self.raw.raft.term, self.raw.raft.state);
        if now != self.seen {
            if now.1 == StateRole::Leader {
                self.led_terms.push(now.0);
            }
            self.seen = now;
            self.draw_election_timeout();
        }
        result
    }

    fn draw_election_timeout(&mut self) {
        let low = self.election_ticks;
        let timeout = self.rng.random_range(low..2 * low);
        self.raw.raft.set_randomized_election_timeout(timeout);
    }
}
