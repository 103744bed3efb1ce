//! The hot path: turning a queued event into a core's step, and the step's commands into
//! queued events.

use std::time::Duration;

use virga_net::role::{CallId, Command, Event, Protocol, Role};
use virga_net::NetError;

use crate::network::Route;
use crate::stats::Kind;
use crate::{CallRecord, CallRef, Incoming, Payload, Scheduled, Sim, ANY_INCARNATION};

impl<R: Role> Sim<R> {
    /// Handles one queued event at virtual time `time`.
    pub(crate) fn handle(&mut self, time: u64, scheduled: Scheduled<R>) {
        self.now = time;
        let node = scheduled.node;
        match scheduled.payload {
            Payload::Crash => {
                if self.nodes[node as usize].live.is_some() {
                    self.crash_node(node);
                }
                return;
            }
            Payload::Restart => {
                if self.nodes[node as usize].live.is_none() {
                    self.restart_node(node);
                }
                return;
            }
            _ => {}
        }
        let entry = &self.nodes[node as usize];
        let current = scheduled.incarnation == ANY_INCARNATION || scheduled.incarnation == entry.incarnation;
        if !current || entry.live.is_none() {
            self.discard(scheduled);
            return;
        }
        if !scheduled.deferred && self.cut_on_arrival(&scheduled, time) {
            self.stats.cut += 1;
            return;
        }
        // Free when the node is, and (when placed) one of its machine's threads is.
        let thread_free = entry.machine.and_then(|m| self.machines[m].iter().min().copied()).unwrap_or(0);
        let free = entry.busy_until.max(thread_free);
        if free > time {
            self.stats.deferred += 1;
            self.schedule(free, Scheduled { deferred: true, ..scheduled });
            return;
        }
        let Some((event, kind, message)) = self.event_for(node, scheduled.payload) else { return };
        self.step_core(time, node, event, kind, message);
    }

    /// Accounts for an event whose node crashed (or is down) since it was queued.
    fn discard(&mut self, scheduled: Scheduled<R>) {
        match scheduled.payload {
            Payload::Request { .. } | Payload::Reply { .. } => self.stats.lost_to_crash += 1,
            // The crash closed the call already.
            Payload::Deadline { .. } => {}
            Payload::Input(_) => self.stats.inputs_lost += 1,
            _ => self.stats.stale_events += 1,
        }
    }

    fn cut_on_arrival(&self, scheduled: &Scheduled<R>, time: u64) -> bool {
        match scheduled.payload {
            Payload::Request { from, .. } | Payload::Reply { from, .. } => {
                self.network.is_cut(from, scheduled.node, time)
            }
            _ => false,
        }
    }

    /// The event a core sees for `payload`, with its kind and message kind for the digest;
    /// `None` when the payload turns out to be moot (a response to a call already answered).
    #[allow(clippy::type_complexity)]
    fn event_for(
        &mut self,
        node: u32,
        payload: Payload<R>,
    ) -> Option<(crate::RoleEvent<R>, Kind, Option<&'static str>)> {
        Some(match payload {
            Payload::Start => (Event::Start, Kind::Start, None),
            Payload::Request { call, from, from_incarnation: caller_incarnation, request } => {
                self.stats.messages_delivered += 1;
                let entry = &mut self.nodes[node as usize];
                let incoming = CallId(entry.next_incoming);
                entry.next_incoming += 1;
                entry.incoming.insert(incoming.0, Incoming { call, caller: from, caller_incarnation });
                let kind = <R::Protocol as Protocol>::request_kind(&request);
                let from = self.nodes[from as usize].id.clone();
                (Event::Request { from, call: incoming, request }, Kind::Request, Some(kind))
            }
            Payload::Reply { call, from, response } => {
                self.stats.messages_delivered += 1;
                let record = &self.calls[call.index as usize];
                if record.generation != call.generation || !record.open {
                    self.stats.late_responses += 1;
                    return None;
                }
                let caller_call = record.call;
                self.close_call(call);
                let kind = <R::Protocol as Protocol>::response_kind(&response);
                let result = <R::Protocol as Protocol>::check(&self.nodes[from as usize].id, response);
                let event_kind = if result.is_ok() { Kind::Response } else { Kind::ResponseError };
                (Event::Response { call: caller_call, result }, event_kind, Some(kind))
            }
            Payload::Deadline { call } => {
                let record = &self.calls[call.index as usize];
                if record.generation != call.generation {
                    // Answered already; the slot has moved on.
                    return None;
                }
                let (caller_call, peer, after) =
                    (record.call, self.nodes[record.callee as usize].id.clone(), record.deadline);
                self.close_call(call);
                self.stats.deadlines_exceeded += 1;
                let result = Err(NetError::DeadlineExceeded { peer, after });
                (Event::Response { call: caller_call, result }, Kind::ResponseError, None)
            }
            Payload::Failed { call, error } => {
                (Event::Response { call, result: Err(error) }, Kind::ResponseError, None)
            }
            Payload::Timer(timer) => (Event::Timer(timer), Kind::Timer, None),
            Payload::Io { io, op } => {
                let live = self.nodes[node as usize].live.as_mut()?;
                let result = live.io.execute(op);
                (Event::IoDone { io, result }, Kind::IoDone, None)
            }
            Payload::Input(input) => (Event::Input(input), Kind::Input, None),
            Payload::Crash | Payload::Restart => unreachable!("control events are handled before"),
        })
    }

    fn step_core(
        &mut self,
        time: u64,
        node: u32,
        event: crate::RoleEvent<R>,
        kind: Kind,
        message: Option<&'static str>,
    ) {
        let mut commands = std::mem::take(&mut self.commands);
        let entry = &mut self.nodes[node as usize];
        let cost = self.cost.step_cost(&entry.id, &event);
        let local = entry.clock.read(time);
        let live = entry.live.as_mut().expect("only live nodes step");
        live.core.step(local, event, &mut commands);
        entry.events += 1;
        let done = time.saturating_add(cost);
        entry.busy_until = done;
        if let Some(threads) = entry.machine.and_then(|m| self.machines.get_mut(m)) {
            if let Some(thread) = threads.iter_mut().min() {
                *thread = done;
            }
        }
        self.stats.events += 1;
        self.digest.record(time, node, kind, message);
        for command in commands.drain(..) {
            self.execute(done, node, command);
        }
        self.commands = commands;
    }

    /// Carries out one command node `node` emitted at the end of a step, at `time`.
    fn execute(&mut self, time: u64, node: u32, command: Command<R::Protocol, R::Io>) {
        let incarnation = self.nodes[node as usize].incarnation;
        match command {
            Command::Call { to, call, request, deadline } => self.call(time, node, to, call, request, deadline),
            Command::Reply { call, response, .. } => {
                // A reply to a request the core was never handed, or answered before, goes nowhere.
                let Some(incoming) = self.nodes[node as usize].incoming.remove(&call.0) else { return };
                let kind = <R::Protocol as Protocol>::response_kind(&response);
                let bytes = <R::Protocol as Protocol>::response_bytes(&response);
                let (to, to_incarnation) = (incoming.caller, incoming.caller_incarnation);
                self.send(time, node, to, to_incarnation, kind, bytes, response, |response| Payload::Reply {
                    call: incoming.call,
                    from: node,
                    response,
                });
            }
            Command::SetTimer { timer, after } => {
                let at = time.saturating_add(duration_ns(after));
                self.schedule(at, Scheduled { node, incarnation, deferred: false, payload: Payload::Timer(timer) });
            }
            Command::Io { io, op } => {
                let entry = &self.nodes[node as usize];
                let (machine, compute) = (entry.machine, self.cost.io_compute_cost(&entry.id, &op));
                let latency = duration_ns(self.config.device_latency).saturating_add(self.cost.io_cost(&entry.id, &op));
                let computed = self.compute(time, machine, compute);
                let payload = Payload::Io { io, op };
                self.schedule(
                    computed.saturating_add(latency),
                    Scheduled { node, incarnation, deferred: false, payload },
                );
            }
        }
    }

    /// When `cost` of computation handed out at `time` is done: on the machine's thread that
    /// is free first, which it then holds (no thread is modelled for an unplaced node).
    fn compute(&mut self, time: u64, machine: Option<usize>, cost: u64) -> u64 {
        if cost == 0 {
            return time;
        }
        let Some(thread) = machine.and_then(|m| self.machines.get_mut(m)).and_then(|threads| threads.iter_mut().min())
        else {
            return time.saturating_add(cost);
        };
        let done = time.max(*thread).saturating_add(cost);
        *thread = done;
        done
    }

    fn call(&mut self, time: u64, node: u32, to: String, call: CallId, request: crate::Request<R>, deadline: Duration) {
        let incarnation = self.nodes[node as usize].incarnation;
        let Some(&callee) = self.index.get(&to) else {
            self.stats.unknown_peers += 1;
            let payload = Payload::Failed { call, error: NetError::UnknownPeer(to) };
            self.schedule(time, Scheduled { node, incarnation, deferred: false, payload });
            return;
        };
        let record = CallRecord { generation: 0, open: true, caller: node, callee, call, deadline };
        let reference = self.open_call(record);
        let at = time.saturating_add(duration_ns(deadline));
        let payload = Payload::Deadline { call: reference };
        self.schedule(at, Scheduled { node, incarnation, deferred: false, payload });
        let kind = <R::Protocol as Protocol>::request_kind(&request);
        let bytes = <R::Protocol as Protocol>::request_bytes(&request);
        let callee_incarnation = self.nodes[callee as usize].incarnation;
        self.send(time, node, callee, callee_incarnation, kind, bytes, request, |request| Payload::Request {
            call: reference,
            from: node,
            from_incarnation: incarnation,
            request,
        });
    }

    /// Puts one message on the network: counted, then lost, cut, or queued for arrival
    /// (twice if duplicated).
    #[allow(clippy::too_many_arguments)]
    fn send<M: Clone>(
        &mut self,
        time: u64,
        from: u32,
        to: u32,
        to_incarnation: u32,
        kind: &'static str,
        bytes: usize,
        message: M,
        wrap: impl Fn(M) -> Payload<R>,
    ) {
        self.stats.messages_sent += 1;
        let traffic = self.traffic.entry((from, to, kind)).or_default();
        traffic.messages += 1;
        traffic.bytes += bytes as u64;
        let receiver = &self.nodes[to as usize];
        if receiver.live.is_none() || receiver.incarnation != to_incarnation {
            self.stats.lost_to_crash += 1;
            return;
        }
        match self.network.route(from, to, time, bytes) {
            Route::Dropped => self.stats.dropped += 1,
            Route::Cut => self.stats.cut += 1,
            Route::Arrives { first, copy } => {
                if let Some(copy) = copy {
                    self.stats.duplicated += 1;
                    let payload = wrap(message.clone());
                    self.schedule(copy, Scheduled { node: to, incarnation: to_incarnation, deferred: false, payload });
                }
                let payload = wrap(message);
                self.schedule(first, Scheduled { node: to, incarnation: to_incarnation, deferred: false, payload });
            }
        }
    }

    fn open_call(&mut self, mut record: CallRecord) -> CallRef {
        self.open_calls += 1;
        match self.free_calls.pop() {
            Some(index) => {
                let slot = &mut self.calls[index as usize];
                record.generation = slot.generation;
                *slot = record;
                CallRef { index, generation: slot.generation }
            }
            None => {
                let index = u32::try_from(self.calls.len()).expect("fewer than 2^32 calls open at once");
                self.calls.push(record);
                CallRef { index, generation: 0 }
            }
        }
    }

    /// The call has had its response: its slot goes to the next call, and whatever still
    /// refers to it (the deadline, a duplicate reply) finds another generation there.
    pub(crate) fn close_call(&mut self, call: CallRef) {
        self.open_calls -= 1;
        let slot = &mut self.calls[call.index as usize];
        slot.open = false;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_calls.push(call.index);
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
