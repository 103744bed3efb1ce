//! Every role of the distributed store as one [`Role`] for the simulator: configuration
//! replicas, the administrator that installs the layout, data nodes and transaction clients
//! (running programs, or running their work as interactive sessions), and KAIROS's
//! validators.

use std::convert::Infallible;

use crate::Dkv;
use virga_net::role::{Command, Event, IoExecutor, Nanos, Role};

use super::session::SessionClient;
use crate::client::{ClientInput, Program, TxnClient};
use crate::config::ConfigCommand;
use crate::kairos::ValidatorCore;
use crate::service::{ConfigClient, ConfigCore, ConfigDisk, ConfigIo, ConfigIoDone};
use crate::shard::{DataCore, DataDisk, DataIo, DataIoDone};

pub enum DkvNode {
    Config(Box<ConfigCore>),
    Admin(Box<ConfigClient>),
    Data(Box<DataCore>),
    Client(Box<TxnClient>),
    Session(Box<SessionClient>),
    Validator(Box<ValidatorCore>),
}

impl DkvNode {
    /// The transaction client of a client node, whichever way it runs its work.
    pub fn txn_client(&self) -> Option<&TxnClient> {
        match self {
            DkvNode::Client(client) => Some(client),
            DkvNode::Session(session) => Some(&session.client),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub enum DkvIo {
    Config(ConfigIo),
    Data(DataIo),
}

#[derive(Debug)]
pub enum DkvIoDone {
    Config(ConfigIoDone),
    Data(DataIoDone),
}

/// Work for a node's user: commands for the administrator, programs for a client (a
/// session client runs each as a session).
#[derive(Debug)]
pub enum DkvInput {
    Commands(Vec<ConfigCommand>),
    Programs(Vec<Program>),
}

pub enum DkvDisk {
    Config(Box<ConfigDisk>),
    Data(Box<DataDisk>),
    None,
}

impl IoExecutor<DkvNode> for DkvDisk {
    fn execute(&mut self, op: DkvIo) -> DkvIoDone {
        match (self, op) {
            (DkvDisk::Config(disk), DkvIo::Config(op)) => DkvIoDone::Config(disk.execute(op)),
            (DkvDisk::Data(disk), DkvIo::Data(op)) => DkvIoDone::Data(disk.execute(op)),
            // Each core asks only for its own device's operations.
            (_, DkvIo::Config(_)) => DkvIoDone::Config(ConfigIoDone::Appended(Ok(0))),
            (_, DkvIo::Data(_)) => DkvIoDone::Data(DataIoDone::Appended(Ok(0))),
        }
    }
}

/// One role's event, its device completion and input unwrapped, or None when it is not
/// for this role.
fn narrow<IoDone, Input>(
    event: Event<Dkv, DkvIoDone, DkvInput>,
    io_done: impl FnOnce(DkvIoDone) -> Option<IoDone>,
    input: impl FnOnce(DkvInput) -> Option<Input>,
) -> Option<Event<Dkv, IoDone, Input>> {
    Some(match event {
        Event::Start => Event::Start,
        Event::Request { from, call, request } => Event::Request { from, call, request },
        Event::Response { call, result } => Event::Response { call, result },
        Event::Timer(timer) => Event::Timer(timer),
        Event::IoDone { io, result } => Event::IoDone { io, result: io_done(result)? },
        Event::Input(work) => Event::Input(input(work)?),
    })
}

fn widen<Io>(commands: Vec<Command<Dkv, Io>>, wrap: impl Fn(Io) -> DkvIo, out: &mut Vec<Command<Dkv, DkvIo>>) {
    out.extend(commands.into_iter().map(|command| match command {
        Command::Call { to, call, request, deadline } => Command::Call { to, call, request, deadline },
        Command::Reply { to, call, response } => Command::Reply { to, call, response },
        Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
        Command::Io { io, op } => Command::Io { io, op: wrap(op) },
    }));
}

fn never(never: Infallible) -> DkvIo {
    match never {}
}

impl Role for DkvNode {
    type Protocol = Dkv;
    type Io = DkvIo;
    type IoDone = DkvIoDone;
    type Input = DkvInput;

    fn step(&mut self, now: Nanos, event: Event<Dkv, DkvIoDone, DkvInput>, out: &mut Vec<Command<Dkv, DkvIo>>) {
        let mut commands = Vec::new();
        match self {
            DkvNode::Config(core) => {
                let io_done = |done| match done {
                    DkvIoDone::Config(done) => Some(done),
                    DkvIoDone::Data(_) => None,
                };
                if let Some(event) = narrow(event, io_done, |_| None) {
                    core.step(now, event, &mut commands);
                }
                widen(commands, DkvIo::Config, out);
            }
            DkvNode::Data(core) => {
                let io_done = |done| match done {
                    DkvIoDone::Data(done) => Some(done),
                    DkvIoDone::Config(_) => None,
                };
                let mut data_commands = Vec::new();
                if let Some(event) = narrow(event, io_done, |_| None) {
                    core.step(now, event, &mut data_commands);
                }
                widen(data_commands, DkvIo::Data, out);
            }
            DkvNode::Admin(client) => {
                let input = |work| match work {
                    DkvInput::Commands(commands) => Some(commands),
                    DkvInput::Programs(_) => None,
                };
                let mut admin_commands = Vec::new();
                if let Some(event) = narrow(event, |_| None, input) {
                    client.step(now, event, &mut admin_commands);
                }
                widen(admin_commands, never, out);
            }
            DkvNode::Client(client) => {
                let input = |work| match work {
                    DkvInput::Programs(programs) => Some(ClientInput::Programs(programs)),
                    DkvInput::Commands(_) => None,
                };
                let mut client_commands = Vec::new();
                if let Some(event) = narrow(event, |_| None, input) {
                    client.step(now, event, &mut client_commands);
                }
                widen(client_commands, never, out);
            }
            DkvNode::Validator(core) => {
                let mut validator_commands = Vec::new();
                if let Some(event) = narrow(event, |_| None, |_| None) {
                    core.step(now, event, &mut validator_commands);
                }
                widen(validator_commands, never, out);
            }
            DkvNode::Session(session) => {
                let input = |work| match work {
                    DkvInput::Programs(programs) => Some(ClientInput::Programs(programs)),
                    DkvInput::Commands(_) => None,
                };
                let mut client_commands = Vec::new();
                if let Some(event) = narrow(event, |_| None, input) {
                    session.step(now, event, &mut client_commands);
                }
                widen(client_commands, never, out);
            }
        }
    }
}
