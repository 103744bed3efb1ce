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

impl NodeDevice {
    fn run(&mut self, op: PipelineIo) -> PipelineIoDone {
        match self {
            NodeDevice::Organization(device) => device.execute(op),
            NodeDevice::Orderer(log) => log.execute(op),
            NodeDevice::Votes(log) => log.execute(op),
            NodeDevice::None => PipelineIoDone::Loaded(Err("this node has no device".to_string())),
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
        }
    }
}

/// A pipeline server on a real transport: every request and response crosses the wire
/// encoding ([`super::wire`]), decoded and checked before the core sees it. Bytes that do
/// not decode are refused with the decoder's reason (a request) or reported as a refusal
/// by the peer (a response); the core is not stepped for them.
pub struct WireNode {
    node: ChainifyNode,
    /// The peer each call went to, for the errors of its answer.
    callees: std::collections::BTreeMap<virga_net::role::CallId, String>,
}

impl WireNode {
    pub fn new(node: ChainifyNode) -> WireNode {
        WireNode { node, callees: Default::default() }
    }
}

fn wire_reply(response: &super::Response) -> virga_net::chainify_proto::Response {
    virga_net::chainify_proto::Response {
        body: Some(virga_net::chainify_proto::response::Body::Message(super::wire::encode_response(response))),
    }
}

impl Role for WireNode {
    type Protocol = virga_net::Chainify;
    type Io = PipelineIo;
    type IoDone = PipelineIoDone;
    type Input = ();

    fn is_long_step(&self, event: &virga_net::role::Event<virga_net::Chainify, PipelineIoDone, ()>) -> bool {
        matches!(self.node, ChainifyNode::Execution(_)) && matches!(event, virga_net::role::Event::IoDone { .. })
    }

    fn step(
        &mut self,
        now: Nanos,
        event: virga_net::role::Event<virga_net::Chainify, PipelineIoDone, ()>,
        out: &mut Vec<virga_net::role::Command<virga_net::Chainify, PipelineIo>>,
    ) {
        use virga_net::chainify_proto::response::Body;
        use virga_net::role::{Command, Event};
        use virga_net::NetError;

        let event: PipelineEvent<()> = match event {
            Event::Start => Event::Start,
            Event::Input(()) => Event::Input(()),
            Event::Timer(timer) => Event::Timer(timer),
            Event::IoDone { io, result } => Event::IoDone { io, result },
            Event::Request { from, call, request } => match super::wire::decode_request(&request.body) {
                Ok(request) => Event::Request { from, call, request },
                Err(error) => {
                    let response = wire_reply(&super::Response::Refused(error.to_string()));
                    out.push(Command::Reply { to: from, call, response });
                    return;
                }
            },
            Event::Response { call, result } => {
                let peer = self.callees.remove(&call).unwrap_or_default();
                let result = result.and_then(|response| match response.body {
                    Some(Body::Message(bytes)) => match super::wire::decode_response(&bytes) {
                        Ok(super::Response::Refused(reason)) => Err(NetError::Refused { peer, reason }),
                        Ok(response) => Ok(response),
                        Err(error) => Err(NetError::Refused { peer, reason: format!("a malformed answer: {error}") }),
                    },
                    Some(Body::Error(reason)) => Err(NetError::Refused { peer, reason }),
                    None => Err(NetError::BadResponse { peer }),
                });
                Event::Response { call, result }
            }
        };
        let mut commands = Vec::new();
        self.node.step(now, event, &mut commands);
        for command in commands {
            out.push(match command {
                Command::Call { to, call, request, deadline } => {
                    self.callees.insert(call, to.clone());
                    let request = virga_net::chainify_proto::Request { body: super::wire::encode_request(&request) };
                    Command::Call { to, call, request, deadline }
                }
                Command::Reply { to, call, response } => Command::Reply { to, call, response: wire_reply(&response) },
                Command::SetTimer { timer, after } => Command::SetTimer { timer, after },
                Command::Io { io, op } => Command::Io { io, op },
            });
        }
    }
}

/// A pipeline server as the simulator runs it: the core itself, or the core behind the wire
/// encoding.
pub trait PipelineNode: Role<Io = PipelineIo, IoDone = PipelineIoDone, Input = ()> + Sized
where
    NodeDevice: IoExecutor<Self>,
{
    fn wrap(node: ChainifyNode) -> Self;
    fn node(&self) -> &ChainifyNode;
}

impl PipelineNode for ChainifyNode {
    fn wrap(node: ChainifyNode) -> Self {
        node
    }

    fn node(&self) -> &ChainifyNode {
        self
    }
}

impl PipelineNode for WireNode {
    fn wrap(node: ChainifyNode) -> Self {
        WireNode::new(node)
    }

    fn node(&self) -> &ChainifyNode {
        &self.node
    }
}

impl IoExecutor<WireNode> for NodeDevice {
    fn execute(&mut self, op: PipelineIo) -> PipelineIoDone {
        self.run(op)
    }

    #[allow(clippy::result_large_err)]
    fn detach(&mut self, op: PipelineIo) -> Result<virga_net::role::Detached<PipelineIoDone>, PipelineIo> {
        self.detached(op)
    }
}
