//! Bodies of virga-dkv's fuzz targets (`fuzz/fuzz_targets/dkv_decode.rs`, `raft_wire.rs`,
//! `dkv_shard.rs`, `kv_session.rs`, `kairos_validator.rs`),
//! kept in the library so the regular test suite runs them too. Each panics only on a real
//! bug: a dkv message decoded to something invalid or that does not re-encode to itself; a
//! Raft message that passed `raft_wire`'s checks and then panicked raft-rs.

pub mod data_node;
pub mod raft_group;
pub mod session;
pub mod validator;

use std::sync::OnceLock;

use crate::proto;
use prost::Message as _;

use crate::raft_wire::{message_from_wire, Receiver};
use crate::{wire, ConfigCommand, ConfigState, ShardId};
use raft_group::{Delivery, Scenario, HEARTBEAT_TICK, VOTERS};

pub use data_node::dkv_shard;
pub use session::kv_session;
pub use validator::kairos_validator;

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

/// Longest Raft message the fuzz body decodes (a replica's transport bounds requests too).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 * 1024;
/// Most messages one input delivers.
const MAX_MESSAGES_PER_INPUT: usize = 8;

/// Honest messages delivered while each scenario's script ran, for the fuzzer to edit.
fn raft_samples(scenario: Scenario) -> &'static [proto::RaftMessage] {
    static SAMPLES: OnceLock<Vec<Vec<proto::RaftMessage>>> = OnceLock::new();
    let all = SAMPLES.get_or_init(|| {
        Scenario::ALL
            .iter()
            .map(|scenario| {
                let group = scenario.build(Delivery::Honest, true);
                group.record.unwrap_or_default().into_iter().map(|delivered| delivered.message).collect()
            })
            .collect()
    });
    &all[Scenario::ALL.iter().position(|s| *s == scenario).unwrap_or_else(|| unreachable!("listed"))]
}

/// Forged Raft messages against a live group: the first byte picks the group's state
/// ([`Scenario`]), the second the receiving replica and the peer the messages come from;
/// then up to 8 messages, each (even tag) `u16` little-endian length and that many bytes
/// decoded as a `RaftMessage`, or (odd tag) an honest message of the scenario, readdressed
/// from the peer to the receiver and changed by up to 8 (field, `u64`) edits (see [`Nudge`]
/// for how a value becomes a number). Each message goes
/// through `message_from_wire` with the receiver's view of that moment and, if accepted, into
/// `RawNode::step`; the group then settles (its own messages checked too, refusals dropped)
/// and ticks for a heartbeat. raft-rs panicking anywhere is the bug this target looks for.
pub fn raft_wire(data: &[u8]) {
    forge_raft_messages(data);
}

/// The body of [`raft_wire`]; returns how many forged messages passed the checks and went
/// into raft-rs.
fn forge_raft_messages(data: &[u8]) -> usize {
    let [scenario, who, rest @ ..] = data else { return 0 };
    let scenario = Scenario::ALL[usize::from(*scenario) % Scenario::ALL.len()];
    let me = VOTERS[usize::from(*who) % VOTERS.len()];
    let peers: Vec<u64> = VOTERS.iter().copied().filter(|&id| id != me).collect();
    let sender = peers[usize::from(*who / 3) % peers.len()];
    let mut group = scenario.build(Delivery::Lenient, false);
    let mut input = rest;
    let mut stepped = 0;
    for _ in 0..MAX_MESSAGES_PER_INPUT {
        let view = Receiver::of(group.node(me), sender);
        let Some(message) = next_forged_message(&mut input, scenario, &view) else { break };
        if let Ok(checked) = message_from_wire(message, &view) {
            stepped += 1;
            let _ = group.step(me, checked);
        }
        group.settle();
    }
    for _ in 0..HEARTBEAT_TICK {
        group.tick();
    }
    stepped
}

fn next_forged_message(input: &mut &[u8], scenario: Scenario, view: &Receiver) -> Option<proto::RaftMessage> {
    let (&tag, rest) = input.split_first()?;
    *input = rest;
    if tag % 2 == 0 {
        let length = usize::from(u16::from_le_bytes([*input.first()?, *input.get(1)?]));
        let bytes = &input[2..];
        let (bytes, rest) = bytes.split_at(length.min(bytes.len()));
        *input = rest;
        if bytes.len() > MAX_RAFT_MESSAGE_BYTES {
            return None;
        }
        // An undecodable message is refused by the transport: try the next one.
        return Some(proto::RaftMessage::decode(bytes).unwrap_or_default());
    }
    let samples = raft_samples(scenario);
    let (&which, rest) = input.split_first()?;
    let (&count, rest) = rest.split_first()?;
    *input = rest;
    let mut message = samples.get(usize::from(which) % samples.len().max(1))?.clone();
    message.to = view.me;
    message.from = view.sender;
    for _ in 0..count % 9 {
        let Some((edit, rest)) = input.split_first_chunk::<9>() else { break };
        *input = rest;
        let value = u64::from_le_bytes(edit[1..].try_into().unwrap_or_else(|_| unreachable!("8 bytes")));
        edit_message(&mut message, edit[0], Nudge { value, view });
    }
    Some(message)
}

/// An edit's value as a new number for a field: by its two low bits, a small step from the
/// field's value, from the receiver's last index or from its term (the edges the checks sit
/// on), or the rest of the value itself.
struct Nudge<'a> {
    value: u64,
    view: &'a Receiver,
}

impl Nudge<'_> {
    fn of(&self, current: u64) -> u64 {
        let step = i64::from((self.value >> 2) as i8);
        match self.value % 4 {
            0 => current.wrapping_add_signed(step),
            1 => self.value >> 2,
            2 => self.view.last_index.wrapping_add_signed(step),
            _ => self.view.term.wrapping_add_signed(step),
        }
    }
}

fn edit_message(message: &mut proto::RaftMessage, field: u8, nudge: Nudge) {
    let value = nudge.value;
    let entry_at = |message: &mut proto::RaftMessage| {
        let count = message.entries.len();
        (count > 0).then(|| (value >> 32) as usize % count)
    };
    match field % 20 {
        0 => message.msg_type = (value % 21) as i32,
        1 => message.term = nudge.of(message.term),
        2 => message.log_term = nudge.of(message.log_term),
        3 => message.index = nudge.of(message.index),
        4 => message.commit = nudge.of(message.commit),
        5 => message.commit_term = nudge.of(message.commit_term),
        6 => message.reject = !message.reject,
        7 => message.reject_hint = nudge.of(message.reject_hint),
        8 => message.to = nudge.of(message.to),
        9 => message.from = nudge.of(message.from),
        10 => message.context = vec![value as u8; (value >> 8) as usize % 80],
        11 => {
            let next = message.entries.last().map_or(message.index, |entry| entry.index).wrapping_add(1);
            let term = message.entries.last().map_or(message.log_term.max(1), |entry| entry.term);
            let data = wire::encode_proposal(&raft_group::sample_proposal("fuzz", value.max(1)));
            message.entries.push(proto::RaftEntry { term, index: next, data, ..Default::default() });
        }
        12 => {
            message.entries.pop();
        }
        13 => {
            if let Some(at) = entry_at(message) {
                message.entries[at].term = nudge.of(message.entries[at].term);
            }
        }
        14 => {
            if let Some(at) = entry_at(message) {
                message.entries[at].index = nudge.of(message.entries[at].index);
            }
        }
        15 => {
            if let Some(at) = entry_at(message) {
                message.entries[at].entry_type = (value % 4) as i32;
            }
        }
        16 => {
            if let Some(at) = entry_at(message) {
                let data = &mut message.entries[at].data;
                match data.len() {
                    0 => data.push(value as u8),
                    length => data[(value as usize >> 8) % length] ^= value as u8,
                }
            }
        }
        17 => message.priority = value as i64,
        18 => message.request_snapshot = value,
        _ => message.snapshot = Some(proto::RaftSnapshot::default()),
    }
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

    /// An input of the `raft_wire` target: scenario, receiver, then messages.
    fn random_raft_input(rng: &mut StdRng) -> Vec<u8> {
        let mut input = vec![rng.random(), rng.random()];
        for _ in 0..rng.random_range(1..4) {
            if rng.random_bool(0.2) {
                let bytes: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
                input.push(0);
                input.extend((bytes.len() as u16).to_le_bytes());
                input.extend(bytes);
            } else {
                let edits = rng.random_range(0..4u8);
                input.extend([1, rng.random(), edits]);
                for _ in 0..edits {
                    input.push(rng.random());
                    // Mostly small steps (from the field, the last index or the term), the edges
                    // the checks sit on; the high half picks an entry.
                    let step = if rng.random_bool(0.7) { rng.random_range(0..4) } else { 1 };
                    let value = step | u64::from(rng.random::<u8>()) << 2 | u64::from(rng.random::<u32>()) << 32;
                    input.extend(value.to_le_bytes());
                }
            }
        }
        input
    }

    #[test]
    fn raft_wire_survives_random_and_mutated_messages() {
        for scenario in Scenario::ALL {
            assert!(raft_samples(scenario).len() > 20, "{scenario:?} recorded too little traffic");
        }
        let mut rng = StdRng::seed_from_u64(11);
        let stepped: usize = (0..3000).map(|_| forge_raft_messages(&random_raft_input(&mut rng))).sum();
        // Most edits keep a message honest enough to pass: raft-rs really sees them.
        assert!(stepped > 1000, "only {stepped} forged messages passed the checks");
    }
}
