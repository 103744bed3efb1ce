//! Cooperative termination (MILANA §3.3): a transaction prepared at this primary whose
//! decision does not come within `termination_after` (its client, the coordinator, may have
//! failed) is decided by this primary from what every participant primary knows of it:
//!
//! 1. a participant received the decision: follow it;
//! 2. a participant never received the prepare: abort (it refuses the prepare from then on);
//! 3. a participant voted abort: abort;
//! 4. every participant voted commit: commit.
//!
//! The decision is then applied here as if the client had sent it, and sent to the other
//! participants, retried until each acknowledges.

use std::collections::BTreeMap;

use crate::messages::{Decide, Invalidate, RefusalKind, Request, Response, TxnPhase, TxnQuery};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::{Timestamp, TxnId};
use virga_txn::AbortReason;

use super::{AfterLog, CallFor, DataCore, PendingKind};
use crate::layout::ShardId;
use crate::shard::replica::{ShardRecord, TxnStatus};
use crate::shard::wire;
use crate::shard::DataIo;

/// A termination in progress: the phases heard so far, by participant.
#[derive(Debug, Default)]
pub(super) struct Terminating {
    pub(super) heard: BTreeMap<u32, TxnPhase>,
    pub(super) calls: Vec<CallId>,
}

impl DataCore {
    /// Answers another primary's query: what this primary knows of `txn`. A transaction it
    /// never saw is refused from now on (logged before the answer), so rule 2 holds.
    pub(super) fn on_query(&mut self, from: &str, call: CallId, query: TxnQuery) -> Option<Response> {
        let TxnQuery { shard, txn, .. } = query;
        if let Err(refusal) = self.primary_of(shard, query.epoch) {
            return Some(refusal);
        }
        let known = self.replicas.get(&shard)?.txn(txn).map(|entry| entry.status);
        let phase = match known {
            Some(TxnStatus::Committed) => TxnPhase::Committed,
            Some(TxnStatus::Aborted) => TxnPhase::Aborted,
            // Prepared here but not yet held by f backups: this primary has not voted, and a
            // crash now would lose the prepare (its successor would answer never prepared).
            // Counting it as a vote could commit the transaction at the other participants
            // and lose it here. The terminator asks again at its next check.
            Some(TxnStatus::Prepared) if !self.prepare_is_safe(shard, txn) => {
                return Some(Response::refused(
                    RefusalKind::Unavailable,
                    format!("transaction {txn:x} is not yet prepared on f backups of shard {shard}; ask again"),
                ));
            }
            Some(TxnStatus::Prepared) => TxnPhase::Prepared,
            None if self.voted_abort.contains_key(&(shard, txn)) => TxnPhase::VotedAbort,
            None => {
                self.voted_abort.insert((shard, txn), AbortReason::Coordinator);
                let record = ShardRecord::Decided { txn, commit: false };
                // As the log will replay it: a decision before any prepare.
                if let Some(replica) = self.replicas.get_mut(&shard) {
                    replica.apply(&record);
                }
                let response = state(TxnPhase::NeverPrepared);
                let after = AfterLog::Reply { to: from.to_string(), call, response };
                self.unlogged.push((wire::encode_log_record(shard, &record), after));
                return None;
            }
        };
        Some(state(phase))
    }

    /// Whether this primary's prepare of `txn` is safe: logged here and held by f backups
    /// (what its commit vote waits for), or no longer being replicated at all.
    fn prepare_is_safe(&self, shard: u32, txn: TxnId) -> bool {
        self.pending.get(&(shard, txn, PendingKind::Prepared)).is_none_or(|pending| pending.answered)
    }

    /// Starts terminating every transaction prepared here longer than `termination_after`
    /// ago with no decision.
    pub(super) fn check_undecided(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, DataIo>>) {
        let after = self.config.termination_after.as_nanos() as u64;
        let due: Vec<(u32, TxnId)> = self
            .undecided
            .iter()
            .filter(|(key, since)| now.saturating_sub(**since) >= after && !self.terminating.contains_key(key))
            .map(|(key, _)| *key)
            .collect();
        for (shard, txn) in due {
            let leads = self.map.group(ShardId(shard)).is_some_and(|group| group.primary == self.config.node);
            if !leads || self.takeovers.contains_key(&shard) {
                continue;
            }
            if !self.prepare_is_safe(shard, txn) {
                // Its own vote is not cast yet (see `on_query`): wait for the backups.
                continue;
            }
            let Some(entry) = self.replicas.get(&shard).and_then(|replica| replica.txn(txn)) else { continue };
            if entry.status != TxnStatus::Prepared {
                self.undecided.remove(&(shard, txn));
                continue;
            }
            self.stats.terminations += 1;
            tracing::info!(node = %self.config.node, shard, txn, "terminating a transaction its coordinator left prepared");
            let others: Vec<u32> = entry.participants.iter().copied().filter(|other| *other != shard).collect();
            let mut terminating = Terminating::default();
            terminating.heard.insert(shard, TxnPhase::Prepared);
            for other in others {
                let Some(group) = self.map.group(ShardId(other)) else { continue };
                let call = self.ids.call();
                self.calls.insert(call, CallFor::Query { shard, txn, participant: other });
                terminating.calls.push(call);
                let query = TxnQuery { shard: other, epoch: group.epoch, txn };
                out.push(Command::Call {
                    to: group.primary.clone(),
                    call,
                    request: Request::Query(query),
                    deadline: self.config.replicate_deadline,
                });
            }
            self.terminating.insert((shard, txn), terminating);
            self.conclude(shard, txn, out);
        }
    }

    /// A participant's answer to a query (or none: the termination is started again later).
    pub(super) fn on_state(
        &mut self,
        call: CallId,
        shard: u32,
        txn: TxnId,
        other: u32,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let Some(terminating) = self.terminating.get_mut(&(shard, txn)) else { return };
        terminating.calls.retain(|pending| *pending != call);
        // The codec refuses a phase this build does not know: it is never a vote.
        if let Some(Response::State(phase)) = body {
            terminating.heard.insert(other, phase);
            self.conclude(shard, txn, out);
        }
        // Every answer of the round is in (or lost) and none decided it: forget the round;
        // the next check starts another. (An answer that came after a lost one would
        // otherwise leave the round open with nothing more to come, and the transaction
        // prepared for good.)
        if self.terminating.get(&(shard, txn)).is_some_and(|terminating| terminating.calls.is_empty()) {
            self.terminating.remove(&(shard, txn));
        }
    }

    /// Decides once the rules allow: at once on a decision or an abort vote, or when every
    /// participant has answered Prepared.
    fn conclude(&mut self, shard: u32, txn: TxnId, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(terminating) = self.terminating.get(&(shard, txn)) else { return };
        let Some(entry) = self.replicas.get(&shard).and_then(|replica| replica.txn(txn)) else { return };
        let participants = entry.participants.clone();
        let weakened = crate::shard::replica::weakened!(self.config.weakened, terminate_ignoring_missing_prepare);
        let heard: BTreeMap<u32, TxnPhase> = terminating
            .heard
            .iter()
            .map(|(shard, phase)| match phase {
                TxnPhase::NeverPrepared | TxnPhase::VotedAbort if weakened => (*shard, TxnPhase::Prepared),
                phase => (*shard, *phase),
            })
            .collect();
        let Some(commit) = termination_decision(&participants, &heard) else { return };
        self.terminating.remove(&(shard, txn));
        self.decide_here(shard, txn, commit, None, out);
        for other in participants.into_iter().filter(|other| *other != shard) {
            self.send_decision(other, txn, commit, out);
        }
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
        self.undecided.remove(&(shard, txn));
        self.stats.decisions += 1;
        self.replicate((shard, txn, PendingKind::Decided), record, waiter, out);
    }

    /// Sends a decision to another participant's primary, retried until acknowledged.
    pub(super) fn send_decision(&mut self, shard: u32, txn: TxnId, commit: bool, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(shard)) else { return };
        let call = self.ids.call();
        self.calls.insert(call, CallFor::Decide { shard, txn, commit });
        let decide = Decide { shard, epoch: group.epoch, txn, commit };
        out.push(Command::Call {
            to: group.primary.clone(),
            call,
            request: Request::Decide(decide),
            deadline: self.config.replicate_deadline,
        });
    }
}

/// The decision the termination rules reach from the phases heard of each participant, or
/// None while they do not decide it yet. A KAIROS validator holding the transaction's writes
/// reaches the same decision from the same answers.
pub(crate) fn termination_decision(participants: &[u32], heard: &BTreeMap<u32, TxnPhase>) -> Option<bool> {
    use TxnPhase::{Aborted, Committed, NeverPrepared, Prepared, VotedAbort};
    if heard.values().any(|phase| *phase == Committed) {
        Some(true)
    } else if heard.values().any(|phase| matches!(phase, Aborted | VotedAbort | NeverPrepared)) {
        Some(false)
    } else if participants.iter().all(|participant| heard.get(participant) == Some(&Prepared)) {
        Some(true)
    } else {
        None
    }
}

fn state(phase: TxnPhase) -> Response {
    Response::State(phase)
}
