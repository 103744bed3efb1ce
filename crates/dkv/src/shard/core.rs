//! A data node's core: the replicas of every shard the node holds, primaries and backups.
//!
//! A primary serves gets, validates and prepares transactions (Algorithm 1), and replicates
//! each prepare and decision to its 2f backups without ordering them (SEMEL). It votes
//! commit once the prepare is durable in its own log and f backups have acknowledged it:
//! with the primary, a majority of the group holds it. A backup logs what it is sent and
//! acknowledges once durable, in any order. Records of one step and of the steps while a
//! write is in flight go to the device together (group commit).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::messages::{Decide, Get, GetMany, ReadReply, RefusalKind, Request, Response, Row, Scan, ScanReply, Vote};
use crate::Dkv;
use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_storage::{Timestamp, TxnId};
use virga_txn::AbortReason;

mod config_link;
mod gauges;
mod gc;
mod group_log;
mod lease;
mod replication;
mod resync;
mod takeover;
mod termination;
mod validator_leases;

use self::group_log::AfterLog;
use self::replication::{PendingKey, PendingKind};
pub(crate) use self::termination::termination_decision;

use super::replica::{ShardRecord, ShardReplica, TxnStatus, Weakened};
use super::wire::{self, PrepareRequest};
use super::{DataIo, DataIoDone, DataStats};
use crate::layout::{ReplicaRole, ShardId, ShardMap};

/// Most keys one get_many may ask for.
pub const MAX_KEYS_PER_GET: usize = 1024;

/// A data node's settings.
#[derive(Debug, Clone)]
pub struct DataConfig {
    /// This node's peer name, as the map names it.
    pub node: String,
    pub map: ShardMap,
    /// Fsync each group of records before acknowledging them (`--sync group`).
    pub sync: bool,
    /// Deadline of one replication call to a backup.
    pub replicate_deadline: Duration,
    /// Pause before replicating again to a backup that did not acknowledge.
    pub retry_after: Duration,
    /// A transaction prepared here this long with no decision is terminated by this
    /// primary (its client may have failed).
    pub termination_after: Duration,
    /// How often undecided transactions, leases and the primaries' liveness are looked at.
    pub check_every: Duration,
    /// The configuration service's replicas (empty: the map never changes).
    pub config_replicas: Vec<String>,
    /// This node's session at the configuration service (unique per node and restart).
    pub session: String,
    /// Primaries serve reads under a lease from f backups, and a primary taking over
    /// refuses commit timestamps at or below the leases granted. Off only to show the
    /// anomaly it prevents: the switch exists only in test builds and under `sim` or
    /// `fuzzing`.
    #[cfg(any(test, feature = "sim", feature = "fuzzing"))]
    pub leases: bool,
    /// How far ahead of its clock a primary asks its lease to reach.
    pub lease_length: Duration,
    /// A backup that hears no lease request from its primary this long proposes to take
    /// over (the i-th backup waits i + 1 times this).
    pub suspect_after: Duration,
    /// How often the map is fetched from the configuration service.
    pub map_every: Duration,
    /// A client silent this long no longer holds the garbage-collection watermark back.
    pub client_expiry: Duration,
    /// How often a full garbage-collection pass runs (installs collect as they go).
    pub collect_every: Duration,
    pub weakened: Weakened,
    /// KAIROS: the lease rule for reads of keys a client caches (none: no lease).
    pub cache: crate::kairos::CacheMode,
    /// KAIROS: the longest lease a validator is granted past this node's clock.
    pub validator_lease: Duration,
    /// KAIROS: how long a validator's renewals are refused after a transaction passed over
    /// it (so that a validator its clients cannot reach stops voting).
    pub validator_revoke_for: Duration,
}

impl DataConfig {
    /// Whether read leases are on: always, but in the unsafe variant of the simulator.
    pub(crate) fn leases(&self) -> bool {
        #[cfg(any(test, feature = "sim", feature = "fuzzing"))]
        return self.leases;
        #[cfg(not(any(test, feature = "sim", feature = "fuzzing")))]
        return true;
    }

    pub fn new(node: impl Into<String>, map: ShardMap) -> DataConfig {
        DataConfig {
            node: node.into(),
            map,
            sync: true,
            replicate_deadline: Duration::from_millis(200),
            retry_after: Duration::from_millis(50),
            termination_after: Duration::from_millis(500),
            check_every: Duration::from_millis(100),
            config_replicas: Vec::new(),
            session: String::new(),
            #[cfg(any(test, feature = "sim", feature = "fuzzing"))]
            leases: true,
            lease_length: Duration::from_millis(400),
            suspect_after: Duration::from_millis(800),
            map_every: Duration::from_millis(300),
            client_expiry: Duration::from_secs(5),
            collect_every: Duration::from_secs(5),
            weakened: Weakened::default(),
            cache: crate::kairos::CacheMode::None,
            validator_lease: Duration::from_millis(250),
            validator_revoke_for: Duration::from_secs(1),
        }
    }
}

/// What one of this node's calls is for: its answer goes to the part of the core that made
/// it, and nowhere else.
enum CallFor {
    /// A pending record sent to a backup (replication).
    Replicate {
        key: PendingKey,
        backup: String,
    },
    /// A termination query to another participant's primary.
    Query {
        shard: u32,
        txn: TxnId,
        participant: u32,
    },
    /// A decision sent to another participant's primary (termination).
    Decide {
        shard: u32,
        txn: TxnId,
        commit: bool,
    },
    /// A new primary's fetch of a replica's table (takeover).
    Fetch {
        shard: u32,
    },
    /// A primary's lease request to a backup.
    Lease {
        shard: u32,
        backup: String,
    },
    /// A map read, or a configuration proposal, at the configuration service.
    Map,
    Proposal,
    /// A restarted backup's request for a shard's records again.
    Resync {
        shard: u32,
    },
}

pub struct DataCore {
    config: DataConfig,
    /// The newest map this node knows.
    map: ShardMap,
    replicas: BTreeMap<u32, ShardReplica>,
    ids: Ids,
    log: group_log::GroupLog,
    replication: replication::Replication,
    /// Every call in flight, by what it is for: the one router of answers.
    calls: HashMap<CallId, CallFor>,
    /// Transactions this primary voted abort on, so a retried prepare gets the same vote.
    voted_abort: HashMap<(u32, TxnId), AbortReason>,
    /// Sends again what was not acknowledged: records to backups, decisions to participants.
    retry_timer: Option<TimerId>,
    termination: termination::Termination,
    check_timer: Option<TimerId>,
    /// One-participant transactions this primary commits as soon as their vote is safe.
    commit_on_vote: BTreeSet<(u32, TxnId)>,
    /// Leases, shard primaries taking over, and the link to the configuration service.
    leases: lease::Leases,
    takeovers: takeover::Takeovers,
    link: config_link::ConfigLink,
    watermarks: gc::Watermarks,
    /// Soft leases for cached reads: each cached key's write rate, nothing per client.
    grants: crate::kairos::LeaseGrants,
    validator_leases: validator_leases::ValidatorLeases,
    resyncs: resync::Resyncs,
    /// The clock at the step being handled.
    now: Nanos,
    stats: DataStats,
    failed: Option<String>,
}

impl DataCore {
    /// A node with the replicas the map gives it, rebuilt from its log's records.
    pub fn new(config: DataConfig, records: Vec<(u32, ShardRecord)>) -> DataCore {
        let mut replicas = BTreeMap::new();
        for (shard, _) in config.map.shards_of_node(&config.node) {
            let mut replica = ShardReplica::new();
            replica.weaken(config.weakened);
            replicas.insert(shard.0, replica);
        }
        for (shard, record) in &records {
            // A shard this node joined after the map it starts with (a backup added later).
            let replica = replicas.entry(*shard).or_insert_with(|| {
                let mut replica = ShardReplica::new();
                replica.weaken(config.weakened);
                replica
            });
            replica.apply(record);
        }
        DataCore {
            grants: crate::kairos::LeaseGrants::new(config.cache),
            validator_leases: validator_leases::ValidatorLeases::default(),
            resyncs: resync::Resyncs::default(),
            map: config.map.clone(),
            link: config_link::ConfigLink::new(&config),
            config,
            replicas,
            ids: Ids::default(),
            log: group_log::GroupLog::default(),
            replication: replication::Replication::default(),
            calls: HashMap::new(),
            voted_abort: HashMap::new(),
            retry_timer: None,
            termination: termination::Termination::default(),
            check_timer: None,
            commit_on_vote: BTreeSet::new(),
            leases: lease::Leases::default(),
            takeovers: takeover::Takeovers::default(),
            watermarks: gc::Watermarks::default(),
            now: 0,
            stats: DataStats::default(),
            failed: None,
        }
    }

    /// The newest map this node has adopted.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    pub fn node(&self) -> &str {
        &self.config.node
    }

    pub fn replica(&self, shard: u32) -> Option<&ShardReplica> {
        self.replicas.get(&shard)
    }

    /// Loads initial data into the replicas of `key`'s shard on this node (before the run).
    pub fn load(&mut self, key: Bytes, value: Bytes) {
        let shard = self.map.shard_of(&key).0;
        if let Some(replica) = self.replicas.get_mut(&shard) {
            replica.load(key, value);
        }
    }

    /// The leases this node handed out for cached reads, by length: bucket k counts
    /// lengths in [2^k, 2^(k+1)) µs.
    pub fn lease_lengths(&self) -> &std::collections::BTreeMap<u32, u64> {
        self.grants.lengths()
    }

    pub fn stats(&self) -> &DataStats {
        &self.stats
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Records not yet acknowledged by every backup (a settled primary has none).
    pub fn replicating(&self) -> usize {
        self.replication.len()
    }

    /// Shards this restarted backup still waits to hear its primary's resync answer for.
    pub fn resyncs_waiting(&self) -> usize {
        self.resyncs.waiting()
    }

    /// Transactions prepared at this primary and not yet decided.
    pub fn undecided(&self) -> usize {
        self.termination.undecided()
    }

    /// Device appends in flight or waiting.
    pub fn unlogged(&self) -> usize {
        self.log.len()
    }

    /// This node's role in `shard` at `epoch`, if the map gives it one there.
    fn role(&self, shard: u32, epoch: u64) -> Result<ReplicaRole, Response> {
        let fence = self.replicas.get(&shard).map_or(0, |replica| replica.fence());
        if epoch < fence {
            return Err(Response::WrongEpoch(fence));
        }
        let group = self.map.group(ShardId(shard));
        match group {
            Some(group) if group.epoch == epoch => {
                if group.primary == self.config.node {
                    Ok(ReplicaRole::Primary)
                } else if group.backups.contains(&self.config.node) {
                    Ok(ReplicaRole::Backup)
                } else {
                    Err(Response::refused(
                        RefusalKind::NotServing,
                        format!("{} holds no replica of shard {shard}", self.config.node),
                    ))
                }
            }
            Some(group) => Err(Response::WrongEpoch(group.epoch)),
            None => Err(Response::refused(RefusalKind::NotServing, format!("shard {shard} is not in the map"))),
        }
    }

    fn primary_of(&self, shard: u32, epoch: u64) -> Result<(), Response> {
        match self.role(shard, epoch)? {
            ReplicaRole::Primary if self.takeovers.is_taking(shard) => Err(Response::refused(
                RefusalKind::Unavailable,
                format!("{} is taking over shard {shard}; retry", self.config.node),
            )),
            ReplicaRole::Primary => Ok(()),
            ReplicaRole::Backup => Err(Response::refused(
                RefusalKind::NotServing,
                format!("{} is a backup of shard {shard}, not its primary", self.config.node),
            )),
        }
    }

    fn on_request(
        &mut self,
        now: Nanos,
        from: String,
        call: CallId,
        request: Request,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let response = match request {
            Request::Get(get) => Some(self.on_get(&from, get)),
            Request::GetMany(get) => Some(self.on_get_many(&from, get)),
            Request::Scan(scan) => Some(self.on_scan(scan)),
            Request::Query(query) => self.on_query(&from, call, query),
            Request::Lease(lease) => self.on_lease_request(now, &from, call, lease),
            Request::Fetch(fetch) => self.on_fetch(&from, call, fetch),
            Request::Watermark(watermark) => Some(self.on_watermark(now, watermark)),
            Request::Prepare(prepare) => self.on_prepare(now, &from, call, prepare, out),
            Request::Decide(decide) => self.on_decide(&from, call, decide, out),
            Request::Replicate(replicate) => self.on_replicate(&from, call, replicate),
            Request::Resync(resync) => Some(self.on_resync(&from, resync, out)),
            Request::ValidatorLease(lease) => Some(self.on_validator_lease(lease)),
            Request::Raft(_) | Request::Propose(_) | Request::GetMap => {
                Some(Response::refused(RefusalKind::WrongRole, "a data node serves no configuration requests"))
            }
            Request::Invalidate(_) | Request::Validate(_) | Request::Release(_) => {
                Some(Response::refused(RefusalKind::WrongRole, "a data node serves no client or validator requests"))
            }
        };
        if let Some(response) = response {
            self.stats.refusals += u64::from(matches!(response, Response::Refused(_) | Response::WrongEpoch(_)));
            out.push(Command::Reply { to: from, call, response });
        }
    }

    fn on_get(&mut self, from: &str, get: Get) -> Response {
        if let Err(error) = wire::check_key(&get.key) {
            return Response::refused(RefusalKind::Invalid, format!("a malformed get: {error}"));
        }
        let ts = get.ts;
        if let Err(refusal) = self.check_read(get.shard, get.epoch, ts, std::slice::from_ref(&get.key)) {
            return refusal;
        }
        match self.read(from, get.shard, get.key, ts, get.read_interval_ns) {
            Some(value) => Response::Value(value),
            None => Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", get.shard)),
        }
    }

    fn on_get_many(&mut self, from: &str, get: GetMany) -> Response {
        if get.keys.is_empty() || get.keys.len() > MAX_KEYS_PER_GET {
            return Response::refused(
                RefusalKind::Invalid,
                format!("a get_many of {} keys (1 to {MAX_KEYS_PER_GET} may be asked at once)", get.keys.len()),
            );
        }
        if let Some(error) = get.keys.iter().find_map(|key| wire::check_key(key).err()) {
            return Response::refused(RefusalKind::Invalid, format!("a malformed get_many: {error}"));
        }
        if !get.read_intervals_ns.is_empty() && get.read_intervals_ns.len() != get.keys.len() {
            return Response::refused(
                RefusalKind::Invalid,
                format!(
                    "a get_many of {} keys with {} read intervals (none, or one a key)",
                    get.keys.len(),
                    get.read_intervals_ns.len()
                ),
            );
        }
        let ts = get.ts;
        if let Err(refusal) = self.check_read(get.shard, get.epoch, ts, &get.keys) {
            return refusal;
        }
        let mut values = Vec::with_capacity(get.keys.len());
        let intervals = get.read_intervals_ns.into_iter().chain(std::iter::repeat(0));
        for (key, interval) in get.keys.into_iter().zip(intervals) {
            match self.read(from, get.shard, key, ts, interval) {
                Some(value) => values.push(value),
                None => {
                    return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", get.shard))
                }
            }
        }
        Response::Values(values)
    }

    /// Whether this node may serve reads of `keys` in `shard` at `ts`: it is the primary at
    /// `epoch`, the keys are the shard's, `ts` is above the watermark and under its lease.
    fn check_read(&mut self, shard: u32, epoch: u64, ts: Timestamp, keys: &[Bytes]) -> Result<(), Response> {
        self.primary_of(shard, epoch)?;
        if keys.iter().any(|key| self.map.shard_of(key).0 != shard) {
            return Err(Response::refused(RefusalKind::Invalid, format!("a key is not in shard {shard}")));
        }
        if let Some(refusal) = self.too_old(shard, ts) {
            self.stats.too_old += 1;
            return Err(refusal);
        }
        if !self.under_lease(shard, ts) {
            self.stats.lease_refusals += 1;
            return Err(Response::refused(
                RefusalKind::Unavailable,
                format!("the lease of shard {shard} does not cover {ts} yet; retry"),
            ));
        }
        Ok(())
    }

    /// The snapshot read of `key` at `ts` by `from` (None: no replica of the shard here),
    /// with a lease if a client caching the key asked (`read_interval_ns` > 0); under EI,
    /// `from` is remembered as holding a copy.
    fn read(&mut self, from: &str, shard: u32, key: Bytes, ts: Timestamp, read_interval_ns: u64) -> Option<ReadReply> {
        let replica = self.replicas.get_mut(&shard)?;
        self.stats.gets += 1;
        let mut lease_end_ns = self.grants.grant(&key, read_interval_ns, self.now);
        if lease_end_ns > 0 && self.grants.mode() == crate::kairos::CacheMode::Ei && !self.grants.share(&key, from) {
            lease_end_ns = 0;
        }
        let found = replica.get(&key, ts);
        Some(ReadReply {
            value: found.value,
            version: found.version,
            writer: found.writer,
            prepared_below: found.prepared_below,
            lease_end_ns,
        })
    }

    fn on_scan(&mut self, scan: Scan) -> Response {
        let range = scan.range;
        if let Err(refusal) = self.primary_of(scan.shard, scan.epoch) {
            return refusal;
        }
        if let Some(refusal) = self.too_old(scan.shard, range.ts) {
            self.stats.too_old += 1;
            return refusal;
        }
        if !self.under_lease(scan.shard, range.ts) {
            self.stats.lease_refusals += 1;
            return Response::refused(
                RefusalKind::Unavailable,
                format!("the lease of shard {} does not cover {} yet; retry", scan.shard, range.ts),
            );
        }
        let Some(replica) = self.replicas.get_mut(&scan.shard) else {
            return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", scan.shard));
        };
        self.stats.scans += 1;
        let limit = (scan.limit as usize).clamp(1, wire::MAX_OPS_PER_SHARD);
        let found = replica.scan(range, limit);
        Response::Rows(ScanReply {
            rows: found
                .rows
                .into_iter()
                .map(|(key, version)| Row {
                    key,
                    value: version.value.unwrap_or_default(),
                    version: version.ts,
                    writer: version.writer,
                })
                .collect(),
            prepared_below: found.prepared_below,
        })
    }

    fn on_prepare(
        &mut self,
        now: Nanos,
        from: &str,
        call: CallId,
        prepare: PrepareRequest,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) -> Option<Response> {
        let (shard, txn) = (prepare.shard, prepare.txn);
        if let Err(refusal) = self.primary_of(shard, prepare.epoch) {
            return Some(refusal);
        }
        if let Some(key) = prepare
            .writes
            .iter()
            .map(|write| &write.key)
            .chain(prepare.reads.iter().map(|read| &read.key))
            .find(|key| self.map.shard_of(key).0 != shard)
        {
            return Some(Response::refused(RefusalKind::Invalid, format!("key {key:?} is not in shard {shard}")));
        }
        if prepare.validate_only {
            return Some(self.validate_read_only(prepare));
        }
        if let Some(reason) = self.voted_abort.get(&(shard, txn)) {
            return Some(vote(Err(*reason)));
        }
        let replica = self.replicas.get_mut(&shard)?;
        // Aborted before its prepare arrived (by its client, or by a termination), in an
        // earlier life of this node too.
        if replica.decided_early(txn) == Some(false) {
            return Some(vote(Err(AbortReason::Coordinator)));
        }
        // A retried prepare: answer as before, or wait with the first caller.
        if let Some(entry) = replica.txn(txn) {
            return match entry.status {
                TxnStatus::Aborted => Some(vote(Err(AbortReason::Coordinator))),
                _ if self
                    .replication
                    .wait_unanswered(&(shard, txn, PendingKind::Prepared), (from.to_string(), call)) =>
                {
                    None
                }
                _ => Some(vote(Ok(()))),
            };
        }
        if !prepare.takeover_validators.is_empty() {
            if let Err(floor) = self.check_takeover(shard, &prepare.takeover_validators, prepare.commit_ts) {
                self.stats.aborts += 1;
                self.voted_abort.insert((shard, txn), AbortReason::BelowCommitFloor);
                let mut answer = vote(Err(AbortReason::BelowCommitFloor));
                if let Response::Vote(vote) = &mut answer {
                    vote.floor = Some(floor);
                }
                return Some(answer);
            }
        }
        let replica = self.replicas.get_mut(&shard)?;
        if let Err(reason) = replica.validate(txn, prepare.commit_ts, &prepare.reads, &prepare.scans, &prepare.writes) {
            self.stats.aborts += 1;
            self.voted_abort.insert((shard, txn), reason);
            let mut answer = vote(Err(reason));
            if let (Response::Vote(vote), AbortReason::BelowCommitFloor) = (&mut answer, reason) {
                vote.floor = Some(replica.commit_floor());
            }
            if let (Response::Vote(vote), AbortReason::ReadStale) = (&mut answer, reason) {
                vote.stale = replica.stale_reads(&prepare.reads);
            }
            return Some(answer);
        }
        self.stats.prepares += 1;
        let record = ShardRecord::Prepared {
            txn,
            commit_ts: prepare.commit_ts,
            writes: prepare.writes,
            participants: prepare.participants,
            takeover_of: prepare.takeover_validators,
        };
        let record = replica.prepare(record, &prepare.reads, &prepare.scans);
        self.termination.prepared((shard, txn), now);
        if prepare.commit_on_vote {
            self.commit_on_vote.insert((shard, txn));
        }
        self.replicate((shard, txn, PendingKind::Prepared), record, Some((from.to_string(), call)), out);
        None
    }

    /// A read-only transaction's validation (KAIROS): Algorithm 1 on its reads at the commit
    /// timestamp, served under the read lease as a get at that timestamp would be; on
    /// success the reads raise their keys' latest read. Nothing is logged or remembered of
    /// the transaction: a retry validates again.
    fn validate_read_only(&mut self, prepare: PrepareRequest) -> Response {
        let (shard, ts) = (prepare.shard, prepare.commit_ts);
        if let Some(refusal) = self.too_old(shard, ts) {
            self.stats.too_old += 1;
            return refusal;
        }
        if !self.under_lease(shard, ts) {
            self.stats.lease_refusals += 1;
            return Response::refused(
                RefusalKind::Unavailable,
                format!("the lease of shard {shard} does not cover {ts} yet; retry"),
            );
        }
        let Some(replica) = self.replicas.get_mut(&shard) else {
            return Response::refused(RefusalKind::NotServing, format!("no replica of shard {shard}"));
        };
        self.stats.validations += 1;
        match replica.validate(prepare.txn, ts, &prepare.reads, &prepare.scans, &[]) {
            Ok(()) => {
                replica.note_validated_reads(ts, &prepare.reads, &prepare.scans);
                vote(Ok(()))
            }
            Err(reason) => {
                self.stats.aborts += 1;
                let mut answer = vote(Err(reason));
                if let (Response::Vote(vote), AbortReason::ReadStale) = (&mut answer, reason) {
                    vote.stale = replica.stale_reads(&prepare.reads);
                }
                answer
            }
        }
    }

    fn on_decide(
        &mut self,
        from: &str,
        call: CallId,
        decide: Decide,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) -> Option<Response> {
        let Decide { shard, txn, .. } = decide;
        if let Err(refusal) = self.primary_of(shard, decide.epoch) {
            return Some(refusal);
        }
        let replica = self.replicas.get_mut(&shard)?;
        let known = replica.txn(txn).map(|entry| entry.status);
        match known {
            // Already decided (a retry): acknowledge.
            Some(TxnStatus::Committed | TxnStatus::Aborted) => return Some(Response::Ack),
            Some(TxnStatus::Prepared) => {}
            // Never prepared here (this primary voted abort, or the prepare was lost):
            // nothing to undo, but the abort is logged so that a late prepare is refused,
            // after a restart too.
            None => {
                if decide.commit {
                    return Some(Response::refused(
                        RefusalKind::UnknownTxn,
                        format!("transaction {txn:x} never prepared at shard {shard}"),
                    ));
                }
                self.voted_abort.entry((shard, txn)).or_insert(AbortReason::Coordinator);
                let record = ShardRecord::Decided { txn, commit: false };
                replica.apply(&record);
                self.log.push(shard, &record, AfterLog::Reply { to: from.to_string(), call, response: Response::Ack });
                return None;
            }
        }
        self.decide_here(shard, txn, decide.commit, Some((from.to_string(), call)), out);
        None
    }

    fn on_response(&mut self, call: CallId, result: Result<Response, NetError>, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(purpose) = self.calls.remove(&call) else { return };
        let body = result.ok();
        let now = self.now;
        match purpose {
            CallFor::Replicate { key, backup } => self.on_replicated(key, backup, body, out),
            CallFor::Query { shard, txn, participant } => self.on_state(call, shard, txn, participant, body, out),
            CallFor::Decide { shard, txn, commit } => {
                if !matches!(body, Some(Response::Ack)) {
                    self.termination.lost_decision(shard, txn, commit);
                    self.arm_retry(out);
                }
            }
            CallFor::Fetch { shard } => self.on_table(now, call, shard, body, out),
            CallFor::Lease { shard, backup } => {
                if let Some(Response::Grant(until)) = body {
                    self.on_grant(shard, backup, until);
                }
            }
            CallFor::Map => self.on_map(now, call, body, out),
            CallFor::Proposal => self.on_proposed(now, call, body, out),
            CallFor::Resync { shard } => self.on_resynced(shard, body),
        }
    }

    /// A backup's answer to a replicated record.
    fn on_replicated(
        &mut self,
        key: PendingKey,
        backup: String,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let acknowledged = matches!(body, Some(Response::Ack));
        if !self.replication.call_ended(&key, backup, acknowledged) {
            return;
        }
        if acknowledged {
            self.settle(key, out);
        } else {
            self.stats.replication_retries += 1;
            self.arm_retry(out);
        }
    }

    fn arm_retry(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        if self.retry_timer.is_none() {
            let timer = self.ids.timer();
            self.retry_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.retry_after });
        }
    }

    fn arm_check(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        let timer = self.ids.timer();
        self.check_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.check_every });
    }

    fn on_written(&mut self, io: IoId, result: DataIoDone, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(afters) = self.log.completed(io) else { return };
        let DataIoDone::Appended(result) = result;
        if let Err(error) = result {
            tracing::error!(node = %self.config.node, %error, "a log append failed: the node stops");
            self.failed = Some(format!("a log append failed: {error}"));
            return;
        }
        self.stats.writes += 1;
        for after in afters {
            match after {
                AfterLog::LocalDurable(key) => {
                    self.replication.durable_here(&key);
                    self.settle(key, out);
                }
                AfterLog::Reply { to, call, response } => {
                    out.push(Command::Reply { to, call, response });
                }
            }
        }
    }

    /// Starts one device append of every record waiting, unless one is in flight.
    fn start_write(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        if let Some((io, records)) = self.log.start(&mut self.ids) {
            out.push(Command::Io { io, op: DataIo::Append { records, sync: self.config.sync } });
        }
    }
}

fn vote(result: Result<(), AbortReason>) -> Response {
    match result {
        Ok(()) => Response::Vote(Vote { commit: true, ..Vote::default() }),
        Err(reason) => Response::Vote(Vote { commit: false, reason: reason.name().to_string(), ..Vote::default() }),
    }
}

impl Role for DataCore {
    type Protocol = Dkv;
    type Io = DataIo;
    type IoDone = DataIoDone;
    type Input = ();

    fn step(&mut self, now: Nanos, event: Event<Dkv, DataIoDone, ()>, out: &mut Vec<Command<Dkv, DataIo>>) {
        if self.failed.is_some() {
            return;
        }
        self.now = now;
        match event {
            Event::Request { from, call, request } => self.on_request(now, from, call, request, out),
            Event::Response { call, result } => self.on_response(call, result, out),
            Event::Timer(timer) if Some(timer) == self.retry_timer => self.on_retry(out),
            Event::IoDone { io, result } => self.on_written(io, result, out),
            Event::Start => {
                self.resume_replication(now, out);
                // A primary (re)starting knows neither the reads it served nor what its
                // backups hold that it lost: it takes over its own shards.
                let led: Vec<(u32, u64)> = self
                    .map
                    .groups()
                    .iter()
                    .enumerate()
                    .filter(|(_, group)| group.primary == self.config.node)
                    .map(|(shard, group)| (shard as u32, group.epoch))
                    .collect();
                for (shard, epoch) in led {
                    self.start_takeover(shard, epoch, out);
                }
                self.start_resyncs(out);
                self.arm_check(out);
            }
            Event::Timer(timer) if Some(timer) == self.check_timer => {
                self.check_undecided(now, out);
                self.lease_tick(now, out);
                self.collect_garbage(now);
                let taking = self.takeovers.shards();
                for shard in taking {
                    self.send_fetches(shard, out);
                }
                self.send_resyncs(out);
                self.arm_check(out);
            }
            Event::Timer(_) | Event::Input(()) => {}
        }
        self.start_write(out);
    }
}
