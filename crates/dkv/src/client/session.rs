//! Interactive transactions: an application begins a transaction, then gets, puts,
//! deletes and scans one operation at a time, and commits or aborts. Each operation is
//! answered through its [`Reply`] once the client knows the answer: writes at once (they are
//! buffered until commit), reads when the primary answers, a commit after phase 1.
//!
//! A transaction reads its own writes (a get of a key it wrote returns the buffered value; a
//! scan overlays its puts and deletes). An aborted session transaction is not run again:
//! the application decides. An operation that cannot reach the primaries within
//! `op_deadline` fails the transaction as unavailable (or, for a commit whose prepares went
//! out, as outcome unknown: the participants then finish it by cooperative termination).

use std::collections::BTreeMap;

use bytes::Bytes;
use virga_net::role::Nanos;
use virga_storage::{Timestamp, TxnId};

use super::scan::ScanState;
use super::txn::{Failure, Phase, Source, Txn};
use super::{Out, TxnClient};
use crate::shard::wire::{MAX_KEY_BYTES, MAX_OPS_PER_SHARD, MAX_VALUE_BYTES};

/// One operation of a session. `txn` is the id [`SessionReply::Began`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOp {
    /// Begins a transaction reading at the client's clock now, or, with `at`, a read-only
    /// transaction reading the snapshot at that timestamp.
    Begin {
        at: Option<Timestamp>,
    },
    Get {
        txn: TxnId,
        key: Bytes,
    },
    Put {
        txn: TxnId,
        key: Bytes,
        value: Bytes,
    },
    Delete {
        txn: TxnId,
        key: Bytes,
    },
    /// The live keys in `[start, end)` (`end` None: unbounded), at most `limit` (1 to 4096).
    Scan {
        txn: TxnId,
        start: Bytes,
        end: Option<Bytes>,
        limit: u32,
    },
    Commit {
        txn: TxnId,
    },
    Abort {
        txn: TxnId,
    },
}

/// The answer to a session's operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionReply {
    Began {
        txn: TxnId,
        ts_begin: Timestamp,
    },
    /// A get's value (None: no such key at the snapshot).
    Value(Option<Bytes>),
    Rows(Vec<(Bytes, Bytes)>),
    /// A put, delete or abort was taken.
    Done,
    Committed {
        commit_ts: Timestamp,
        read_only: bool,
    },
}

/// Why a session's operation failed. After `Aborted`, `StaleMap`, `Unavailable` and
/// `OutcomeUnknown` the transaction is over; after the others it is still open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("the transaction aborted: {reason}")]
    Aborted { reason: String },
    #[error("no open transaction {txn:#x} at this client (it ended, or never began here)")]
    UnknownTransaction { txn: TxnId },
    #[error("transaction {txn:#x} is committing and takes no more operations")]
    Committing { txn: TxnId },
    #[error("transaction {txn:#x} reads a snapshot in the past and cannot write")]
    ReadOnly { txn: TxnId },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("the shard map is stale and no newer one could be fetched ({detail}); the transaction ended")]
    StaleMap { detail: String },
    #[error("a shard is unavailable ({detail}); the transaction ended")]
    Unavailable { detail: String },
    #[error("the commit's outcome is unknown ({detail}): the participants decide it")]
    OutcomeUnknown { detail: String },
}

pub type SessionResult = Result<SessionReply, SessionError>;

/// Where an operation's answer goes (a channel of the caller, or a test's record).
pub struct Reply(Box<dyn FnOnce(SessionResult) + Send>);

impl Reply {
    pub fn new(deliver: impl FnOnce(SessionResult) + Send + 'static) -> Reply {
        Reply(Box::new(deliver))
    }

    fn send(self, result: SessionResult) {
        (self.0)(result)
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reply")
    }
}

/// An operation and where its answer goes.
#[derive(Debug)]
pub struct SessionRequest {
    pub op: SessionOp,
    pub reply: Reply,
}

/// An operation waiting for the primaries, since when.
struct Waiting {
    reply: Reply,
    since: Nanos,
}

/// A session transaction's operations in flight.
pub(super) struct SessionTxn {
    read_only: bool,
    gets: Vec<(Bytes, Waiting)>,
    /// Scans by their index in the transaction's scans.
    scans: Vec<(usize, Waiting)>,
    commit: Option<Waiting>,
    last_used: Nanos,
}

impl SessionTxn {
    pub(super) fn commit_requested(&self) -> bool {
        self.commit.is_some()
    }

    /// The oldest operation still waiting.
    fn oldest_wait(&self) -> Option<Nanos> {
        let gets = self.gets.iter().map(|(_, waiting)| waiting.since);
        let scans = self.scans.iter().map(|(_, waiting)| waiting.since);
        gets.chain(scans).chain(self.commit.iter().map(|waiting| waiting.since)).min()
    }

    pub(super) fn committed(self, commit_ts: Timestamp, read_only: bool) {
        if let Some(commit) = self.commit {
            commit.reply.send(Ok(SessionReply::Committed { commit_ts, read_only }));
        }
    }

    /// The transaction is over: every waiting operation gets `error`.
    pub(super) fn fail(self, error: SessionError) {
        let waiting = self.gets.into_iter().map(|(_, waiting)| waiting);
        let waiting = waiting.chain(self.scans.into_iter().map(|(_, waiting)| waiting)).chain(self.commit);
        for waiting in waiting {
            waiting.reply.send(Err(error.clone()));
        }
    }
}

fn check_key(key: &[u8]) -> Result<(), SessionError> {
    if key.is_empty() {
        return Err(SessionError::Invalid("an empty key".to_string()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(SessionError::Invalid(format!("a key of {} bytes (at most {MAX_KEY_BYTES})", key.len())));
    }
    Ok(())
}

fn check_scan(start: &[u8], end: Option<&Bytes>, limit: u32) -> Result<(), SessionError> {
    if start.len() > MAX_KEY_BYTES || end.is_some_and(|end| end.len() > MAX_KEY_BYTES) {
        return Err(SessionError::Invalid(format!("a scan bound longer than {MAX_KEY_BYTES} bytes")));
    }
    if end.is_some_and(|end| end.as_ref() <= start) {
        return Err(SessionError::Invalid("a scan whose end is not after its start".to_string()));
    }
    if limit == 0 || limit as usize > MAX_OPS_PER_SHARD {
        return Err(SessionError::Invalid(format!("a scan limit of {limit} (1 to {MAX_OPS_PER_SHARD})")));
    }
    Ok(())
}

impl TxnClient {
    /// Takes one operation of a session.
    pub(super) fn on_session(&mut self, now: Nanos, request: super::SessionRequest, out: &mut Out) {
        let SessionRequest { op, reply } = request;
        let txn = match op {
            SessionOp::Begin { at } => return self.begin_session(now, at, reply),
            SessionOp::Get { txn, .. }
            | SessionOp::Put { txn, .. }
            | SessionOp::Delete { txn, .. }
            | SessionOp::Scan { txn, .. }
            | SessionOp::Commit { txn }
            | SessionOp::Abort { txn } => txn,
        };
        let Some(Txn { source: Source::Session(session), phase, .. }) = self.txns.get_mut(&txn) else {
            return reply.send(Err(SessionError::UnknownTransaction { txn }));
        };
        if session.commit.is_some() || matches!(phase, Phase::Preparing { .. } | Phase::Validating { .. }) {
            return reply.send(Err(SessionError::Committing { txn }));
        }
        session.last_used = now;
        let read_only = session.read_only;
        match op {
            SessionOp::Begin { .. } => {}
            SessionOp::Get { key, .. } => self.session_get(now, txn, key, reply, out),
            SessionOp::Put { key, value, .. } => self.session_write(txn, key, Some(value), read_only, reply),
            SessionOp::Delete { key, .. } => self.session_write(txn, key, None, read_only, reply),
            SessionOp::Scan { start, end, limit, .. } => self.session_scan(now, txn, (start, end, limit), reply, out),
            SessionOp::Commit { .. } => self.session_commit(now, txn, reply, out),
            SessionOp::Abort { .. } => {
                if let Some(Txn { source: Source::Session(session), .. }) = self.txns.remove(&txn) {
                    *self.stats.aborts.entry("application".to_string()).or_default() += 1;
                    session.fail(SessionError::Aborted { reason: "the application aborted it".to_string() });
                }
                reply.send(Ok(SessionReply::Done));
            }
        }
    }

    fn begin_session(&mut self, now: Nanos, at: Option<Timestamp>, reply: Reply) {
        if let Some(at) = at.filter(|at| at.time > now) {
            return reply.send(Err(SessionError::Invalid(format!("a snapshot at {}, in the future", at.time))));
        }
        let id = self.next_txn_id();
        let ts_begin = match at {
            Some(at) => at,
            None => self.next_ts(now),
        };
        let session =
            SessionTxn { read_only: at.is_some(), gets: Vec::new(), scans: Vec::new(), commit: None, last_used: now };
        let mut txn = Txn::new(Source::Session(session), id, ts_begin, self.now);
        txn.uses_cache = at.is_none();
        self.txns.insert(id, txn);
        reply.send(Ok(SessionReply::Began { txn: id, ts_begin }));
    }

    fn session_get(&mut self, now: Nanos, id: TxnId, key: Bytes, reply: Reply, out: &mut Out) {
        if let Err(error) = check_key(&key) {
            return reply.send(Err(error));
        }
        let Some(txn) = self.txns.get_mut(&id) else { return };
        if let Some(written) = txn.writes.get(&key) {
            return reply.send(Ok(SessionReply::Value(written.clone())));
        }
        if let Some(read) = txn.reads.get(&key) {
            return reply.send(Ok(SessionReply::Value(read.value.clone())));
        }
        if self.read_cached(id, vec![key.clone()]).is_empty() {
            let value = self.txns.get(&id).and_then(|txn| txn.reads.get(&key)).and_then(|read| read.value.clone());
            return reply.send(Ok(SessionReply::Value(value)));
        }
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Source::Session(session) = &mut txn.source else { return };
        let in_flight = session.gets.iter().any(|(waiting_for, _)| *waiting_for == key);
        session.gets.push((key.clone(), Waiting { reply, since: now }));
        if !in_flight {
            self.send_gets(id, vec![key], out);
        }
    }

    fn session_write(&mut self, id: TxnId, key: Bytes, value: Option<Bytes>, read_only: bool, reply: Reply) {
        if let Err(error) = check_key(&key) {
            return reply.send(Err(error));
        }
        if read_only {
            return reply.send(Err(SessionError::ReadOnly { txn: id }));
        }
        if let Some(value) = value.as_ref().filter(|value| value.len() > MAX_VALUE_BYTES) {
            let error = format!("a value of {} bytes (at most {MAX_VALUE_BYTES})", value.len());
            return reply.send(Err(SessionError::Invalid(error)));
        }
        let Some(txn) = self.txns.get_mut(&id) else { return };
        txn.writes.insert(key, value);
        reply.send(Ok(SessionReply::Done));
    }

    fn session_scan(
        &mut self,
        now: Nanos,
        id: TxnId,
        (start, end, limit): (Bytes, Option<Bytes>, u32),
        reply: Reply,
        out: &mut Out,
    ) {
        if let Err(error) = check_scan(&start, end.as_ref(), limit) {
            return reply.send(Err(error));
        }
        let scan = ScanState::new(start, end, limit, &self.config.map);
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let index = txn.scans.len();
        txn.scans.push(scan);
        if let Source::Session(session) = &mut txn.source {
            session.scans.push((index, Waiting { reply, since: now }));
        }
        for (index, shard) in self.scan_parts(id, index) {
            self.send_scan(id, index, shard, out);
        }
        // A range no shard covers has nothing to wait for.
        self.answer_session_reads(id);
    }

    fn session_commit(&mut self, now: Nanos, id: TxnId, reply: Reply, out: &mut Out) {
        if let Some(shard) = self.oversized_shard(id) {
            let reason = format!("too-large: more than {MAX_OPS_PER_SHARD} reads or writes at shard {shard}");
            self.aborted(id, reason.clone(), out);
            return reply.send(Err(SessionError::Aborted { reason }));
        }
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Source::Session(session) = &mut txn.source else { return };
        session.commit = Some(Waiting { reply, since: now });
        if txn.reads_done() {
            self.finish_reads(now, id, out);
        }
    }

    /// A shard where the transaction reads or writes more keys than one prepare carries.
    fn oversized_shard(&self, id: TxnId) -> Option<u32> {
        let txn = self.txns.get(&id)?;
        let mut counts: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
        for key in txn.reads.keys() {
            counts.entry(self.shard_of(key)).or_default().0 += 1;
        }
        for key in txn.writes.keys() {
            counts.entry(self.shard_of(key)).or_default().1 += 1;
        }
        counts
            .into_iter()
            .find(|(_, (reads, writes))| *reads > MAX_OPS_PER_SHARD || *writes > MAX_OPS_PER_SHARD)
            .map(|(shard, _)| shard)
    }

    /// Answers a session's gets whose keys are read and scans whose shards all answered.
    pub(super) fn answer_session_reads(&mut self, id: TxnId) {
        let Some(txn) = self.txns.get_mut(&id) else { return };
        let Source::Session(session) = &mut txn.source else { return };
        let (reads, writes, scans) = (&txn.reads, &txn.writes, &txn.scans);
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut session.gets).into_iter().partition(|(key, _)| reads.contains_key(key));
        session.gets = waiting;
        for (key, waiting) in ready {
            let value = reads.get(&key).and_then(|read| read.value.clone());
            waiting.reply.send(Ok(SessionReply::Value(value)));
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut session.scans)
            .into_iter()
            .partition(|(index, _)| scans.get(*index).is_none_or(ScanState::is_complete));
        session.scans = waiting;
        for (index, waiting) in ready {
            let rows = scans.get(index).map(|scan| overlay(scan, writes)).unwrap_or_default();
            waiting.reply.send(Ok(SessionReply::Rows(rows)));
        }
    }

    /// Ends session transactions that waited past `op_deadline` for the primaries, and
    /// aborts those idle past `session_idle`.
    pub(super) fn expire_sessions(&mut self, now: Nanos) {
        let deadline = self.config.op_deadline.as_nanos() as u64;
        let idle = self.config.session_idle.as_nanos() as u64;
        let mut expired = Vec::new();
        for (id, txn) in &self.txns {
            let Source::Session(session) = &txn.source else { continue };
            let overdue = session.oldest_wait().is_some_and(|since| now.saturating_sub(since) > deadline);
            if overdue {
                let preparing = matches!(txn.phase, Phase::Preparing { .. });
                let detail = match &txn.last_failure {
                    Some(Failure::StaleMap { epoch }) => format!("a primary is at epoch {epoch}"),
                    Some(Failure::Unavailable(detail)) => detail.clone(),
                    None => "no answer".to_string(),
                };
                let error = match (&txn.last_failure, preparing) {
                    (_, true) => SessionError::OutcomeUnknown { detail },
                    (Some(Failure::StaleMap { .. }), false) => SessionError::StaleMap { detail },
                    _ => SessionError::Unavailable { detail },
                };
                expired.push((*id, error));
            } else if session.oldest_wait().is_none() && now.saturating_sub(session.last_used) > idle {
                expired.push((*id, SessionError::Aborted { reason: "idle".to_string() }));
            }
        }
        for (id, error) in expired {
            if let Some(Txn { source: Source::Session(session), .. }) = self.txns.remove(&id) {
                let reason = match &error {
                    SessionError::Aborted { .. } => "session-idle",
                    SessionError::OutcomeUnknown { .. } => "outcome-unknown",
                    _ => "unavailable",
                };
                *self.stats.aborts.entry(reason.to_string()).or_default() += 1;
                session.fail(error);
            }
        }
    }
}

/// A scan's rows with the transaction's own writes in its range laid over them, the first
/// `limit` in key order.
fn overlay(scan: &ScanState, writes: &BTreeMap<Bytes, Option<Bytes>>) -> Vec<(Bytes, Bytes)> {
    let mut rows: BTreeMap<Bytes, Bytes> = scan.all_rows().clone();
    for (key, value) in writes.iter().filter(|(key, _)| scan.contains(key)) {
        match value {
            Some(value) => rows.insert(key.clone(), value.clone()),
            None => rows.remove(key),
        };
    }
    rows.into_iter().take(scan.limit()).collect()
}
