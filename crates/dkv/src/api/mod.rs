//! The store's client library: transactions an application programs against, the same over
//! a client core in its own process ([`LocalKv`]) or over gRPC to a server (`grpc::RemoteKv`,
//! the `virga.kv.v1` service of `proto/kv.proto`).
//!
//! ```text
//! let kv = Kv::new(backend);
//! let txn = kv.begin().await?;
//! let balance = txn.get("alice").await?;
//! txn.put("alice", "90").await?;
//! txn.commit().await?;          // Err(KvError::Aborted { reason }) on a conflict
//! ```
//!
//! A transaction dropped without `commit` or `abort` is aborted in the background.

#[cfg(feature = "grpc")]
pub mod grpc;
pub mod proto;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use virga_net::driver::InputSender;
use virga_storage::{Timestamp, TxnId};

use crate::client::{ClientInput, Reply, SessionError, SessionOp, SessionReply, SessionRequest, TxnClient};

/// Why an operation failed. After `Aborted`, `OutcomeUnknown`, `Unavailable`, `StaleMap` and
/// `Deadline` the transaction is over; after `Invalid` and `ReadOnly` it is still open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("the transaction aborted: {reason}")]
    Aborted { reason: String },
    #[error("the commit's outcome is unknown ({detail})")]
    OutcomeUnknown { detail: String },
    #[error("a shard is unavailable: {detail}")]
    Unavailable { detail: String },
    #[error("the shard map is stale: {detail}")]
    StaleMap { detail: String },
    #[error("no answer in time: {0}")]
    Deadline(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no open transaction {txn:#x} (it ended, or never began)")]
    UnknownTransaction { txn: TxnId },
    #[error("transaction {txn:#x} is committing")]
    Committing { txn: TxnId },
    #[error("transaction {txn:#x} is read-only (a snapshot in the past)")]
    ReadOnly { txn: TxnId },
    #[error("the client is shutting down")]
    ShuttingDown,
    /// The request did not reach a server, or its answer was malformed.
    #[error("transport: {0}")]
    Transport(String),
}

impl KvError {
    /// The kind's name, as the `.proto` spells its code (`aborted`, `outcome-unknown`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            KvError::Aborted { .. } => "aborted",
            KvError::OutcomeUnknown { .. } => "outcome-unknown",
            KvError::Unavailable { .. } => "unavailable",
            KvError::StaleMap { .. } => "stale-map",
            KvError::Deadline(_) => "deadline-exceeded",
            KvError::Invalid(_) => "invalid-argument",
            KvError::UnknownTransaction { .. } => "unknown-transaction",
            KvError::Committing { .. } => "committing",
            KvError::ReadOnly { .. } => "read-only",
            KvError::ShuttingDown => "shutting-down",
            KvError::Transport(_) => "transport",
        }
    }

    /// What the error says beyond its kind (the whole message for the kinds that say
    /// nothing more).
    pub fn detail(&self) -> String {
        match self {
            KvError::Aborted { reason: detail }
            | KvError::OutcomeUnknown { detail }
            | KvError::Unavailable { detail }
            | KvError::StaleMap { detail }
            | KvError::Deadline(detail)
            | KvError::Invalid(detail)
            | KvError::Transport(detail) => detail.clone(),
            other => other.to_string(),
        }
    }
}

impl From<SessionError> for KvError {
    fn from(error: SessionError) -> KvError {
        match error {
            SessionError::Aborted { reason } => KvError::Aborted { reason },
            SessionError::UnknownTransaction { txn } => KvError::UnknownTransaction { txn },
            SessionError::Committing { txn } => KvError::Committing { txn },
            SessionError::ReadOnly { txn } => KvError::ReadOnly { txn },
            SessionError::Invalid(detail) => KvError::Invalid(detail),
            SessionError::StaleMap { detail } => KvError::StaleMap { detail },
            SessionError::Unavailable { detail } => KvError::Unavailable { detail },
            SessionError::OutcomeUnknown { detail } => KvError::OutcomeUnknown { detail },
        }
    }
}

/// Where a [`Kv`]'s operations go: one session operation in, its answer out.
pub trait KvBackend: Clone + Send + Sync + 'static {
    fn call(&self, op: SessionOp) -> impl Future<Output = Result<SessionReply, KvError>> + Send;
}

/// A client core running in this process (under the tokio driver), reached through its
/// input.
#[derive(Clone)]
pub struct LocalKv {
    input: InputSender<TxnClient>,
    /// How long to wait for an answer; the core ends operations stuck for its own
    /// `op_deadline` sooner, so this is a backstop.
    wait: Duration,
}

impl LocalKv {
    pub fn new(input: InputSender<TxnClient>, wait: Duration) -> LocalKv {
        LocalKv { input, wait }
    }
}

impl KvBackend for LocalKv {
    fn call(&self, op: SessionOp) -> impl Future<Output = Result<SessionReply, KvError>> + Send {
        let (answer, answered) = oneshot::channel();
        let reply = Reply::new(move |result| {
            let _ = answer.send(result);
        });
        let sent = self.input.send(ClientInput::Session(SessionRequest { op, reply }));
        let wait = self.wait;
        async move {
            if !sent {
                return Err(KvError::ShuttingDown);
            }
            match tokio::time::timeout(wait, answered).await {
                Ok(Ok(result)) => result.map_err(KvError::from),
                // The core dropped the reply: it stopped.
                Ok(Err(_)) => Err(KvError::ShuttingDown),
                Err(_) => Err(KvError::Deadline(format!("none within {wait:?}"))),
            }
        }
    }
}

/// A committed transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub commit_ts: Timestamp,
    /// Nothing was written: it committed at its snapshot without a message to the shards.
    pub read_only: bool,
}

/// The store, through a backend.
#[derive(Clone)]
pub struct Kv<B> {
    backend: B,
    /// Runs of a one-operation transaction (`get`, `put`, ...) before its abort is final.
    auto_attempts: u32,
}

impl<B: KvBackend> Kv<B> {
    pub fn new(backend: B) -> Kv<B> {
        Kv { backend, auto_attempts: 5 }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Begins a read-write transaction reading the snapshot at its begin.
    pub async fn begin(&self) -> Result<Transaction<B>, KvError> {
        self.begin_op(SessionOp::Begin { at: None }).await
    }

    /// Begins a read-only transaction reading the committed state as of `at`.
    pub async fn begin_at(&self, at: Timestamp) -> Result<Transaction<B>, KvError> {
        self.begin_op(SessionOp::Begin { at: Some(at) }).await
    }

    async fn begin_op(&self, op: SessionOp) -> Result<Transaction<B>, KvError> {
        match self.backend.call(op).await? {
            SessionReply::Began { txn, ts_begin } => {
                Ok(Transaction { backend: self.backend.clone(), id: txn, ts_begin, ended: false })
            }
            other => Err(unexpected("begin", &other)),
        }
    }

    /// Runs `work` in a transaction of its own and commits it, again while it aborts (up to
    /// a few times). `work` hands the transaction back with its result.
    pub async fn transact<T, F, Fut>(&self, work: F) -> Result<(T, Committed), KvError>
    where
        F: Fn(Transaction<B>) -> Fut,
        Fut: Future<Output = Result<(T, Transaction<B>), KvError>>,
    {
        let mut attempt = 1;
        loop {
            let txn = self.begin().await?;
            let result = match work(txn).await {
                Ok((value, txn)) => txn.commit().await.map(|committed| (value, committed)),
                Err(error) => Err(error),
            };
            match result {
                Err(KvError::Aborted { .. }) if attempt < self.auto_attempts => attempt += 1,
                result => return result,
            }
        }
    }

    /// The value of `key` now (a read-only transaction of its own).
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>, KvError> {
        let key = key.into();
        let (value, _) = self
            .transact(|txn| {
                let key = key.clone();
                async move { Ok((txn.get(key).await?, txn)) }
            })
            .await?;
        Ok(value)
    }

    /// Sets `key` to `value` in a transaction of its own; its commit timestamp.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<Timestamp, KvError> {
        let (key, value) = (key.into(), value.into());
        let ((), committed) = self
            .transact(|txn| {
                let (key, value) = (key.clone(), value.clone());
                async move { Ok((txn.put(key, value).await?, txn)) }
            })
            .await?;
        Ok(committed.commit_ts)
    }

    /// Removes `key` in a transaction of its own; its commit timestamp.
    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<Timestamp, KvError> {
        let key = key.into();
        let ((), committed) = self
            .transact(|txn| {
                let key = key.clone();
                async move { Ok((txn.delete(key).await?, txn)) }
            })
            .await?;
        Ok(committed.commit_ts)
    }

    /// The live keys in `[start, end)` now, at most `limit` (a transaction of its own).
    pub async fn scan(
        &self,
        start: impl Into<Bytes>,
        end: Option<Bytes>,
        limit: u32,
    ) -> Result<Vec<(Bytes, Bytes)>, KvError> {
        let start = start.into();
        let (rows, _) = self
            .transact(|txn| {
                let (start, end) = (start.clone(), end.clone());
                async move { Ok((txn.scan(start, end, limit).await?, txn)) }
            })
            .await?;
        Ok(rows)
    }
}

/// An open transaction.
pub struct Transaction<B: KvBackend> {
    backend: B,
    id: TxnId,
    ts_begin: Timestamp,
    ended: bool,
}

impl<B: KvBackend> Transaction<B> {
    pub fn id(&self) -> TxnId {
        self.id
    }

    /// The snapshot it reads.
    pub fn ts_begin(&self) -> Timestamp {
        self.ts_begin
    }

    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>, KvError> {
        match self.backend.call(SessionOp::Get { txn: self.id, key: key.into() }).await? {
            SessionReply::Value(value) => Ok(value),
            other => Err(unexpected("get", &other)),
        }
    }

    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<(), KvError> {
        let op = SessionOp::Put { txn: self.id, key: key.into(), value: value.into() };
        match self.backend.call(op).await? {
            SessionReply::Done => Ok(()),
            other => Err(unexpected("put", &other)),
        }
    }

    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<(), KvError> {
        match self.backend.call(SessionOp::Delete { txn: self.id, key: key.into() }).await? {
            SessionReply::Done => Ok(()),
            other => Err(unexpected("delete", &other)),
        }
    }

    /// The live keys in `[start, end)` (`end` None: unbounded), at most `limit` (1 to 4096).
    pub async fn scan(
        &self,
        start: impl Into<Bytes>,
        end: Option<Bytes>,
        limit: u32,
    ) -> Result<Vec<(Bytes, Bytes)>, KvError> {
        match self.backend.call(SessionOp::Scan { txn: self.id, start: start.into(), end, limit }).await? {
            SessionReply::Rows(rows) => Ok(rows),
            other => Err(unexpected("scan", &other)),
        }
    }

    /// Commits. A commit that gets no answer in time is `OutcomeUnknown`: it may have
    /// committed.
    pub async fn commit(mut self) -> Result<Committed, KvError> {
        self.ended = true;
        match self.backend.call(SessionOp::Commit { txn: self.id }).await {
            Ok(SessionReply::Committed { commit_ts, read_only }) => Ok(Committed { commit_ts, read_only }),
            Ok(other) => Err(unexpected("commit", &other)),
            Err(KvError::Deadline(detail)) => Err(KvError::OutcomeUnknown { detail: format!("the commit: {detail}") }),
            Err(error) => Err(error),
        }
    }

    pub async fn abort(mut self) -> Result<(), KvError> {
        self.ended = true;
        match self.backend.call(SessionOp::Abort { txn: self.id }).await? {
            SessionReply::Done => Ok(()),
            other => Err(unexpected("abort", &other)),
        }
    }
}

impl<B: KvBackend> Drop for Transaction<B> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Abandoned (an error, or the application dropped it): release its snapshot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (backend, txn) = (self.backend.clone(), self.id);
            runtime.spawn(async move {
                let _ = backend.call(SessionOp::Abort { txn }).await;
            });
        }
    }
}

fn unexpected(operation: &str, reply: &SessionReply) -> KvError {
    KvError::Transport(format!("an answer to {operation} that does not fit it: {reply:?}"))
}
