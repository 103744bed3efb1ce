//! Loss, partitions, duplicates and refusals as the callers see them.

use std::time::Duration;

use virga_net::role::CallId;
use virga_net::NetError;
use virga_sim::{Partition, SimConfig};

use crate::common::{call, entries, fixed_latency, sim_with, Answer, Do, Entry, Seen, MS};

fn responses(log: &[Entry], node: &str) -> Vec<(u64, CallId, Result<Answer, NetError>)> {
    log.iter()
        .filter(|entry| entry.node == node)
        .filter_map(|entry| match &entry.seen {
            Seen::Response { call, result } => Some((entry.time, *call, result.clone())),
            _ => None,
        })
        .collect()
}

fn requests(log: &[Entry], node: &str) -> Vec<(u64, String, CallId)> {
    log.iter()
        .filter(|entry| entry.node == node)
        .filter_map(|entry| match &entry.seen {
            Seen::Request { from, call, .. } => Some((entry.time, from.clone(), *call)),
            _ => None,
        })
        .collect()
}

#[test]
fn when_every_message_is_lost_every_call_times_out_once() {
    let mut config = SimConfig::default();
    config.net.drop_probability = 1.0;
    let (mut sim, log) = sim_with(config, &["a", "b"]);
    for round in 0..20 {
        sim.input_at(round * MS, "a", call("b", 3)).unwrap();
    }
    sim.run_until(100 * MS);
    let log = entries(&log);
    assert!(requests(&log, "b").is_empty());
    let answers = responses(&log, "a");
    assert_eq!(answers.len(), 20);
    for (index, (time, call, result)) in answers.iter().enumerate() {
        assert_eq!(*call, CallId(index as u64));
        assert_eq!(*time, index as u64 * MS + 3 * MS);
        assert!(
            matches!(result, Err(NetError::DeadlineExceeded { peer, after }) if peer == "b" && after == &Duration::from_millis(3))
        );
    }
    assert_eq!(sim.stats().dropped, 20);
    assert_eq!(sim.stats().deadlines_exceeded, 20);
}

#[test]
fn a_partition_cuts_exactly_its_pairs_in_its_window_and_heals() {
    let mut config = fixed_latency(Duration::from_micros(100));
    config.net.partitions = vec![Partition {
        start_ns: 10 * MS,
        end_ns: 20 * MS,
        side_a: vec!["a".into()],
        side_b: vec!["b".into(), "c".into()],
    }];
    let (mut sim, log) = sim_with(config, &["a", "b", "c", "d"]);
    // At 5, 15 and 25 ms every node calls every other node.
    let ids = ["a", "b", "c", "d"];
    for at in [5 * MS, 15 * MS, 25 * MS] {
        for from in ids {
            for to in ids.iter().filter(|to| **to != from) {
                sim.input_at(at, from, call(to, 2)).unwrap();
            }
        }
    }
    sim.run_until(40 * MS);
    let log = entries(&log);
    let cut =
        |from: &str, to: &str| (from == "a" && to != "a" && to != "d") || (to == "a" && from != "a" && from != "d");
    for from in ids {
        let answers = responses(&log, from);
        let called: Vec<_> = log
            .iter()
            .filter(|entry| entry.node == from)
            .filter_map(|entry| match &entry.seen {
                Seen::Called(call, to) => Some((entry.time, *call, to.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(called.len(), 9);
        for (at, call, to) in called {
            let (_, _, result) = answers.iter().find(|(_, answered, _)| *answered == call).unwrap();
            let in_window = at == 15 * MS;
            if in_window && cut(from, to.as_str()) {
                assert!(matches!(result, Err(NetError::DeadlineExceeded { .. })), "{from} → {to} at {at}: {result:?}");
            } else {
                assert!(result.is_ok(), "{from} → {to} at {at}: {result:?}");
            }
        }
    }
    // a→b, a→c, b→a, c→a during the window.
    assert_eq!(sim.stats().cut, 4);
}

#[test]
fn a_reply_that_arrives_inside_a_window_is_cut() {
    let mut config = fixed_latency(Duration::from_millis(1));
    config.net.partitions =
        vec![Partition { start_ns: 10 * MS + 1, end_ns: 20 * MS, side_a: vec!["a".into()], side_b: vec!["b".into()] }];
    let (mut sim, log) = sim_with(config, &["a", "b"]);
    // The request leaves at 9 ms and arrives at 10 ms; the reply leaves at 10 ms (before the
    // window) and would arrive at 11 ms, inside it.
    sim.input_at(9 * MS, "a", call("b", 5)).unwrap();
    sim.run_until(30 * MS);
    let log = entries(&log);
    assert_eq!(requests(&log, "b").len(), 1);
    let answers = responses(&log, "a");
    assert!(matches!(answers[..], [(time, _, Err(NetError::DeadlineExceeded { .. }))] if time == 14 * MS));
}

#[test]
fn a_duplicated_request_is_delivered_twice_and_answered_once() {
    let mut config = SimConfig::default();
    config.net.duplicate_probability = 1.0;
    let (mut sim, log) = sim_with(config, &["a", "b"]);
    sim.input_at(0, "a", call("b", 10)).unwrap();
    sim.run_until(50 * MS);
    let log = entries(&log);
    let delivered = requests(&log, "b");
    assert_eq!(delivered.len(), 2);
    assert_ne!(delivered[0].2, delivered[1].2, "each copy has its own incoming call id");
    let answers = responses(&log, "a");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].2, Ok(Answer::Pong(0)));
    // Both copies were answered, each answer duplicated: four replies, one taken.
    assert_eq!(sim.stats().duplicated, 1 + 2);
    assert_eq!(sim.stats().late_responses, 3);
}

#[test]
fn a_call_to_an_unknown_node_fails_at_once() {
    let (mut sim, log) = sim_with(SimConfig::default(), &["a"]);
    sim.input_at(3 * MS, "a", call("nobody", 10)).unwrap();
    sim.run_until(50 * MS);
    let answers = responses(&entries(&log), "a");
    assert!(
        matches!(&answers[..], [(time, _, Err(NetError::UnknownPeer(peer)))] if *time == 3 * MS && peer == "nobody")
    );
    assert_eq!(sim.stats().unknown_peers, 1);
}

#[test]
fn a_refusal_reaches_the_caller_as_refused() {
    let (mut sim, log) = sim_with(fixed_latency(Duration::from_micros(200)), &["a", "b"]);
    let refuse = Do::Call { to: "b".into(), deadline: Duration::from_millis(5), refuse: true };
    sim.input_at(0, "a", refuse).unwrap();
    sim.run_until(50 * MS);
    let answers = responses(&entries(&log), "a");
    assert!(matches!(&answers[..], [(400_000, _, Err(NetError::Refused { peer, .. }))] if peer == "b"));
    let traffic = sim.traffic();
    assert_eq!(traffic.len(), 2);
    assert_eq!((traffic[0].0, traffic[0].1, traffic[0].2, traffic[0].3.bytes), ("a", "b", "refuse", 100));
    assert_eq!((traffic[1].0, traffic[1].1, traffic[1].2, traffic[1].3.bytes), ("b", "a", "refused", 40));
}

#[test]
fn latencies_reorder_messages_within_their_range() {
    let mut config = SimConfig { seed: 3, ..SimConfig::default() };
    config.net.latency_min = Duration::from_micros(100);
    config.net.latency_max = Duration::from_millis(2);
    let (mut sim, log) = sim_with(config, &["a", "b"]);
    for _ in 0..50 {
        sim.input_at(0, "a", call("b", 100)).unwrap();
    }
    sim.run_until(50 * MS);
    let delivered = requests(&entries(&log), "b");
    assert_eq!(delivered.len(), 50);
    assert!(delivered.iter().all(|(time, _, _)| (100_000..=2 * MS).contains(time)));
    // The b side numbers requests in arrival order; the callers' order differs somewhere.
    let answers = responses(&entries(&log), "a");
    let order: Vec<_> = answers.iter().map(|(_, call, _)| call.0).collect();
    assert!(order.windows(2).any(|pair| pair[0] > pair[1]), "no reordering in {order:?}");
}

#[test]
fn a_wan_link_has_its_latency_and_queues_by_bandwidth() {
    use virga_sim::LinkConfig;
    let mut config = fixed_latency(Duration::from_micros(100));
    // 100 kB/s: a 100-byte request takes 1 ms to send, a 40-byte reply 0.4 ms.
    config.net.links = vec![LinkConfig {
        a: "a".into(),
        b: "b".into(),
        latency: Some(Duration::from_millis(10)),
        bandwidth: Some(100_000),
    }];
    let (mut sim, log) = sim_with(config, &["a", "b", "c"]);
    sim.input_at(0, "a", call("b", 100)).unwrap();
    sim.input_at(0, "a", call("b", 100)).unwrap();
    sim.input_at(0, "a", call("c", 100)).unwrap();
    sim.run_until(100 * MS);
    let log = entries(&log);
    let arrived: Vec<_> = requests(&log, "b").iter().map(|(time, _, _)| *time).collect();
    assert_eq!(arrived, [11 * MS, 12 * MS]);
    let answered: Vec<_> = responses(&log, "a").iter().map(|(time, call, _)| (*time, call.0)).collect();
    // a→c is an ordinary link: 100 µs each way.
    assert_eq!(answered, [(200_000, 2), (21 * MS + 400_000, 0), (22 * MS + 400_000, 1)]);
}
