//! The store's messages between its roles as a protocol of the transports: Raft traffic
//! between configuration replicas, proposals and map reads from clients and data nodes, and
//! the shard replicas' reads, two-phase commit, replication, leases and termination.

use virga_net::role::Protocol;
use virga_net::{NetError, ProtobufError, WireProtocol};

use crate::proto::TxnPhase;

/// Why bytes are not a message of the dkv protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DkvWireError {
    #[error(transparent)]
    Protobuf(#[from] ProtobufError),
    /// An enum field holds a value this build does not know: refused, never defaulted.
    #[error("field {field} holds {value}, a value this build does not know")]
    UnknownEnumValue { field: &'static str, value: i32 },
}

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
    type DecodeError = DkvWireError;

    fn refusal(reason: String) -> Response {
        Response { body: Some(ResponseBody::Error(reason)) }
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request)
    }

    /// A request of no kind this build knows is refused, not served as a default.
    fn decode_request(bytes: &[u8]) -> Result<Request, DkvWireError> {
        Ok(ProtobufError::decode_kind(bytes, "dkv request", |request: &Request| request.body.is_some())?)
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, DkvWireError> {
        let response =
            ProtobufError::decode_kind(bytes, "dkv response", |response: &Response| response.body.is_some())?;
        if let Some(ResponseBody::State(state)) = &response.body {
            if TxnPhase::try_from(state.phase).is_err() {
                return Err(DkvWireError::UnknownEnumValue { field: "TxnState.phase", value: state.phase });
            }
        }
        Ok(response)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;
    use proptest::prelude::*;

    fn state(phase: i32) -> Response {
        Response { body: Some(ResponseBody::State(proto::TxnState { phase })) }
    }

    #[test]
    fn an_unknown_termination_phase_is_refused_and_never_read_as_a_vote() {
        let bytes = Dkv::encode_response(state(9));
        assert_eq!(
            Dkv::decode_response(&bytes),
            Err(DkvWireError::UnknownEnumValue { field: "TxnState.phase", value: 9 })
        );
        for phase in [TxnPhase::NeverPrepared, TxnPhase::Prepared, TxnPhase::VotedAbort, TxnPhase::Committed] {
            let known = state(phase as i32);
            assert_eq!(Dkv::decode_response(&Dkv::encode_response(known.clone())), Ok(known));
        }
    }

    #[test]
    fn an_empty_or_unparsable_message_is_refused_with_its_reason() {
        assert_eq!(
            Dkv::decode_request(&Dkv::encode_request(Request { body: None })),
            Err(ProtobufError::Empty { message: "dkv request" }.into())
        );
        assert!(matches!(
            Dkv::decode_response(&[0xff, 0xff]),
            Err(DkvWireError::Protobuf(ProtobufError::Undecodable { message: "dkv response", .. }))
        ));
    }

    fn get() -> impl Strategy<Value = Request> {
        (
            any::<u32>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 1..40),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(|(shard, epoch, key, time, client, read_interval_ns)| Request {
                body: Some(proto::request::Body::Get(proto::Get {
                    shard,
                    epoch,
                    key,
                    ts: Some(proto::Timestamp { time, client }),
                    read_interval_ns,
                })),
            })
    }

    proptest! {
        /// What the gRPC transport sends is what the callee's core receives, and the byte
        /// count both transports report is the encoding's length.
        #[test]
        fn a_request_crosses_the_codec_unchanged(request in get()) {
            let bytes = Dkv::encode_request(request.clone());
            prop_assert_eq!(bytes.len(), Dkv::request_bytes(&request));
            prop_assert_eq!(Dkv::decode_request(&bytes), Ok(request));
        }

        #[test]
        fn any_bytes_decode_to_a_message_or_a_named_refusal(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            match Dkv::decode_response(&bytes) {
                Ok(response) => prop_assert!(response.body.is_some()),
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }
    }
}
