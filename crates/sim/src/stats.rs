//! What a run did: counters, traffic per (sender, receiver, kind), and the trace digest.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// Counters of one run. Every field counts from the simulator's creation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events handed to a core's `step`.
    pub events: u64,
    /// Requests and replies put on the network (a duplicate counts once).
    pub messages_sent: u64,
    /// Messages that reached a live receiver (a duplicate counts twice).
    pub messages_delivered: u64,
    /// Messages lost to the drop probability.
    pub dropped: u64,
    /// Messages the network delivered a second copy of.
    pub duplicated: u64,
    /// Messages a partition cut, when they left or when they arrived.
    pub cut: u64,
    /// Messages that arrived at a crashed node (or at a later incarnation of it).
    pub lost_to_crash: u64,
    /// Responses that arrived after their call was already answered or timed out.
    pub late_responses: u64,
    /// Calls answered with `DeadlineExceeded`.
    pub deadlines_exceeded: u64,
    /// Calls to a node that does not exist.
    pub unknown_peers: u64,
    /// Timers and device completions of an incarnation that had crashed.
    pub stale_events: u64,
    /// Inputs for a node that was down when they came.
    pub inputs_lost: u64,
    /// Events that waited for a busy node.
    pub deferred: u64,
    pub crashes: u64,
    pub restarts: u64,
}

/// Messages and bytes on one (sender, receiver, kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
}

pub(crate) type TrafficMap =
    HashMap<(u32, u32, &'static str), Traffic, BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

/// The kinds of handled events, as the digest records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Start = 1,
    Request = 2,
    Response = 3,
    ResponseError = 4,
    Timer = 5,
    IoDone = 6,
    Input = 7,
    Crash = 8,
    Restart = 9,
}

/// A running 64-bit hash of the handled events, in order. Not cryptographic: it only has
/// to tell two runs apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    #[inline]
    fn mix(&mut self, value: u64) {
        // Multiply-xorshift: every input bit reaches every output bit within two rounds.
        let mixed = (self.0 ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = mixed ^ (mixed >> 29);
    }

    /// Records one event: when, where, what, and for messages their kind.
    #[inline]
    pub(crate) fn record(&mut self, time: u64, node: u32, kind: Kind, message: Option<&'static str>) {
        self.mix(time);
        self.mix((u64::from(node) << 8) | kind as u64);
        if let Some(message) = message {
            // The bytes, not the address: the address differs between runs of a PIE binary.
            for chunk in message.as_bytes().chunks(8) {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                self.mix(u64::from_le_bytes(word));
            }
        }
    }

    pub(crate) fn value(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_tells_apart_time_node_kind_and_message() {
        let digest = |time, node, kind, message| {
            let mut digest = Digest::default();
            digest.record(time, node, kind, message);
            digest.value()
        };
        let base = digest(5, 1, Kind::Request, Some("ping"));
        assert_ne!(base, digest(6, 1, Kind::Request, Some("ping")));
        assert_ne!(base, digest(5, 2, Kind::Request, Some("ping")));
        assert_ne!(base, digest(5, 1, Kind::Response, Some("ping")));
        assert_ne!(base, digest(5, 1, Kind::Request, Some("pong")));
        assert_ne!(base, digest(5, 1, Kind::Request, None));
        assert_eq!(base, digest(5, 1, Kind::Request, Some("ping")));
    }
}
