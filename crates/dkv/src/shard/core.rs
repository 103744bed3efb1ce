//! A data node's core: the replicas of every shard the node holds, primaries and backups.
//!
//! A primary serves gets, validates and prepares transactions (Algorithm 1), and replicates
//! each prepare and decision to its 2f backups without ordering them (SEMEL). It votes
//! commit once the prepare is durable in its own log and f backups have acknowledged it:
//! with the primary, a majority of the group holds it. A backup logs what it is sent and
//! acknowledges once durable, in any order. Records of one step and of the steps while a
//! write is in flight go to the device together (group commit).
//!
//! Each part owns its state and is tested on its own; this file routes events to them:
//! `reads` (gets and scans), `commit` (an ordinary commit, prepare to decision),
//! `replication` and `group_log` (what the commit waits for), `termination` (transactions
//! their client left prepared), `takeover` (Algorithm 2), `lease` (read leases and
//! suspicion), `config_link` (the map), `gc` (watermarks), `resync` (a backup that lost
//! records), and KAIROS's `validator_leases`. Every answer to a call this node makes comes
//! back through one router, `on_response`, by what the call was for (`CallFor`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::messages::{RefusalKind, Request, Response};
use crate::Dkv;
use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_storage::TxnId;
use virga_txn::AbortReason;

mod commit;
mod config_link;
mod gauges;
mod gc;
mod group_log;
mod lease;
mod reads;
mod replication;
mod resync;
mod takeover;
mod termination;
mod validator_leases;

use self::commit::vote;
use self::group_log::AfterLog;
use self::replication::{PendingKey, SETTLED_PART_BYTES};
pub(crate) use self::termination::termination_decision;

use super::replica::{ShardRecord, ShardReplica, Weakened};
use super::{DataIo, DataIoDone, DataStats};
use crate::layout::{ReplicaRole, ShardId, ShardMap};

/// How long versions stay readable behind the newest commit unless configured otherwise
/// (FoundationDB's MVCC window).
pub const DEFAULT_SNAPSHOT_WINDOW: Duration = Duration::from_secs(5);

/// The longest snapshot window a node accepts (a day).
pub const MAX_SNAPSHOT_WINDOW: Duration = Duration::from_secs(86_400);

/// Records between two checkpoints of a data node's log unless configured otherwise.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 100_000;

/// The size of a data node's log segments unless configured otherwise.
pub const DEFAULT_LOG_SEGMENT_BYTES: u64 = 16 << 20;

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
    /// Versions stay readable this long behind this primary's clock: the watermark never
    /// passes it (`--snapshot-window`).
    pub snapshot_window: Duration,
    /// A checkpoint of every shard goes to the log after this many records, and the log
    /// drops the segments before it.
    pub checkpoint_every: u64,
    /// The log's segments start anew past this many bytes (truncation drops whole ones).
    pub log_segment_bytes: u64,
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
            snapshot_window: DEFAULT_SNAPSHOT_WINDOW,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_BYTES,
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
    /// Parts of settled state this primary has sent (each numbered by the count).
    settled_parts_sent: u64,
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
        // What the log replayed is durable: grants under its lease ceilings need no write.
        let mut leases = lease::Leases::default();
        for (shard, replica) in &replicas {
            leases.ceiling_durable(*shard, replica.lease_granted());
        }
        DataCore {
            grants: crate::kairos::LeaseGrants::new(config.cache),
            validator_leases: validator_leases::ValidatorLeases::default(),
            resyncs: resync::Resyncs::default(),
            settled_parts_sent: 0,
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
            leases,
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
            CallFor::Lease { shard, backup } => match body {
                Some(Response::Grant(until)) => self.on_grant(shard, backup, until),
                // The backup holds a newer map (a backup added or removed): fetch it now,
                // before the backups, hearing only refused requests, suspect this primary.
                Some(Response::WrongEpoch(epoch))
                    if self.map.group(ShardId(shard)).is_some_and(|group| group.epoch < epoch) =>
                {
                    self.fetch_map(now, out)
                }
                _ => {}
            },
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
                AfterLog::LeaseGranted { shard, ceiling, to, call, response } => {
                    self.leases.ceiling_durable(shard, ceiling);
                    out.push(Command::Reply { to, call, response });
                }
                AfterLog::Checkpointed | AfterLog::Nothing => {}
            }
        }
    }

    /// Starts one device append of every record waiting, unless one is in flight.
    fn start_write(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        if let Some((io, records, checkpoint_from)) = self.log.start(&mut self.ids) {
            out.push(Command::Io { io, op: DataIo::Append { records, sync: self.config.sync, checkpoint_from } });
        }
    }

    /// Every `checkpoint_every` records: every shard's state as the records that rebuild it
    /// (its settled state in parts, its lease and fence, its live entries), after which the
    /// log drops what came before. A crash before the checkpoint is durable leaves the old
    /// log whole; replaying older records before a checkpoint changes nothing it holds.
    fn checkpoint_if_due(&mut self) {
        if !self.log.checkpoint_due(self.config.checkpoint_every) {
            return;
        }
        let mut records = Vec::new();
        for (&shard, replica) in &self.replicas {
            records.extend(replica.checkpoint_records(SETTLED_PART_BYTES).into_iter().map(|record| (shard, record)));
        }
        self.stats.checkpoints += 1;
        self.log.push_checkpoint(records);
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
                self.checkpoint_if_due();
                self.arm_check(out);
            }
            Event::Timer(_) | Event::Input(()) => {}
        }
        self.start_write(out);
    }
}
