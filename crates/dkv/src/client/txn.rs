//! One running transaction of a client, whichever its source: its reads at `ts_begin`, its
//! buffered writes, and its two-phase commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::messages::{Request, Response};
use bytes::Bytes;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::{Timestamp, TxnId};
use virga_txn::checker::TxnRecord;
use virga_txn::AbortReason;

use super::scan::ScanState;
use super::session::SessionTxn;
use super::{CallFor, Out, Program, ProgramOutcome, ProgramResult, ReadOnlyValidation, TxnClient};
use crate::kairos::CachedRead;
use crate::shard::wire::PrepareRequest;
use crate::shard::{ReadOp, WriteOp, MAX_KEYS_PER_GET};

#[derive(Debug, Default)]
pub(super) struct ReadState {
    pub(super) value: Option<Bytes>,
    pub(super) version: Timestamp,
    pub(super) writer: TxnId,
    pub(super) prepared_below: bool,
    /// Served from the client's cache (KAIROS): validated at the primaries.
    pub(super) cached: bool,
    /// Up to when the version read is known to be the newest: the snapshot of the get that
    /// fetched it (whose primary raised the key's latest read to it).
    pub(super) freshness: Timestamp,
}

/// A read in flight: gets of one shard's keys (one request), or one shard's part of a scan
/// (by its index).
pub(super) enum ReadCall {
    Get(Vec<Bytes>),
    Scan(usize, u32),
}

pub(super) enum Phase {
    /// Gets and scans in flight, by call.
    Reading(HashMap<CallId, ReadCall>),
    /// KAIROS: validations at the sharded validators in flight (by call, the validator's
    /// index), and the commit votes so far; the prepares follow for a read-write one.
    Validating {
        commit_ts: Timestamp,
        calls: HashMap<CallId, u32>,
        yes: BTreeSet<u32>,
        validators: Vec<u32>,
        participants: Vec<u32>,
        /// The validator of each key read or written, hashed once.
        owners: HashMap<Bytes, u32>,
    },
    /// Prepares in flight (by call), and the votes so far.
    Preparing {
        commit_ts: Timestamp,
        calls: HashMap<CallId, u32>,
        yes: BTreeSet<u32>,
        participants: Vec<u32>,
        /// A read-only transaction's validation alone (KAIROS): no decision follows.
        validate_only: bool,
    },
}

/// Where a transaction's operations come from.
pub(super) enum Source {
    /// A program's attempt: its reads go out at once, its writes follow from what they
    /// return, and an abort runs it again.
    Program { program: Program, attempt: u32 },
    /// An application's session: operations arrive one at a time, each answered.
    Session(SessionTxn),
}

pub(super) struct Txn {
    pub(super) source: Source,
    pub(super) id: TxnId,
    pub(super) ts_begin: Timestamp,
    pub(super) reads: BTreeMap<Bytes, ReadState>,
    pub(super) writes: BTreeMap<Bytes, Option<Bytes>>,
    pub(super) phase: Phase,
    /// The transaction's scans, as they come in.
    pub(super) scans: Vec<ScanState>,
    /// Requests to send again at the retry timer: gets by key, scans by (scan, shard),
    /// prepares by shard.
    pub(super) lost_gets: Vec<Bytes>,
    pub(super) lost_scans: Vec<(usize, u32)>,
    pub(super) lost_prepares: Vec<u32>,
    /// KAIROS: the validators this attempt passed over (the primaries validate in their
    /// place, above their leases).
    pub(super) passed_over: Vec<u32>,
    /// Validators this attempt asked again after a validation went unanswered.
    pub(super) validation_resent: Vec<u32>,
    /// The validators holding this transaction's writes, released once it is decided.
    pub(super) held_at: Vec<u32>,
    /// Gets waiting out a prepared writer, and how often each key was read again.
    pub(super) rereads: Vec<Bytes>,
    pub(super) reread_counts: HashMap<Bytes, u32>,
    /// Why the last request of this transaction failed (for a session's error).
    pub(super) last_failure: Option<Failure>,
    /// The shard of each key read or written, routed once (hashing a key is not free).
    pub(super) shards: HashMap<Bytes, u32>,
    /// When this attempt began (the client's step time).
    pub(super) started: Nanos,
    /// Reads may come from the client's cache (not a snapshot in the past).
    pub(super) uses_cache: bool,
}

impl Txn {
    pub(super) fn new(source: Source, id: TxnId, ts_begin: Timestamp, started: Nanos) -> Txn {
        Txn {
            started,
            source,
            id,
            ts_begin,
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            phase: Phase::Reading(HashMap::new()),
            scans: Vec::new(),
            lost_gets: Vec::new(),
            lost_scans: Vec::new(),
            lost_prepares: Vec::new(),
            passed_over: Vec::new(),
            validation_resent: Vec::new(),
            held_at: Vec::new(),
            rereads: Vec::new(),
            reread_counts: HashMap::new(),
            last_failure: None,
            shards: HashMap::new(),
            uses_cache: true,
        }
    }

    pub(super) fn is_program(&self) -> bool {
        matches!(self.source, Source::Program { .. })
    }

    /// No read in flight and none waiting to be sent again.
    pub(super) fn reads_done(&self) -> bool {
        matches!(&self.phase, Phase::Reading(calls) if calls.is_empty())
            && self.lost_gets.is_empty()
            && self.lost_scans.is_empty()
            && self.rereads.is_empty()
    }

    /// The committed record of this transaction at `commit_ts`.
    fn record(&self, commit_ts: Timestamp) -> TxnRecord {
        TxnRecord {
            id: self.id,
            commit_ts,
            reads: self.reads.iter().map(|(key, read)| (key.clone(), read.writer)).collect(),
            writes: self.writes.keys().cloned().collect(),
        }
    }
}

impl TxnClient {
    /// Starts a program's attempt.
    pub(super) fn start_program(&mut self, now: Nanos, program: Program, attempt: u32, out: &mut Out) {
        let id = self.next_txn_id();
        let ts_begin = match program.snapshot_at() {
            Some(at) => at,
            None => self.next_ts(now),
        };
        let keys = program.read_keys();
        let scans = ScanState::of_program(&program, &self.config.map);
        let mut txn = Txn::new(Source::Program { program, attempt }, id, ts_begin, self.now);
        txn.uses_cache = txn_may_cache(&txn);
        txn.scans = scans;
        self.txns.insert(id, txn);
        let keys = self.read_cached(id, keys);
        let scan_parts = self.scan_parts(id, 0);
        if keys.is_empty() && scan_parts.is_empty() {
            self.finish_reads(now, id, out);
            return;
        }
        self.send_gets(id, keys, out);
        for (index, shard) in scan_parts {
            self.send_scan(id, index, shard, out);
        }
    }

    /// Serves the transaction's reads of `keys` that the cache holds under a live lease;
    /// returns the others, to fetch.
    pub(super) fn read_cached(&mut self, id: TxnId, keys: Vec<Bytes>) -> Vec<Bytes> {
        if !self.cache.mode().caches() {
            return keys;
        }
        let now = self.local_now();
        let Some(txn) = self.txns.get_mut(&id).filter(|txn| txn.uses_cache) else { return keys };
        let mut missed = Vec::with_capacity(keys.len());
        for key in keys {
            match self.cache.read(&key, txn.ts_begin, now) {
                Some(hit) => {
                    self.observed = self.observed.max(hit.version);
                    let read = ReadState {
                        value: hit.value,
                        version: hit.version,
                        writer: hit.writer,
                        prepared_below: false,
                        cached: true,
                        freshness: hit.freshness,
                    };
                    txn.reads.insert(key, read);
                }
                None => missed.push(key),
            }
        }
        missed
    }

    /// Reads `keys` at the transaction's snapshot: one request to each shard's primary (a
    /// get for a lone key, a get_many for several).
    pub(super) fn send_gets(&mut self, id: TxnId, keys: Vec<Bytes>, out: &mut Out) {
        let mut by_shard: BTreeMap<u32, Vec<Bytes>> = BTreeMap::new();
        let map = &self.config.map;
        let Some(txn) = self.txns.get_mut(&id) else { return };
        for key in keys {
            let shard = *txn.shards.entry(key.clone()).or_insert_with(|| map.shard_of(&key).0);
            by_shard.entry(shard).or_default().push(key);
        }
        for (shard, keys) in by_shard {
            for part in keys.chunks(MAX_KEYS_PER_GET) {
                self.send_shard_gets(id, shard, part.to_vec(), out);
            }
        }
    }

    fn send_shard_gets(&mut self, id: TxnId, shard: u32, keys: Vec<Bytes>, out: &mut Out) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Reading(calls) = &mut txn.phase else { return };
        let call = self.ids.call();
        self.calls.insert(call, CallFor::Txn(id));
        self.stats.gets += 1;
        self.stats.keys_read += keys.len() as u64;
        let ts = txn.ts_begin;
        // A cached key's get carries the cache's mean inter-read time, for its lease.
        let cache = &self.cache;
        let caching = txn.uses_cache && cache.mode().caches();
        let interval = |key: &Bytes| if caching { cache.read_interval_ns(key) } else { 0 };
        let body = match keys.as_slice() {
            [key] => {
                let read_interval_ns = interval(key);
                Request::Get(crate::messages::Get { shard, epoch, key: key.clone(), ts, read_interval_ns })
            }
            _ => {
                let wire_keys = keys.clone();
                let mut read_intervals_ns: Vec<u64> =
                    if caching { keys.iter().map(interval).collect() } else { Vec::new() };
                if read_intervals_ns.iter().all(|&interval| interval == 0) {
                    read_intervals_ns.clear();
                }
                Request::GetMany(crate::messages::GetMany { shard, epoch, keys: wire_keys, ts, read_intervals_ns })
            }
        };
        calls.insert(call, ReadCall::Get(keys));
        let request = body;
        out.push(Command::Call { to, call, request, deadline: self.config.deadline });
    }

    pub(super) fn on_read_reply(
        &mut self,
        now: Nanos,
        id: TxnId,
        call: CallId,
        result: Result<Response, virga_net::NetError>,
        out: &mut Out,
    ) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Reading(calls) = &mut txn.phase else { return };
        let keys = match calls.remove(&call) {
            Some(ReadCall::Get(keys)) => keys,
            Some(ReadCall::Scan(index, shard)) => return self.on_scan_reply(now, id, index, shard, result, out),
            None => return,
        };
        let values = match result {
            Ok(Response::Value(reply)) if keys.len() == 1 => vec![reply],
            Ok(Response::Values(values)) if values.len() == keys.len() => values,
            // The versions this snapshot needs may be collected: run it again, newer.
            Ok(Response::TooOld(too_old)) => {
                let reason = too_old.explain(txn.ts_begin);
                self.aborted(id, reason, out);
                return;
            }
            failure => {
                txn.last_failure = Some(describe_failure(&failure));
                txn.lost_gets.extend(keys);
                return self.reads_progressed(now, id, out);
            }
        };
        let mut reread = false;
        for (key, reply) in keys.into_iter().zip(values) {
            let rereads = txn.reread_counts.get(&key).copied().unwrap_or(0);
            if reply.prepared_below && rereads < self.config.prepared_rereads {
                txn.reread_counts.insert(key.clone(), rereads + 1);
                txn.rereads.push(key);
                self.stats.rereads += 1;
                reread = true;
                continue;
            }
            let read = ReadState {
                value: reply.value,
                version: reply.version,
                writer: reply.writer,
                prepared_below: reply.prepared_below,
                cached: false,
                freshness: txn.ts_begin,
            };
            self.observed = self.observed.max(read.version);
            if txn.uses_cache && reply.lease_end_ns > 0 {
                // Fresh up to the snapshot: the primary raised the key's latest read to it.
                let copy = CachedRead {
                    value: read.value.clone(),
                    version: read.version,
                    writer: read.writer,
                    freshness: txn.ts_begin,
                };
                self.cache.fill(&key, copy, reply.lease_end_ns, read.prepared_below);
            }
            txn.reads.insert(key, read);
        }
        if reread {
            self.arm_reread(out);
        }
        self.reads_progressed(now, id, out);
    }

    /// After a read came back: answer the session's waiting operations, retry what was
    /// lost, and commit once everything is in and the commit is due.
    pub(super) fn reads_progressed(&mut self, now: Nanos, id: TxnId, out: &mut Out) {
        self.answer_session_reads(id);
        let Some(txn) = self.txns.get(&id) else { return };
        let lost = !txn.lost_gets.is_empty() || !txn.lost_scans.is_empty();
        let commit_due = match &txn.source {
            Source::Program { .. } => true,
            Source::Session(session) => session.commit_requested(),
        };
        let finish = txn.reads_done() && commit_due;
        if lost {
            self.arm_retry(out);
        }
        if finish {
            self.finish_reads(now, id, out);
        }
    }

    /// Every read is in and the commit is due: validate a read-only transaction here, or
    /// prepare at every participant.
    pub(super) fn finish_reads(&mut self, now: Nanos, id: TxnId, out: &mut Out) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        if let Source::Program { program, .. } = &txn.source {
            let values: BTreeMap<Bytes, Option<Bytes>> =
                txn.reads.iter().map(|(key, read)| (key.clone(), read.value.clone())).collect();
            txn.writes = program.writes(&values);
        }
        let any_cached = txn.reads.values().any(|read| read.cached);
        let read_only = txn.writes.is_empty();
        let validation = self.config.read_only_validation;
        if read_only && validation == ReadOnlyValidation::Local && !any_cached {
            let prepared =
                txn.reads.values().any(|read| read.prepared_below) || txn.scans.iter().any(|scan| scan.prepared_below);
            if prepared && !self.config.skip_local_validation {
                self.aborted(id, AbortReason::SnapshotPrepared.name().to_string(), out);
            } else {
                let ts = txn.ts_begin;
                self.committed(id, ts, true);
            }
            return;
        }
        // Validated alone at its snapshot: every read (a cached one's version is at or
        // below it) must still be the newest there.
        let validate_only = read_only && (any_cached || validation == ReadOnlyValidation::Validate);
        let commit_ts = if validate_only { txn.ts_begin } else { self.next_ts(now) };
        let map = &self.config.map;
        let Some(txn) = self.txns.get_mut(&id) else { return };
        for key in txn.writes.keys().chain(txn.reads.keys()) {
            if !txn.shards.contains_key(key) {
                txn.shards.insert(key.clone(), map.shard_of(key).0);
            }
        }
        let shards = &txn.shards;
        let mut participants: BTreeSet<u32> =
            txn.writes.keys().chain(txn.reads.keys()).filter_map(|key| shards.get(key).copied()).collect();
        participants.extend(txn.scans.iter().flat_map(|scan| scan.shards().iter().copied()));
        let participants: Vec<u32> = participants.into_iter().collect();
        if participants.is_empty() {
            // Read and wrote nothing: there is nothing to validate anywhere.
            self.committed(id, commit_ts, true);
            return;
        }
        if self.validates_at_validators(id, read_only, validate_only) {
            self.start_validation(id, commit_ts, participants, out);
            return;
        }
        self.start_prepares(id, commit_ts, participants, validate_only, out);
    }

    /// Phase 1 at the primaries: a prepare to every participant, or (`validate_only`) a
    /// read-only transaction's one-round validation.
    pub(super) fn start_prepares(
        &mut self,
        id: TxnId,
        commit_ts: Timestamp,
        participants: Vec<u32>,
        validate_only: bool,
        out: &mut Out,
    ) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        // A validation prepares nothing a terminator could commit.
        if self.config.keep_history && !validate_only {
            self.attempts.push(txn.record(commit_ts));
        }
        txn.phase = Phase::Preparing {
            commit_ts,
            calls: HashMap::new(),
            yes: BTreeSet::new(),
            participants: participants.clone(),
            validate_only,
        };
        for shard in participants {
            self.send_prepare(id, shard, out);
        }
    }

    fn send_prepare(&mut self, id: TxnId, shard: u32, out: &mut Out) {
        let (epoch, to) = (self.epoch_of(shard), self.primary_of(shard));
        let validators = self.config.validators.len() as u32;
        let one_round_trip = self.config.one_round_trip;
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let takeover = takeover_here(txn, shard, validators);
        let Phase::Preparing { commit_ts, calls, participants, validate_only, .. } = &mut txn.phase else { return };
        let validate_only = *validate_only;
        let shards = &txn.shards;
        let in_shard = |key: &Bytes| shards.get(key) == Some(&shard);
        let prepare = PrepareRequest {
            shard,
            epoch,
            txn: id,
            commit_ts: *commit_ts,
            reads: txn
                .reads
                .iter()
                .filter(|(key, _)| in_shard(key))
                .map(|(key, read)| ReadOp { key: key.clone(), version: read.version, cached: read.cached })
                .collect(),
            writes: txn
                .writes
                .iter()
                .filter(|(key, _)| in_shard(key))
                .map(|(key, value)| WriteOp { key: key.clone(), value: value.clone() })
                .collect(),
            participants: participants.clone(),
            scans: txn.scans.iter().filter(|scan| scan.covers(shard)).map(|scan| scan.range(txn.ts_begin)).collect(),
            commit_on_vote: participants.len() == 1 && one_round_trip && !validate_only,
            validate_only,
            takeover_validators: if validate_only { Vec::new() } else { takeover },
        };
        let call = self.ids.call();
        calls.insert(call, shard);
        self.calls.insert(call, CallFor::Txn(id));
        if validate_only {
            self.stats.validations += 1;
        } else {
            self.stats.prepares += 1;
        }
        let request = Request::Prepare(prepare);
        out.push(Command::Call { to, call, request, deadline: self.config.deadline });
    }

    pub(super) fn on_vote(
        &mut self,
        id: TxnId,
        call: CallId,
        result: Result<Response, virga_net::NetError>,
        out: &mut Out,
    ) {
        let one_round_trip = self.config.one_round_trip;
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Preparing { calls, yes, participants, commit_ts, validate_only } = &mut txn.phase else { return };
        let Some(shard) = calls.remove(&call) else { return };
        // A single participant commits on its vote, and a validation holds nothing: there is
        // no decision to send.
        let validate_only = *validate_only;
        let one_round = participants.len() == 1 && one_round_trip;
        let decide = !(validate_only || one_round);
        match result {
            Ok(Response::Vote(vote)) if vote.commit => {
                yes.insert(shard);
                if yes.len() == participants.len() {
                    let (commit_ts, participants) = (*commit_ts, participants.clone());
                    self.release(id, true, out);
                    self.committed(id, commit_ts, validate_only);
                    for shard in participants.into_iter().filter(|_| decide) {
                        self.send_decision(shard, id, true, out);
                    }
                }
            }
            Ok(Response::Vote(vote)) => {
                let participants = participants.clone();
                self.note_stale(id, &vote.stale);
                // A primary that took over refuses commit timestamps up to its floor: the
                // next one goes above it.
                if let Some(floor) = vote.floor {
                    if floor.time > self.last_ts.time {
                        self.last_ts = Timestamp::new(floor.time, self.config.client);
                    }
                }
                self.release(id, false, out);
                self.aborted(id, vote.reason, out);
                for shard in participants.into_iter().filter(|_| decide) {
                    self.send_decision(shard, id, false, out);
                }
            }
            failure => {
                txn.last_failure = Some(describe_failure(&failure));
                txn.lost_prepares.push(shard);
                self.arm_retry(out);
            }
        }
    }

    /// A vote named these keys' versions read as superseded: their cached copies go.
    pub(super) fn note_stale(&mut self, id: TxnId, stale: &[Bytes]) {
        let Some(txn) = self.txns.get(&id) else { return };
        for key in stale {
            let was_hit = txn.reads.get(key).is_some_and(|read| read.cached);
            self.cache.found_stale(key, was_hit);
        }
    }

    pub(super) fn committed(&mut self, id: TxnId, commit_ts: Timestamp, read_only: bool) {
        let Some(txn) = self.txns.remove(&id) else { return };
        // Counted by what it did, however it was validated.
        let wrote_nothing = txn.writes.is_empty();
        if self.cache.mode().caches() {
            for key in txn.writes.keys() {
                self.cache.wrote(key);
            }
        }
        self.stats.committed += 1;
        self.stats.committed_read_only += u64::from(wrote_nothing);
        let latency = self.now.saturating_sub(txn.started);
        if wrote_nothing {
            self.stats.commit_latency_read_only.record(latency);
        } else {
            self.stats.commit_latency_read_write.record(latency);
        }
        if self.config.keep_history {
            self.history.push(txn.record(commit_ts));
        }
        match txn.source {
            Source::Program { .. } if !self.config.keep_results => {}
            Source::Program { attempt, .. } => self.results.push(ProgramResult {
                outcome: ProgramOutcome::Committed { txn: id, commit_ts, read_only },
                scans: txn.scans.iter().map(ScanState::rows).collect(),
                reads: txn.reads.into_iter().map(|(key, read)| (key, read.value)).collect(),
                attempts: attempt,
            }),
            Source::Session(session) => session.committed(commit_ts, read_only),
        }
    }

    /// Ends a transaction's attempt with an abort: a program runs again after a pause
    /// (until its last attempt), a session is told.
    pub(super) fn aborted(&mut self, id: TxnId, reason: String, out: &mut Out) {
        let Some(txn) = self.txns.remove(&id) else { return };
        // Counted by the reason's name; the detail after it is for the application.
        let name = reason.split(':').next().unwrap_or_default();
        *self.stats.aborts.entry(name.to_string()).or_default() += 1;
        // A cached copy an aborted attempt read may be what doomed it (a participant that
        // refused for another reason first does not say): its next attempt fetches afresh,
        // so a stale copy cannot abort a program again and again.
        let mut read_cached = false;
        for (key, _) in txn.reads.iter().filter(|(_, read)| read.cached) {
            self.cache.drop_copy(key);
            read_cached = true;
        }
        match txn.source {
            Source::Program { program, attempt } if attempt < self.config.max_attempts => {
                // Run it again after a pause that grows with the attempts; at once if what
                // it read stale came from the cache (the copies are gone, no writer to wait
                // out).
                let stale_copy = read_cached && reason == AbortReason::ReadStale.name();
                let pause =
                    if stale_copy { std::time::Duration::ZERO } else { self.config.rerun_after * attempt.min(10) };
                let timer = self.ids.timer();
                self.reruns.insert(timer, (program, attempt + 1));
                out.push(Command::SetTimer { timer, after: pause });
            }
            Source::Program { .. } if !self.config.keep_results => {}
            Source::Program { attempt, .. } => self.results.push(ProgramResult {
                outcome: ProgramOutcome::Aborted { reason },
                reads: Vec::new(),
                scans: Vec::new(),
                attempts: attempt,
            }),
            Source::Session(session) => session.fail(super::SessionError::Aborted { reason }),
        }
    }

    /// Sends the transaction's lost requests again.
    pub(super) fn resend_lost(&mut self, id: TxnId, out: &mut Out) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let scans = std::mem::take(&mut txn.lost_scans);
        let gets = std::mem::take(&mut txn.lost_gets);
        let prepares = std::mem::take(&mut txn.lost_prepares);
        self.stats.retries += (gets.len() + scans.len() + prepares.len()) as u64;
        self.send_gets(id, gets, out);
        for (index, shard) in scans {
            self.send_scan(id, index, shard, out);
        }
        for shard in prepares {
            self.send_prepare(id, shard, out);
        }
    }
}

/// The validators `txn` passed over that own a key it writes in `shard`: that shard's primary
/// validates those writes in their place (only a write can land under a read a validator
/// vouched for alone; the reads are validated by the primaries anyway).
fn takeover_here(txn: &Txn, shard: u32, validators: u32) -> Vec<u32> {
    if txn.passed_over.is_empty() {
        return Vec::new();
    }
    let written_here = |validator: u32| {
        txn.writes.keys().any(|key| {
            txn.shards.get(key) == Some(&shard) && crate::kairos::validator::validator_of(key, validators) == validator
        })
    };
    txn.passed_over.iter().copied().filter(|validator| written_here(*validator)).collect()
}

/// Whether a transaction may read from the cache: not a snapshot in the past (a program's
/// `SnapshotAt`, a session begun at a timestamp), whose reads must be of that time.
fn txn_may_cache(txn: &Txn) -> bool {
    match &txn.source {
        Source::Program { program, .. } => program.snapshot_at().is_none(),
        Source::Session(_) => txn.uses_cache,
    }
}

/// Why a request of a transaction failed, for the error a session reports if it never
/// gets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The primary asked is at a newer epoch than the client's map.
    StaleMap { epoch: u64 },
    /// No answer, or a refusal.
    Unavailable(String),
}

pub(super) fn describe_failure(answer: &Result<Response, virga_net::NetError>) -> Failure {
    match answer {
        Ok(Response::WrongEpoch(epoch)) => Failure::StaleMap { epoch: *epoch },
        Err(error) => Failure::Unavailable(error.to_string()),
        Ok(Response::Refused(refusal)) => Failure::Unavailable(refusal.to_string()),
        Ok(other) => Failure::Unavailable(format!("an unexpected answer: {other:?}")),
    }
}
