//! RainBlock's messages (storage nodes, miners, prefetching clients) as a protocol.

use crate::role::Protocol;
use crate::{NetError, Request, RequestBody, Response, ResponseBody, WireProtocol};

/// RainBlock's protocol: [`Request`] and [`Response`] of package `virga.rainblock.v1`, in the
/// envelope's `rainblock` arm.
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

    /// Turns an `error` response into [`NetError::Refused`] and an empty one into
    /// [`NetError::BadResponse`].
    fn check(peer: &str, response: Response) -> Result<Response, NetError> {
        match response.body {
            Some(ResponseBody::Error(reason)) => Err(NetError::Refused { peer: peer.to_string(), reason }),
            None => Err(NetError::BadResponse { peer: peer.to_string() }),
            Some(_) => Ok(response),
        }
    }
}

impl WireProtocol for Rainblock {
    const NAME: &'static str = "rainblock";

    fn refusal(reason: String) -> Response {
        refusal(reason)
    }

    crate::envelope_arm!(Rainblock);
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
