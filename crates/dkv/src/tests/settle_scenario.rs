//! The settled point, step by step on three data nodes: a backup cut off from its primary
//! misses a committed transaction; the primary's settled point must stay at or below it
//! while that backup lacks its records, so that the other backup keeps the entry a later
//! takeover by the lagging backup needs. The broken variant (`settle_early`), which settles
//! on the decision alone, loses the committed write at that takeover: the check here, that
//! a committed write is in the new primary's store, catches it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Role, TimerId};
use virga_storage::{Timestamp, VersionedStore};

use crate::layout::{Partitioning, ReplicaGroup, ShardMap};
use crate::messages::{Request, Response, Watermark};
use crate::shard::wire::PrepareRequest;
use crate::shard::{DataConfig, DataCore, DataIo, DataIoDone, Weakened, WriteOp};

const SECOND: u64 = 1_000_000_000;
const T0: u64 = 1_000 * SECOND;
const CLIENT: &str = "client-1";

/// Data nodes wired together in memory: every call to a node that is up and reachable is
/// delivered, answered and its answer delivered back, until nothing moves; log appends
/// complete at once; calls to a node cut off are dropped.
struct Nodes {
    cores: BTreeMap<String, DataCore>,
    cut_off: BTreeSet<String>,
    /// Each node's latest check timer.
    checks: BTreeMap<String, TimerId>,
    /// What the client was answered.
    answers: Vec<Response>,
}

impl Nodes {
    fn step(&mut self, now: u64, node: &str, event: Event<crate::Dkv, DataIoDone, ()>) {
        let mut queue = VecDeque::from([(node.to_string(), event)]);
        while let Some((at, event)) = queue.pop_front() {
            let Some(core) = self.cores.get_mut(&at) else { continue };
            let mut out = Vec::new();
            core.step(now, event, &mut out);
            for command in out {
                match command {
                    Command::Io { io, op: DataIo::Append { records, .. } } => {
                        let done = DataIoDone::Appended(Ok(records.len() as u64));
                        queue.push_back((at.clone(), Event::IoDone { io, result: done }));
                    }
                    Command::Call { to, call, request, .. }
                        if self.cores.contains_key(&to)
                            && !self.cut_off.contains(&to)
                            && !self.cut_off.contains(&at) =>
                    {
                        queue.push_back((to, Event::Request { from: at.clone(), call, request }));
                    }
                    Command::Reply { to, response, .. } if to == CLIENT => self.answers.push(response),
                    Command::Reply { to, call, response } => {
                        queue.push_back((to, Event::Response { call, result: Ok(response) }));
                    }
                    Command::SetTimer { timer, after } if after == Duration::from_millis(100) => {
                        self.checks.insert(at.clone(), timer);
                    }
                    _ => {}
                }
            }
        }
    }

    fn check(&mut self, now: u64, node: &str) {
        let timer = self.checks[node];
        self.step(now, node, Event::Timer(timer));
    }

    fn ask(&mut self, now: u64, node: &str, request: Request) {
        self.step(now, node, Event::Request { from: CLIENT.to_string(), call: CallId(1), request });
    }
}

fn map(primary: &str, backups: [&str; 2], epoch: u64) -> ShardMap {
    let group =
        ReplicaGroup { primary: primary.to_string(), backups: backups.iter().map(|b| b.to_string()).collect(), epoch };
    ShardMap::new(Partitioning::Hash { shards: 1 }, vec![group], 1).unwrap()
}

fn config(node: &str, map: ShardMap, weakened: Weakened) -> DataConfig {
    let mut config = DataConfig::new(node, map);
    config.snapshot_window = Duration::ZERO;
    config.client_expiry = Duration::from_secs(1);
    config.weakened = weakened;
    config
}

/// Runs the scenario; returns the value of `k` the lagging backup's store holds at the end,
/// once it has taken the shard over from the other backup's table, and the client's answers.
fn lagging_backup_takes_over(weakened: Weakened) -> (Option<Bytes>, Vec<Response>) {
    let first = map("p", ["b", "c"], 1);
    let mut nodes = Nodes {
        cores: ["p", "b", "c"]
            .into_iter()
            .map(|node| (node.to_string(), DataCore::new(config(node, first.clone(), weakened), Vec::new())))
            .collect(),
        cut_off: BTreeSet::from(["c".to_string()]),
        checks: BTreeMap::new(),
        answers: Vec::new(),
    };
    for node in ["b", "c", "p"] {
        nodes.step(T0, node, Event::Start);
    }
    // T commits at p with b's acknowledgement alone; c hears nothing of it.
    let write = WriteOp { key: Bytes::from_static(b"k"), value: Some(Bytes::from_static(b"v")) };
    let prepare = PrepareRequest {
        shard: 0,
        epoch: 1,
        txn: crate::shard::txn_id(1, 1),
        commit_ts: Timestamp::new(T0 + SECOND, 1),
        reads: Vec::new(),
        writes: vec![write],
        participants: vec![0],
        scans: Vec::new(),
        commit_on_vote: true,
        validate_only: false,
        takeover_validators: Vec::new(),
    };
    nodes.ask(T0 + SECOND / 2, "p", Request::Prepare(prepare));
    // The watermark rises past T's commit (the client reads nothing below 1.5 s), and the
    // lease requests carry the settled point to b.
    nodes.check(T0 + SECOND, "p");
    let watermark = Timestamp::new(T0 + 3 * SECOND / 2, 1);
    nodes.ask(T0 + 2 * SECOND, "p", Request::Watermark(Watermark { client: 1, ts: watermark, freshness: watermark }));
    nodes.check(T0 + 2 * SECOND + 1, "p");
    nodes.check(T0 + 2 * SECOND + 2, "p");
    assert_eq!(nodes.cores["p"].replica(0).map(|replica| replica.watermark()), Some(watermark));
    // p is lost; c, back in touch, takes over from b's table.
    nodes.cores.remove("p");
    nodes.cut_off.clear();
    let second = map("c", ["b", "p"], 2);
    nodes.cores.insert("c".to_string(), DataCore::new(config("c", second, weakened), Vec::new()));
    nodes.step(T0 + 3 * SECOND, "c", Event::Start);
    let replica = nodes.cores["c"].replica(0).expect("c holds shard 0");
    let store = replica.store();
    let value = store.find(b"k").and_then(|entry| store.read_at(&entry, Timestamp::MAX).visible).and_then(|v| v.value);
    (value, nodes.answers)
}

#[test]
fn a_transaction_a_backup_lacks_is_not_settled_and_survives_its_takeover() {
    let (value, answers) = lagging_backup_takes_over(Weakened::default());
    assert!(
        answers.iter().any(|answer| matches!(answer, Response::Vote(vote) if vote.commit)),
        "T committed: {answers:?}"
    );
    assert_eq!(value, Some(Bytes::from_static(b"v")), "the committed write is in the new primary's store");
}

#[test]
fn settling_before_every_backup_holds_a_transaction_is_caught() {
    let weakened = Weakened { settle_early: true, ..Weakened::default() };
    let (value, answers) = lagging_backup_takes_over(weakened);
    assert!(answers.iter().any(|answer| matches!(answer, Response::Vote(vote) if vote.commit)));
    assert_eq!(value, None, "settled early, the committed write is lost at the takeover");
}
