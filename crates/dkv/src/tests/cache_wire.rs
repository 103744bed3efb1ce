//! The client cache and the wire encoding.

use super::super::wire::{self, MAX_WIRE_BYTES};
use super::*;
use crate::proto;
use proptest::prelude::*;
use prost::Message;

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

#[test]
fn the_largest_valid_map_fits_the_wire_bound() {
    // Every bound at its maximum: MAX_SHARDS shards by range with splits of the longest key,
    // 2·MAX_F+1 replicas with the longest ids, the largest epochs and version.
    let splits: Vec<Vec<u8>> = (0..MAX_SHARDS as u16 - 1)
        .map(|i| {
            let mut split = vec![0xee; MAX_SPLIT_KEY_BYTES];
            split[..2].copy_from_slice(&i.to_be_bytes());
            split
        })
        .collect();
    let ids: Vec<String> = (0..2 * MAX_F + 1).map(|i| format!("{i}{}", "n".repeat(MAX_NODE_ID_BYTES - 1))).collect();
    let mut map = ShardMap::place(&ids, Partitioning::Range { splits }, MAX_F).unwrap();
    map.version = u64::MAX;
    for group in &mut map.groups {
        group.epoch = u64::MAX;
    }
    let encoded = wire::encode_command(&ConfigCommand::Install(map.clone()));
    assert!(encoded.len() <= MAX_WIRE_BYTES, "{} bytes", encoded.len());
    assert_eq!(wire::decode_command(&encoded), Ok(ConfigCommand::Install(map)));
}
