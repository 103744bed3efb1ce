//! The configuration replica's state machine as a Raft snapshot's image: the configuration
//! state, the clients' sessions (so a retried proposal is still answered once after a
//! compaction) and the hash chain over what was applied. Decoding trusts nothing: a leader's
//! snapshot arrives from the network, a replica's own from its disk.

use std::collections::BTreeMap;

use prost::Message;

use super::core::Outcome;
use crate::config::ConfigState;
use crate::layout::LayoutError;
use crate::proto;
use crate::wire::{self, WireError};

/// The one format this build writes and reads.
const IMAGE_FORMAT: u32 = 1;

/// A replica's state machine as of `state.applied_index()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigImage {
    pub state: ConfigState,
    pub sessions: BTreeMap<String, (u64, Outcome)>,
    pub chain: u64,
}

/// Why bytes are not a configuration image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the configuration image: {0}")]
    Wire(#[from] WireError),
    #[error("the configuration image has format {0}, which this build does not know (a newer build wrote it)")]
    UnknownFormat(u32),
    #[error("the configuration image's map: {0}")]
    Layout(#[from] LayoutError),
}

impl From<prost::DecodeError> for ImageError {
    fn from(error: prost::DecodeError) -> ImageError {
        ImageError::Wire(WireError::Protobuf(error))
    }
}

pub fn encode_image(image: &ConfigImage) -> Vec<u8> {
    proto::ConfigImage {
        format: IMAGE_FORMAT,
        map: image.state.map().map(wire::map_to_proto),
        applied_index: image.state.applied_index(),
        sessions: image
            .sessions
            .iter()
            .map(|(client, (seq, outcome))| proto::ConfigSession {
                client: client.clone(),
                seq: *seq,
                index: outcome.index,
                version: outcome.version,
                refusal: outcome.refusal.clone(),
            })
            .collect(),
        chain: image.chain,
    }
    .encode_to_vec()
}

pub fn decode_image(bytes: &[u8]) -> Result<ConfigImage, ImageError> {
    wire::check_length(bytes)?;
    let image = proto::ConfigImage::decode(bytes)?;
    if image.format != IMAGE_FORMAT {
        return Err(ImageError::UnknownFormat(image.format));
    }
    let map = image.map.map(wire::map_from_proto).transpose()?;
    let state = ConfigState::restore(map, image.applied_index)?;
    let mut sessions = BTreeMap::new();
    for session in image.sessions {
        let client = wire::node_id("ConfigSession.client", session.client)?;
        let outcome = Outcome { index: session.index, version: session.version, refusal: session.refusal };
        sessions.insert(client, (session.seq, outcome));
    }
    Ok(ConfigImage { state, sessions, chain: image.chain })
}

/// The check a leader's snapshot passes before raft-rs sees it.
pub(crate) fn check_image(bytes: &[u8]) -> Result<(), virga_raft::EntryRefusal> {
    decode_image(bytes).map(|_| ()).map_err(|error| virga_raft::EntryRefusal::new("a configuration image", error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Partitioning, ShardMap};

    fn image() -> ConfigImage {
        let nodes: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
        let map = ShardMap::place(&nodes, Partitioning::Hash { shards: 2 }, 0).unwrap();
        let mut state = ConfigState::new();
        state.apply(4, &crate::config::ConfigCommand::Install(map)).unwrap();
        let outcome = Outcome { index: 4, version: 1, refusal: String::new() };
        ConfigImage { state, sessions: BTreeMap::from([("admin@0".to_string(), (1, outcome))]), chain: 77 }
    }

    #[test]
    fn an_image_round_trips_and_a_damaged_one_is_refused_with_its_reason() {
        let bytes = encode_image(&image());
        assert_eq!(decode_image(&bytes).unwrap(), image());
        let mut newer = proto::ConfigImage::decode(&bytes[..]).unwrap();
        newer.format = 2;
        assert!(matches!(decode_image(&newer.encode_to_vec()), Err(ImageError::UnknownFormat(2))));
        assert!(decode_image(&bytes[..bytes.len() / 2]).is_err(), "cut short");
        let mut bad_client = proto::ConfigImage::decode(&bytes[..]).unwrap();
        bad_client.sessions[0].client = String::new();
        assert!(decode_image(&bad_client.encode_to_vec()).is_err());
        assert!(check_image(&[0xff; 9]).is_err());
    }
}
