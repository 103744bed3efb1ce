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
        ProtobufError::decode_kind(bytes, "rainblock request", |request: &Request| request.body.is_some())
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, ProtobufError> {
        ProtobufError::decode_kind(bytes, "rainblock response", |response: &Response| response.body.is_some())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;
    use proptest::prelude::*;

    fn witness() -> impl Strategy<Value = Request> {
        (prop::collection::vec(prop::collection::vec(any::<u8>(), 32), 0..8), any::<u32>(), any::<u64>()).prop_map(
            |(keys, compaction, number)| {
                request(RequestBody::Witness(proto::WitnessRequest {
                    keys,
                    compaction,
                    at: Some(proto::BlockId { number, hash: vec![7; 32] }),
                    slots: Vec::new(),
                    code_hashes: Vec::new(),
                }))
            },
        )
    }

    proptest! {
        /// What the gRPC transport sends is what the callee's core receives, and the byte
        /// count both transports report is the encoding's length.
        #[test]
        fn a_request_crosses_the_codec_unchanged(request in witness()) {
            let bytes = Rainblock::encode_request(request.clone());
            prop_assert_eq!(bytes.len(), Rainblock::request_bytes(&request));
            prop_assert_eq!(Rainblock::decode_request(&bytes), Ok(request));
        }

        #[test]
        fn any_bytes_decode_to_a_message_or_a_named_refusal(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            match Rainblock::decode_response(&bytes) {
                Ok(response) => prop_assert!(response.body.is_some()),
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }
    }

    #[test]
    fn an_empty_message_is_a_message_of_no_known_kind_and_refused() {
        assert_eq!(
            Rainblock::decode_request(&Rainblock::encode_request(Request { body: None })),
            Err(ProtobufError::Empty { message: "rainblock request" })
        );
        assert_eq!(Rainblock::decode_response(&[]), Err(ProtobufError::Empty { message: "rainblock response" }));
        let refused = Rainblock::decode_response(&Rainblock::encode_response(refusal("busy"))).unwrap();
        assert_eq!(Rainblock::refusal_reason(&refused), Some("busy"));
    }
}
