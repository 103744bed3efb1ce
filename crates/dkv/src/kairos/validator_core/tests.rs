//! The validator role's own rules, step by step: votes, holds and releases, the lease on
//! its clock and the floor of a restart, garbage collection from the clients' freshness,
//! termination through the primaries, and malformed requests.

use std::convert::Infallible;

use virga_net::role::{Command, Event};

use super::*;
use crate::kairos::validate_from_wire;
use crate::layout::{Partitioning, ShardMap};
use crate::proto;
use crate::shard::wire as shard_wire;
use virga_net::WireProtocol;

const MS: u64 = 1_000_000;
/// The validator's clock at the start of every test (timestamps are clock readings).
const T0: u64 = 1_000_000 * MS;

fn map() -> ShardMap {
    let nodes: Vec<String> = (0..3).map(|index| format!("data-{index}")).collect();
    ShardMap::place(&nodes, Partitioning::Hash { shards: 3 }, 1).unwrap()
}

fn validator(fresh: bool) -> ValidatorCore {
    validator_parking(fresh, Duration::ZERO)
}

/// A validator whose blocked read-only validations wait up to `park_for`.
fn validator_parking(fresh: bool, park_for: Duration) -> ValidatorCore {
    let mut config = ValidatorConfig::new(0, map());
    config.fresh = fresh;
    config.park_for = park_for;
    let mut core = ValidatorCore::new(config);
    let mut out = Vec::new();
    core.step(T0, Event::Start, &mut out);
    // Every shard's primary grants a lease longer than any test: the validator's own lease
    // on its clock is the bound these tests look at.
    for (call, _) in renewals(out) {
        grant(&mut core, T0, call, u64::MAX / 2, 0);
    }
    core
}

/// The validator lease renewals among `out`: (call, shard).
fn renewals(out: Vec<Command<Dkv, Infallible>>) -> Vec<(CallId, u32)> {
    out.into_iter()
        .filter_map(|command| match command {
            Command::Call { call, request: Request::ValidatorLease(lease), .. } => Some((call, lease.shard)),
            _ => None,
        })
        .collect()
}

/// A primary's grant up to `until_ns`, reporting writes validated in the validator's place
/// up to `takeover_high`.
fn grant(core: &mut ValidatorCore, now: u64, call: CallId, until_ns: u64, takeover_high: u64) {
    let takeover_high = if takeover_high > 0 { ts(takeover_high) } else { Timestamp::ZERO };
    let grant = ValidatorGrant { until_ns, takeover_high };
    let response = Response::ValidatorGrant(grant);
    core.step(now, Event::Response { call, result: Ok(response) }, &mut Vec::new());
}

fn ts(time: u64) -> Timestamp {
    Timestamp::new(time, 1)
}

fn read(key: &str, version: u64, cached: bool) -> proto::Read {
    proto::Read { key: key.as_bytes().to_vec(), version: Some(shard_wire::ts_to_wire(ts(version))), cached }
}

/// A validation as a peer would send it.
fn wire_validate(txn: u32, commit: u64, freshness: u64, reads: Vec<proto::Read>, writes: &[&str]) -> proto::Validate {
    proto::Validate {
        txn: Some(proto::TxnId { client: 1, seq: txn }),
        commit_ts: Some(shard_wire::ts_to_wire(ts(commit))),
        freshness: Some(shard_wire::ts_to_wire(ts(freshness))),
        reads,
        writes: writes.iter().map(|key| key.as_bytes().to_vec()).collect(),
        participants: if writes.is_empty() { Vec::new() } else { vec![0, 1] },
    }
}

/// A well-formed validation, as the codec hands it to the validator.
fn validate(txn: u32, commit: u64, freshness: u64, reads: Vec<proto::Read>, writes: &[&str]) -> Request {
    Request::Validate(validate_from_wire(wire_validate(txn, commit, freshness, reads, writes)).expect("well-formed"))
}

fn txn_id(seq: u32) -> TxnId {
    shard_wire::txn_from_wire(Some(proto::TxnId { client: 1, seq })).expect("a transaction id")
}

fn release(txn: u32, commit: bool) -> Request {
    Request::Release(Release { txn: txn_id(txn), commit })
}

/// The answer of the validator to `request` at `now`.
fn ask(core: &mut ValidatorCore, now: u64, request: Request) -> Response {
    let mut out: Vec<Command<Dkv, Infallible>> = Vec::new();
    core.step(now, Event::Request { from: "client-1".into(), call: CallId(7), request }, &mut out);
    match out.as_slice() {
        [Command::Reply { response: body, .. }] => body.clone(),
        other => panic!("expected one reply, got {other:?}"),
    }
}

/// The vote: Ok, or the abort reason.
fn vote(core: &mut ValidatorCore, now: u64, request: Request) -> Result<(), String> {
    match ask(core, now, request) {
        Response::Vote(vote) if vote.commit => Ok(()),
        Response::Vote(vote) => Err(vote.reason),
        other => panic!("not a vote: {other:?}"),
    }
}

#[test]
fn a_held_write_blocks_readers_until_released_and_its_commit_makes_older_reads_stale() {
    let mut core = validator(true);
    let now = T0 + MS;
    assert_eq!(vote(&mut core, now, validate(1, T0, T0, vec![], &["k"])), Ok(()));
    assert_eq!(core.held(), 1);
    // A reader of the held key aborts, whatever it read.
    let reader = || validate(2, T0 + 5, T0 + 5, vec![read("k", 0, true)], &[]);
    assert_eq!(vote(&mut core, now, reader()), Err("read-prepared".into()));
    assert!(matches!(ask(&mut core, now, release(1, true)), Response::Ack));
    assert_eq!(core.held(), 0);
    // Committed at T0: a cached copy of the version before it is stale, and the vote says
    // which key, so the client drops that copy.
    match ask(&mut core, now, reader()) {
        Response::Vote(vote) => {
            assert_eq!((vote.reason.as_str(), vote.stale), ("read-stale", vec![bytes::Bytes::from_static(b"k")]))
        }
        other => panic!("not a vote: {other:?}"),
    }
    assert_eq!(vote(&mut core, now, validate(3, T0 + 5, T0 + 5, vec![read("k", T0, true)], &[])), Ok(()));
    // That read raised the key's latest read: a writer below it aborts.
    assert_eq!(vote(&mut core, now, validate(4, T0 + 4, T0 + 4, vec![], &["k"])), Err("write-after-read".into()));
}

#[test]
fn a_validation_after_its_own_release_is_refused_rather_than_held_for_good() {
    let mut core = validator(true);
    let now = T0 + MS;
    assert!(matches!(ask(&mut core, now, release(9, false)), Response::Ack));
    assert_eq!(vote(&mut core, now, validate(9, T0, T0, vec![], &["k"])), Err(ALREADY_RELEASED.into()));
    assert_eq!(core.held(), 0);
}

#[test]
fn commit_votes_stay_below_the_lease_and_a_restart_starts_above_it() {
    let lease = ValidatorConfig::new(0, map()).lease.as_nanos() as u64;
    let mut core = validator(true);
    assert_eq!(vote(&mut core, T0, validate(1, T0 + lease, T0, vec![], &["k"])), Err(BEYOND_LEASE.into()));
    assert_eq!(vote(&mut core, T0, validate(2, T0 + lease - 1, T0, vec![read("j", 0, true)], &[])), Ok(()));
    // Restarted at T0 (its clock at least where it was): everything the old incarnation could
    // have let through lies at or below the new floor.
    let mut restarted = validator(false);
    let floor = T0 + lease;
    // A write at or below the floor might pass under a forgotten read.
    assert_eq!(vote(&mut restarted, T0, validate(3, floor - 1, floor, vec![], &["k"])), Err("write-after-read".into()));
    // A read known fresh only below the floor might have missed a forgotten write.
    let stale_risk = validate(4, floor - 1, floor - 1, vec![read("k", 0, true)], &[]);
    assert_eq!(vote(&mut restarted, T0, stale_risk), Err("below-gc".into()));
    // Later, above the floor, it judges as before.
    let later = T0 + 2 * lease;
    assert_eq!(vote(&mut restarted, later, validate(5, floor + 1, floor + 1, vec![], &["k"])), Ok(()));
}

#[test]
fn the_floor_follows_the_oldest_freshness_the_clients_report() {
    let mut core = validator(true);
    let watermark = |client: u32, freshness: u64| {
        let watermark = crate::messages::Watermark { client, ts: ts(freshness + 100), freshness: ts(freshness) };
        Request::Watermark(watermark)
    };
    let now = T0 + MS;
    assert_eq!(vote(&mut core, now, validate(1, T0, T0, vec![read("a", 0, false)], &[])), Ok(()));
    ask(&mut core, now, watermark(1, T0 + 50));
    ask(&mut core, now, watermark(2, T0 + 20));
    let mut out = Vec::new();
    let tick = core.tick.expect("armed at start");
    core.step(now, Event::Timer(tick), &mut out);
    assert_eq!(core.stats().floor, ts(T0 + 20), "the minimum over clients, not the newest");
    assert_eq!(core.stats().keys, 0, "the read at T0 lies below the floor: its state is gone");
    assert_eq!(
        vote(&mut core, now, validate(2, T0 + 30, T0 + 19, vec![read("a", 0, true)], &[])),
        Err("below-gc".into())
    );
    // A client silent past the expiry no longer holds the floor back.
    let later = now + core.config().report_expiry.as_nanos() as u64;
    ask(&mut core, later, watermark(1, T0 + 60));
    let tick = core.tick.expect("armed again");
    core.step(later, Event::Timer(tick), &mut out);
    assert_eq!(core.stats().floor, ts(T0 + 60));
}

/// Steps the validator's tick at `now` and returns the termination queries it sent: (call,
/// primary, shard).
fn tick_queries(core: &mut ValidatorCore, now: u64) -> Vec<(CallId, String, u32)> {
    let mut out = Vec::new();
    let tick = core.tick.expect("armed");
    core.step(now, Event::Timer(tick), &mut out);
    out.into_iter()
        .filter_map(|command| match command {
            Command::Call { to, call, request: Request::Query(query), .. } => Some((call, to, query.shard)),
            _ => None,
        })
        .collect()
}

fn answer(core: &mut ValidatorCore, call: CallId, phase: TxnPhase) {
    let response = Response::State(phase);
    core.step(T0, Event::Response { call, result: Ok(response) }, &mut Vec::new());
}

#[test]
fn a_held_write_with_no_release_is_decided_by_what_its_primaries_know() {
    let after = ValidatorConfig::new(0, map()).termination_after.as_nanos() as u64;
    for (phases, commit) in [
        ([TxnPhase::Prepared, TxnPhase::Prepared], true),
        ([TxnPhase::Prepared, TxnPhase::NeverPrepared], false),
        ([TxnPhase::Committed, TxnPhase::Prepared], true),
    ] {
        let mut core = validator(true);
        assert_eq!(vote(&mut core, T0, validate(1, T0, T0, vec![], &["k"])), Ok(()));
        assert!(tick_queries(&mut core, T0 + after / 2).is_empty(), "not overdue yet");
        let queries = tick_queries(&mut core, T0 + after);
        let shards: Vec<u32> = queries.iter().map(|(_, _, shard)| *shard).collect();
        assert_eq!(shards, vec![0, 1], "one query per participant");
        for (primary, shard) in queries.iter().map(|(_, to, shard)| (to, shard)) {
            assert_eq!(Some(primary), map().group(ShardId(*shard)).map(|group| &group.primary));
        }
        answer(&mut core, queries[0].0, phases[0]);
        answer(&mut core, queries[1].0, phases[1]);
        assert_eq!((core.held(), core.stats().terminated_commit), (0, u64::from(commit)), "{phases:?}");
        // Committed: a copy older than the write is stale; aborted: the old version stands.
        let reader = validate(2, T0 + 5, T0 + 5, vec![read("k", 0, true)], &[]);
        assert_eq!(vote(&mut core, T0 + 1, reader).is_ok(), !commit, "{phases:?}");
    }
}

#[test]
fn malformed_requests_are_refused_at_the_codec_and_others_by_the_validator() {
    use proto::request::Body;
    let mut zero = wire_validate(1, 0, 0, vec![], &["k"]);
    zero.commit_ts = None;
    let twice = wire_validate(2, T0, T0, vec![], &["k", "k"]);
    let mut orphan = wire_validate(3, T0, T0, vec![], &["k"]);
    orphan.participants.clear();
    let empty_key = wire_validate(4, T0, T0, vec![read("", 0, false)], &[]);
    let release_zero = proto::Release { txn: Some(proto::TxnId { client: 1, seq: 0 }), commit: true };
    for (body, expected) in [
        (Body::Validate(zero), "commit timestamp is zero"),
        (Body::Validate(twice), "listed twice"),
        (Body::Validate(orphan), "names no participant"),
        (Body::Validate(empty_key), "key is empty"),
        (Body::Release(release_zero), "sequence number 0"),
    ] {
        let bytes = prost::Message::encode_to_vec(&proto::Request { body: Some(body) });
        match Dkv::decode_request(&bytes) {
            Err(error) => assert!(error.to_string().contains(expected), "{error} lacks {expected:?}"),
            Ok(request) => panic!("expected a refusal with {expected:?}, got {request:?}"),
        }
    }
    let mut core = validator(true);
    match ask(&mut core, T0, Request::GetMap) {
        Response::Refused(error) => {
            assert_eq!(error.kind, crate::messages::RefusalKind::WrongRole);
            assert!(error.detail.contains("serves only"), "{error}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!((core.held(), core.stats().commit_votes), (0, 0));
}

/// Every reply the step produced: (call, vote or other answer).
fn replies(out: Vec<Command<Dkv, Infallible>>) -> Vec<(CallId, Response)> {
    out.into_iter()
        .filter_map(|command| match command {
            Command::Reply { call, response: body, .. } => Some((call, body)),
            _ => None,
        })
        .collect()
}

fn is_commit(body: &Response) -> bool {
    matches!(body, Response::Vote(vote) if vote.commit)
}

#[test]
fn a_read_only_validation_behind_a_held_writer_waits_for_its_release_or_its_time() {
    let park_for = Duration::from_millis(50);
    let mut core = validator_parking(true, park_for);
    let now = T0 + MS;
    assert_eq!(vote(&mut core, now, validate(1, T0, T0, vec![], &["k"])), Ok(()));
    // A read-only reader of the held key gets no answer yet.
    let mut out = Vec::new();
    let reader = validate(2, T0 + 5, T0 + 5, vec![read("k", 0, true)], &[]);
    core.step(now, Event::Request { from: "client-2".into(), call: CallId(20), request: reader }, &mut out);
    assert!(replies(out).is_empty(), "parked");
    assert_eq!(core.stats().parked, 1);
    // The writer aborts: the version read stands, and the waiting reader commits.
    let mut out = Vec::new();
    core.step(now, Event::Request { from: "client-1".into(), call: CallId(21), request: release(1, false) }, &mut out);
    let answered = replies(out);
    assert_eq!(answered.len(), 2, "{answered:?}");
    assert!(answered.iter().any(|(call, body)| *call == CallId(20) && is_commit(body)), "{answered:?}");
    // Another writer held, a reader parked behind it, and no release: the tick past
    // `park_for` aborts the reader.
    assert_eq!(vote(&mut core, now, validate(3, T0 + 10, T0 + 10, vec![], &["k"])), Ok(()));
    let mut out = Vec::new();
    let reader = validate(4, T0 + 20, T0 + 20, vec![read("k", 0, true)], &[]);
    core.step(now, Event::Request { from: "client-2".into(), call: CallId(22), request: reader }, &mut out);
    assert!(replies(out).is_empty());
    let tick = core.tick.expect("armed");
    let mut out = Vec::new();
    core.step(now + park_for.as_nanos() as u64, Event::Timer(tick), &mut out);
    let answered = replies(out);
    assert!(
        matches!(answered.as_slice(), [(CallId(22), Response::Vote(vote))] if vote.reason == "read-prepared"),
        "{answered:?}"
    );
    // A read-write transaction never waits (it would hold its own writes meanwhile).
    assert_eq!(
        vote(&mut core, now, validate(5, T0 + 30, T0 + 30, vec![read("k", 0, true)], &["j"])),
        Err("read-prepared".into())
    );
}

#[test]
fn commit_votes_need_every_primarys_grant_and_a_takeover_raises_the_floor_first() {
    let mut config = ValidatorConfig::new(0, map());
    config.fresh = true;
    let mut core = ValidatorCore::new(config);
    let mut out = Vec::new();
    core.step(T0, Event::Start, &mut out);
    let asked = renewals(out);
    assert_eq!(asked.iter().map(|(_, shard)| *shard).collect::<Vec<_>>(), vec![0, 1, 2], "one per shard");
    let reader = |txn, commit| validate(txn, commit, commit, vec![read("k", 0, true)], &[]);
    assert_eq!(vote(&mut core, T0, reader(1, T0 + 1)), Err(BEYOND_LEASE.into()), "no grant yet");
    // A read-write transaction's reads are validated by its primaries too: no grant needed.
    assert_eq!(vote(&mut core, T0, validate(2, T0 + 1, T0 + 1, vec![read("j", 0, true)], &["i"])), Ok(()));
    // Only the grant of the shard holding `k` bounds a vouch for a read of `k`.
    let shard_of_k = map().shard_of(b"k").0;
    for (call, shard) in &asked {
        if *shard != shard_of_k {
            grant(&mut core, T0, *call, T0 + 100, 0);
        }
    }
    assert_eq!(vote(&mut core, T0, reader(3, T0 + 1)), Err(BEYOND_LEASE.into()), "k's shard granted nothing");
    let (call_k, _) = asked.iter().find(|(_, shard)| *shard == shard_of_k).copied().unwrap();
    grant(&mut core, T0, call_k, T0 + 80, 0);
    assert_eq!(vote(&mut core, T0, reader(4, T0 + 80)), Err(BEYOND_LEASE.into()), "bounded by the grant");
    assert_eq!(vote(&mut core, T0, reader(5, T0 + 79)), Ok(()));
    // A primary validated writes up to T0 + 90 in this validator's place (after its lease
    // ran out): the floor rises there before anything else is voted.
    let mut out = Vec::new();
    let tick = core.tick.expect("armed");
    core.step(T0 + 50, Event::Timer(tick), &mut out);
    let asked = renewals(out);
    grant(&mut core, T0 + 50, asked[0].0, 0, T0 + 90);
    assert_eq!(core.stats().takeover_floors, 1);
    let stale_risk = validate(6, T0 + 60, T0 + 89, vec![read("j", 0, true)], &[]);
    assert_eq!(vote(&mut core, T0 + 50, stale_risk), Err("below-gc".into()));
}
