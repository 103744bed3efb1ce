//! Virga's peer transport.
//!
//! Roles talk by request and response, each conversation in one protocol (RainBlock's, the
//! distributed store's, ChainifyDB's, the [`health::Health`] probe, …): a caller names a peer
//! by id (`storage-3`, `miner-0`, `client-1`) and sends the protocol's request; the peer's
//! [`Handler`] for that protocol answers with the protocol's response. A peer hosts the
//! handlers of several protocols ([`Host`]).
//!
//! A protocol's messages are its own Rust types, defined in its crate; this crate knows them
//! only through [`role::Protocol`] (kinds, sizes, refusals) and [`WireProtocol`] (a name and
//! a codec). Two transports carry every protocol:
//!
//! - [`InProc`]: the embedded default. Peers are hosts in one process; a call is a function
//!   call on the callee's handler, passing the typed values: nothing is encoded.
//! - [`Grpc`]: each peer is a tonic server ([`serve`]) at an address; the schema is
//!   `proto/virga.proto`, an envelope that names the protocol and carries its message in the
//!   protocol's own encoding. The transport encodes once on the way out and decodes once on
//!   the way in; bytes that do not decode are refused, never defaulted.
//!
//! Both count, per peer and per message kind, messages, bytes (each message's encoded
//! length as the protocol reports it, so the counts are identical across transports) and
//! round trips ([`NetStats`]).

/// The generated messages, in modules that mirror their protobuf packages.
mod generated {
    #![allow(clippy::all, clippy::too_many_lines)]
    pub(crate) mod virga {
        pub(crate) mod v1 {
            include!(concat!(env!("OUT_DIR"), "/virga.v1.rs"));
        }
        pub(crate) mod health {
            pub(crate) mod v1 {
                include!(concat!(env!("OUT_DIR"), "/virga.health.v1.rs"));
            }
        }
    }
}

/// The envelope every peer call travels in (package `virga.v1`): the protocol's name and its
/// message's bytes.
pub mod envelope {
    pub use crate::generated::virga::v1::*;
}

pub mod driver;
#[cfg(test)]
mod echo;
#[cfg(feature = "grpc")]
mod grpc;
pub mod health;
mod host;
mod inproc;
pub mod role;
mod stats;
#[cfg(feature = "grpc")]
pub mod tls;
pub mod wired;

use std::future::Future;
use std::pin::Pin;

#[cfg(feature = "grpc")]
pub use grpc::{serve, serve_with_tls, Grpc};
pub use host::Host;
pub use inproc::InProc;
pub use stats::{KindTraffic, MessageKind, NetStats, RoleTraffic};
#[cfg(feature = "grpc")]
pub use tls::{Tls, TlsError};

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
    /// The peer's answer did not decode as its protocol's response.
    #[error("peer {peer} sent a malformed answer: {reason}")]
    Malformed { peer: String, reason: String },
    #[error("peer {peer} did not answer within {after:?}")]
    DeadlineExceeded { peer: String, after: std::time::Duration },
    /// The peer is up but serves no handler of the request's protocol.
    #[error("peer {peer} does not serve protocol {protocol} (it serves: {})", .hosted.join(", "))]
    NotHosted { peer: String, protocol: &'static str, hosted: Vec<String> },
}

/// A protocol the transports carry between peers: its name, its in-band refusal, and its
/// codec. The codec is the only place the protocol's messages meet bytes: the gRPC transport
/// encodes a request once and decodes it once at the callee (and the same for the response);
/// the in-process transport and the simulator pass the typed values and never call it.
///
/// Decoding is fail-closed: a missing field, a value out of range or an enum value this
/// build does not know is an error naming the field, never a default. A request that does
/// not decode is answered with the protocol's refusal carrying that error; a response that
/// does not decode is the caller's [`NetError::Malformed`].
pub trait WireProtocol: role::Protocol {
    /// The protocol's name on the wire (`rainblock`, `health`). Unique among the protocols
    /// of one [`Host`].
    const NAME: &'static str;

    /// Why bytes do not decode as one of the protocol's messages.
    type DecodeError: std::error::Error + Send + Sync + 'static;

    /// A response that refuses the request for `reason` (the caller gets
    /// [`NetError::Refused`] from [`role::Protocol::check`]).
    fn refusal(reason: String) -> Self::Response;

    fn encode_request(request: Self::Request) -> Vec<u8>;
    fn decode_request(bytes: &[u8]) -> Result<Self::Request, Self::DecodeError>;
    fn encode_response(response: Self::Response) -> Vec<u8>;
    fn decode_response(bytes: &[u8]) -> Result<Self::Response, Self::DecodeError>;
}

/// Why bytes are not a message of a protocol whose messages are protobuf's (the messages'
/// own checks come after, in the protocol's crate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    #[error("not a {message}: {source}")]
    Undecodable { message: &'static str, source: prost::DecodeError },
    /// A message whose `oneof` is unset: empty, or of a kind newer than this build.
    #[error("a {message} of no kind this build knows")]
    Empty { message: &'static str },
}

impl ProtobufError {
    /// `bytes` as protobuf message `M`, named `message` in the error.
    pub fn decode<M: prost::Message + Default>(bytes: &[u8], message: &'static str) -> Result<M, ProtobufError> {
        M::decode(bytes).map_err(|source| ProtobufError::Undecodable { message, source })
    }

    /// `bytes` as a protocol's envelope-less message `M` whose `oneof` must be set
    /// (`has_kind`): one of no kind this build knows is refused, never defaulted.
    pub fn decode_kind<M: prost::Message + Default>(
        bytes: &[u8],
        message: &'static str,
        has_kind: impl FnOnce(&M) -> bool,
    ) -> Result<M, ProtobufError> {
        let decoded: M = Self::decode(bytes, message)?;
        if has_kind(&decoded) {
            Ok(decoded)
        } else {
            Err(ProtobufError::Empty { message })
        }
    }
}

/// Serves one protocol's requests addressed to one peer.
pub trait Handler<P: role::Protocol>: Send + Sync + 'static {
    /// Answers `request` from peer `from`. Refusals are in-band responses
    /// ([`WireProtocol::refusal`]).
    fn handle(&self, from: String, request: P::Request) -> BoxFuture<P::Response>;
}

/// Sends one protocol's requests to peers by id.
pub trait Transport<P: role::Protocol>: Send + Sync + 'static {
    /// Sends `request` from `from` to `to` and waits for the response. A refusal is returned
    /// as [`NetError::Refused`] (the protocol's [`role::Protocol::check`]); a peer that does
    /// not host `P` answers [`NetError::NotHosted`].
    fn call(&self, from: &str, to: &str, request: P::Request) -> BoxFuture<Result<P::Response, NetError>>;

    /// The traffic counted so far (of every protocol the transport carries).
    fn stats(&self) -> &NetStats;
}

/// The role of a peer id: the part before the first `-` (`storage-3` → `storage`).
pub fn role_of(peer: &str) -> &str {
    peer.split('-').next().unwrap_or(peer)
}
