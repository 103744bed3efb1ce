//! Traffic accounting per role.

use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Traffic one role caused or received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoleTraffic {
    /// Requests this role sent (each is one round trip).
    pub round_trips: u64,
    /// Messages sent: requests and responses.
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// A request's kind within its protocol (`rainblock`/`witness`, `health`/`ping`): two
/// protocols may use the same kind name without their counts mixing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageKind {
    pub protocol: &'static str,
    pub request: &'static str,
}

impl MessageKind {
    /// The kind of `request` of protocol `P`.
    pub fn of<P: crate::WireProtocol>(request: &P::Request) -> Self {
        MessageKind { protocol: P::NAME, request: P::request_kind(request) }
    }
}

impl std::fmt::Display for MessageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.protocol, self.request)
    }
}

/// Calls of one message kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindTraffic {
    pub calls: u64,
    pub request_bytes: u64,
    pub response_bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    peers: BTreeMap<String, RoleTraffic>,
    kinds: BTreeMap<MessageKind, KindTraffic>,
}

/// Counters shared by every call of one transport: per peer, and per request kind (the
/// protocol and its typed kind, e.g. `rainblock.witness` or `health.ping`).
#[derive(Debug, Default)]
pub struct NetStats {
    counters: Mutex<Counters>,
}

impl NetStats {
    /// Counts one completed round trip of kind `kind`: `request_bytes` from `caller` to
    /// `callee`, and `response_bytes` back.
    pub fn record(&self, caller: &str, callee: &str, kind: MessageKind, request_bytes: usize, response_bytes: usize) {
        let mut counters = self.counters.lock();
        let from = peer_counters(&mut counters.peers, caller);
        from.round_trips += 1;
        from.messages_sent += 1;
        from.bytes_sent += request_bytes as u64;
        from.bytes_received += response_bytes as u64;
        let to = peer_counters(&mut counters.peers, callee);
        to.messages_sent += 1;
        to.bytes_sent += response_bytes as u64;
        to.bytes_received += request_bytes as u64;
        let kind = counters.kinds.entry(kind).or_default();
        kind.calls += 1;
        kind.request_bytes += request_bytes as u64;
        kind.response_bytes += response_bytes as u64;
    }

    /// A copy of the counters, per peer.
    pub fn peers(&self) -> BTreeMap<String, RoleTraffic> {
        self.counters.lock().peers.clone()
    }

    /// A copy of the counters, per request kind.
    pub fn kinds(&self) -> BTreeMap<MessageKind, KindTraffic> {
        self.counters.lock().kinds.clone()
    }

    /// The per-peer counters summed per role, `role_of` naming each peer's role.
    pub fn by_role(&self, role_of: impl Fn(&str) -> String) -> BTreeMap<String, RoleTraffic> {
        let mut roles: BTreeMap<String, RoleTraffic> = BTreeMap::new();
        for (peer, traffic) in &self.counters.lock().peers {
            let role = roles.entry(role_of(peer)).or_default();
            role.round_trips += traffic.round_trips;
            role.messages_sent += traffic.messages_sent;
            role.bytes_sent += traffic.bytes_sent;
            role.bytes_received += traffic.bytes_received;
        }
        roles
    }

    /// The counters per role, a role being a peer id's part before its first `-`
    /// (`storage-3` → `storage`), as Virga names its peers.
    pub fn snapshot(&self) -> BTreeMap<String, RoleTraffic> {
        self.by_role(|peer| crate::role_of(peer).to_string())
    }

    /// Messages of every peer together.
    pub fn total_messages(&self) -> u64 {
        self.counters.lock().peers.values().map(|traffic| traffic.messages_sent).sum()
    }

    /// Bytes of every peer together (each byte counted once, by its sender).
    pub fn total_bytes(&self) -> u64 {
        self.counters.lock().peers.values().map(|traffic| traffic.bytes_sent).sum()
    }
}

/// The counters of `peer`, allocating its name only the first time (this runs on every call).
fn peer_counters<'a>(peers: &'a mut BTreeMap<String, RoleTraffic>, peer: &str) -> &'a mut RoleTraffic {
    if !peers.contains_key(peer) {
        peers.insert(peer.to_string(), RoleTraffic::default());
    }
    peers.get_mut(peer).unwrap_or_else(|| unreachable!("inserted above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_counts_two_messages_and_both_directions() {
        let stats = NetStats::default();
        let witness = MessageKind { protocol: "rainblock", request: "witness" };
        stats.record("client-0", "storage-3", witness, 100, 900);
        stats.record("client-1", "miner-0", MessageKind { protocol: "rainblock", request: "submit" }, 50, 10);
        stats.record("client-1", "miner-0", MessageKind { protocol: "health", request: "witness" }, 7, 3);
        let roles = stats.snapshot();
        assert_eq!(
            roles["client"],
            RoleTraffic { round_trips: 3, messages_sent: 3, bytes_sent: 157, bytes_received: 913 }
        );
        assert_eq!(
            roles["storage"],
            RoleTraffic { round_trips: 0, messages_sent: 1, bytes_sent: 900, bytes_received: 100 }
        );
        assert_eq!(stats.total_messages(), 6);
        assert_eq!(stats.peers()["storage-3"].bytes_sent, 900);
        // The same kind name in two protocols is two kinds.
        assert_eq!(stats.kinds()[&witness], KindTraffic { calls: 1, request_bytes: 100, response_bytes: 900 });
        assert_eq!(stats.kinds().len(), 3);
        assert_eq!(stats.total_bytes(), 1070);
    }
}
