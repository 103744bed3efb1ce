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
//! Transactions come from two sources, and many run at once: programs ([`Program`]), whose
//! reads are known up front and whose aborted attempts the client runs again, and
//! interactive sessions ([`SessionOp`]), where the application begins a transaction, reads
//! and writes one operation at a time and commits or aborts; each operation is answered
//! through its [`Reply`]. Lost or late messages are retried with the same transaction id,
//! which the primaries recognise.

mod program;
mod scan;
mod session;
mod txn;
mod validation;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::messages::{RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Event, Ids, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_storage::{Timestamp, TxnId};
use virga_txn::checker::TxnRecord;

pub use self::program::{balance, Program, TxnOp};
pub use self::session::{Reply, SessionError, SessionOp, SessionReply, SessionRequest, SessionResult};

use self::txn::{Phase, Txn};
use crate::layout::ShardMap;

/// The commands a client core emits.
type Out = Vec<Command<Dkv, std::convert::Infallible>>;

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
    /// A get that finds a writer prepared at or below the snapshot is sent again this many
    /// times, `reread_after` apart, before the transaction takes the answer as it is (a
    /// read-only one then aborts at its local validation). Once the writer is decided, the
    /// same snapshot read has its final answer: no writer can commit below a read already
    /// served (the key's latest read), so waiting it out is as safe as aborting. 0: MILANA's
    /// plain rule.
    pub prepared_rereads: u32,
    pub reread_after: Duration,
    /// Programs running at once (aborted ones waiting to run again count).
    pub programs_in_flight: usize,
    /// How long an operation of a session may wait for the primaries before it fails
    /// (unavailable, or outcome unknown for a commit whose prepares went out).
    pub op_deadline: Duration,
    /// A session transaction with no operation for this long is aborted (its snapshot holds
    /// back garbage collection).
    pub session_idle: Duration,
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
    /// Records every committed transaction and every prepared attempt ([`TxnClient::history`],
    /// [`TxnClient::attempts`]) for the history checker. Off by default: the records grow
    /// with every transaction.
    pub keep_history: bool,
    /// Keeps every finished program's result ([`TxnClient::results`]); off, only the
    /// counters tell (a long-running client's results would grow without end).
    pub keep_results: bool,
    /// Where read-only transactions are validated.
    pub read_only_validation: ReadOnlyValidation,
    /// Added to the deployment's clock when the client draws a timestamp: a clock this far
    /// off (benchmarks draw it from the PTP-like or NTP-like skew profile; the simulator
    /// skews whole nodes instead).
    pub clock_offset_ns: i64,
    /// KAIROS: which keys the client caches across transactions, under which lease rule
    /// (the primaries must run the same [`crate::kairos::CacheMode`]). A transaction that
    /// read a cached value validates at the primaries, read-only ones too.
    pub cache: crate::kairos::CacheConfig,
    /// KAIROS's sharded validators, by index (a key's is `kairos::validator::validator_of`);
    /// empty: every validation runs at the primaries.
    pub validators: Vec<String>,
}

/// Where a read-only transaction is validated (seed 004 Fig. 3.7 compares the two).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReadOnlyValidation {
    /// At the client, from what its gets returned: no message at commit (MILANA).
    #[default]
    Local,
    /// At the primaries, as a read-write transaction with no writes: a prepare to every
    /// participant (Algorithm 1 on its reads at a commit timestamp), replicated to f
    /// backups, then the decision.
    Remote,
    /// At the primaries in one round trip: a validation alone to every participant
    /// (Algorithm 1 on its reads at the snapshot, raising their latest read), nothing logged
    /// and no decision; KAIROS validates every read-only transaction this way, and one that
    /// read a cached value validates so whatever this setting.
    Validate,
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
            prepared_rereads: 3,
            reread_after: Duration::from_millis(2),
            programs_in_flight: 1,
            op_deadline: Duration::from_secs(10),
            session_idle: Duration::from_secs(60),
            skip_local_validation: false,
            config_replicas: Vec::new(),
            clock: ClientClock::Physical,
            watermark_every: Duration::from_millis(100),
            one_round_trip: true,
            keep_history: false,
            keep_results: true,
            read_only_validation: ReadOnlyValidation::Local,
            clock_offset_ns: 0,
            cache: crate::kairos::CacheConfig::default(),
            validators: Vec::new(),
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
    pub reads: Vec<(bytes::Bytes, Option<bytes::Bytes>)>,
    /// Each scan's rows, in the program's order.
    pub scans: Vec<Vec<(bytes::Bytes, bytes::Bytes)>>,
    pub attempts: u32,
}

/// Work for a client: programs to run, or one operation of a session.
#[derive(Debug)]
pub enum ClientInput {
    Programs(Vec<Program>),
    Session(SessionRequest),
}

/// Counters of one client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub committed: u64,
    /// Committed transactions that wrote nothing (validated here, or at the primaries with
    /// [`ReadOnlyValidation::Remote`]).
    pub committed_read_only: u64,
    /// Attempts aborted, by reason.
    pub aborts: BTreeMap<String, u64>,
    /// Get requests (one a shard of a transaction's reads) and the keys they read.
    pub gets: u64,
    pub keys_read: u64,
    pub scans: u64,
    pub prepares: u64,
    /// Validations of read-only transactions sent to participants (one round, nothing logged).
    pub validations: u64,
    /// Decisions sent to participants (a one-participant commit needs none).
    pub decisions: u64,
    /// KAIROS: validations sent to the sharded validators, releases of their held writes,
    /// and read-only validations moved to the primaries (a validator that did not answer, or
    /// could not judge the transaction).
    pub validator_validations: u64,
    pub releases: u64,
    pub validator_fallbacks: u64,
    /// Read-write transactions prepared at the primaries passing over a validator (the
    /// primaries validated in its place, above its lease).
    pub validator_takeovers: u64,
    pub retries: u64,
    /// Gets sent again to wait out a prepared writer.
    pub rereads: u64,
    pub maps_adopted: u64,
    /// From an attempt's start to its commit (read-only: validated here; read-write: every
    /// participant voted commit), by kind.
    pub commit_latency_read_only: crate::metrics::LatencyHistogram,
    pub commit_latency_read_write: crate::metrics::LatencyHistogram,
}

/// What one of the client's calls is for.
enum CallFor {
    /// A read, prepare, scan or validation of a running transaction.
    Txn(TxnId),
    /// A decision to a participant's primary, retried until acknowledged.
    Decide { shard: u32, txn: TxnId, commit: bool },
    /// A release of what a validator held for a decided transaction.
    Release { validator: u32, txn: TxnId, commit: bool },
    /// A watermark to a validator: an acknowledgement says it is back.
    Watermark { validator: u32 },
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
    /// The transactions running, by id (ordered, so a retry sends in the same order on every
    /// run of a seed).
    txns: BTreeMap<TxnId, Txn>,
    /// Every call in flight, by what it is for: the one router of answers (the map fetch
    /// aside, which its own small state machine tracks).
    calls: HashMap<CallId, CallFor>,
    /// Aborted programs waiting to run again: by timer, the program and its next attempt.
    reruns: BTreeMap<TimerId, (Program, u32)>,
    /// Decisions that were not acknowledged, to send again.
    lost_decisions: Vec<(u32, TxnId, bool)>,
    /// Releases of validators' held writes that were not acknowledged: retried as decisions
    /// are, so a lost one does not hold keys until the validator asks the primaries.
    lost_releases: Vec<(u32, TxnId, bool)>,
    /// Validators that did not answer or could not vote lately, and until when the client
    /// goes straight to the primaries in their place.
    validators_down: HashMap<u32, Nanos>,
    retry_timer: Option<TimerId>,
    /// Gets waiting out a prepared writer go out again at this timer.
    reread_timer: Option<TimerId>,
    /// A request failed since the map was last fetched; the fetch in flight, and which
    /// configuration replica to ask.
    map_refresh: crate::map_refresh::MapRefresh,
    results: Vec<ProgramResult>,
    history: Vec<TxnRecord>,
    /// Every read-write attempt that sent prepares, as it would commit.
    attempts: Vec<TxnRecord>,
    stats: ClientStats,
    cache: crate::kairos::ClientCache,
    /// The clock at the step being handled.
    now: Nanos,
}

impl TxnClient {
    pub fn new(config: TxnClientConfig) -> TxnClient {
        TxnClient {
            cache: crate::kairos::ClientCache::new(config.cache.clone()),
            config,
            ids: Ids::default(),
            next_seq: 1,
            last_ts: Timestamp::ZERO,
            observed: Timestamp::ZERO,
            watermark_timer: None,
            queue: VecDeque::new(),
            txns: BTreeMap::new(),
            calls: HashMap::new(),
            reruns: BTreeMap::new(),
            lost_decisions: Vec::new(),
            lost_releases: Vec::new(),
            validators_down: HashMap::new(),
            retry_timer: None,
            reread_timer: None,
            map_refresh: Default::default(),
            results: Vec::new(),
            history: Vec::new(),
            attempts: Vec::new(),
            stats: ClientStats::default(),
            now: 0,
        }
    }

    pub fn config(&self) -> &TxnClientConfig {
        &self.config
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

    /// What the client's cache did (all zero without caching).
    pub fn cache_stats(&self) -> &crate::kairos::CacheStats {
        self.cache.stats()
    }

    /// The client's clock at the step being handled, skew included: what a lease end is
    /// compared with.
    fn local_now(&self) -> Nanos {
        self.now.saturating_add_signed(self.config.clock_offset_ns)
    }

    /// Programs given and not finished, open session transactions, and decisions not yet
    /// acknowledged.
    pub fn outstanding(&self) -> usize {
        let deciding = self.calls.values().filter(|purpose| matches!(purpose, CallFor::Decide { .. })).count();
        self.queue.len() + self.txns.len() + self.reruns.len() + deciding + self.lost_decisions.len()
    }

    /// A timestamp of this client strictly above every one it gave before.
    fn next_ts(&mut self, now: Nanos) -> Timestamp {
        let now = now.saturating_add_signed(self.config.clock_offset_ns);
        let mut time = now.max(self.last_ts.time + 1);
        if self.config.clock == ClientClock::Hybrid {
            // A hybrid logical clock: also above every version seen, so a lagging physical
            // clock does not doom a write to a key just read.
            time = time.max(self.observed.time.saturating_add(1));
        }
        self.last_ts = Timestamp::new(time, self.config.client);
        self.last_ts
    }

    /// A new transaction id of this client.
    fn next_txn_id(&mut self) -> TxnId {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        crate::shard::txn_id(self.config.client, seq)
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

    fn send_decision(&mut self, shard: u32, txn: TxnId, commit: bool, out: &mut Out) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let call = self.ids.call();
        self.calls.insert(call, CallFor::Decide { shard, txn, commit });
        self.stats.decisions += 1;
        let decide = crate::messages::Decide { shard, epoch, txn, commit };
        out.push(Command::Call { to, call, request: Request::Decide(decide), deadline: self.config.deadline });
    }

    fn arm_retry(&mut self, out: &mut Out) {
        if self.retry_timer.is_none() {
            let timer = self.ids.timer();
            self.retry_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.retry_after });
        }
    }

    fn arm_reread(&mut self, out: &mut Out) {
        if self.reread_timer.is_none() {
            let timer = self.ids.timer();
            self.reread_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.reread_after });
        }
    }

    fn on_reread(&mut self, out: &mut Out) {
        self.reread_timer = None;
        let ids: Vec<TxnId> = self.txns.keys().copied().collect();
        for id in ids {
            let keys = self.txns.get_mut(&id).map(|txn| std::mem::take(&mut txn.rereads)).unwrap_or_default();
            if !keys.is_empty() {
                self.send_gets(id, keys, out);
            }
        }
    }

    fn on_retry(&mut self, now: Nanos, out: &mut Out) {
        self.retry_timer = None;
        let ids: Vec<TxnId> = self.txns.keys().copied().collect();
        for id in ids {
            self.resend_lost(id, out);
        }
        for (shard, txn, commit) in std::mem::take(&mut self.lost_decisions) {
            self.stats.retries += 1;
            self.send_decision(shard, txn, commit, out);
        }
        for (validator, txn, commit) in std::mem::take(&mut self.lost_releases) {
            self.stats.retries += 1;
            self.send_release(validator, txn, commit, out);
        }
        self.expire_sessions(now);
        self.fetch_map(out);
    }

    /// Asks the configuration service for the map after a failed request (a primary may
    /// have changed).
    fn fetch_map(&mut self, out: &mut Out) {
        let replicas = &self.config.config_replicas;
        out.extend(self.map_refresh.fetch(&mut self.ids, replicas, self.config.deadline));
    }

    fn on_map(&mut self, body: Result<Response, NetError>) {
        if let Some(map) = self.map_refresh.answered(body, &self.config.map) {
            tracing::info!(client = self.config.client, version = map.version(), "adopted a newer shard map");
            self.config.map = map;
            self.stats.maps_adopted += 1;
        }
    }

    fn on_response(&mut self, now: Nanos, call: CallId, result: Result<Response, NetError>, out: &mut Out) {
        let body = result;
        if self.map_refresh.is_fetch(call) {
            self.on_map(body);
            return;
        }
        if matches!(body, Err(_) | Ok(Response::Refused(_) | Response::WrongEpoch(_))) {
            // A primary may have changed (a watermark that did not arrive says so too).
            self.map_refresh.mark_stale();
            self.arm_retry(out);
        }
        let id = match self.calls.remove(&call) {
            Some(CallFor::Txn(id)) => id,
            Some(CallFor::Watermark { validator }) => {
                if matches!(body, Ok(Response::Ack)) {
                    self.validators_down.remove(&validator);
                }
                return;
            }
            Some(CallFor::Release { validator, txn, commit }) => {
                if !matches!(body, Ok(Response::Ack)) {
                    self.lost_releases.push((validator, txn, commit));
                    self.arm_retry(out);
                }
                return;
            }
            Some(CallFor::Decide { shard, txn, commit }) => {
                if !matches!(body, Ok(Response::Ack)) {
                    self.lost_decisions.push((shard, txn, commit));
                    self.arm_retry(out);
                }
                return;
            }
            None => return,
        };
        match self.txns.get(&id).map(|txn| &txn.phase) {
            Some(Phase::Reading(calls)) if calls.contains_key(&call) => self.on_read_reply(now, id, call, body, out),
            Some(Phase::Preparing { calls, .. }) if calls.contains_key(&call) => self.on_vote(id, call, body, out),
            Some(Phase::Validating { calls, .. }) if calls.contains_key(&call) => {
                self.on_validator_vote(id, call, body, out)
            }
            _ => {}
        }
        self.run_programs(now, out);
    }

    /// The timestamp this client reads at or above from now on: its oldest running
    /// transaction's begin, or above everything it gave out so far.
    fn watermark(&self) -> Timestamp {
        self.txns.values().map(|txn| txn.ts_begin).min().unwrap_or(self.last_ts)
    }

    /// Tells every primary and validator the client's watermark and `c_freshness`.
    fn broadcast_watermark(&mut self, now: Nanos, out: &mut Out) {
        self.expire_sessions(now);
        let watermark = self.watermark();
        // c_freshness: no older version than this will be presented for validation.
        let running = self.txns.values().flat_map(|txn| txn.reads.values().map(|read| read.freshness)).min();
        let freshness = [self.cache.freshness(), running].into_iter().flatten().fold(watermark, Timestamp::min);
        let mut peers: Vec<String> = self.config.map.groups().iter().map(|group| group.primary.clone()).collect();
        peers.sort();
        peers.dedup();
        let primaries = peers.len();
        peers.extend(self.config.validators.iter().cloned());
        for (index, peer) in peers.into_iter().enumerate() {
            let call = self.ids.call();
            if let Some(validator) = index.checked_sub(primaries) {
                self.calls.insert(call, CallFor::Watermark { validator: validator as u32 });
            }
            let request = crate::messages::Watermark { client: self.config.client, ts: watermark, freshness };
            out.push(Command::Call {
                to: peer,
                call,
                request: Request::Watermark(request),
                deadline: self.config.deadline,
            });
        }
        let timer = self.ids.timer();
        self.watermark_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.watermark_every });
    }

    /// Starts queued programs while fewer than the configured number run.
    fn run_programs(&mut self, now: Nanos, out: &mut Out) {
        // Several programs may finish within one start (read-only ones commit at once).
        loop {
            let running = self.txns.values().filter(|txn| txn.is_program()).count() + self.reruns.len();
            if running >= self.config.programs_in_flight.max(1) {
                return;
            }
            let Some(program) = self.queue.pop_front() else { return };
            self.start_program(now, program, 1, out);
        }
    }

    fn on_rerun(&mut self, now: Nanos, timer: TimerId, out: &mut Out) {
        if let Some((program, attempt)) = self.reruns.remove(&timer) {
            self.start_program(now, program, attempt, out);
        }
    }
}

impl Role for TxnClient {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ClientInput;

    fn step(&mut self, now: Nanos, event: Event<Dkv, std::convert::Infallible, ClientInput>, out: &mut Out) {
        self.now = now;
        match event {
            Event::Input(ClientInput::Programs(programs)) => self.queue.extend(programs),
            Event::Input(ClientInput::Session(request)) => self.on_session(now, request, out),
            Event::Response { call, result } => self.on_response(now, call, result, out),
            Event::Timer(timer) if Some(timer) == self.retry_timer => self.on_retry(now, out),
            Event::Timer(timer) if Some(timer) == self.reread_timer => self.on_reread(out),
            Event::Timer(timer) if self.reruns.contains_key(&timer) => self.on_rerun(now, timer, out),
            Event::Timer(timer) if Some(timer) == self.watermark_timer => self.broadcast_watermark(now, out),
            Event::Start => self.broadcast_watermark(now, out),
            Event::Request { from, call, request } => {
                let response = match request {
                    // EI: a primary calls back about a key this client cached.
                    Request::Invalidate(invalidate) => {
                        self.cache.invalidated(&invalidate.key, invalidate.version);
                        Response::Ack
                    }
                    _ => Response::refused(RefusalKind::WrongRole, "a client serves only invalidations"),
                };
                out.push(Command::Reply { to: from, call, response });
            }
            Event::Timer(_) | Event::IoDone { .. } => {}
        }
        self.run_programs(now, out);
    }
}
