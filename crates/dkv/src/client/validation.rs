//! KAIROS's sharded validators at the client (seed 004 §4.2): each validator judges the
//! reads and writes of the keys it owns (Algorithm 5); a transaction commits only if every
//! validator votes commit.
//!
//! - A read-only transaction validates at the validators alone, in one round, at its
//!   snapshot: the primaries see nothing of it.
//! - A read-write transaction validates its writes at the validators owning them first (its
//!   reads are judged by its primaries, which run Algorithm 1 in full), and then prepares at
//!   the primaries as before; it commits when every primary votes commit too, and the
//!   validators holding its writes are released with the outcome. Sequential rather than in
//!   parallel (as the seed has it) because the primaries' termination commits a transaction
//!   every participant prepared: a prepare must not go out before the validators agreed.
//!
//! When a validator does not answer, or has no lease to vote under (as after a restart), the
//! primaries take over its part:
//! - A read-only transaction validates at the primaries instead, at once. They stay complete
//!   validators of read-only transactions (every writer passes their Algorithm 1, and a get
//!   raises a key's latest read there).
//! - A read-write transaction prepares at the primaries passing over the validator: they
//!   validate it in the validator's place, but only above the validator lease they granted
//!   (a read the validator vouched for alone lies below it), so an attempt under it aborts
//!   with the floor to pass and runs again above it (`shard::core::validator_leases`).
//!
//! A validator that did not answer twice is passed over directly for a while, without waiting
//! for it again, until it acknowledges one of the client's watermarks.
//! (A read-write transaction whose freshness is below a validator's floor aborts: its cached
//! reads may be stale.)

use std::collections::{BTreeSet, HashMap};

use crate::messages::{Release, Request, Response};
use bytes::Bytes;
use virga_net::role::{CallId, Command};
use virga_storage::{Timestamp, TxnId};

use super::txn::{describe_failure, Phase};
use super::{CallFor, Out, TxnClient};
use crate::kairos::validator::{validator_of, ValidatorAbort};
use crate::kairos::{ValidateRequest, BEYOND_LEASE};
use crate::shard::ReadOp;

/// How long a validator that did not answer (twice) is passed over directly.
const PASS_OVER_FOR_NS: u64 = 500_000_000;

impl TxnClient {
    fn validator_count(&self) -> u32 {
        self.config.validators.len() as u32
    }

    /// Whether the transaction validates at the validators: every read-write one when there
    /// are validators, and a read-only one that validates remotely in one round, unless the
    /// primaries must judge it (a scan's range, a read that saw a prepared writer).
    pub(super) fn validates_at_validators(&self, id: TxnId, read_only: bool, validate_only: bool) -> bool {
        if self.config.validators.is_empty() {
            return false;
        }
        let Some(txn) = self.txns.get(&id) else { return false };
        if !read_only {
            return true;
        }
        validate_only && txn.scans.is_empty() && !txn.reads.values().any(|read| read.prepared_below)
    }

    /// Sends each validator owning a key of the transaction its part; one known to be down
    /// is passed over at once.
    pub(super) fn start_validation(&mut self, id: TxnId, commit_ts: Timestamp, participants: Vec<u32>, out: &mut Out) {
        let count = self.validator_count();
        let now = self.now;
        self.validators_down.retain(|_, until| *until > now);
        let Some(txn) = self.txns.get_mut(&id) else { return };
        // A read-write transaction's reads are judged by its primaries (Algorithm 1 in full):
        // the validators judge only its writes, against the reads they vouched for alone.
        let judged: Box<dyn Iterator<Item = &Bytes>> =
            if txn.writes.is_empty() { Box::new(txn.reads.keys()) } else { Box::new(txn.writes.keys()) };
        let owners: HashMap<Bytes, u32> = judged.map(|key| (key.clone(), validator_of(key, count))).collect();
        let validators: BTreeSet<u32> = owners.values().copied().collect();
        let (down, up): (Vec<u32>, Vec<u32>) =
            validators.iter().partition(|validator| self.validators_down.contains_key(validator));
        txn.phase = Phase::Validating {
            commit_ts,
            calls: HashMap::new(),
            yes: BTreeSet::new(),
            validators: validators.iter().copied().collect(),
            participants,
            owners,
        };
        if !down.is_empty() && txn.writes.is_empty() {
            return self.validate_at_primaries(id, out);
        }
        for validator in down {
            self.pass_over(id, validator, out);
        }
        for validator in up {
            self.send_validation(id, validator, out);
        }
    }

    pub(super) fn send_validation(&mut self, id: TxnId, validator: u32, out: &mut Out) {
        let Some(to) = self.config.validators.get(validator as usize).cloned() else { return };
        let deadline = self.config.deadline;
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Validating { commit_ts, calls, participants, owners, .. } = &mut txn.phase else { return };
        let owned = |key: &Bytes| owners.get(key) == Some(&validator);
        let read_only = txn.writes.is_empty();
        let reads = txn.reads.iter().filter(|(key, _)| read_only && owned(key));
        let freshness = reads.clone().map(|(_, read)| read.freshness).min().unwrap_or(*commit_ts);
        let reads: Vec<ReadOp> =
            reads.map(|(key, read)| ReadOp { key: key.clone(), version: read.version, cached: read.cached }).collect();
        let writes: Vec<Bytes> = txn.writes.keys().filter(|key| owned(key)).cloned().collect();
        let request = ValidateRequest {
            txn: id,
            commit_ts: *commit_ts,
            freshness,
            reads,
            participants: if writes.is_empty() { Vec::new() } else { participants.clone() },
            writes,
        };
        let call = self.ids.call();
        calls.insert(call, validator);
        self.calls.insert(call, CallFor::Txn(id));
        self.stats.validator_validations += 1;
        let request = Request::Validate(request);
        out.push(Command::Call { to, call, request, deadline });
    }

    pub(super) fn on_validator_vote(
        &mut self,
        id: TxnId,
        call: CallId,
        result: Result<Response, virga_net::NetError>,
        out: &mut Out,
    ) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let read_only = txn.writes.is_empty();
        let Phase::Validating { calls, yes, validators, participants, commit_ts, owners } = &mut txn.phase else {
            return;
        };
        let Some(validator) = calls.remove(&call) else { return };
        match result {
            Ok(Response::Vote(vote)) if vote.commit => {
                let holds = txn.writes.keys().any(|key| owners.get(key) == Some(&validator));
                if holds && !txn.held_at.contains(&validator) {
                    txn.held_at.push(validator);
                }
                yes.insert(validator);
                if yes.len() + txn.passed_over.len() == validators.len() {
                    let (commit_ts, participants) = (*commit_ts, std::mem::take(participants));
                    if read_only {
                        self.committed(id, commit_ts, true);
                    } else {
                        self.start_prepares(id, commit_ts, participants, false, out);
                    }
                }
            }
            Ok(Response::Vote(vote)) if vote.reason == BEYOND_LEASE => {
                if read_only {
                    return self.validate_at_primaries(id, out);
                }
                self.pass_over(id, validator, out);
            }
            Ok(Response::Vote(vote)) => {
                if read_only && vote.reason == ValidatorAbort::BelowGc.name() {
                    return self.validate_at_primaries(id, out);
                }
                // Every validator sent a part with writes is released, not only those that
                // voted yes so far: a vote still on its way holds them too.
                txn.held_at = validators
                    .iter()
                    .copied()
                    .filter(|validator| txn.writes.keys().any(|key| owners.get(key) == Some(validator)))
                    .collect();
                self.note_stale(id, &vote.stale);
                self.release(id, false, out);
                self.aborted(id, vote.reason, out);
            }
            failure => {
                txn.last_failure = Some(describe_failure(&failure));
                if read_only {
                    return self.validate_at_primaries(id, out);
                }
                // One lost message is not a failed validator: asked once more first, since
                // passing over it costs a wait past its lease (and revokes it a while).
                if !txn.validation_resent.contains(&validator) {
                    txn.validation_resent.push(validator);
                    self.stats.retries += 1;
                    return self.send_validation(id, validator, out);
                }
                self.validators_down.insert(validator, self.now.saturating_add(PASS_OVER_FOR_NS));
                self.pass_over(id, validator, out);
            }
        }
    }

    /// The primaries validate a read-write transaction in `validator`'s place. (Should the
    /// validator hold the transaction's writes, its vote lost, its termination frees them
    /// once the primaries know the outcome: a release to it might never be acknowledged.)
    /// Once every validator voted commit or was passed over, the prepares go out, naming
    /// those passed over.
    fn pass_over(&mut self, id: TxnId, validator: u32, out: &mut Out) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Validating { yes, validators, participants, commit_ts, .. } = &mut txn.phase else {
            return;
        };
        if txn.passed_over.contains(&validator) {
            return;
        }
        txn.passed_over.push(validator);
        if yes.len() + txn.passed_over.len() == validators.len() {
            let (commit_ts, participants) = (*commit_ts, std::mem::take(participants));
            self.stats.validator_takeovers += 1;
            self.start_prepares(id, commit_ts, participants, false, out);
        }
    }

    /// The primaries take over a read-only transaction's validation: one round at its
    /// snapshot, as without validators.
    fn validate_at_primaries(&mut self, id: TxnId, out: &mut Out) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Phase::Validating { participants, .. } = &mut txn.phase else { return };
        let (participants, ts_begin) = (std::mem::take(participants), txn.ts_begin);
        self.stats.validator_fallbacks += 1;
        self.start_prepares(id, ts_begin, participants, true, out);
    }

    /// Tells the validators holding the transaction's writes how it ended (retried until
    /// each acknowledges).
    pub(super) fn release(&mut self, id: TxnId, commit: bool, out: &mut Out) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        for validator in std::mem::take(&mut txn.held_at) {
            self.send_release(validator, id, commit, out);
        }
    }

    pub(super) fn send_release(&mut self, validator: u32, id: TxnId, commit: bool, out: &mut Out) {
        let Some(to) = self.config.validators.get(validator as usize).cloned() else { return };
        let release = Release { txn: id, commit };
        let call = self.ids.call();
        self.calls.insert(call, CallFor::Release { validator, txn: id, commit });
        self.stats.releases += 1;
        let request = Request::Release(release);
        out.push(Command::Call { to, call, request, deadline: self.config.deadline });
    }
}
