//! RainBlock's messages (storage nodes, miners, prefetching clients) as a protocol of the
//! transports.

use virga_net::role::Protocol;
use virga_net::{ProtobufError, WireProtocol};

pub use crate::proto::{request::Body as RequestBody, response::Body as ResponseBody, Request, Response};

/// RainBlock's protocol: [`Request`] and [`Response`] of package `virga.rainblock.v1`, in
/// envelopes named `rainblock`.
#[derive(Clone, Copy, Debug)]
pub struct Rainblock;

impl Protocol for Rainblock {
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

    fn refusal_reason(response: &Response) -> Option<&str> {
        match &response.body {
            Some(ResponseBody::Error(reason)) => Some(reason),
            _ => None,
        }
    }
}

impl WireProtocol for Rainblock {
    const NAME: &'static str = "rainblock";
    type DecodeError = ProtobufError;

    fn refusal(reason: String) -> Response {
        refusal(reason)
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request)
    }

    /// A request of no kind this build knows is refused, not served as a default.
    fn decode_request(bytes: &[u8]) -> Result<Request, ProtobufError> {
        let request: Request = ProtobufError::decode(bytes, "rainblock request")?;
        match request.body {
            Some(_) => Ok(request),
            None => Err(ProtobufError::Empty { message: "rainblock request" }),
        }
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, ProtobufError> {
        let response: Response = ProtobufError::decode(bytes, "rainblock response")?;
        match response.body {
            Some(_) => Ok(response),
            None => Err(ProtobufError::Empty { message: "rainblock response" }),
        }
    }
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
