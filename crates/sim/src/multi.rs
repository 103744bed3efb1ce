//! One role type for a system of several roles. The simulator runs nodes of a single role
//! type, while a system's roles each have their own device operations, completions and
//! inputs. A [`MultiRole`] holds any one of a system's roles together with its [`Fit`]: how
//! the node's device completions and inputs narrow to the role's own (those that are not its
//! own are dropped, which is what a role that never asked for them expects) and how its
//! device operations widen to the node's. A harness reaches the role inside with
//! [`MultiRole::role`].

use std::any::Any;

use virga_net::role::{Command, Event, Nanos, Protocol, Role};

/// How role `R`'s own types sit among the node's.
pub struct Fit<R: Role, Io, IoDone, Input> {
    /// The role's completion in a node's, or `None` when it is another role's.
    pub io_done: fn(IoDone) -> Option<R::IoDone>,
    /// The role's input in a node's, or `None` when it is another role's.
    pub input: fn(Input) -> Option<R::Input>,
    /// The node's device operation for one of the role's.
    pub io: fn(R::Io) -> Io,
}

impl<R: Role, Io, IoDone, Input> Fit<R, Io, IoDone, Input> {
    /// The fit of a role that has no device and takes no input of the node's.
    pub fn plain() -> Fit<R, Io, IoDone, Input>
    where
        R: Role<Io = std::convert::Infallible>,
    {
        Fit { io_done: |_| None, input: |_| None, io: |never| match never {} }
    }
}

/// The object-safe face of a fitted role.
trait Member<P: Protocol, Io, IoDone, Input>: Send {
    fn step(&mut self, now: Nanos, event: Event<P, IoDone, Input>, out: &mut Vec<Command<P, Io>>);
    fn is_long_step(&self, event: &Event<P, IoDone, Input>) -> bool;
    fn role(&self) -> &dyn Any;
    fn role_mut(&mut self) -> &mut dyn Any;
}

struct Fitted<R: Role, Io, IoDone, Input> {
    role: R,
    fit: Fit<R, Io, IoDone, Input>,
    /// The role's commands of one step, kept to reuse the allocation.
    commands: Vec<Command<R::Protocol, R::Io>>,
}

impl<R, Io, IoDone, Input> Member<R::Protocol, Io, IoDone, Input> for Fitted<R, Io, IoDone, Input>
where
    R: Role,
    Io: Send + 'static,
    IoDone: Send + 'static,
    Input: Send + 'static,
{
    fn step(&mut self, now: Nanos, event: Event<R::Protocol, IoDone, Input>, out: &mut Vec<Command<R::Protocol, Io>>) {
        let Some(event) = narrow(event, self.fit.io_done, self.fit.input) else { return };
        self.role.step(now, event, &mut self.commands);
        let io = self.fit.io;
        out.extend(self.commands.drain(..).map(|command| widen(command, io)));
    }

    /// The role is asked about the events it can be shown by reference or by a copy of
    /// a request; a device completion or input of the node's would have to be narrowed by
    /// value, and the simulator, which runs every step in virtual time, never asks.
    fn is_long_step(&self, event: &Event<R::Protocol, IoDone, Input>) -> bool {
        let own = match event {
            Event::Start => Event::Start,
            Event::Timer(timer) => Event::Timer(*timer),
            Event::Request { from, call, request } => {
                Event::Request { from: from.clone(), call: *call, request: request.clone() }
            }
            Event::Response { .. } | Event::IoDone { .. } | Event::Input(_) => return false,
        };
        self.role.is_long_step(&own)
    }

    fn role(&self) -> &dyn Any {
        &self.role
    }

    fn role_mut(&mut self) -> &mut dyn Any {
        &mut self.role
    }
}

fn narrow<P: Protocol, IoDone, Input, OwnDone, OwnInput>(
    event: Event<P, IoDone, Input>,
    io_done: fn(IoDone) -> Option<OwnDone>,
    input: fn(Input) -> Option<OwnInput>,
) -> Option<Event<P, OwnDone, OwnInput>> {
    Some(match event {
        Event::Start => Event::Start,
        Event::Request { from, call, request } => Event::Request { from, call, request },
        Event::Response { call, result } => Event::Response { call, result },
        Event::Timer(timer) => Event::Timer(timer),
        Event::IoDone { io, result } => Event::IoDone { io, result: io_done(result)? },
        Event::Input(work) => Event::Input(input(work)?),
    })
}

fn widen<P: Protocol, OwnIo, Io>(command: Command<P, OwnIo>, io: fn(OwnIo) -> Io) -> Command<P, Io> {
    match command {
        Command::Call { to, call, request, deadline } => Command::Call { to, call, request, deadline },
        Command::Reply { to, call, response } => Command::Reply { to, call, response },
        Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
        Command::Io { io: id, op } => Command::Io { io: id, op: io(op) },
    }
}

/// Any one of a system's roles, as one role type of protocol `P` whose device operations,
/// completions and inputs are `Io`, `IoDone` and `Input`.
pub struct MultiRole<P: Protocol, Io, IoDone, Input> {
    member: Box<dyn Member<P, Io, IoDone, Input>>,
}

impl<P, Io, IoDone, Input> MultiRole<P, Io, IoDone, Input>
where
    P: Protocol,
    Io: Send + 'static,
    IoDone: Send + 'static,
    Input: Send + 'static,
{
    pub fn new<R: Role<Protocol = P>>(role: R, fit: Fit<R, Io, IoDone, Input>) -> Self {
        MultiRole { member: Box::new(Fitted { role, fit, commands: Vec::new() }) }
    }

    /// The role inside, if it is an `R`.
    pub fn role<R: Role>(&self) -> Option<&R> {
        self.member.role().downcast_ref()
    }

    pub fn role_mut<R: Role>(&mut self) -> Option<&mut R> {
        self.member.role_mut().downcast_mut()
    }
}

impl<P, Io, IoDone, Input> Role for MultiRole<P, Io, IoDone, Input>
where
    P: Protocol,
    Io: Send + std::fmt::Debug + 'static,
    IoDone: Send + std::fmt::Debug + 'static,
    Input: Send + std::fmt::Debug + 'static,
{
    type Protocol = P;
    type Io = Io;
    type IoDone = IoDone;
    type Input = Input;

    fn is_long_step(&self, event: &Event<P, IoDone, Input>) -> bool {
        self.member.is_long_step(event)
    }

    fn step(&mut self, now: Nanos, event: Event<P, IoDone, Input>, out: &mut Vec<Command<P, Io>>) {
        self.member.step(now, event, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use virga_net::role::{IoId, TimerId};

    /// A protocol of text messages.
    #[derive(Clone, Copy, Debug)]
    struct Text;

    impl Protocol for Text {
        type Request = String;
        type Response = String;

        fn request_kind(_: &String) -> &'static str {
            "text"
        }

        fn response_kind(_: &String) -> &'static str {
            "text"
        }

        fn request_bytes(request: &String) -> usize {
            request.len()
        }

        fn response_bytes(response: &String) -> usize {
            response.len()
        }

        fn refusal_reason(_: &String) -> Option<&str> {
            None
        }
    }

    /// A role with a device: it writes each input it is handed and counts completions.
    #[derive(Default)]
    struct Writer {
        done: Vec<u32>,
    }

    impl Role for Writer {
        type Protocol = Text;
        type Io = u32;
        type IoDone = u32;
        type Input = u32;

        fn step(&mut self, _: Nanos, event: Event<Text, u32, u32>, out: &mut Vec<Command<Text, u32>>) {
            match event {
                Event::Input(value) => out.push(Command::Io { io: IoId(u64::from(value)), op: value }),
                Event::IoDone { result, .. } => self.done.push(result),
                _ => out.push(Command::SetTimer { timer: TimerId(1), after: Duration::from_millis(1) }),
            }
        }
    }

    /// A role without a device that answers every request.
    struct Echo;

    impl Role for Echo {
        type Protocol = Text;
        type Io = std::convert::Infallible;
        type IoDone = std::convert::Infallible;
        type Input = ();

        fn step(&mut self, _: Nanos, event: Event<Text, Self::IoDone, ()>, out: &mut Vec<Command<Text, Self::Io>>) {
            if let Event::Request { from, call, request } = event {
                out.push(Command::Reply { to: from, call, response: request });
            }
        }
    }

    #[derive(Debug, PartialEq)]
    enum NodeIo {
        Write(u32),
    }

    #[derive(Debug)]
    enum NodeDone {
        Written(u32),
        Other,
    }

    type Node = MultiRole<Text, NodeIo, NodeDone, Option<u32>>;

    fn writer() -> Node {
        let fit = Fit::<Writer, NodeIo, NodeDone, Option<u32>> {
            io_done: |done| match done {
                NodeDone::Written(value) => Some(value),
                NodeDone::Other => None,
            },
            input: |input| input,
            io: NodeIo::Write,
        };
        MultiRole::new(Writer::default(), fit)
    }

    #[test]
    fn a_role_sees_its_own_events_and_its_commands_are_widened() {
        let mut node = writer();
        let mut out = Vec::new();
        node.step(0, Event::Input(Some(7)), &mut out);
        assert!(matches!(out.as_slice(), [Command::Io { io: IoId(7), op: NodeIo::Write(7) }]), "{out:?}");
        node.step(0, Event::IoDone { io: IoId(7), result: NodeDone::Written(7) }, &mut Vec::new());
        // Another role's completion and an input that is not this role's are dropped.
        node.step(0, Event::IoDone { io: IoId(8), result: NodeDone::Other }, &mut Vec::new());
        let mut dropped = Vec::new();
        node.step(0, Event::Input(None), &mut dropped);
        assert!(dropped.is_empty(), "{dropped:?}");
        assert_eq!(node.role::<Writer>().map(|writer| writer.done.clone()), Some(vec![7]));
        assert!(node.role::<Echo>().is_none(), "the node holds a writer, not an echo");
    }

    #[test]
    fn a_role_without_a_device_answers_through_the_node() {
        let mut node: Node = MultiRole::new(Echo, Fit::plain());
        let mut out = Vec::new();
        let call = virga_net::role::CallId(3);
        node.step(0, Event::Request { from: "peer".into(), call, request: "hi".into() }, &mut out);
        assert!(matches!(out.as_slice(), [Command::Reply { response, .. }] if response == "hi"), "{out:?}");
        assert!(node.role_mut::<Echo>().is_some());
    }
}
