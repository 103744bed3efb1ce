//! RainBlock's three roles as one [`Role`] for the simulator, which runs one role type.

use crate::protocol::Rainblock;
use virga_net::role::{Command, Event, IoExecutor, Nanos, Role};

use crate::client::{ClientCore, UserTransfer};
use crate::miner::{ChainDisk, ChainDiskError, MinerCore, MinerIo, MinerIoDone};
use crate::storage::{StorageCore, StorageDisk, StorageIo, StorageIoDone};

pub enum RainblockNode {
    Storage(Box<StorageCore>),
    Miner(Box<MinerCore>),
    Client(Box<ClientCore>),
}

#[derive(Debug)]
pub enum NodeIo {
    Storage(StorageIo),
    Miner(MinerIo),
}

#[derive(Debug)]
pub enum NodeIoDone {
    Storage(StorageIoDone),
    Miner(MinerIoDone),
}

/// A node's device (clients have none).
pub enum NodeDisk {
    Storage(StorageDisk),
    Miner(ChainDisk),
    None,
}

impl IoExecutor<RainblockNode> for NodeDisk {
    fn execute(&mut self, op: NodeIo) -> NodeIoDone {
        match (self, op) {
            (NodeDisk::Storage(disk), NodeIo::Storage(op)) => NodeIoDone::Storage(disk.execute(op)),
            (NodeDisk::Miner(disk), NodeIo::Miner(op)) => NodeIoDone::Miner(disk.execute(op)),
            (_, op) => {
                NodeIoDone::Miner(MinerIoDone::Stored(Err(ChainDiskError::WrongDevice { op: format!("{op:?}") })))
            }
        }
    }
}

/// The event of one role, from the wrapped event (its device completion unwrapped), or
/// `None` when it is not for this role.
fn narrow<IoDone, Input>(
    event: Event<Rainblock, NodeIoDone, Vec<UserTransfer>>,
    io_done: impl FnOnce(NodeIoDone) -> Option<IoDone>,
    input: impl FnOnce(Vec<UserTransfer>) -> Option<Input>,
) -> Option<Event<Rainblock, IoDone, Input>> {
    Some(match event {
        Event::Start => Event::Start,
        Event::Request { from, call, request } => Event::Request { from, call, request },
        Event::Response { call, result } => Event::Response { call, result },
        Event::Timer(timer) => Event::Timer(timer),
        Event::IoDone { io, result } => Event::IoDone { io, result: io_done(result)? },
        Event::Input(transfers) => Event::Input(input(transfers)?),
    })
}

/// Wraps one role's commands.
fn widen<Io>(
    commands: Vec<Command<Rainblock, Io>>,
    wrap: impl Fn(Io) -> NodeIo,
    out: &mut Vec<Command<Rainblock, NodeIo>>,
) {
    out.extend(commands.into_iter().map(|command| match command {
        Command::Call { to, call, request, deadline } => Command::Call { to, call, request, deadline },
        Command::Reply { to, call, response } => Command::Reply { to, call, response },
        Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
        Command::Io { io, op } => Command::Io { io, op: wrap(op) },
    }));
}

impl Role for RainblockNode {
    type Protocol = Rainblock;
    type Io = NodeIo;
    type IoDone = NodeIoDone;
    type Input = Vec<UserTransfer>;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Rainblock, NodeIoDone, Vec<UserTransfer>>,
        out: &mut Vec<Command<Rainblock, NodeIo>>,
    ) {
        match self {
            RainblockNode::Storage(core) => {
                let event = narrow(
                    event,
                    |done| match done {
                        NodeIoDone::Storage(done) => Some(done),
                        NodeIoDone::Miner(_) => None,
                    },
                    |_| None,
                );
                if let Some(event) = event {
                    let mut commands = Vec::new();
                    core.step(now, event, &mut commands);
                    widen(commands, NodeIo::Storage, out);
                }
            }
            RainblockNode::Miner(core) => {
                let event = narrow(
                    event,
                    |done| match done {
                        NodeIoDone::Miner(done) => Some(done),
                        NodeIoDone::Storage(_) => None,
                    },
                    |_| None,
                );
                if let Some(event) = event {
                    let mut commands = Vec::new();
                    core.step(now, event, &mut commands);
                    widen(commands, NodeIo::Miner, out);
                }
            }
            RainblockNode::Client(core) => {
                let event = narrow(event, |_| None, Some);
                if let Some(event) = event {
                    let mut commands = Vec::new();
                    core.step(now, event, &mut commands);
                    widen(commands, |never| match never {}, out);
                }
            }
        }
    }
}
