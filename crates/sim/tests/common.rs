//! A scriptable test role: it does what its inputs say and writes down everything it sees
//! in a log shared across crashes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use virga_net::role::{CallId, Command, Event, Ids, IoExecutor, IoId, Nanos, Protocol, Role, TimerId};
use virga_net::NetError;
use virga_sim::{Sim, SimConfig, EPOCH_BASE_NS};

pub(crate) const MS: u64 = 1_000_000;

#[derive(Clone, Debug)]
pub(crate) enum Ask {
    Ping(u64),
    /// Asks the callee to refuse.
    Refuse,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    Pong(u64),
    Refused(String),
}

pub(crate) struct TestProtocol;

impl Protocol for TestProtocol {
    type Request = Ask;
    type Response = Answer;

    fn request_kind(request: &Ask) -> &'static str {
        match request {
            Ask::Ping(_) => "ping",
            Ask::Refuse => "refuse",
        }
    }

    fn response_kind(response: &Answer) -> &'static str {
        match response {
            Answer::Pong(_) => "pong",
            Answer::Refused(_) => "refused",
        }
    }

    fn request_bytes(_: &Ask) -> usize {
        100
    }

    fn response_bytes(_: &Answer) -> usize {
        40
    }

    fn refusal_reason(response: &Answer) -> Option<&str> {
        match response {
            Answer::Refused(reason) => Some(reason),
            Answer::Pong(_) => None,
        }
    }
}

/// What a test core is told to do.
#[derive(Debug)]
pub(crate) enum Do {
    Call { to: String, deadline: Duration, refuse: bool },
    Timer(Duration),
    Io(u64),
}

pub(crate) fn call(to: &str, deadline_ms: u64) -> Do {
    Do::Call { to: to.to_string(), deadline: Duration::from_millis(deadline_ms), refuse: false }
}

/// What a test core saw.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Seen {
    Start,
    /// It issued call `CallId` to the peer (not an event: its own action, for the checker).
    Called(CallId, String),
    Request {
        from: String,
        call: CallId,
        kind: &'static str,
    },
    Response {
        call: CallId,
        result: Result<Answer, NetError>,
    },
    Timer(TimerId),
    IoDone(IoId, u64),
    Input,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub node: String,
    pub incarnation: u32,
    /// The node's clock less the epoch base: virtual time when the node has no skew.
    pub time: u64,
    pub seen: Seen,
}

pub(crate) type Log = Arc<Mutex<Vec<Entry>>>;

pub(crate) struct TestCore {
    node: String,
    incarnation: u32,
    log: Log,
    /// Whether it answers requests.
    pub answers: bool,
    ids: Ids,
}

impl TestCore {
    pub(crate) fn new(node: &str, incarnation: u32, log: &Log) -> Self {
        TestCore { node: node.to_string(), incarnation, log: Arc::clone(log), answers: true, ids: Ids::default() }
    }

    fn note(&self, now: Nanos, seen: Seen) {
        let entry = Entry {
            node: self.node.clone(),
            incarnation: self.incarnation,
            time: now.saturating_sub(EPOCH_BASE_NS),
            seen,
        };
        self.log.lock().unwrap().push(entry);
    }
}

impl Role for TestCore {
    type Protocol = TestProtocol;
    type Io = u64;
    type IoDone = u64;
    type Input = Do;

    fn step(&mut self, now: Nanos, event: Event<TestProtocol, u64, Do>, out: &mut Vec<Command<TestProtocol, u64>>) {
        match event {
            Event::Start => self.note(now, Seen::Start),
            Event::Request { from, call, request } => {
                let kind = TestProtocol::request_kind(&request);
                self.note(now, Seen::Request { from: from.clone(), call, kind });
                if self.answers {
                    let response = match request {
                        Ask::Ping(value) => Answer::Pong(value),
                        Ask::Refuse => Answer::Refused("asked to".into()),
                    };
                    out.push(Command::Reply { to: from, call, response });
                }
            }
            Event::Response { call, result } => self.note(now, Seen::Response { call, result }),
            Event::Timer(timer) => self.note(now, Seen::Timer(timer)),
            Event::IoDone { io, result } => self.note(now, Seen::IoDone(io, result)),
            Event::Input(action) => {
                self.note(now, Seen::Input);
                match action {
                    Do::Call { to, deadline, refuse } => {
                        let call = self.ids.call();
                        self.note(now, Seen::Called(call, to.clone()));
                        let request = if refuse { Ask::Refuse } else { Ask::Ping(call.0) };
                        out.push(Command::Call { to, call, request, deadline });
                    }
                    Do::Timer(after) => out.push(Command::SetTimer { timer: self.ids.timer(), after }),
                    Do::Io(value) => out.push(Command::Io { io: self.ids.io(), op: value }),
                }
            }
        }
    }
}

/// A device that doubles what it is given.
pub(crate) struct Doubler;

impl IoExecutor<TestCore> for Doubler {
    fn execute(&mut self, op: u64) -> u64 {
        op * 2
    }
}

/// A simulator with nodes `ids` and a factory that restarts them with the next incarnation.
pub(crate) fn sim_with(config: SimConfig, ids: &[&str]) -> (Sim<TestCore>, Log) {
    let log = Log::default();
    let mut sim = Sim::new(config).unwrap();
    for id in ids {
        sim.add_node(*id, TestCore::new(id, 0, &log), Box::new(Doubler)).unwrap();
    }
    let factory_log = Arc::clone(&log);
    let mut restarts = std::collections::HashMap::<String, u32>::new();
    sim.set_factory(move |id| {
        let incarnation = restarts.entry(id.to_string()).or_insert(0);
        *incarnation += 1;
        (TestCore::new(id, *incarnation, &factory_log), Box::new(Doubler) as Box<dyn IoExecutor<TestCore>>)
    });
    (sim, log)
}

/// A network with a fixed latency and nothing else.
pub(crate) fn fixed_latency(latency: Duration) -> SimConfig {
    let mut config = SimConfig::default();
    config.net.latency_min = latency;
    config.net.latency_max = latency;
    config
}

pub(crate) fn entries(log: &Log) -> Vec<Entry> {
    log.lock().unwrap().clone()
}

/// What is wrong with the calls in `log`: every call issued must get exactly one response,
/// except that a call whose caller crashed before its deadline may get none.
pub(crate) fn check_one_response_per_call(log: &[Entry], crashed: &dyn Fn(&str, u32) -> bool) -> Result<usize, String> {
    let mut calls = std::collections::BTreeMap::new();
    for entry in log {
        let key = |call: CallId| (entry.node.clone(), entry.incarnation, call);
        match &entry.seen {
            Seen::Called(call, _) if calls.insert(key(*call), 0u32).is_some() => {
                return Err(format!("call {call:?} of {} issued twice", entry.node));
            }
            Seen::Response { call, .. } => match calls.get_mut(&key(*call)) {
                Some(responses) => *responses += 1,
                None => return Err(format!("{} got a response to {call:?}, which it never made", entry.node)),
            },
            _ => {}
        }
    }
    for ((node, incarnation, call), responses) in &calls {
        let allowed_none = crashed(node, *incarnation);
        if *responses > 1 || (*responses == 0 && !allowed_none) {
            return Err(format!("call {call:?} of {node} (incarnation {incarnation}) got {responses} responses"));
        }
    }
    Ok(calls.len())
}
