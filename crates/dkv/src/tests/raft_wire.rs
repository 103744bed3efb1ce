//! `raft_wire` against a live raft-rs group: honest traffic crosses Virga's wire unchanged and
//! is never refused; each refusal, made from an honest message with one thing broken, names
//! its own error; raft-rs really panics on what the worst checks refuse; random honest-shaped
//! messages round-trip.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use crate::proto;
use proptest::prelude::*;
use prost::Message as _;
use raft::eraftpb::{self, MessageType};
use raft::{GetEntriesContext, Storage};

use crate::fuzzing::raft_group::{sample_proposal, Delivered, RaftGroup, Scenario, ELECTION_TICK, HEARTBEAT_TICK};
use crate::raft_wire::*;
use crate::wire::{self, Proposal};

use proto::RaftMessageType as W;

/// What the honest run proposed and must see committed, in order.
struct HonestRun {
    group: RaftGroup,
    committed: Vec<Proposal>,
}

/// Elections by timeout, proposals, a leader transfer, a follower cut off and caught up, the
/// leader cut off with a proposal of its own, a re-election, the partition healed and the old
/// leader brought back in line; every message over the wire in `Delivery::Honest` (a refusal
/// or a changed message panics, naming both).
fn honest_run() -> HonestRun {
    let mut group = RaftGroup::new();
    group.record = Some(Vec::new());
    let mut committed = Vec::new();
    let mut propose = |group: &mut RaftGroup, at: u64, client: &str, seq: u64, commits: bool| {
        let proposal = sample_proposal(client, seq);
        group.propose(at, &proposal).unwrap();
        if commits {
            committed.push(proposal);
        }
    };
    assert_eq!(group.tick_until_leader(1, 4 * ELECTION_TICK), Some(1));
    for seq in 1..=5 {
        propose(&mut group, 1, "first", seq, true);
    }
    for _ in 0..2 * HEARTBEAT_TICK {
        group.tick();
    }
    group.transfer_leader(1, 2);
    assert_eq!(group.leader(), Some(2), "the transfer went through");
    for seq in 1..=3 {
        propose(&mut group, 2, "second", seq, true);
    }
    // A follower falls behind and catches up: the leader's probes past its log are rejected.
    group.isolate(Some(3));
    for seq in 1..=3 {
        propose(&mut group, 2, "behind", seq, true);
    }
    group.isolate(None);
    for _ in 0..2 * HEARTBEAT_TICK {
        group.tick();
    }
    let term = group.node(2).raft.term;
    group.isolate(Some(2));
    propose(&mut group, 2, "lost", 1, false);
    let leader = group.tick_until_leader(term, 4 * ELECTION_TICK).unwrap();
    assert_ne!(leader, 2);
    for seq in 1..=3 {
        propose(&mut group, leader, "third", seq, true);
    }
    group.isolate(None);
    for _ in 0..2 * ELECTION_TICK {
        group.tick();
    }
    for seq in 1..=2 {
        propose(&mut group, leader, "fourth", seq, true);
    }
    for _ in 0..2 * HEARTBEAT_TICK {
        group.tick();
    }
    assert_eq!(group.leader(), Some(leader), "the healed partition left the leader in place");
    HonestRun { group, committed }
}

/// The honest run's deliveries, for the refusal tests to break.
fn honest_deliveries() -> &'static [Delivered] {
    static DELIVERIES: OnceLock<Vec<Delivered>> = OnceLock::new();
    DELIVERIES.get_or_init(|| honest_run().group.record.unwrap())
}

fn log_of(group: &RaftGroup, id: u64, through: u64) -> Vec<eraftpb::Entry> {
    group.node(id).store().entries(1, through + 1, None, GetEntriesContext::empty(false)).unwrap()
}

#[test]
fn honest_traffic_crosses_the_wire_unchanged() {
    let HonestRun { group, committed } = honest_run();
    let record = group.record.as_ref().unwrap();
    // Every kind an honest replica sends, in each of its forms, went through the checks.
    let seen = |kind: W, form: &dyn Fn(&proto::RaftMessage) -> bool| {
        record.iter().any(|delivered| delivered.message.msg_type == kind as i32 && form(&delivered.message))
    };
    let any = |_: &proto::RaftMessage| true;
    assert!(seen(W::Append, &|m| m.entries.len() > 1 && m.entries.iter().any(|e| !e.data.is_empty())));
    assert!(seen(W::AppendResponse, &|m| !m.reject));
    assert!(seen(W::AppendResponse, &|m| m.reject), "a lagging follower rejected a probe");
    assert!(seen(W::Heartbeat, &|m| m.commit > 0));
    assert!(seen(W::HeartbeatResponse, &any));
    assert!(seen(W::RequestPreVote, &any) && seen(W::RequestPreVoteResponse, &|m| !m.reject));
    assert!(seen(W::RequestVote, &|m| m.context == b"CampaignTransfer") && seen(W::RequestVoteResponse, &any));
    assert!(seen(W::TimeoutNow, &any));
    assert!(record.len() > 150, "{} messages", record.len());

    let commit = group.node(1).raft.raft_log.committed;
    for id in [2, 3] {
        assert_eq!(group.node(id).raft.raft_log.committed, commit, "replica {id}'s commit");
        assert_eq!(log_of(&group, id, commit), log_of(&group, 1, commit), "replica {id}'s committed log");
        assert_eq!(group.applied(id), group.applied(1), "replica {id}'s applied entries");
    }
    assert_eq!(group.applied(1).len() as u64, commit);
    let applied: Vec<Proposal> = group
        .applied(1)
        .iter()
        .filter(|entry| !entry.data.is_empty())
        .map(|entry| wire::decode_proposal(&entry.data).unwrap())
        .collect();
    assert_eq!(applied, committed, "committed proposals, in order, without the lost one");
}

#[test]
fn honest_traffic_reordered_lost_and_duplicated_is_never_refused() {
    for seed in 0..6 {
        let mut group = RaftGroup::new();
        group.reorder_lose_and_duplicate(seed);
        let mut seq = 0;
        for round in 0..6u64 {
            // In turn: a whole network, the leader cut off, a follower cut off.
            let cut = match round % 3 {
                0 => None,
                1 => group.leader(),
                _ => Some(1 + round % 3),
            };
            group.isolate(cut);
            for _ in 0..3 * ELECTION_TICK {
                group.tick();
                if let Some(leader) = group.leader() {
                    seq += 1;
                    // A leader cut off or stepping down may drop it: that is not checked here.
                    let _ = group.propose(leader, &sample_proposal("chaos", seq));
                }
            }
        }
        group.isolate(None);
        for _ in 0..4 * ELECTION_TICK {
            group.tick();
        }
        let commit = [1, 2, 3].map(|id| group.node(id).raft.raft_log.committed).into_iter().min().unwrap();
        assert!(commit >= 50, "seed {seed}: only {commit} entries committed everywhere");
        for id in [2, 3] {
            assert_eq!(log_of(&group, id, commit), log_of(&group, 1, commit), "seed {seed}: replica {id}'s log");
            let shared = group.applied(id).len().min(group.applied(1).len());
            assert_eq!(group.applied(id)[..shared], group.applied(1)[..shared], "seed {seed}: replica {id} applied");
        }
    }
}

// ---- one refusal per error, each from an honest message with one thing broken ----

/// The last honest delivery of `kind` that `form` picks.
fn honest(kind: W, form: impl Fn(&Delivered) -> bool) -> Delivered {
    honest_deliveries()
        .iter()
        .rev()
        .find(|delivered| delivered.message.msg_type == kind as i32 && form(delivered))
        .unwrap_or_else(|| panic!("the honest run delivered no such {kind:?}"))
        .clone()
}

fn append_with_entries() -> Delivered {
    honest(W::Append, |d| d.message.entries.len() >= 2 && d.message.entries.iter().all(|e| !e.data.is_empty()))
}

fn heartbeat() -> Delivered {
    honest(W::Heartbeat, |d| d.message.commit > 0)
}

/// An acknowledgement as its leader received it.
fn append_ack() -> Delivered {
    honest(W::AppendResponse, |d| !d.message.reject && d.view.is_leader && d.view.term == d.message.term)
}

fn append_reject() -> Delivered {
    honest(W::AppendResponse, |d| d.message.reject && d.view.is_leader && d.view.term == d.message.term)
}

fn vote_request() -> Delivered {
    honest(W::RequestVote, |d| d.message.index > 0)
}

/// Checks `sample` passes, then breaks it with `edit` and returns the refusal.
fn refused(sample: Delivered, edit: impl FnOnce(&mut proto::RaftMessage, &mut Receiver)) -> RaftWireError {
    let Delivered { mut message, mut view } = sample;
    if let Err(error) = message_from_wire(message.clone(), &view) {
        panic!("the honest sample {message:?} was refused at {view:?}: {error}");
    }
    edit(&mut message, &mut view);
    match message_from_wire(message.clone(), &view) {
        Ok(_) => panic!("{message:?} was accepted at {view:?}"),
        Err(error) => error,
    }
}

#[test]
fn unknown_message_types_are_refused() {
    for value in [19, 20, 1000, -1] {
        assert_eq!(refused(heartbeat(), |m, _| m.msg_type = value), RaftWireError::UnknownMessageType(value));
    }
}

#[test]
fn unknown_entry_types_are_refused() {
    assert_eq!(refused(append_with_entries(), |m, _| m.entries[1].entry_type = 3), RaftWireError::UnknownEntryType(3));
}

#[test]
fn local_and_forwarded_types_are_refused() {
    let local = [
        (W::Hup, MessageType::MsgHup),
        (W::Beat, MessageType::MsgBeat),
        (W::Propose, MessageType::MsgPropose),
        (W::Unreachable, MessageType::MsgUnreachable),
        (W::SnapStatus, MessageType::MsgSnapStatus),
        (W::CheckQuorum, MessageType::MsgCheckQuorum),
        (W::TransferLeader, MessageType::MsgTransferLeader),
        (W::ReadIndex, MessageType::MsgReadIndex),
        (W::ReadIndexResp, MessageType::MsgReadIndexResp),
    ];
    for (wire_type, kind) in local {
        assert_eq!(refused(heartbeat(), |m, _| m.msg_type = wire_type as i32), RaftWireError::NotAWireType(kind));
        // As raft-rs forwards them: term 0, entries.
        let forwarded = refused(append_with_entries(), |m, _| {
            m.msg_type = wire_type as i32;
            m.term = 0;
        });
        assert_eq!(forwarded, RaftWireError::NotAWireType(kind));
    }
}

#[test]
fn snapshots_are_refused() {
    let error = refused(append_with_entries(), |m, _| {
        m.msg_type = W::Snapshot as i32;
        m.entries.clear();
        m.snapshot = Some(proto::RaftSnapshot {
            data: Vec::new(),
            metadata: Some(proto::RaftSnapshotMetadata { conf_state: None, index: m.index, term: m.log_term }),
        });
    });
    assert_eq!(error, RaftWireError::SnapshotUnsupported);
}

#[test]
fn term_zero_is_refused_on_every_wire_type() {
    let samples = [
        (append_with_entries(), MessageType::MsgAppend),
        (heartbeat(), MessageType::MsgHeartbeat),
        (append_ack(), MessageType::MsgAppendResponse),
        (vote_request(), MessageType::MsgRequestVote),
        (honest(W::RequestPreVote, |_| true), MessageType::MsgRequestPreVote),
        (honest(W::RequestVoteResponse, |_| true), MessageType::MsgRequestVoteResponse),
        (honest(W::RequestPreVoteResponse, |_| true), MessageType::MsgRequestPreVoteResponse),
        (honest(W::HeartbeatResponse, |_| true), MessageType::MsgHeartbeatResponse),
        (honest(W::TimeoutNow, |_| true), MessageType::MsgTimeoutNow),
    ];
    for (sample, kind) in samples {
        assert_eq!(refused(sample, |m, _| m.term = 0), RaftWireError::ZeroTerm(kind));
    }
}

#[test]
fn a_message_for_another_replica_is_refused() {
    let sample = heartbeat();
    let me = sample.view.me;
    let other = [1, 2, 3].into_iter().find(|&id| id != me && id != sample.message.from).unwrap();
    assert_eq!(refused(sample.clone(), |m, _| m.to = other), RaftWireError::WrongReceiver { to: other, me });
    assert_eq!(refused(sample, |m, _| m.to = 0), RaftWireError::WrongReceiver { to: 0, me });
}

#[test]
fn a_message_claiming_another_sender_or_the_receiver_itself_is_refused() {
    let sample = append_with_entries();
    let (me, sender) = (sample.view.me, sample.view.sender);
    let third = [1, 2, 3].into_iter().find(|&id| id != me && id != sender).unwrap();
    assert_eq!(refused(sample.clone(), |m, _| m.from = third), RaftWireError::WrongSender { from: third, sender });
    assert_eq!(refused(sample.clone(), |m, _| m.from = 0), RaftWireError::WrongSender { from: 0, sender });
    // Even if the transport bound the peer to the receiver's own id, it is not a peer.
    let error = refused(sample, |m, view| {
        m.from = me;
        view.sender = me;
    });
    assert_eq!(error, RaftWireError::WrongSender { from: me, sender: me });
}

#[test]
fn election_priorities_are_refused() {
    for priority in [1, -1, i64::MIN] {
        assert_eq!(refused(vote_request(), |m, _| m.priority = priority), RaftWireError::PriorityUnsupported);
    }
    assert_eq!(refused(vote_request(), |m, _| m.deprecated_priority = 1), RaftWireError::PriorityUnsupported);
}

#[test]
fn snapshot_requests_are_refused() {
    let error = refused(append_reject(), |m, _| m.request_snapshot = m.index);
    assert_eq!(error, RaftWireError::RequestSnapshotUnsupported);
}

#[test]
fn fields_a_type_never_carries_are_refused() {
    let unexpected = |kind, field| RaftWireError::UnexpectedField { kind, field };
    let with_snapshot = refused(append_with_entries(), |m, _| m.snapshot = Some(proto::RaftSnapshot::default()));
    assert_eq!(with_snapshot, unexpected(MessageType::MsgAppend, "snapshot"));
    let entries = append_with_entries().message.entries;
    let with_entries = refused(heartbeat(), |m, _| m.entries = entries);
    assert_eq!(with_entries, unexpected(MessageType::MsgHeartbeat, "entries"));
    assert_eq!(refused(heartbeat(), |m, _| m.reject = true), unexpected(MessageType::MsgHeartbeat, "reject"));
    assert_eq!(refused(vote_request(), |m, _| m.reject_hint = 1), unexpected(MessageType::MsgRequestVote, "reject"));
}

#[test]
fn oversized_contexts_and_batches_are_refused() {
    let long = vec![7; MAX_CONTEXT_BYTES + 1];
    let too_large = |what, length, max| RaftWireError::TooLarge { what, length, max };
    let context = long.clone();
    let error = refused(heartbeat(), |m, _| m.context = context);
    assert_eq!(error, too_large("the context", MAX_CONTEXT_BYTES + 1, MAX_CONTEXT_BYTES));
    let error = refused(append_with_entries(), |m, _| m.entries[1].context = long);
    assert_eq!(error, too_large("an entry's context", MAX_CONTEXT_BYTES + 1, MAX_CONTEXT_BYTES));
    let error = refused(append_with_entries(), |m, _| {
        let first = m.entries[0].clone();
        m.entries = (0..=MAX_ENTRIES_PER_MESSAGE as u64)
            .map(|offset| proto::RaftEntry { index: first.index + offset, ..first.clone() })
            .collect();
    });
    assert_eq!(error, too_large("the number of entries", MAX_ENTRIES_PER_MESSAGE + 1, MAX_ENTRIES_PER_MESSAGE));
}

#[test]
fn an_index_and_its_term_must_both_be_zero_or_neither() {
    let sample = append_with_entries();
    let index = sample.message.index;
    assert!(index >= 1);
    assert_eq!(refused(sample.clone(), |m, _| m.log_term = 0), RaftWireError::ZeroLogTerm { index, log_term: 0 });
    let error = refused(sample, |m, _| {
        m.index = 0;
        for (position, entry) in m.entries.iter_mut().enumerate() {
            entry.index = 1 + position as u64;
        }
    });
    assert!(matches!(error, RaftWireError::ZeroLogTerm { index: 0, log_term } if log_term >= 1), "{error:?}");
    let vote = vote_request();
    let index = vote.message.index;
    assert_eq!(refused(vote, |m, _| m.log_term = 0), RaftWireError::ZeroLogTerm { index, log_term: 0 });
}

#[test]
fn indexes_near_overflow_are_refused() {
    for index in [MAX_INDEX + 1, u64::MAX] {
        let error = refused(append_with_entries(), |m, _| m.index = index);
        assert_eq!(error, RaftWireError::IndexTooHigh { index, max: MAX_INDEX });
    }
}

#[test]
fn entries_must_follow_the_index_one_by_one() {
    let sample = append_with_entries();
    let first = sample.message.index + 1;
    let not_contiguous = |position, expected, found| RaftWireError::EntriesNotContiguous { position, expected, found };
    let gap = refused(sample.clone(), |m, _| m.entries[1].index += 1);
    assert_eq!(gap, not_contiguous(1, first + 1, first + 2));
    let duplicate = refused(sample.clone(), |m, _| m.entries[1].index = first);
    assert_eq!(duplicate, not_contiguous(1, first + 1, first));
    let back = refused(sample.clone(), |m, _| m.entries[1].index = first - 1);
    assert_eq!(back, not_contiguous(1, first + 1, first - 1));
    let gap_in_front = refused(sample.clone(), |m, _| m.index -= 1);
    assert_eq!(gap_in_front, not_contiguous(0, first - 1, first));
    let past_the_index = refused(sample, |m, _| m.entries[0].index = first + 5);
    assert_eq!(past_the_index, not_contiguous(0, first, first + 5));
}

#[test]
fn entry_terms_must_rise_from_the_log_term_to_the_message_term() {
    let sample = append_with_entries();
    let (term, log_term) = (sample.message.term, sample.message.log_term);
    let first = sample.message.index + 1;
    let out_of_order = |index, term, low, high| RaftWireError::EntryTermOutOfOrder { index, term, low, high };
    let zero = refused(sample.clone(), |m, _| m.entries[0].term = 0);
    assert_eq!(zero, out_of_order(first, 0, log_term, term));
    let above = refused(sample.clone(), |m, _| m.entries[1].term = term + 1);
    assert_eq!(above, out_of_order(first + 1, term + 1, sample.message.entries[0].term, term));
    // Entries below the term of the entry they follow: raise the log term past theirs.
    let below = refused(sample.clone(), |m, _| m.log_term = m.entries[0].term + 1);
    assert_eq!(below, out_of_order(first, sample.message.entries[0].term, sample.message.entries[0].term + 1, term));
    // A term going back along the entries: raise the first past the second.
    let second_term = sample.message.entries[1].term;
    if second_term < term {
        let decreasing = refused(sample, |m, _| m.entries[0].term = second_term + 1);
        assert_eq!(decreasing, out_of_order(first + 1, second_term, second_term + 1, term));
    }
}

#[test]
fn membership_change_entries_are_refused() {
    for entry_type in [proto::RaftEntryType::ConfChange, proto::RaftEntryType::ConfChangeV2] {
        let sample = append_with_entries();
        let index = sample.message.entries[0].index;
        let error = refused(sample, |m, _| m.entries[0].entry_type = entry_type as i32);
        assert_eq!(error, RaftWireError::ConfChangeUnsupported { index });
    }
}

#[test]
fn entries_must_hold_proposals() {
    let sample = append_with_entries();
    let index = sample.message.entries[1].index;
    let garbage = refused(sample.clone(), |m, _| m.entries[1].data = vec![0xff; 9]);
    assert!(matches!(garbage, RaftWireError::BadEntry { index: i, .. } if i == index), "{garbage:?}");
    let zero_seq = wire::encode_proposal(&Proposal { seq: 0, ..sample_proposal("zero", 1) });
    let error = refused(sample, |m, _| m.entries[1].data = zero_seq);
    let zero = wire::WireError::ZeroSequence.to_string();
    assert!(
        matches!(&error, RaftWireError::BadEntry { index: i, reason } if *i == index && reason.reason.contains(&zero)),
        "{error:?}"
    );
}

#[test]
fn a_second_leader_in_a_term_is_refused() {
    // A follower that knows its leader hears another replica lead the same term.
    let sample = heartbeat();
    let (me, leader, term) = (sample.view.me, sample.view.leader, sample.message.term);
    assert_eq!((sample.view.term, sample.message.from), (term, leader));
    let other = [1, 2, 3].into_iter().find(|&id| id != me && id != leader).unwrap();
    let forged = |other: u64| {
        move |m: &mut proto::RaftMessage, view: &mut Receiver| {
            m.from = other;
            view.sender = other;
        }
    };
    assert_eq!(refused(sample, forged(other)), RaftWireError::SecondLeader { from: other, term, leader });
    let append = append_with_entries();
    let (leader, term) = (append.view.leader, append.message.term);
    assert_eq!(append.view.term, term);
    let other = [1, 2, 3].into_iter().find(|&id| id != append.view.me && id != leader).unwrap();
    assert_eq!(refused(append, forged(other)), RaftWireError::SecondLeader { from: other, term, leader });
    // The leader itself hears a follower of its term claim to lead it.
    let at_leader = append_ack();
    let (me, from, term) = (at_leader.view.me, at_leader.message.from, at_leader.message.term);
    let error = refused(at_leader, |m, _| {
        m.msg_type = W::Heartbeat as i32;
        (m.index, m.commit) = (0, 0);
    });
    assert_eq!(error, RaftWireError::SecondLeader { from, term, leader: me });
}

#[test]
fn a_heartbeat_committing_past_the_log_is_refused() {
    let sample = heartbeat();
    let last_index = sample.view.last_index;
    let error = refused(sample, |m, _| m.commit = last_index + 1);
    assert_eq!(error, RaftWireError::CommitBeyondLog { commit: last_index + 1, last_index });
}

#[test]
fn timeout_now_from_another_than_the_leader_is_refused() {
    let sample = honest(W::TimeoutNow, |_| true);
    let (me, leader, term) = (sample.view.me, sample.view.leader, sample.message.term);
    let other = [1, 2, 3].into_iter().find(|&id| id != me && id != leader).unwrap();
    let error = refused(sample.clone(), |m, view| {
        m.from = other;
        view.sender = other;
    });
    assert_eq!(error, RaftWireError::NotFromLeader { from: other, term });
    assert_eq!(refused(sample, |m, _| m.term += 1), RaftWireError::NotFromLeader { from: leader, term: term + 1 });
}

#[test]
fn an_ack_past_the_leaders_log_is_refused() {
    let sample = append_ack();
    let last_index = sample.view.last_index;
    let error = refused(sample, |m, _| m.index = last_index + 1);
    assert_eq!(error, RaftWireError::AckBeyondLog { index: last_index + 1, last_index });
}

#[test]
fn a_rejection_hint_past_the_probe_or_the_log_is_refused() {
    let sample = append_reject();
    let (index, hint, last_index) = (sample.message.index, sample.message.reject_hint, sample.view.last_index);
    let bad_hint = |index, hint| RaftWireError::BadRejectHint { index, hint, last_index };
    assert_eq!(refused(sample.clone(), |m, _| m.reject_hint = index + 1), bad_hint(index, index + 1));
    assert_eq!(refused(sample, |m, _| m.index = last_index + 1), bad_hint(last_index + 1, hint));
}

// ---- the checks are needed: raft-rs panics on what the worst of them refuse ----

/// Steps `message` unchecked into replica `to`: whether raft-rs panicked, and its message.
fn step_unchecked(group: &mut RaftGroup, to: u64, message: proto::RaftMessage) -> Option<String> {
    let message = message_into_raft_unchecked(message).unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| group.node_mut(to).step(message)));
    outcome.err().map(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
            .unwrap_or_default()
    })
}

/// Replica 2 of a steady group, with the last heartbeat and append its leader sent it.
fn steady_follower() -> (RaftGroup, proto::RaftMessage, proto::RaftMessage) {
    let group = Scenario::Steady.build(crate::fuzzing::raft_group::Delivery::Honest, true);
    let to_two = |kind: W| {
        group
            .record
            .as_ref()
            .unwrap()
            .iter()
            .rev()
            .find(|d| d.message.msg_type == kind as i32 && d.message.to == 2)
            .unwrap()
            .message
            .clone()
    };
    let (heartbeat, append) = (to_two(W::Heartbeat), to_two(W::Append));
    (group, heartbeat, append)
}

#[test]
fn raft_panics_on_a_heartbeat_committing_past_its_log_and_the_check_refuses_it() {
    let (mut group, heartbeat, _) = steady_follower();
    let view = Receiver::of(group.node(2), 1);
    assert!(message_from_wire(heartbeat.clone(), &view).is_ok());
    let forged = proto::RaftMessage { commit: view.last_index + 1, ..heartbeat.clone() };
    assert_eq!(
        message_from_wire(forged.clone(), &view),
        Err(RaftWireError::CommitBeyondLog { commit: view.last_index + 1, last_index: view.last_index })
    );
    // The honest heartbeat steps fine; the forged one brings raft-rs down.
    assert_eq!(step_unchecked(&mut group, 2, heartbeat), None);
    let panic = step_unchecked(&mut group, 2, forged).expect("raft-rs took a commit past its log");
    assert!(panic.contains("out of range"), "{panic}");
}

#[test]
fn raft_panics_on_a_zero_term_entry_past_its_log_and_the_check_refuses_it() {
    let (mut group, _, append) = steady_follower();
    let view = Receiver::of(group.node(2), 1);
    let last = view.last_index;
    let last_term = group.node(2).raft.raft_log.term(last).unwrap();
    // Follows the follower's last entry correctly, then claims index last + 1 at term 0.
    let data = wire::encode_proposal(&sample_proposal("forged", 1));
    let forged = proto::RaftMessage {
        index: last,
        log_term: last_term,
        commit: last + 1,
        entries: vec![proto::RaftEntry { term: 0, index: last + 1, data: data.clone(), ..Default::default() }],
        ..append.clone()
    };
    assert_eq!(
        message_from_wire(forged.clone(), &view),
        Err(RaftWireError::EntryTermOutOfOrder { index: last + 1, term: 0, low: last_term, high: append.term })
    );
    // The same entry at its real term is taken; at term 0 raft-rs commits past its log.
    let honest_entry = proto::RaftEntry { term: append.term, index: last + 1, data, ..Default::default() };
    let honest = proto::RaftMessage { entries: vec![honest_entry], commit: last, ..forged.clone() };
    assert!(message_from_wire(honest, &view).is_ok());
    let panic = step_unchecked(&mut group, 2, forged).expect("raft-rs took a zero-term entry");
    assert!(panic.contains("out of range"), "{panic}");
}

// ---- random honest-shaped messages round-trip ----

/// A message and a receiver's view it is honest at, as raft-rs 0.7 would build them.
fn honest_shaped() -> impl Strategy<Value = (eraftpb::Message, Receiver)> {
    let proposal =
        ("[a-z]{1,8}", 1..1000u64).prop_map(|(client, seq)| wire::encode_proposal(&sample_proposal(&client, seq)));
    let entry_data = prop_oneof![1 => Just(Vec::new()), 3 => proposal];
    let common = (1..1000u64, 0..1000u64, 0..1000u64, proptest::collection::vec(0..=MAX_CONTEXT_BYTES as u8, 0..2));
    (0..9usize, common, proptest::collection::vec((0..3u64, entry_data), 0..6), any::<bool>(), any::<u64>()).prop_map(
        |(kind, (term, index, commit, context), entries, flag, seed)| {
            let log_term = if index == 0 { 0 } else { 1 + seed % term };
            let mut message = eraftpb::Message { to: 2, from: 1, term, ..Default::default() };
            let mut view = Receiver { me: 2, sender: 1, term, is_leader: false, leader: 1, last_index: index + commit };
            let context_bytes = vec![7u8; usize::from(context.first().copied().unwrap_or(0))];
            match kind {
                0 => {
                    message.set_msg_type(MessageType::MsgAppend);
                    (message.index, message.log_term, message.commit) = (index, log_term, commit);
                    let mut entry_term = log_term.max(1);
                    let built: Vec<eraftpb::Entry> = entries
                        .into_iter()
                        .enumerate()
                        .map(|(position, (step, data))| {
                            entry_term = (entry_term + step).min(term);
                            let mut entry = eraftpb::Entry {
                                term: entry_term,
                                index: index + 1 + position as u64,
                                ..Default::default()
                            };
                            entry.data = data.into();
                            entry
                        })
                        .collect();
                    message.set_entries(built.into());
                    view.leader = if flag { 1 } else { 0 };
                }
                1 => {
                    message.set_msg_type(MessageType::MsgHeartbeat);
                    message.commit = commit.min(view.last_index);
                    message.context = context_bytes.into();
                }
                2 => {
                    message.set_msg_type(MessageType::MsgHeartbeatResponse);
                    message.commit = commit;
                    message.context = context_bytes.into();
                }
                3 | 4 => {
                    // At the leader, of its term.
                    message.set_msg_type(MessageType::MsgAppendResponse);
                    view = Receiver { is_leader: true, leader: 2, ..view };
                    (message.index, message.commit) = (index, commit);
                    if kind == 4 {
                        (message.reject, message.reject_hint, message.log_term) = (true, seed % (index + 1), log_term);
                    }
                }
                5 | 6 => {
                    let pre = kind == 6;
                    message.set_msg_type(if pre {
                        MessageType::MsgRequestPreVote
                    } else {
                        MessageType::MsgRequestVote
                    });
                    (message.index, message.log_term, message.commit) = (index, log_term, commit);
                    message.commit_term = if commit == 0 { 0 } else { 1 + seed % term };
                    if flag {
                        message.context = b"CampaignTransfer".to_vec().into();
                    }
                    view.term = term.saturating_sub(1).max(1);
                }
                7 => {
                    message.set_msg_type(if flag {
                        MessageType::MsgRequestVoteResponse
                    } else {
                        MessageType::MsgRequestPreVoteResponse
                    });
                    message.reject = seed % 2 == 1;
                    if message.reject {
                        (message.commit, message.commit_term) = (commit, if commit == 0 { 0 } else { 1 + seed % term });
                    }
                }
                _ => message.set_msg_type(MessageType::MsgTimeoutNow),
            }
            (message, view)
        },
    )
}

proptest! {
    #[test]
    fn honest_shaped_messages_round_trip((message, view) in honest_shaped()) {
        let bytes = message_to_wire(message.clone()).encode_to_vec();
        let decoded = proto::RaftMessage::decode(bytes.as_slice()).unwrap();
        let back = message_from_wire(decoded, &view);
        prop_assert_eq!(back, Ok(message));
    }
}
