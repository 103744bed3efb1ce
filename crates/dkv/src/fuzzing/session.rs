//! The body of the `kv_session` fuzz target: what an application (through the client API)
//! and the network can do to a client core's interactive sessions. Any bytes become a
//! sequence of session operations (on transactions that exist, ended long ago, or never
//! did; with any keys, values, ranges, limits and snapshots), answers to the core's calls
//! (values, rows, votes for or against with or without a commit floor, refusals, stale
//! epochs, snapshots too old, malformed and missing answers) in any order, requests from
//! peers (EI's invalidations of cached keys, malformed ones, and requests a client does not
//! serve), and passing time; the client caches half of the keys (KAIROS), with leases or
//! callbacks as the bytes choose. The core must never panic, must never answer an operation twice (`Reply` is
//! `FnOnce`, so a second answer cannot even be written), and once every call is answered and
//! the deadlines have passed, every operation must have had its answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::messages::{Invalidate, Request, Response};
use bytes::Bytes;
use virga_net::role::{CallId, Command, Event, Nanos, Role, TimerId};
use virga_net::NetError;
use virga_storage::Timestamp;

use crate::client::{ClientInput, Reply, SessionOp, SessionRequest, TxnClient, TxnClientConfig};
use crate::layout::{Partitioning, ShardMap};

/// Reads the fuzzer's bytes one at a time, zero once they run out.
struct Bytes8<'a>(&'a [u8]);

impl Bytes8<'_> {
    fn next(&mut self) -> u8 {
        let Some((&byte, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        byte
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A short key from a small alphabet (so keys meet), empty now and then.
    fn key(&mut self) -> Bytes {
        let length = self.next() % 4;
        Bytes::from((0..length).map(|_| b'a' + self.next() % 4).collect::<Vec<u8>>())
    }
}

/// The client core under test, the calls it made and not yet answered, its timers, and the
/// operations given and answered.
struct Harness {
    client: TxnClient,
    now: Nanos,
    calls: VecDeque<(CallId, Request)>,
    timers: Vec<TimerId>,
    /// Transactions begun so far (so operations name real ones most of the time).
    begun: Vec<u64>,
    given: usize,
    answered: Arc<Mutex<Vec<crate::client::SessionResult>>>,
    /// Answers already looked at for new transactions.
    seen: usize,
}

impl Harness {
    fn new(cache: crate::kairos::CacheMode) -> Harness {
        let nodes: Vec<String> = (0..3).map(|index| format!("node-{index}")).collect();
        let map = ShardMap::place(&nodes, Partitioning::Hash { shards: 3 }, 1)
            .unwrap_or_else(|error| unreachable!("the sample layout: {error}"));
        let mut config = TxnClientConfig::new(7, map);
        config.op_deadline = Duration::from_millis(50);
        config.session_idle = Duration::from_millis(200);
        // Every key of one or two letters is cacheable (half the keys the bytes make).
        let letters = || (b'a'..=b'd').map(|letter| vec![letter]);
        let pairs = letters().flat_map(|first| (b'a'..=b'd').map(move |second| vec![first[0], second]));
        config.cache = crate::kairos::CacheConfig::new(cache, letters().chain(pairs).map(Bytes::from));
        let mut harness = Harness {
            client: TxnClient::new(config),
            now: 1_000_000_000,
            calls: VecDeque::new(),
            timers: Vec::new(),
            begun: Vec::new(),
            given: 0,
            answered: Arc::new(Mutex::new(Vec::new())),
            seen: 0,
        };
        harness.step(Event::Start);
        harness
    }

    fn step(&mut self, event: Event<crate::Dkv, std::convert::Infallible, ClientInput>) {
        let mut out = Vec::new();
        self.client.step(self.now, event, &mut out);
        for command in out {
            match command {
                // Watermarks need no answer to check anything; the rest wait for one.
                Command::Call { request: Request::Watermark(_), .. } => {}
                Command::Call { call, request, .. } => self.calls.push_back((call, request)),
                Command::SetTimer { timer, .. } => self.timers.push(timer),
                Command::Reply { .. } | Command::Io { .. } => {}
            }
        }
        let answered = self.answered.lock().unwrap_or_else(|poison| poison.into_inner());
        for result in &answered[self.seen..] {
            if let Ok(crate::client::SessionReply::Began { txn, .. }) = result {
                self.begun.push(*txn);
            }
        }
        self.seen = answered.len();
    }

    fn give(&mut self, op: SessionOp) {
        self.given += 1;
        let answered = Arc::clone(&self.answered);
        let reply = Reply::new(move |result| answered.lock().unwrap_or_else(|poison| poison.into_inner()).push(result));
        self.step(Event::Input(ClientInput::Session(SessionRequest { op, reply })));
    }

    fn txn(&mut self, bytes: &mut Bytes8) -> u64 {
        match bytes.next() % 8 {
            0 => u64::from(bytes.next()),
            _ if self.begun.is_empty() => 1,
            pick => self.begun[usize::from(pick) % self.begun.len()],
        }
    }

    fn operation(&mut self, bytes: &mut Bytes8) {
        let op = match bytes.next() % 8 {
            0 | 1 => {
                let at = (bytes.next() % 4 == 0).then(|| Timestamp::new(self.now - u64::from(bytes.next()), 3));
                SessionOp::Begin { at }
            }
            2 => SessionOp::Get { txn: self.txn(bytes), key: bytes.key() },
            3 => {
                let (txn, key) = (self.txn(bytes), bytes.key());
                let value = Bytes::from(vec![bytes.next(); usize::from(bytes.next() % 8)]);
                SessionOp::Put { txn, key, value }
            }
            4 => SessionOp::Delete { txn: self.txn(bytes), key: bytes.key() },
            5 => {
                let (txn, start) = (self.txn(bytes), bytes.key());
                let end = (bytes.next() % 2 == 0).then(|| bytes.key());
                SessionOp::Scan { txn, start, end, limit: u32::from(bytes.next()) * 20 }
            }
            6 => SessionOp::Commit { txn: self.txn(bytes) },
            _ => SessionOp::Abort { txn: self.txn(bytes) },
        };
        self.give(op);
    }

    /// Answers the call `index` calls from the oldest, with what the bytes choose.
    fn answer(&mut self, bytes: &mut Bytes8) {
        if self.calls.is_empty() {
            return;
        }
        let index = usize::from(bytes.next()) % self.calls.len();
        let Some((call, request)) = self.calls.remove(index) else { return };
        let result = answer_for(&request, bytes);
        self.step(Event::Response { call, result });
    }

    /// A request from a peer: an invalidation of a key (perhaps with no version), or a
    /// request a client does not serve. The client answers each once and goes on.
    fn peer_request(&mut self, bytes: &mut Bytes8) {
        let body = match bytes.next() % 4 {
            0 => Request::Invalidate(Invalidate { key: Bytes::from(bytes.key().to_vec()), version: Timestamp::ZERO }),
            1 => Request::Get(crate::messages::Get {
                shard: 0,
                epoch: 0,
                key: Bytes::from(bytes.key().to_vec()),
                ts: Timestamp::ZERO,
                read_interval_ns: 0,
            }),
            _ => Request::Invalidate(Invalidate {
                key: Bytes::from(bytes.key().to_vec()),
                version: Timestamp::new(u64::from(bytes.next()), 2),
            }),
        };
        let call = CallId(u64::from(bytes.next()) << 40);
        let request = body;
        let mut out = Vec::new();
        self.client.step(self.now, Event::Request { from: "node-0".to_string(), call, request }, &mut out);
        let replies = out.iter().filter(|command| matches!(command, Command::Reply { .. })).count();
        assert_eq!(replies, 1, "a peer's request must get exactly one reply: {out:?}");
    }

    fn pass_time(&mut self, by: Duration) {
        self.now += by.as_nanos() as u64;
        for timer in std::mem::take(&mut self.timers) {
            self.step(Event::Timer(timer));
        }
    }
}

fn get_reply(bytes: &mut Bytes8) -> crate::messages::ReadReply {
    let found = bytes.next() % 2 == 0;
    let value = vec![bytes.next(); usize::from(bytes.next() % 4)];
    crate::messages::ReadReply {
        value: found.then(|| bytes::Bytes::from(value)),
        version: Timestamp::new(u64::from(bytes.next()), 2),
        writer: 0,
        prepared_below: bytes.next() % 4 == 0,
        lease_end_ns: u64::from(bytes.next()) << 24,
    }
}

/// An answer to `request`: a fitting one, a refusal, or none at all.
fn answer_for(request: &Request, bytes: &mut Bytes8) -> Result<Response, NetError> {
    let choice = bytes.next() % 8;
    let body = match (request, choice) {
        (_, 0) => {
            return Err(NetError::DeadlineExceeded { peer: "node-0".to_string(), after: Duration::from_millis(300) })
        }
        (_, 1) => Response::refused(crate::messages::RefusalKind::Unavailable, "refused"),
        (_, 2) => Response::WrongEpoch(u64::from(bytes.next())),
        (_, 3) => Response::TooOld(crate::messages::TooOld {
            watermark: Timestamp::new(u64::from(bytes.next()), 1),
            window_ms: u64::from(bytes.next()),
        }),
        (Request::Get(_), _) => Response::Value(get_reply(bytes)),
        // Sometimes a wrong number of answers.
        (Request::GetMany(get), _) => {
            let count = if choice == 4 { usize::from(bytes.next() % 4) } else { get.keys.len() };
            Response::Values((0..count).map(|_| get_reply(bytes)).collect())
        }
        (Request::Scan(scan), _) => Response::Rows(crate::messages::ScanReply {
            rows: (0..bytes.next() % 3)
                .map(|_| crate::messages::Row {
                    key: bytes::Bytes::from([scan.range.start.to_vec(), vec![b'a' + bytes.next() % 4]].concat()),
                    value: bytes::Bytes::from(vec![bytes.next()]),
                    version: Timestamp::new(u64::from(bytes.next()), 2),
                    writer: 0,
                })
                .collect(),
            prepared_below: bytes.next() % 4 == 0,
        }),
        (Request::Prepare(_), _) => Response::Vote(crate::messages::Vote {
            commit: bytes.next() % 3 != 0,
            reason: "read-stale".to_string(),
            floor: (bytes.next() % 3 == 0).then(|| Timestamp::new(u64::from(bytes.next()) << 32, 1)),
            stale: (0..bytes.next() % 2).map(|_| bytes::Bytes::from(vec![b'a' + bytes.next() % 4])).collect(),
        }),
        (Request::Decide(_), _) => Response::Ack,
        // A well-formed answer to something else: it does not fit.
        _ => Response::Ack,
    };
    Ok(body)
}

/// Runs the bytes as a session's life; panics on a broken invariant.
pub fn kv_session(data: &[u8]) {
    run_session(data);
}

/// [`kv_session`], returning every answer given and what the client's cache did.
fn run_session(data: &[u8]) -> (Vec<crate::client::SessionResult>, crate::kairos::CacheStats) {
    let mut bytes = Bytes8(data);
    let cache = match bytes.next() % 4 {
        0 => crate::kairos::CacheMode::None,
        1 => crate::kairos::CacheMode::Ei,
        2 => crate::kairos::CacheMode::Naive,
        _ => crate::kairos::CacheMode::Lease,
    };
    let mut harness = Harness::new(cache);
    while !bytes.is_empty() {
        match bytes.next() % 8 {
            0..=2 => harness.operation(&mut bytes),
            3..=5 => harness.answer(&mut bytes),
            6 => harness.peer_request(&mut bytes),
            _ => harness.pass_time(Duration::from_millis(u64::from(bytes.next() % 64))),
        }
    }
    // The network goes quiet (every call refused) and time passes beyond every deadline:
    // every operation must have been answered.
    for _ in 0..64 {
        while let Some((call, _)) = harness.calls.pop_front() {
            harness.step(Event::Response {
                call,
                result: Err(NetError::DeadlineExceeded { peer: "x".into(), after: Duration::from_millis(300) }),
            });
        }
        harness.pass_time(Duration::from_millis(100));
        let answered = harness.answered.lock().unwrap_or_else(|poison| poison.into_inner());
        if answered.len() == harness.given {
            return (answered.clone(), *harness.client.cache_stats());
        }
    }
    let answered = harness.answered.lock().unwrap_or_else(|poison| poison.into_inner()).len();
    panic!("{} operations given, {answered} answered", harness.given);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random lives answer every operation, and reach every kind of answer (so the target
    /// exercises commits, aborts, timeouts and refusals, not only the first checks).
    #[test]
    fn random_session_lives_answer_every_operation_with_every_kind_of_answer() {
        use crate::client::{SessionError, SessionReply};
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        let mut kinds = std::collections::BTreeSet::new();
        let (mut hits, mut invalidations, mut fills, mut reads) = (0, 0, 0, 0);
        for _ in 0..400 {
            let length = rng.random_range(0..600);
            let data: Vec<u8> = (0..length).map(|_| rng.random()).collect();
            let (answers, cache) = run_session(&data);
            hits += cache.hits;
            invalidations += cache.invalidations;
            fills += cache.fills;
            reads += cache.reads;
            for result in answers {
                kinds.insert(match result {
                    Ok(SessionReply::Committed { read_only: false, .. }) => "committed",
                    Ok(SessionReply::Committed { read_only: true, .. }) => "committed-read-only",
                    Ok(SessionReply::Rows(_)) => "rows",
                    Ok(SessionReply::Value(Some(_))) => "value",
                    Ok(_) => "other",
                    Err(SessionError::Aborted { .. }) => "aborted",
                    Err(SessionError::OutcomeUnknown { .. }) => "outcome-unknown",
                    Err(SessionError::Unavailable { .. } | SessionError::StaleMap { .. }) => "unavailable",
                    Err(SessionError::UnknownTransaction { .. }) => "unknown-transaction",
                    Err(SessionError::Invalid(_)) => "invalid",
                    Err(SessionError::ReadOnly { .. } | SessionError::Committing { .. }) => "refused",
                });
            }
        }
        let expected = [
            "aborted",
            "committed",
            "committed-read-only",
            "invalid",
            "other",
            "outcome-unknown",
            "refused",
            "rows",
            "unavailable",
            "unknown-transaction",
            "value",
        ];
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), expected);
        // Cached reads and peers' invalidations are reached too.
        assert!(
            hits > 0 && invalidations > 0,
            "{hits} hits, {invalidations} invalidations, {fills} fills, {reads} reads"
        );
    }
}
