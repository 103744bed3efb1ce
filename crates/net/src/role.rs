//! The shape of every protocol role: a core that turns events into commands.
//!
//! A role's core is a state machine with no clock read, socket, thread, sleep or fsync of
//! its own. A driver feeds it [`Event`]s (a request or a response arrived, a timer fired,
//! a device operation finished, an input from the role's user) together with the local
//! clock's reading, and carries out the [`Command`]s it emits (call a peer with a deadline,
//! reply, set a timer, do a device operation). The same core runs under the tokio driver
//! ([`crate::driver`]) over the in-process or gRPC transport, and under the deterministic
//! simulator (crate `virga-sim`) in virtual time.

use std::time::Duration;

use crate::NetError;

/// A clock reading: nanoseconds since the Unix epoch on the node's own (possibly skewed)
/// clock. Real drivers read the system clock; the simulator derives it from virtual time.
pub type Nanos = u64;

/// Names one call a core made, so that its response comes back to it. A core numbers its
/// own calls; the driver numbers incoming requests (their [`CallId`]s name the reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// Names one timer of a core; a timer fires once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// Names one device operation of a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoId(pub u64);

/// The messages of one protocol: what a caller sends and what it gets back.
pub trait Protocol: 'static {
    type Request: Clone + Send + std::fmt::Debug + 'static;
    type Response: Clone + Send + std::fmt::Debug + 'static;

    /// The request's kind, for per-kind traffic counts (`witness`, `submit`, …).
    fn request_kind(request: &Self::Request) -> &'static str;
    /// The response's kind.
    fn response_kind(response: &Self::Response) -> &'static str;
    /// Bytes the message takes on the wire (the gRPC transport's encoded length).
    fn request_bytes(request: &Self::Request) -> usize;
    fn response_bytes(response: &Self::Response) -> usize;
    /// The reason, when `response` is the protocol's refusal of a request.
    fn refusal_reason(response: &Self::Response) -> Option<&str>;
    /// What the caller's core receives for `response` from `peer`: a refusal becomes
    /// [`NetError::Refused`], as every transport reports it.
    fn check(peer: &str, response: Self::Response) -> Result<Self::Response, NetError> {
        match Self::refusal_reason(&response) {
            Some(reason) => Err(NetError::Refused { peer: peer.to_string(), reason: reason.to_string() }),
            None => Ok(response),
        }
    }
}

/// What happens to a core.
#[derive(Debug)]
pub enum Event<P: Protocol, IoDone, Input> {
    /// The core has just been created (or restarted after a crash): the first event it sees.
    Start,
    /// Peer `from` asks something; the core answers with [`Command::Reply`] naming `call`.
    Request { from: String, call: CallId, request: P::Request },
    /// The answer to the core's call `call`: the peer's response, or why there is none
    /// (unreachable, refused, or no answer within the call's deadline).
    Response { call: CallId, result: Result<P::Response, NetError> },
    /// Timer `timer` fired.
    Timer(TimerId),
    /// Device operation `io` finished.
    IoDone { io: IoId, result: IoDone },
    /// Work from the role's own user (a client's transfers to submit).
    Input(Input),
}

/// What a core asks its driver to do.
#[derive(Debug)]
pub enum Command<P: Protocol, Io> {
    /// Send `request` to peer `to`. Exactly one [`Event::Response`] for `call` follows: the
    /// answer, or [`NetError::DeadlineExceeded`] once `deadline` has passed without one.
    Call { to: String, call: CallId, request: P::Request, deadline: Duration },
    /// Answer the request `call` of peer `to`.
    Reply { to: String, call: CallId, response: P::Response },
    /// Fire [`Event::Timer`] after `after`.
    SetTimer { timer: TimerId, after: Duration },
    /// Do a device operation; [`Event::IoDone`] follows with its result.
    Io { io: IoId, op: Io },
}

/// A protocol role's core.
pub trait Role: Send + 'static {
    type Protocol: Protocol;
    /// Device operations the core asks for, and their results.
    type Io: Send + std::fmt::Debug + 'static;
    type IoDone: Send + std::fmt::Debug + 'static;
    /// Work the role's user hands it (use `()` when there is none).
    type Input: Send + std::fmt::Debug + 'static;

    /// Whether handling `event` may compute for long (a follower re-executing a block). The
    /// tokio driver runs such a step in `block_in_place`, which hands the worker thread's
    /// other tasks to another thread: worth it for a long step, a thread switch (and, under load,
    /// new threads) wasted on a short one. By default no step is long.
    fn is_long_step(&self, event: &Event<Self::Protocol, Self::IoDone, Self::Input>) -> bool {
        let _ = event;
        false
    }

    /// Handles one event at local time `now`, appending what it wants done to `out`.
    fn step(
        &mut self,
        now: Nanos,
        event: Event<Self::Protocol, Self::IoDone, Self::Input>,
        out: &mut Vec<Command<Self::Protocol, Self::Io>>,
    );
}

/// Carries out a role's device operations (a driver's disk). The same executor code runs
/// on files in a real driver and on the simulator's memory devices.
pub trait IoExecutor<R: Role>: Send + 'static {
    fn execute(&mut self, op: R::Io) -> R::IoDone;

    /// An operation that computes for long and needs nothing of the executor (a miner's
    /// block to build) comes back as a job to run on a thread of its own, so that the
    /// core's other events (a storage node's acknowledgement) are not held up behind it;
    /// any other operation comes back unchanged and runs in the driver's loop. Under the
    /// simulator every operation runs in its loop at its completion time.
    fn detach(&mut self, op: R::Io) -> Result<Detached<R::IoDone>, R::Io> {
        Err(op)
    }
}

/// A device operation's work, moved off the driver's loop ([`IoExecutor::detach`]).
pub type Detached<Done> = Box<dyn FnOnce() -> Done + Send>;

/// A role with no device: its executor is never called.
pub struct NoIo;

impl<R: Role<Io = std::convert::Infallible>> IoExecutor<R> for NoIo {
    fn execute(&mut self, op: R::Io) -> R::IoDone {
        match op {}
    }
}

/// Hands out a core's call, timer and device-operation ids, each kind counting from 0.
#[derive(Clone, Debug, Default)]
pub struct Ids {
    next_call: u64,
    next_timer: u64,
    next_io: u64,
}

impl Ids {
    pub fn call(&mut self) -> CallId {
        self.next_call += 1;
        CallId(self.next_call - 1)
    }

    pub fn timer(&mut self) -> TimerId {
        self.next_timer += 1;
        TimerId(self.next_timer - 1)
    }

    pub fn io(&mut self) -> IoId {
        self.next_io += 1;
        IoId(self.next_io - 1)
    }
}
