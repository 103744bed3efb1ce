//! The store's messages between its roles as a protocol of the transports: Raft traffic
//! between configuration replicas, proposals and map reads from clients and data nodes, and
//! the shard replicas' reads, two-phase commit, replication, leases and termination.

use virga_net::role::Protocol;
use virga_net::{ProtobufError, WireProtocol};

use crate::kairos::{validate_from_wire, validate_to_wire, ValidateWireError};
use crate::messages::{
    Decide, Fetch, FetchTable, Get, GetMany, Invalidate, LeaseRequest, MapReply, Proposed, ReadReply, Refusal,
    RefusalKind, Release, Replicate, Request, Response, Resync, Row, Scan, ScanReply, TooOld, TxnPhase, TxnQuery,
    ValidatorGrant, ValidatorLease, Vote, Watermark,
};
use crate::proto;
use crate::proto::{request::Body as RequestBody, response::Body as ResponseBody};
use crate::shard::wire::{self as shard_wire, ShardWireError};
use crate::wire as config_wire;
use bytes::Bytes;

/// Why bytes are not a message of the dkv protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DkvWireError {
    #[error(transparent)]
    Protobuf(#[from] ProtobufError),
    /// An enum field holds a value this build does not know: refused, never defaulted.
    #[error("field {field} holds {value}, a value this build does not know")]
    UnknownEnumValue { field: &'static str, value: i32 },
    /// A message of kind `kind` whose fields do not make one.
    #[error("{kind}: {source}")]
    Malformed {
        kind: &'static str,
        #[source]
        source: ShardWireError,
    },
    /// A configuration proposal or shard map that is not one.
    #[error("{kind}: {source}")]
    Config {
        kind: &'static str,
        #[source]
        source: crate::wire::WireError,
    },
    /// A KAIROS validation that is not one.
    #[error("validator_validate: {0}")]
    Validation(#[from] ValidateWireError),
}

fn malformed(kind: &'static str) -> impl FnOnce(ShardWireError) -> DkvWireError {
    move |source| DkvWireError::Malformed { kind, source }
}

/// The dkv protocol: [`Request`] and [`Response`] of [`crate::messages`], in envelopes
/// named `dkv`.
#[derive(Clone, Copy, Debug)]
pub struct Dkv;

impl Protocol for Dkv {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match request {
            Request::Raft(_) => "raft",
            Request::Propose(_) => "propose",
            Request::GetMap => "get_map",
            Request::Get(_) => "get",
            // A read-only transaction's validation alone costs far less than a prepare.
            Request::Prepare(prepare) if prepare.validate_only => "validate",
            Request::Prepare(_) => "prepare",
            Request::Decide(_) => "decide",
            Request::Replicate(_) => "replicate",
            Request::Resync(_) => "resync",
            Request::Query(_) => "query",
            Request::Lease(_) => "lease",
            Request::Fetch(_) => "fetch",
            Request::Watermark(_) => "watermark",
            Request::Scan(_) => "scan",
            Request::GetMany(_) => "get_many",
            Request::Invalidate(_) => "invalidate",
            Request::Validate(_) => "validator_validate",
            Request::Release(_) => "release",
            Request::ValidatorLease(_) => "validator_lease",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match response {
            Response::Ack => "ack",
            Response::Proposed(_) => "proposed",
            Response::NotLeader(_) => "not_leader",
            Response::Map(_) => "map",
            Response::Value(_) => "value",
            Response::Vote(_) => "vote",
            Response::WrongEpoch(_) => "wrong_epoch",
            Response::State(_) => "state",
            Response::Grant(_) => "grant",
            Response::Table(_) => "table",
            Response::TooOld(_) => "too_old",
            Response::Rows(_) => "rows",
            Response::Values(_) => "values",
            Response::ValidatorGrant(_) => "validator_grant",
            Response::Refused(_) => "error",
        }
    }

    /// The encoding's length. It converts a copy, so it is for reports, not a hot path (the
    /// gRPC transport counts the bytes it sends).
    fn request_bytes(request: &Request) -> usize {
        prost::Message::encoded_len(&request_to_wire(request.clone()))
    }

    fn response_bytes(response: &Response) -> usize {
        prost::Message::encoded_len(&response_to_wire(response.clone()))
    }

    /// A `Refused` response is a refusal; `NotLeader` is an answer, left to the caller.
    fn refusal_reason(response: &Response) -> Option<&str> {
        match response {
            Response::Refused(refusal) => Some(&refusal.detail),
            _ => None,
        }
    }
}

impl WireProtocol for Dkv {
    const NAME: &'static str = "dkv";
    type DecodeError = DkvWireError;

    fn refusal(reason: String) -> Response {
        Response::refused(RefusalKind::Transport, reason)
    }

    fn encode_request(request: Request) -> Vec<u8> {
        prost::Message::encode_to_vec(&request_to_wire(request))
    }

    /// A request of no kind this build knows is refused, not served as a default.
    fn decode_request(bytes: &[u8]) -> Result<Request, DkvWireError> {
        let request: crate::proto::Request =
            ProtobufError::decode_kind(bytes, "dkv request", |request: &crate::proto::Request| request.body.is_some())?;
        request_from_wire(request)
    }

    fn encode_response(response: Response) -> Vec<u8> {
        prost::Message::encode_to_vec(&response_to_wire(response))
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, DkvWireError> {
        let response: crate::proto::Response =
            ProtobufError::decode_kind(bytes, "dkv response", |response: &crate::proto::Response| {
                response.body.is_some()
            })?;
        response_from_wire(response)
    }
}

fn request_to_wire(request: Request) -> crate::proto::Request {
    let body = match request {
        Request::Raft(batch) => RequestBody::Raft(batch),
        Request::Propose(proposal) => RequestBody::Propose(config_wire::proposal_to_proto(&proposal)),
        Request::GetMap => RequestBody::GetMap(crate::proto::GetMap {}),
        Request::Get(Get { shard, epoch, key, ts, read_interval_ns }) => RequestBody::Get(proto::Get {
            shard,
            epoch,
            key: key.to_vec(),
            ts: Some(shard_wire::ts_to_wire(ts)),
            read_interval_ns,
        }),
        Request::GetMany(GetMany { shard, epoch, keys, ts, read_intervals_ns }) => {
            RequestBody::GetMany(proto::GetMany {
                shard,
                epoch,
                keys: keys.iter().map(|key| key.to_vec()).collect(),
                ts: Some(shard_wire::ts_to_wire(ts)),
                read_intervals_ns,
            })
        }
        Request::Scan(Scan { shard, epoch, range, limit }) => RequestBody::Scan(proto::Scan {
            shard,
            epoch,
            start: range.start.to_vec(),
            end: range.end.map(|end| end.to_vec()).unwrap_or_default(),
            ts: Some(shard_wire::ts_to_wire(range.ts)),
            limit,
        }),
        Request::Prepare(prepare) => RequestBody::Prepare(shard_wire::prepare_to_wire(&prepare)),
        Request::Decide(Decide { shard, epoch, txn, commit }) => {
            RequestBody::Decide(crate::proto::Decide { shard, epoch, txn: Some(shard_wire::txn_to_wire(txn)), commit })
        }
        Request::Replicate(Replicate { shard, epoch, record }) => RequestBody::Replicate(crate::proto::Replicate {
            shard,
            epoch,
            record: Some(shard_wire::record_to_wire(&record)),
        }),
        Request::Query(TxnQuery { shard, epoch, txn }) => {
            RequestBody::Query(crate::proto::TxnQuery { shard, epoch, txn: Some(shard_wire::txn_to_wire(txn)) })
        }
        Request::Lease(LeaseRequest { shard, epoch, until, watermark, settled }) => {
            RequestBody::Lease(proto::LeaseRequest {
                shard,
                epoch,
                until: Some(shard_wire::ts_to_wire(until)),
                watermark: Some(shard_wire::ts_to_wire(watermark)),
                settled: Some(shard_wire::ts_to_wire(settled)),
            })
        }
        Request::Fetch(Fetch { shard, epoch }) => RequestBody::Fetch(proto::Fetch { shard, epoch }),
        Request::Resync(Resync { shard, epoch }) => RequestBody::Resync(proto::Resync { shard, epoch }),
        Request::Watermark(Watermark { client, ts, freshness }) => RequestBody::Watermark(proto::Watermark {
            client,
            ts: Some(shard_wire::ts_to_wire(ts)),
            freshness: Some(shard_wire::ts_to_wire(freshness)),
        }),
        Request::Invalidate(Invalidate { key, version }) => RequestBody::Invalidate(proto::Invalidate {
            key: key.to_vec(),
            version: Some(shard_wire::ts_to_wire(version)),
        }),
        Request::Validate(validate) => RequestBody::Validate(validate_to_wire(&validate)),
        Request::Release(Release { txn, commit }) => {
            RequestBody::Release(proto::Release { txn: Some(shard_wire::txn_to_wire(txn)), commit })
        }
        Request::ValidatorLease(ValidatorLease { validator, shard, epoch, until_ns }) => {
            RequestBody::ValidatorLease(proto::ValidatorLease { validator, shard, epoch, until_ns })
        }
    };
    crate::proto::Request { body: Some(body) }
}

fn request_from_wire(request: crate::proto::Request) -> Result<Request, DkvWireError> {
    let Some(body) = request.body else {
        return Err(ProtobufError::Empty { message: "dkv request" }.into());
    };
    Ok(match body {
        RequestBody::Raft(batch) => Request::Raft(batch),
        RequestBody::Propose(proposal) => Request::Propose(
            config_wire::proposal_from_proto(proposal)
                .map_err(|source| DkvWireError::Config { kind: "propose", source })?,
        ),
        RequestBody::GetMap(crate::proto::GetMap {}) => Request::GetMap,
        RequestBody::Get(get) => Request::Get(Get {
            shard: get.shard,
            epoch: get.epoch,
            key: Bytes::from(get.key),
            ts: shard_wire::ts_from_wire(get.ts),
            read_interval_ns: get.read_interval_ns,
        }),
        RequestBody::GetMany(get) => Request::GetMany(GetMany {
            shard: get.shard,
            epoch: get.epoch,
            keys: get.keys.into_iter().map(Bytes::from).collect(),
            ts: shard_wire::ts_from_wire(get.ts),
            read_intervals_ns: get.read_intervals_ns,
        }),
        RequestBody::Scan(scan) => Request::Scan(Scan {
            shard: scan.shard,
            epoch: scan.epoch,
            range: shard_wire::range_from_wire(scan.start, scan.end, scan.ts).map_err(malformed("scan"))?,
            limit: scan.limit,
        }),
        RequestBody::Prepare(prepare) => {
            Request::Prepare(shard_wire::prepare_from_wire(prepare).map_err(malformed("prepare"))?)
        }
        RequestBody::Decide(decide) => Request::Decide(Decide {
            shard: decide.shard,
            epoch: decide.epoch,
            txn: shard_wire::txn_from_wire(decide.txn).map_err(malformed("decide"))?,
            commit: decide.commit,
        }),
        RequestBody::Replicate(replicate) => {
            let shard = shard_wire::shard_from_wire(replicate.shard).map_err(malformed("replicate"))?;
            let record = replicate.record.ok_or(ShardWireError::Missing("record")).map_err(malformed("replicate"))?;
            let record = shard_wire::record_from_wire(shard, record).map_err(malformed("replicate"))?;
            Request::Replicate(Replicate { shard, epoch: replicate.epoch, record })
        }
        RequestBody::Query(query) => Request::Query(TxnQuery {
            shard: query.shard,
            epoch: query.epoch,
            txn: shard_wire::txn_from_wire(query.txn).map_err(malformed("query"))?,
        }),
        RequestBody::Lease(lease) => Request::Lease(LeaseRequest {
            shard: lease.shard,
            epoch: lease.epoch,
            until: shard_wire::ts_from_wire(lease.until),
            watermark: shard_wire::ts_from_wire(lease.watermark),
            settled: shard_wire::ts_from_wire(lease.settled),
        }),
        RequestBody::Fetch(fetch) => Request::Fetch(Fetch { shard: fetch.shard, epoch: fetch.epoch }),
        RequestBody::Resync(resync) => Request::Resync(Resync { shard: resync.shard, epoch: resync.epoch }),
        // A client that reports no freshness is fresh up to its watermark.
        RequestBody::Watermark(watermark) => Request::Watermark(Watermark {
            client: watermark.client,
            ts: shard_wire::ts_from_wire(watermark.ts),
            freshness: shard_wire::ts_from_wire(watermark.freshness.or(watermark.ts)),
        }),
        RequestBody::Invalidate(invalidate) => Request::Invalidate(Invalidate {
            key: Bytes::from(invalidate.key),
            version: shard_wire::ts_from_wire(invalidate.version),
        }),
        RequestBody::Validate(validate) => Request::Validate(validate_from_wire(validate)?),
        RequestBody::Release(release) => Request::Release(Release {
            txn: shard_wire::txn_from_wire(release.txn).map_err(malformed("release"))?,
            commit: release.commit,
        }),
        RequestBody::ValidatorLease(lease) => Request::ValidatorLease(ValidatorLease {
            validator: lease.validator,
            shard: lease.shard,
            epoch: lease.epoch,
            until_ns: lease.until_ns,
        }),
    })
}

fn response_to_wire(response: Response) -> crate::proto::Response {
    let body = match response {
        Response::Ack => ResponseBody::Ack(crate::proto::Ack {}),
        Response::Proposed(Proposed { index, version, refusal }) => {
            ResponseBody::Proposed(proto::Proposed { index, version, refusal: refusal.unwrap_or_default() })
        }
        Response::NotLeader(leader) => ResponseBody::NotLeader(proto::NotLeader { leader: leader.unwrap_or_default() }),
        Response::Map(MapReply { map, applied }) => {
            ResponseBody::Map(proto::MapReply { map: map.as_ref().map(config_wire::map_to_proto), applied })
        }
        Response::Value(value) => ResponseBody::Value(read_to_wire(value)),
        Response::Values(values) => {
            ResponseBody::Values(proto::GetManyReply { values: values.into_iter().map(read_to_wire).collect() })
        }
        Response::Rows(ScanReply { rows, prepared_below }) => ResponseBody::Rows(proto::ScanReply {
            rows: rows
                .into_iter()
                .map(|row| proto::Row {
                    key: row.key.to_vec(),
                    value: row.value.to_vec(),
                    version: Some(shard_wire::ts_to_wire(row.version)),
                    writer: Some(shard_wire::txn_to_wire(row.writer)),
                })
                .collect(),
            prepared_below,
        }),
        Response::Vote(Vote { commit, reason, floor, stale }) => ResponseBody::Vote(proto::Vote {
            commit,
            reason,
            floor: floor.map(shard_wire::ts_to_wire),
            stale: stale.iter().map(|key| key.to_vec()).collect(),
        }),
        Response::WrongEpoch(epoch) => ResponseBody::WrongEpoch(crate::proto::WrongEpoch { epoch }),
        Response::State(phase) => ResponseBody::State(crate::proto::TxnState { phase: phase as i32 }),
        Response::Grant(until) => ResponseBody::Grant(proto::LeaseGrant { until: Some(shard_wire::ts_to_wire(until)) }),
        Response::Table(FetchTable { records, lease }) => ResponseBody::Table(proto::FetchReply {
            records: records.iter().map(shard_wire::record_to_wire).collect(),
            lease: Some(shard_wire::ts_to_wire(lease)),
        }),
        Response::TooOld(TooOld { watermark, window_ms }) => {
            ResponseBody::TooOld(proto::TooOld { watermark: Some(shard_wire::ts_to_wire(watermark)), window_ms })
        }
        Response::ValidatorGrant(ValidatorGrant { until_ns, takeover_high }) => {
            ResponseBody::ValidatorGrant(proto::ValidatorGrant {
                until_ns,
                takeover_high: Some(shard_wire::ts_to_wire(takeover_high)),
            })
        }
        Response::Refused(Refusal { kind, detail }) => {
            ResponseBody::Refused(proto::Refusal { kind: refusal_kind_to_wire(kind) as i32, detail })
        }
    };
    crate::proto::Response { body: Some(body) }
}

fn response_from_wire(response: crate::proto::Response) -> Result<Response, DkvWireError> {
    let Some(body) = response.body else {
        return Err(ProtobufError::Empty { message: "dkv response" }.into());
    };
    Ok(match body {
        ResponseBody::Ack(crate::proto::Ack {}) => Response::Ack,
        // A refusal is never empty, so empty text is an applied proposal.
        ResponseBody::Proposed(proposed) => Response::Proposed(Proposed {
            index: proposed.index,
            version: proposed.version,
            refusal: (!proposed.refusal.is_empty()).then_some(proposed.refusal),
        }),
        ResponseBody::NotLeader(not_leader) => {
            Response::NotLeader((!not_leader.leader.is_empty()).then_some(not_leader.leader))
        }
        ResponseBody::Map(reply) => Response::Map(MapReply {
            map: reply
                .map
                .map(config_wire::map_from_proto)
                .transpose()
                .map_err(|source| DkvWireError::Config { kind: "map", source })?,
            applied: reply.applied,
        }),
        ResponseBody::Value(value) => Response::Value(read_from_wire(value)),
        ResponseBody::Values(values) => Response::Values(values.values.into_iter().map(read_from_wire).collect()),
        ResponseBody::Rows(rows) => Response::Rows(ScanReply {
            rows: rows
                .rows
                .into_iter()
                .map(|row| Row {
                    key: Bytes::from(row.key),
                    value: Bytes::from(row.value),
                    version: shard_wire::ts_from_wire(row.version),
                    writer: writer_from_wire(row.writer),
                })
                .collect(),
            prepared_below: rows.prepared_below,
        }),
        ResponseBody::Vote(vote) => Response::Vote(Vote {
            commit: vote.commit,
            reason: vote.reason,
            floor: vote.floor.map(|floor| shard_wire::ts_from_wire(Some(floor))),
            stale: vote.stale.into_iter().map(Bytes::from).collect(),
        }),
        ResponseBody::WrongEpoch(wrong) => Response::WrongEpoch(wrong.epoch),
        // A phase this build does not know is refused: never read as a vote either way.
        ResponseBody::State(state) => Response::State(
            TxnPhase::try_from(state.phase)
                .map_err(|_| DkvWireError::UnknownEnumValue { field: "TxnState.phase", value: state.phase })?,
        ),
        ResponseBody::Grant(grant) => Response::Grant(shard_wire::ts_from_wire(grant.until)),
        ResponseBody::Table(table) => Response::Table(FetchTable {
            records: table
                .records
                .into_iter()
                .map(shard_wire::table_record_from_wire)
                .collect::<Result<_, _>>()
                .map_err(malformed("table"))?,
            lease: shard_wire::ts_from_wire(table.lease),
        }),
        ResponseBody::TooOld(too_old) => Response::TooOld(TooOld {
            watermark: shard_wire::ts_from_wire(too_old.watermark),
            window_ms: too_old.window_ms,
        }),
        ResponseBody::ValidatorGrant(grant) => Response::ValidatorGrant(ValidatorGrant {
            until_ns: grant.until_ns,
            takeover_high: shard_wire::ts_from_wire(grant.takeover_high),
        }),
        // A kind this build does not know is refused, never read as another.
        ResponseBody::Refused(refusal) => Response::Refused(Refusal {
            kind: proto::RefusalKind::try_from(refusal.kind)
                .ok()
                .and_then(refusal_kind_from_wire)
                .ok_or(DkvWireError::UnknownEnumValue { field: "Refusal.kind", value: refusal.kind })?,
            detail: refusal.detail,
        }),
    })
}

fn refusal_kind_to_wire(kind: RefusalKind) -> proto::RefusalKind {
    match kind {
        RefusalKind::Invalid => proto::RefusalKind::Invalid,
        RefusalKind::WrongRole => proto::RefusalKind::WrongRole,
        RefusalKind::NotServing => proto::RefusalKind::NotServing,
        RefusalKind::Unavailable => proto::RefusalKind::Unavailable,
        RefusalKind::UnknownTxn => proto::RefusalKind::UnknownTxn,
        RefusalKind::Transport => proto::RefusalKind::Transport,
    }
}

/// `Unspecified` is no kind: a peer that sends it is refused.
fn refusal_kind_from_wire(kind: proto::RefusalKind) -> Option<RefusalKind> {
    Some(match kind {
        proto::RefusalKind::Unspecified => return None,
        proto::RefusalKind::Invalid => RefusalKind::Invalid,
        proto::RefusalKind::WrongRole => RefusalKind::WrongRole,
        proto::RefusalKind::NotServing => RefusalKind::NotServing,
        proto::RefusalKind::Unavailable => RefusalKind::Unavailable,
        proto::RefusalKind::UnknownTxn => RefusalKind::UnknownTxn,
        proto::RefusalKind::Transport => RefusalKind::Transport,
    })
}

fn read_to_wire(read: ReadReply) -> proto::GetReply {
    proto::GetReply {
        found: read.value.is_some(),
        value: read.value.map(|value| value.to_vec()).unwrap_or_default(),
        version: Some(shard_wire::ts_to_wire(read.version)),
        writer: Some(shard_wire::txn_to_wire(read.writer)),
        prepared_below: read.prepared_below,
        lease_end_ns: read.lease_end_ns,
    }
}

fn read_from_wire(read: proto::GetReply) -> ReadReply {
    ReadReply {
        value: read.found.then(|| Bytes::from(read.value)),
        version: shard_wire::ts_from_wire(read.version),
        writer: writer_from_wire(read.writer),
        prepared_below: read.prepared_below,
        lease_end_ns: read.lease_end_ns,
    }
}

/// A version's writer; none (a key that never had a version) is transaction 0.
fn writer_from_wire(writer: Option<proto::TxnId>) -> virga_storage::TxnId {
    shard_wire::txn_from_wire(writer).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;
    use proptest::prelude::*;

    fn state(phase: i32) -> Vec<u8> {
        let body = ResponseBody::State(proto::TxnState { phase });
        prost::Message::encode_to_vec(&proto::Response { body: Some(body) })
    }

    #[test]
    fn an_unknown_termination_phase_is_refused_and_never_read_as_a_vote() {
        assert_eq!(
            Dkv::decode_response(&state(9)),
            Err(DkvWireError::UnknownEnumValue { field: "TxnState.phase", value: 9 })
        );
        for phase in [TxnPhase::NeverPrepared, TxnPhase::Prepared, TxnPhase::VotedAbort, TxnPhase::Committed] {
            assert_eq!(Dkv::decode_response(&state(phase as i32)), Ok(Response::State(phase)));
        }
    }

    #[test]
    fn a_malformed_proposal_or_map_is_refused_naming_what_is_wrong() {
        let proposal = proto::ConfigProposal { client: "client-1".into(), seq: 0, command: None };
        let bytes = prost::Message::encode_to_vec(&proto::Request { body: Some(RequestBody::Propose(proposal)) });
        let error = Dkv::decode_request(&bytes).expect_err("sequence number 0 is refused");
        assert!(matches!(error, DkvWireError::Config { kind: "propose", .. }), "{error}");
        let map = proto::ShardMap { version: 1, f: 1, partitioning: None, groups: Vec::new() };
        let reply = proto::MapReply { map: Some(map), applied: 3 };
        let bytes = prost::Message::encode_to_vec(&proto::Response { body: Some(ResponseBody::Map(reply)) });
        let error = Dkv::decode_response(&bytes).expect_err("a map with no partitioning is refused");
        assert!(error.to_string().starts_with("map: "), "{error}");
    }

    #[test]
    fn an_empty_or_unparsable_message_is_refused_with_its_reason() {
        let empty = prost::Message::encode_to_vec(&proto::Request { body: None });
        assert_eq!(Dkv::decode_request(&empty), Err(ProtobufError::Empty { message: "dkv request" }.into()));
        assert!(matches!(
            Dkv::decode_response(&[0xff, 0xff]),
            Err(DkvWireError::Protobuf(ProtobufError::Undecodable { message: "dkv response", .. }))
        ));
    }

    fn ts() -> impl Strategy<Value = virga_storage::Timestamp> {
        (any::<u64>(), any::<u32>()).prop_map(|(time, client)| virga_storage::Timestamp::new(time, client))
    }

    fn refusal_kind() -> impl Strategy<Value = RefusalKind> {
        prop::sample::select(vec![
            RefusalKind::Invalid,
            RefusalKind::WrongRole,
            RefusalKind::NotServing,
            RefusalKind::Unavailable,
            RefusalKind::UnknownTxn,
            RefusalKind::Transport,
        ])
    }

    #[test]
    fn a_refusal_of_no_kind_this_build_knows_is_refused() {
        for kind in [0, 7, -1] {
            let refusal = proto::Refusal { kind, detail: "why".into() };
            let bytes = prost::Message::encode_to_vec(&proto::Response { body: Some(ResponseBody::Refused(refusal)) });
            assert_eq!(
                Dkv::decode_response(&bytes),
                Err(DkvWireError::UnknownEnumValue { field: "Refusal.kind", value: kind })
            );
        }
    }

    fn read() -> impl Strategy<Value = ReadReply> {
        (prop::option::of(prop::collection::vec(any::<u8>(), 0..8)), ts(), any::<u64>(), any::<bool>(), any::<u64>())
            .prop_map(|(value, version, writer, prepared_below, lease_end_ns)| ReadReply {
                value: value.map(Bytes::from),
                version,
                // Transaction ids have a sequence number from 1; none is 0.
                writer: if writer & 0xffff_ffff == 0 { 0 } else { writer },
                prepared_below,
                lease_end_ns,
            })
    }

    fn request() -> impl Strategy<Value = Request> {
        let get = (any::<u32>(), any::<u64>(), prop::collection::vec(any::<u8>(), 1..40), ts(), any::<u64>()).prop_map(
            |(shard, epoch, key, ts, read_interval_ns)| {
                Request::Get(Get { shard, epoch, key: Bytes::from(key), ts, read_interval_ns })
            },
        );
        let scan = (
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..8),
            prop::option::of(prop::collection::vec(any::<u8>(), 1..8)),
            ts(),
            any::<u32>(),
        )
            .prop_map(|(shard, start, end, ts, limit)| {
                let range = crate::messages::ScanRange { start: Bytes::from(start), end: end.map(Bytes::from), ts };
                Request::Scan(Scan { shard, epoch: 3, range, limit })
            });
        let decide = (any::<u32>(), any::<u64>(), any::<u32>(), 1..u32::MAX, any::<bool>()).prop_map(
            |(shard, epoch, client, seq, commit)| {
                let txn = crate::shard::replica::txn_id(client, seq);
                Request::Decide(Decide { shard, epoch, txn, commit })
            },
        );
        let watermark = (any::<u32>(), ts(), ts())
            .prop_map(|(client, ts, freshness)| Request::Watermark(Watermark { client, ts, freshness }));
        let lease =
            (any::<u32>(), any::<u64>(), ts(), ts(), ts()).prop_map(|(shard, epoch, until, watermark, settled)| {
                Request::Lease(LeaseRequest { shard, epoch, until, watermark, settled })
            });
        let fetch = (any::<u32>(), any::<u64>()).prop_map(|(shard, epoch)| Request::Fetch(Fetch { shard, epoch }));
        let resync = (any::<u32>(), any::<u64>()).prop_map(|(shard, epoch)| Request::Resync(Resync { shard, epoch }));
        let store = prop_oneof![get, scan, decide, watermark, lease, fetch, resync, Just(Request::GetMap)];
        prop_oneof![store, kairos_or_config_request()]
    }

    fn txn() -> impl Strategy<Value = virga_storage::TxnId> {
        (any::<u32>(), 1..u32::MAX).prop_map(|(client, seq)| crate::shard::replica::txn_id(client, seq))
    }

    /// KAIROS's validator traffic and the configuration service's proposals.
    fn kairos_or_config_request() -> impl Strategy<Value = Request> {
        let key = || prop::collection::vec(any::<u8>(), 1..16).prop_map(Bytes::from);
        let invalidate = (key(), ts()).prop_map(|(key, version)| Request::Invalidate(Invalidate { key, version }));
        let release = (txn(), any::<bool>()).prop_map(|(txn, commit)| Request::Release(Release { txn, commit }));
        let validator_lease = (0..crate::shard::wire::MAX_VALIDATORS, any::<u32>(), any::<u64>(), any::<u64>())
            .prop_map(|(validator, shard, epoch, until_ns)| {
                Request::ValidatorLease(ValidatorLease { validator, shard, epoch, until_ns })
            });
        let read = (key(), ts(), any::<bool>()).prop_map(|(key, version, cached)| crate::shard::ReadOp {
            key,
            version,
            cached,
        });
        let validate = (txn(), 1..u64::MAX, ts(), prop::collection::vec(read, 0..3), prop::option::of(key())).prop_map(
            |(txn, commit, freshness, reads, write)| {
                let writes: Vec<Bytes> = write.into_iter().collect();
                let participants = if writes.is_empty() { Vec::new() } else { vec![0, 2] };
                let commit_ts = virga_storage::Timestamp::new(commit, 1);
                Request::Validate(crate::messages::ValidateRequest {
                    txn,
                    commit_ts,
                    freshness,
                    reads,
                    writes,
                    participants,
                })
            },
        );
        let propose = (1..u64::MAX, 0..64u32, any::<u64>()).prop_map(|(seq, shard, epoch)| {
            let command = crate::config::ConfigCommand::Failover {
                shard: crate::layout::ShardId(shard),
                epoch,
                new_primary: "data-1".to_string(),
            };
            Request::Propose(crate::messages::Proposal { client: "client-7".to_string(), seq, command })
        });
        prop_oneof![invalidate, release, validator_lease, validate, propose]
    }

    fn kairos_or_config_response() -> impl Strategy<Value = Response> {
        let nodes: Vec<String> = (0..3).map(|index| format!("data-{index}")).collect();
        let placed = crate::layout::ShardMap::place(&nodes, crate::layout::Partitioning::Hash { shards: 2 }, 1)
            .expect("a valid layout");
        prop_oneof![
            (any::<u64>(), ts()).prop_map(|(until_ns, takeover_high)| Response::ValidatorGrant(ValidatorGrant {
                until_ns,
                takeover_high
            })),
            (any::<u64>(), any::<u64>(), prop::option::of("[a-z ]{1,16}"))
                .prop_map(|(index, version, refusal)| Response::Proposed(Proposed { index, version, refusal })),
            prop::option::of("data-[0-9]").prop_map(Response::NotLeader),
            (any::<bool>(), any::<u64>()).prop_map(move |(installed, applied)| {
                Response::Map(MapReply { map: installed.then(|| placed.clone()), applied })
            }),
        ]
    }

    fn response() -> impl Strategy<Value = Response> {
        let phase = prop_oneof![
            Just(TxnPhase::NeverPrepared),
            Just(TxnPhase::Prepared),
            Just(TxnPhase::VotedAbort),
            Just(TxnPhase::Committed),
            Just(TxnPhase::Aborted),
        ];
        let store = prop_oneof![
            Just(Response::Ack),
            ts().prop_map(Response::Grant),
            ts().prop_map(|lease| Response::Table(FetchTable { records: Vec::new(), lease })),
            read().prop_map(Response::Value),
            prop::collection::vec(read(), 0..3).prop_map(Response::Values),
            phase.prop_map(Response::State),
            any::<u64>().prop_map(Response::WrongEpoch),
            (refusal_kind(), "[a-z ]{0,16}").prop_map(|(kind, detail)| Response::refused(kind, detail)),
            (
                any::<bool>(),
                "[a-z-]{0,12}",
                prop::option::of(ts()),
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..4), 0..3)
            )
                .prop_map(|(commit, reason, floor, stale)| Response::Vote(Vote {
                    commit,
                    reason,
                    floor,
                    stale: stale.into_iter().map(Bytes::from).collect(),
                })),
        ];
        prop_oneof![store, kairos_or_config_response()]
    }

    proptest! {
        /// What the gRPC transport sends is what the callee's core receives, and the byte
        /// count reported is the encoding's length.
        #[test]
        fn a_request_crosses_the_codec_unchanged(request in request()) {
            let bytes = Dkv::encode_request(request.clone());
            prop_assert_eq!(bytes.len(), Dkv::request_bytes(&request));
            prop_assert_eq!(Dkv::decode_request(&bytes), Ok(request));
        }

        #[test]
        fn a_response_crosses_the_codec_unchanged(response in response()) {
            let bytes = Dkv::encode_response(response.clone());
            prop_assert_eq!(bytes.len(), Dkv::response_bytes(&response));
            prop_assert_eq!(Dkv::decode_response(&bytes), Ok(response));
        }

        #[test]
        fn any_bytes_decode_to_a_message_or_a_named_refusal(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            for error in [Dkv::decode_request(&bytes).err(), Dkv::decode_response(&bytes).err()].into_iter().flatten() {
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }
}
