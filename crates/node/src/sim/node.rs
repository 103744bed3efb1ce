//! RainBlock's three roles as one [`Role`](virga_net::role::Role) for the simulator, which
//! runs one role type: each a [`MultiRole`] with the fit of its device and input.

use crate::protocol::Rainblock;
use virga_net::role::IoExecutor;
use virga_sim::{Fit, MultiRole};

use crate::client::{ClientCore, UserTransfer};
use crate::miner::{ChainDisk, ChainDiskError, MinerCore, MinerIo, MinerIoDone};
use crate::storage::{StorageCore, StorageDisk, StorageIo, StorageIoDone};

/// A storage node, a miner or a client; [`MultiRole::role`] reaches the core.
pub type RainblockNode = MultiRole<Rainblock, NodeIo, NodeIoDone, Vec<UserTransfer>>;

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

pub fn storage_node(core: StorageCore) -> RainblockNode {
    let fit = Fit::<StorageCore, _, _, _> {
        io_done: |done| match done {
            NodeIoDone::Storage(done) => Some(done),
            NodeIoDone::Miner(_) => None,
        },
        input: |_| None,
        io: NodeIo::Storage,
    };
    MultiRole::new(core, fit)
}

pub fn miner_node(core: MinerCore) -> RainblockNode {
    let fit = Fit::<MinerCore, _, _, _> {
        io_done: |done| match done {
            NodeIoDone::Miner(done) => Some(done),
            NodeIoDone::Storage(_) => None,
        },
        input: |_| None,
        io: NodeIo::Miner,
    };
    MultiRole::new(core, fit)
}

/// A node whose storage refused to open: nothing answers until its next restart.
pub(crate) fn unopened_node(error: String) -> RainblockNode {
    MultiRole::new(virga_sim::media::Unopened::<Rainblock>::new(error), Fit::plain())
}

/// A client has no device; the node's input is its users' transfers.
pub fn client_node(core: ClientCore) -> RainblockNode {
    MultiRole::new(core, Fit { io_done: |_| None, input: Some, io: |never| match never {} })
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
