//! The health protocol (package `virga.health.v1`): a ping that a peer answers with its id,
//! role and build version. Every Virga peer hosts it beside its role's protocol, so any
//! node can be probed the same way, in process or over gRPC.

use crate::role::Protocol;
use crate::{role_of, BoxFuture, Handler, NetError, ProtobufError, Transport, WireProtocol};

/// Health's messages.
pub mod proto {
    pub use crate::generated::virga::health::v1::*;
}

pub use proto::{request::Body as RequestBody, response::Body as ResponseBody, Ping, Pong, Request, Response};

/// The version of Virga this build is (what a [`Pong`] reports).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The health protocol: [`Request`] and [`Response`] of `virga.health.v1`, in the envelope's
/// `health` arm.
#[derive(Clone, Copy, Debug)]
pub struct Health;

impl Protocol for Health {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match request.body {
            Some(RequestBody::Ping(_)) => "ping",
            None => "empty",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match response.body {
            Some(ResponseBody::Pong(_)) => "pong",
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

    fn refusal_reason(response: &Response) -> Option<&str> {
        match &response.body {
            Some(ResponseBody::Error(reason)) => Some(reason),
            _ => None,
        }
    }
}

impl WireProtocol for Health {
    const NAME: &'static str = "health";
    type DecodeError = ProtobufError;

    fn refusal(reason: String) -> Response {
        Response { body: Some(ResponseBody::Error(reason)) }
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request)
    }

    fn decode_request(bytes: &[u8]) -> Result<Request, ProtobufError> {
        ProtobufError::decode_kind(bytes, "health request", |request: &Request| request.body.is_some())
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, ProtobufError> {
        ProtobufError::decode_kind(bytes, "health response", |response: &Response| response.body.is_some())
    }
}

/// Answers pings for one peer, at once and without touching the peer's role (a node busy
/// building a block still answers).
pub struct Responder {
    pong: Pong,
}

impl Responder {
    /// The responder of peer `node`, its role read from the id (`storage-3` → `storage`).
    pub fn new(node: impl Into<String>) -> Self {
        let node = node.into();
        let role = role_of(&node).to_string();
        Responder { pong: Pong { node, role, version: VERSION.to_string() } }
    }
}

impl Handler<Health> for Responder {
    fn handle(&self, _from: String, request: Request) -> BoxFuture<Response> {
        let response = match request.body {
            Some(RequestBody::Ping(Ping {})) => Response { body: Some(ResponseBody::Pong(self.pong.clone())) },
            None => Health::refusal("an empty health request".to_string()),
        };
        Box::pin(std::future::ready(response))
    }
}

/// Pings peer `to` from `from`: who it is and which version it runs.
pub async fn ping(transport: &dyn Transport<Health>, from: &str, to: &str) -> Result<Pong, NetError> {
    let response = transport.call(from, to, Request { body: Some(RequestBody::Ping(Ping {})) }).await?;
    match response.body {
        Some(ResponseBody::Pong(pong)) => Ok(pong),
        _ => Err(NetError::BadResponse { peer: to.to_string() }),
    }
}
