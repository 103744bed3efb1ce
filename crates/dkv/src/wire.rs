//! Protobuf encoding of shard maps, configuration commands and proposals (`crate::proto`,
//! package `virga.dkv.v1` in `crates/net/proto/dkv.proto`): Raft entry payloads and the
//! configuration service's map replies.
//!
//! Decoding trusts nothing: the input is bounded by [`MAX_WIRE_BYTES`] before prost reads it
//! (so what it allocates is bounded too), every field is checked, and a decoded map passes
//! the layout checks of [`ShardMap::new`] except that its groups may be degraded (a map
//! served after a failover has groups below 2f backups, never below a majority): exactly
//! [`ShardMap::check_invariants`]. A layout to install must in addition be full, which
//! [`super::ConfigState::apply`] checks. No input makes decoding panic.

use crate::proto;
use prost::Message;

use super::config::ConfigCommand;
use super::layout::{
    check_node_id, Backups, LayoutError, NodeIdProblem, Partitioning, ReplicaGroup, ShardId, ShardMap, MAX_SHARDS,
};

/// Largest message accepted. The largest valid map (1024 shards of 9 replicas with 64-byte
/// ids, 1023 splits of 256 bytes) encodes to under 1 MiB.
pub const MAX_WIRE_BYTES: usize = 1 << 20;

/// Why bytes do not decode to a shard map or a configuration command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message is {length} bytes, more than the {max} accepted")]
    TooLarge { length: usize, max: usize },
    #[error("not a protobuf message of the expected type: {0}")]
    Protobuf(#[from] prost::DecodeError),
    #[error("the shard map has no partitioning this build knows")]
    UnknownPartitioning,
    #[error("the configuration command is of no kind this build knows")]
    UnknownCommand,
    #[error("the install command carries no shard map")]
    MissingMap,
    #[error("shard id {shard} is out of range (a layout has at most {max} shards)")]
    BadShardId { shard: u32, max: u32 },
    #[error("field {field} holds a bad node id: {problem}")]
    BadNodeId { field: &'static str, problem: NodeIdProblem },
    #[error("the shard map is not a valid layout: {0}")]
    Layout(#[from] LayoutError),
    #[error("the proposal's sequence number is 0 (sequence numbers start at 1)")]
    ZeroSequence,
}

/// Encodes a shard map.
pub fn encode_map(map: &ShardMap) -> Vec<u8> {
    map_to_proto(map).encode_to_vec()
}

/// Decodes and checks a shard map (see the module docs for what is checked).
pub fn decode_map(bytes: &[u8]) -> Result<ShardMap, WireError> {
    check_length(bytes)?;
    map_from_proto(proto::ShardMap::decode(bytes)?)
}

/// Encodes a configuration command.
pub fn encode_command(command: &ConfigCommand) -> Vec<u8> {
    command_to_proto(command).encode_to_vec()
}

/// A configuration command with its proposer's session: what a Normal entry of the
/// configuration service's Raft log carries, so a retried proposal applies once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The proposing client's id (1 to 64 bytes).
    pub client: String,
    /// The client's sequence number, from 1; a new command takes the next one.
    pub seq: u64,
    pub command: ConfigCommand,
}

/// Encodes a proposal.
pub fn encode_proposal(proposal: &Proposal) -> Vec<u8> {
    proposal_to_proto(proposal).encode_to_vec()
}

/// The wire form of a proposal (the `propose` request carries it).
pub fn proposal_to_proto(proposal: &Proposal) -> proto::ConfigProposal {
    proto::ConfigProposal {
        client: proposal.client.clone(),
        seq: proposal.seq,
        command: Some(command_to_proto(&proposal.command)),
    }
}

/// Decodes and checks a proposal: the client id valid, the sequence number at least 1, the
/// command as [`decode_command`] checks it.
pub fn decode_proposal(bytes: &[u8]) -> Result<Proposal, WireError> {
    check_length(bytes)?;
    proposal_from_proto(proto::ConfigProposal::decode(bytes)?)
}

/// Checks a proposal already decoded by the transport (the `propose` request).
pub fn proposal_from_proto(proposal: proto::ConfigProposal) -> Result<Proposal, WireError> {
    if proposal.seq == 0 {
        return Err(WireError::ZeroSequence);
    }
    Ok(Proposal {
        client: node_id("proposal.client", proposal.client)?,
        seq: proposal.seq,
        command: command_from_proto(proposal.command.ok_or(WireError::UnknownCommand)?)?,
    })
}

fn command_to_proto(command: &ConfigCommand) -> proto::ConfigCommand {
    use proto::config_command::Command;
    let body = match command {
        ConfigCommand::Install(map) => Command::Install(proto::Install { map: Some(map_to_proto(map)) }),
        ConfigCommand::Failover { shard, epoch, new_primary } => {
            Command::Failover(proto::Failover { shard: shard.0, epoch: *epoch, new_primary: new_primary.clone() })
        }
        ConfigCommand::AddBackup { shard, epoch, node } => {
            Command::AddBackup(proto::AddBackup { shard: shard.0, epoch: *epoch, node: node.clone() })
        }
        ConfigCommand::RemoveBackup { shard, epoch, node } => {
            Command::RemoveBackup(proto::RemoveBackup { shard: shard.0, epoch: *epoch, node: node.clone() })
        }
    };
    proto::ConfigCommand { command: Some(body) }
}

/// Decodes and checks a configuration command: shard ids within [`MAX_SHARDS`], node ids
/// valid, an installed map checked as by [`decode_map`]. Whether the command applies is the
/// state machine's decision.
pub fn decode_command(bytes: &[u8]) -> Result<ConfigCommand, WireError> {
    check_length(bytes)?;
    command_from_proto(proto::ConfigCommand::decode(bytes)?)
}

fn command_from_proto(command: proto::ConfigCommand) -> Result<ConfigCommand, WireError> {
    use proto::config_command::Command;
    Ok(match command.command.ok_or(WireError::UnknownCommand)? {
        Command::Install(install) => ConfigCommand::Install(map_from_proto(install.map.ok_or(WireError::MissingMap)?)?),
        Command::Failover(failover) => ConfigCommand::Failover {
            shard: shard_id(failover.shard)?,
            epoch: failover.epoch,
            new_primary: node_id("failover.new_primary", failover.new_primary)?,
        },
        Command::AddBackup(add) => ConfigCommand::AddBackup {
            shard: shard_id(add.shard)?,
            epoch: add.epoch,
            node: node_id("add_backup.node", add.node)?,
        },
        Command::RemoveBackup(remove) => ConfigCommand::RemoveBackup {
            shard: shard_id(remove.shard)?,
            epoch: remove.epoch,
            node: node_id("remove_backup.node", remove.node)?,
        },
    })
}

pub(crate) fn check_length(bytes: &[u8]) -> Result<(), WireError> {
    if bytes.len() > MAX_WIRE_BYTES {
        return Err(WireError::TooLarge { length: bytes.len(), max: MAX_WIRE_BYTES });
    }
    Ok(())
}

fn shard_id(shard: u32) -> Result<ShardId, WireError> {
    if shard >= MAX_SHARDS {
        return Err(WireError::BadShardId { shard, max: MAX_SHARDS });
    }
    Ok(ShardId(shard))
}

pub(crate) fn node_id(field: &'static str, node: String) -> Result<String, WireError> {
    check_node_id(&node).map_err(|problem| WireError::BadNodeId { field, problem })?;
    Ok(node)
}

/// The wire form of a map (the configuration service's map replies carry it).
pub fn map_to_proto(map: &ShardMap) -> proto::ShardMap {
    use proto::shard_map::Partitioning as Wire;
    let partitioning = match map.partitioning() {
        Partitioning::Hash { shards } => Wire::Hash(proto::HashPartitioning { shards: *shards }),
        Partitioning::Range { splits } => Wire::Range(proto::RangePartitioning { splits: splits.clone() }),
    };
    proto::ShardMap {
        version: map.version(),
        // f is at most MAX_F in every map built or decoded.
        f: map.f() as u32,
        partitioning: Some(partitioning),
        groups: map
            .groups()
            .iter()
            .map(|group| proto::ReplicaGroup {
                primary: group.primary.clone(),
                backups: group.backups.clone(),
                epoch: group.epoch,
            })
            .collect(),
    }
}

/// Checks a map already decoded by the transport (a map reply), as [`decode_map`] does.
pub fn map_from_proto(map: proto::ShardMap) -> Result<ShardMap, WireError> {
    use proto::shard_map::Partitioning as Wire;
    let partitioning = match map.partitioning.ok_or(WireError::UnknownPartitioning)? {
        Wire::Hash(hash) => Partitioning::Hash { shards: hash.shards },
        Wire::Range(range) => Partitioning::Range { splits: range.splits },
    };
    let groups = map
        .groups
        .into_iter()
        .map(|group| ReplicaGroup { primary: group.primary, backups: group.backups, epoch: group.epoch })
        .collect();
    // An f beyond usize (impossible on 32- and 64-bit targets) is refused as too large.
    let f = usize::try_from(map.f).unwrap_or(usize::MAX);
    Ok(ShardMap::checked(map.version, partitioning, groups, f, Backups::AtLeastMajority)?)
}
