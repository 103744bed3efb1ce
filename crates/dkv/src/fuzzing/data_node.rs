//! The body of the `dkv_shard` fuzz target: requests (any bytes, or edits of honest ones)
//! stepped into a data node that leads one shard and backs up the other two, already holding
//! loaded data, a committed transaction and a prepared one; and the node's log records,
//! decoded and replayed by `open_data_node`.

use std::collections::{BTreeMap, VecDeque};

use crate::messages::{Request, Response};
use crate::proto;
use crate::Dkv;
use bytes::Bytes;
use virga_core::device::MemStorage;
use virga_log::{LogOptions, RecordLog};
use virga_net::role::{CallId, Command, Event, Role};
use virga_net::NetError;
use virga_storage::{Timestamp, TxnId, Version, VersionedStore};

use crate::layout::{Partitioning, ShardMap};
use crate::shard::wire::{self, MAX_KEY_BYTES};
use crate::shard::{
    open_data_node, txn_id, DataConfig, DataCore, DataIo, DataIoDone, DataOpenError, SettledPart, SettledTxn,
    ShardRecord, TxnStatus, WriteOp,
};

/// The three nodes: each holds every shard; `n0`, the node under test, leads shard 0 and
/// backs up shards 1 (led by `n1`) and 2 (led by `n2`).
const NODES: [&str; 3] = ["n0", "n1", "n2"];
const ME: &str = "n0";
/// Who a request may come from: the other replicas, a client, the node itself.
const SENDERS: [&str; 4] = ["n1", "n2", "client-9", ME];
/// Longest request the body decodes (a transport bounds requests too).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Most requests one input steps.
const MAX_REQUESTS_PER_INPUT: usize = 8;

/// Committed at shard 0; prepared at shards 0 and 1 (its client went quiet); committed at
/// shard 1.
const T1: TxnId = 1 << 32 | 1;
const T2: TxnId = 1 << 32 | 2;
const T3: TxnId = 2 << 32 | 1;
/// Settled before the node's log begins: only its settled state names it.
const T4: TxnId = 3 << 32 | 1;

/// Range partitioning: shard 0 below "g", shard 1 from "g" below "p", shard 2 from "p".
fn sample_map() -> ShardMap {
    let nodes: Vec<String> = NODES.iter().map(|node| node.to_string()).collect();
    let splits = vec![b"g".to_vec(), b"p".to_vec()];
    ShardMap::place(&nodes, Partitioning::Range { splits }, 1)
        .unwrap_or_else(|error| unreachable!("the sample layout: {error}"))
}

fn put(key: &str, value: &str) -> WriteOp {
    WriteOp { key: Bytes::copy_from_slice(key.as_bytes()), value: Some(Bytes::copy_from_slice(value.as_bytes())) }
}

/// The records the node under test starts from, as its log would replay them.
pub fn sample_records() -> Vec<(u32, ShardRecord)> {
    let at = Timestamp::new;
    vec![
        (
            0,
            ShardRecord::Prepared {
                txn: T1,
                commit_ts: at(10, 1),
                writes: vec![put("b", "20")],
                participants: vec![0],
                takeover_of: Vec::new(),
            },
        ),
        (0, ShardRecord::Decided { txn: T1, commit: true }),
        (
            0,
            ShardRecord::Prepared {
                txn: T2,
                commit_ts: at(30, 1),
                writes: vec![put("c", "30")],
                participants: vec![0, 1],
                takeover_of: Vec::new(),
            },
        ),
        (
            1,
            ShardRecord::Prepared {
                txn: T2,
                commit_ts: at(30, 1),
                writes: vec![put("k", "40")],
                participants: vec![0, 1],
                takeover_of: Vec::new(),
            },
        ),
        (
            1,
            ShardRecord::Prepared {
                txn: T3,
                commit_ts: at(20, 2),
                writes: vec![put("h", "33")],
                participants: vec![1],
                takeover_of: Vec::new(),
            },
        ),
        (1, ShardRecord::Decided { txn: T3, commit: true }),
        (2, ShardRecord::LeaseGranted { epoch: 1, until: at(5, 0) }),
        (2, ShardRecord::Fence { epoch: 1 }),
        (
            2,
            ShardRecord::Settled(SettledPart {
                versions: vec![(
                    Bytes::from_static(b"z"),
                    vec![
                        Version { ts: at(4, 3), writer: T4, value: None },
                        Version { ts: Timestamp::ZERO, writer: 0, value: Some(Bytes::from_static(b"1")) },
                    ],
                )],
                txns: vec![(T4, SettledTxn { commit: true, commit_ts: at(4, 3) })],
                validator_floors: vec![(1, at(4, 3))],
            }),
        ),
    ]
}

/// Keys loaded at version zero (none of them written by the sample transactions: a load
/// replaces a key's history).
const LOADED: [&str; 4] = ["a", "d", "m", "q"];

fn sample_core(leases: bool) -> DataCore {
    let mut config = DataConfig::new(ME, sample_map());
    config.leases = leases;
    let mut core = DataCore::new(config, sample_records());
    for key in LOADED {
        core.load(Bytes::from_static(key.as_bytes()), Bytes::from_static(b"1"));
    }
    core
}

/// What a refused request must leave as it was: per shard, the transaction table, the
/// fence, lease, floor and watermark, and a few reads of the store.
#[derive(Debug, PartialEq)]
struct Snapshot(Vec<ShardState>);

#[derive(Debug, PartialEq)]
struct ShardState {
    records: Vec<ShardRecord>,
    prepared: usize,
    fence: u64,
    lease: Timestamp,
    floor: Timestamp,
    watermark: Timestamp,
    reads: Vec<Option<Bytes>>,
}

const PROBED: [&str; 8] = ["a", "b", "c", "d", "h", "k", "m", "q"];

impl Snapshot {
    fn of(core: &DataCore) -> Snapshot {
        let shards = (0..NODES.len() as u32).filter_map(|shard| core.replica(shard)).map(|replica| {
            let reads = PROBED
                .iter()
                .flat_map(|key| {
                    [Timestamp::new(15, 0), Timestamp::new(35, 0), Timestamp::MAX]
                        .map(|ts| replica.store().get_at(key.as_bytes(), ts))
                })
                .collect();
            ShardState {
                records: replica.records(),
                prepared: replica.prepared_count(),
                fence: replica.fence(),
                lease: replica.lease_granted(),
                floor: replica.commit_floor(),
                watermark: replica.watermark(),
                reads,
            }
        });
        Snapshot(shards.collect())
    }
}

/// A request and its sender, formatted only when a check fails.
struct Described {
    from: String,
    request: Request,
}

impl std::fmt::Display for Described {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} from {}", self.request, self.from)
    }
}

fn check_unchanged(before: &Snapshot, core: &DataCore, described: &Described) {
    assert_eq!(&Snapshot::of(core), before, "{described} was refused but changed a replica");
}

fn is_refusal(response: &Response) -> bool {
    matches!(response, Response::Refused(_) | Response::WrongEpoch(_) | Response::TooOld(_))
}

/// What the requests of one input came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub requests: usize,
    pub refused: usize,
    /// Answered with something else than a refusal (a value, a vote, an acknowledgement...).
    pub served: usize,
    /// Prepares voted commit.
    pub commit_votes: usize,
}

/// The node under test and its driver: device writes complete and backups acknowledge
/// every replication (other calls time out), at once or, deferred, when the input says.
struct Harness {
    core: DataCore,
    next_call: u64,
    next_lsn: u64,
    /// Off only to show that a lost reply is caught.
    complete_io: bool,
    /// Device writes and calls not completed yet, in order.
    outstanding: VecDeque<Command<Dkv, DataIo>>,
    /// Every request: what it was and the replies it got.
    asked: BTreeMap<CallId, (Described, Vec<Option<Response>>)>,
    tally: Tally,
}

impl Harness {
    fn new(leases: bool) -> Harness {
        Harness {
            core: sample_core(leases),
            next_call: 1,
            next_lsn: 1,
            complete_io: true,
            outstanding: VecDeque::new(),
            asked: BTreeMap::new(),
            tally: Tally::default(),
        }
    }

    /// Steps one request, checking that a refusal changed no replica; what it sets off is
    /// left outstanding.
    fn request(&mut self, from: &str, request: Request) -> CallId {
        let call = CallId(self.next_call);
        self.next_call += 1;
        let described = Described { from: from.to_string(), request: request.clone() };
        let before = Snapshot::of(&self.core);
        let mut commands = Vec::new();
        self.core.step(0, Event::Request { from: from.to_string(), call, request }, &mut commands);
        // Refusals are immediate, in the request's own step.
        let refused =
            commands.iter().any(|command| matches!(command, Command::Reply { response, .. } if is_refusal(response)));
        if refused {
            check_unchanged(&before, &self.core, &described);
        }
        self.asked.insert(call, (described, Vec::new()));
        self.absorb(commands);
        call
    }

    /// Steps one request and completes everything outstanding; checks that it got exactly
    /// one reply and that a commit vote left the transaction prepared. Returns the reply.
    fn ask(&mut self, from: &str, request: Request) -> Option<Response> {
        let prepared = match &request {
            // A validation alone holds nothing: its commit vote prepares nothing.
            Request::Prepare(prepare) if !prepare.validate_only => Some((prepare.shard, prepare.txn)),
            _ => None,
        };
        let call = self.request(from, request);
        self.complete(usize::MAX);
        let reply = self.answer(call);
        if let (Some(Response::Vote(vote)), Some((shard, txn))) = (&reply, prepared) {
            if vote.commit {
                let status = self.core.replica(shard).and_then(|replica| replica.status(txn));
                assert!(
                    matches!(status, Some(TxnStatus::Prepared | TxnStatus::Committed)),
                    "{} was voted commit but is {status:?} at shard {shard}",
                    self.asked[&call].0
                );
            }
        }
        reply
    }

    /// The one reply `call` got.
    fn answer(&self, call: CallId) -> Option<Response> {
        let (described, replies) = &self.asked[&call];
        match replies.as_slice() {
            [reply] => reply.clone(),
            [] => panic!("no reply to {described}"),
            more => panic!("{} replies to {described}: {more:?}", more.len()),
        }
    }

    /// Completes everything outstanding, then checks every request got exactly one reply.
    fn finish(&mut self) {
        self.complete(usize::MAX);
        for call in self.asked.keys() {
            let reply = self.answer(*call);
            self.tally.requests += 1;
            if reply.as_ref().is_some_and(is_refusal) {
                self.tally.refused += 1;
            } else {
                self.tally.served += 1;
            }
            self.tally.commit_votes += usize::from(matches!(reply, Some(Response::Vote(vote)) if vote.commit));
        }
    }

    /// Records replies; keeps writes and calls outstanding.
    fn absorb(&mut self, commands: Vec<Command<Dkv, DataIo>>) {
        for command in commands {
            match command {
                Command::Reply { to, call, response } => {
                    let Some((described, replies)) = self.asked.get_mut(&call) else {
                        panic!("a reply to {call:?}, never asked")
                    };
                    assert_eq!(to, described.from, "the reply to {described} went to {to}");
                    replies.push(Some(response));
                }
                Command::SetTimer { .. } => {}
                other => self.outstanding.push_back(other),
            }
        }
        assert!(self.core.failed().is_none(), "the node failed");
    }

    /// Completes up to `count` outstanding writes and calls, oldest first (and what they set
    /// off, once `count` allows).
    fn complete(&mut self, count: usize) {
        for _ in 0..count {
            let Some(command) = self.outstanding.pop_front() else { return };
            let mut more = Vec::new();
            match command {
                Command::Io { io, op } => {
                    if !self.complete_io {
                        continue;
                    }
                    let result = self.write(op);
                    self.core.step(0, Event::IoDone { io, result }, &mut more);
                }
                Command::Call { to, call, request, .. } => {
                    // The backups hold what they are sent; nothing else is answered in time.
                    let result = match request {
                        Request::Replicate(_) => Ok(Response::Ack),
                        _ => Err(NetError::DeadlineExceeded { peer: to, after: std::time::Duration::ZERO }),
                    };
                    self.core.step(0, Event::Response { call, result }, &mut more);
                }
                Command::Reply { .. } | Command::SetTimer { .. } => {}
            }
            self.absorb(more);
        }
    }

    /// A device append: every record the node logs must come back when it restarts.
    fn write(&mut self, op: DataIo) -> DataIoDone {
        let DataIo::Append { records, .. } = op;
        for record in &records {
            match wire::decode_log_record(record) {
                Ok((shard, _)) => {
                    assert!(self.core.replica(shard).is_some(), "a record of shard {shard}, not held")
                }
                Err(error) => panic!("a record logged does not decode: {error}"),
            }
        }
        self.next_lsn += records.len() as u64;
        DataIoDone::Appended(Ok(self.next_lsn - 1))
    }
}

/// The knobs an honest request is built from, and that edits turn.
#[derive(Debug, Clone)]
struct Knobs {
    from: &'static str,
    shard: u32,
    epoch: u64,
    key: Vec<u8>,
    key2: Vec<u8>,
    ts: Timestamp,
    ts2: Timestamp,
    txn: Option<proto::TxnId>,
    commit: bool,
    reads: usize,
    writes: usize,
    /// Writes are deletes, and deletes carry a value anyway.
    delete: bool,
    delete_with_value: bool,
    scans: usize,
    participants: Vec<u32>,
    limit: u32,
    /// The replicated record: prepared, decided, lease, fence, none.
    record: u8,
    /// KAIROS validators a prepare passes over (and a replicated prepare names).
    takeover: Vec<u32>,
}

/// The kinds of honest requests, each with its defaults (see [`honest`]).
const KINDS: u8 = 12;

fn wire_txn(txn: TxnId) -> Option<proto::TxnId> {
    Some(wire::txn_to_wire(txn))
}

/// Honest defaults of request kind `kind`: each is served as the sample node stands.
fn honest(kind: u8) -> (u8, Knobs) {
    let at = Timestamp::new;
    let base = Knobs {
        from: "client-9",
        shard: 0,
        epoch: 1,
        key: b"a".to_vec(),
        key2: b"b".to_vec(),
        ts: at(25, 0),
        ts2: Timestamp::ZERO,
        txn: wire_txn(txn_id(3, 1)),
        commit: true,
        reads: 1,
        writes: 1,
        delete: false,
        delete_with_value: false,
        scans: 0,
        participants: vec![0],
        limit: 10,
        record: 0,
        takeover: Vec::new(),
    };
    let kind = kind % KINDS;
    let knobs = match kind {
        // Get, Scan, Prepare (reads a at version zero, writes b), Decide T2.
        0 => base,
        1 => Knobs { key2: b"e".to_vec(), ..base },
        2 => Knobs { ts: at(40, 3), ..base },
        3 => Knobs { txn: wire_txn(T2), ..base },
        // As a backup of shard 1: a replicated prepare from its primary; a termination
        // query from n1; a lease request; a new primary's fetch; a client's watermark.
        4 => Knobs {
            from: "n1",
            shard: 1,
            key2: b"m".to_vec(),
            ts: at(50, 3),
            txn: wire_txn(txn_id(3, 2)),
            participants: vec![1],
            ..base
        },
        5 => Knobs { from: "n1", txn: wire_txn(T2), ..base },
        6 => Knobs { from: "n1", shard: 1, ts: at(1000, 0), ..base },
        7 => Knobs { from: "n1", shard: 1, ..base },
        8 => Knobs { ts: at(5, 0), ..base },
        // A validator's lease request; a prepare passing over validator 1.
        11 => Knobs { from: "validator-0", ts: at(1000, 0), ..base },
        // The configuration service's arms, refused.
        _ => base,
    };
    (kind, knobs)
}

const TIMESTAMPS: [Timestamp; 13] = [
    Timestamp::ZERO,
    Timestamp { time: 1, client: 0 },
    Timestamp { time: 10, client: 0 },
    Timestamp { time: 10, client: 1 },
    Timestamp { time: 11, client: 0 },
    Timestamp { time: 20, client: 2 },
    Timestamp { time: 29, client: 9 },
    Timestamp { time: 30, client: 1 },
    Timestamp { time: 31, client: 0 },
    Timestamp { time: 40, client: 3 },
    Timestamp { time: 1000, client: 0 },
    Timestamp { time: u64::MAX, client: 0 },
    Timestamp::MAX,
];

fn key_pool(value: u8) -> Vec<u8> {
    match value % 14 {
        0 => Vec::new(),
        1 => vec![b'a'; MAX_KEY_BYTES],
        2 => vec![b'x'; MAX_KEY_BYTES + 1],
        at => [&b"a"[..], b"b", b"c", b"d", b"f", b"g", b"h", b"k", b"m", b"p", b"q"][usize::from(at) - 3].to_vec(),
    }
}

fn edit(knobs: &mut Knobs, field: u8, value: u8) {
    let pick = |options: &[u32]| options[usize::from(value) % options.len()];
    match field % 15 {
        0 => knobs.from = SENDERS[usize::from(value) % SENDERS.len()],
        1 => knobs.shard = pick(&[0, 1, 2, 3, 1023, 1024, u32::MAX]),
        2 => knobs.epoch = [0, 1, 2, 3, u64::MAX][usize::from(value) % 5],
        3 => knobs.key = key_pool(value),
        4 => knobs.key2 = key_pool(value),
        5 => knobs.ts = TIMESTAMPS[usize::from(value) % TIMESTAMPS.len()],
        6 => knobs.ts2 = TIMESTAMPS[usize::from(value) % TIMESTAMPS.len()],
        7 => {
            knobs.txn = match value % 7 {
                0 => wire_txn(T1),
                1 => wire_txn(T2),
                2 => wire_txn(T3),
                3 => wire_txn(txn_id(3, 1)),
                4 => wire_txn(txn_id(u32::from(value), u32::MAX)),
                5 => Some(proto::TxnId { client: 3, seq: 0 }),
                _ => None,
            }
        }
        8 => knobs.commit = !knobs.commit,
        9 => knobs.reads = usize::from(value % 4),
        10 => {
            knobs.writes = usize::from(value % 4);
            knobs.delete = value & 4 != 0;
            knobs.delete_with_value = value & 8 != 0;
        }
        11 => match value % 8 {
            6 => knobs.participants.clear(),
            7 => {
                knobs.participants.pop();
            }
            at => knobs.participants.push([0, 1, 2, 3, 1024, u32::MAX][usize::from(at)]),
        },
        12 => {
            knobs.scans = usize::from(value % 3);
            knobs.limit = [0, 1, 2, u32::MAX][usize::from(value >> 2) % 4];
        }
        13 => knobs.record = value % 5,
        _ => match value % 4 {
            0 => knobs.takeover.clear(),
            at => knobs.takeover.push([1, 255, 256, u32::MAX][usize::from(at)]),
        },
    }
}

/// The keys an op list cycles through: key, key2, key (a duplicate from the third on).
fn op_key(knobs: &Knobs, at: usize) -> Vec<u8> {
    if at % 2 == 0 {
        knobs.key.clone()
    } else {
        knobs.key2.clone()
    }
}

fn writes(knobs: &Knobs, first: usize) -> Vec<proto::Write> {
    (first..first + knobs.writes)
        .map(|at| proto::Write {
            key: op_key(knobs, at),
            value: if knobs.delete && !knobs.delete_with_value { Vec::new() } else { b"v".to_vec() },
            delete: knobs.delete,
        })
        .collect()
}

/// The request of kind `kind` with `knobs`, as a peer would send it: built on the wire, then
/// decoded through the protocol's codec, which refuses what is malformed there.
fn build(kind: u8, knobs: &Knobs) -> Result<Request, crate::protocol::DkvWireError> {
    let wire = proto::Request { body: Some(build_wire(kind, knobs)) };
    <crate::Dkv as virga_net::WireProtocol>::decode_request(&prost::Message::encode_to_vec(&wire))
}

fn build_wire(kind: u8, knobs: &Knobs) -> proto::request::Body {
    use proto::request::Body;
    let ts = Some(wire::ts_to_wire(knobs.ts));
    let (shard, epoch) = (knobs.shard, knobs.epoch);
    match kind {
        0 => Body::Get(proto::Get {
            shard,
            epoch,
            key: knobs.key.clone(),
            ts,
            read_interval_ns: u64::from(knobs.limit) << 10,
        }),
        1 => Body::Scan(proto::Scan {
            shard,
            epoch,
            start: knobs.key.clone(),
            end: knobs.key2.clone(),
            ts,
            limit: knobs.limit,
        }),
        2 => Body::Prepare(proto::Prepare {
            shard,
            epoch,
            txn: knobs.txn,
            commit_ts: ts,
            reads: (0..knobs.reads)
                .map(|at| proto::Read {
                    key: op_key(knobs, at),
                    version: Some(wire::ts_to_wire(knobs.ts2)),
                    cached: at % 2 == 1,
                })
                .collect(),
            // A read-only transaction's validation alone (KAIROS) carries no writes.
            writes: if knobs.limit == 2 { Vec::new() } else { writes(knobs, 1) },
            participants: knobs.participants.clone(),
            scans: (0..knobs.scans)
                .map(|_| proto::ScannedRange {
                    start: knobs.key.clone(),
                    end: knobs.key2.clone(),
                    ts: Some(wire::ts_to_wire(knobs.ts2)),
                })
                .collect(),
            // A one-participant transaction committed on its vote, or an ordinary prepare.
            commit_on_vote: knobs.commit,
            validate_only: knobs.limit == 2,
            takeover_validators: knobs.takeover.clone(),
        }),
        3 => Body::Decide(proto::Decide { shard, epoch, txn: knobs.txn, commit: knobs.commit }),
        4 => Body::Replicate(proto::Replicate { shard, epoch, record: replicated(knobs) }),
        5 => Body::Query(proto::TxnQuery { shard, epoch, txn: knobs.txn }),
        6 => Body::Lease(proto::LeaseRequest { shard, epoch, until: ts, watermark: ts, settled: ts }),
        7 => Body::Fetch(proto::Fetch { shard, epoch }),
        8 => Body::Watermark(proto::Watermark { client: 9, ts, freshness: None }),
        10 => Body::GetMany(proto::GetMany {
            shard,
            epoch,
            keys: (0..=knobs.reads).map(|at| op_key(knobs, at)).collect(),
            ts,
            // None, or one a key (a cached key's, as a caching client sends).
            read_intervals_ns: match knobs.limit % 2 {
                0 => Vec::new(),
                _ => (0..=knobs.reads).map(|at| (at as u64) << 20).collect(),
            },
        }),
        11 => Body::ValidatorLease(proto::ValidatorLease {
            validator: knobs.limit,
            shard,
            epoch,
            until_ns: knobs.ts.time,
        }),
        _ if knobs.commit => Body::GetMap(proto::GetMap {}),
        _ => Body::Propose(proto::ConfigProposal::default()),
    }
}

fn replicated(knobs: &Knobs) -> Option<proto::ShardRecord> {
    use proto::shard_record::Record;
    let ts = Some(wire::ts_to_wire(knobs.ts));
    let record = match knobs.record {
        0 => Record::Prepared(proto::PreparedTxn {
            txn: knobs.txn,
            commit_ts: ts,
            writes: writes(knobs, 1),
            participants: knobs.participants.clone(),
            takeover_validators: knobs.takeover.clone(),
        }),
        1 => Record::Decided(proto::DecidedTxn { txn: knobs.txn, commit: knobs.commit }),
        2 => Record::Lease(proto::LeaseGranted { epoch: knobs.epoch, until: ts }),
        3 => Record::Fence(proto::Fence { epoch: knobs.epoch }),
        _ => return Some(proto::ShardRecord { record: None }),
    };
    Some(proto::ShardRecord { record: Some(record) })
}

/// Any bytes as requests to a data node, or as one of its log records. The first byte:
/// its top three bits 7, a log record ([`check_log_record`] on the rest); otherwise bit 0
/// turns read leases on (a primary without a lease refuses reads), bit 1 defers the
/// completion of device writes and calls (after each request, a byte (mod 4) says how many
/// of the oldest complete; the rest complete at the end), and the rest are up to 8
/// requests stepped into the sample node, each a tag byte then, for a tag ≡ 0 (mod 4), a
/// `u16` little-endian length and that many bytes decoded as a `Request` from the
/// sender the tag's top bits pick; for any other tag, the honest request of kind `tag / 4`
/// (mod 10) changed by a count byte's (mod 9) (field, value) edits. Every request gets
/// exactly one reply once its writes and replication complete; a refusal changes no
/// replica; a commit vote (completions at once) leaves the transaction prepared or
/// committed; every logged record decodes.
pub fn dkv_shard(data: &[u8]) {
    step_requests(data);
}

/// The body of [`dkv_shard`]; returns what the requests came to.
pub fn step_requests(data: &[u8]) -> Tally {
    let Some((&first, mut input)) = data.split_first() else { return Tally::default() };
    if first >> 5 == 7 {
        check_log_record(input);
        return Tally::default();
    }
    let mut harness = Harness::new(first & 1 == 1);
    let deferred = first & 2 == 2;
    for _ in 0..MAX_REQUESTS_PER_INPUT {
        let Some((from, request)) = next_request(&mut input) else { break };
        let Ok(request) = request else {
            harness.tally.requests += 1;
            harness.tally.refused += 1;
            continue;
        };
        if deferred {
            harness.request(from, request);
            let Some((&release, rest)) = input.split_first() else { break };
            input = rest;
            harness.complete(usize::from(release % 4));
        } else {
            harness.ask(from, request);
        }
    }
    harness.finish();
    harness.tally
}

fn next_request(input: &mut &[u8]) -> Option<(&'static str, Result<Request, crate::protocol::DkvWireError>)> {
    let (&tag, rest) = input.split_first()?;
    *input = rest;
    if tag % 4 == 0 {
        let length = usize::from(u16::from_le_bytes([*input.first()?, *input.get(1)?]));
        let bytes = &input[2..];
        let (bytes, rest) = bytes.split_at(length.min(bytes.len()).min(MAX_REQUEST_BYTES));
        *input = rest;
        // Bytes go through the protocol's codec, as over gRPC: what it refuses never
        // reaches the node.
        let request = <crate::Dkv as virga_net::WireProtocol>::decode_request(bytes);
        return Some((SENDERS[usize::from(tag >> 6)], request));
    }
    let (kind, mut knobs) = honest(tag / 4);
    let (&count, rest) = input.split_first().unwrap_or((&0, &[]));
    *input = rest;
    for _ in 0..count % 9 {
        let Some(([field, value], rest)) = input.split_first_chunk::<2>().map(|(edit, rest)| (*edit, rest)) else {
            break;
        };
        *input = rest;
        edit(&mut knobs, field, value);
    }
    Some((knobs.from, build(kind, &knobs)))
}

/// Valid log records: the sample node's (transactions, a lease granted, a fence).
pub fn sample_log_records() -> Vec<Vec<u8>> {
    sample_records().iter().map(|(shard, record)| wire::encode_log_record(*shard, record)).collect()
}

/// Log-record mode: the first byte, even, makes the rest the record; odd, a sample record
/// (the second byte picks it) changed by the rest as (offset: u16, xor: u8) triples. The
/// record must decode to one that re-encodes to an equal record, or be refused with a named
/// error; and a node's log holding it between valid records opens exactly when it decodes,
/// else refuses naming its LSN.
pub fn check_log_record(input: &[u8]) {
    let Some((&how, rest)) = input.split_first() else { return };
    let record = if how % 2 == 0 {
        rest.to_vec()
    } else {
        let Some((&which, edits)) = rest.split_first() else { return };
        let samples = sample_log_records();
        let mut bytes = samples[usize::from(which) % samples.len()].clone();
        for edit in edits.chunks_exact(3) {
            let offset = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % bytes.len();
            bytes[offset] ^= edit[2];
        }
        bytes
    };
    let decoded = wire::decode_log_record(&record);
    if let Ok((shard, decoded)) = &decoded {
        let again = wire::decode_log_record(&wire::encode_log_record(*shard, decoded));
        assert_eq!(again.as_ref().ok(), Some(&(*shard, decoded.clone())), "a decoded log record did not round-trip");
    }
    let samples = sample_log_records();
    let storage = MemStorage::new();
    let bad_lsn = {
        let (mut log, _) = RecordLog::open(&storage, LogOptions::default())
            .unwrap_or_else(|error| unreachable!("a memory log opens: {error}"));
        let append = |log: &mut RecordLog, payload: &[u8]| {
            log.append(payload).unwrap_or_else(|error| unreachable!("a memory log appends: {error}"))
        };
        append(&mut log, &samples[0]);
        append(&mut log, &samples[1]);
        let lsn = append(&mut log, &record);
        append(&mut log, &samples[2]);
        log.sync().unwrap_or_else(|error| unreachable!("a memory log syncs: {error}"));
        lsn
    };
    match (open_data_node(DataConfig::new(ME, sample_map()), &storage), decoded) {
        (Ok(_), Ok(_)) => {}
        (Err(DataOpenError::Record { lsn, error }), Err(expected)) => {
            assert_eq!(lsn, bad_lsn, "the node's log refused the wrong record");
            assert_eq!(error, expected, "the node's log refused record {lsn} for another reason");
        }
        (Ok(_), Err(error)) => panic!("a log holding an undecodable record ({error}) opened"),
        (Err(error), _) => panic!("a log of valid records did not open: {error}"),
    }
}

#[cfg(test)]
mod tests;
