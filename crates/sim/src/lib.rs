//! Virga's deterministic simulator: role cores run in virtual time on a seeded event loop.
//!
//! A [`Sim`] holds nodes, each a core implementing [`Role`] with its device executor and
//! its own skewed clock, and one queue of events ordered by (virtual time, sequence
//! number). Everything random (latencies, losses, duplicates, clock errors, what a crash
//! keeps) comes from streams derived from the seed, and nothing reads the wall clock, so a
//! run is a function of its seed, configuration and harness: the same seed replays the
//! same run, event for event ([`Sim::trace_digest`]).
//!
//! The simulator keeps the driver's promises ([`virga_net::driver`]): a core sees
//! [`Event::Start`] first; every [`Command::Call`] gets exactly one [`Event::Response`],
//! the callee's answer passed through [`Protocol::check`] or `DeadlineExceeded` once the
//! deadline has passed, whichever comes first; `now` is nanoseconds since the Unix epoch
//! on the node's clock.
//!
//! ```
//! use virga_net::role::NoIo;
//! use virga_sim::{NullCore, Sim, SimConfig};
//!
//! let run = |seed| {
//!     let mut sim = Sim::new(SimConfig { seed, ..SimConfig::default() }).unwrap();
//!     sim.add_node("a", NullCore::new(vec!["b".into()], 1), Box::new(NoIo)).unwrap();
//!     sim.add_node("b", NullCore::new(vec!["a".into()], 1), Box::new(NoIo)).unwrap();
//!     sim.run_until(10_000_000); // 10 ms of virtual time
//!     assert!(sim.core("a").unwrap().responses > 0);
//!     sim.trace_digest()
//! };
//! assert_eq!(run(7), run(7));
//! assert_ne!(run(7), run(8));
//! ```
//!
//! [`Command::Call`]: virga_net::role::Command::Call
//! [`Event::Start`]: virga_net::role::Event::Start
//! [`Event::Response`]: virga_net::role::Event::Response
//! [`Protocol::check`]: virga_net::role::Protocol::check

mod bench;
mod clock;
mod cost;
mod dispatch;
pub mod media;
mod multi;
mod network;
mod queue;
mod stats;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use virga_core::clock::{Skew, SkewProfile};
use virga_net::role::{CallId, IoExecutor, IoId, Protocol, Role, TimerId};
use virga_net::NetError;

pub use bench::{null_core_events_per_sec, NullCore, NullProtocol};
pub use clock::{SkewProblem, EPOCH_BASE_NS, MAX_DRIFT_PPM, MAX_OFFSET_NS};
pub use cost::{CostModel, RoleEvent, ZeroCost};
pub use multi::{Fit, MultiRole};
pub use network::{LinkConfig, NetConfig, Partition};
pub use stats::{Stats, Traffic};

use clock::NodeClock;
use network::Network;
use queue::EventQueue;
use stats::{Digest, Kind, TrafficMap};

/// What can go wrong setting up or steering a simulation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulator configuration: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    #[error("invalid clock for node {node}: {reason}")]
    InvalidSkew { node: String, reason: SkewProblem },
    #[error("a node named {0} already exists")]
    DuplicateNode(String),
    #[error("no node named {0}")]
    UnknownNode(String),
    #[error("node {0} is already up")]
    NodeUp(String),
    #[error("node {0} is already down")]
    NodeDown(String),
    #[error("no factory to restart node {0} with (Sim::set_factory)")]
    NoFactory(String),
    #[error("virtual time {at} ns is before the present, {now} ns")]
    InPast { at: u64, now: u64 },
}

/// How a simulation runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The one source of randomness of the run.
    pub seed: u64,
    pub net: NetConfig,
    /// Fixed time a device operation takes, to which [`CostModel::io_cost`] adds.
    pub device_latency: Duration,
    /// The profile each node's clock error is drawn from, unless given explicitly.
    pub clock_profile: SkewProfile,
    /// Stop after this many events handled by cores (a run-away protocol's bound).
    pub max_events: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            net: NetConfig::default(),
            device_latency: Duration::from_micros(10),
            clock_profile: SkewProfile::None,
            max_events: None,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        self.net.validate()?;
        if self.device_latency > Duration::from_secs(3600) {
            return Err(SimError::InvalidConfig {
                field: "device_latency".into(),
                reason: format!("{:?} is longer than an hour", self.device_latency),
            });
        }
        Ok(())
    }
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Nothing but timers is left in the queue: no message, call, device operation, input,
    /// crash or restart pending.
    Quiet,
    /// The next event is past the time limit (or the queue is empty).
    TimeLimit,
    /// `max_events` events have been handled.
    MaxEvents,
    /// The harness's predicate said to stop.
    Predicate,
}

/// Builds a node's core and executor again after a crash.
pub type Factory<R> = Box<dyn FnMut(&str) -> (R, Box<dyn IoExecutor<R>>)>;

/// Told of every crash, with a random stream for what the crash keeps (a harness calls
/// `MemStorage::crash` on the node's durable state with a seed drawn from it).
pub type CrashHook = Box<dyn FnMut(&str, &mut StdRng)>;

type Request<R> = <<R as Role>::Protocol as Protocol>::Request;
type Response<R> = <<R as Role>::Protocol as Protocol>::Response;
type FixedHashMap<K, V> = HashMap<K, V, BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

/// Marks an event that goes to whatever incarnation of the node is up when it comes.
const ANY_INCARNATION: u32 = u32::MAX;

/// One call's record, found through a [`CallRef`]; the generation tells a reused slot apart.
struct CallRecord {
    generation: u32,
    /// False once the call has had its one response.
    open: bool,
    caller: u32,
    callee: u32,
    call: CallId,
    deadline: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CallRef {
    index: u32,
    generation: u32,
}

/// A request a node has been handed and not answered yet.
#[derive(Clone, Copy)]
struct Incoming {
    call: CallRef,
    caller: u32,
    caller_incarnation: u32,
}

enum Payload<R: Role> {
    Start,
    Request {
        call: CallRef,
        from: u32,
        from_incarnation: u32,
        request: Request<R>,
    },
    Reply {
        call: CallRef,
        from: u32,
        response: Response<R>,
    },
    Deadline {
        call: CallRef,
    },
    Failed {
        call: CallId,
        error: NetError,
    },
    Timer(TimerId),
    /// A device operation, carried out when it completes: a crash before then loses it, as
    /// a write not yet on the device is lost.
    Io {
        io: IoId,
        op: R::Io,
    },
    Input(R::Input),
    Crash,
    Restart,
}

struct Scheduled<R: Role> {
    node: u32,
    /// The incarnation the event belongs to, or [`ANY_INCARNATION`].
    incarnation: u32,
    /// Set when the event already waited for its busy node: its arrival was checked.
    deferred: bool,
    payload: Payload<R>,
}

struct Live<R: Role> {
    core: R,
    io: Box<dyn IoExecutor<R>>,
}

struct Node<R: Role> {
    id: String,
    live: Option<Live<R>>,
    /// Bumped by every crash and restart, so events of a past incarnation are told apart.
    incarnation: u32,
    clock: NodeClock,
    busy_until: u64,
    /// The machine whose threads the node's steps run on ([`Sim::place`]), if any.
    machine: Option<usize>,
    next_incoming: u64,
    incoming: FixedHashMap<u64, Incoming>,
    events: u64,
}

/// The simulator. See the crate documentation.
pub struct Sim<R: Role> {
    config: SimConfig,
    now: u64,
    /// Per machine, the time each of its threads is free again (see [`Sim::place`]).
    machines: Vec<Vec<u64>>,
    queue: EventQueue<Scheduled<R>>,
    /// Queued events other than timers and deadlines.
    pending_work: usize,
    /// Calls still waiting for their one response.
    open_calls: usize,
    nodes: Vec<Node<R>>,
    index: FixedHashMap<String, u32>,
    calls: Vec<CallRecord>,
    free_calls: Vec<u32>,
    network: Network,
    crash_rng: StdRng,
    cost: Box<dyn CostModel<R>>,
    factory: Option<Factory<R>>,
    on_crash: Option<CrashHook>,
    stats: Stats,
    traffic: TrafficMap,
    digest: Digest,
    /// Commands of the step being carried out; kept to reuse its allocation.
    commands: Vec<virga_net::role::Command<R::Protocol, R::Io>>,
}

/// Seeds of the independent random streams, derived from the run's seed.
fn stream_seed(seed: u64, purpose: u64) -> u64 {
    let mut z = seed ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const NETWORK_STREAM: u64 = 1;
const CRASH_STREAM: u64 = 2;
const JITTER_STREAM: u64 = 3;

impl<R: Role> Sim<R> {
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        config.validate()?;
        let seed = config.seed;
        Ok(Sim {
            now: 0,
            machines: Vec::new(),
            queue: EventQueue::default(),
            pending_work: 0,
            open_calls: 0,
            nodes: Vec::new(),
            index: FixedHashMap::default(),
            calls: Vec::new(),
            free_calls: Vec::new(),
            network: Network::new(config.net.clone(), StdRng::seed_from_u64(stream_seed(seed, NETWORK_STREAM))),
            crash_rng: StdRng::seed_from_u64(stream_seed(seed, CRASH_STREAM)),
            cost: Box::new(ZeroCost),
            factory: None,
            on_crash: None,
            stats: Stats::default(),
            traffic: TrafficMap::default(),
            digest: Digest::default(),
            commands: Vec::new(),
            config,
        })
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Adds node `id`, its clock error drawn from the configured profile; it starts now.
    pub fn add_node(&mut self, id: impl Into<String>, core: R, io: Box<dyn IoExecutor<R>>) -> Result<(), SimError> {
        let skew = self.config.clock_profile.draw(self.nodes.len() as u64, self.config.seed);
        self.add_node_with_skew(id, core, io, skew)
    }

    /// Adds node `id` with an explicit clock error; it starts now.
    pub fn add_node_with_skew(
        &mut self,
        id: impl Into<String>,
        core: R,
        io: Box<dyn IoExecutor<R>>,
        skew: Skew,
    ) -> Result<(), SimError> {
        let id = id.into();
        if self.index.contains_key(&id) {
            return Err(SimError::DuplicateNode(id));
        }
        NodeClock::check(&skew).map_err(|reason| SimError::InvalidSkew { node: id.clone(), reason })?;
        let index = u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes");
        let jitter_seed = stream_seed(self.config.seed, JITTER_STREAM ^ (u64::from(index) << 8));
        let index_of = &self.index;
        self.network.add_node(index, &id, |other| index_of.get(other).copied());
        self.index.insert(id.clone(), index);
        self.nodes.push(Node {
            id,
            live: Some(Live { core, io }),
            incarnation: 0,
            clock: NodeClock::new(skew, self.now, jitter_seed),
            busy_until: 0,
            machine: None,
            next_incoming: 0,
            incoming: FixedHashMap::default(),
            events: 0,
        });
        self.schedule(self.now, Scheduled { node: index, incarnation: 0, deferred: false, payload: Payload::Start });
        Ok(())
    }

    /// What a restart builds a node from.
    pub fn set_factory(&mut self, factory: impl FnMut(&str) -> (R, Box<dyn IoExecutor<R>>) + 'static) {
        self.factory = Some(Box::new(factory));
    }

    /// What a crash tells the harness.
    pub fn set_on_crash(&mut self, hook: impl FnMut(&str, &mut StdRng) + 'static) {
        self.on_crash = Some(Box::new(hook));
    }

    pub fn set_cost_model(&mut self, cost: impl CostModel<R> + 'static) {
        self.cost = Box::new(cost);
    }

    fn node_index(&self, id: &str) -> Result<u32, SimError> {
        self.index.get(id).copied().ok_or_else(|| SimError::UnknownNode(id.to_string()))
    }

    fn not_past(&self, at: u64) -> Result<(), SimError> {
        if at < self.now {
            return Err(SimError::InPast { at, now: self.now });
        }
        Ok(())
    }

    /// Hands `input` to node `id` at virtual time `at` (lost if the node is down then).
    pub fn input_at(&mut self, at: u64, id: &str, input: R::Input) -> Result<(), SimError> {
        let node = self.node_index(id)?;
        self.not_past(at)?;
        let payload = Payload::Input(input);
        self.schedule(at, Scheduled { node, incarnation: ANY_INCARNATION, deferred: false, payload });
        Ok(())
    }

    /// Hands `input` to node `id` now, after the events already due now.
    pub fn input(&mut self, id: &str, input: R::Input) -> Result<(), SimError> {
        self.input_at(self.now, id, input)
    }

    /// Crashes node `id` at virtual time `at` (nothing happens if it is down then).
    pub fn crash_at(&mut self, at: u64, id: &str) -> Result<(), SimError> {
        let node = self.node_index(id)?;
        self.not_past(at)?;
        self.schedule(at, Scheduled { node, incarnation: ANY_INCARNATION, deferred: false, payload: Payload::Crash });
        Ok(())
    }

    /// Restarts node `id` at virtual time `at` (nothing happens if it is up then).
    pub fn restart_at(&mut self, at: u64, id: &str) -> Result<(), SimError> {
        let node = self.node_index(id)?;
        self.not_past(at)?;
        if self.factory.is_none() {
            return Err(SimError::NoFactory(id.to_string()));
        }
        let payload = Payload::Restart;
        self.schedule(at, Scheduled { node, incarnation: ANY_INCARNATION, deferred: false, payload });
        Ok(())
    }

    /// Crashes node `id` now.
    pub fn crash(&mut self, id: &str) -> Result<(), SimError> {
        let node = self.node_index(id)?;
        if self.nodes[node as usize].live.is_none() {
            return Err(SimError::NodeDown(id.to_string()));
        }
        self.crash_node(node);
        Ok(())
    }

    /// Restarts node `id` now; its new core sees [`Event::Start`](virga_net::role::Event::Start) first.
    pub fn restart(&mut self, id: &str) -> Result<(), SimError> {
        let node = self.node_index(id)?;
        if self.nodes[node as usize].live.is_some() {
            return Err(SimError::NodeUp(id.to_string()));
        }
        if self.factory.is_none() {
            return Err(SimError::NoFactory(id.to_string()));
        }
        self.restart_node(node);
        Ok(())
    }

    /// Handles the next queued event, if any and if `max_events` allows; false otherwise.
    pub fn step_one(&mut self) -> bool {
        if self.config.max_events.is_some_and(|max| self.stats.events >= max) {
            return false;
        }
        match self.pop() {
            Some((time, scheduled)) => {
                self.handle(time, scheduled);
                true
            }
            None => false,
        }
    }

    /// Handles every event due at or before `time`, then sets the clock to `time`.
    pub fn run_until(&mut self, time: u64) -> Stop {
        let stop = self.run_while(time, |_| true);
        if stop != Stop::MaxEvents {
            self.now = self.now.max(time);
        }
        stop
    }

    /// Runs until nothing but timers is queued, or the next event is past `limit`.
    pub fn run_until_quiet(&mut self, limit: u64) -> Stop {
        loop {
            if self.is_quiet() {
                return Stop::Quiet;
            }
            match self.step_due(limit) {
                Some(stop) => return stop,
                None => continue,
            }
        }
    }

    /// Runs while `keep_going` holds (asked before every event) and events are due at or
    /// before `limit`.
    pub fn run_while(&mut self, limit: u64, mut keep_going: impl FnMut(&Self) -> bool) -> Stop {
        loop {
            if !keep_going(self) {
                return Stop::Predicate;
            }
            if let Some(stop) = self.step_due(limit) {
                return stop;
            }
        }
    }

    /// Handles the next event if it is due by `limit`; why not otherwise.
    fn step_due(&mut self, limit: u64) -> Option<Stop> {
        if self.config.max_events.is_some_and(|max| self.stats.events >= max) {
            return Some(Stop::MaxEvents);
        }
        match self.queue.peek_time() {
            Some(time) if time <= limit => {
                let (time, scheduled) = self.pop().expect("a peeked event is there");
                self.handle(time, scheduled);
                None
            }
            _ => Some(Stop::TimeLimit),
        }
    }

    /// Virtual time: nanoseconds since the simulation began.
    /// Runs node `id`'s steps on machine `machine`, which has `threads` threads (set by the
    /// first placement on it): under a cost model, a step then waits for its node to be free
    /// and for one of the machine's threads, so roles sharing a machine share its cores.
    pub fn place(&mut self, id: &str, machine: usize, threads: usize) -> Result<(), SimError> {
        let node = *self.index.get(id).ok_or_else(|| SimError::UnknownNode(id.to_string()))?;
        if threads == 0 || machine > 1 << 20 {
            return Err(SimError::InvalidConfig {
                field: "machine".into(),
                reason: format!("machine {machine} with {threads} threads"),
            });
        }
        if self.machines.len() <= machine {
            self.machines.resize(machine + 1, Vec::new());
        }
        if self.machines[machine].is_empty() {
            self.machines[machine] = vec![0; threads];
        }
        self.nodes[node as usize].machine = Some(machine);
        Ok(())
    }

    /// Changes the chance of losing and of duplicating messages from now on (a harness
    /// ends its fault phase with zeros).
    pub fn set_net_faults(&mut self, drop_probability: f64, duplicate_probability: f64) -> Result<(), SimError> {
        let mut config = self.network.config().clone();
        config.drop_probability = drop_probability;
        config.duplicate_probability = duplicate_probability;
        config.validate()?;
        self.network.set_probabilities(drop_probability, duplicate_probability);
        Ok(())
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// Events queued, including stale ones (the deadline of a call answered already, the
    /// timer of a crashed incarnation) not discarded yet.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// The core of node `id`, if it exists and is up.
    pub fn core(&self, id: &str) -> Option<&R> {
        let node = self.index.get(id)?;
        self.nodes[*node as usize].live.as_ref().map(|live| &live.core)
    }

    pub fn core_mut(&mut self, id: &str) -> Option<&mut R> {
        let node = self.index.get(id)?;
        self.nodes[*node as usize].live.as_mut().map(|live| &mut live.core)
    }

    pub fn is_up(&self, id: &str) -> Option<bool> {
        self.index.get(id).map(|node| self.nodes[*node as usize].live.is_some())
    }

    /// The node ids, in the order they were added.
    pub fn node_ids(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|node| node.id.as_str())
    }

    /// The clock error node `id` runs with.
    pub fn skew(&self, id: &str) -> Option<Skew> {
        self.index.get(id).map(|node| self.nodes[*node as usize].clock.skew())
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Events node `id`'s cores (all incarnations) have handled.
    pub fn events_of(&self, id: &str) -> Option<u64> {
        self.index.get(id).map(|node| self.nodes[*node as usize].events)
    }

    /// Messages and bytes per (sender, receiver, kind), sorted.
    pub fn traffic(&self) -> Vec<(&str, &str, &'static str, Traffic)> {
        let mut rows: Vec<_> = self
            .traffic
            .iter()
            .map(|(&(from, to, kind), &traffic)| {
                (self.nodes[from as usize].id.as_str(), self.nodes[to as usize].id.as_str(), kind, traffic)
            })
            .collect();
        rows.sort_unstable_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        rows
    }

    /// A hash of every handled event so far (time, node, event kind, message kind), crashes
    /// and restarts included: equal for two runs that did the same.
    pub fn trace_digest(&self) -> u64 {
        self.digest.value()
    }

    fn schedule(&mut self, time: u64, scheduled: Scheduled<R>) {
        if !matches!(scheduled.payload, Payload::Timer(_) | Payload::Deadline { .. }) {
            self.pending_work += 1;
        }
        self.queue.push(time, scheduled);
    }

    fn pop(&mut self) -> Option<(u64, Scheduled<R>)> {
        let (time, scheduled) = self.queue.pop()?;
        if !matches!(scheduled.payload, Payload::Timer(_) | Payload::Deadline { .. }) {
            self.pending_work -= 1;
        }
        Some((time, scheduled))
    }

    /// Nothing but timers left to come: no message, device operation, input, crash or
    /// restart queued, and no call waiting for its response.
    fn is_quiet(&self) -> bool {
        self.pending_work == 0 && self.open_calls == 0
    }

    fn crash_node(&mut self, node: u32) {
        let entry = &mut self.nodes[node as usize];
        entry.live = None;
        entry.incarnation += 1;
        entry.incoming.clear();
        entry.busy_until = self.now;
        // The node's open calls die with it (crashes are rare enough for a scan); their
        // deadlines, still queued, will find their slots moved on.
        let dying: Vec<CallRef> = self
            .calls
            .iter()
            .enumerate()
            .filter(|(_, record)| record.open && record.caller == node)
            .map(|(index, record)| CallRef { index: index as u32, generation: record.generation })
            .collect();
        for call in dying {
            self.close_call(call);
        }
        let entry = &mut self.nodes[node as usize];
        self.stats.crashes += 1;
        self.digest.record(self.now, node, Kind::Crash, None);
        if let Some(hook) = self.on_crash.as_mut() {
            hook(&entry.id, &mut self.crash_rng);
        }
    }

    fn restart_node(&mut self, node: u32) {
        let factory = self.factory.as_mut().expect("restarts are scheduled only with a factory");
        let entry = &mut self.nodes[node as usize];
        let (core, io) = factory(&entry.id);
        entry.live = Some(Live { core, io });
        entry.incarnation += 1;
        entry.next_incoming = 0;
        entry.busy_until = self.now;
        let incarnation = entry.incarnation;
        self.stats.restarts += 1;
        self.digest.record(self.now, node, Kind::Restart, None);
        self.schedule(self.now, Scheduled { node, incarnation, deferred: false, payload: Payload::Start });
    }
}
