//! A KAIROS validator as a role of the store (seed 004 §4.2, Algorithm 5): one of the
//! sharded validators, owning the keys `validator_of(key, V)`.
//!
//! It answers `Validate` with a vote from its [`ValidatorState`], holds a commit vote's
//! writes until the client's `Release` (or, if that never comes, until the participant
//! primaries say how the transaction ended: the primaries' own termination rules over
//! `TxnQuery`), and raises its floor to `ts_GC`, the minimum of the clients' reported
//! `c_freshness`.
//!
//! Its state is volatile. What keeps a restart safe is a lease on its own clock: it votes
//! commit only for commit timestamps below `now + lease`, so every read it raised and every
//! write it let through lies below the clock at its restart plus the lease, which is where a
//! restarted validator puts its floor. Check 1 of Algorithm 5 (freshness below the floor:
//! abort) and the refusal of writes at or below the floor then cover everything it forgot.
//! (The clock must not run backwards across a restart by more than the lease; the
//! simulator's node clocks and the process's wall clock, read at start, satisfy that.)
//!
//! It also votes commit on a read-only transaction only below the validator lease the
//! primaries of the shards it read granted it, renewed at each tick. A primary validates a
//! read-write transaction that passed over this validator only above that lease, and answers
//! the next renewal with the highest such commit timestamp, to which the validator raises its
//! floor before it votes again (`shard::core::validator_leases` has the argument).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use crate::messages::{
    RefusalKind, Release, Request, Response, TxnPhase, ValidateRequest, ValidatorGrant, ValidatorLease,
};
use crate::Dkv;
use virga_net::role::{CallId, Command, Event, Ids, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_storage::{Timestamp, TxnId};
use virga_txn::AbortReason;

use super::validator::{Validation, ValidatorAbort, ValidatorState, ValidatorWeakening};
use crate::layout::{ShardId, ShardMap};
use crate::map_refresh::MapRefresh;
use crate::shard::termination_decision;

/// The reason a validator gives for a commit timestamp beyond its lease.
pub const BEYOND_LEASE: &str = "beyond-validator-lease";

/// How many released transactions a validator remembers.
const REMEMBERED_RELEASES: usize = 65_536;

/// The reason a validator gives for a transaction it was already told the outcome of.
pub(super) const ALREADY_RELEASED: &str = "already-released";

/// The peer name of validator `index`.
pub fn validator_name(index: u32) -> String {
    format!("validator-{index}")
}

/// The index of the validator called `name` (None: not a validator's name).
pub fn validator_index(name: &str) -> Option<u32> {
    name.strip_prefix("validator-")?.parse().ok()
}

/// A validator's settings.
#[derive(Debug, Clone)]
pub struct ValidatorConfig {
    /// This validator's peer name, [`validator_name`] of its index.
    pub node: String,
    /// Its index: it owns the keys `validator_of(key, V) == index`.
    pub index: u32,
    /// The shard map, for the primaries it asks about held transactions; newer ones come
    /// from the configuration service.
    pub map: ShardMap,
    pub config_replicas: Vec<String>,
    /// Commit votes only for timestamps below the clock plus this; a restart puts the
    /// floor at the clock plus this.
    pub lease: Duration,
    /// This validator never ran before (a new cluster): it has forgotten nothing, so it
    /// starts with its floor at zero instead of past its lease.
    pub fresh: bool,
    /// A held transaction with no release for this long is asked about at its primaries.
    pub termination_after: Duration,
    /// The period of terminations and garbage collection.
    pub check_every: Duration,
    /// A client whose freshness was not heard for this long no longer holds back `ts_GC`
    /// (any floor is safe: a transaction below it aborts).
    pub report_expiry: Duration,
    /// The floor follows the clock at most this far behind, whatever the clients report: a
    /// client holding an old copy for long costs it an abort (or, read-only, a validation at
    /// the primaries) rather than the validator its memory.
    pub max_lag: Duration,
    pub deadline: Duration,
    /// How long a read-only validation blocked by a held writer waits for its release before
    /// it aborts (checked at each tick; zero: abort at once, as Algorithm 1 has it).
    pub park_for: Duration,
    pub weakened: ValidatorWeakening,
}

impl ValidatorConfig {
    pub fn new(index: u32, map: ShardMap) -> ValidatorConfig {
        ValidatorConfig {
            node: validator_name(index),
            index,
            map,
            config_replicas: Vec::new(),
            lease: Duration::from_millis(250),
            fresh: true,
            termination_after: Duration::from_secs(1),
            check_every: Duration::from_millis(100),
            report_expiry: Duration::from_secs(3),
            max_lag: Duration::from_secs(10),
            deadline: Duration::from_millis(500),
            park_for: Duration::from_millis(50),
            weakened: ValidatorWeakening::default(),
        }
    }
}

/// What a validator did.
#[derive(Debug, Clone, Default)]
pub struct ValidatorStats {
    pub validations: u64,
    pub commit_votes: u64,
    /// Read-only validations that waited for a held writer's release.
    pub parked: u64,
    /// Abort votes by reason.
    pub aborts: BTreeMap<String, u64>,
    pub releases: u64,
    /// Held transactions decided from the primaries' answers, and those of them committed.
    pub terminations: u64,
    pub terminated_commit: u64,
    /// Times a primary's grant raised the floor past writes validated in this validator's
    /// place.
    pub takeover_floors: u64,
    /// Keys with state, and the floor (`ts_GC`), at the last collection.
    pub keys: usize,
    pub floor: Timestamp,
}

/// A read-only validation waiting for a held writer's release.
struct Parked {
    from: String,
    call: CallId,
    request: ValidateRequest,
    since: Nanos,
}

/// A transaction this validator voted commit on and holds the writes of.
struct Held {
    participants: Vec<u32>,
    since: Nanos,
    heard: BTreeMap<u32, TxnPhase>,
    calls: Vec<CallId>,
}

pub struct ValidatorCore {
    config: ValidatorConfig,
    state: ValidatorState,
    ids: Ids,
    held: HashMap<TxnId, Held>,
    /// Termination queries in flight: the transaction and the shard asked.
    queries: HashMap<CallId, (TxnId, u32)>,
    /// Transactions released, newest last (at most [`REMEMBERED_RELEASES`]): a validation
    /// that arrives after its own release (reordered, or late after the client gave up on
    /// it) is refused rather than held with no release to come.
    released: HashSet<TxnId>,
    released_order: VecDeque<TxnId>,
    parked: Vec<Parked>,
    /// Each client's last reported freshness and when it came.
    reports: HashMap<u32, (Timestamp, Nanos)>,
    tick: Option<TimerId>,
    map_refresh: MapRefresh,
    /// Per shard, the end of the validator lease its primary granted (ns), and the renewals
    /// in flight (the shard asked).
    grants: BTreeMap<u32, Nanos>,
    renewals: HashMap<CallId, u32>,
    stats: ValidatorStats,
}

type Out = Vec<Command<Dkv, std::convert::Infallible>>;

/// Why the role votes abort: its own rules, or the state's.
enum Abort {
    AlreadyReleased,
    BeyondLease,
    Validator(ValidatorAbort),
}

impl Abort {
    fn name(&self) -> &'static str {
        match self {
            Abort::AlreadyReleased => ALREADY_RELEASED,
            Abort::BeyondLease => BEYOND_LEASE,
            Abort::Validator(abort) => abort.name(),
        }
    }
}

impl ValidatorCore {
    pub fn new(config: ValidatorConfig) -> ValidatorCore {
        let mut state = ValidatorState::new(Timestamp::ZERO);
        state.weaken(config.weakened);
        ValidatorCore {
            config,
            state,
            ids: Ids::default(),
            held: HashMap::new(),
            released: HashSet::new(),
            released_order: VecDeque::new(),
            parked: Vec::new(),
            queries: HashMap::new(),
            reports: HashMap::new(),
            tick: None,
            map_refresh: MapRefresh::default(),
            grants: BTreeMap::new(),
            renewals: HashMap::new(),
            stats: ValidatorStats::default(),
        }
    }

    pub fn config(&self) -> &ValidatorConfig {
        &self.config
    }

    pub fn stats(&self) -> &ValidatorStats {
        &self.stats
    }

    /// Transactions voted commit whose outcome this validator does not know yet.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn lease_end(&self, now: Nanos) -> Timestamp {
        Timestamp::new(now.saturating_add(self.config.lease.as_nanos() as u64), 0)
    }

    /// Commit votes go only to timestamps below this: its own lease and, for a read-only
    /// transaction, the grant of the primary of every shard holding a key it read (a shard
    /// with none yet, as after a start, allows nothing). Only a read-only transaction's reads
    /// rest on this validator alone; a read-write one's are validated by its primaries too.
    fn vote_bound(&self, now: Nanos, request: &ValidateRequest) -> Timestamp {
        if !request.writes.is_empty() {
            return self.lease_end(now);
        }
        let granted = request
            .reads
            .iter()
            .map(|read| self.grants.get(&self.config.map.shard_of(&read.key).0).copied().unwrap_or(0))
            .min()
            .unwrap_or(u64::MAX);
        self.lease_end(now).min(Timestamp::new(granted, 0))
    }

    /// Asks every shard's primary for the lease up to the clock plus `lease`.
    fn renew_leases(&mut self, now: Nanos, out: &mut Out) {
        let until_ns = now.saturating_add(self.config.lease.as_nanos() as u64);
        for (shard, group) in self.config.map.groups().iter().enumerate() {
            let shard = shard as u32;
            let call = self.ids.call();
            self.renewals.insert(call, shard);
            let lease = ValidatorLease { validator: self.config.index, shard, epoch: group.epoch, until_ns };
            out.push(Command::Call {
                to: group.primary.clone(),
                call,
                request: Request::ValidatorLease(lease),
                deadline: self.config.deadline,
            });
        }
    }

    /// A primary's answer to a renewal: first the floor rises to the highest commit
    /// timestamp validated in this validator's place, then the grant counts.
    fn on_grant(&mut self, shard: u32, body: Result<Response, NetError>) {
        match body {
            Ok(Response::ValidatorGrant(ValidatorGrant { until_ns, takeover_high })) => {
                if takeover_high > self.state.floor() {
                    self.state.collect(takeover_high);
                    self.stats.takeover_floors += 1;
                    tracing::info!(node = %self.config.node, shard, floor = takeover_high.time, "validator's floor raised past writes validated in its place");
                }
                let granted = self.grants.entry(shard).or_default();
                *granted = (*granted).max(until_ns);
            }
            // The primary may have changed: ask the configuration service before the next round.
            _ => self.map_refresh.mark_stale(),
        }
    }

    fn on_start(&mut self, now: Nanos, out: &mut Out) {
        if !self.config.fresh {
            // Everything the previous incarnation voted on lies below its lease, which ended
            // before this clock plus the lease.
            let floor = Timestamp::new(now.saturating_add(self.config.lease.as_nanos() as u64), u32::MAX);
            self.state.collect(floor);
            tracing::info!(node = %self.config.node, floor = floor.time, "validator restarted above its old lease");
        }
        self.renew_leases(now, out);
        self.arm_tick(out);
    }

    fn arm_tick(&mut self, out: &mut Out) {
        let timer = self.ids.timer();
        self.tick = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.check_every });
    }

    /// Votes on a validation, or (`None`) parks it: a read-only one whose only obstacle is a
    /// writer held at or below its timestamp waits for that writer's release, as a get waits
    /// out a prepared writer, rather than abort a transaction that may well be valid.
    fn on_validate(&mut self, now: Nanos, from: &str, call: CallId, request: ValidateRequest) -> Option<Response> {
        self.stats.validations += 1;
        let vote = self.judge(now, &request);
        let blocked = matches!(vote, Err(Abort::Validator(ValidatorAbort::Check(AbortReason::ReadPrepared))));
        if blocked && request.writes.is_empty() && !self.config.park_for.is_zero() {
            self.stats.parked += 1;
            self.parked.push(Parked { from: from.to_string(), call, request, since: now });
            return None;
        }
        Some(self.vote_body(&request, vote))
    }

    /// Algorithm 5 and the role's own rules; a commit vote with writes holds them.
    fn judge(&mut self, now: Nanos, request: &ValidateRequest) -> Result<(), Abort> {
        if self.released.contains(&request.txn) {
            return Err(Abort::AlreadyReleased);
        }
        if request.commit_ts >= self.vote_bound(now, request) {
            return Err(Abort::BeyondLease);
        }
        let validation = Validation {
            txn: request.txn,
            commit_ts: request.commit_ts,
            freshness: request.freshness,
            reads: &request.reads,
            writes: &request.writes,
        };
        self.state.validate(&validation).map_err(Abort::Validator)?;
        if !request.writes.is_empty() && !self.held.contains_key(&request.txn) {
            let participants = request.participants.clone();
            let held = Held { participants, since: now, heard: BTreeMap::new(), calls: Vec::new() };
            self.held.insert(request.txn, held);
        }
        Ok(())
    }

    fn vote_body(&mut self, request: &ValidateRequest, vote: Result<(), Abort>) -> Response {
        match vote {
            Ok(()) => {
                self.stats.commit_votes += 1;
                Response::Vote(crate::messages::Vote { commit: true, ..Default::default() })
            }
            Err(abort) => {
                let stale = match abort {
                    Abort::Validator(ValidatorAbort::Check(AbortReason::ReadStale)) => {
                        self.state.stale_reads(&request.reads).cloned().collect()
                    }
                    _ => Vec::new(),
                };
                let reason = abort.name().to_string();
                *self.stats.aborts.entry(reason.clone()).or_default() += 1;
                Response::Vote(crate::messages::Vote { commit: false, reason, stale, floor: None })
            }
        }
    }

    /// Judges the parked validations again (a writer was released): each still blocked
    /// waits on until `park_for` has passed (`expire`), then aborts.
    fn retry_parked(&mut self, now: Nanos, expire: bool, out: &mut Out) {
        if self.parked.is_empty() {
            return;
        }
        let park_for = self.config.park_for.as_nanos() as u64;
        for parked in std::mem::take(&mut self.parked) {
            let vote = self.judge(now, &parked.request);
            let blocked = matches!(vote, Err(Abort::Validator(ValidatorAbort::Check(AbortReason::ReadPrepared))));
            if blocked && !(expire && now.saturating_sub(parked.since) >= park_for) {
                self.parked.push(parked);
                continue;
            }
            let response = self.vote_body(&parked.request, vote);
            out.push(Command::Reply { to: parked.from, call: parked.call, response });
        }
    }

    fn on_release(&mut self, Release { txn, commit }: Release) -> Response {
        if self.held.remove(&txn).is_some() {
            self.stats.releases += 1;
        }
        self.state.decide(txn, commit);
        self.remember_release(txn);
        Response::Ack
    }

    fn remember_release(&mut self, txn: TxnId) {
        if !self.released.insert(txn) {
            return;
        }
        self.released_order.push_back(txn);
        if self.released_order.len() > REMEMBERED_RELEASES {
            if let Some(oldest) = self.released_order.pop_front() {
                self.released.remove(&oldest);
            }
        }
    }

    fn on_watermark(&mut self, now: Nanos, watermark: crate::messages::Watermark) -> Response {
        self.reports.insert(watermark.client, (watermark.freshness, now));
        Response::Ack
    }

    /// Raises the floor to `ts_GC` (the minimum freshness of the clients heard from lately),
    /// and asks about transactions held too long.
    fn on_tick(&mut self, now: Nanos, out: &mut Out) {
        let expiry = self.config.report_expiry.as_nanos() as u64;
        self.reports.retain(|_, (_, at)| now.saturating_sub(*at) < expiry);
        let lagging = Timestamp::new(now.saturating_sub(self.config.max_lag.as_nanos() as u64), 0);
        let reported = self.reports.values().map(|(freshness, _)| *freshness).min();
        self.state.collect(reported.map_or(lagging, |ts_gc| ts_gc.max(lagging)));
        self.stats.keys = self.state.len();
        self.stats.floor = self.state.floor();
        self.terminate_held(now, out);
        self.retry_parked(now, true, out);
        self.fetch_map(out);
        self.renew_leases(now, out);
        self.arm_tick(out);
    }

    fn terminate_held(&mut self, now: Nanos, out: &mut Out) {
        let after = self.config.termination_after.as_nanos() as u64;
        let due: Vec<TxnId> = self
            .held
            .iter()
            .filter(|(_, held)| held.calls.is_empty() && now.saturating_sub(held.since) >= after)
            .map(|(txn, _)| *txn)
            .collect();
        for txn in due {
            let Some(held) = self.held.get_mut(&txn) else { continue };
            held.heard.clear();
            for shard in held.participants.clone() {
                let Some(group) = self.config.map.group(ShardId(shard)) else { continue };
                let call = self.ids.call();
                self.queries.insert(call, (txn, shard));
                held.calls.push(call);
                let query = crate::messages::TxnQuery { shard, epoch: group.epoch, txn };
                out.push(Command::Call {
                    to: group.primary.clone(),
                    call,
                    request: Request::Query(query),
                    deadline: self.config.deadline,
                });
            }
        }
    }

    fn on_state(&mut self, call: CallId, body: Result<Response, NetError>) {
        let Some((txn, shard)) = self.queries.remove(&call) else { return };
        let Some(held) = self.held.get_mut(&txn) else { return };
        held.calls.retain(|pending| *pending != call);
        match body {
            // The codec refuses a phase this build does not know: it is never a vote.
            Ok(Response::State(phase)) => {
                held.heard.insert(shard, phase);
            }
            // A primary may have changed: ask the configuration service before the next round.
            _ => self.map_refresh.mark_stale(),
        }
        let Some(commit) = termination_decision(&held.participants, &held.heard) else { return };
        self.held.remove(&txn);
        self.state.decide(txn, commit);
        self.remember_release(txn);
        self.stats.terminations += 1;
        self.stats.terminated_commit += u64::from(commit);
        tracing::info!(node = %self.config.node, txn, commit, "validator learned a held transaction's outcome from its primaries");
    }

    fn fetch_map(&mut self, out: &mut Out) {
        out.extend(self.map_refresh.fetch(&mut self.ids, &self.config.config_replicas, self.config.deadline));
    }

    fn on_response(&mut self, call: CallId, result: Result<Response, NetError>) {
        let body = result;
        if self.map_refresh.is_fetch(call) {
            if let Some(map) = self.map_refresh.answered(body, &self.config.map) {
                self.config.map = map;
            }
        } else if let Some(shard) = self.renewals.remove(&call) {
            self.on_grant(shard, body);
        } else {
            self.on_state(call, body);
        }
    }
}

impl Role for ValidatorCore {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = std::convert::Infallible;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Dkv, std::convert::Infallible, std::convert::Infallible>,
        out: &mut Out,
    ) {
        match event {
            Event::Start => self.on_start(now, out),
            Event::Request { from, call, request } => {
                let response = match request {
                    Request::Validate(validate) => self.on_validate(now, &from, call, validate),
                    Request::Release(release) => {
                        let response = self.on_release(release);
                        self.retry_parked(now, false, out);
                        Some(response)
                    }
                    Request::Watermark(watermark) => Some(self.on_watermark(now, watermark)),
                    _ => Some(Response::refused(
                        RefusalKind::WrongRole,
                        "a validator serves only validations, releases and watermarks",
                    )),
                };
                if let Some(response) = response {
                    out.push(Command::Reply { to: from, call, response });
                }
            }
            Event::Response { call, result } => {
                self.on_response(call, result);
                self.retry_parked(now, false, out);
            }
            Event::Timer(timer) if Some(timer) == self.tick => self.on_tick(now, out),
            Event::Timer(_) => {}
            Event::IoDone { result, .. } => match result {},
            Event::Input(input) => match input {},
        }
    }
}

#[cfg(test)]
mod tests;
