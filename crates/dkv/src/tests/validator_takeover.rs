//! A shard primary taking over a KAIROS validator's part of read-write transactions, step by
//! step: validator leases granted and assumed, a takeover under the lease refused with the
//! floor to pass (and the lease revoked), one above it validated, and the highest such commit
//! timestamp reported to the validator's renewals, after a restart of the node too.

use std::time::Duration;

use crate::messages::{RefusalKind, Request, Response, ValidatorGrant, ValidatorLease};
use crate::Dkv;
use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Role};
use virga_storage::Timestamp;

use crate::layout::{Partitioning, ShardMap};
use crate::shard::wire::{self, PrepareRequest};
use crate::shard::{DataConfig, DataCore, DataIo, DataIoDone, ShardRecord, Weakened, WriteOp};

const MS: u64 = 1_000_000;
const T0: u64 = 1_000_000 * MS;

/// One node leading the one shard, without backups.
fn node(weakened: Weakened, records: Vec<(u32, ShardRecord)>) -> DataCore {
    let map = ShardMap::place(&["n0".to_string()], Partitioning::Hash { shards: 1 }, 0).unwrap();
    let mut config = DataConfig::new("n0", map);
    config.weakened = weakened;
    let mut core = DataCore::new(config, records);
    core.step(T0, Event::Start, &mut Vec::new());
    core
}

fn lease_length() -> u64 {
    DataConfig::new("n0", ShardMap::place(&["n0".to_string()], Partitioning::Hash { shards: 1 }, 0).unwrap())
        .validator_lease
        .as_nanos() as u64
}

/// Steps `request` at `now`, completes any log write, and returns the reply.
fn ask(core: &mut DataCore, now: u64, request: Request) -> Response {
    let mut out: Vec<Command<Dkv, DataIo>> = Vec::new();
    core.step(now, Event::Request { from: "client-1".into(), call: CallId(5), request }, &mut out);
    for command in std::mem::take(&mut out) {
        match command {
            Command::Reply { response: body, .. } => return body,
            Command::Io { io, op: DataIo::Append { records, .. } } => {
                let done = DataIoDone::Appended(Ok(records.len() as u64));
                core.step(now, Event::IoDone { io, result: done }, &mut out);
            }
            _ => {}
        }
    }
    match out.into_iter().find_map(|command| match command {
        Command::Reply { response: body, .. } => Some(body),
        _ => None,
    }) {
        Some(body) => body,
        None => panic!("no reply"),
    }
}

fn renew(core: &mut DataCore, now: u64, until_ns: u64) -> ValidatorGrant {
    let lease = ValidatorLease { validator: 0, shard: 0, epoch: 1, until_ns };
    match ask(core, now, Request::ValidatorLease(lease)) {
        Response::ValidatorGrant(grant) => grant,
        other => panic!("not a grant: {other:?}"),
    }
}

/// A read-write transaction writing `k` at `commit` that passed over validator 0.
fn takeover(seq: u32, commit: u64) -> Request {
    let prepare = PrepareRequest {
        shard: 0,
        epoch: 1,
        txn: crate::shard::txn_id(1, seq),
        commit_ts: Timestamp::new(commit, 1),
        reads: Vec::new(),
        writes: vec![WriteOp { key: Bytes::from_static(b"k"), value: Some(Bytes::from_static(b"v")) }],
        participants: vec![0],
        scans: Vec::new(),
        commit_on_vote: true,
        validate_only: false,
        takeover_validators: vec![0],
    };
    Request::Prepare(prepare)
}

fn vote(body: Response) -> crate::messages::Vote {
    match body {
        Response::Vote(vote) => vote,
        other => panic!("not a vote: {other:?}"),
    }
}

#[test]
fn a_takeover_waits_past_the_validators_lease_and_its_renewal_learns_how_high_it_went() {
    let lease = lease_length();
    let mut core = node(Weakened::default(), Vec::new());
    // Just started: it assumes a predecessor granted up to twice the longest lease.
    let refused = vote(ask(&mut core, T0 + MS, takeover(1, T0 + MS)));
    assert_eq!(refused.reason, "below-commit-floor");
    let floor = refused.floor.unwrap_or(Timestamp::ZERO);
    assert_eq!(floor.time, T0 + 2 * lease);
    // The refusal revoked the lease: renewals get nothing, and learn of no takeover yet.
    let grant = renew(&mut core, T0 + 2 * MS, T0 + 2 * MS + lease);
    assert_eq!((grant.until_ns, grant.takeover_high), (0, Timestamp::ZERO));
    // Above the floor, the primary validates in the validator's place.
    let above = floor.time + 1;
    assert!(vote(ask(&mut core, T0 + 3 * MS, takeover(2, above))).commit);
    // Once the revocation is over, the validator is granted again and told how high the
    // writes validated in its place went.
    let later = T0 + 3 * MS + Duration::from_secs(1).as_nanos() as u64;
    let grant = renew(&mut core, later, later + 10 * lease);
    assert_eq!(grant.until_ns, later + lease, "capped at the longest grant");
    assert_eq!(grant.takeover_high, Timestamp::new(above, 1));
    // A takeover now has to pass the lease just granted.
    let refused = vote(ask(&mut core, later, takeover(3, later + lease)));
    assert_eq!(refused.floor.map(|floor| floor.time), Some(later + lease));
    // The highest takeover survives a restart, from the shard's records.
    let records: Vec<(u32, ShardRecord)> =
        core.replica(0).unwrap().records().into_iter().map(|record| (0, record)).collect();
    let mut restarted = node(Weakened::default(), records);
    let grant = renew(&mut restarted, T0 + 10 * lease, T0 + 11 * lease);
    assert_eq!(grant.takeover_high, Timestamp::new(above, 1));
}

#[test]
fn the_weakened_primary_validates_under_the_validators_lease() {
    let weakened = Weakened { skip_validator_lease: true, ..Weakened::default() };
    let mut core = node(weakened, Vec::new());
    let lease = lease_length();
    assert_eq!(renew(&mut core, T0 + MS, T0 + MS + lease).until_ns, T0 + MS + lease);
    // Under the lease the validator holds: a read it vouched for alone may lie above this.
    assert!(vote(ask(&mut core, T0 + 2 * MS, takeover(1, T0 + 2 * MS))).commit);
}

#[test]
fn malformed_takeovers_and_lease_requests_are_refused() {
    let mut core = node(Weakened::default(), Vec::new());
    let Request::Prepare(mut twice) = takeover(1, T0) else { unreachable!() };
    twice.takeover_validators = vec![0, 0];
    let Request::Prepare(mut out_of_range) = takeover(2, T0) else { unreachable!() };
    out_of_range.takeover_validators = vec![wire::MAX_VALIDATORS];
    // A malformed prepare is refused at the codec, before any core sees it.
    for (prepare, expected) in [(twice, "passed over twice"), (out_of_range, "out of range")] {
        let bytes = <Dkv as virga_net::WireProtocol>::encode_request(Request::Prepare(prepare));
        match <Dkv as virga_net::WireProtocol>::decode_request(&bytes) {
            Err(error) => assert!(error.to_string().contains(expected), "{error} lacks {expected:?}"),
            Ok(request) => panic!("expected a refusal with {expected:?}, got {request:?}"),
        }
    }
    let lease = ValidatorLease { validator: wire::MAX_VALIDATORS, shard: 0, epoch: 1, until_ns: T0 };
    let stale = ValidatorLease { validator: 0, shard: 0, epoch: 7, until_ns: T0 };
    match ask(&mut core, T0, Request::ValidatorLease(lease)) {
        Response::Refused(error) => assert!(
            error.kind == RefusalKind::Invalid && error.detail.contains("out of range"),
            "{error} lacks \"out of range\""
        ),
        other => panic!("expected an error with \"out of range\", got {other:?}"),
    }
    assert!(matches!(ask(&mut core, T0, Request::ValidatorLease(stale)), Response::WrongEpoch(_)));
}
