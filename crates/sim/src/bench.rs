//! The simulator's own speed: a core that does nothing but keep the loop busy.

use std::time::{Duration, Instant};

use virga_net::role::{CallId, Command, Event, Ids, Nanos, NoIo, Protocol, Role, TimerId};

use crate::{Sim, SimConfig};

/// A protocol of bare numbers: a request is a number, its response the same number back.
#[derive(Clone, Copy, Debug)]
pub struct NullProtocol;

impl Protocol for NullProtocol {
    type Request = u64;
    type Response = u64;

    fn request_kind(_: &u64) -> &'static str {
        "ping"
    }

    fn response_kind(_: &u64) -> &'static str {
        "pong"
    }

    fn request_bytes(_: &u64) -> usize {
        8
    }

    fn response_bytes(_: &u64) -> usize {
        8
    }

    fn refusal_reason(_: &u64) -> Option<&str> {
        None
    }
}

/// Pings its peers round robin, `in_flight` calls at a time, answers every ping, and
/// re-arms a heartbeat timer: every event it handles causes about one more.
pub struct NullCore {
    peers: Vec<String>,
    next_peer: usize,
    in_flight: usize,
    heartbeat: Duration,
    ids: Ids,
    /// Responses received, answers and timeouts alike.
    pub responses: u64,
}

impl NullCore {
    pub fn new(peers: Vec<String>, in_flight: usize) -> Self {
        NullCore {
            peers,
            next_peer: 0,
            in_flight,
            heartbeat: Duration::from_millis(1),
            ids: Ids::default(),
            responses: 0,
        }
    }

    fn ping(&mut self, out: &mut Vec<Command<NullProtocol, std::convert::Infallible>>) {
        if self.peers.is_empty() {
            return;
        }
        let to = self.peers[self.next_peer].clone();
        self.next_peer = (self.next_peer + 1) % self.peers.len();
        let call: CallId = self.ids.call();
        out.push(Command::Call { to, call, request: call.0, deadline: Duration::from_millis(50) });
    }

    fn arm(&mut self, out: &mut Vec<Command<NullProtocol, std::convert::Infallible>>) {
        let timer: TimerId = self.ids.timer();
        out.push(Command::SetTimer { timer, after: self.heartbeat });
    }
}

impl Role for NullCore {
    type Protocol = NullProtocol;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ();

    fn step(
        &mut self,
        _now: Nanos,
        event: Event<NullProtocol, Self::IoDone, ()>,
        out: &mut Vec<Command<NullProtocol, Self::Io>>,
    ) {
        match event {
            Event::Start => {
                self.arm(out);
                for _ in 0..self.in_flight {
                    self.ping(out);
                }
            }
            Event::Request { from, call, request } => out.push(Command::Reply { to: from, call, response: request }),
            Event::Response { .. } => {
                self.responses += 1;
                self.ping(out);
            }
            Event::Timer(_) => self.arm(out),
            Event::IoDone { result, .. } => match result {},
            Event::Input(()) => {}
        }
    }
}

/// Runs `nodes` [`NullCore`]s, each keeping 4 pings in flight, for `events` events on a
/// LAN with default latencies, and returns the events handled per second of wall-clock
/// time. The one place in the crate that reads a clock.
pub fn null_core_events_per_sec(nodes: usize, events: u64) -> f64 {
    let config = SimConfig { seed: 1, max_events: Some(events), ..SimConfig::default() };
    let mut sim = Sim::new(config).expect("the default configuration is valid");
    let ids: Vec<String> = (0..nodes).map(|node| format!("node-{node}")).collect();
    for id in &ids {
        let peers = ids.iter().filter(|peer| *peer != id).cloned().collect();
        sim.add_node(id.clone(), NullCore::new(peers, 4), Box::new(NoIo)).expect("node ids are distinct");
    }
    let started = Instant::now();
    sim.run_until(u64::MAX);
    let elapsed = started.elapsed().as_secs_f64();
    sim.stats().events as f64 / elapsed.max(1e-9)
}
