//! A client's cached shard map: routes keys to primaries and tells when to refresh.

use super::layout::{ShardId, ShardMap};

/// Where a key's operations go: its shard, that shard's primary and the group's epoch the
/// client saw (sent along, so a server can tell the client its map is stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'a> {
    pub shard: ShardId,
    pub primary: &'a str,
    pub epoch: u64,
}

/// The newest shard map a client has seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapCache {
    map: ShardMap,
}

impl MapCache {
    /// A cache holding the map a client fetched when it started.
    pub fn new(map: ShardMap) -> MapCache {
        MapCache { map }
    }

    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// The route of `key` in the cached map.
    pub fn route(&self, key: &[u8]) -> Route<'_> {
        let shard = self.map.shard_of(key);
        let group = self.map.group(shard).unwrap_or_else(|| unreachable!("shard_of returned {shard} out of range"));
        Route { shard, primary: &group.primary, epoch: group.epoch }
    }

    /// Takes `map` if it is strictly newer than the cached one (a reordered or repeated
    /// reply carrying an older map is ignored); says whether it was taken.
    pub fn offer(&mut self, map: ShardMap) -> bool {
        if map.version() <= self.map.version() {
            return false;
        }
        self.map = map;
        true
    }

    /// Whether a server's reply about `shard` at `epoch_in_reply` shows the cached map to be
    /// stale: the server knows a newer epoch of the group (or a shard the cache does not), so
    /// the client should fetch the map again. A reply at the cached epoch or an older one
    /// (a server that has not yet heard of the change) is no reason to refresh.
    pub fn is_stale(&self, shard: ShardId, epoch_in_reply: u64) -> bool {
        match self.map.group(shard) {
            Some(group) => epoch_in_reply > group.epoch,
            None => true,
        }
    }
}
