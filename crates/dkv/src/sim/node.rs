//! The configuration service's roles as one [`Role`](virga_net::role::Role) for the
//! simulator, which runs one role type: replicas and the client that proposes commands.

use crate::Dkv;
use virga_net::role::IoExecutor;
use virga_sim::{Fit, MultiRole};

use crate::config::ConfigCommand;
use crate::service::{ConfigClient, ConfigCore, ConfigDisk, ConfigIo, ConfigIoDone};

/// A replica or the client; [`MultiRole::role`] reaches the core.
pub type ServiceNode = MultiRole<Dkv, ConfigIo, ConfigIoDone, Vec<ConfigCommand>>;

pub(crate) fn replica_node(core: ConfigCore) -> ServiceNode {
    MultiRole::new(core, Fit { io_done: Some, input: |_| None, io: |io| io })
}

/// A replica whose storage refused to open: nothing answers until its next restart.
pub(crate) fn unopened_node(error: String) -> ServiceNode {
    MultiRole::new(virga_sim::media::Unopened::<Dkv>::new(error), Fit::plain())
}

pub(crate) fn client_node(client: ConfigClient) -> ServiceNode {
    MultiRole::new(client, Fit { io_done: |_| None, input: Some, io: |never| match never {} })
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
