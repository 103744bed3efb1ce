//! The `dkv_shard` body checked on honest requests, on many random and edited ones, and
//! against deliberately broken drivers its checks must catch.

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn honest_input(kind: u8) -> Vec<u8> {
    vec![0, 1 + kind * 4, 0]
}

#[test]
fn every_honest_request_is_served_and_configuration_requests_refused() {
    for kind in 0..KINDS {
        let (_, knobs) = honest(kind);
        let mut harness = Harness::new(false);
        let reply = harness.ask(knobs.from, build(kind, &knobs).unwrap());
        let served = match (kind, &reply) {
            (0, Some(Response::Value(value))) => value.value.as_deref() == Some(b"1".as_slice()),
            (1, Some(Response::Rows(rows))) => rows.rows.len() == 3,
            (2, Some(Response::Vote(vote))) => vote.commit,
            (3 | 4 | 8, Some(Response::Ack)) => true,
            (5, Some(Response::State(phase))) => *phase == proto::TxnPhase::Prepared,
            (6, Some(Response::Grant(_))) => true,
            (7, Some(Response::Table(table))) => table.records.len() == 3,
            (9, reply) => reply.as_ref().is_some_and(is_refusal),
            (11, Some(Response::ValidatorGrant(grant))) => grant.until_ns > 0,
            (10, Some(Response::Values(values))) => {
                values.len() == 2 && values[0].value.as_deref() == Some(b"1".as_slice())
            }
            _ => false,
        };
        assert!(served, "honest request kind {kind}: {reply:?}");
        assert_eq!(step_requests(&honest_input(kind)).requests, 1);
    }
}

#[test]
fn a_prepare_voted_commit_then_decided_is_installed() {
    let mut harness = Harness::new(false);
    let (kind, knobs) = honest(2);
    assert!(matches!(harness.ask("client-9", build(kind, &knobs).unwrap()), Some(Response::Vote(v)) if v.commit));
    let (kind, mut knobs) = honest(3);
    knobs.txn = wire_txn(txn_id(3, 1));
    assert!(matches!(harness.ask("client-9", build(kind, &knobs).unwrap()), Some(Response::Ack)));
    let replica = harness.core.replica(0).unwrap();
    assert_eq!(replica.store().get_at(b"b", Timestamp::new(40, 3)), Some(Bytes::from_static(b"v")));
    assert_eq!(replica.store().get_at(b"b", Timestamp::new(39, 0)), Some(Bytes::from_static(b"20")));
}

#[test]
#[should_panic(expected = "no reply to")]
fn a_reply_lost_behind_an_unfinished_write_is_caught() {
    let mut harness = Harness::new(false);
    harness.complete_io = false;
    let (kind, knobs) = honest(3);
    harness.ask(knobs.from, build(kind, &knobs).unwrap());
}

#[test]
#[should_panic(expected = "was refused but changed a replica")]
fn a_refusal_that_changes_a_replica_is_caught() {
    let mut harness = Harness::new(false);
    // A fetch of a newer epoch fences shard 0 (accepted); replayed with the sample
    // node's snapshot as the one before, its state change shows as a refused one's.
    let before = Snapshot::of(&harness.core);
    let (kind, mut knobs) = honest(7);
    knobs.shard = 0;
    knobs.epoch = 2;
    let request = build(kind, &knobs).unwrap();
    assert!(matches!(harness.ask("n1", request.clone()), Some(Response::Table(_))));
    check_unchanged(&before, &harness.core, &Described { from: "n1".to_string(), request });
}

#[test]
fn dkv_shard_survives_random_and_edited_requests() {
    let mut rng = StdRng::seed_from_u64(23);
    let mut total = Tally::default();
    for _ in 0..3000 {
        let mut input = vec![rng.random_range(0..0xe0u8)];
        for _ in 0..rng.random_range(1..5) {
            if rng.random_bool(0.1) {
                let bytes: Vec<u8> = (0..rng.random_range(0..48)).map(|_| rng.random()).collect();
                input.push(rng.random::<u8>() & 0xc0);
                input.extend((bytes.len() as u16).to_le_bytes());
                input.extend(bytes);
            } else {
                let edits = rng.random_range(0..4u8);
                input.extend([rng.random::<u8>() | 1, edits]);
                for _ in 0..edits {
                    input.extend([rng.random::<u8>(), rng.random()]);
                }
            }
            if input[0] & 2 == 2 {
                // Deferred completions: how many of the oldest complete now.
                input.push(rng.random());
            }
        }
        let tally = step_requests(&input);
        total.requests += tally.requests;
        total.refused += tally.refused;
        total.served += tally.served;
        total.commit_votes += tally.commit_votes;
    }
    // Edits keep many requests honest enough to be served: the accepted paths run too.
    assert!(total.served > total.requests / 3, "{total:?}");
    assert!(total.refused > total.requests / 10, "{total:?}");
    assert!(total.commit_votes > 100, "{total:?}");
}

#[test]
fn log_records_round_trip_and_a_bad_one_is_refused_by_its_lsn() {
    for sample in sample_log_records() {
        assert!(wire::decode_log_record(&sample).is_ok());
    }
    // A record with no body, at LSN 3 of the log.
    check_log_record(&[0]);
    let storage = MemStorage::new();
    let bad = {
        let (mut log, _) = RecordLog::open(&storage, LogOptions::default()).unwrap();
        log.append(&sample_log_records()[0]).unwrap();
        let bad = log.append(&[0x08, 0x01]).unwrap();
        log.append(&sample_log_records()[1]).unwrap();
        log.sync().unwrap();
        bad
    };
    match open_data_node(DataConfig::new(ME, sample_map()), &storage) {
        Err(DataOpenError::Record { lsn, error: wire::ShardWireError::Missing("record") }) => assert_eq!(lsn, bad),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut rng = StdRng::seed_from_u64(29);
    for _ in 0..300 {
        let mut input = vec![0xe0, rng.random()];
        input.extend((0..rng.random_range(0..40)).map(|_| rng.random::<u8>()));
        step_requests(&input);
    }
}

#[test]
fn a_get_many_that_is_empty_too_large_or_reaches_into_another_shard_is_refused_whole() {
    let (kind, knobs) = honest(10);
    let mut harness = Harness::new(false);
    let ask = |harness: &mut Harness, keys: Vec<Vec<u8>>| {
        let Request::GetMany(mut get) = build(kind, &knobs).unwrap() else { panic!("kind 10 is a get_many") };
        get.keys = keys.into_iter().map(Bytes::from).collect();
        harness.ask(knobs.from, Request::GetMany(get))
    };
    let reply = ask(&mut harness, vec![]);
    assert!(matches!(&reply, Some(Response::Refused(e)) if e.detail.contains("0 keys")), "{reply:?}");
    let reply = ask(&mut harness, vec![b"a".to_vec(); crate::shard::MAX_KEYS_PER_GET + 1]);
    assert!(matches!(&reply, Some(Response::Refused(e)) if e.detail.contains("1025 keys")), "{reply:?}");
    // `m` is shard 1's (led by n1): the whole request is refused, not the rest answered.
    let reply = ask(&mut harness, vec![b"a".to_vec(), b"m".to_vec()]);
    assert!(matches!(&reply, Some(Response::Refused(e)) if e.detail.contains("not in shard 0")), "{reply:?}");
    let reply = ask(&mut harness, vec![b"a".to_vec(), Vec::new()]);
    assert!(matches!(&reply, Some(Response::Refused(e)) if e.detail.contains("malformed")), "{reply:?}");
    // Read intervals (KAIROS) come one a key or not at all.
    let Request::GetMany(mut get) = build(kind, &knobs).unwrap() else { panic!("kind 10 is a get_many") };
    get.keys = vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")];
    get.read_intervals_ns = vec![1_000];
    let reply = harness.ask(knobs.from, Request::GetMany(get));
    assert!(matches!(&reply, Some(Response::Refused(e)) if e.detail.contains("1 read intervals")), "{reply:?}");
    // The same keys one by one and together read the same.
    let together = ask(&mut harness, vec![b"a".to_vec(), b"b".to_vec(), b"f-absent".to_vec()]);
    let Some(Response::Values(together)) = together else { panic!("{together:?}") };
    for (key, value) in [b"a".as_slice(), b"b", b"f-absent"].into_iter().zip(&together) {
        let (get_kind, mut get_knobs) = honest(0);
        get_knobs.key = key.to_vec();
        let alone = harness.ask(get_knobs.from, build(get_kind, &get_knobs).unwrap());
        assert_eq!(alone, Some(Response::Value(value.clone())), "{key:?}");
    }
}

/// Found by seed 347546 of session 8's soak: a primary whose prepare had not yet reached f
/// backups (it had not voted) answered a terminator's query `Prepared` and counted its own
/// shard as voted; the termination committed the transaction at the other participant,
/// the primary then crashed, and its successor, which never saw the prepare, refused it.
#[test]
fn a_prepare_not_yet_on_f_backups_is_no_vote_for_a_terminator() {
    let mut harness = Harness::new(false);
    let (kind, knobs) = honest(2);
    let knobs = Knobs { participants: vec![0, 1], commit: false, ..knobs };
    let prepare = harness.request(knobs.from, build(kind, &knobs).unwrap());
    // Logged and sent to the backups; no backup has answered.
    let early = harness.request("n1", build(5, &knobs).unwrap());
    let refused = &harness.asked[&early].1;
    assert!(
        matches!(refused.as_slice(), [Some(Response::Refused(e))] if e.detail.contains("ask again")),
        "{refused:?}"
    );
    harness.complete(usize::MAX);
    assert!(matches!(harness.answer(prepare), Some(Response::Vote(vote)) if vote.commit));
    let late = harness.ask("n1", build(5, &knobs).unwrap());
    assert!(matches!(late, Some(Response::State(proto::TxnPhase::Prepared))));
}

/// KAIROS's validation of a read-only transaction: a commit vote holds nothing and logs
/// nothing, but raises the read key's latest read, so a writer below it aborts; a read
/// whose version is no longer the newest aborts with the stale key named.
#[test]
fn a_validation_alone_holds_nothing_but_guards_its_reads() {
    let mut harness = Harness::new(false);
    let (kind, knobs) = honest(2);
    let validation = Knobs { limit: 2, ..knobs.clone() };
    let reply = harness.ask("client-9", build(kind, &validation).unwrap());
    assert!(matches!(&reply, Some(Response::Vote(vote)) if vote.commit), "{reply:?}");
    let txn = wire::txn_from_wire(validation.txn).unwrap();
    assert!(harness.core.replica(0).unwrap().txn(txn).is_none(), "a validation leaves no transaction behind");
    // A writer of `a` at 30 < 40, the validated read's timestamp.
    let writer = Knobs {
        reads: 0,
        key2: b"a".to_vec(),
        ts: Timestamp::new(30, 3),
        txn: wire_txn(txn_id(3, 5)),
        ..knobs.clone()
    };
    let reply = harness.ask("client-9", build(kind, &writer).unwrap());
    assert!(
        matches!(&reply, Some(Response::Vote(vote)) if !vote.commit && vote.reason == "write-after-read"),
        "{reply:?}"
    );
    // A read of `a` at a version that is not its newest.
    let stale = Knobs { limit: 2, ts2: Timestamp::new(5, 0), txn: wire_txn(txn_id(3, 6)), ..knobs };
    let reply = harness.ask("client-9", build(kind, &stale).unwrap());
    let Some(Response::Vote(vote)) = reply else { panic!("{reply:?}") };
    assert!(!vote.commit && vote.reason == "read-stale", "{vote:?}");
    assert_eq!(vote.stale, vec![Bytes::from_static(b"a")]);
}

#[test]
fn a_log_record_of_a_newer_format_is_refused_saying_what_to_do() {
    use prost::Message as _;
    let mut record = crate::proto::ShardLogRecord::decode(sample_log_records()[0].as_slice()).unwrap();
    assert_eq!(record.format, wire::LOG_FORMAT, "records carry the format they were written in");
    record.format = wire::LOG_FORMAT + 1;
    let error = wire::decode_log_record(&record.encode_to_vec()).unwrap_err();
    assert_eq!(error, wire::ShardWireError::NewerLogFormat { format: wire::LOG_FORMAT + 1 });
    assert!(error.to_string().contains("with the build that wrote it"), "{error}");
    // A record of before formats were numbered (no format field) still reads.
    record.format = 0;
    assert!(wire::decode_log_record(&record.encode_to_vec()).is_ok());
}
