//! The body of the `kairos_validator` fuzz target: a KAIROS validator fed any sequence of
//! requests (raw bytes decoded as a request, or validations, releases and watermarks built
//! from the input), clock advances with its ticks, and answers to its termination queries
//! (any phase, or a failure). It must answer every request exactly once (a read-only
//! validation it parks behind a held writer, later: by the end, once its wait has passed),
//! never hold more transactions than it voted commit with writes, and a validation it accepts
//! must encode back to itself.

use std::collections::{HashMap, HashSet};

use crate::messages::{Release, Request, Response, ValidatorGrant};
use crate::proto;
use virga_net::role::{CallId, Command, Event, Role, TimerId};
use virga_net::NetError;
use virga_storage::TxnId;

use crate::kairos::{validate_from_wire, validate_to_wire, ValidateRequest, ValidatorConfig, ValidatorCore};
use crate::layout::{Partitioning, ShardMap};
use crate::shard::wire as shard_wire;

/// Most operations one input runs.
const MAX_OPS: usize = 64;
const MS: u64 = 1_000_000;
const START: u64 = 1_000_000 * MS;

/// What an input came to.
#[derive(Debug, Default, Clone, Copy)]
pub struct ValidatorTally {
    pub requests: usize,
    pub commit_votes: usize,
    pub abort_votes: usize,
    pub errors: usize,
    /// Read-only validations that waited for a held writer's release.
    pub parked: usize,
    pub terminated: u64,
}

struct Harness {
    core: ValidatorCore,
    now: u64,
    next_call: u64,
    tick: Option<TimerId>,
    queries: Vec<CallId>,
    /// Validator lease renewals not answered yet.
    renewals: Vec<CallId>,
    /// Requests asked and not yet answered (parked validations), with what each was.
    pending: HashMap<CallId, Option<ValidateRequest>>,
    /// Transactions voted commit with writes: the most the validator may hold.
    holders: HashSet<u64>,
    tally: ValidatorTally,
}

pub fn kairos_validator(data: &[u8]) {
    run_validator(data);
}

/// The body of [`kairos_validator`].
pub fn run_validator(data: &[u8]) -> ValidatorTally {
    let Some((&first, mut input)) = data.split_first() else { return ValidatorTally::default() };
    let nodes: Vec<String> = (0..3).map(|index| format!("data-{index}")).collect();
    let Ok(map) = ShardMap::place(&nodes, Partitioning::Hash { shards: 3 }, 1) else {
        return ValidatorTally::default();
    };
    let mut config = ValidatorConfig::new(0, map);
    config.fresh = first & 1 == 0;
    let mut harness = Harness {
        core: ValidatorCore::new(config),
        now: START,
        next_call: 0,
        tick: None,
        queries: Vec::new(),
        renewals: Vec::new(),
        pending: HashMap::new(),
        holders: HashSet::new(),
        tally: ValidatorTally::default(),
    };
    harness.step(Event::Start);
    // The primaries grant long leases at first; later grants come from the input.
    while !harness.renewals.is_empty() {
        harness.grant(u8::MAX);
    }
    for _ in 0..MAX_OPS {
        let Some((&tag, rest)) = input.split_first() else { break };
        input = rest;
        match tag % 6 {
            0 => {
                let Some(request) = raw_request(&mut input) else { break };
                harness.ask(request);
            }
            1 => {
                let Some(validate) = built_validation(&mut input, harness.now) else { break };
                // Through the codec, as over gRPC: a malformed validation is refused there.
                match validate_from_wire(validate) {
                    Ok(validate) => harness.ask(Request::Validate(validate)),
                    Err(_) => harness.refused_at_codec(),
                }
            }
            2 => {
                let Some([seq, commit]) = take::<2>(&mut input) else { break };
                let release = Release { txn: txn_of(seq), commit: commit & 1 == 1 };
                harness.ask(Request::Release(release));
            }
            3 => {
                let Some([client, back]) = take::<2>(&mut input) else { break };
                let freshness = virga_storage::Timestamp::new(harness.now - u64::from(back) * MS, 1);
                let watermark = crate::messages::Watermark {
                    client: u32::from(client),
                    ts: virga_storage::Timestamp::ZERO,
                    freshness,
                };
                harness.ask(Request::Watermark(watermark));
            }
            4 => {
                let Some([advance]) = take::<1>(&mut input) else { break };
                harness.now += u64::from(advance) * 10 * MS;
                if let Some(tick) = harness.tick.take() {
                    harness.step(Event::Timer(tick));
                }
            }
            _ => {
                let Some([phase]) = take::<1>(&mut input) else { break };
                if phase >= 0xc0 {
                    harness.grant(phase);
                } else {
                    harness.answer(phase);
                }
            }
        }
    }
    // Past every parked validation's wait: each is answered at the next tick.
    harness.now += 2 * harness.core.config().park_for.as_nanos() as u64 + 1;
    if let Some(tick) = harness.tick.take() {
        harness.step(Event::Timer(tick));
    }
    assert!(harness.pending.is_empty(), "{} requests never answered", harness.pending.len());
    harness.tally.terminated = harness.core.stats().terminations;
    harness.tally
}

fn take<const N: usize>(input: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = input.split_first_chunk::<N>()?;
    *input = rest;
    Some(*head)
}

fn raw_request(input: &mut &[u8]) -> Option<Request> {
    let [low, high] = take::<2>(input)?;
    let length = usize::from(u16::from_le_bytes([low, high])).min(input.len());
    let (bytes, rest) = input.split_at(length);
    *input = rest;
    // Through the protocol's codec, as over gRPC; what it refuses arrives as a request a
    // validator does not serve, which an in-process caller could send.
    Some(<crate::Dkv as virga_net::WireProtocol>::decode_request(bytes).unwrap_or(Request::GetMap))
}

fn txn_of(seq: u8) -> TxnId {
    shard_wire::txn_from_wire(Some(proto::TxnId { client: 1, seq: u32::from(seq) })).unwrap_or_default()
}

/// A validation of small keys and timestamps near the validator's clock, as it would come
/// over the wire (perhaps malformed).
fn built_validation(input: &mut &[u8], now: u64) -> Option<proto::Validate> {
    let [seq, commit_back, fresh_back, shape] = take::<4>(input)?;
    let ts = |back: u8| Some(shard_wire::ts_to_wire(virga_storage::Timestamp::new(now - u64::from(back) * MS, 1)));
    let mut reads = Vec::new();
    for _ in 0..shape % 4 {
        let [key, version] = take::<2>(input)?;
        reads.push(proto::Read {
            key: vec![b'k', b'0' + key % 8],
            version: if version == 0 { None } else { ts(version) },
            cached: key & 0x80 != 0,
        });
    }
    let writes: Vec<Vec<u8>> =
        (0..(shape >> 2) % 3).map(|index| vec![b'k', b'0' + (seq.wrapping_add(index)) % 8]).collect();
    let validate = proto::Validate {
        txn: Some(proto::TxnId { client: 1, seq: u32::from(seq) }),
        commit_ts: ts(commit_back),
        freshness: ts(fresh_back),
        reads,
        participants: if writes.is_empty() { Vec::new() } else { vec![0, u32::from(shape >> 4) % 3] },
        writes,
    };
    Some(validate)
}

impl Harness {
    /// Steps the validator; every reply must answer a pending request, once.
    fn step(&mut self, event: Event<crate::Dkv, std::convert::Infallible, std::convert::Infallible>) {
        let mut out = Vec::new();
        self.core.step(self.now, event, &mut out);
        for command in out {
            match command {
                Command::SetTimer { timer, .. } => self.tick = Some(timer),
                Command::Call { call, request: Request::Query(_), .. } => self.queries.push(call),
                Command::Call { call, request: Request::ValidatorLease(_), .. } => self.renewals.push(call),
                Command::Reply { call, response, .. } => {
                    let asked = self.pending.remove(&call);
                    let Some(accepted) = asked else { panic!("a reply to {call:?}, which is not pending") };
                    self.tally_reply(accepted, &response);
                }
                other => panic!("a validator sent {other:?}"),
            }
        }
        assert!(self.core.held() <= self.holders.len(), "holds {} of {} voted", self.core.held(), self.holders.len());
    }

    fn tally_reply(&mut self, accepted: Option<ValidateRequest>, response: &Response) {
        match response {
            Response::Vote(vote) if vote.commit => {
                self.tally.commit_votes += 1;
                if let Some(accepted) = accepted.filter(|accepted| !accepted.writes.is_empty()) {
                    self.holders.insert(accepted.txn);
                }
            }
            Response::Vote(_) => self.tally.abort_votes += 1,
            Response::Ack => {}
            Response::Refused(_) => self.tally.errors += 1,
            other => panic!("a validator answered {other:?}"),
        }
    }

    fn ask(&mut self, request: Request) {
        self.next_call += 1;
        let call = CallId(self.next_call);
        let accepted = match &request {
            Request::Validate(validate) => Some(validate.clone()),
            _ => None,
        };
        if let Some(accepted) = &accepted {
            let again = validate_from_wire(validate_to_wire(accepted));
            assert_eq!(again.as_ref(), Ok(accepted), "a validation did not round-trip");
        }
        let may_wait = accepted.as_ref().is_some_and(|accepted| accepted.writes.is_empty());
        self.pending.insert(call, accepted);
        self.step(Event::Request { from: "client-1".into(), call, request });
        self.tally.requests += 1;
        if self.pending.contains_key(&call) {
            assert!(may_wait, "only a read-only validation may wait for its answer");
            self.tally.parked += 1;
        }
    }

    /// A request the codec refused never reaches the validator; the transport answers it.
    fn refused_at_codec(&mut self) {
        self.tally.requests += 1;
        self.tally.errors += 1;
    }

    /// Answers the oldest lease renewal: a grant of up to 630 ms past the clock, reporting
    /// writes validated in the validator's place up to 31 ms back (`knob` 0xff: a long
    /// grant and none), or a refusal or failure.
    fn grant(&mut self, knob: u8) {
        if self.renewals.is_empty() {
            return;
        }
        let call = self.renewals.remove(0);
        let result = match knob & 0x3f {
            0 => Err(NetError::Unreachable { peer: "data-0".into(), reason: "fuzzed".into() }),
            1 => Ok(Response::refused(crate::messages::RefusalKind::Unavailable, "fuzzed")),
            _ if knob == u8::MAX => Ok(grant_body(self.now + 10_000 * MS, virga_storage::Timestamp::ZERO)),
            reach => {
                let high = if knob & 0x40 != 0 {
                    virga_storage::Timestamp::new(self.now - u64::from(reach >> 1) * MS, 1)
                } else {
                    virga_storage::Timestamp::ZERO
                };
                Ok(grant_body(self.now + u64::from(reach) * 10 * MS, high))
            }
        };
        self.step(Event::Response { call, result });
    }

    /// Answers the oldest termination query: a phase, or (past the phases) a failure.
    fn answer(&mut self, phase: u8) {
        if self.queries.is_empty() {
            return;
        }
        let call = self.queries.remove(0);
        let result = match crate::messages::TxnPhase::try_from(i32::from(phase % 6)) {
            Ok(phase) => Ok(Response::State(phase)),
            Err(_) => Err(NetError::Unreachable { peer: "data-0".into(), reason: "fuzzed".into() }),
        };
        self.step(Event::Response { call, result });
    }
}

fn grant_body(until_ns: u64, takeover_high: virga_storage::Timestamp) -> Response {
    Response::ValidatorGrant(ValidatorGrant { until_ns, takeover_high })
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn random_inputs_get_one_reply_each_and_exercise_votes_and_terminations() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut total = ValidatorTally::default();
        for _ in 0..2_000 {
            let length = rng.random_range(0..400);
            let data: Vec<u8> = (0..length).map(|_| rng.random()).collect();
            let tally = run_validator(&data);
            total.requests += tally.requests;
            total.commit_votes += tally.commit_votes;
            total.abort_votes += tally.abort_votes;
            total.errors += tally.errors;
            total.terminated += tally.terminated;
            total.parked += tally.parked;
        }
        assert!(total.commit_votes > 100 && total.abort_votes > 100 && total.errors > 100, "{total:?}");
        assert!(total.terminated > 0 && total.parked > 0, "{total:?}");
    }
}
