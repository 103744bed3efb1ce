//! ChainifyDB's pipeline protocol on the transports: byte bodies whose first byte is the
//! message's kind (the tags of `virga_chainify::pipeline::wire`, which encodes, decodes and
//! checks them).

use crate::chainify_proto::{response::Body, Request, Response};
use crate::role::Protocol;
use crate::{NetError, WireProtocol};

/// The pipeline's protocol as the transports carry it.
#[derive(Debug)]
pub struct Chainify;

const REQUEST_KINDS: [&str; 8] = ["unknown", "propose", "agree", "order", "fetch", "decide", "vote", "committed"];
const RESPONSE_KINDS: [&str; 9] =
    ["unknown", "done", "agreed", "ordered", "blocks", "decided", "vote_ack", "ack", "refused"];

impl Protocol for Chainify {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        let tag = request.body.first().copied().unwrap_or(0);
        REQUEST_KINDS.get(usize::from(tag)).copied().unwrap_or("unknown")
    }

    fn response_kind(response: &Response) -> &'static str {
        match &response.body {
            Some(Body::Message(body)) => {
                let tag = body.first().copied().unwrap_or(0);
                RESPONSE_KINDS.get(usize::from(tag)).copied().unwrap_or("unknown")
            }
            Some(Body::Error(_)) => "error",
            None => "empty",
        }
    }

    fn request_bytes(request: &Request) -> usize {
        prost::Message::encoded_len(request)
    }

    fn response_bytes(response: &Response) -> usize {
        prost::Message::encoded_len(response)
    }

    /// A transport's own refusal becomes [`NetError::Refused`], an empty response
    /// [`NetError::BadResponse`]; a refusal inside the body is the pipeline's to read.
    fn check(peer: &str, response: Response) -> Result<Response, NetError> {
        match response.body {
            Some(Body::Error(reason)) => Err(NetError::Refused { peer: peer.to_string(), reason }),
            None => Err(NetError::BadResponse { peer: peer.to_string() }),
            Some(Body::Message(_)) => Ok(response),
        }
    }
}

impl WireProtocol for Chainify {
    const NAME: &'static str = "chainify";

    fn refusal(reason: String) -> Response {
        Response { body: Some(Body::Error(reason)) }
    }

    crate::envelope_arm!(Chainify);
}
