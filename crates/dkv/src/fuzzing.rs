//! Bodies of virga-dkv's fuzz targets (`fuzz/fuzz_targets/dkv_decode.rs`), kept in the
//! library so the regular test suite runs them too. Each panics only on a real bug: a dkv
//! message decoded to something invalid or that does not re-encode to itself.

use std::sync::OnceLock;

use crate::{wire, ConfigCommand, ConfigState, ShardId};

/// A configuration with the sample layout installed at log index 1: 5 nodes, range
/// partitioning into 3 shards, f = 1.
fn sample_config() -> &'static ConfigState {
    static CONFIG: OnceLock<ConfigState> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let nodes: Vec<String> = (0..5).map(|i| format!("node-{i}")).collect();
        let splits = vec![b"g".to_vec(), b"p".to_vec()];
        let map = crate::ShardMap::place(&nodes, crate::Partitioning::Range { splits }, 1)
            .unwrap_or_else(|error| unreachable!("the sample layout: {error}"));
        let mut config = ConfigState::new();
        config.apply(1, &ConfigCommand::Install(map)).unwrap_or_else(|error| unreachable!("{error}"));
        config
    })
}

/// Valid encodings of both message types, for the fuzzer to mutate.
pub fn sample_dkv_messages() -> Vec<Vec<u8>> {
    let config = sample_config();
    let map = config.map().unwrap_or_else(|| unreachable!("installed"));
    vec![
        wire::encode_map(map),
        wire::encode_command(&ConfigCommand::Install(map.clone())),
        wire::encode_command(&ConfigCommand::Failover {
            shard: ShardId(1),
            epoch: 1,
            new_primary: "node-2".to_string(),
        }),
    ]
}

/// Any bytes as a dkv shard map and as a configuration command, by the first byte's value
/// modulo 3: (0) the rest as a map, (1) the rest as a command, (2) a sample message (chosen by
/// the second byte) edited by the rest as (offset: u16, xor: u8) triples, decoded as both. A
/// decoded map holds the layout invariants, routes keys inside it and re-encodes to an equal
/// map; a decoded command re-encodes to an equal command and, applied to the sample
/// configuration, keeps the invariants of every step (`dkv::check_step`).
pub fn dkv_decode(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => check_decoded_map(rest),
        1 => check_decoded_command(rest),
        _ => {
            let Some((&which, edits)) = rest.split_first() else { return };
            static SAMPLES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
            let samples = SAMPLES.get_or_init(sample_dkv_messages);
            let mut bytes = samples[usize::from(which) % samples.len()].clone();
            for edit in edits.chunks_exact(3) {
                let offset = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % bytes.len();
                bytes[offset] ^= edit[2];
            }
            check_decoded_map(&bytes);
            check_decoded_command(&bytes);
        }
    }
}

fn check_decoded_map(bytes: &[u8]) {
    let Ok(map) = wire::decode_map(bytes) else { return };
    if let Err(error) = map.check_invariants() {
        panic!("a decoded map breaks an invariant: {error}");
    }
    let shard = map.shard_of(bytes);
    assert!(map.group(shard).is_some(), "a key routed to {shard}, outside the map's {} shards", map.shard_count());
    assert_eq!(wire::decode_map(&wire::encode_map(&map)).ok(), Some(map), "a decoded map did not round-trip");
}

fn check_decoded_command(bytes: &[u8]) {
    let Ok(command) = wire::decode_command(bytes) else { return };
    let again = wire::decode_command(&wire::encode_command(&command)).ok();
    assert_eq!(again.as_ref(), Some(&command), "a decoded command did not round-trip");
    let before = sample_config();
    let mut after = before.clone();
    let applied = after.apply(2, &command);
    if let Err(violation) = crate::check_step(before.map(), after.map()) {
        panic!("applying {command:?} broke an invariant: {violation}");
    }
    if applied.is_err() {
        assert_eq!(after.map(), before.map(), "a refused command changed the map");
    }
    assert_eq!(after.applied_index(), 2, "an entry was not consumed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn dkv_decode_survives_random_and_mutated_messages() {
        for sample in sample_dkv_messages() {
            assert!(wire::decode_map(&sample).is_ok() || wire::decode_command(&sample).is_ok());
        }
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let len = rng.random_range(0..300);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            dkv_decode(&bytes);
            let edits: Vec<u8> = (0..rng.random_range(1..13)).map(|_| rng.random()).collect();
            dkv_decode(&[[2u8, rng.random()].as_slice(), &edits].concat());
        }
    }
}
