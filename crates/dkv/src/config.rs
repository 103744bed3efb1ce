//! The configuration state machine: what the Raft log of the configuration service will
//! carry ([`ConfigCommand`]) and the state every replica of the service rebuilds by applying
//! it in log order ([`ConfigState::apply`]). Pure and deterministic: the same commands at the
//! same indexes give the same state on every replica.
//!
//! Every membership change names the epoch of the group it changes and is refused unless
//! that is the group's current epoch, so two controllers acting on the same view cannot both
//! change a group: the second finds the epoch moved on.

use super::layout::{check_node_id, Backups, LayoutError, ShardId, ShardMap};

/// A change to the configuration, as a Raft entry carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigCommand {
    /// The first layout; refused once one is installed. It must be full (2f backups in
    /// every group).
    Install(ShardMap),
    /// The primary of `shard` failed: `new_primary`, one of its backups, takes over and the
    /// old primary leaves the group, which runs with one backup less until
    /// [`ConfigCommand::AddBackup`] replaces it.
    Failover { shard: ShardId, epoch: u64, new_primary: String },
    /// A node (not yet in the group) joins a degraded group as a backup.
    AddBackup { shard: ShardId, epoch: u64, node: String },
    /// A backup leaves the group.
    RemoveBackup { shard: ShardId, epoch: u64, node: String },
}

/// What an accepted command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The layout was installed at its version.
    Installed { version: u64 },
    /// A group changed; its new epoch and the map's new version.
    Changed { shard: ShardId, epoch: u64, version: u64 },
}

/// Why a command was refused. A refused command changes nothing but the applied index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigRefusal {
    #[error("entry {index} is not after the last applied entry {applied}")]
    OutOfOrder { applied: u64, index: u64 },
    #[error("no layout is installed yet")]
    NotInstalled,
    #[error("a layout is already installed (version {version})")]
    AlreadyInstalled { version: u64 },
    #[error("the layout to install is refused: {0}")]
    Invalid(#[from] LayoutError),
    #[error("{0} is not in the layout")]
    UnknownShard(ShardId),
    #[error("{shard} is at epoch {current}, the command was made at epoch {given}")]
    StaleEpoch { shard: ShardId, current: u64, given: u64 },
    #[error("node {node:?} is not a backup of {shard}")]
    NotABackup { shard: ShardId, node: String },
    #[error("node {node:?} is already a replica of {shard}")]
    AlreadyInGroup { shard: ShardId, node: String },
    #[error("{shard} already has its {backups} backups")]
    GroupFull { shard: ShardId, backups: usize },
    #[error("{shard} would keep {replicas} replicas, fewer than a majority of {majority}")]
    BelowMajority { shard: ShardId, replicas: usize, majority: usize },
    #[error("node id {node:?} for {shard} is refused: {problem}")]
    BadNodeId { shard: ShardId, node: String, problem: super::layout::NodeIdProblem },
    #[error("{shard}'s epoch or the map's version cannot be raised past u64::MAX")]
    CounterExhausted { shard: ShardId },
}

/// The replicated configuration: the installed layout (if any) and the index of the last
/// applied log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigState {
    map: Option<ShardMap>,
    applied_index: u64,
}

impl ConfigState {
    /// Nothing installed, nothing applied.
    pub fn new() -> ConfigState {
        ConfigState::default()
    }

    /// The state a snapshot holds (the configuration service restarting, or a replica
    /// catching up): a map, if one was installed, must hold the layout invariants
    /// ([`ShardMap::check_invariants`]); it may be degraded.
    pub fn restore(map: Option<ShardMap>, applied_index: u64) -> Result<ConfigState, LayoutError> {
        if let Some(map) = &map {
            map.check_invariants()?;
        }
        Ok(ConfigState { map, applied_index })
    }

    pub fn map(&self) -> Option<&ShardMap> {
        self.map.as_ref()
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// Applies the log entry at `index`. Entries are applied in increasing index order and
    /// each at most once: an index at or below the applied index is refused as
    /// [`ConfigRefusal::OutOfOrder`] and changes nothing. Indexes may skip (a Raft log also
    /// holds entries that are not commands: a new leader's empty entry, membership changes).
    ///
    /// A command refused for what it says (a stale epoch, a node that is not a backup, …)
    /// still consumes its entry: the applied index moves to `index`. Its Raft entry is
    /// committed whatever it holds, every replica refuses it the same way, and re-applying it
    /// later (after a restart from a snapshot) must be recognised as already done.
    pub fn apply(&mut self, index: u64, command: &ConfigCommand) -> Result<Applied, ConfigRefusal> {
        if index <= self.applied_index {
            return Err(ConfigRefusal::OutOfOrder { applied: self.applied_index, index });
        }
        self.applied_index = index;
        match command {
            ConfigCommand::Install(map) => self.install(map),
            ConfigCommand::Failover { shard, epoch, new_primary } => {
                self.change(*shard, *epoch, |map, shard| failover(map, shard, new_primary))
            }
            ConfigCommand::AddBackup { shard, epoch, node } => {
                self.change(*shard, *epoch, |map, shard| add_backup(map, shard, node))
            }
            ConfigCommand::RemoveBackup { shard, epoch, node } => {
                self.change(*shard, *epoch, |map, shard| remove_backup(map, shard, node))
            }
        }
    }

    /// Consumes the log entry at `index` without a command (a new leader's empty entry, an
    /// entry that holds no proposal, a retried proposal applied before). Indexes at or below
    /// the applied index change nothing.
    pub fn skip_to(&mut self, index: u64) {
        self.applied_index = self.applied_index.max(index);
    }

    fn install(&mut self, map: &ShardMap) -> Result<Applied, ConfigRefusal> {
        if let Some(installed) = &self.map {
            return Err(ConfigRefusal::AlreadyInstalled { version: installed.version });
        }
        map.validate(Backups::Full)?;
        self.map = Some(map.clone());
        Ok(Applied::Installed { version: map.version })
    }

    /// Checks that `shard` exists at `epoch`, lets `edit` check and make the change, then
    /// raises the group's epoch and the map's version. `edit` changes nothing when it refuses.
    fn change(
        &mut self,
        shard: ShardId,
        epoch: u64,
        edit: impl FnOnce(&mut ShardMap, ShardId) -> Result<(), ConfigRefusal>,
    ) -> Result<Applied, ConfigRefusal> {
        let map = self.map.as_mut().ok_or(ConfigRefusal::NotInstalled)?;
        let group = map.group(shard).ok_or(ConfigRefusal::UnknownShard(shard))?;
        if group.epoch != epoch {
            return Err(ConfigRefusal::StaleEpoch { shard, current: group.epoch, given: epoch });
        }
        let next_epoch = epoch.checked_add(1).ok_or(ConfigRefusal::CounterExhausted { shard })?;
        let next_version = map.version.checked_add(1).ok_or(ConfigRefusal::CounterExhausted { shard })?;
        edit(map, shard)?;
        map.version = next_version;
        let group = map.group_mut(shard).unwrap_or_else(|| unreachable!("{shard} was found above"));
        group.epoch = next_epoch;
        Ok(Applied::Changed { shard, epoch: next_epoch, version: next_version })
    }
}

/// The fewest replicas a group keeps: a majority of 2f+1. Below it no write could commit and
/// a new primary could not merge the logs of f+1 replicas.
fn majority(map: &ShardMap) -> usize {
    map.f + 1
}

/// A failed primary leaves and its backup `new_primary` takes over.
fn failover(map: &mut ShardMap, shard: ShardId, new_primary: &str) -> Result<(), ConfigRefusal> {
    let promoted = take_backup(map, shard, new_primary)?;
    map.group_mut(shard).unwrap_or_else(|| unreachable!("{shard} was checked")).primary = promoted;
    Ok(())
}

fn add_backup(map: &mut ShardMap, shard: ShardId, node: &str) -> Result<(), ConfigRefusal> {
    let full = 2 * map.f;
    let group = map.group_mut(shard).unwrap_or_else(|| unreachable!("{shard} was checked"));
    check_node_id(node).map_err(|problem| ConfigRefusal::BadNodeId { shard, node: node.to_string(), problem })?;
    if group.contains(node) {
        return Err(ConfigRefusal::AlreadyInGroup { shard, node: node.to_string() });
    }
    if group.backups.len() >= full {
        return Err(ConfigRefusal::GroupFull { shard, backups: group.backups.len() });
    }
    group.backups.push(node.to_string());
    Ok(())
}

fn remove_backup(map: &mut ShardMap, shard: ShardId, node: &str) -> Result<(), ConfigRefusal> {
    take_backup(map, shard, node).map(drop)
}

/// Takes backup `node` out of `shard`'s group (to promote or to drop it), unless the group
/// would then hold fewer than a majority of replicas.
fn take_backup(map: &mut ShardMap, shard: ShardId, node: &str) -> Result<String, ConfigRefusal> {
    let majority = majority(map);
    let group = map.group_mut(shard).unwrap_or_else(|| unreachable!("{shard} was checked"));
    let Some(position) = group.backups.iter().position(|backup| backup == node) else {
        return Err(ConfigRefusal::NotABackup { shard, node: node.to_string() });
    };
    let replicas = group.replica_count() - 1;
    if replicas < majority {
        return Err(ConfigRefusal::BelowMajority { shard, replicas, majority });
    }
    Ok(group.backups.remove(position))
}

/// A broken invariant between two successive configuration states.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepViolation {
    #[error("the map breaks a layout invariant: {0}")]
    Layout(#[from] LayoutError),
    #[error("an installed map disappeared")]
    MapRemoved,
    #[error("the version went from {before} to {after}")]
    VersionDecreased { before: u64, after: u64 },
    #[error("the map changed but its version stayed at {version}")]
    VersionNotRaised { version: u64 },
    #[error("{shard}'s epoch went from {before} to {after}")]
    EpochDecreased { shard: ShardId, before: u64, after: u64 },
    #[error("{shard} changed but its epoch stayed at {epoch}")]
    EpochNotRaised { shard: ShardId, epoch: u64 },
    #[error("the partitioning, f or the shard count changed")]
    ShapeChanged,
}

/// Checks the invariants that hold across every applied command: the new map (if any) is
/// valid ([`ShardMap::check_invariants`]); once installed a map stays, keeps its
/// partitioning, f and shards; the version and every epoch never decrease, and both rise
/// whenever what they cover changed.
pub fn check_step(before: Option<&ShardMap>, after: Option<&ShardMap>) -> Result<(), StepViolation> {
    let Some(after) = after else {
        return if before.is_some() { Err(StepViolation::MapRemoved) } else { Ok(()) };
    };
    after.check_invariants()?;
    let Some(before) = before else { return Ok(()) };
    if before.partitioning != after.partitioning || before.f != after.f || before.groups.len() != after.groups.len() {
        return Err(StepViolation::ShapeChanged);
    }
    if after.version < before.version {
        return Err(StepViolation::VersionDecreased { before: before.version, after: after.version });
    }
    if after.version == before.version && after.groups != before.groups {
        return Err(StepViolation::VersionNotRaised { version: after.version });
    }
    for (index, (old, new)) in before.groups.iter().zip(&after.groups).enumerate() {
        let shard = ShardId(index as u32);
        if new.epoch < old.epoch {
            return Err(StepViolation::EpochDecreased { shard, before: old.epoch, after: new.epoch });
        }
        if new.epoch == old.epoch && (new.primary != old.primary || new.backups != old.backups) {
            return Err(StepViolation::EpochNotRaised { shard, epoch: new.epoch });
        }
    }
    Ok(())
}
