//! Tests of the dkv layout: partitioning against oracles, placement and validation here; the
//! configuration state machine (`config`), the client cache and the wire encoding
//! (`cache_wire`) in the submodules.

mod cache_wire;
mod config;
mod raft_wire;

use super::layout::{MAX_F, MAX_NODE_ID_BYTES, MAX_SHARDS, MAX_SPLIT_KEY_BYTES};
use super::*;
use proptest::prelude::*;

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
                    .map(|node| {
                        map.shards_of_node(node).iter().filter(|(_, role)| *role == ReplicaRole::Primary).count()
                    })
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
        vec![(ShardId(0), ReplicaRole::Backup), (ShardId(1), ReplicaRole::Backup), (ShardId(2), ReplicaRole::Primary)]
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
mod backup_watermark;
mod checkpoint;
mod kairos_sim;
mod replica;
mod resync;
mod service_sim;
mod settle_scenario;
mod snapshot_window;
mod txn_sim;
mod validator_takeover;
