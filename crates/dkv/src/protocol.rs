//! The store's messages between its roles as a protocol of the transports: Raft traffic
//! between configuration replicas, proposals and map reads from clients and data nodes, and
//! the shard replicas' reads, two-phase commit, replication, leases and termination.

use virga_net::role::Protocol;
use virga_net::{NetError, ProtobufError, WireProtocol};

use crate::proto::{request::Body as RequestBody, response::Body as ResponseBody, Request, Response};

/// The dkv protocol: [`Request`] and [`Response`] of `virga.dkv.v1`, in envelopes named `dkv`.
#[derive(Clone, Copy, Debug)]
pub struct Dkv;

impl Protocol for Dkv {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match &request.body {
            Some(RequestBody::Raft(_)) => "raft",
            Some(RequestBody::Propose(_)) => "propose",
            Some(RequestBody::GetMap(_)) => "get_map",
            Some(RequestBody::Get(_)) => "get",
            // A read-only transaction's validation alone costs far less than a prepare.
            Some(RequestBody::Prepare(prepare)) if prepare.validate_only => "validate",
            Some(RequestBody::Prepare(_)) => "prepare",
            Some(RequestBody::Decide(_)) => "decide",
            Some(RequestBody::Replicate(_)) => "replicate",
            Some(RequestBody::Query(_)) => "query",
            Some(RequestBody::Lease(_)) => "lease",
            Some(RequestBody::Fetch(_)) => "fetch",
            Some(RequestBody::Watermark(_)) => "watermark",
            Some(RequestBody::Scan(_)) => "scan",
            Some(RequestBody::GetMany(_)) => "get_many",
            Some(RequestBody::Invalidate(_)) => "invalidate",
            Some(RequestBody::Validate(_)) => "validator_validate",
            Some(RequestBody::Release(_)) => "release",
            Some(RequestBody::ValidatorLease(_)) => "validator_lease",
            None => "empty",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match &response.body {
            Some(ResponseBody::Ack(_)) => "ack",
            Some(ResponseBody::Proposed(_)) => "proposed",
            Some(ResponseBody::NotLeader(_)) => "not_leader",
            Some(ResponseBody::Map(_)) => "map",
            Some(ResponseBody::Value(_)) => "value",
            Some(ResponseBody::Vote(_)) => "vote",
            Some(ResponseBody::WrongEpoch(_)) => "wrong_epoch",
            Some(ResponseBody::State(_)) => "state",
            Some(ResponseBody::Grant(_)) => "grant",
            Some(ResponseBody::Table(_)) => "table",
            Some(ResponseBody::TooOld(_)) => "too_old",
            Some(ResponseBody::Rows(_)) => "rows",
            Some(ResponseBody::Values(_)) => "values",
            Some(ResponseBody::ValidatorGrant(_)) => "validator_grant",
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

    /// An `error` response is a refusal; `not_leader` is an answer, left to the caller.
    fn refusal_reason(response: &Response) -> Option<&str> {
        match &response.body {
            Some(ResponseBody::Error(reason)) => Some(reason),
            _ => None,
        }
    }
}

impl WireProtocol for Dkv {
    const NAME: &'static str = "dkv";
    type DecodeError = ProtobufError;

    fn refusal(reason: String) -> Response {
        Response { body: Some(ResponseBody::Error(reason)) }
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request)
    }

    /// A request of no kind this build knows is refused, not served as a default.
    fn decode_request(bytes: &[u8]) -> Result<Request, ProtobufError> {
        let request: Request = ProtobufError::decode(bytes, "dkv request")?;
        match request.body {
            Some(_) => Ok(request),
            None => Err(ProtobufError::Empty { message: "dkv request" }),
        }
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, ProtobufError> {
        let response: Response = ProtobufError::decode(bytes, "dkv response")?;
        match response.body {
            Some(_) => Ok(response),
            None => Err(ProtobufError::Empty { message: "dkv response" }),
        }
    }
}

/// The body of an answer to one of a core's calls. A response with no body is what no peer
/// of this build sends (the codec refuses one on the wire), so it is a bad response.
pub(crate) fn body_of(result: Result<Response, NetError>) -> Result<ResponseBody, NetError> {
    match result {
        Ok(Response { body: Some(body) }) => Ok(body),
        Ok(Response { body: None }) => Err(NetError::BadResponse { peer: "a dkv peer".to_string() }),
        Err(error) => Err(error),
    }
}
