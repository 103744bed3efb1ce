//! Every pipeline server as one [`Role`] (the simulator and the drivers run one role type),
//! and their devices as one executor.

use virga_net::role::{IoExecutor, Nanos, Role};
use virga_net::wired::{Wired, WiredIo};

use super::chainify_server::ChainifyServer;
use super::client::ClientCore;
use super::commit::CommitServer;
use super::device::{OrdererLog, OrganizationDevice, VoteLog};
use super::execution::ExecutionServer;
use super::orderer::OrderingServer;
use super::{ChainifyProtocol, PipelineCommand, PipelineEvent, PipelineIo, PipelineIoDone};

pub enum ChainifyNode {
    Client(Box<ClientCore>),
    Chainify(Box<ChainifyServer>),
    Orderer(Box<OrderingServer>),
    Execution(Box<ExecutionServer>),
    Commit(Box<CommitServer>),
    /// A server whose storage did not open in the simulator: its process refused to start,
    /// so nothing answers until its next restart tries again.
    #[cfg(any(test, feature = "sim"))]
    Unopened(String),
}

/// A node's device: an organization's database for its execution server, the block log for
/// the orderer, the vote log for a commit server, none for the others.
pub enum NodeDevice {
    Organization(Box<OrganizationDevice>),
    Orderer(OrdererLog),
    Votes(VoteLog),
    None,
}

impl NodeDevice {
    fn run(&mut self, op: PipelineIo) -> PipelineIoDone {
        match self {
            NodeDevice::Organization(device) => device.execute(op),
            NodeDevice::Orderer(log) => log.execute(op),
            NodeDevice::Votes(log) => log.execute(op),
            NodeDevice::None => {
                PipelineIoDone::Loaded(Err(super::DeviceFailure::WrongDevice("this node has no device")))
            }
        }
    }

    /// A database operation runs on a thread of its own under a real driver, so that the
    /// driver's other servers go on meanwhile; the logs' operations are quick and stay (the
    /// operation is handed back by value, as the trait asks).
    #[allow(clippy::result_large_err)]
    fn detached(&mut self, op: PipelineIo) -> Result<virga_net::role::Detached<PipelineIoDone>, PipelineIo> {
        match self {
            NodeDevice::Organization(device) => {
                let mut device = device.share();
                Ok(Box::new(move || device.execute(op)))
            }
            _ => Err(op),
        }
    }
}

impl IoExecutor<ChainifyNode> for NodeDevice {
    fn execute(&mut self, op: PipelineIo) -> PipelineIoDone {
        self.run(op)
    }

    #[allow(clippy::result_large_err)]
    fn detach(&mut self, op: PipelineIo) -> Result<virga_net::role::Detached<PipelineIoDone>, PipelineIo> {
        self.detached(op)
    }
}

impl Role for ChainifyNode {
    type Protocol = ChainifyProtocol;
    type Io = PipelineIo;
    type IoDone = PipelineIoDone;
    type Input = ();

    fn is_long_step(&self, event: &PipelineEvent<()>) -> bool {
        matches!(self, ChainifyNode::Execution(_)) && matches!(event, virga_net::role::Event::IoDone { .. })
    }

    fn step(&mut self, now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        match self {
            ChainifyNode::Client(core) => core.step(now, event, out),
            ChainifyNode::Chainify(core) => core.step(now, event, out),
            ChainifyNode::Orderer(core) => core.step(now, event, out),
            ChainifyNode::Execution(core) => core.step(now, event, out),
            ChainifyNode::Commit(core) => core.step(now, event, out),
            #[cfg(any(test, feature = "sim"))]
            ChainifyNode::Unopened(_) => {}
        }
    }
}

/// A pipeline server as the simulator runs it: the core itself, or the core with every
/// message crossing the wire encoding ([`virga_net::wired::Wired`]), as between processes.
pub trait PipelineNode:
    Role<Protocol = ChainifyProtocol, Io = PipelineIo, IoDone = PipelineIoDone, Input = ()> + Sized
{
    type Device: IoExecutor<Self>;

    fn wrap(node: ChainifyNode, device: NodeDevice) -> (Self, Self::Device);
    fn node(&self) -> &ChainifyNode;
}

impl PipelineNode for ChainifyNode {
    type Device = NodeDevice;

    fn wrap(node: ChainifyNode, device: NodeDevice) -> (Self, NodeDevice) {
        (node, device)
    }

    fn node(&self) -> &ChainifyNode {
        self
    }
}

impl PipelineNode for Wired<ChainifyNode> {
    type Device = WiredIo<NodeDevice>;

    fn wrap(node: ChainifyNode, device: NodeDevice) -> (Self, WiredIo<NodeDevice>) {
        (Wired::new(node), WiredIo(device))
    }

    fn node(&self) -> &ChainifyNode {
        self.role()
    }
}
