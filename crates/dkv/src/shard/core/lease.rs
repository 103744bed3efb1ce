//! Leases, failure suspicion and the map.
//!
//! A primary asks its backups, every check, for a read lease reaching `lease_length`
//! ahead of its clock; a backup grants it durably. The lease is the timestamp at least f
//! backups granted, and the primary serves a read at `ts` only below it. Leases are in
//! timestamp space: safety needs no clock agreement, only that a primary taking over refuses
//! commit timestamps at or below every lease granted (it learns the largest from f+1
//! replicas, which include one of the f that granted the last lease).
//!
//! A backup that hears no lease request for `suspect_after` (times its position among the
//! backups, so the first proposes first) proposes to the configuration service that it take
//! over; the service's epoch check lets one proposal win. Every node fetches the map
//! periodically and takes the newer.

use std::collections::BTreeMap;

use crate::messages::{LeaseRequest, RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::Timestamp;

use super::group_log::AfterLog;
use super::{CallFor, DataConfig, DataCore};
use crate::config::ConfigCommand;
use crate::layout::{ShardId, ShardMap};
use crate::shard::replica::ShardRecord;
use crate::shard::DataIo;
use crate::wire::Proposal;

/// A primary's lease on one shard.
#[derive(Debug, Default)]
pub(super) struct Held {
    epoch: u64,
    grants: BTreeMap<String, Timestamp>,
    /// Reads are served below this.
    pub(super) until: Timestamp,
}

#[derive(Debug, Default)]
pub(super) struct Leases {
    pub(super) held: BTreeMap<u32, Held>,
    /// As a backup: when the primary last asked, by shard.
    pub(super) heard: BTreeMap<u32, Nanos>,
}

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

    pub(super) fn refresh_soon(&mut self) {
        self.last_fetch = None;
    }

    fn next_target(&mut self) {
        self.target = (self.target + 1) % self.replicas.len().max(1);
    }
}

fn ts(time: Nanos) -> Timestamp {
    Timestamp::new(time, 0)
}

impl DataCore {
    /// Whether this primary may serve a read of `shard` at `ts`.
    pub(super) fn under_lease(&self, shard: u32, ts: Timestamp) -> bool {
        !self.config.leases() || self.leases.held.get(&shard).is_some_and(|held| ts < held.until)
    }

    /// Every check: ask for leases, suspect silent primaries, fetch the map.
    pub(super) fn lease_tick(&mut self, now: Nanos, out: &mut Vec<Command<Dkv, DataIo>>) {
        let node = self.config.node.clone();
        let until = ts(now.saturating_add(self.config.lease_length.as_nanos() as u64));
        let mut requests = Vec::new();
        let mut suspects = Vec::new();
        for (index, group) in self.map.groups().iter().enumerate() {
            let shard = index as u32;
            // Lease requests double as the primary's heartbeat, so they go out with leases off
            // too (a primary then serves reads whatever the grants).
            if group.primary == node && !self.takeovers.contains_key(&shard) {
                requests.extend(group.backups.iter().map(|backup| (shard, group.epoch, backup.clone())));
            } else if let Some(position) = group.backups.iter().position(|backup| *backup == node) {
                let heard = *self.leases.heard.entry(shard).or_insert(now);
                let patience = self.config.suspect_after.as_nanos() as u64 * (position as u64 + 1);
                if !self.config.config_replicas.is_empty() && now.saturating_sub(heard) >= patience {
                    suspects.push((shard, group.epoch));
                }
            }
        }
        for (shard, epoch, backup) in requests {
            let call = self.ids.call();
            self.calls.insert(call, CallFor::Lease { shard, backup: backup.clone() });
            let request = LeaseRequest { shard, epoch, until };
            out.push(Command::Call {
                to: backup,
                call,
                request: Request::Lease(request),
                deadline: self.config.replicate_deadline,
            });
        }
        if let Some((shard, epoch)) = suspects.first().copied() {
            let command = ConfigCommand::Failover { shard: ShardId(shard), epoch, new_primary: node };
            self.propose(command, out);
        }
        self.resend_proposal(out);
        let due =
            self.link.last_fetch.is_none_or(|last| now.saturating_sub(last) >= self.config.map_every.as_nanos() as u64);
        if due {
            self.fetch_map(now, out);
        }
    }

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

    fn propose(&mut self, command: ConfigCommand, out: &mut Vec<Command<Dkv, DataIo>>) {
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

    fn resend_proposal(&mut self, out: &mut Vec<Command<Dkv, DataIo>>) {
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

    /// A backup grants its primary's lease, durably, then answers.
    pub(super) fn on_lease_request(
        &mut self,
        now: Nanos,
        from: &str,
        call: CallId,
        request: LeaseRequest,
    ) -> Option<Response> {
        let shard = request.shard;
        match self.role(shard, request.epoch) {
            Ok(crate::layout::ReplicaRole::Backup) => {}
            Ok(crate::layout::ReplicaRole::Primary) => {
                return Some(Response::refused(
                    RefusalKind::NotServing,
                    format!("{} is the primary of shard {shard}", self.config.node),
                ))
            }
            Err(refusal) => return Some(refusal),
        }
        let until = request.until;
        self.leases.heard.insert(shard, now);
        let record = ShardRecord::LeaseGranted { epoch: request.epoch, until };
        self.replicas.get_mut(&shard)?.apply(&record);
        let response = Response::Grant(until);
        self.log.push(shard, &record, AfterLog::Reply { to: from.to_string(), call, response });
        None
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

    pub(super) fn on_grant(&mut self, shard: u32, backup: String, until: Timestamp) {
        let Some(group) = self.map.group(ShardId(shard)) else { return };
        if group.primary != self.config.node {
            return;
        }
        let epoch = group.epoch;
        let f = self.map.f();
        let held = self.leases.held.entry(shard).or_default();
        if held.epoch != epoch {
            *held = Held { epoch, ..Held::default() };
        }
        held.grants.insert(backup, until);
        let mut grants: Vec<Timestamp> = held.grants.values().copied().collect();
        grants.sort_unstable_by(|a, b| b.cmp(a));
        if f > 0 && grants.len() >= f {
            held.until = held.until.max(grants[f - 1]);
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
            let led_before =
                before.is_some_and(|before| before.primary == node) && !self.takeovers.contains_key(&shard);
            if group.primary == node && !led_before {
                takeovers.push((shard, group.epoch));
            } else if group.primary == node && before.is_some_and(|before| before.epoch != group.epoch) {
                // Still this node's, with backups added or removed: it keeps what it knows
                // (its reads' state above all: a takeover would drop it, and the new
                // backups never granted the lease that covered those reads). Its lease
                // starts again from the new group's grants, and the new backups get every
                // record it holds.
                self.leases.held.remove(&shard);
                pushes.push(shard);
            }
            if group.primary != node {
                // No longer this node's to lead: what it was doing as primary stops.
                self.leases.held.remove(&shard);
                self.takeovers.remove(&shard);
                self.termination.drop_shard(shard);
                self.replication.drop_shard(shard);
                self.commit_on_vote.retain(|(pending, _)| *pending != shard);
            }
            if group.backups.contains(&node) {
                self.leases.heard.insert(shard, now);
            }
        }
        for (shard, epoch) in takeovers {
            self.start_takeover(shard, epoch, out);
        }
        for shard in pushes {
            self.push_table(shard, out);
        }
    }
}
