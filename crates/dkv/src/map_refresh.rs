//! Asking the configuration service for a newer shard map, for a role that learns from a
//! failed request that a primary may have changed (a client, a KAIROS validator): one
//! `GetMap` at a time, to the next replica after a failure, and only a strictly newer map
//! adopted.

use std::time::Duration;

use crate::messages::{Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Ids};

use crate::layout::ShardMap;

#[derive(Debug, Default)]
pub(crate) struct MapRefresh {
    /// A request failed since the map was last fetched.
    stale: bool,
    /// The fetch in flight.
    call: Option<CallId>,
    /// Which configuration replica to ask next.
    target: usize,
}

impl MapRefresh {
    pub(crate) fn mark_stale(&mut self) {
        self.stale = true;
    }

    pub(crate) fn is_fetch(&self, call: CallId) -> bool {
        self.call == Some(call)
    }

    /// The `GetMap` to send, when the map is stale and no fetch is in flight.
    pub(crate) fn fetch<Io>(
        &mut self,
        ids: &mut Ids,
        replicas: &[String],
        deadline: Duration,
    ) -> Option<Command<Dkv, Io>> {
        if !self.stale || self.call.is_some() || replicas.is_empty() {
            return None;
        }
        let call = ids.call();
        self.call = Some(call);
        let to = replicas[self.target % replicas.len()].clone();
        let request = Request::GetMap;
        Some(Command::Call { to, call, request, deadline })
    }

    /// The fetch's answer: a map newer than `current`, if it brought one. A failure moves
    /// to the next replica; any map answered ends the staleness.
    pub(crate) fn answered(
        &mut self,
        body: Result<Response, virga_net::NetError>,
        current: &ShardMap,
    ) -> Option<ShardMap> {
        self.call = None;
        match body {
            Ok(Response::Map(reply)) => {
                self.stale = false;
                reply.map.filter(|map| map.version() > current.version())
            }
            _ => {
                self.target += 1;
                None
            }
        }
    }
}
