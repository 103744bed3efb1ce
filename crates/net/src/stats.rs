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

/// Counters shared by every call of one transport.
#[derive(Debug, Default)]
pub struct NetStats {
    roles: Mutex<BTreeMap<String, RoleTraffic>>,
}

impl NetStats {
    /// Counts one completed round trip: `request_bytes` from `caller`'s role to `callee`'s,
    /// and `response_bytes` back.
    pub fn record(&self, caller: &str, callee: &str, request_bytes: usize, response_bytes: usize) {
        let mut roles = self.roles.lock();
        let from = roles.entry(crate::role_of(caller).to_string()).or_default();
        from.round_trips += 1;
        from.messages_sent += 1;
        from.bytes_sent += request_bytes as u64;
        from.bytes_received += response_bytes as u64;
        let to = roles.entry(crate::role_of(callee).to_string()).or_default();
        to.messages_sent += 1;
        to.bytes_sent += response_bytes as u64;
        to.bytes_received += request_bytes as u64;
    }

    /// A copy of the counters, by role.
    pub fn snapshot(&self) -> BTreeMap<String, RoleTraffic> {
        self.roles.lock().clone()
    }

    /// Messages of every role together.
    pub fn total_messages(&self) -> u64 {
        self.roles.lock().values().map(|traffic| traffic.messages_sent).sum()
    }

    /// Bytes of every role together (each byte counted once, by its sender).
    pub fn total_bytes(&self) -> u64 {
        self.roles.lock().values().map(|traffic| traffic.bytes_sent).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_counts_two_messages_and_both_directions() {
        let stats = NetStats::default();
        stats.record("client-0", "storage-3", 100, 900);
        stats.record("client-1", "miner-0", 50, 10);
        let roles = stats.snapshot();
        assert_eq!(
            roles["client"],
            RoleTraffic { round_trips: 2, messages_sent: 2, bytes_sent: 150, bytes_received: 910 }
        );
        assert_eq!(
            roles["storage"],
            RoleTraffic { round_trips: 0, messages_sent: 1, bytes_sent: 900, bytes_received: 100 }
        );
        assert_eq!(stats.total_messages(), 4);
        assert_eq!(stats.total_bytes(), 1060);
    }
}
