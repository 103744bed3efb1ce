//! A restarted backup catching up from its primary, step by step: it asks at its start (a
//! fresh node does not), asks again at each check until the primary answers, and the
//! primary sends every record of the shard again to that backup alone.

use crate::messages::{Fetch, FetchTable, RefusalKind, Replicate, Request, Response, Resync};
use crate::Dkv;
use virga_net::role::{CallId, Command, Event, Role, TimerId};
use virga_net::NetError;
use virga_storage::Timestamp;

use crate::layout::{Partitioning, ShardId, ShardMap};
use crate::shard::{DataConfig, DataCore, DataIo, DataIoDone, ShardRecord, WriteOp};

pub(super) const T0: u64 = 1_000_000_000_000;

pub(super) fn map() -> ShardMap {
    let nodes: Vec<String> = (0..3).map(|index| format!("n{index}")).collect();
    ShardMap::place(&nodes, Partitioning::Hash { shards: 1 }, 1).unwrap()
}

pub(super) fn roles() -> (String, Vec<String>) {
    let map = map();
    let group = map.group(ShardId(0)).unwrap();
    (group.primary.clone(), group.backups.clone())
}

fn records() -> Vec<(u32, ShardRecord)> {
    let txn = crate::shard::replica::txn_id(1, 1);
    let write = WriteOp { key: bytes::Bytes::from_static(b"k"), value: Some(bytes::Bytes::from_static(b"v")) };
    let prepared = ShardRecord::Prepared {
        txn,
        commit_ts: Timestamp::new(T0 - 1_000, 1),
        writes: vec![write],
        participants: vec![0],
        takeover_of: vec![],
    };
    vec![(0, prepared), (0, ShardRecord::Decided { txn, commit: true })]
}

/// Steps `event`, completing every log append at once; returns the other commands.
pub(super) fn step(core: &mut DataCore, event: Event<Dkv, DataIoDone, ()>) -> Vec<Command<Dkv, DataIo>> {
    let mut pending = vec![event];
    let mut commands = Vec::new();
    while let Some(event) = pending.pop() {
        let mut out = Vec::new();
        core.step(T0, event, &mut out);
        for command in out {
            match command {
                Command::Io { io, op: DataIo::Append { records, .. } } => {
                    pending.push(Event::IoDone { io, result: DataIoDone::Appended(Ok(records.len() as u64)) });
                }
                other => commands.push(other),
            }
        }
    }
    commands
}

fn resync_calls(commands: &[Command<Dkv, DataIo>]) -> Vec<(String, CallId, Resync)> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::Call { to, call, request: Request::Resync(resync), .. } => Some((to.clone(), *call, *resync)),
            _ => None,
        })
        .collect()
}

pub(super) fn check_timer(commands: &[Command<Dkv, DataIo>]) -> Option<TimerId> {
    commands.iter().rev().find_map(|command| match command {
        Command::SetTimer { timer, .. } => Some(*timer),
        _ => None,
    })
}

#[test]
fn a_restarted_backup_asks_its_primary_until_it_answers_and_a_fresh_one_does_not() {
    let (primary, backups) = roles();
    let mut fresh = DataCore::new(DataConfig::new(backups[0].clone(), map()), Vec::new());
    assert!(resync_calls(&step(&mut fresh, Event::Start)).is_empty(), "a fresh node has lost nothing");

    let mut backup = DataCore::new(DataConfig::new(backups[0].clone(), map()), records());
    backup.resync_on_start();
    let started = step(&mut backup, Event::Start);
    let asked = resync_calls(&started);
    assert_eq!(asked.len(), 1, "{started:?}");
    assert_eq!((asked[0].0.as_str(), asked[0].2), (primary.as_str(), Resync { shard: 0, epoch: 1 }));
    // No answer: asked again at the next check.
    let deadline =
        Err(NetError::DeadlineExceeded { peer: primary.clone(), after: std::time::Duration::from_millis(200) });
    step(&mut backup, Event::Response { call: asked[0].1, result: deadline });
    let timer = check_timer(&started).expect("the check is armed");
    let checked = step(&mut backup, Event::Timer(timer));
    let again = resync_calls(&checked);
    assert_eq!(again.len(), 1, "asked again: {checked:?}");
    // Answered: never asked again.
    step(&mut backup, Event::Response { call: again[0].1, result: Ok(Response::Ack) });
    let timer = check_timer(&checked).expect("the check is armed again");
    assert!(resync_calls(&step(&mut backup, Event::Timer(timer))).is_empty());
    assert_eq!(backup.stats().resyncs, 1);
}

/// The primary after its restart's takeover, with both its records held by both backups.
fn settled_primary() -> DataCore {
    let (primary, _) = roles();
    let mut core = DataCore::new(DataConfig::new(primary, map()), records());
    let mut commands = step(&mut core, Event::Start);
    while let Some(command) = commands.pop() {
        let Command::Call { call, request, .. } = command else { continue };
        let answer = match request {
            Request::Fetch(Fetch { .. }) => Response::Table(FetchTable { records: Vec::new(), lease: Timestamp::ZERO }),
            Request::Replicate(_) | Request::Lease(_) => Response::Ack,
            _ => continue,
        };
        commands.extend(step(&mut core, Event::Response { call, result: Ok(answer) }));
    }
    assert_eq!(core.replicating(), 0, "every record is on every backup");
    core
}

fn ask(core: &mut DataCore, from: &str, resync: Resync) -> (Response, Vec<Command<Dkv, DataIo>>) {
    let commands = step(core, Event::Request { from: from.into(), call: CallId(77), request: Request::Resync(resync) });
    let reply = commands.iter().find_map(|command| match command {
        Command::Reply { call: CallId(77), response, .. } => Some(response.clone()),
        _ => None,
    });
    (reply.expect("an answer"), commands)
}

#[test]
fn the_primary_sends_every_record_again_to_the_backup_that_asks_and_to_no_other() {
    let (_, backups) = roles();
    let mut primary = settled_primary();
    let (reply, commands) = ask(&mut primary, &backups[0], Resync { shard: 0, epoch: 1 });
    assert_eq!(reply, Response::Ack);
    let sent: Vec<(&str, &ShardRecord)> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Call { to, request: Request::Replicate(Replicate { record, .. }), .. } => {
                Some((to.as_str(), record))
            }
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 3, "the prepare, the decision and the settled state: {commands:?}");
    assert!(sent.iter().all(|(to, _)| *to == backups[0]), "only the backup that asked: {sent:?}");
    let kinds = |wanted: fn(&ShardRecord) -> bool| sent.iter().filter(|(_, record)| wanted(record)).count();
    assert_eq!(kinds(|record| matches!(record, ShardRecord::Prepared { .. })), 1);
    assert_eq!(kinds(|record| matches!(record, ShardRecord::Decided { .. })), 1);
    // The store's versions go along: the loaded-free store holds k's one version.
    let settled: Vec<&crate::shard::replica::SettledPart> = sent
        .iter()
        .filter_map(|(_, record)| match record {
            ShardRecord::Settled(part) => Some(part),
            _ => None,
        })
        .collect();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].versions.len(), 1, "k and its version: {settled:?}");
    assert_eq!(primary.stats().resyncs_served, 1);
    assert_eq!(primary.stats().settled_states_sent, 1);
}

#[test]
fn a_resync_from_no_backup_or_at_another_epoch_is_refused() {
    let mut primary = settled_primary();
    let (reply, _) = ask(&mut primary, "stranger", Resync { shard: 0, epoch: 1 });
    assert!(matches!(reply, Response::Refused(ref refusal) if refusal.kind == RefusalKind::Invalid), "{reply:?}");
    let (_, backups) = roles();
    let (reply, _) = ask(&mut primary, &backups[0], Resync { shard: 0, epoch: 2 });
    assert_eq!(reply, Response::WrongEpoch(1));
}
