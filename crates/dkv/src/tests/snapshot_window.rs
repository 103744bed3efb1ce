//! The snapshot window: however close to the present the clients report their watermarks,
//! a primary keeps every version readable `snapshot_window` behind its clock, and refuses
//! a read older than that with `TooOld`, naming its watermark and the window.

use std::time::Duration;

use crate::messages::{Get, Request, Response, TooOld, Watermark};
use crate::Dkv;
use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Role, TimerId};
use virga_storage::Timestamp;

use crate::layout::{Partitioning, ShardMap};
use crate::shard::{DataConfig, DataCore, DataIo};

const SECOND: u64 = 1_000_000_000;
const T0: u64 = 1_000 * SECOND;

/// One node leading the one shard (no backups, no leases: only the watermark decides),
/// holding `k` loaded, with its check timer.
fn node(window: Duration) -> (DataCore, TimerId) {
    let map = ShardMap::place(&["n0".to_string()], Partitioning::Hash { shards: 1 }, 0).unwrap();
    let mut config = DataConfig::new("n0", map);
    config.leases = false;
    config.snapshot_window = window;
    let mut core = DataCore::new(config, Vec::new());
    core.load(Bytes::from_static(b"k"), Bytes::from_static(b"v0"));
    let mut out = Vec::new();
    core.step(T0, Event::Start, &mut out);
    (core, check_timer(&out))
}

fn check_timer(out: &[Command<Dkv, DataIo>]) -> TimerId {
    let timers: Vec<TimerId> = out
        .iter()
        .filter_map(|command| match command {
            Command::SetTimer { timer, .. } => Some(*timer),
            _ => None,
        })
        .collect();
    *timers.last().expect("the node arms its check")
}

fn ask(core: &mut DataCore, now: u64, request: Request) -> Response {
    let mut out = Vec::new();
    core.step(now, Event::Request { from: "client-1".into(), call: CallId(9), request }, &mut out);
    out.into_iter()
        .find_map(|command| match command {
            Command::Reply { response, .. } => Some(response),
            _ => None,
        })
        .expect("a reply")
}

fn get(core: &mut DataCore, now: u64, ts: u64) -> Response {
    let get = Get { shard: 0, epoch: 1, key: Bytes::from_static(b"k"), ts: Timestamp::new(ts, 1), read_interval_ns: 0 };
    ask(core, now, Request::Get(get))
}

/// The client reports, every second for 12 s, that it reads nothing below its clock; the
/// node's check runs each time. Returns the time of the last step and the check timer.
fn clients_report_the_present(core: &mut DataCore, mut timer: TimerId) -> u64 {
    let mut now = T0;
    for _ in 0..12 {
        now += SECOND;
        let watermark = Watermark { client: 1, ts: Timestamp::new(now, 1), freshness: Timestamp::new(now, 1) };
        assert_eq!(ask(core, now, Request::Watermark(watermark)), Response::Ack);
        let mut out = Vec::new();
        core.step(now, Event::Timer(timer), &mut out);
        timer = check_timer(&out);
    }
    now
}

#[test]
fn a_snapshot_inside_the_window_is_served_and_an_older_one_is_refused_naming_the_window() {
    let (mut core, timer) = node(Duration::from_secs(5));
    let now = clients_report_the_present(&mut core, timer);
    match get(&mut core, now, now - 4 * SECOND) {
        Response::Value(reply) => assert_eq!(reply.value, Some(Bytes::from_static(b"v0"))),
        other => panic!("a snapshot 4 s old inside a 5 s window was not served: {other:?}"),
    }
    let watermark = core.replica(0).unwrap().watermark();
    assert!(watermark <= Timestamp::new(now - 5 * SECOND, 0), "the watermark {watermark} passed the window");
    assert!(watermark >= Timestamp::new(now - 6 * SECOND, 0), "the watermark {watermark} did not rise at all");
    match get(&mut core, now, now - 7 * SECOND) {
        Response::TooOld(too_old) => {
            assert_eq!(too_old, TooOld { watermark, window_ms: 5_000 });
            let told = too_old.explain(Timestamp::new(now - 7 * SECOND, 1));
            assert!(told.starts_with("snapshot-too-old: "), "{told}");
            assert!(told.contains("snapshot window of 5 s"), "{told}");
        }
        other => panic!("a snapshot 7 s old outside a 5 s window was served: {other:?}"),
    }
}

#[test]
fn without_a_window_the_clients_reports_alone_raise_the_watermark() {
    let (mut core, timer) = node(Duration::ZERO);
    let now = clients_report_the_present(&mut core, timer);
    match get(&mut core, now, now - 4 * SECOND) {
        Response::TooOld(too_old) => assert_eq!(too_old.window_ms, 0),
        other => panic!("with no window, a snapshot below the clients' watermark was served: {other:?}"),
    }
}
