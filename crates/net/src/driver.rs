//! The tokio driver: a thin loop that runs one role's core over a [`Transport`].
//!
//! Requests reach the core through the [`Handler`] the driver hands out; the core's calls
//! go out on the transport, each bounded by its deadline; timers are tokio sleeps; device
//! operations run on the driver's [`IoExecutor`], in the loop (so a core that waits for
//! its log before acknowledging gets exactly that), except computations the executor
//! detaches ([`IoExecutor::detach`]), which run on a blocking thread and complete through
//! the mailbox. A step that may compute for long ([`Role::is_long_step`], a follower
//! re-executing an announced block) runs in `block_in_place`, so the runtime's other tasks
//! move on. An observer may read the core after every step (to publish
//! a snapshot that queries are answered from without waiting for a long step).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, watch};

use crate::role::Protocol;
use crate::role::{CallId, Command, Event, IoExecutor, Nanos, Role};
use crate::{BoxFuture, Handler, NetError, Transport, WireProtocol};

/// The requests and responses of role `R`'s protocol.
type RequestOf<R> = <<R as Role>::Protocol as Protocol>::Request;
type ResponseOf<R> = <<R as Role>::Protocol as Protocol>::Response;

enum Inbound<R: Role> {
    Request { from: String, request: RequestOf<R>, reply: oneshot::Sender<ResponseOf<R>> },
    Response { call: CallId, result: Result<ResponseOf<R>, NetError> },
    Timer(crate::role::TimerId),
    Input(R::Input),
    IoDone { io: crate::role::IoId, result: R::IoDone },
}

/// The reading of the system clock as a core sees it.
pub fn system_now() -> Nanos {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

/// A role's mailbox, made before the role runs so that its handler can be registered with
/// the transport first.
pub struct Mailbox<R: Role> {
    sender: mpsc::UnboundedSender<Inbound<R>>,
    receiver: mpsc::UnboundedReceiver<Inbound<R>>,
    observer: Option<Observer<R>>,
}

/// Reads a core after each of its steps.
pub type Observer<R> = Box<dyn Fn(&R) + Send>;

impl<R: Role> Default for Mailbox<R> {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Mailbox { sender, receiver, observer: None }
    }
}

struct MailboxHandler<R: Role> {
    sender: mpsc::UnboundedSender<Inbound<R>>,
}

impl<R: Role> Handler<R::Protocol> for MailboxHandler<R>
where
    R::Protocol: WireProtocol,
{
    fn handle(&self, from: String, request: RequestOf<R>) -> BoxFuture<ResponseOf<R>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.sender.send(Inbound::Request { from, request, reply });
        Box::pin(async move {
            if sent.is_err() {
                return R::Protocol::refusal("the role has stopped".to_string());
            }
            answer.await.unwrap_or_else(|_| R::Protocol::refusal("the role stopped before answering".to_string()))
        })
    }
}

impl<R: Role> Mailbox<R>
where
    R::Protocol: WireProtocol,
{
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `observe` with the core after every step (under the core's lock, so keep it short).
    pub fn with_observer(mut self, observe: impl Fn(&R) + Send + 'static) -> Self {
        self.observer = Some(Box::new(observe));
        self
    }

    /// What the transport calls for requests to this role.
    pub fn handler(&self) -> Arc<dyn Handler<R::Protocol>> {
        Arc::new(MailboxHandler { sender: self.sender.clone() })
    }

    /// Runs `core` as peer `id` until `shutdown` turns true.
    pub fn run<X: IoExecutor<R>>(
        self,
        id: impl Into<String>,
        core: R,
        transport: Arc<dyn Transport<R::Protocol>>,
        io: X,
        shutdown: watch::Receiver<bool>,
    ) -> Running<R> {
        self.run_shared(id, Arc::new(Mutex::new(core)), transport, io, shutdown)
    }

    /// [`Self::run`] with a core its owner keeps a handle to.
    pub fn run_shared<X: IoExecutor<R>>(
        self,
        id: impl Into<String>,
        core: Arc<Mutex<R>>,
        transport: Arc<dyn Transport<R::Protocol>>,
        io: X,
        shutdown: watch::Receiver<bool>,
    ) -> Running<R> {
        let driver = Driver {
            id: id.into(),
            core: Arc::clone(&core),
            transport,
            io,
            sender: self.sender.clone(),
            replies: HashMap::new(),
            next_incoming: 0,
            ready: VecDeque::new(),
            commands: Vec::new(),
            observer: self.observer,
        };
        let task = tokio::spawn(driver.run(self.receiver, shutdown));
        Running { core, sender: self.sender, task }
    }
}

/// A running role: its core (for reports) and a way to hand it input.
pub struct Running<R: Role> {
    core: Arc<Mutex<R>>,
    sender: mpsc::UnboundedSender<Inbound<R>>,
    task: tokio::task::JoinHandle<()>,
}

impl<R: Role> Running<R> {
    /// Reads the core between two steps.
    pub fn with_core<T>(&self, read: impl FnOnce(&R) -> T) -> T {
        read(&self.core.lock())
    }

    /// A handle that reads the core between steps, for readers that do not own the running
    /// role (a metrics exporter).
    pub fn reader(&self) -> CoreReader<R> {
        CoreReader { core: Arc::clone(&self.core) }
    }

    /// Hands the core work from its user; false once the role has stopped.
    pub fn input(&self, input: R::Input) -> bool {
        self.sender.send(Inbound::Input(input)).is_ok()
    }

    /// A handle that hands the core work, for users that do not own the running role.
    pub fn input_sender(&self) -> InputSender<R> {
        InputSender { sender: self.sender.clone() }
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the loop to end (after shutdown).
    pub async fn join(self) -> Arc<Mutex<R>> {
        if let Err(error) = self.task.await {
            tracing::error!(%error, "a role's driver panicked");
        }
        self.core
    }
}

/// Reads a running role's core between its steps (see [`Running::reader`]).
pub struct CoreReader<R> {
    core: Arc<Mutex<R>>,
}

impl<R> Clone for CoreReader<R> {
    fn clone(&self) -> Self {
        CoreReader { core: Arc::clone(&self.core) }
    }
}

impl<R> CoreReader<R> {
    pub fn with_core<T>(&self, read: impl FnOnce(&R) -> T) -> T {
        read(&self.core.lock())
    }
}

/// Hands a running role work from its user (see [`Running::input_sender`]).
pub struct InputSender<R: Role> {
    sender: mpsc::UnboundedSender<Inbound<R>>,
}

impl<R: Role> Clone for InputSender<R> {
    fn clone(&self) -> Self {
        InputSender { sender: self.sender.clone() }
    }
}

impl<R: Role> InputSender<R> {
    /// False once the role has stopped.
    pub fn send(&self, input: R::Input) -> bool {
        self.sender.send(Inbound::Input(input)).is_ok()
    }
}

struct Driver<R: Role, X> {
    id: String,
    core: Arc<Mutex<R>>,
    transport: Arc<dyn Transport<R::Protocol>>,
    io: X,
    sender: mpsc::UnboundedSender<Inbound<R>>,
    /// Answer channels of the requests the core has not answered yet.
    replies: HashMap<CallId, oneshot::Sender<ResponseOf<R>>>,
    next_incoming: u64,
    /// Events produced inside the loop (device completions), handled before the next message.
    ready: VecDeque<Event<R::Protocol, R::IoDone, R::Input>>,
    commands: Vec<Command<R::Protocol, R::Io>>,
    observer: Option<Observer<R>>,
}

impl<R: Role, X: IoExecutor<R>> Driver<R, X> {
    async fn run(mut self, mut inbox: mpsc::UnboundedReceiver<Inbound<R>>, mut shutdown: watch::Receiver<bool>) {
        self.ready.push_back(Event::Start);
        loop {
            while let Some(event) = self.ready.pop_front() {
                self.step(event);
            }
            if *shutdown.borrow() {
                break;
            }
            let inbound = tokio::select! {
                inbound = inbox.recv() => inbound,
                _ = shutdown.changed() => continue,
            };
            let Some(inbound) = inbound else { break };
            let event = match inbound {
                Inbound::Request { from, request, reply } => {
                    let call = CallId(self.next_incoming);
                    self.next_incoming += 1;
                    self.replies.insert(call, reply);
                    Event::Request { from, call, request }
                }
                Inbound::Response { call, result } => Event::Response { call, result },
                Inbound::Timer(timer) => Event::Timer(timer),
                Inbound::Input(input) => Event::Input(input),
                Inbound::IoDone { io, result } => Event::IoDone { io, result },
            };
            self.ready.push_back(event);
        }
        // Requests still unanswered are refused as their senders drop.
    }

    fn step(&mut self, event: Event<R::Protocol, R::IoDone, R::Input>) {
        let now = system_now();
        let core = Arc::clone(&self.core);
        let commands = &mut self.commands;
        let observer = self.observer.as_deref();
        let long = core.lock().is_long_step(&event);
        let step = || {
            let mut core = core.lock();
            core.step(now, event, commands);
            if let Some(observe) = observer {
                observe(&core);
            }
        };
        if long && tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(step);
        } else {
            step();
        }
        let commands = std::mem::take(&mut self.commands);
        for command in commands {
            self.execute(command);
        }
    }

    fn execute(&mut self, command: Command<R::Protocol, R::Io>) {
        match command {
            Command::Call { to, call, request, deadline } => {
                let (transport, sender, from) = (Arc::clone(&self.transport), self.sender.clone(), self.id.clone());
                tokio::spawn(async move {
                    let result = match tokio::time::timeout(deadline, transport.call(&from, &to, request)).await {
                        Ok(result) => result,
                        Err(_) => Err(NetError::DeadlineExceeded { peer: to, after: deadline }),
                    };
                    let _ = sender.send(Inbound::Response { call, result });
                });
            }
            Command::Reply { call, response, .. } => {
                if let Some(reply) = self.replies.remove(&call) {
                    let _ = reply.send(response);
                }
            }
            Command::SetTimer { timer, after } => {
                let sender = self.sender.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = sender.send(Inbound::Timer(timer));
                });
            }
            Command::Io { io, op } => match self.io.detach(op) {
                Ok(job) => {
                    let sender = self.sender.clone();
                    tokio::task::spawn_blocking(move || {
                        let result = job();
                        let _ = sender.send(Inbound::IoDone { io, result });
                    });
                }
                Err(op) => {
                    let result = self.io.execute(op);
                    self.ready.push_back(Event::IoDone { io, result });
                }
            },
        }
    }
}

/// The longest a driver waits for a peer by default: a hung peer costs a call this long.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::echo::{Answer, Ask, Echo};
    use crate::role::{Command, Event, Role, TimerId};
    use crate::InProc;

    /// Calls `peer` with a short deadline when it starts and keeps what came back; answers
    /// head requests; sets a timer on input and counts its firings.
    #[derive(Default)]
    struct Probe {
        peer: String,
        results: Vec<Result<Answer, NetError>>,
        fired: Vec<TimerId>,
    }

    impl Role for Probe {
        type Protocol = Echo;
        type Io = std::convert::Infallible;
        type IoDone = std::convert::Infallible;
        type Input = u64;

        fn step(&mut self, _now: Nanos, event: Event<Echo, Self::IoDone, u64>, out: &mut Vec<Command<Echo, Self::Io>>) {
            match event {
                Event::Start => out.push(Command::Call {
                    to: self.peer.clone(),
                    call: CallId(1),
                    request: Ask::Head,
                    deadline: Duration::from_millis(50),
                }),
                Event::Response { result, .. } => self.results.push(result),
                Event::Request { from, call, .. } => {
                    out.push(Command::Reply { to: from, call, response: Answer::Head(Vec::new()) })
                }
                Event::Input(timer) => {
                    out.push(Command::SetTimer { timer: TimerId(timer), after: Duration::from_millis(1) })
                }
                Event::Timer(timer) => self.fired.push(timer),
                Event::IoDone { result, .. } => match result {},
            }
        }
    }

    /// A peer that never answers.
    struct Hung;

    impl Handler<Echo> for Hung {
        fn handle(&self, _: String, _: Ask) -> BoxFuture<Answer> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_to_a_hung_peer_ends_at_its_deadline_and_the_role_keeps_serving() {
        let transport = InProc::new();
        transport.register("hung", Arc::new(Hung));
        let mailbox = Mailbox::<Probe>::new();
        transport.register("probe", mailbox.handler());
        let (stop, stopped) = watch::channel(false);
        let probe = Probe { peer: "hung".into(), ..Probe::default() };
        let running = mailbox.run("probe", probe, Arc::clone(&transport) as _, crate::role::NoIo, stopped);
        // The role answers others while its own call hangs.
        let answer = Transport::<Echo>::call(&*transport, "other", "probe", Ask::Head);
        assert!(matches!(answer.await, Ok(Answer::Head(_))));
        assert!(running.input(7));
        tokio::time::sleep(Duration::from_millis(300)).await;
        running.with_core(|probe| {
            assert!(
                matches!(probe.results.as_slice(), [Err(NetError::DeadlineExceeded { peer, .. })] if peer == "hung"),
                "{:?}",
                probe.results
            );
            assert_eq!(probe.fired, [TimerId(7)]);
        });
        let _ = stop.send(true);
        running.join().await;
    }

    /// A health role: pings its peer when it starts and keeps the answers, and answers pings
    /// itself as `watcher-0`.
    #[derive(Default)]
    struct Watcher {
        peer: String,
        pongs: Vec<Result<crate::health::Response, NetError>>,
    }

    impl Role for Watcher {
        type Protocol = crate::health::Health;
        type Io = std::convert::Infallible;
        type IoDone = std::convert::Infallible;
        type Input = ();

        fn step(
            &mut self,
            _now: Nanos,
            event: Event<Self::Protocol, Self::IoDone, ()>,
            out: &mut Vec<Command<Self::Protocol, Self::Io>>,
        ) {
            use crate::health::{Ping, Pong, Request, Response, ResponseBody};
            match event {
                Event::Start => out.push(Command::Call {
                    to: self.peer.clone(),
                    call: CallId(0),
                    request: Request { body: Some(crate::health::RequestBody::Ping(Ping {})) },
                    deadline: Duration::from_secs(5),
                }),
                Event::Response { result, .. } => self.pongs.push(result),
                Event::Request { from, call, .. } => {
                    let pong = Pong { node: "watcher-0".into(), role: "watcher".into(), version: String::new() };
                    out.push(Command::Reply {
                        to: from,
                        call,
                        response: Response { body: Some(ResponseBody::Pong(pong)) },
                    })
                }
                Event::Timer(_) | Event::Input(()) => {}
                Event::IoDone { result, .. } => match result {},
            }
        }
    }

    #[tokio::test]
    async fn the_driver_runs_a_role_of_another_protocol() {
        let transport = InProc::new();
        transport.register::<crate::health::Health>("storage-0", Arc::new(crate::health::Responder::new("storage-0")));
        let mailbox = Mailbox::<Watcher>::new();
        transport.register("watcher-0", mailbox.handler());
        let (stop, stopped) = watch::channel(false);
        let watcher = Watcher { peer: "storage-0".into(), ..Watcher::default() };
        let running = mailbox.run("watcher-0", watcher, Arc::clone(&transport) as _, crate::role::NoIo, stopped);
        let pong = crate::health::ping(&*transport, "client-0", "watcher-0").await.unwrap();
        assert_eq!(pong.node, "watcher-0");
        // The watcher hosts health only: an echo call finds it up but not serving echo.
        let echo = Transport::<Echo>::call(&*transport, "client-0", "watcher-0", Ask::Head);
        assert!(matches!(echo.await, Err(NetError::NotHosted { protocol: "echo", .. })));
        for _ in 0..100 {
            if running.with_core(|watcher| !watcher.pongs.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        running.with_core(|watcher| {
            let [Ok(crate::health::Response { body: Some(crate::health::ResponseBody::Pong(pong)) })] =
                watcher.pongs.as_slice()
            else {
                panic!("{:?}", watcher.pongs)
            };
            assert_eq!(pong.node, "storage-0");
        });
        let _ = stop.send(true);
        running.join().await;
    }
}
