//! Virga's peer transport.
//!
//! Roles talk by request and response: a caller names a peer by id (`storage-3`,
//! `miner-0`, `client-1`) and sends a [`proto::Request`]; the peer's [`Handler`] answers
//! with a [`proto::Response`]. Two transports carry the same messages:
//!
//! - [`InProc`]: the embedded default. Peers are handlers in one process; a call is a
//!   function call on the callee's handler, with no encoding.
//! - [`Grpc`]: each peer is a tonic server ([`serve`]) at an address; the schema is
//!   `proto/virga.proto` (an envelope with one arm per protocol) and
//!   `proto/rainblock.proto` (RainBlock's messages).
//!
//! Both count, per role, messages, bytes (each message's protobuf encoded length, so the
//! counts are identical across transports) and round trips ([`NetStats`]).

/// The generated messages, in modules that mirror their protobuf packages.
mod generated {
    #![allow(clippy::all)]
    pub mod virga {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/virga.v1.rs"));
        }
        pub mod rainblock {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/virga.rainblock.v1.rs"));
            }
        }
    }
}

/// RainBlock's messages (package `virga.rainblock.v1`).
pub mod proto {
    pub use crate::generated::virga::rainblock::v1::*;
}

/// The envelope every peer call travels in (package `virga.v1`): the protocol's message in
/// the arm of its protocol.
pub mod envelope {
    pub use crate::generated::virga::v1::*;
}

pub mod driver;
#[cfg(feature = "grpc")]
mod grpc;
mod inproc;
pub mod role;
mod stats;

use std::future::Future;
use std::pin::Pin;

#[cfg(feature = "grpc")]
pub use grpc::{serve, Grpc};
pub use inproc::InProc;
pub use proto::{request::Body as RequestBody, response::Body as ResponseBody, Request, Response};
pub use stats::{KindTraffic, NetStats, RoleTraffic};

/// Largest message either transport accepts (a submission's node bag or a cold miner's top
/// layer can be tens of megabytes).
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("no peer named {0}")]
    UnknownPeer(String),
    #[error("peer {peer} is unreachable: {reason}")]
    Unreachable { peer: String, reason: String },
    #[error("peer {peer} refused the request: {reason}")]
    Refused { peer: String, reason: String },
    #[error("peer {peer} sent an empty or unexpected response")]
    BadResponse { peer: String },
    #[error("peer {peer} did not answer within {after:?}")]
    DeadlineExceeded { peer: String, after: std::time::Duration },
}

/// RainBlock's messages (storage nodes, miners, prefetching clients) as a [`role::Protocol`].
#[derive(Clone, Copy, Debug)]
pub struct Rainblock;

impl role::Protocol for Rainblock {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match &request.body {
            Some(RequestBody::Witness(_)) => "witness",
            Some(RequestBody::Top(_)) => "top",
            Some(RequestBody::ApplyBlock(_)) => "apply_block",
            Some(RequestBody::Head(_)) => "head",
            Some(RequestBody::Submit(_)) => "submit",
            Some(RequestBody::Announce(_)) => "announce",
            None => "empty",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match &response.body {
            Some(ResponseBody::Witness(_)) => "witness",
            Some(ResponseBody::Top(_)) => "top",
            Some(ResponseBody::BlockAck(_)) => "block_ack",
            Some(ResponseBody::Head(_)) => "head",
            Some(ResponseBody::Submitted(_)) => "submitted",
            Some(ResponseBody::Verdict(_)) => "verdict",
            Some(ResponseBody::Error(_)) => "error",
            None => "empty",
        }
    }

    fn request_bytes(request: &Request) -> usize {
        prost::Message::encoded_len(request)
    }

    fn response_bytes(response: &Response) -> usize {
        prost::Message::encoded_len(response)
    }

    fn check(peer: &str, response: Response) -> Result<Response, NetError> {
        check_response(peer, response)
    }
}

/// Serves requests addressed to one peer.
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from peer `from`. Refusals are `Response` bodies of kind `error`.
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response>;
}

/// Sends requests to peers by id.
pub trait Transport: Send + Sync + 'static {
    /// Sends `request` from `from` to `to` and waits for the response. A response of kind
    /// `error` is returned as [`NetError::Refused`].
    fn call(&self, from: &str, to: &str, request: Request) -> BoxFuture<Result<Response, NetError>>;

    /// The traffic counted so far.
    fn stats(&self) -> &NetStats;
}

/// The role of a peer id: the part before the first `-` (`storage-3` → `storage`).
pub fn role_of(peer: &str) -> &str {
    peer.split('-').next().unwrap_or(peer)
}

pub fn request(body: RequestBody) -> Request {
    Request { body: Some(body) }
}

pub fn response(body: ResponseBody) -> Response {
    Response { body: Some(body) }
}

/// A refusal with its reason.
pub fn refusal(reason: impl Into<String>) -> Response {
    response(ResponseBody::Error(reason.into()))
}

/// Turns an `error` response into [`NetError::Refused`] and an empty one into
/// [`NetError::BadResponse`].
fn check_response(peer: &str, response: Response) -> Result<Response, NetError> {
    match response.body {
        Some(ResponseBody::Error(reason)) => Err(NetError::Refused { peer: peer.to_string(), reason }),
        None => Err(NetError::BadResponse { peer: peer.to_string() }),
        Some(_) => Ok(response),
    }
}
