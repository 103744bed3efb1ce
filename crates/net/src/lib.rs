//! Virga's peer transport.
//!
//! Roles talk by request and response, each conversation in one protocol (RainBlock's
//! [`Rainblock`], the [`health::Health`] probe, the distributed store's [`Dkv`], …): a
//! caller names a peer by id (`storage-3`, `miner-0`, `client-1`) and sends the protocol's
//! request; the peer's [`Handler`] for that protocol answers with the protocol's response.
//! A peer hosts the handlers of several protocols ([`Host`]). Two transports carry every protocol:
//!
//! - [`InProc`]: the embedded default. Peers are hosts in one process; a call is a function
//!   call on the callee's handler, with no encoding.
//! - [`Grpc`]: each peer is a tonic server ([`serve`]) at an address; the schema is
//!   `proto/virga.proto` (an envelope with one arm per protocol, see [`WireProtocol`]) and a
//!   package per protocol (`proto/rainblock.proto`, `proto/health.proto`).
//!
//! Both count, per peer and per message kind, messages, bytes (each message's protobuf
//! encoded length, so the counts are identical across transports) and round trips
//! ([`NetStats`]).

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
        pub mod health {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/virga.health.v1.rs"));
            }
        }
        pub mod dkv {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/virga.dkv.v1.rs"));
            }
        }
        pub mod chainify {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/virga.chainify.v1.rs"));
            }
        }
    }
}

/// RainBlock's messages (package `virga.rainblock.v1`).
pub mod proto {
    pub use crate::generated::virga::rainblock::v1::*;
}

/// The distributed transactional store's messages (package `virga.dkv.v1`): the shard map,
/// the configuration commands, the configuration service's Raft traffic and the [`Dkv`]
/// protocol's requests and responses. virga-dkv's `wire` and `raft_wire` modules check them.
pub mod dkv_proto {
    pub use crate::generated::virga::dkv::v1::*;
}

/// ChainifyDB's pipeline messages (package `virga.chainify.v1`): byte bodies that
/// virga-chainify's `pipeline::wire` encodes, decodes and checks; carried by [`Chainify`].
pub mod chainify_proto {
    pub use crate::generated::virga::chainify::v1::*;
}

/// The envelope every peer call travels in (package `virga.v1`): the protocol's message in
/// the arm of its protocol.
pub mod envelope {
    pub use crate::generated::virga::v1::*;
}

mod chainify;
mod dkv;
pub mod driver;
#[cfg(feature = "grpc")]
mod grpc;
pub mod health;
mod host;
mod inproc;
mod rainblock;
pub mod role;
mod stats;
#[cfg(feature = "grpc")]
pub mod tls;

use std::future::Future;
use std::pin::Pin;

pub use chainify::Chainify;
pub use dkv::Dkv;
#[cfg(feature = "grpc")]
pub use grpc::{serve, serve_with_tls, Grpc};
pub use host::Host;
pub use inproc::InProc;
pub use proto::{request::Body as RequestBody, response::Body as ResponseBody, Request, Response};
pub use rainblock::{refusal, request, response, Rainblock};
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
    #[error("peer {peer} did not answer within {after:?}")]
    DeadlineExceeded { peer: String, after: std::time::Duration },
    /// The peer is up but serves no handler of the request's protocol.
    #[error("peer {peer} does not serve protocol {protocol} (it serves: {})", .hosted.join(", "))]
    NotHosted { peer: String, protocol: &'static str, hosted: Vec<String> },
}

/// A protocol the transports carry between peers: its name, its in-band refusal, and its
/// arm of the envelope's and the reply's `oneof` (`proto/virga.proto`), which is how one
/// gRPC server hosts several protocols and tells their messages apart.
///
/// The `from_*` conversions hand a foreign arm back by value (it is the caller's, moved, not
/// copied), hence Results as large as the arm.
#[allow(clippy::result_large_err)]
pub trait WireProtocol: role::Protocol {
    /// The protocol's name: its arm's name in the envelope (`rainblock`, `health`). Unique
    /// among the protocols of one [`Host`].
    const NAME: &'static str;

    /// A response that refuses the request for `reason` (the caller gets
    /// [`NetError::Refused`] from [`role::Protocol::check`]).
    fn refusal(reason: String) -> Self::Response;

    fn into_envelope(request: Self::Request) -> envelope::envelope::Protocol;
    /// The request in `arm`, or `arm` back when it is another protocol's.
    fn from_envelope(arm: envelope::envelope::Protocol) -> Result<Self::Request, envelope::envelope::Protocol>;
    fn into_reply(response: Self::Response) -> envelope::reply::Protocol;
    /// The response in `arm`, or `arm` back when it is another protocol's (or `not_hosted`).
    fn from_reply(arm: envelope::reply::Protocol) -> Result<Self::Response, envelope::reply::Protocol>;
}

/// The four conversions of [`WireProtocol`] for a protocol whose arm is named `$arm` in both
/// the envelope's and the reply's oneof (every protocol's is), inside its `impl WireProtocol`.
#[macro_export]
macro_rules! envelope_arm {
    ($arm:ident) => {
        fn into_envelope(request: Self::Request) -> $crate::envelope::envelope::Protocol {
            $crate::envelope::envelope::Protocol::$arm(request)
        }

        fn from_envelope(
            arm: $crate::envelope::envelope::Protocol,
        ) -> Result<Self::Request, $crate::envelope::envelope::Protocol> {
            match arm {
                $crate::envelope::envelope::Protocol::$arm(request) => Ok(request),
                other => Err(other),
            }
        }

        fn into_reply(response: Self::Response) -> $crate::envelope::reply::Protocol {
            $crate::envelope::reply::Protocol::$arm(response)
        }

        fn from_reply(
            arm: $crate::envelope::reply::Protocol,
        ) -> Result<Self::Response, $crate::envelope::reply::Protocol> {
            match arm {
                $crate::envelope::reply::Protocol::$arm(response) => Ok(response),
                other => Err(other),
            }
        }
    };
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
