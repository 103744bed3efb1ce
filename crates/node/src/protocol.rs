//! RainBlock's messages (storage nodes, miners, prefetching clients) as a protocol of the
//! transports: the cores exchange [`crate::messages`]; the gRPC transport encodes them once
//! through [`crate::codec`].

use virga_net::role::Protocol;
use virga_net::{ProtobufError, WireProtocol};

use crate::codec::{request_from_wire, request_to_wire, response_from_wire, response_to_wire, WireError};
pub use crate::messages::{Request, Response};

/// RainBlock's protocol: [`Request`] and [`Response`], in envelopes named `rainblock`.
#[derive(Clone, Copy, Debug)]
pub struct Rainblock;

/// Why bytes are not a RainBlock message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RainblockWireError {
    #[error(transparent)]
    Protobuf(#[from] ProtobufError),
    #[error(transparent)]
    Field(#[from] WireError),
}

impl Protocol for Rainblock {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match request {
            Request::Witness(_) => "witness",
            Request::Top(_) => "top",
            Request::ApplyBlock(_) => "apply_block",
            Request::Head => "head",
            Request::Submit(_) => "submit",
            Request::Announce(_) => "announce",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match response {
            Response::Witness(_) => "witness",
            Response::Top(_) => "top",
            Response::BlockAck(_) => "block_ack",
            Response::Head(_) => "head",
            Response::Submitted(_) => "submitted",
            Response::Verdict(_) => "verdict",
            Response::Refused(_) => "error",
        }
    }

    /// The encoding's length. It converts a copy, so it is for the cost model, not a hot
    /// path (the gRPC transport counts the bytes it sends).
    fn request_bytes(request: &Request) -> usize {
        prost::Message::encoded_len(&request_to_wire(request.clone()))
    }

    fn response_bytes(response: &Response) -> usize {
        prost::Message::encoded_len(&response_to_wire(response.clone()))
    }

    fn refusal_reason(response: &Response) -> Option<&str> {
        match response {
            Response::Refused(reason) => Some(reason),
            _ => None,
        }
    }
}

impl WireProtocol for Rainblock {
    const NAME: &'static str = "rainblock";
    type DecodeError = RainblockWireError;

    fn refusal(reason: String) -> Response {
        Response::Refused(reason)
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request_to_wire(request))
    }

    /// A request of no kind this build knows, or with a malformed field, is refused.
    fn decode_request(bytes: &[u8]) -> Result<Request, RainblockWireError> {
        let request = ProtobufError::decode_kind(bytes, "rainblock request", |request: &crate::proto::Request| {
            request.body.is_some()
        })?;
        Ok(request_from_wire(request)?)
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response_to_wire(response))
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, RainblockWireError> {
        let response = ProtobufError::decode_kind(bytes, "rainblock response", |response: &crate::proto::Response| {
            response.body.is_some()
        })?;
        Ok(response_from_wire(response)?)
    }
}

/// A refusal with its reason.
pub fn refusal(reason: impl Into<String>) -> Response {
    Response::Refused(reason.into())
}

#[cfg(test)]
mod tests;
