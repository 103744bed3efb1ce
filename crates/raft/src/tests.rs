//! Three replicas wired together in one thread: an election, entries replicated and applied
//! in the same order everywhere, and no vote leaving before its write is done.

use std::collections::BTreeMap;

use crate::{EntryCheck, Output, RaftLog, Replica, ReplicaSettings};

fn group(size: u64) -> Vec<Replica> {
    let voters: Vec<u64> = (1..=size).collect();
    let founding = RaftLog::bootstrap_record_with(&voters, &[b"genesis".to_vec()]);
    (1..=size)
        .map(|id| {
            let log = RaftLog::replay([(0, founding.as_slice())]).unwrap();
            let settings = ReplicaSettings::new(id, 10, 2, id * 7);
            Replica::new(&settings, log).unwrap()
        })
        .collect()
}

fn any_data(_: &[u8]) -> Result<(), crate::EntryRefusal> {
    Ok(())
}

/// Drains every replica, completing writes at once, delivering messages until quiet;
/// returns what each applied.
fn settle(replicas: &mut [Replica], applied: &mut BTreeMap<u64, Vec<Vec<u8>>>) {
    let check: EntryCheck<'_> = &any_data;
    for _ in 0..1000 {
        let mut mail: Vec<(u64, u64, Vec<_>)> = Vec::new();
        for replica in replicas.iter_mut() {
            let mut out = Output::default();
            replica.drain(&mut out);
            while out.write.take().is_some() {
                replica.written(&mut out);
            }
            let id = replica.id();
            applied.entry(id).or_default().extend(out.committed.into_iter().map(|entry| entry.data.to_vec()));
            mail.extend(out.messages.into_iter().map(|(to, messages)| (id, to, messages)));
        }
        if mail.is_empty() {
            return;
        }
        for (from, to, messages) in mail {
            let refused = replicas[to as usize - 1].step_batch(from, messages, check);
            assert!(refused.is_empty(), "{refused:?}");
        }
    }
    panic!("the group never went quiet");
}

#[test]
fn a_group_elects_a_leader_and_applies_the_same_entries_everywhere() {
    let mut replicas = group(3);
    let mut applied = BTreeMap::new();
    for _ in 0..40 {
        replicas.iter_mut().for_each(Replica::tick);
        settle(&mut replicas, &mut applied);
        if replicas.iter().any(Replica::is_leader) {
            break;
        }
    }
    let leader = replicas.iter().position(Replica::is_leader).expect("a leader within 40 ticks");
    assert_eq!(replicas.iter().filter(|replica| replica.is_leader()).count(), 1);
    for data in [b"one".to_vec(), b"two".to_vec()] {
        replicas[leader].propose(data).unwrap();
        settle(&mut replicas, &mut applied);
    }
    replicas.iter_mut().for_each(Replica::tick);
    settle(&mut replicas, &mut applied);
    let wanted: Vec<Vec<u8>> = vec![b"genesis".to_vec(), b"one".to_vec(), b"two".to_vec()];
    for (id, entries) in &applied {
        let data: Vec<Vec<u8>> = entries.iter().filter(|data| !data.is_empty()).cloned().collect();
        assert_eq!(data, wanted, "replica {id}");
    }
    assert!(replicas[(leader + 1) % 3].propose(b"ignored".to_vec()).is_err(), "a follower does not propose");
}

#[test]
fn a_vote_waits_for_the_write_that_makes_it_durable() {
    let mut replicas = group(3);
    let check: EntryCheck<'_> = &any_data;
    // Replica 1 campaigns; replica 2 answers only once its write completes.
    let mut campaign = Output::default();
    for _ in 0..20 {
        replicas[0].tick();
        replicas[0].drain(&mut campaign);
        while campaign.write.take().is_some() {
            replicas[0].written(&mut campaign);
        }
        if campaign.messages.contains_key(&2) {
            break;
        }
    }
    let request = campaign.messages.remove(&2).expect("replica 1 asks replica 2 for its (pre-)vote");
    assert!(replicas[1].step_batch(1, request, check).is_empty());
    let mut out = Output::default();
    replicas[1].drain(&mut out);
    // A pre-vote needs no write; a vote does: keep stepping until a write is asked for.
    let mut rounds = 0;
    while out.write.is_none() && rounds < 10 {
        let answers = out.messages.remove(&1).unwrap_or_default();
        assert!(replicas[0].step_batch(2, answers, check).is_empty());
        let mut more = Output::default();
        replicas[0].drain(&mut more);
        while more.write.take().is_some() {
            replicas[0].written(&mut more);
        }
        if let Some(request) = more.messages.remove(&2) {
            assert!(replicas[1].step_batch(1, request, check).is_empty());
        }
        replicas[1].drain(&mut out);
        rounds += 1;
    }
    assert!(out.write.is_some(), "a vote changes the hard state, which must be written");
    assert!(replicas[1].is_writing());
    assert!(out.messages.get(&1).is_none_or(Vec::is_empty), "the vote left before its write: {:?}", out.messages);
    out.write = None;
    replicas[1].written(&mut out);
    assert!(out.messages.get(&1).is_some_and(|messages| !messages.is_empty()), "the vote goes once written");
}
