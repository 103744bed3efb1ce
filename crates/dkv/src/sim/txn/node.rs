//! Every role of the distributed store as one [`Role`](virga_net::role::Role) for the
//! simulator: configuration replicas, the administrator that installs the layout, data
//! nodes and transaction clients (running programs, or running their work as interactive
//! sessions), and KAIROS's validators, each a [`MultiRole`] with the fit of its device and
//! input.

use crate::Dkv;
use virga_net::role::IoExecutor;
use virga_sim::{Fit, MultiRole};

use super::session::SessionClient;
use crate::client::{ClientInput, Program, TxnClient};
use crate::config::ConfigCommand;
use crate::kairos::ValidatorCore;
use crate::service::{ConfigClient, ConfigCore, ConfigDisk, ConfigIo, ConfigIoDone};
use crate::shard::{DataCore, DataDisk, DataIo, DataIoDone};

/// Any role of the store; [`MultiRole::role`] reaches the core.
pub type DkvNode = MultiRole<Dkv, DkvIo, DkvIoDone, DkvInput>;

/// The transaction client of a client node, whichever way it runs its work.
pub fn txn_client(node: &DkvNode) -> Option<&TxnClient> {
    node.role::<TxnClient>().or_else(|| node.role::<SessionClient>().map(|session| &session.client))
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

pub(crate) fn config_node(core: ConfigCore) -> DkvNode {
    let fit = Fit::<ConfigCore, _, _, _> {
        io_done: |done| match done {
            DkvIoDone::Config(done) => Some(done),
            DkvIoDone::Data(_) => None,
        },
        input: |_| None,
        io: DkvIo::Config,
    };
    MultiRole::new(core, fit)
}

pub(crate) fn data_node(core: DataCore) -> DkvNode {
    let fit = Fit::<DataCore, _, _, _> {
        io_done: |done| match done {
            DkvIoDone::Data(done) => Some(done),
            DkvIoDone::Config(_) => None,
        },
        input: |_| None,
        io: DkvIo::Data,
    };
    MultiRole::new(core, fit)
}

pub(crate) fn admin_node(client: ConfigClient) -> DkvNode {
    let input = |work| match work {
        DkvInput::Commands(commands) => Some(commands),
        DkvInput::Programs(_) => None,
    };
    MultiRole::new(client, Fit { io_done: |_| None, input, io: |never| match never {} })
}

fn programs(work: DkvInput) -> Option<ClientInput> {
    match work {
        DkvInput::Programs(programs) => Some(ClientInput::Programs(programs)),
        DkvInput::Commands(_) => None,
    }
}

pub(crate) fn client_node(client: TxnClient) -> DkvNode {
    MultiRole::new(client, Fit { io_done: |_| None, input: programs, io: |never| match never {} })
}

pub(crate) fn session_node(session: SessionClient) -> DkvNode {
    MultiRole::new(session, Fit { io_done: |_| None, input: programs, io: |never| match never {} })
}

pub(crate) fn validator_node(core: ValidatorCore) -> DkvNode {
    MultiRole::new(core, Fit::plain())
}

pub(crate) fn unopened_node(error: String) -> DkvNode {
    MultiRole::new(virga_sim::media::Unopened::<Dkv>::new(error), Fit::plain())
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
