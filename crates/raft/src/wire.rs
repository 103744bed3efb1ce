//! Raft messages between replicas: conversion between Virga's prost mirror of raft-rs 0.7's
//! `eraftpb` (package `virga.dkv.v1`, `Raft*` messages, where the first Raft group of Virga,
//! the dkv configuration service, put them) and raft-rs's own types, and the checks every
//! received message passes before raft-rs sees it.
//!
//! raft-rs trusts its peers: a heartbeat committing past the receiver's log, a message of
//! term 0 (taken for a local one, skipping every term check), entries that are not
//! contiguous or carry term 0, an acknowledgement of entries the leader never had: each makes
//! it panic or quietly breaks its safety. [`message_from_wire`] refuses all of these with a
//! [`RaftWireError`] naming what is wrong, given what the receiver knows of itself
//! ([`Receiver`]). Only Virga's prost decoder reads peer bytes; raft-rs's own protobuf decoder
//! (rust-protobuf 2, whose recursion is unbounded) never does.
//!
//! Virga's Raft groups have fixed voter sets, so membership-change entries, forwarded
//! proposals and follower reads are refused too: no honest replica sends them. What an
//! entry's data must be is the group's own business: the caller hands a check
//! ([`EntryCheck`]) that every appended entry's data passes. A group that compacts its log
//! also hands the check of a snapshot's image ([`Checks::snapshot`]); a snapshot is taken
//! only from the receiver's leader, for its own voters, and only by a group that compacts.

use crate::proto;
use raft::eraftpb::{self, EntryType, MessageType};

/// What a group's entries must hold: the check of one entry's data (never empty), with the
/// reason it is refused.
pub type EntryCheck<'a> = &'a dyn Fn(&[u8]) -> Result<(), EntryRefusal>;

/// Why an entry's data is not what the group replicates: what it should hold, and why the
/// group's decoder refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not {expected}: {reason}")]
pub struct EntryRefusal {
    pub expected: &'static str,
    pub reason: String,
}

impl EntryRefusal {
    /// `error` refusing data that should be `expected`.
    pub fn new(expected: &'static str, error: impl std::fmt::Display) -> EntryRefusal {
        EntryRefusal { expected, reason: error.to_string() }
    }
}

/// Everything a received message is checked against besides the receiver's own state.
#[derive(Clone, Copy)]
pub struct Checks<'a> {
    /// What each appended entry's data must hold.
    pub entry: EntryCheck<'a>,
    /// What a snapshot's image must hold; None: the group takes no snapshot.
    pub snapshot: Option<EntryCheck<'a>>,
    /// The group's voters: a snapshot naming another membership is refused.
    pub voters: &'a [u64],
}

/// Most entries one append may carry (raft-rs sends at most `max_inflight`-bounded batches,
/// far fewer than this).
pub const MAX_ENTRIES_PER_MESSAGE: usize = 4096;
/// Longest context a message may carry (a leader transfer's vote request carries 16 bytes).
pub const MAX_CONTEXT_BYTES: usize = 64;
/// Highest log index accepted, far below where `index + entries` could overflow.
pub const MAX_INDEX: u64 = 1 << 62;

/// What the receiving replica knows of itself when a message arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receiver {
    /// Its own Raft id.
    pub me: u64,
    /// The Raft id bound to the peer the message came from (the transport names the peer).
    pub sender: u64,
    /// Its current term.
    pub term: u64,
    /// Whether it leads in `term`.
    pub is_leader: bool,
    /// The leader it knows in `term` (0 = none).
    pub leader: u64,
    /// The last index of its log.
    pub last_index: u64,
}

impl Receiver {
    /// What `node` knows of itself now, for a message from the peer bound to Raft id `sender`.
    pub fn of<T: raft::Storage>(node: &raft::RawNode<T>, sender: u64) -> Receiver {
        Receiver {
            me: node.raft.id,
            sender,
            term: node.raft.term,
            is_leader: node.raft.state == raft::StateRole::Leader,
            leader: node.raft.leader_id,
            last_index: node.raft.raft_log.last_index(),
        }
    }
}

/// Why a received Raft message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftWireError {
    #[error("unknown message type {0}")]
    UnknownMessageType(i32),
    #[error("unknown entry type {0}")]
    UnknownEntryType(i32),
    #[error("a {0:?} message never travels between replicas")]
    NotAWireType(MessageType),
    #[error("this group takes no snapshots")]
    SnapshotUnsupported,
    #[error("the snapshot {0}")]
    BadSnapshot(&'static str),
    #[error("the snapshot names voters {found:?}, not the group's {expected:?}")]
    SnapshotMembership { found: Vec<u64>, expected: Vec<u64> },
    #[error("the snapshot's image does not hold what the group replicates: {0}")]
    SnapshotImage(EntryRefusal),
    #[error("a {0:?} message has term 0")]
    ZeroTerm(MessageType),
    #[error("the message is for Raft id {to}, not this replica ({me})")]
    WrongReceiver { to: u64, me: u64 },
    #[error("the message claims to be from Raft id {from}, but its sender is Raft id {sender}")]
    WrongSender { from: u64, sender: u64 },
    #[error("election priorities are not used by the service")]
    PriorityUnsupported,
    #[error("snapshot requests are not used by the service")]
    RequestSnapshotUnsupported,
    #[error("a {kind:?} message carries field {field}, which it never has")]
    UnexpectedField { kind: MessageType, field: &'static str },
    #[error("{what} is {length}, more than the {max} accepted")]
    TooLarge { what: &'static str, length: usize, max: usize },
    #[error("index {index} and its term {log_term} disagree (only index 0 has term 0)")]
    ZeroLogTerm { index: u64, log_term: u64 },
    #[error("index {index} is beyond the highest accepted ({max})")]
    IndexTooHigh { index: u64, max: u64 },
    #[error("entry {position} has index {found}, expected {expected}")]
    EntriesNotContiguous { position: usize, expected: u64, found: u64 },
    #[error("entry at index {index} has term {term}, outside [{low}, {high}] (terms never decrease along a log)")]
    EntryTermOutOfOrder { index: u64, term: u64, low: u64, high: u64 },
    #[error("entry at index {index} is a membership change, which the service does not make")]
    ConfChangeUnsupported { index: u64 },
    #[error("entry at index {index} does not hold what the group replicates: {reason}")]
    BadEntry { index: u64, reason: EntryRefusal },
    #[error("Raft id {from} sends as leader of term {term}, whose leader is Raft id {leader}")]
    SecondLeader { from: u64, term: u64, leader: u64 },
    #[error("commit index {commit} is beyond this replica's last index {last_index}")]
    CommitBeyondLog { commit: u64, last_index: u64 },
    #[error("leader transfer from Raft id {from} at term {term}, which is not this replica's leader")]
    NotFromLeader { from: u64, term: u64 },
    #[error("acknowledged index {index} is beyond the leader's last index {last_index}")]
    AckBeyondLog { index: u64, last_index: u64 },
    #[error(
        "rejection of index {index} with hint {hint} (the hint is at most the index, the index at most {last_index})"
    )]
    BadRejectHint { index: u64, hint: u64, last_index: u64 },
}

/// Converts a raft-rs message to send.
pub fn message_to_wire(mut message: eraftpb::Message) -> proto::RaftMessage {
    proto::RaftMessage {
        msg_type: message_type_to_wire(message.get_msg_type()) as i32,
        to: message.to,
        from: message.from,
        term: message.term,
        log_term: message.log_term,
        index: message.index,
        entries: message.take_entries().into_iter().map(entry_to_wire).collect(),
        commit: message.commit,
        snapshot: message.snapshot.take().map(snapshot_to_wire),
        reject: message.reject,
        reject_hint: message.reject_hint,
        context: message.context.to_vec(),
        request_snapshot: message.request_snapshot,
        deprecated_priority: message.deprecated_priority,
        commit_term: message.commit_term,
        priority: message.priority,
    }
}

/// Checks a received message against what the receiver knows and converts it for
/// `RawNode::step`. A refused message changes nothing.
pub fn message_from_wire(
    message: proto::RaftMessage,
    at: &Receiver,
    check_entry: EntryCheck<'_>,
) -> Result<eraftpb::Message, RaftWireError> {
    message_from_wire_with(message, at, &Checks { entry: check_entry, snapshot: None, voters: &[] })
}

/// [`message_from_wire`] for a group that may also send snapshots (`checks.snapshot`).
pub fn message_from_wire_with(
    message: proto::RaftMessage,
    at: &Receiver,
    checks: &Checks<'_>,
) -> Result<eraftpb::Message, RaftWireError> {
    let kind = message_type_from_wire(message.msg_type)?;
    if kind == MessageType::MsgSnapshot && checks.snapshot.is_none() {
        return Err(RaftWireError::SnapshotUnsupported);
    }
    check_envelope(kind, &message, at)?;
    match kind {
        MessageType::MsgAppend => check_append(&message, at, checks.entry)?,
        MessageType::MsgSnapshot => check_snapshot(&message, at, checks)?,
        MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => {
            check_index_term(message.index, message.log_term)?;
        }
        MessageType::MsgHeartbeat => {
            check_sole_leader(&message, at)?;
            if message.commit > at.last_index {
                return Err(RaftWireError::CommitBeyondLog { commit: message.commit, last_index: at.last_index });
            }
        }
        MessageType::MsgTimeoutNow if message.from != at.leader || message.term != at.term => {
            return Err(RaftWireError::NotFromLeader { from: message.from, term: message.term });
        }
        MessageType::MsgAppendResponse => check_append_response(&message, at)?,
        _ => {}
    }
    message_into_raft(kind, message)
}

/// Checks what every kind of message must satisfy.
fn check_envelope(kind: MessageType, message: &proto::RaftMessage, at: &Receiver) -> Result<(), RaftWireError> {
    match kind {
        MessageType::MsgHup
        | MessageType::MsgBeat
        | MessageType::MsgPropose
        | MessageType::MsgUnreachable
        | MessageType::MsgSnapStatus
        | MessageType::MsgCheckQuorum
        | MessageType::MsgTransferLeader
        | MessageType::MsgReadIndex
        | MessageType::MsgReadIndexResp => return Err(RaftWireError::NotAWireType(kind)),
        _ => {}
    }
    if message.term == 0 {
        return Err(RaftWireError::ZeroTerm(kind));
    }
    if message.to != at.me {
        return Err(RaftWireError::WrongReceiver { to: message.to, me: at.me });
    }
    if message.from != at.sender || message.from == at.me {
        return Err(RaftWireError::WrongSender { from: message.from, sender: at.sender });
    }
    if message.priority != 0 || message.deprecated_priority != 0 {
        return Err(RaftWireError::PriorityUnsupported);
    }
    if message.request_snapshot != 0 {
        return Err(RaftWireError::RequestSnapshotUnsupported);
    }
    if message.snapshot.is_some() != (kind == MessageType::MsgSnapshot) {
        return Err(RaftWireError::UnexpectedField { kind, field: "snapshot" });
    }
    if kind != MessageType::MsgAppend && !message.entries.is_empty() {
        return Err(RaftWireError::UnexpectedField { kind, field: "entries" });
    }
    let requests_answer = matches!(
        kind,
        MessageType::MsgAppendResponse | MessageType::MsgRequestVoteResponse | MessageType::MsgRequestPreVoteResponse
    );
    if !requests_answer && (message.reject || message.reject_hint != 0) {
        return Err(RaftWireError::UnexpectedField { kind, field: "reject" });
    }
    if message.context.len() > MAX_CONTEXT_BYTES {
        return Err(RaftWireError::TooLarge {
            what: "the context",
            length: message.context.len(),
            max: MAX_CONTEXT_BYTES,
        });
    }
    if message.index > MAX_INDEX {
        return Err(RaftWireError::IndexTooHigh { index: message.index, max: MAX_INDEX });
    }
    Ok(())
}

/// Only index 0 (before the first entry) has term 0; every entry has a term of at least 1.
fn check_index_term(index: u64, log_term: u64) -> Result<(), RaftWireError> {
    if (index == 0) != (log_term == 0) {
        return Err(RaftWireError::ZeroLogTerm { index, log_term });
    }
    Ok(())
}

/// Two replicas never lead in one term: an append or heartbeat at our term from another
/// replica than the leader we know means a bug or a forgery.
fn check_sole_leader(message: &proto::RaftMessage, at: &Receiver) -> Result<(), RaftWireError> {
    let known = if at.is_leader { at.me } else { at.leader };
    if message.term == at.term && known != 0 && known != message.from {
        return Err(RaftWireError::SecondLeader { from: message.from, term: message.term, leader: known });
    }
    Ok(())
}

fn check_append(message: &proto::RaftMessage, at: &Receiver, check_entry: EntryCheck<'_>) -> Result<(), RaftWireError> {
    check_sole_leader(message, at)?;
    check_index_term(message.index, message.log_term)?;
    if message.entries.len() > MAX_ENTRIES_PER_MESSAGE {
        return Err(RaftWireError::TooLarge {
            what: "the number of entries",
            length: message.entries.len(),
            max: MAX_ENTRIES_PER_MESSAGE,
        });
    }
    let mut previous_term = message.log_term;
    for (position, entry) in message.entries.iter().enumerate() {
        // `message.index` is at most MAX_INDEX and the count at most 4096: no overflow.
        let expected = message.index + 1 + position as u64;
        if entry.index != expected {
            return Err(RaftWireError::EntriesNotContiguous { position, expected, found: entry.index });
        }
        if entry.term < previous_term.max(1) || entry.term > message.term {
            return Err(RaftWireError::EntryTermOutOfOrder {
                index: entry.index,
                term: entry.term,
                low: previous_term.max(1),
                high: message.term,
            });
        }
        previous_term = entry.term;
        match entry_type_from_wire(entry.entry_type)? {
            EntryType::EntryNormal if entry.data.is_empty() => {}
            EntryType::EntryNormal => {
                check_entry(&entry.data).map_err(|reason| RaftWireError::BadEntry { index: entry.index, reason })?;
            }
            EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                return Err(RaftWireError::ConfChangeUnsupported { index: entry.index });
            }
        }
        if entry.context.len() > MAX_CONTEXT_BYTES {
            return Err(RaftWireError::TooLarge {
                what: "an entry's context",
                length: entry.context.len(),
                max: MAX_CONTEXT_BYTES,
            });
        }
    }
    Ok(())
}

/// A snapshot comes from the receiver's leader, at an index and term a log can hold, for
/// the group's own voters, and its image is what the group's snapshots hold.
fn check_snapshot(message: &proto::RaftMessage, at: &Receiver, checks: &Checks<'_>) -> Result<(), RaftWireError> {
    check_sole_leader(message, at)?;
    let Some(snapshot) = &message.snapshot else { return Err(RaftWireError::BadSnapshot("is missing")) };
    let Some(metadata) = &snapshot.metadata else { return Err(RaftWireError::BadSnapshot("has no metadata")) };
    if metadata.index == 0 || metadata.index > MAX_INDEX {
        return Err(RaftWireError::BadSnapshot("index is 0 or beyond the highest accepted"));
    }
    if metadata.term == 0 || metadata.term > message.term {
        return Err(RaftWireError::BadSnapshot("term is 0 or above the message's"));
    }
    let Some(conf_state) = &metadata.conf_state else { return Err(RaftWireError::BadSnapshot("names no voters")) };
    let (mut found, mut expected) = (conf_state.voters.clone(), checks.voters.to_vec());
    found.sort_unstable();
    expected.sort_unstable();
    let joint = !conf_state.learners.is_empty()
        || !conf_state.voters_outgoing.is_empty()
        || !conf_state.learners_next.is_empty()
        || conf_state.auto_leave;
    if found != expected || joint {
        return Err(RaftWireError::SnapshotMembership { found, expected });
    }
    if let Some(check) = checks.snapshot {
        check(&snapshot.data).map_err(RaftWireError::SnapshotImage)?;
    }
    Ok(())
}

/// A leader takes acknowledgements of its own term only for entries it has.
fn check_append_response(message: &proto::RaftMessage, at: &Receiver) -> Result<(), RaftWireError> {
    if !at.is_leader || message.term != at.term {
        return Ok(());
    }
    if !message.reject && message.index > at.last_index {
        return Err(RaftWireError::AckBeyondLog { index: message.index, last_index: at.last_index });
    }
    if message.reject && (message.reject_hint > message.index || message.index > at.last_index) {
        return Err(RaftWireError::BadRejectHint {
            index: message.index,
            hint: message.reject_hint,
            last_index: at.last_index,
        });
    }
    Ok(())
}

/// Converts a message without any check, to show what raft-rs does with what the checks
/// refuse (tests only: nothing a peer sends may take this path).
#[doc(hidden)]
pub fn message_into_raft_unchecked(message: proto::RaftMessage) -> Result<eraftpb::Message, RaftWireError> {
    message_into_raft(message_type_from_wire(message.msg_type)?, message)
}

fn message_into_raft(kind: MessageType, message: proto::RaftMessage) -> Result<eraftpb::Message, RaftWireError> {
    let mut out = eraftpb::Message::default();
    out.set_msg_type(kind);
    out.to = message.to;
    out.from = message.from;
    out.term = message.term;
    out.log_term = message.log_term;
    out.index = message.index;
    out.commit = message.commit;
    out.commit_term = message.commit_term;
    out.reject = message.reject;
    out.reject_hint = message.reject_hint;
    out.context = message.context.into();
    let entries: Vec<eraftpb::Entry> = message.entries.into_iter().map(entry_into_raft).collect::<Result<_, _>>()?;
    out.set_entries(entries.into());
    if let Some(snapshot) = message.snapshot {
        out.set_snapshot(snapshot_into_raft(snapshot));
    }
    Ok(out)
}

/// Converts an entry for the replica's own log (its device, or a message).
pub fn entry_to_wire(mut entry: eraftpb::Entry) -> proto::RaftEntry {
    proto::RaftEntry {
        entry_type: entry_type_to_wire(entry.get_entry_type()) as i32,
        term: entry.term,
        index: entry.index,
        data: std::mem::take(&mut entry.data).to_vec(),
        sync_log: false,
        context: std::mem::take(&mut entry.context).to_vec(),
    }
}

/// Converts an entry read back from the replica's own log or checked by [`message_from_wire`].
pub fn entry_into_raft(entry: proto::RaftEntry) -> Result<eraftpb::Entry, RaftWireError> {
    let mut out = eraftpb::Entry::default();
    out.set_entry_type(entry_type_from_wire(entry.entry_type)?);
    out.term = entry.term;
    out.index = entry.index;
    out.data = entry.data.into();
    out.context = entry.context.into();
    Ok(out)
}

pub fn hard_state_to_wire(state: &eraftpb::HardState) -> proto::RaftHardState {
    proto::RaftHardState { term: state.term, vote: state.vote, commit: state.commit }
}

pub fn hard_state_into_raft(state: &proto::RaftHardState) -> eraftpb::HardState {
    eraftpb::HardState { term: state.term, vote: state.vote, commit: state.commit, ..Default::default() }
}

pub fn conf_state_to_wire(state: &eraftpb::ConfState) -> proto::RaftConfState {
    proto::RaftConfState {
        voters: state.voters.clone(),
        learners: state.learners.clone(),
        voters_outgoing: state.voters_outgoing.clone(),
        learners_next: state.learners_next.clone(),
        auto_leave: state.auto_leave,
    }
}

pub fn conf_state_into_raft(state: &proto::RaftConfState) -> eraftpb::ConfState {
    eraftpb::ConfState {
        voters: state.voters.clone(),
        learners: state.learners.clone(),
        voters_outgoing: state.voters_outgoing.clone(),
        learners_next: state.learners_next.clone(),
        auto_leave: state.auto_leave,
        ..Default::default()
    }
}

pub fn snapshot_to_wire(snapshot: eraftpb::Snapshot) -> proto::RaftSnapshot {
    let metadata = snapshot.get_metadata();
    proto::RaftSnapshot {
        data: snapshot.data.to_vec(),
        metadata: Some(proto::RaftSnapshotMetadata {
            conf_state: Some(conf_state_to_wire(metadata.get_conf_state())),
            index: metadata.index,
            term: metadata.term,
        }),
    }
}

/// Converts a snapshot read back from the device or checked by [`message_from_wire_with`].
pub fn snapshot_into_raft(snapshot: proto::RaftSnapshot) -> eraftpb::Snapshot {
    let metadata = snapshot.metadata.unwrap_or_default();
    let mut raft_metadata =
        eraftpb::SnapshotMetadata { index: metadata.index, term: metadata.term, ..Default::default() };
    raft_metadata.set_conf_state(metadata.conf_state.as_ref().map(conf_state_into_raft).unwrap_or_default());
    let mut out = eraftpb::Snapshot { data: snapshot.data.into(), ..Default::default() };
    out.set_metadata(raft_metadata);
    out
}

fn message_type_from_wire(value: i32) -> Result<MessageType, RaftWireError> {
    use proto::RaftMessageType as W;
    let wire = W::try_from(value).map_err(|_| RaftWireError::UnknownMessageType(value))?;
    Ok(match wire {
        W::Hup => MessageType::MsgHup,
        W::Beat => MessageType::MsgBeat,
        W::Propose => MessageType::MsgPropose,
        W::Append => MessageType::MsgAppend,
        W::AppendResponse => MessageType::MsgAppendResponse,
        W::RequestVote => MessageType::MsgRequestVote,
        W::RequestVoteResponse => MessageType::MsgRequestVoteResponse,
        W::Snapshot => MessageType::MsgSnapshot,
        W::Heartbeat => MessageType::MsgHeartbeat,
        W::HeartbeatResponse => MessageType::MsgHeartbeatResponse,
        W::Unreachable => MessageType::MsgUnreachable,
        W::SnapStatus => MessageType::MsgSnapStatus,
        W::CheckQuorum => MessageType::MsgCheckQuorum,
        W::TransferLeader => MessageType::MsgTransferLeader,
        W::TimeoutNow => MessageType::MsgTimeoutNow,
        W::ReadIndex => MessageType::MsgReadIndex,
        W::ReadIndexResp => MessageType::MsgReadIndexResp,
        W::RequestPreVote => MessageType::MsgRequestPreVote,
        W::RequestPreVoteResponse => MessageType::MsgRequestPreVoteResponse,
    })
}

fn message_type_to_wire(kind: MessageType) -> proto::RaftMessageType {
    use proto::RaftMessageType as W;
    match kind {
        MessageType::MsgHup => W::Hup,
        MessageType::MsgBeat => W::Beat,
        MessageType::MsgPropose => W::Propose,
        MessageType::MsgAppend => W::Append,
        MessageType::MsgAppendResponse => W::AppendResponse,
        MessageType::MsgRequestVote => W::RequestVote,
        MessageType::MsgRequestVoteResponse => W::RequestVoteResponse,
        MessageType::MsgSnapshot => W::Snapshot,
        MessageType::MsgHeartbeat => W::Heartbeat,
        MessageType::MsgHeartbeatResponse => W::HeartbeatResponse,
        MessageType::MsgUnreachable => W::Unreachable,
        MessageType::MsgSnapStatus => W::SnapStatus,
        MessageType::MsgCheckQuorum => W::CheckQuorum,
        MessageType::MsgTransferLeader => W::TransferLeader,
        MessageType::MsgTimeoutNow => W::TimeoutNow,
        MessageType::MsgReadIndex => W::ReadIndex,
        MessageType::MsgReadIndexResp => W::ReadIndexResp,
        MessageType::MsgRequestPreVote => W::RequestPreVote,
        MessageType::MsgRequestPreVoteResponse => W::RequestPreVoteResponse,
    }
}

fn entry_type_from_wire(value: i32) -> Result<EntryType, RaftWireError> {
    use proto::RaftEntryType as W;
    match W::try_from(value).map_err(|_| RaftWireError::UnknownEntryType(value))? {
        W::Normal => Ok(EntryType::EntryNormal),
        W::ConfChange => Ok(EntryType::EntryConfChange),
        W::ConfChangeV2 => Ok(EntryType::EntryConfChangeV2),
    }
}

fn entry_type_to_wire(kind: EntryType) -> proto::RaftEntryType {
    use proto::RaftEntryType as W;
    match kind {
        EntryType::EntryNormal => W::Normal,
        EntryType::EntryConfChange => W::ConfChange,
        EntryType::EntryConfChangeV2 => W::ConfChangeV2,
    }
}
