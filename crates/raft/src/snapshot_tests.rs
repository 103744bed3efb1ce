//! Log compaction: a group whose replicas compact behind snapshots of a small state machine,
//! a follower that was away brought back by the leader's snapshot, a replica restarted from
//! its truncated records, and forged snapshots refused.

use crate::wire::{self, Checks, RaftWireError, Receiver};
use crate::{proto, EntryCheck, EntryRefusal, Output, RaftLog, Replica, ReplicaSettings};

/// The state machine: the entries applied, in order (its image: their lengths and bytes).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Machine {
    applied: Vec<Vec<u8>>,
    index: u64,
}

impl Machine {
    fn image(&self) -> Vec<u8> {
        let mut image = Vec::new();
        for data in &self.applied {
            image.extend_from_slice(&(data.len() as u32).to_le_bytes());
            image.extend_from_slice(data);
        }
        image
    }

    fn restore(index: u64, mut image: &[u8]) -> Result<Machine, EntryRefusal> {
        let mut applied = Vec::new();
        while !image.is_empty() {
            let refusal = || EntryRefusal::new("an image of applied entries", "cut short");
            let length = image.get(..4).ok_or_else(refusal)?;
            let length = u32::from_le_bytes(length.try_into().map_err(|_| refusal())?) as usize;
            let data = image.get(4..4 + length).ok_or_else(refusal)?;
            applied.push(data.to_vec());
            image = &image[4 + length..];
        }
        Ok(Machine { applied, index })
    }
}

fn check_image(image: &[u8]) -> Result<(), EntryRefusal> {
    Machine::restore(0, image).map(|_| ())
}

fn any_data(_: &[u8]) -> Result<(), EntryRefusal> {
    Ok(())
}

/// A replica with its device (the records it wrote, truncated as it says) and its machine.
struct Node {
    replica: Replica,
    disk: Vec<Vec<u8>>,
    machine: Machine,
    restored: usize,
}

fn settings(id: u64, snapshots: bool) -> ReplicaSettings {
    let mut settings = ReplicaSettings::new(id, 10, 2, id * 7);
    settings.snapshot_check = snapshots.then_some(check_image as crate::ImageCheck);
    settings
}

fn open(id: u64, disk: Vec<Vec<u8>>, snapshots: bool) -> Node {
    let log = RaftLog::replay(disk.iter().enumerate().map(|(lsn, record)| (lsn as u64, record.as_slice()))).unwrap();
    let machine = match log.snapshot_state() {
        Some((index, image)) => Machine::restore(index, image).unwrap(),
        None => Machine::default(),
    };
    let replica = Replica::new(&settings(id, snapshots), log).unwrap();
    Node { replica, disk, machine, restored: 0 }
}

fn group(snapshots: [bool; 3]) -> Vec<Node> {
    let founding = RaftLog::bootstrap_record(&[1, 2, 3]);
    (1..=3).map(|id| open(id, vec![founding.clone()], snapshots[id as usize - 1])).collect()
}

impl Node {
    /// Carries out an output: the machine restored or advanced, writes done at once (and
    /// the device truncated before a standalone record); returns the messages.
    fn carry_out(&mut self, mut out: Output) -> Vec<(u64, Vec<proto::RaftMessage>)> {
        loop {
            if let Some((index, image)) = out.restored.take() {
                self.machine = Machine::restore(index, &image).unwrap();
                self.restored += 1;
            }
            for entry in out.committed.drain(..) {
                assert_eq!(entry.index, self.machine.index + 1, "entries apply in order, after the snapshot");
                self.machine.index = entry.index;
                if !entry.data.is_empty() {
                    self.machine.applied.push(entry.data.to_vec());
                }
            }
            let Some(records) = out.write.take() else { break };
            let first_kept = out.truncate_before.take().map(|position| self.disk.len() + position);
            self.disk.extend(records);
            if let Some(first_kept) = first_kept {
                self.disk.drain(..first_kept);
            }
            let mut more = Output { messages: std::mem::take(&mut out.messages), ..Output::default() };
            self.replica.written(&mut more);
            out = more;
        }
        out.messages.into_iter().collect()
    }
}

/// Drains every node, carrying its output out; the messages, as (from, to, batch).
fn drain_all(nodes: &mut [Node]) -> Vec<(u64, u64, Vec<proto::RaftMessage>)> {
    let mut mail = Vec::new();
    for node in nodes.iter_mut() {
        let mut out = Output::default();
        node.replica.drain(&mut out);
        let from = node.replica.id();
        mail.extend(node.carry_out(out).into_iter().map(|(to, messages)| (from, to, messages)));
    }
    mail
}

/// Drains every node and delivers messages until quiet; nothing reaches or leaves `away`
/// (its sender hears the batch was not delivered).
fn settle(nodes: &mut [Node], away: Option<u64>) {
    let check: EntryCheck<'_> = &any_data;
    for _ in 0..1000 {
        let mail = drain_all(nodes);
        if mail.is_empty() {
            return;
        }
        for (from, to, messages) in mail {
            if away == Some(to) || away == Some(from) {
                nodes[from as usize - 1].replica.unreachable(to);
                continue;
            }
            let refused = nodes[to as usize - 1].replica.step_batch(from, messages, check);
            assert!(refused.is_empty(), "{refused:?}");
        }
    }
    panic!("the group never went quiet");
}

fn elect(nodes: &mut [Node], away: Option<u64>) -> usize {
    for _ in 0..60 {
        nodes.iter_mut().for_each(|node| node.replica.tick());
        settle(nodes, away);
        if let Some(leader) = nodes.iter().position(|node| node.replica.is_leader()) {
            return leader;
        }
    }
    panic!("no leader within 60 ticks");
}

/// A group whose replica 3 is away while 30 entries commit; the leader's position.
fn thirty_entries_without_replica_3(snapshots: [bool; 3]) -> (Vec<Node>, usize) {
    let mut nodes = group(snapshots);
    let leader = elect(&mut nodes, Some(3));
    for seq in 0..30u32 {
        nodes[leader].replica.propose(format!("entry-{seq}").into_bytes()).unwrap();
        settle(&mut nodes, Some(3));
    }
    (nodes, leader)
}

/// Replica 3 is away while 30 entries commit and the others compact behind them; then it
/// comes back. Returns the nodes and the leader's position.
fn away_while_the_others_compact(snapshots: [bool; 3]) -> (Vec<Node>, usize) {
    let (mut nodes, leader) = thirty_entries_without_replica_3(snapshots);
    for node in nodes.iter_mut().take(2) {
        let (index, image) = (node.machine.index, node.machine.image());
        node.replica.compact(index, image).unwrap();
        let mut out = Output::default();
        node.replica.drain(&mut out);
        assert!(out.truncate_before.is_some(), "the compaction's record stands alone");
        node.carry_out(out);
        assert_eq!(node.replica.log_extent(), (index + 1, 0), "the log starts after the snapshot");
        assert_eq!(node.disk.len(), 1, "the device keeps the standalone record alone");
    }
    for _ in 0..10 {
        nodes.iter_mut().for_each(|node| node.replica.tick());
        settle(&mut nodes, None);
    }
    (nodes, leader)
}

#[test]
fn a_follower_that_was_away_is_brought_back_by_the_leaders_snapshot() {
    let (mut nodes, leader) = away_while_the_others_compact([true; 3]);
    assert_eq!(nodes[2].restored, 1, "replica 3 installed one snapshot");
    assert_eq!(nodes[2].machine, nodes[leader].machine);
    assert_eq!(nodes[2].machine.applied.len(), 30);
    // It goes on from there like the others.
    nodes[leader].replica.propose(b"after".to_vec()).unwrap();
    settle(&mut nodes, None);
    assert!(nodes.iter().all(|node| node.machine == nodes[leader].machine));
    assert_eq!(nodes[2].machine.applied.last().map(Vec::as_slice), Some(&b"after"[..]));
}

#[test]
fn a_group_that_takes_no_snapshots_leaves_a_follower_behind_a_compacted_log() {
    // The broken variant: replica 3 refuses snapshots (no image check), so once the others
    // compacted it never catches up; the test above fails exactly when snapshots do not work.
    let (mut nodes, _) = thirty_entries_without_replica_3([true, true, false]);
    for node in nodes.iter_mut().take(2) {
        let (index, image) = (node.machine.index, node.machine.image());
        node.replica.compact(index, image).unwrap();
    }
    let check: EntryCheck<'_> = &any_data;
    let mut refused = Vec::new();
    for _ in 0..10 {
        for node in nodes.iter_mut() {
            node.replica.tick();
        }
        let mail = drain_all(&mut nodes);
        for (from, to, messages) in mail {
            refused.extend(nodes[to as usize - 1].replica.step_batch(from, messages, check));
        }
    }
    assert!(refused.contains(&RaftWireError::SnapshotUnsupported), "{refused:?}");
    assert_eq!(nodes[2].restored, 0);
    assert!(nodes[2].machine.applied.len() < 30);
}

#[test]
fn a_replica_restarted_from_its_truncated_records_has_the_same_state_and_log() {
    let (mut nodes, leader) = away_while_the_others_compact([true; 3]);
    nodes[leader].replica.propose(b"tail".to_vec()).unwrap();
    settle(&mut nodes, None);
    for (position, node) in nodes.iter().enumerate() {
        let mut restarted = open(node.replica.id(), node.disk.clone(), true);
        let mut out = Output::default();
        restarted.replica.drain(&mut out);
        restarted.carry_out(out);
        assert_eq!(restarted.machine, node.machine, "replica {}", position + 1);
        assert_eq!(restarted.replica.log_extent(), node.replica.log_extent());
    }
}

#[test]
fn a_compaction_past_what_is_applied_is_refused() {
    let mut nodes = group([true; 3]);
    let leader = elect(&mut nodes, None);
    let applied = nodes[leader].machine.index;
    assert!(nodes[leader].replica.compact(applied + 5, Vec::new()).is_err());
    let image = nodes[leader].machine.image();
    nodes[leader].replica.compact(applied, image).unwrap();
    assert!(nodes[leader].replica.compact(applied, Vec::new()).is_err(), "already compacted there");
}

fn snapshot_message(voters: Vec<u64>, image: Vec<u8>, term: u64) -> proto::RaftMessage {
    proto::RaftMessage {
        msg_type: proto::RaftMessageType::Snapshot as i32,
        to: 2,
        from: 1,
        term: 3,
        snapshot: Some(proto::RaftSnapshot {
            data: image,
            metadata: Some(proto::RaftSnapshotMetadata {
                conf_state: Some(proto::RaftConfState { voters, ..Default::default() }),
                index: 40,
                term,
            }),
        }),
        ..Default::default()
    }
}

#[test]
fn forged_snapshots_are_refused_before_raft_sees_them() {
    let at = Receiver { me: 2, sender: 1, term: 3, is_leader: false, leader: 1, last_index: 10 };
    let image: crate::ImageCheck = check_image;
    let checks = Checks { entry: &any_data, snapshot: Some(&image), voters: &[1, 2, 3] };
    let good = Machine { applied: vec![b"a".to_vec()], index: 40 }.image();
    assert!(wire::message_from_wire_with(snapshot_message(vec![3, 1, 2], good.clone(), 2), &at, &checks).is_ok());
    let refused = |message| wire::message_from_wire_with(message, &at, &checks).unwrap_err();
    assert!(matches!(
        refused(snapshot_message(vec![1, 2, 4], good.clone(), 2)),
        RaftWireError::SnapshotMembership { .. }
    ));
    assert!(matches!(refused(snapshot_message(vec![1, 2, 3], vec![9, 0, 0, 0], 2)), RaftWireError::SnapshotImage(_)));
    assert!(matches!(refused(snapshot_message(vec![1, 2, 3], good.clone(), 4)), RaftWireError::BadSnapshot(_)));
    let mut from_other = snapshot_message(vec![1, 2, 3], good.clone(), 2);
    from_other.from = 3;
    let other = Receiver { sender: 3, ..at };
    assert!(matches!(
        wire::message_from_wire_with(from_other, &other, &checks),
        Err(RaftWireError::SecondLeader { .. })
    ));
    // A group that compacts nothing takes no snapshot at all.
    let plain = wire::message_from_wire(snapshot_message(vec![1, 2, 3], good, 2), &at, &any_data);
    assert_eq!(plain.unwrap_err(), RaftWireError::SnapshotUnsupported);
}
