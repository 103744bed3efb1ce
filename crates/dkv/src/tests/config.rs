//! The configuration state machine: fixed cases, the step checker and its broken variants,
//! and random command sequences against an independent model.

use super::*;
use proptest::prelude::*;
use std::mem::discriminant;

#[test]
fn failover_with_a_stale_epoch_is_refused_and_changes_nothing() {
    let mut state = installed();
    let before = state.clone();
    let stale = ConfigCommand::Failover { shard: ShardId(0), epoch: 0, new_primary: "node-1".into() };
    assert_eq!(state.apply(2, &stale), Err(ConfigRefusal::StaleEpoch { shard: ShardId(0), current: 1, given: 0 }));
    assert_eq!(state.map(), before.map());
    // The entry is consumed all the same.
    assert_eq!(state.applied_index(), 2);
}

#[test]
fn failover_promotes_a_backup_and_the_group_runs_degraded_until_a_backup_is_added() {
    let mut state = installed();
    // Shard 1: primary node-1, backups node-2 and node-3.
    let promote = ConfigCommand::Failover { shard: ShardId(1), epoch: 1, new_primary: "node-3".into() };
    assert_eq!(state.apply(2, &promote), Ok(Applied::Changed { shard: ShardId(1), epoch: 2, version: 2 }));
    let map = state.map().unwrap();
    assert_eq!(map.group(ShardId(1)).unwrap(), &group("node-3", &["node-2"], 2));
    assert!(!map.is_full() && map.check_invariants().is_ok());
    // One more failover would leave a single replica of three: below a majority.
    let again = ConfigCommand::Failover { shard: ShardId(1), epoch: 2, new_primary: "node-2".into() };
    assert_eq!(
        state.apply(3, &again),
        Err(ConfigRefusal::BelowMajority { shard: ShardId(1), replicas: 1, majority: 2 })
    );
    // The failed primary cannot come back as primary, nor can a stranger.
    for (index, node) in [(4, "node-1"), (5, "node-4")] {
        let command = ConfigCommand::Failover { shard: ShardId(1), epoch: 2, new_primary: node.into() };
        let refusal = ConfigRefusal::NotABackup { shard: ShardId(1), node: node.into() };
        assert_eq!(state.apply(index, &command), Err(refusal));
    }
    let add = |node: &str, epoch| ConfigCommand::AddBackup { shard: ShardId(1), epoch, node: node.into() };
    let in_group = ConfigRefusal::AlreadyInGroup { shard: ShardId(1), node: "node-3".into() };
    assert_eq!(state.apply(6, &add("node-3", 2)), Err(in_group));
    assert_eq!(state.apply(7, &add("node-4", 2)), Ok(Applied::Changed { shard: ShardId(1), epoch: 3, version: 3 }));
    assert!(state.map().unwrap().is_full());
    assert_eq!(state.apply(8, &add("node-0", 3)), Err(ConfigRefusal::GroupFull { shard: ShardId(1), backups: 2 }));
    let remove = ConfigCommand::RemoveBackup { shard: ShardId(1), epoch: 3, node: "node-2".into() };
    assert_eq!(state.apply(9, &remove), Ok(Applied::Changed { shard: ShardId(1), epoch: 4, version: 4 }));
    assert_eq!(state.map().unwrap().group(ShardId(1)).unwrap(), &group("node-3", &["node-4"], 4));
}

#[test]
fn entries_apply_in_order_once_and_refused_entries_are_consumed() {
    let mut state = ConfigState::new();
    let map = ShardMap::place(&nodes(3), hash(2), 1).unwrap();
    let failover = ConfigCommand::Failover { shard: ShardId(0), epoch: 1, new_primary: "node-1".into() };
    assert_eq!(state.apply(1, &failover), Err(ConfigRefusal::NotInstalled));
    assert_eq!(
        state.apply(1, &ConfigCommand::Install(map.clone())),
        Err(ConfigRefusal::OutOfOrder { applied: 1, index: 1 })
    );
    // Indexes may skip (entries that are not commands).
    assert_eq!(state.apply(4, &ConfigCommand::Install(map.clone())), Ok(Applied::Installed { version: 1 }));
    assert_eq!(state.apply(5, &ConfigCommand::Install(map)), Err(ConfigRefusal::AlreadyInstalled { version: 1 }));
    assert_eq!(state.apply(3, &failover), Err(ConfigRefusal::OutOfOrder { applied: 5, index: 3 }));
    assert_eq!(state.map().unwrap().version(), 1);
    let unknown = ConfigCommand::AddBackup { shard: ShardId(2), epoch: 1, node: "node-9".into() };
    assert_eq!(state.apply(6, &unknown), Err(ConfigRefusal::UnknownShard(ShardId(2))));
    assert_eq!(state.apply(7, &failover), Ok(Applied::Changed { shard: ShardId(0), epoch: 2, version: 2 }));
    assert_eq!(state.applied_index(), 7);
}

#[test]
fn a_restored_state_continues_where_the_snapshot_left_off() {
    let mut state = installed();
    state.apply(2, &ConfigCommand::Failover { shard: ShardId(0), epoch: 1, new_primary: "node-2".into() }).unwrap();
    let mut restored = ConfigState::restore(state.map().cloned(), state.applied_index()).unwrap();
    assert_eq!(restored, state);
    let repeated = ConfigCommand::Failover { shard: ShardId(0), epoch: 1, new_primary: "node-2".into() };
    assert_eq!(restored.apply(2, &repeated), Err(ConfigRefusal::OutOfOrder { applied: 2, index: 2 }));
    let mut broken = state.map().unwrap().clone();
    broken.groups[2].backups[0] = broken.groups[2].primary.clone();
    assert_eq!(
        ConfigState::restore(Some(broken), 2),
        Err(LayoutError::DuplicateNode { shard: ShardId(2), node: "node-2".into() })
    );
}

#[test]
fn only_a_full_layout_installs() {
    let mut degraded = ShardMap::place(&nodes(3), hash(1), 1).unwrap();
    degraded.groups[0].backups.pop();
    assert!(degraded.check_invariants().is_ok());
    let mut state = ConfigState::new();
    assert_eq!(
        state.apply(1, &ConfigCommand::Install(degraded)),
        Err(ConfigRefusal::Invalid(LayoutError::BackupCount { shard: ShardId(0), backups: 1, min: 2, max: 2 }))
    );
    assert_eq!(state.map(), None);
}

#[test]
fn exhausted_counters_refuse_instead_of_wrapping() {
    let mut map = ShardMap::place(&nodes(3), hash(1), 1).unwrap();
    map.groups[0].epoch = u64::MAX;
    let mut state = ConfigState::new();
    state.apply(1, &ConfigCommand::Install(map)).unwrap();
    let failover = ConfigCommand::Failover { shard: ShardId(0), epoch: u64::MAX, new_primary: "node-1".into() };
    assert_eq!(state.apply(2, &failover), Err(ConfigRefusal::CounterExhausted { shard: ShardId(0) }));
    assert_eq!(state.map().unwrap().group(ShardId(0)).unwrap().primary, "node-0");
}

#[test]
fn the_step_checker_catches_broken_states() {
    let good = ShardMap::place(&nodes(4), hash(2), 1).unwrap();
    assert_eq!(check_step(None, Some(&good)), Ok(()));
    assert_eq!(check_step(Some(&good), Some(&good)), Ok(()));

    let mut duplicated = good.clone();
    duplicated.groups[1].backups[0] = duplicated.groups[1].primary.clone();
    assert_eq!(
        check_step(Some(&good), Some(&duplicated)),
        Err(StepViolation::Layout(LayoutError::DuplicateNode { shard: ShardId(1), node: "node-1".into() }))
    );
    let mut emptied = good.clone();
    emptied.groups[0].backups.clear();
    assert!(matches!(
        check_step(Some(&good), Some(&emptied)),
        Err(StepViolation::Layout(LayoutError::BackupCount { .. }))
    ));
    assert_eq!(check_step(Some(&good), None), Err(StepViolation::MapRemoved));

    let mut older = good.clone();
    older.version = 0;
    assert_eq!(check_step(Some(&good), Some(&older)), Err(StepViolation::VersionDecreased { before: 1, after: 0 }));
    let mut unversioned = good.clone();
    unversioned.groups[0].backups.swap(0, 1);
    unversioned.groups[0].epoch = 2;
    assert_eq!(check_step(Some(&good), Some(&unversioned)), Err(StepViolation::VersionNotRaised { version: 1 }));
    unversioned.version = 2;
    assert_eq!(check_step(Some(&good), Some(&unversioned)), Ok(()));
    unversioned.groups[0].epoch = 1;
    assert_eq!(
        check_step(Some(&good), Some(&unversioned)),
        Err(StepViolation::EpochNotRaised { shard: ShardId(0), epoch: 1 })
    );
    let mut rewound = good.clone();
    rewound.version = 2;
    rewound.groups[1].epoch = 0;
    assert_eq!(
        check_step(Some(&good), Some(&rewound)),
        Err(StepViolation::EpochDecreased { shard: ShardId(1), before: 1, after: 0 })
    );
    let reshaped = ShardMap::place(&nodes(4), hash(3), 1).unwrap();
    assert_eq!(check_step(Some(&good), Some(&reshaped)), Err(StepViolation::ShapeChanged));
}

/// An independent model of the configuration: per shard, the replicas (primary first) and
/// the epoch.
#[derive(Debug, Clone, Default)]
struct Model {
    f: usize,
    groups: Option<Vec<(Vec<String>, u64)>>,
    version: u64,
    applied: u64,
}

impl Model {
    /// The refusal's variant (as an example value) or the change, by the rules of the
    /// configuration service written out directly.
    fn apply(&mut self, index: u64, command: &ConfigCommand) -> Result<(), ConfigRefusal> {
        if index <= self.applied {
            return Err(ConfigRefusal::OutOfOrder { applied: 0, index: 0 });
        }
        self.applied = index;
        let (shard, epoch, node) = match command {
            ConfigCommand::Install(map) => {
                if self.groups.is_some() {
                    return Err(ConfigRefusal::AlreadyInstalled { version: 0 });
                }
                if map.groups.iter().any(|group| group.backups.len() != 2 * map.f) {
                    return Err(ConfigRefusal::Invalid(LayoutError::NoShards));
                }
                self.f = map.f;
                self.version = map.version;
                self.groups =
                    Some(map.groups.iter().map(|g| (g.replicas().map(String::from).collect(), g.epoch)).collect());
                return Ok(());
            }
            ConfigCommand::Failover { shard, epoch, new_primary } => (shard, epoch, new_primary),
            ConfigCommand::AddBackup { shard, epoch, node } => (shard, epoch, node),
            ConfigCommand::RemoveBackup { shard, epoch, node } => (shard, epoch, node),
        };
        let f = self.f;
        let groups = self.groups.as_mut().ok_or(ConfigRefusal::NotInstalled)?;
        let (replicas, current) = groups.get_mut(shard.0 as usize).ok_or(ConfigRefusal::UnknownShard(*shard))?;
        if current != epoch {
            return Err(ConfigRefusal::StaleEpoch { shard: *shard, current: 0, given: 0 });
        }
        let is_backup = replicas[1..].contains(node);
        let below = Err(ConfigRefusal::BelowMajority { shard: *shard, replicas: 0, majority: 0 });
        match command {
            ConfigCommand::Failover { .. } | ConfigCommand::RemoveBackup { .. } if !is_backup => {
                return Err(ConfigRefusal::NotABackup { shard: *shard, node: String::new() });
            }
            ConfigCommand::Failover { .. } | ConfigCommand::RemoveBackup { .. } if replicas.len() - 1 < f + 1 => {
                return below;
            }
            ConfigCommand::Failover { .. } => {
                let rest: Vec<String> = replicas[1..].iter().filter(|r| *r != node).cloned().collect();
                *replicas = std::iter::once(node.clone()).chain(rest).collect();
            }
            ConfigCommand::RemoveBackup { .. } => replicas.retain(|r| r != node),
            _ if node.is_empty() => {
                return Err(ConfigRefusal::BadNodeId {
                    shard: *shard,
                    node: String::new(),
                    problem: NodeIdProblem::Empty,
                })
            }
            _ if replicas.contains(node) => {
                return Err(ConfigRefusal::AlreadyInGroup { shard: *shard, node: String::new() })
            }
            _ if replicas.len() - 1 == 2 * f => return Err(ConfigRefusal::GroupFull { shard: *shard, backups: 0 }),
            _ => replicas.push(node.clone()),
        }
        *current += 1;
        self.version += 1;
        Ok(())
    }
}

/// A command drawn against the model's current state, so that epochs are mostly current.
#[derive(Debug, Clone)]
struct Draw {
    kind: u8,
    shard: u32,
    epoch_skew: u8,
    node: usize,
    index_step: u64,
}

const POOL: [&str; 8] = ["node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6", ""];

fn draw() -> impl Strategy<Value = Draw> {
    (0..10u8, 0..5u32, 0..6u8, 0..POOL.len(), prop_oneof![6 => Just(1u64), 1 => Just(0u64), 1 => Just(3u64)])
        .prop_map(|(kind, shard, epoch_skew, node, index_step)| Draw { kind, shard, epoch_skew, node, index_step })
}

fn command_of(draw: &Draw, model: &Model, layout: &ShardMap) -> ConfigCommand {
    let current = model.groups.as_ref().and_then(|groups| groups.get(draw.shard as usize)).map_or(1, |group| group.1);
    let epoch = match draw.epoch_skew {
        0 => current.saturating_sub(1),
        1 => current + 1,
        _ => current,
    };
    let shard = ShardId(draw.shard);
    let node = POOL[draw.node].to_string();
    match draw.kind {
        0 => ConfigCommand::Install(layout.clone()),
        1..=3 => ConfigCommand::Failover { shard, epoch, new_primary: node },
        4..=6 => ConfigCommand::AddBackup { shard, epoch, node },
        _ => ConfigCommand::RemoveBackup { shard, epoch, node },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_command_sequences_keep_the_invariants_and_match_a_model(
        install_first in any::<bool>(),
        f in 0..=2usize,
        shards in 1..=4u32,
        degrade in any::<bool>(),
        draws in proptest::collection::vec(draw(), 1..60),
    ) {
        let mut layout = ShardMap::place(&POOL[..7].iter().map(|n| n.to_string()).collect::<Vec<_>>(), hash(shards), f).unwrap();
        if degrade && f > 0 {
            layout.groups[0].backups.pop();
        }
        let mut state = ConfigState::new();
        let mut model = Model::default();
        let mut index = 0;
        if install_first {
            index = 1;
            let install = ConfigCommand::Install(layout.clone());
            prop_assert_eq!(state.apply(index, &install).is_ok(), model.apply(index, &install).is_ok());
        }
        for draw in &draws {
            index += draw.index_step;
            let command = command_of(draw, &model, &layout);
            let before = state.clone();
            let result = state.apply(index, &command);
            let expected = model.apply(index, &command);
            match (&result, &expected) {
                (Ok(_), Ok(())) => {}
                (Err(got), Err(want)) => {
                    prop_assert_eq!(discriminant(got), discriminant(want), "{:?}: {} vs {}", command, got, want);
                    prop_assert_eq!(state.map(), before.map());
                }
                _ => prop_assert!(false, "{:?}: {:?}, the model says {:?}", command, result, expected),
            }
            prop_assert_eq!(state.applied_index(), model.applied);
            prop_assert!(check_step(before.map(), state.map()).is_ok(), "{:?}", check_step(before.map(), state.map()));
            if let (Some(map), Some(groups)) = (state.map(), &model.groups) {
                prop_assert_eq!(map.version(), model.version);
                for (group, (replicas, epoch)) in map.groups().iter().zip(groups) {
                    prop_assert_eq!(&group.replicas().map(String::from).collect::<Vec<_>>(), replicas);
                    prop_assert_eq!(group.epoch, *epoch);
                }
            }
        }
    }
}
