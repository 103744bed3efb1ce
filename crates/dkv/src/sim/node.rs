//! The configuration service's roles as one [`Role`] for the simulator, which runs one role
//! type: replicas and the client that proposes commands.

use std::convert::Infallible;

use crate::Dkv;
use virga_net::role::{Command, Event, IoExecutor, Nanos, Role};

use crate::config::ConfigCommand;
use crate::service::{ConfigClient, ConfigCore, ConfigDisk, ConfigIo, ConfigIoDone};

pub enum ServiceNode {
    Replica(Box<ConfigCore>),
    Client(Box<ConfigClient>),
}

/// A node's device (the client has none).
pub enum ServiceDisk {
    Replica(Box<ConfigDisk>),
    None,
}

impl IoExecutor<ServiceNode> for ServiceDisk {
    fn execute(&mut self, op: ConfigIo) -> ConfigIoDone {
        match self {
            ServiceDisk::Replica(disk) => disk.execute(op),
            // Only replicas ask for device operations.
            ServiceDisk::None => ConfigIoDone::Appended(Ok(0)),
        }
    }
}

impl Role for ServiceNode {
    type Protocol = Dkv;
    type Io = ConfigIo;
    type IoDone = ConfigIoDone;
    type Input = Vec<ConfigCommand>;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Dkv, ConfigIoDone, Vec<ConfigCommand>>,
        out: &mut Vec<Command<Dkv, ConfigIo>>,
    ) {
        match self {
            ServiceNode::Replica(core) => {
                let event = match event {
                    Event::Input(_) => return,
                    Event::Start => Event::Start,
                    Event::Request { from, call, request } => Event::Request { from, call, request },
                    Event::Response { call, result } => Event::Response { call, result },
                    Event::Timer(timer) => Event::Timer(timer),
                    Event::IoDone { io, result } => Event::IoDone { io, result },
                };
                core.step(now, event, out);
            }
            ServiceNode::Client(client) => {
                let event: Event<Dkv, Infallible, Vec<ConfigCommand>> = match event {
                    Event::IoDone { .. } => return,
                    Event::Start => Event::Start,
                    Event::Request { from, call, request } => Event::Request { from, call, request },
                    Event::Response { call, result } => Event::Response { call, result },
                    Event::Timer(timer) => Event::Timer(timer),
                    Event::Input(commands) => Event::Input(commands),
                };
                let mut commands = Vec::new();
                client.step(now, event, &mut commands);
                out.extend(commands.into_iter().map(|command| match command {
                    Command::Call { to, call, request, deadline } => Command::Call { to, call, request, deadline },
                    Command::Reply { to, call, response } => Command::Reply { to, call, response },
                    Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
                    Command::Io { op, .. } => match op {},
                }));
            }
        }
    }
}
