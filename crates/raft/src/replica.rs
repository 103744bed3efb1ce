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

use crate::log::{CompactError, RaftLog};
use crate::wire::{self, Checks, EntryCheck, EntryRefusal, RaftWireError, Receiver};

/// What a group's snapshot image must hold (see [`crate::wire::Checks::snapshot`]).
pub type ImageCheck = fn(&[u8]) -> Result<(), EntryRefusal>;

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
    /// What a leader's snapshot image must hold, for a group that compacts its log (None:
    /// snapshots are refused).
    pub snapshot_check: Option<ImageCheck>,
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
            snapshot_check: None,
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
    /// A leader's snapshot this replica installed: the state machine becomes its image (the
    /// index and the image), before the committed entries that follow are applied.
    pub restored: Option<(u64, Vec<u8>)>,
    pub committed: Vec<Entry>,
    /// Records to append to the replica's log (then [`Replica::written`]).
    pub write: Option<Vec<Vec<u8>>>,
    /// Of `write`, the position of a record that stands alone (a snapshot): once the write
    /// is durable, every record before it may be dropped from the device.
    pub truncate_before: Option<usize>,
}

/// A Ready (or a compaction) whose writes wait for the device.
struct Queued {
    number: u64,
    records: Vec<Vec<u8>>,
    /// Of `records`, one that stands alone (a snapshot).
    standalone: Option<usize>,
    /// The index of a leader's snapshot installed by this Ready.
    installed: Option<u64>,
    messages: Vec<Message>,
}

/// The device write in flight: the newest Ready it covers, the messages held for it, and
/// the index of a leader's snapshot it makes durable.
struct Writing {
    number: u64,
    messages: Vec<Message>,
    installed: Option<u64>,
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
    snapshot_check: Option<ImageCheck>,
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
            snapshot_check: settings.snapshot_check,
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
        let voters = self.raw.store().voters().to_vec();
        let snapshot_check = self.snapshot_check;
        let snapshot: Option<EntryCheck<'_>> = snapshot_check.as_ref().map(|check| check as EntryCheck<'_>);
        let checks = Checks { entry: check_entry, snapshot, voters: &voters };
        for message in messages {
            let at = Receiver::of(&self.raw, sender);
            match wire::message_from_wire_with(message, &at, &checks) {
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

    /// A batch to `peer` was not delivered: raft-rs probes it again (and sends a snapshot
    /// again, if the batch held one).
    pub fn unreachable(&mut self, peer: u64) {
        self.raft(|raw| {
            raw.report_unreachable(peer);
            raw.report_snapshot(peer, raft::SnapshotStatus::Failure);
        });
    }

    /// The log's first index (after its snapshot) and how many entries it holds in memory.
    pub fn log_extent(&self) -> (u64, usize) {
        let store = self.raw.store();
        (store.offset() + 1, store.len())
    }

    /// Compacts the log behind `image`, the state machine as of `index` (which it has
    /// applied): the entries up to `index` are dropped, a lagging follower is sent the image
    /// instead, and the record that stands for the dropped ones goes to the device with the
    /// next write ([`Output::truncate_before`]).
    pub fn compact(&mut self, index: u64, image: Vec<u8>) -> Result<(), CompactError> {
        let applied = self.raw.raft.raft_log.applied;
        if index > applied {
            return Err(CompactError::NotCommitted { index, commit: applied });
        }
        let record = self.raw.mut_store().compact(index, image)?;
        self.queued.push(Queued {
            number: 0,
            records: vec![record],
            standalone: Some(0),
            installed: None,
            messages: Vec::new(),
        });
        Ok(())
    }

    /// The device write handed out in the last [`Output`] is durable (or failed: then the
    /// core must stop, since it cannot promise what it did not write).
    pub fn written(&mut self, out: &mut Output) {
        if let Some(writing) = self.writing.take() {
            self.raft(|raw| raw.on_persist_ready(writing.number));
            if let Some(index) = writing.installed {
                self.raft(|raw| raw.advance_apply_to(index));
            }
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
                let mut records = Vec::new();
                let (mut standalone, mut installed) = (None, None);
                if !ready.snapshot().is_empty() {
                    // A leader's snapshot: it replaces what this replica applied.
                    let snapshot = ready.snapshot().clone();
                    let index = snapshot.get_metadata().index;
                    out.committed.retain(|entry| entry.index > index);
                    out.restored = Some((index, snapshot.data.to_vec()));
                    records.push(self.raw.mut_store().apply_snapshot(snapshot));
                    (standalone, installed) = (Some(0), Some(index));
                }
                records.extend(RaftLog::record(ready.entries(), ready.hs()));
                let store = self.raw.mut_store();
                store.append(ready.entries());
                if let Some(hard_state) = ready.hs() {
                    store.set_hard_state(hard_state.clone());
                }
                let committed = ready.take_committed_entries();
                let applied = committed.last().map(|entry| entry.index);
                out.committed.extend(committed);
                let messages = ready.take_persisted_messages();
                self.queued.push(Queued { number: ready.number(), records, standalone, installed, messages });
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
        // A compaction is queued with number 0: the newest Ready is the highest number.
        let number = queued.iter().map(|ready| ready.number).max().unwrap_or(0);
        let mut records = Vec::new();
        let mut messages = Vec::new();
        let (mut truncate_before, mut installed) = (None, None);
        for ready in queued {
            if let Some(position) = ready.standalone {
                truncate_before = Some(records.len() + position);
            }
            installed = ready.installed.or(installed);
            records.extend(ready.records);
            messages.extend(ready.messages);
        }
        #[cfg(any(test, feature = "sim"))]
        let ack_before_write = self.unsafe_ack_before_write;
        #[cfg(not(any(test, feature = "sim")))]
        let ack_before_write = false;
        if records.is_empty() || ack_before_write {
            self.raft(|raw| raw.on_persist_ready(number));
            if let Some(index) = installed {
                self.raft(|raw| raw.advance_apply_to(index));
            }
            self.send(messages, out);
            if !records.is_empty() {
                let write = out.write.get_or_insert_with(Vec::new);
                if let Some(position) = truncate_before {
                    out.truncate_before = Some(write.len() + position);
                }
                write.extend(records);
            }
            return true;
        }
        out.write = Some(records);
        out.truncate_before = truncate_before;
        self.writing = Some(Writing { number, messages, installed });
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
