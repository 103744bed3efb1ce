//! Every pipeline server as one [`Role`] (the simulator runs one role type), and their
//! devices as one executor.

use virga_net::role::{IoExecutor, Nanos, Role};

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
}

/// A node's device: an organization's database for its execution server, the block log for
/// the orderer, the vote log for a commit server, none for the others.
pub enum NodeDevice {
    Organization(Box<OrganizationDevice>),
    Orderer(OrdererLog),
    Votes(VoteLog),
    None,
}

impl IoExecutor<ChainifyNode> for NodeDevice {
    fn execute(&mut self, op: PipelineIo) -> PipelineIoDone {
        match self {
            NodeDevice::Organization(device) => device.execute(op),
            NodeDevice::Orderer(log) => log.execute(op),
            NodeDevice::Votes(log) => log.execute(op),
            NodeDevice::None => PipelineIoDone::Loaded(Err("this node has no device".to_string())),
        }
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
        }
    }
}
