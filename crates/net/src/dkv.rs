//! The distributed transactional store's messages (package `virga.dkv.v1`) as a protocol:
//! Raft traffic between configuration replicas, proposals and map reads from clients.

use crate::dkv_proto::{request::Body as RequestBody, response::Body as ResponseBody, Request, Response};
use crate::role::Protocol;
use crate::{NetError, WireProtocol};

/// The dkv protocol: [`Request`] and [`Response`] of `virga.dkv.v1`, in the envelope's `dkv`
/// arm.
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

    /// Turns an `error` response into [`NetError::Refused`] and an empty one into
    /// [`NetError::BadResponse`]; `not_leader` is an answer, left to the caller.
    fn check(peer: &str, response: Response) -> Result<Response, NetError> {
        match response.body {
            Some(ResponseBody::Error(reason)) => Err(NetError::Refused { peer: peer.to_string(), reason }),
            None => Err(NetError::BadResponse { peer: peer.to_string() }),
            Some(_) => Ok(response),
        }
    }
}

impl WireProtocol for Dkv {
    const NAME: &'static str = "dkv";

    fn refusal(reason: String) -> Response {
        Response { body: Some(ResponseBody::Error(reason)) }
    }

    crate::envelope_arm!(Dkv);
}
