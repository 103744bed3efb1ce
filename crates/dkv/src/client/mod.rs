//! A MILANA client: runs transactions against the shard primaries and coordinates their
//! two-phase commit.
//!
//! A transaction reads at `ts_begin` (its client's clock when it began) from each key's
//! primary, buffers its writes, and commits:
//! - read-only: locally, with no message, unless a read saw a writer prepared at or below
//!   `ts_begin` (MILANA §3.2.3);
//! - read-write: at `ts_commit` (the clock at commit), by a prepare to every participant
//!   primary (its reads with the versions they returned, its writes, the participants); it
//!   commits if and only if every participant votes commit. The application learns the
//!   outcome then; the decision goes to the primaries afterwards, retried until each
//!   acknowledges.
//!
//! Lost or late messages are retried with the same transaction id, which the primaries
//! recognise. An aborted transaction is run again from the start, up to a bound.

mod program;
mod scan;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use virga_net::dkv_proto::{self as proto, request::Body as RequestBody, response::Body as ResponseBody};
use virga_net::role::{CallId, Command, Event, Ids, Nanos, Role, TimerId};
use virga_net::{Dkv, NetError};
use virga_storage::{Timestamp, TxnId};
use virga_txn::checker::TxnRecord;
use virga_txn::AbortReason;

pub use self::program::{balance, Program, TxnOp};

use crate::layout::ShardMap;
use crate::shard::wire::{self as shard_wire, PrepareRequest};
use crate::shard::{txn_id, ReadOp, WriteOp};

/// A client's settings.
#[derive(Debug, Clone)]
pub struct TxnClientConfig {
    /// The client's id: the tie-breaker of its timestamps and the high half of its
    /// transaction ids.
    pub client: u32,
    pub map: ShardMap,
    /// Deadline of one request to a primary.
    pub deadline: Duration,
    /// Pause before a lost request is sent again.
    pub retry_after: Duration,
    /// Pause before an aborted program runs again, times its attempts so far (up to 10):
    /// long enough for the conflicting writer to finish, short enough not to idle.
    pub rerun_after: Duration,
    /// Runs of one program before its abort is final.
    pub max_attempts: u32,
    /// A deliberately broken variant: read-only transactions commit without checking for
    /// prepared writers below their snapshot.
    pub skip_local_validation: bool,
    /// The configuration service's replicas, asked for a newer map when a request fails
    /// (empty: the map never changes).
    pub config_replicas: Vec<String>,
    /// Where timestamps come from.
    pub clock: ClientClock,
    /// How often the client tells the primaries its watermark.
    pub watermark_every: Duration,
    /// A transaction with one participant commits in one round trip (the primary commits on
    /// its vote); off, it takes a prepare and a decision as any other.
    pub one_round_trip: bool,
}

/// A client's timestamp scheme (both `<time, client id>`, strictly increasing per client).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClientClock {
    /// The client's physical clock (skewed as the deployment's clocks are).
    #[default]
    Physical,
    /// A hybrid logical clock: the physical clock, pushed above every version the client
    /// has read.
    Hybrid,
}

impl TxnClientConfig {
    pub fn new(client: u32, map: ShardMap) -> TxnClientConfig {
        TxnClientConfig {
            client,
            map,
            deadline: Duration::from_millis(300),
            retry_after: Duration::from_millis(20),
            rerun_after: Duration::from_millis(2),
            max_attempts: 20,
            skip_local_validation: false,
            config_replicas: Vec::new(),
            clock: ClientClock::Physical,
            watermark_every: Duration::from_millis(100),
            one_round_trip: true,
        }
    }
}

/// How a program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramOutcome {
    Committed {
        txn: TxnId,
        commit_ts: Timestamp,
        read_only: bool,
    },
    /// Aborted on its last attempt.
    Aborted {
        reason: String,
    },
}

/// A finished program: its outcome, what its committed attempt read, and how many runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramResult {
    pub outcome: ProgramOutcome,
    /// Each key read and its value (None: absent), from the committed attempt.
    pub reads: Vec<(Bytes, Option<Bytes>)>,
    /// Each scan's rows, in the program's order.
    pub scans: Vec<Vec<(Bytes, Bytes)>>,
    pub attempts: u32,
}

#[derive(Debug, Default)]
struct ReadState {
    value: Option<Bytes>,
    version: Timestamp,
    writer: TxnId,
    prepared_below: bool,
}

/// A read in flight: a get of a key, or one shard's part of a scan (by its index).
enum ReadCall {
    Get(Bytes),
    Scan(usize, u32),
}

enum Phase {
    /// Gets and scans in flight, by call.
    Reading(HashMap<CallId, ReadCall>),
    /// Prepares in flight (by call), and the votes so far.
    Preparing { commit_ts: Timestamp, calls: HashMap<CallId, u32>, yes: BTreeSet<u32>, participants: Vec<u32> },
}

struct Active {
    program: Program,
    attempt: u32,
    txn: TxnId,
    ts_begin: Timestamp,
    reads: BTreeMap<Bytes, ReadState>,
    writes: BTreeMap<Bytes, Option<Bytes>>,
    phase: Phase,
    /// The program's scans, as they come in.
    scans: Vec<scan::ScanState>,
    /// Requests to send again at the retry timer: gets by key, scans by (scan, shard),
    /// prepares by shard.
    lost_gets: Vec<Bytes>,
    lost_scans: Vec<(usize, u32)>,
    lost_prepares: Vec<u32>,
}

/// Counters of one client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub committed: u64,
    pub committed_read_only: u64,
    /// Attempts aborted, by reason.
    pub aborts: BTreeMap<String, u64>,
    pub gets: u64,
    pub scans: u64,
    pub prepares: u64,
    pub retries: u64,
    pub maps_adopted: u64,
}

pub struct TxnClient {
    config: TxnClientConfig,
    ids: Ids,
    next_seq: u32,
    last_ts: Timestamp,
    /// The newest version timestamp read (for the hybrid clock).
    observed: Timestamp,
    watermark_timer: Option<TimerId>,
    queue: VecDeque<Program>,
    active: Option<Active>,
    /// Decisions not yet acknowledged: by call, (shard, txn, commit).
    deciding: HashMap<CallId, (u32, TxnId, bool)>,
    lost_decisions: Vec<(u32, TxnId, bool)>,
    retry_timer: Option<TimerId>,
    /// An aborted program waits for this timer before running again.
    rerun_timer: Option<TimerId>,
    /// The attempt number the next program to start runs as.
    pending_attempt: u32,
    /// A request failed since the map was last fetched; the fetch in flight, and which
    /// configuration replica to ask.
    map_stale: bool,
    map_call: Option<CallId>,
    config_target: usize,
    results: Vec<ProgramResult>,
    history: Vec<TxnRecord>,
    /// Every read-write attempt that sent prepares, as it would commit.
    attempts: Vec<TxnRecord>,
    stats: ClientStats,
}

impl TxnClient {
    pub fn new(config: TxnClientConfig) -> TxnClient {
        TxnClient {
            config,
            ids: Ids::default(),
            next_seq: 1,
            last_ts: Timestamp::ZERO,
            observed: Timestamp::ZERO,
            watermark_timer: None,
            queue: VecDeque::new(),
            active: None,
            deciding: HashMap::new(),
            lost_decisions: Vec::new(),
            retry_timer: None,
            rerun_timer: None,
            pending_attempt: 1,
            map_stale: false,
            map_call: None,
            config_target: 0,
            results: Vec::new(),
            history: Vec::new(),
            attempts: Vec::new(),
            stats: ClientStats::default(),
        }
    }

    pub fn results(&self) -> &[ProgramResult] {
        &self.results
    }

    /// The committed transactions, for the history checker.
    pub fn history(&self) -> &[TxnRecord] {
        &self.history
    }

    /// Every read-write attempt that reached its prepares, committed or not: what a
    /// participant that terminates a transaction for this client may have committed.
    pub fn attempts(&self) -> &[TxnRecord] {
        &self.attempts
    }

    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// Programs given and not finished, and decisions not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.queue.len() + usize::from(self.active.is_some()) + self.deciding.len() + self.lost_decisions.len()
    }

    /// A timestamp of this client strictly above every one it gave before.
    fn next_ts(&mut self, now: Nanos) -> Timestamp {
        let mut time = now.max(self.last_ts.time + 1);
        if self.config.clock == ClientClock::Hybrid {
            // A hybrid logical clock: also above every version seen, so a lagging physical
            // clock does not doom a write to a key just read.
            time = time.max(self.observed.time.saturating_add(1));
        }
        self.last_ts = Timestamp::new(time, self.config.client);
        self.last_ts
    }

    fn epoch_of(&self, shard: u32) -> u64 {
        self.config.map.group(crate::layout::ShardId(shard)).map_or(0, |group| group.epoch)
    }

    fn primary_of(&self, shard: u32) -> String {
        self.config.map.group(crate::layout::ShardId(shard)).map(|group| group.primary.clone()).unwrap_or_default()
    }

    fn shard_of(&self, key: &[u8]) -> u32 {
        self.config.map.shard_of(key).0
    }

    /// Starts the next program (or the same one again after an abort).
    fn start(
        &mut self,
        now: Nanos,
        program: Program,
        attempt: u32,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        let ts_begin = match program.snapshot_at() {
            Some(at) => at,
            None => self.next_ts(now),
        };
        let keys = program.read_keys();
        let scans = scan::ScanState::of(&program, &self.config.map);
        self.active = Some(Active {
            program,
            attempt,
            txn: txn_id(self.config.client, seq),
            ts_begin,
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            phase: Phase::Reading(HashMap::new()),
            scans,
            lost_gets: Vec::new(),
            lost_scans: Vec::new(),
            lost_prepares: Vec::new(),
        });
        let scan_parts = self.scan_parts();
        if keys.is_empty() && scan_parts.is_empty() {
            self.finish_reads(now, out);
            return;
        }
        for key in keys {
            self.send_get(key, out);
        }
        for (index, shard) in scan_parts {
            self.send_scan(index, shard, out);
        }
    }

    fn send_get(&mut self, key: Bytes, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let shard = self.shard_of(&key);
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let Some(active) = &mut self.active else { return };
        let Phase::Reading(calls) = &mut active.phase else { return };
        let call = self.ids.call();
        calls.insert(call, ReadCall::Get(key.clone()));
        self.stats.gets += 1;
        let get = proto::Get { shard, epoch, key: key.to_vec(), ts: Some(shard_wire::ts_to_wire(active.ts_begin)) };
        out.push(Command::Call {
            to,
            call,
            request: proto::Request { body: Some(RequestBody::Get(get)) },
            deadline: self.config.deadline,
        });
    }

    fn on_get_reply(
        &mut self,
        now: Nanos,
        call: CallId,
        result: Result<ResponseBody, ()>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let Some(active) = &mut self.active else { return };
        let Phase::Reading(calls) = &mut active.phase else { return };
        let key = match calls.remove(&call) {
            Some(ReadCall::Get(key)) => key,
            Some(ReadCall::Scan(index, shard)) => return self.on_scan_reply(now, index, shard, result, out),
            None => return,
        };
        match result {
            Ok(ResponseBody::Value(reply)) => {
                let writer = shard_wire::txn_from_wire(reply.writer).unwrap_or(0);
                let read = ReadState {
                    value: reply.found.then(|| Bytes::from(reply.value)),
                    version: shard_wire::ts_from_wire(reply.version),
                    writer,
                    prepared_below: reply.prepared_below,
                };
                self.observed = self.observed.max(read.version);
                active.reads.insert(key, read);
            }
            // The versions this snapshot needs may be collected: run it again, newer.
            Ok(ResponseBody::TooOld(_)) => {
                self.aborted("snapshot-too-old".to_string(), out);
                return;
            }
            _ => {
                active.lost_gets.push(key);
            }
        }
        self.reads_progressed(now, out);
    }

    /// After a read came back: retry what was lost, or commit once everything is in.
    fn reads_progressed(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let Some(active) = &self.active else { return };
        let lost = !active.lost_gets.is_empty() || !active.lost_scans.is_empty();
        let done = matches!(&active.phase, Phase::Reading(calls) if calls.is_empty()) && !lost;
        if lost {
            self.arm_retry(out);
        }
        if done {
            self.finish_reads(now, out);
        }
    }

    /// Every read is in: compute the writes and commit.
    fn finish_reads(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let Some(active) = &mut self.active else { return };
        let values: BTreeMap<Bytes, Option<Bytes>> =
            active.reads.iter().map(|(key, read)| (key.clone(), read.value.clone())).collect();
        active.writes = active.program.writes(&values);
        if active.writes.is_empty() {
            let prepared = active.reads.values().any(|read| read.prepared_below)
                || active.scans.iter().any(|scan| scan.prepared_below);
            if prepared && !self.config.skip_local_validation {
                self.aborted(AbortReason::SnapshotPrepared.name().to_string(), out);
            } else {
                let ts = active.ts_begin;
                self.committed(ts, true);
            }
            return;
        }
        let commit_ts = self.next_ts(now);
        let Some(active) = &mut self.active else { return };
        let mut participants: BTreeSet<u32> = active.writes.keys().map(|key| self.config.map.shard_of(key).0).collect();
        participants.extend(active.reads.keys().map(|key| self.config.map.shard_of(key).0));
        participants.extend(active.scans.iter().flat_map(|scan| scan.shards().iter().copied()));
        let participants: Vec<u32> = participants.into_iter().collect();
        self.attempts.push(TxnRecord {
            id: active.txn,
            commit_ts,
            reads: active.reads.iter().map(|(key, read)| (key.clone(), read.writer)).collect(),
            writes: active.writes.keys().cloned().collect(),
        });
        active.phase = Phase::Preparing {
            commit_ts,
            calls: HashMap::new(),
            yes: BTreeSet::new(),
            participants: participants.clone(),
        };
        for shard in participants {
            self.send_prepare(shard, out);
        }
    }

    fn send_prepare(&mut self, shard: u32, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let one_round_trip = self.config.one_round_trip;
        let map = &self.config.map;
        let Some(active) = &mut self.active else { return };
        let Phase::Preparing { commit_ts, calls, participants, .. } = &mut active.phase else { return };
        let prepare = PrepareRequest {
            shard,
            epoch,
            txn: active.txn,
            commit_ts: *commit_ts,
            reads: active
                .reads
                .iter()
                .filter(|(key, _)| map.shard_of(key).0 == shard)
                .map(|(key, read)| ReadOp { key: key.clone(), version: read.version })
                .collect(),
            writes: active
                .writes
                .iter()
                .filter(|(key, _)| map.shard_of(key).0 == shard)
                .map(|(key, value)| WriteOp { key: key.clone(), value: value.clone() })
                .collect(),
            participants: participants.clone(),
            scans: active
                .scans
                .iter()
                .filter(|scan| scan.covers(shard))
                .map(|scan| scan.range(active.ts_begin))
                .collect(),
            commit_on_vote: participants.len() == 1 && one_round_trip,
        };
        let call = self.ids.call();
        calls.insert(call, shard);
        self.stats.prepares += 1;
        let request = proto::Request { body: Some(RequestBody::Prepare(shard_wire::prepare_to_wire(&prepare))) };
        out.push(Command::Call { to, call, request, deadline: self.config.deadline });
    }

    fn on_vote(
        &mut self,
        call: CallId,
        result: Result<ResponseBody, ()>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let Some(active) = &mut self.active else { return };
        let Phase::Preparing { calls, yes, participants, commit_ts } = &mut active.phase else { return };
        let Some(shard) = calls.remove(&call) else { return };
        match result {
            Ok(ResponseBody::Vote(vote)) if vote.commit => {
                yes.insert(shard);
                if yes.len() == participants.len() {
                    let (commit_ts, participants, txn) = (*commit_ts, participants.clone(), active.txn);
                    self.committed(commit_ts, false);
                    // A single participant committed on its vote: there is no decision to send.
                    if !self.one_round_trip(participants.len()) {
                        for shard in participants {
                            self.send_decision(shard, txn, true, out);
                        }
                    }
                }
            }
            Ok(ResponseBody::Vote(vote)) => {
                let (participants, txn) = (participants.clone(), active.txn);
                self.aborted(vote.reason, out);
                if !self.one_round_trip(participants.len()) {
                    for shard in participants {
                        self.send_decision(shard, txn, false, out);
                    }
                }
            }
            _ => {
                active.lost_prepares.push(shard);
                self.arm_retry(out);
            }
        }
    }

    /// Whether a transaction with this many participants commits on its vote.
    fn one_round_trip(&self, participants: usize) -> bool {
        participants == 1 && self.config.one_round_trip
    }

    fn send_decision(
        &mut self,
        shard: u32,
        txn: TxnId,
        commit: bool,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let call = self.ids.call();
        self.deciding.insert(call, (shard, txn, commit));
        let decide = proto::Decide { shard, epoch, txn: Some(shard_wire::txn_to_wire(txn)), commit };
        out.push(Command::Call {
            to,
            call,
            request: proto::Request { body: Some(RequestBody::Decide(decide)) },
            deadline: self.config.deadline,
        });
    }

    fn committed(&mut self, commit_ts: Timestamp, read_only: bool) {
        let Some(active) = self.active.take() else { return };
        self.stats.committed += 1;
        self.stats.committed_read_only += u64::from(read_only);
        self.history.push(TxnRecord {
            id: active.txn,
            commit_ts,
            reads: active.reads.iter().map(|(key, read)| (key.clone(), read.writer)).collect(),
            writes: active.writes.keys().cloned().collect(),
        });
        self.results.push(ProgramResult {
            outcome: ProgramOutcome::Committed { txn: active.txn, commit_ts, read_only },
            scans: active.scans.iter().map(scan::ScanState::rows).collect(),
            reads: active.reads.into_iter().map(|(key, read)| (key, read.value)).collect(),
            attempts: active.attempt,
        });
    }

    fn aborted(&mut self, reason: String, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let Some(active) = self.active.take() else { return };
        *self.stats.aborts.entry(reason.clone()).or_default() += 1;
        if active.attempt < self.config.max_attempts {
            // Run it again after a pause that grows with the attempts.
            self.queue.push_front(active.program);
            self.pending_attempt = active.attempt + 1;
            let timer = self.ids.timer();
            self.rerun_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.rerun_after * active.attempt.min(10) });
        } else {
            self.results.push(ProgramResult {
                outcome: ProgramOutcome::Aborted { reason },
                reads: Vec::new(),
                scans: Vec::new(),
                attempts: active.attempt,
            });
        }
    }

    fn arm_retry(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        if self.retry_timer.is_none() {
            let timer = self.ids.timer();
            self.retry_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.retry_after });
        }
    }

    fn on_retry(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        self.retry_timer = None;
        if let Some(active) = &mut self.active {
            let scans = std::mem::take(&mut active.lost_scans);
            let gets = std::mem::take(&mut active.lost_gets);
            let prepares = std::mem::take(&mut active.lost_prepares);
            self.stats.retries += (gets.len() + prepares.len()) as u64;
            for key in gets {
                self.send_get(key, out);
            }
            for (index, shard) in scans {
                self.send_scan(index, shard, out);
            }
            for shard in prepares {
                self.send_prepare(shard, out);
            }
        }
        for (shard, txn, commit) in std::mem::take(&mut self.lost_decisions) {
            self.stats.retries += 1;
            self.send_decision(shard, txn, commit, out);
        }
        self.fetch_map(out);
    }

    /// Asks the configuration service for the map after a failed request (a primary may
    /// have changed).
    fn fetch_map(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        if !self.map_stale || self.map_call.is_some() || self.config.config_replicas.is_empty() {
            return;
        }
        let call = self.ids.call();
        self.map_call = Some(call);
        let to = self.config.config_replicas[self.config_target % self.config.config_replicas.len()].clone();
        out.push(Command::Call {
            to,
            call,
            request: proto::Request { body: Some(RequestBody::GetMap(proto::GetMap {})) },
            deadline: self.config.deadline,
        });
    }

    fn on_map(&mut self, body: Result<ResponseBody, ()>) {
        self.map_call = None;
        match body {
            Ok(ResponseBody::Map(reply)) => {
                let map = reply.map.and_then(|map| crate::wire::map_from_proto(map).ok());
                if let Some(map) = map.filter(|map| map.version() > self.config.map.version()) {
                    self.config.map = map;
                    self.stats.maps_adopted += 1;
                }
                self.map_stale = false;
            }
            _ => self.config_target += 1,
        }
    }

    fn on_response(
        &mut self,
        now: Nanos,
        call: CallId,
        result: Result<proto::Response, NetError>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        let body = result.ok().and_then(|response| response.body).ok_or(());
        if self.map_call == Some(call) {
            self.on_map(body);
            return;
        }
        if matches!(body, Err(()) | Ok(ResponseBody::Error(_) | ResponseBody::WrongEpoch(_))) {
            // A primary may have changed (a watermark that did not arrive says so too).
            self.map_stale = true;
            self.arm_retry(out);
        }
        if let Some((shard, txn, commit)) = self.deciding.remove(&call) {
            if !matches!(body, Ok(ResponseBody::Ack(_))) {
                self.lost_decisions.push((shard, txn, commit));
                self.arm_retry(out);
            }
            return;
        }
        match self.active.as_ref().map(|active| &active.phase) {
            Some(Phase::Reading(calls)) if calls.contains_key(&call) => self.on_get_reply(now, call, body, out),
            Some(Phase::Preparing { calls, .. }) if calls.contains_key(&call) => self.on_vote(call, body, out),
            _ => {}
        }
    }

    /// Tells every primary the timestamp this client reads at or above from now on: its
    /// running transaction's begin, or above everything it gave out so far.
    fn broadcast_watermark(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        let watermark = match &self.active {
            Some(active) => active.ts_begin,
            None => self.last_ts,
        };
        let mut primaries: Vec<(u32, String)> = self
            .config
            .map
            .groups()
            .iter()
            .enumerate()
            .map(|(shard, group)| (shard as u32, group.primary.clone()))
            .collect();
        primaries.sort_by(|a, b| a.1.cmp(&b.1));
        primaries.dedup_by(|a, b| a.1 == b.1);
        for (_, primary) in primaries {
            let call = self.ids.call();
            let request = proto::Watermark { client: self.config.client, ts: Some(shard_wire::ts_to_wire(watermark)) };
            out.push(Command::Call {
                to: primary,
                call,
                request: proto::Request { body: Some(RequestBody::Watermark(request)) },
                deadline: self.config.deadline,
            });
        }
        let timer = self.ids.timer();
        self.watermark_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.watermark_every });
    }

    fn run_next(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        if self.active.is_some() || self.rerun_timer.is_some() {
            return;
        }
        if let Some(program) = self.queue.pop_front() {
            let attempt = std::mem::replace(&mut self.pending_attempt, 1);
            self.start(now, program, attempt, out);
        }
    }
}

impl Role for TxnClient {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = Vec<Program>;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Dkv, std::convert::Infallible, Vec<Program>>,
        out: &mut Vec<Command<Dkv, std::convert::Infallible>>,
    ) {
        match event {
            Event::Input(programs) => self.queue.extend(programs),
            Event::Response { call, result } => self.on_response(now, call, result, out),
            Event::Timer(timer) if Some(timer) == self.retry_timer => self.on_retry(out),
            Event::Timer(timer) if Some(timer) == self.rerun_timer => self.rerun_timer = None,
            Event::Timer(timer) if Some(timer) == self.watermark_timer => self.broadcast_watermark(out),
            Event::Start => self.broadcast_watermark(out),
            Event::Request { from, call, .. } => {
                let response = ResponseBody::Error("a client serves no requests".to_string());
                out.push(Command::Reply { to: from, call, response: proto::Response { body: Some(response) } });
            }
            Event::Timer(_) | Event::IoDone { .. } => {}
        }
        // Several programs may finish within one step (read-only ones commit at once).
        loop {
            let before = self.results.len();
            self.run_next(now, out);
            if self.results.len() == before || self.active.is_some() {
                break;
            }
        }
    }
}
