//! An ordinary commit, as a primary sees it (MILANA's Algorithm 1 over SEMEL's
//! replication): a prepare is checked against the map, validated against the shard's
//! versions and latest reads, logged and replicated, and voted commit once it is safe
//! (`replication`); a decision is applied, logged and replicated, and acknowledged once
//! durable here. A vote to abort is remembered, so a retried prepare hears it again; a
//! transaction aborted before its prepare arrived is refused when it does.

use crate::messages::{Decide, Invalidate, RefusalKind, Request, Response, Vote};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::{Timestamp, TxnId};
use virga_txn::AbortReason;

use super::group_log::AfterLog;
use super::replication::PendingKind;
use super::DataCore;
use crate::shard::replica::{ShardRecord, TxnStatus};
use crate::shard::wire::PrepareRequest;
use crate::shard::DataIo;

impl DataCore {
    pub(super) fn on_prepare(
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
        if let Some(status) = replica.status(txn) {
            return match status {
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
                vote.floor = Some(replica.write_floor());
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

    pub(super) fn on_decide(
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
        let known = replica.status(txn);
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

    /// Applies a decision to this primary's replica, logs and replicates it; the waiter, if
    /// any, is answered once it is durable here.
    pub(super) fn decide_here(
        &mut self,
        shard: u32,
        txn: TxnId,
        commit: bool,
        waiter: Option<(String, CallId)>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let Some(replica) = self.replicas.get_mut(&shard) else { return };
        if commit && self.grants.mode().caches() {
            // The write rates the leases of cached keys come from; under EI, the callbacks.
            let (version, writes) =
                replica.txn(txn).map_or((Timestamp::ZERO, &[][..]), |entry| (entry.commit_ts, &entry.writes[..]));
            for write in writes {
                self.grants.written(&write.key, self.now);
                for sharer in self.grants.take_sharers(&write.key) {
                    let invalidate = Invalidate { key: write.key.clone(), version };
                    let call = self.ids.call();
                    self.stats.invalidations += 1;
                    out.push(Command::Call {
                        to: sharer,
                        call,
                        request: Request::Invalidate(invalidate),
                        deadline: self.config.replicate_deadline,
                    });
                }
            }
        }
        let record = ShardRecord::Decided { txn, commit };
        replica.apply(&record);
        self.termination.decided(&(shard, txn));
        self.stats.decisions += 1;
        self.replicate((shard, txn, PendingKind::Decided), record, waiter, out);
    }
}

pub(super) fn vote(result: Result<(), AbortReason>) -> Response {
    match result {
        Ok(()) => Response::Vote(Vote { commit: true, ..Vote::default() }),
        Err(reason) => Response::Vote(Vote { commit: false, reason: reason.name().to_string(), ..Vote::default() }),
    }
}
