//! The client API over gRPC: [`KvService`] serves `virga.kv.v1.Kv` (proto/kv.proto) from a
//! client core in the server's process, and [`RemoteKv`] is the [`KvBackend`] that calls it.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use virga_net::tls::{error_chain, server_builder};
use virga_net::Tls;
use virga_storage::{Timestamp, TxnId};

use super::proto::{self, error::Code};
use super::{Kv, KvBackend, KvError, LocalKv};
use crate::client::{SessionOp, SessionReply};

/// The largest message either side takes: a scan of 4096 rows of a few KiB each fits.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

pub fn ts_to_proto(ts: Timestamp) -> proto::Timestamp {
    proto::Timestamp { time: ts.time, client: ts.client }
}

pub fn ts_from_proto(ts: proto::Timestamp) -> Timestamp {
    Timestamp::new(ts.time, ts.client)
}

/// The typed error a response carries.
pub fn error_to_proto(error: &KvError) -> proto::Error {
    let (code, reason) = match error {
        KvError::Aborted { reason } => (Code::Aborted, reason.clone()),
        KvError::OutcomeUnknown { .. } => (Code::OutcomeUnknown, String::new()),
        KvError::Unavailable { .. } | KvError::Transport(_) => (Code::Unavailable, String::new()),
        KvError::StaleMap { .. } => (Code::StaleMap, String::new()),
        KvError::Deadline(_) => (Code::DeadlineExceeded, String::new()),
        KvError::Invalid(_) => (Code::InvalidArgument, String::new()),
        KvError::UnknownTransaction { .. } => (Code::UnknownTransaction, String::new()),
        KvError::Committing { .. } => (Code::Committing, String::new()),
        KvError::ReadOnly { .. } => (Code::ReadOnly, String::new()),
        KvError::ShuttingDown => (Code::ShuttingDown, String::new()),
    };
    proto::Error { code: code as i32, message: error.detail(), reason }
}

/// The error a response carried, for the operation on transaction `txn`.
pub fn error_from_proto(error: proto::Error, txn: TxnId) -> KvError {
    let detail = error.message;
    match Code::try_from(error.code).unwrap_or(Code::Unspecified) {
        Code::Aborted => KvError::Aborted { reason: if error.reason.is_empty() { detail } else { error.reason } },
        Code::OutcomeUnknown => KvError::OutcomeUnknown { detail },
        Code::Unavailable => KvError::Unavailable { detail },
        Code::StaleMap => KvError::StaleMap { detail },
        Code::DeadlineExceeded => KvError::Deadline(detail),
        Code::InvalidArgument => KvError::Invalid(detail),
        Code::UnknownTransaction => KvError::UnknownTransaction { txn },
        Code::Committing => KvError::Committing { txn },
        Code::ReadOnly => KvError::ReadOnly { txn },
        Code::ShuttingDown => KvError::ShuttingDown,
        Code::Unspecified => KvError::Transport(format!("an error with no known code ({}): {detail}", error.code)),
    }
}

fn end_from_wire(end: Vec<u8>) -> Option<Bytes> {
    (!end.is_empty()).then(|| Bytes::from(end))
}

/// Serves the API from a client core of this process.
pub struct KvService {
    kv: Kv<LocalKv>,
}

impl KvService {
    pub fn new(kv: Kv<LocalKv>) -> KvService {
        KvService { kv }
    }

    async fn call(&self, op: SessionOp) -> Result<SessionReply, KvError> {
        self.kv.backend().call(op).await
    }
}

/// A response, or one carrying `error`.
fn answer<T>(result: Result<T, KvError>, failed: impl FnOnce(proto::Error) -> T) -> Result<Response<T>, Status> {
    Ok(Response::new(result.unwrap_or_else(|error| failed(error_to_proto(&error)))))
}

fn mismatch(operation: &str, reply: SessionReply) -> KvError {
    KvError::Transport(format!("the client core answered {operation} with {reply:?}"))
}

#[tonic::async_trait]
impl proto::kv_server::Kv for KvService {
    async fn begin(&self, request: Request<proto::BeginRequest>) -> Result<Response<proto::BeginResponse>, Status> {
        let at = request.into_inner().snapshot.map(ts_from_proto);
        let result = match self.call(SessionOp::Begin { at }).await {
            Ok(SessionReply::Began { txn, ts_begin }) => {
                Ok(proto::BeginResponse { txn, begin: Some(ts_to_proto(ts_begin)), error: None })
            }
            Ok(other) => Err(mismatch("begin", other)),
            Err(error) => Err(error),
        };
        answer(result, |error| proto::BeginResponse { error: Some(error), ..Default::default() })
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::GetResponse>, Status> {
        let proto::GetRequest { txn, key } = request.into_inner();
        let key = Bytes::from(key);
        let result = if txn == 0 {
            self.kv
                .transact(|txn| {
                    let key = key.clone();
                    async move { Ok((txn.get(key).await?, txn)) }
                })
                .await
                .map(|(value, committed)| (value, Some(ts_to_proto(committed.commit_ts))))
        } else {
            match self.call(SessionOp::Get { txn, key }).await {
                Ok(SessionReply::Value(value)) => Ok((value, None)),
                Ok(other) => Err(mismatch("get", other)),
                Err(error) => Err(error),
            }
        };
        let result = result.map(|(value, read_at)| proto::GetResponse {
            found: value.is_some(),
            value: value.map(|value| value.to_vec()).unwrap_or_default(),
            read_at,
            error: None,
        });
        answer(result, |error| proto::GetResponse { error: Some(error), ..Default::default() })
    }

    async fn put(&self, request: Request<proto::PutRequest>) -> Result<Response<proto::WriteResponse>, Status> {
        let proto::PutRequest { txn, key, value } = request.into_inner();
        let (key, value) = (Bytes::from(key), Bytes::from(value));
        let result = if txn == 0 {
            self.kv.put(key, value).await.map(Some)
        } else {
            self.write(SessionOp::Put { txn, key, value }).await
        };
        let result = result.map(|ts| proto::WriteResponse { committed: ts.map(ts_to_proto), error: None });
        answer(result, |error| proto::WriteResponse { error: Some(error), ..Default::default() })
    }

    async fn delete(&self, request: Request<proto::DeleteRequest>) -> Result<Response<proto::WriteResponse>, Status> {
        let proto::DeleteRequest { txn, key } = request.into_inner();
        let key = Bytes::from(key);
        let result = if txn == 0 {
            self.kv.delete(key).await.map(Some)
        } else {
            self.write(SessionOp::Delete { txn, key }).await
        };
        let result = result.map(|ts| proto::WriteResponse { committed: ts.map(ts_to_proto), error: None });
        answer(result, |error| proto::WriteResponse { error: Some(error), ..Default::default() })
    }

    async fn scan(&self, request: Request<proto::ScanRequest>) -> Result<Response<proto::ScanResponse>, Status> {
        let proto::ScanRequest { txn, start, end, limit } = request.into_inner();
        let (start, end) = (Bytes::from(start), end_from_wire(end));
        let limit = if limit == 0 { crate::shard::wire::MAX_OPS_PER_SHARD as u32 } else { limit };
        let result = if txn == 0 {
            self.kv
                .transact(|txn| {
                    let (start, end) = (start.clone(), end.clone());
                    async move { Ok((txn.scan(start, end, limit).await?, txn)) }
                })
                .await
                .map(|(rows, committed)| (rows, Some(ts_to_proto(committed.commit_ts))))
        } else {
            match self.call(SessionOp::Scan { txn, start, end, limit }).await {
                Ok(SessionReply::Rows(rows)) => Ok((rows, None)),
                Ok(other) => Err(mismatch("scan", other)),
                Err(error) => Err(error),
            }
        };
        let result = result.map(|(rows, read_at)| proto::ScanResponse {
            rows: rows
                .into_iter()
                .map(|(key, value)| proto::Row { key: key.to_vec(), value: value.to_vec() })
                .collect(),
            read_at,
            error: None,
        });
        answer(result, |error| proto::ScanResponse { error: Some(error), ..Default::default() })
    }

    async fn commit(&self, request: Request<proto::CommitRequest>) -> Result<Response<proto::CommitResponse>, Status> {
        let txn = request.into_inner().txn;
        let result = match self.call(SessionOp::Commit { txn }).await {
            Ok(SessionReply::Committed { commit_ts, read_only }) => {
                Ok(proto::CommitResponse { committed: Some(ts_to_proto(commit_ts)), read_only, error: None })
            }
            Ok(other) => Err(mismatch("commit", other)),
            Err(KvError::Deadline(detail)) => Err(KvError::OutcomeUnknown { detail }),
            Err(error) => Err(error),
        };
        answer(result, |error| proto::CommitResponse { error: Some(error), ..Default::default() })
    }

    async fn abort(&self, request: Request<proto::AbortRequest>) -> Result<Response<proto::AbortResponse>, Status> {
        let txn = request.into_inner().txn;
        let result = match self.call(SessionOp::Abort { txn }).await {
            Ok(SessionReply::Done) => Ok(proto::AbortResponse { error: None }),
            Ok(other) => Err(mismatch("abort", other)),
            Err(error) => Err(error),
        };
        answer(result, |error| proto::AbortResponse { error: Some(error) })
    }
}

impl KvService {
    async fn write(&self, op: SessionOp) -> Result<Option<Timestamp>, KvError> {
        match self.call(op).await? {
            SessionReply::Done => Ok(None),
            other => Err(mismatch("a write", other)),
        }
    }
}

/// Serves `kv` on `listener` until `shutdown` completes, over mutual TLS when `tls` is given
/// (clients must present a certificate of its CA). Returns the bound address and the
/// server's future (spawn it).
pub fn serve(
    listener: TcpListener,
    kv: Kv<LocalKv>,
    tls: Option<&Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send)> {
    let address = listener.local_addr()?;
    let service = proto::kv_server::KvServer::new(KvService::new(kv))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = server_builder(tls)?.add_service(service).serve_with_incoming_shutdown(incoming, shutdown);
    Ok((address, server))
}

/// A server of the API at a gRPC address (`http://127.0.0.1:7400`).
#[derive(Clone)]
pub struct RemoteKv {
    client: proto::kv_client::KvClient<Channel>,
    /// How long one call may take before it is `Deadline` (`OutcomeUnknown` for a commit).
    wait: Duration,
}

impl RemoteKv {
    /// Connects lazily (on the first call), so an unreachable server shows as that call's
    /// `Transport` error. Call it within a tokio runtime.
    pub fn connect(address: &str, wait: Duration) -> Result<RemoteKv, KvError> {
        Self::connect_with(address, wait, None)
    }

    /// [`Self::connect`] over mutual TLS: the server's certificate must come from `tls`'s CA,
    /// and this client presents `tls`'s certificate.
    pub fn connect_tls(address: &str, wait: Duration, tls: &Tls) -> Result<RemoteKv, KvError> {
        Self::connect_with(address, wait, Some(tls))
    }

    fn connect_with(address: &str, wait: Duration, tls: Option<&Tls>) -> Result<RemoteKv, KvError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(KvError::Invalid("RemoteKv::connect needs a tokio runtime".to_string()));
        }
        let invalid = |error: String| KvError::Invalid(format!("the address {address:?}: {error}"));
        let endpoint = match tls {
            None => Endpoint::from_shared(address.to_string()).map_err(|error| invalid(error.to_string()))?,
            Some(tls) => Endpoint::from_shared(virga_net::tls::https(address))
                .and_then(|endpoint| endpoint.tls_config(tls.client_config()))
                .map_err(|error| invalid(error_chain(&error)))?,
        }
        .tcp_nodelay(true)
        .connect_timeout(wait);
        let client = proto::kv_client::KvClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(RemoteKv { client, wait })
    }

    async fn exchange(&self, op: SessionOp) -> Result<SessionReply, KvError> {
        let mut client = self.client.clone();
        let status = |status: Status| KvError::Transport(format!("{}: {}", status.code(), status.message()));
        let failed = |error: Option<proto::Error>, txn| error.map(|error| Err(error_from_proto(error, txn)));
        match op {
            SessionOp::Begin { at } => {
                let reply = client.begin(proto::BeginRequest { snapshot: at.map(ts_to_proto) }).await;
                let reply = reply.map_err(status)?.into_inner();
                failed(reply.error, 0).unwrap_or_else(|| {
                    let ts_begin = reply.begin.map(ts_from_proto).unwrap_or_default();
                    Ok(SessionReply::Began { txn: reply.txn, ts_begin })
                })
            }
            SessionOp::Get { txn, key } => {
                let reply =
                    client.get(proto::GetRequest { txn, key: key.to_vec() }).await.map_err(status)?.into_inner();
                failed(reply.error, txn)
                    .unwrap_or_else(|| Ok(SessionReply::Value(reply.found.then(|| Bytes::from(reply.value)))))
            }
            SessionOp::Put { txn, key, value } => {
                let request = proto::PutRequest { txn, key: key.to_vec(), value: value.to_vec() };
                let reply = client.put(request).await.map_err(status)?.into_inner();
                failed(reply.error, txn).unwrap_or(Ok(SessionReply::Done))
            }
            SessionOp::Delete { txn, key } => {
                let request = proto::DeleteRequest { txn, key: key.to_vec() };
                let reply = client.delete(request).await.map_err(status)?.into_inner();
                failed(reply.error, txn).unwrap_or(Ok(SessionReply::Done))
            }
            SessionOp::Scan { txn, start, end, limit } => {
                let end = end.map(|end| end.to_vec()).unwrap_or_default();
                let request = proto::ScanRequest { txn, start: start.to_vec(), end, limit };
                let reply = client.scan(request).await.map_err(status)?.into_inner();
                failed(reply.error, txn).unwrap_or_else(|| {
                    let rows = reply.rows.into_iter().map(|row| (Bytes::from(row.key), Bytes::from(row.value)));
                    Ok(SessionReply::Rows(rows.collect()))
                })
            }
            SessionOp::Commit { txn } => {
                let reply = client.commit(proto::CommitRequest { txn }).await.map_err(status)?.into_inner();
                failed(reply.error, txn).unwrap_or_else(|| {
                    let commit_ts = reply.committed.map(ts_from_proto).unwrap_or_default();
                    Ok(SessionReply::Committed { commit_ts, read_only: reply.read_only })
                })
            }
            SessionOp::Abort { txn } => {
                let reply = client.abort(proto::AbortRequest { txn }).await.map_err(status)?.into_inner();
                failed(reply.error, txn).unwrap_or(Ok(SessionReply::Done))
            }
        }
    }
}

impl KvBackend for RemoteKv {
    fn call(&self, op: SessionOp) -> impl Future<Output = Result<SessionReply, KvError>> + Send {
        let this = self.clone();
        async move {
            match tokio::time::timeout(this.wait, this.exchange(op)).await {
                Ok(result) => result,
                Err(_) => Err(KvError::Deadline(format!("no answer from the server within {:?}", this.wait))),
            }
        }
    }
}
