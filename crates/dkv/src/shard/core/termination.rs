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
//!
//! [`Termination`] holds the state: what is undecided since when, the rounds of queries in
//! progress, and decisions to send again; the core makes the calls and applies decisions.

use std::collections::BTreeMap;

use crate::messages::{Decide, RefusalKind, Request, Response, TxnPhase, TxnQuery};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::TxnId;
use virga_txn::AbortReason;

use super::group_log::AfterLog;
use super::replication::PendingKind;
use super::{CallFor, DataCore};
use crate::layout::ShardId;
use crate::shard::replica::{ShardRecord, TxnStatus};
use crate::shard::DataIo;

/// A round of queries in progress: the phases heard so far, by participant, and the calls
/// still out.
#[derive(Debug, Default)]
struct Round {
    heard: BTreeMap<u32, TxnPhase>,
    calls: Vec<CallId>,
}

/// A transaction prepared at this primary, by shard and id.
type TxnKey = (u32, TxnId);

/// What this primary knows of the transactions it may have to terminate.
#[derive(Debug, Default)]
pub(super) struct Termination {
    /// Transactions prepared here with no decision yet, and since when.
    undecided: BTreeMap<TxnKey, Nanos>,
    rounds: BTreeMap<TxnKey, Round>,
    /// Decisions to other participants that were not acknowledged, to send again.
    lost_decisions: Vec<(u32, TxnId, bool)>,
}

impl Termination {
    /// `txn` is prepared here (or found prepared after a restart or takeover) at `now`.
    pub(super) fn prepared(&mut self, key: TxnKey, now: Nanos) {
        self.undecided.insert(key, now);
    }

    /// `txn` is decided here (or no longer prepared).
    pub(super) fn decided(&mut self, key: &TxnKey) {
        self.undecided.remove(key);
    }

    pub(super) fn undecided(&self) -> usize {
        self.undecided.len()
    }

    /// Undecided transactions prepared at least `after` before `now`, with no round open.
    pub(super) fn due(&self, now: Nanos, after: Nanos) -> Vec<TxnKey> {
        self.undecided
            .iter()
            .filter(|(key, since)| now.saturating_sub(**since) >= after && !self.rounds.contains_key(key))
            .map(|(key, _)| *key)
            .collect()
    }

    /// Opens a round for `key`, prepared here, with the queries `calls` out to the others.
    pub(super) fn open_round(&mut self, key: TxnKey, calls: Vec<CallId>) {
        let mut round = Round { heard: BTreeMap::new(), calls };
        round.heard.insert(key.0, TxnPhase::Prepared);
        self.rounds.insert(key, round);
    }

    /// A query of the round ended: with the phase `other` answered, or none (lost or
    /// refused). False if no round is open.
    pub(super) fn answered(&mut self, key: &TxnKey, call: CallId, other: u32, phase: Option<TxnPhase>) -> bool {
        let Some(round) = self.rounds.get_mut(key) else { return false };
        round.calls.retain(|pending| *pending != call);
        round.heard.extend(phase.map(|phase| (other, phase)));
        true
    }

    /// The decision the round reaches among `participants`, if it reaches one yet. The
    /// weakened variant counts a participant that never prepared, or voted abort, as
    /// prepared.
    pub(super) fn decision(&self, key: &TxnKey, participants: &[u32], ignore_missing_prepare: bool) -> Option<bool> {
        let round = self.rounds.get(key)?;
        let heard: BTreeMap<u32, TxnPhase> = round
            .heard
            .iter()
            .map(|(shard, phase)| match phase {
                TxnPhase::NeverPrepared | TxnPhase::VotedAbort if ignore_missing_prepare => {
                    (*shard, TxnPhase::Prepared)
                }
                phase => (*shard, *phase),
            })
            .collect();
        termination_decision(participants, &heard)
    }

    pub(super) fn close_round(&mut self, key: &TxnKey) {
        self.rounds.remove(key);
    }

    /// Closes a round every answer of which is in (or lost) without deciding: the next
    /// check starts another. (An answer after a lost one would otherwise leave the round
    /// open with nothing more to come, and the transaction prepared for good.)
    pub(super) fn close_if_silent(&mut self, key: &TxnKey) {
        if self.rounds.get(key).is_some_and(|round| round.calls.is_empty()) {
            self.rounds.remove(key);
        }
    }

    pub(super) fn lost_decision(&mut self, shard: u32, txn: TxnId, commit: bool) {
        self.lost_decisions.push((shard, txn, commit));
    }

    pub(super) fn take_lost_decisions(&mut self) -> Vec<(u32, TxnId, bool)> {
        std::mem::take(&mut self.lost_decisions)
    }

    /// Forgets `shard` (this node no longer leads it).
    pub(super) fn drop_shard(&mut self, shard: u32) {
        self.undecided.retain(|(undecided, _), _| *undecided != shard);
        self.rounds.retain(|(terminating, _), _| *terminating != shard);
    }
}

impl DataCore {
    /// Answers another primary's query: what this primary knows of `txn`. A transaction it
    /// never saw is refused from now on (logged before the answer), so rule 2 holds.
    pub(super) fn on_query(&mut self, from: &str, call: CallId, query: TxnQuery) -> Option<Response> {
        let TxnQuery { shard, txn, .. } = query;
        if let Err(refusal) = self.primary_of(shard, query.epoch) {
            return Some(refusal);
        }
        let known = self.replicas.get(&shard)?.status(txn);
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
                self.log.push(shard, &record, AfterLog::Reply { to: from.to_string(), call, response });
                return None;
            }
        };
        Some(state(phase))
    }

    /// Whether this primary's prepare of `txn` is safe: logged here and held by f backups
    /// (what its commit vote waits for), or no longer being replicated at all.
    fn prepare_is_safe(&self, shard: u32, txn: TxnId) -> bool {
        self.replication.answered_or_done(&(shard, txn, PendingKind::Prepared))
    }

    /// Starts terminating every transaction prepared here longer than `termination_after`
    /// ago with no decision.
    pub(super) fn check_undecided(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, DataIo>>) {
        let due = self.termination.due(now, self.config.termination_after.as_nanos() as u64);
        for (shard, txn) in due {
            let leads = self.map.group(ShardId(shard)).is_some_and(|group| group.primary == self.config.node);
            if !leads || self.takeovers.is_taking(shard) {
                continue;
            }
            if !self.prepare_is_safe(shard, txn) {
                // Its own vote is not cast yet (see `on_query`): wait for the backups.
                continue;
            }
            // Decided meanwhile (and perhaps settled already, with no entry left).
            let Some(status) = self.replicas.get(&shard).and_then(|replica| replica.status(txn)) else { continue };
            if status != TxnStatus::Prepared {
                self.termination.decided(&(shard, txn));
                continue;
            }
            let Some(entry) = self.replicas.get(&shard).and_then(|replica| replica.txn(txn)) else { continue };
            self.stats.terminations += 1;
            tracing::info!(node = %self.config.node, shard, txn, "terminating a transaction its coordinator left prepared");
            let others: Vec<u32> = entry.participants.iter().copied().filter(|other| *other != shard).collect();
            let mut calls = Vec::new();
            for other in others {
                let Some(group) = self.map.group(ShardId(other)) else { continue };
                let call = self.ids.call();
                self.calls.insert(call, CallFor::Query { shard, txn, participant: other });
                calls.push(call);
                let query = TxnQuery { shard: other, epoch: group.epoch, txn };
                out.push(Command::Call {
                    to: group.primary.clone(),
                    call,
                    request: Request::Query(query),
                    deadline: self.config.replicate_deadline,
                });
            }
            self.termination.open_round((shard, txn), calls);
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
        // The codec refuses a phase this build does not know: it is never a vote.
        let phase = match body {
            Some(Response::State(phase)) => Some(phase),
            _ => None,
        };
        if !self.termination.answered(&(shard, txn), call, other, phase) {
            return;
        }
        if phase.is_some() {
            self.conclude(shard, txn, out);
        }
        self.termination.close_if_silent(&(shard, txn));
    }

    /// Decides once the rules allow: at once on a decision or an abort vote, or when every
    /// participant has answered Prepared.
    fn conclude(&mut self, shard: u32, txn: TxnId, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(entry) = self.replicas.get(&shard).and_then(|replica| replica.txn(txn)) else { return };
        let participants = entry.participants.clone();
        let weakened = crate::shard::replica::weakened!(self.config.weakened, terminate_ignoring_missing_prepare);
        let Some(commit) = self.termination.decision(&(shard, txn), &participants, weakened) else { return };
        self.termination.close_round(&(shard, txn));
        self.decide_here(shard, txn, commit, None, out);
        for other in participants.into_iter().filter(|other| *other != shard) {
            self.send_decision(other, txn, commit, out);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_is_due_once_undecided_for_long_enough_and_not_while_a_round_is_open() {
        let mut termination = Termination::default();
        termination.prepared((0, 1), 100);
        termination.prepared((1, 2), 400);
        assert_eq!(termination.due(500, 400), vec![(0, 1)]);
        termination.open_round((0, 1), vec![CallId(1)]);
        assert!(termination.due(900, 400).iter().all(|key| *key != (0, 1)), "a round is open");
        assert_eq!(termination.due(900, 400), vec![(1, 2)]);
        termination.decided(&(1, 2));
        assert_eq!(termination.undecided(), 1);
        termination.drop_shard(0);
        assert_eq!(termination.undecided(), 0);
        assert!(
            !termination.answered(&(0, 1), CallId(1), 1, Some(TxnPhase::Prepared)),
            "the round went with its shard"
        );
    }

    #[test]
    fn a_round_decides_by_the_rules_and_a_silent_round_is_closed() {
        let mut termination = Termination::default();
        let key = (0, 7);
        termination.open_round(key, vec![CallId(1), CallId(2)]);
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), None, "only its own prepare is known");
        assert!(termination.answered(&key, CallId(1), 1, Some(TxnPhase::Prepared)));
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), None);
        assert!(termination.answered(&key, CallId(2), 2, None));
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), None, "a lost answer decides nothing");
        termination.close_if_silent(&key);
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), None);
        assert!(
            !termination.answered(&key, CallId(2), 2, Some(TxnPhase::Prepared)),
            "closed: the next check starts over"
        );

        termination.open_round(key, vec![CallId(3), CallId(4)]);
        termination.answered(&key, CallId(3), 1, Some(TxnPhase::Prepared));
        termination.answered(&key, CallId(4), 2, Some(TxnPhase::Prepared));
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), Some(true), "every participant prepared");
    }

    #[test]
    fn a_participant_that_never_prepared_aborts_the_transaction_unless_weakened() {
        let mut termination = Termination::default();
        let key = (0, 8);
        termination.open_round(key, vec![CallId(5), CallId(6)]);
        termination.answered(&key, CallId(5), 1, Some(TxnPhase::NeverPrepared));
        assert_eq!(termination.decision(&key, &[0, 1, 2], false), Some(false));
        termination.answered(&key, CallId(6), 2, Some(TxnPhase::Prepared));
        assert_eq!(termination.decision(&key, &[0, 1, 2], true), Some(true), "the broken variant commits it");
    }

    #[test]
    fn lost_decisions_are_handed_out_once() {
        let mut termination = Termination::default();
        termination.lost_decision(1, 9, true);
        assert_eq!(termination.take_lost_decisions(), vec![(1, 9, true)]);
        assert!(termination.take_lost_decisions().is_empty());
    }
}
