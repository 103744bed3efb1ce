//! The node's link to the configuration service: it fetches the map periodically and takes
//! a newer one (taking over the shards it now leads, dropping what it did for those it no
//! longer leads), and proposes one change of the map at a time (a backup's failover),
//! following the service's leader hints.

use crate::messages::{Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};

use super::{CallFor, DataConfig, DataCore};
use crate::config::ConfigCommand;
use crate::layout::{ShardId, ShardMap};
use crate::shard::DataIo;
use crate::wire::Proposal;

/// The node's link to the configuration service: map fetches and one proposal at a time.
#[derive(Debug)]
pub(super) struct ConfigLink {
    replicas: Vec<String>,
    target: usize,
    session: String,
    next_seq: u64,
    map_call: Option<CallId>,
    last_fetch: Option<Nanos>,
    proposal: Option<(u64, ConfigCommand, Option<CallId>)>,
}

impl ConfigLink {
    pub(super) fn new(config: &DataConfig) -> ConfigLink {
        ConfigLink {
            replicas: config.config_replicas.clone(),
            target: 0,
            session: config.session.clone(),
            next_seq: 1,
            map_call: None,
            last_fetch: None,
            proposal: None,
        }
    }

    /// Whether the map is due to be fetched again, `every` after the last fetch.
    pub(super) fn fetch_due(&self, now: Nanos, every: Nanos) -> bool {
        self.last_fetch.is_none_or(|last| now.saturating_sub(last) >= every)
    }

    pub(super) fn refresh_soon(&mut self) {
        self.last_fetch = None;
    }

    fn next_target(&mut self) {
        self.target = (self.target + 1) % self.replicas.len().max(1);
    }
}

impl DataCore {
    /// Asks a configuration replica for the map (one fetch at a time).
    pub(super) fn fetch_map(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, DataIo>>) {
        if self.link.replicas.is_empty() || self.link.map_call.is_some() {
            return;
        }
        self.link.last_fetch = Some(now);
        let call = self.ids.call();
        self.link.map_call = Some(call);
        self.calls.insert(call, CallFor::Map);
        out.push(Command::Call {
            to: self.link.replicas[self.link.target].clone(),
            call,
            request: Request::GetMap,
            deadline: self.config.replicate_deadline,
        });
    }

    pub(super) fn propose(&mut self, command: ConfigCommand, out: &mut Vec<Command<Dkv, DataIo>>) {
        if self.link.proposal.is_some() {
            return;
        }
        let seq = self.link.next_seq;
        self.link.next_seq += 1;
        self.stats.failovers_proposed += 1;
        tracing::warn!(node = %self.config.node, ?command, "proposing a change of the shard map");
        self.link.proposal = Some((seq, command, None));
        self.resend_proposal(out);
    }

    pub(super) fn resend_proposal(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some((seq, command, call)) = &mut self.link.proposal else { return };
        if call.is_some() || self.link.replicas.is_empty() {
            return;
        }
        let new_call = self.ids.call();
        *call = Some(new_call);
        self.calls.insert(new_call, CallFor::Proposal);
        let proposal = Proposal { client: self.link.session.clone(), seq: *seq, command: command.clone() };
        out.push(Command::Call {
            to: self.link.replicas[self.link.target].clone(),
            call: new_call,
            request: Request::Propose(proposal),
            deadline: self.config.replicate_deadline * 4,
        });
    }

    /// The configuration service's answer to a map read.
    pub(super) fn on_map(
        &mut self,
        now: Nanos,
        call: CallId,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        if self.link.map_call != Some(call) {
            return;
        }
        self.link.map_call = None;
        match body {
            Some(Response::Map(reply)) => {
                if let Some(map) = reply.map {
                    self.offer_map(now, map, out);
                }
            }
            _ => self.link.next_target(),
        }
    }

    /// The configuration service's answer to this node's proposal.
    /// An answer to an earlier proposal call than the one in flight is stale, and dropped.
    pub(super) fn on_proposed(
        &mut self,
        now: Nanos,
        call: CallId,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        if self.link.proposal.as_ref().is_some_and(|(_, _, pending)| *pending == Some(call)) {
            match body {
                Some(Response::Proposed(_)) => {
                    self.link.proposal = None;
                    self.link.last_fetch = None;
                    self.fetch_map(now, out);
                }
                Some(Response::NotLeader(hint)) => {
                    match hint.and_then(|leader| self.link.replicas.iter().position(|replica| *replica == leader)) {
                        Some(leader) => self.link.target = leader,
                        None => self.link.next_target(),
                    }
                    if let Some((_, _, pending)) = &mut self.link.proposal {
                        *pending = None;
                    }
                }
                _ => {
                    self.link.next_target();
                    if let Some((_, _, pending)) = &mut self.link.proposal {
                        *pending = None;
                    }
                }
            }
        }
    }

    /// Takes a newer map: a shard this node now leads is taken over; leases of shards it
    /// no longer leads are dropped.
    pub(super) fn offer_map(&mut self, now: Nanos, map: ShardMap, out: &mut Vec<Command<Dkv, DataIo>>) {
        if map.version() <= self.map.version() {
            return;
        }
        let old = std::mem::replace(&mut self.map, map);
        self.stats.maps_adopted += 1;
        tracing::info!(node = %self.config.node, version = self.map.version(), "adopted a newer shard map");
        let node = self.config.node.clone();
        // A shard this node joins (a backup added): its replica starts empty, and its
        // primary's takeover at the new epoch pushes it every record.
        for (shard, _) in self.map.shards_of_node(&node) {
            let weakened = self.config.weakened;
            self.replicas.entry(shard.0).or_insert_with(|| {
                let mut replica = crate::shard::ShardReplica::new();
                replica.weaken(weakened);
                replica
            });
        }
        let mut takeovers = Vec::new();
        let mut pushes = Vec::new();
        for (index, group) in self.map.groups().iter().enumerate() {
            let shard = index as u32;
            let before = old.group(ShardId(shard));
            let led_before = before.is_some_and(|before| before.primary == node) && !self.takeovers.is_taking(shard);
            if group.primary == node && !led_before {
                takeovers.push((shard, group.epoch));
            } else if group.primary == node && before.is_some_and(|before| before.epoch != group.epoch) {
                // Still this node's, with backups added or removed: it keeps what it knows
                // (its reads' state above all: a takeover would drop it, and the new
                // backups never granted the lease that covered those reads). Its lease
                // starts again from the new group's grants, and the new backups get every
                // record it holds.
                self.leases.drop_held(shard);
                let added: Vec<String> = group
                    .backups
                    .iter()
                    .filter(|backup| before.is_none_or(|before| !before.backups.contains(backup)))
                    .cloned()
                    .collect();
                pushes.push((shard, added));
            }
            if group.primary != node {
                // No longer this node's to lead: what it was doing as primary stops.
                self.leases.drop_held(shard);
                self.takeovers.cancel(shard);
                self.termination.drop_shard(shard);
                self.replication.drop_shard(shard);
                self.commit_on_vote.retain(|(pending, _)| *pending != shard);
            }
            if group.backups.contains(&node) {
                self.leases.heard_primary(shard, now);
            }
        }
        for (shard, epoch) in takeovers {
            self.start_takeover(shard, epoch, out);
        }
        for (shard, added) in pushes {
            self.push_table(shard, &added, out);
        }
    }
}
