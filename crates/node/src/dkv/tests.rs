//! Tests of the dkv layout: partitioning against oracles, placement, validation, the
//! configuration state machine against an independent model, the client cache and the wire
//! encoding.

use super::layout::{MAX_F, MAX_NODE_ID_BYTES, MAX_SHARDS, MAX_SPLIT_KEY_BYTES};
use super::wire::{self, MAX_WIRE_BYTES};
use super::*;
use proptest::prelude::*;
use prost::Message;
use std::mem::discriminant;
use virga_net::dkv_proto as proto;

fn nodes(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("node-{i}")).collect()
}

fn hash(shards: u32) -> Partitioning {
    Partitioning::Hash { shards }
}

fn group(primary: &str, backups: &[&str], epoch: u64) -> ReplicaGroup {
    ReplicaGroup { primary: primary.to_string(), backups: backups.iter().map(|b| b.to_string()).collect(), epoch }
}

/// Three shards over five nodes, f = 1, installed at index 1.
fn installed() -> ConfigState {
    let mut state = ConfigState::new();
    let map = ShardMap::place(&nodes(5), hash(3), 1).unwrap();
    state.apply(1, &ConfigCommand::Install(map)).unwrap();
    state
}

// ---- partitioning ----

#[test]
fn hash_partitioning_is_keccak_prefix_big_endian() {
    // keccak-256 of the empty input is c5d2460186f7233c…, a published constant: the hash is
    // its first 8 bytes read big-endian.
    assert_eq!(key_hash(b""), 0xc5d2_4601_86f7_233c);
    let map = ShardMap::place(&nodes(3), hash(7), 1).unwrap();
    assert_eq!(map.shard_of(b""), ShardId((0xc5d2_4601_86f7_233c_u64 % 7) as u32));
}

#[test]
fn hash_shards_of_fixed_keys_never_change() {
    // Computed once (keccak-256, first 8 bytes big-endian, modulo 16; the same figures came
    // out of a separate Keccak written for the check) and written down: a change to the hash
    // would move every stored key, so these must stay as they are across versions, processes
    // and platforms.
    let map = ShardMap::place(&nodes(3), hash(16), 1).unwrap();
    let expected: [(&[u8], u32); 5] = [(b"", 12), (b"a", 2), (b"user:1", 8), (b"account-42", 14), (&[0u8; 16], 15)];
    let actual: Vec<(&[u8], u32)> = expected.iter().map(|(key, _)| (*key, map.shard_of(key).0)).collect();
    assert_eq!(actual, expected);
}

#[test]
fn hash_partitioning_spreads_keys_evenly() {
    let map = ShardMap::place(&nodes(3), hash(3), 1).unwrap();
    let mut counts = [0u32; 3];
    for i in 0..10_000 {
        counts[map.shard_of(format!("key-{i}").as_bytes()).0 as usize] += 1;
    }
    for count in counts {
        // Within ±10% of a third.
        assert!((3000..=3667).contains(&count), "uneven spread: {counts:?}");
    }
}

/// The shard a linear scan of the splits gives: one past the last split at or below the key.
fn range_oracle(splits: &[Vec<u8>], key: &[u8]) -> u32 {
    let mut shard = 0;
    for (index, split) in splits.iter().enumerate() {
        if key >= split.as_slice() {
            shard = index as u32 + 1;
        }
    }
    shard
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    // A small alphabet so keys often equal splits or share prefixes with them.
    proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xff)], 0..4)
}

fn splits_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::btree_set(key_strategy().prop_filter("non-empty", |key| !key.is_empty()), 0..8)
        .prop_map(|set| set.into_iter().collect())
}

proptest! {
    #[test]
    fn hash_shards_are_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), shards in 1..=MAX_SHARDS) {
        let map = ShardMap::place(&nodes(1), hash(shards), 0).unwrap();
        prop_assert!(map.shard_of(&key).0 < shards);
    }

    #[test]
    fn range_partitioning_matches_a_linear_scan(splits in splits_strategy(), keys in proptest::collection::vec(key_strategy(), 1..20)) {
        let map = ShardMap::place(&nodes(3), Partitioning::Range { splits: splits.clone() }, 1).unwrap();
        prop_assert_eq!(map.shard_count() as usize, splits.len() + 1);
        for key in keys.iter().chain(&splits) {
            prop_assert_eq!(map.shard_of(key).0, range_oracle(&splits, key));
        }
    }
}

// ---- placement and validation ----

#[test]
fn place_gives_distinct_replicas_and_spreads_primaries_and_replicas() {
    for node_count in 1..=8 {
        for f in 0..=2 {
            for shards in 1..=12u32 {
                let all = nodes(node_count);
                let placed = ShardMap::place(&all, hash(shards), f);
                if node_count < 2 * f + 1 {
                    assert_eq!(placed, Err(LayoutError::NotEnoughNodes { nodes: node_count, needed: 2 * f + 1 }));
                    continue;
                }
                let map = placed.unwrap();
                assert!(map.is_full() && map.check_invariants().is_ok());
                for group in map.groups() {
                    let mut replicas: Vec<&str> = group.replicas().collect();
                    replicas.sort();
                    replicas.dedup();
                    assert_eq!(replicas.len(), 2 * f + 1);
                    assert_eq!(group.epoch, 1);
                }
                let primaries: Vec<usize> = all
                    .iter()
                    .map(|node| map.shards_of_node(node).iter().filter(|(_, role)| *role == Role::Primary).count())
                    .collect();
                let replicas: Vec<usize> = all.iter().map(|node| map.shards_of_node(node).len()).collect();
                let spread = |counts: &[usize]| counts.iter().max().unwrap() - counts.iter().min().unwrap();
                assert!(spread(&primaries) <= 1, "{node_count} nodes, f {f}, {shards} shards: {primaries:?}");
                // Every node holds the same number of replicas when the shards go round the
                // nodes a whole number of times.
                if shards as usize % node_count == 0 {
                    assert_eq!(spread(&replicas), 0, "{node_count} nodes, f {f}, {shards} shards: {replicas:?}");
                }
            }
        }
    }
}

#[test]
fn place_is_deterministic() {
    let first = ShardMap::place(&nodes(5), hash(9), 2).unwrap();
    assert_eq!(first, ShardMap::place(&nodes(5), hash(9), 2).unwrap());
    assert_eq!(first.group(ShardId(1)).unwrap(), &group("node-1", &["node-2", "node-3", "node-4", "node-0"], 1));
}

#[test]
fn shards_of_node_names_each_role() {
    let map = ShardMap::place(&nodes(4), hash(4), 1).unwrap();
    // Shard i: primary node-i, backups node-(i+1) and node-(i+2), modulo 4.
    assert_eq!(
        map.shards_of_node("node-2"),
        vec![(ShardId(0), Role::Backup), (ShardId(1), Role::Backup), (ShardId(2), Role::Primary)]
    );
    assert!(map.shards_of_node("node-9").is_empty());
}

#[test]
fn replica_counts_must_be_odd_and_positive() {
    assert_eq!(replicas_to_f(0), Err(LayoutError::ZeroReplicas));
    for even in [2, 4, 6] {
        let error = replicas_to_f(even).unwrap_err();
        assert_eq!(error, LayoutError::EvenReplicaCount { replicas: even });
        assert!(error.to_string().contains(&format!("replica count of {even}")), "{error}");
    }
    assert_eq!((replicas_to_f(1), replicas_to_f(3), replicas_to_f(5)), (Ok(0), Ok(1), Ok(2)));
    assert_eq!(replicas_to_f(2 * MAX_F + 3), Err(LayoutError::FTooLarge { f: MAX_F + 1, max: MAX_F }));
    assert_eq!(ShardMap::place_replicas(&nodes(5), hash(3), 4), Err(LayoutError::EvenReplicaCount { replicas: 4 }));
    assert_eq!(ShardMap::place_replicas(&nodes(5), hash(3), 3).unwrap().f(), 1);
}

#[test]
fn invalid_layouts_are_refused_with_the_right_error() {
    let full = |primary: &str, backups: &[&str]| group(primary, backups, 1);
    let three = || vec![full("a", &["b", "c"]), full("b", &["c", "a"]), full("c", &["a", "b"])];
    let range = |splits: &[&[u8]]| Partitioning::Range { splits: splits.iter().map(|s| s.to_vec()).collect() };
    let cases: Vec<(Partitioning, Vec<ReplicaGroup>, usize, LayoutError)> = vec![
        (hash(0), vec![], 1, LayoutError::NoShards),
        (
            hash(MAX_SHARDS + 1),
            vec![],
            1,
            LayoutError::TooManyShards { shards: u64::from(MAX_SHARDS) + 1, max: MAX_SHARDS },
        ),
        (hash(2), three(), 1, LayoutError::GroupCount { shards: 2, groups: 3 }),
        (hash(3), three(), MAX_F + 1, LayoutError::FTooLarge { f: MAX_F + 1, max: MAX_F }),
        (
            hash(1),
            vec![full("a", &["b"])],
            1,
            LayoutError::BackupCount { shard: ShardId(0), backups: 1, min: 2, max: 2 },
        ),
        (
            hash(1),
            vec![full("a", &["b", "c", "d"])],
            1,
            LayoutError::BackupCount { shard: ShardId(0), backups: 3, min: 2, max: 2 },
        ),
        (hash(1), vec![full("a", &["b", "a"])], 1, LayoutError::DuplicateNode { shard: ShardId(0), node: "a".into() }),
        (hash(1), vec![full("a", &["b", "b"])], 1, LayoutError::DuplicateNode { shard: ShardId(0), node: "b".into() }),
        (
            hash(1),
            vec![full("a", &["", "b"])],
            1,
            LayoutError::BadNodeId { shard: ShardId(0), problem: NodeIdProblem::Empty },
        ),
        (range(&[b"m", b"m"]), three(), 1, LayoutError::SplitsNotIncreasing { index: 1 }),
        (range(&[b"m", b"d"]), three(), 1, LayoutError::SplitsNotIncreasing { index: 1 }),
        (range(&[b"", b"d"]), three(), 1, LayoutError::EmptySplit { index: 0 }),
        (
            range(&[b"d", &[7; MAX_SPLIT_KEY_BYTES + 1]]),
            three(),
            1,
            LayoutError::SplitTooLong { index: 1, length: MAX_SPLIT_KEY_BYTES + 1, max: MAX_SPLIT_KEY_BYTES },
        ),
    ];
    for (partitioning, groups, f, expected) in cases {
        assert_eq!(ShardMap::new(partitioning.clone(), groups, f), Err(expected), "{partitioning:?}");
    }
    let long = "x".repeat(MAX_NODE_ID_BYTES + 1);
    assert_eq!(
        ShardMap::new(hash(1), vec![full("a", &["b", &long])], 1),
        Err(LayoutError::BadNodeId {
            shard: ShardId(0),
            problem: NodeIdProblem::TooLong { length: MAX_NODE_ID_BYTES + 1, max: MAX_NODE_ID_BYTES }
        })
    );
    let with = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ShardMap::place(&with(&["a", "b", "a"]), hash(1), 1),
        Err(LayoutError::DuplicateNodeInList { node: "a".into() })
    );
    assert_eq!(
        ShardMap::place(&with(&["a", "", "c"]), hash(1), 1),
        Err(LayoutError::BadNodeInList { position: 1, problem: NodeIdProblem::Empty })
    );
    assert!(ShardMap::new(range(&[b"d", b"m"]), three(), 1).is_ok());
}

// ---- the configuration state machine ----

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

// ---- the client cache ----

#[test]
fn the_cache_routes_to_the_primary_and_takes_only_newer_maps() {
    let mut state = installed();
    let mut cache = MapCache::new(state.map().unwrap().clone());
    let key = b"user:1";
    let shard = cache.map().shard_of(key);
    let route = cache.route(key);
    let group = state.map().unwrap().group(shard).unwrap().clone();
    assert_eq!(route, Route { shard, primary: &group.primary, epoch: 1 });

    let failover = ConfigCommand::Failover { shard, epoch: 1, new_primary: group.backups[1].clone() };
    state.apply(2, &failover).unwrap();
    // The new primary answers at epoch 2: the cached map is stale; the old epoch is not.
    assert!(cache.is_stale(shard, 2));
    assert!(!cache.is_stale(shard, 1) && !cache.is_stale(shard, 0));
    assert!(cache.is_stale(ShardId(7), 1));
    let newer = state.map().unwrap().clone();
    assert!(cache.offer(newer.clone()));
    assert_eq!(cache.route(key), Route { shard, primary: &group.backups[1], epoch: 2 });
    // A repeated or older map is ignored.
    assert!(!cache.offer(newer));
    assert!(!cache.offer(installed().map().unwrap().clone()));
    assert_eq!(cache.map().version(), 2);
}

// ---- wire ----

fn map_strategy() -> impl Strategy<Value = ShardMap> {
    let partitioning =
        prop_oneof![(1..6u32).prop_map(hash), splits_strategy().prop_map(|splits| Partitioning::Range { splits })];
    (partitioning, 0..=2usize, any::<u64>(), proptest::collection::vec((any::<u64>(), 0..3usize), 8), any::<u64>())
        .prop_map(|(partitioning, f, version, tweaks, rotate)| {
            let mut all = nodes(2 * f + 3);
            let by = (rotate % all.len() as u64) as usize;
            all.rotate_left(by);
            let mut map = ShardMap::place(&all, partitioning, f).unwrap();
            map.version = version;
            for (index, group) in map.groups.iter_mut().enumerate() {
                let (epoch, drop) = tweaks[index % tweaks.len()];
                group.epoch = epoch;
                group.backups.truncate(2 * f - drop.min(f));
            }
            map
        })
}

fn command_strategy() -> impl Strategy<Value = ConfigCommand> {
    let node = prop_oneof![Just("node-0".to_string()), "[a-z0-9-]{1,64}"];
    prop_oneof![
        map_strategy().prop_map(ConfigCommand::Install),
        (0..MAX_SHARDS, any::<u64>(), node.clone()).prop_map(|(s, epoch, new_primary)| ConfigCommand::Failover {
            shard: ShardId(s),
            epoch,
            new_primary
        }),
        (0..MAX_SHARDS, any::<u64>(), node.clone()).prop_map(|(s, epoch, node)| ConfigCommand::AddBackup {
            shard: ShardId(s),
            epoch,
            node
        }),
        (0..MAX_SHARDS, any::<u64>(), node).prop_map(|(s, epoch, node)| ConfigCommand::RemoveBackup {
            shard: ShardId(s),
            epoch,
            node
        }),
    ]
}

proptest! {
    #[test]
    fn maps_and_commands_round_trip(map in map_strategy(), command in command_strategy()) {
        prop_assert!(map.check_invariants().is_ok());
        prop_assert_eq!(wire::decode_map(&wire::encode_map(&map)), Ok(map));
        prop_assert_eq!(wire::decode_command(&wire::encode_command(&command)), Ok(command));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(map) = wire::decode_map(&bytes) {
            prop_assert!(map.check_invariants().is_ok());
        }
        let _ = wire::decode_command(&bytes);
    }

    #[test]
    fn decoding_mutated_encodings_never_panics(
        command in command_strategy(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = wire::encode_command(&command);
        for (at, xor) in &edits {
            let at = at.index(bytes.len());
            bytes[at] ^= xor;
        }
        for candidate in [&bytes[..], &bytes[..cut.index(bytes.len() + 1)]] {
            if let Ok(map) = wire::decode_map(candidate) {
                prop_assert!(map.check_invariants().is_ok());
            }
            if let Ok(ConfigCommand::Install(map)) = wire::decode_command(candidate) {
                prop_assert!(map.check_invariants().is_ok());
            }
        }
    }
}

#[test]
fn decoding_names_what_is_wrong() {
    let good = proto::ShardMap::decode(&*wire::encode_map(&ShardMap::place(&nodes(3), hash(2), 1).unwrap())).unwrap();

    let no_partitioning = proto::ShardMap { partitioning: None, ..good.clone() };
    assert_eq!(wire::decode_map(&no_partitioning.encode_to_vec()), Err(WireError::UnknownPartitioning));

    let mut duplicated = good.clone();
    duplicated.groups[0].backups[0] = duplicated.groups[0].primary.clone();
    assert_eq!(
        wire::decode_map(&duplicated.encode_to_vec()),
        Err(WireError::Layout(LayoutError::DuplicateNode { shard: ShardId(0), node: "node-0".into() }))
    );
    let even = proto::ShardMap { f: 9, ..good.clone() };
    assert_eq!(
        wire::decode_map(&even.encode_to_vec()),
        Err(WireError::Layout(LayoutError::FTooLarge { f: 9, max: MAX_F }))
    );

    let too_large = vec![0u8; MAX_WIRE_BYTES + 1];
    assert_eq!(
        wire::decode_map(&too_large),
        Err(WireError::TooLarge { length: MAX_WIRE_BYTES + 1, max: MAX_WIRE_BYTES })
    );
    assert!(matches!(wire::decode_map(&[0x0a, 0xff]), Err(WireError::Protobuf(_))));

    use proto::config_command::Command;
    let encode = |command: Command| proto::ConfigCommand { command: Some(command) }.encode_to_vec();
    assert_eq!(
        wire::decode_command(&proto::ConfigCommand { command: None }.encode_to_vec()),
        Err(WireError::UnknownCommand)
    );
    assert_eq!(
        wire::decode_command(&encode(Command::Install(proto::Install { map: None }))),
        Err(WireError::MissingMap)
    );
    let failover = |shard, new_primary: &str| {
        encode(Command::Failover(proto::Failover { shard, epoch: 1, new_primary: new_primary.into() }))
    };
    assert_eq!(
        wire::decode_command(&failover(MAX_SHARDS, "a")),
        Err(WireError::BadShardId { shard: MAX_SHARDS, max: MAX_SHARDS })
    );
    assert_eq!(
        wire::decode_command(&failover(0, "")),
        Err(WireError::BadNodeId { field: "failover.new_primary", problem: NodeIdProblem::Empty })
    );
    assert!(wire::decode_command(&failover(0, "a")).is_ok());
}
