//! Read leases and failure suspicion.
//!
//! A primary asks its backups, every check, for a read lease reaching `lease_length`
//! ahead of its clock; a backup grants it durably. The lease is the timestamp at least f
//! backups granted, and the primary serves a read at `ts` only below it. Leases are in
//! timestamp space: safety needs no clock agreement, only that a primary taking over refuses
//! commit timestamps at or below every lease granted (it learns the largest from f+1
//! replicas, which include one of the f that granted the last lease). A backup logs a lease
//! ceiling a few lease lengths above its grant, so renewals under it cost no write. The
//! requests also carry the primary's watermark and settled point: backups collect and
//! settle below them as the primary does.
//!
//! A backup that hears no lease request for `suspect_after` (times its position among the
//! backups, so the first proposes first) proposes to the configuration service that it take
//! over; the service's epoch check lets one proposal win.

use std::collections::BTreeMap;

use crate::messages::{LeaseRequest, RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::Timestamp;

use super::group_log::AfterLog;
use super::replication::PendingKind;
use super::{CallFor, DataCore};
use crate::config::ConfigCommand;
use crate::layout::ShardId;
use crate::shard::replica::ShardRecord;
use crate::shard::DataIo;

/// A primary's lease on one shard: the grants of its backups at the group's epoch.
#[derive(Debug, Default)]
struct Held {
    epoch: u64,
    grants: BTreeMap<String, Timestamp>,
    /// Reads are served below this.
    until: Timestamp,
}

/// The leases this node holds as a primary, and, as a backup, when each primary last asked.
#[derive(Debug, Default)]
pub(super) struct Leases {
    held: BTreeMap<u32, Held>,
    heard: BTreeMap<u32, Nanos>,
    /// As a backup: per shard, the lease ceiling its log holds durably (a grant under it
    /// needs no write).
    durable_ceilings: BTreeMap<u32, Timestamp>,
}

impl Leases {
    /// A backup granted `until` on `shard` at `epoch`: the lease is the highest timestamp
    /// `f` backups granted, and never moves back within an epoch. A grant of a new epoch
    /// starts the lease again.
    pub(super) fn granted(&mut self, shard: u32, epoch: u64, backup: String, until: Timestamp, f: usize) {
        let held = self.held.entry(shard).or_default();
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

    /// Reads of `shard` are served below this (None: no lease).
    pub(super) fn until(&self, shard: u32) -> Option<Timestamp> {
        self.held.get(&shard).map(|held| held.until)
    }

    /// Whether the lease on `shard` covers a read at `ts`.
    pub(super) fn covers(&self, shard: u32, ts: Timestamp) -> bool {
        self.until(shard).is_some_and(|until| ts < until)
    }

    /// The lease on `shard` is void (a takeover, or a change of its group).
    pub(super) fn drop_held(&mut self, shard: u32) {
        self.held.remove(&shard);
    }

    /// As a backup: the log holds a lease ceiling of `until` on `shard`.
    pub(super) fn ceiling_durable(&mut self, shard: u32, until: Timestamp) {
        let held = self.durable_ceilings.entry(shard).or_default();
        *held = (*held).max(until);
    }

    /// As a backup: whether a grant of `until` on `shard` is under the durable ceiling.
    pub(super) fn under_ceiling(&self, shard: u32, until: Timestamp) -> bool {
        self.durable_ceilings.get(&shard).is_some_and(|ceiling| until <= *ceiling)
    }

    /// As a backup: the primary of `shard` asked at `now`.
    pub(super) fn heard_primary(&mut self, shard: u32, now: Nanos) {
        self.heard.insert(shard, now);
    }

    /// As a backup: when the primary of `shard` last asked, if it did.
    pub(super) fn primary_heard_at(&self, shard: u32) -> Option<Nanos> {
        self.heard.get(&shard).copied()
    }

    /// As a backup: how long the primary of `shard` has been silent (from `now` on, for
    /// a shard never heard of before).
    pub(super) fn primary_silent_for(&mut self, shard: u32, now: Nanos) -> Nanos {
        now.saturating_sub(*self.heard.entry(shard).or_insert(now))
    }
}

/// How many lease lengths a backup's logged lease ceiling reaches past the grant that
/// logged it: an idle primary renewing its lease costs its backups one fsync per this many
/// renewals.
const LEASE_CEILINGS: u64 = 4;

fn ts(time: Nanos) -> Timestamp {
    Timestamp::new(time, 0)
}

impl DataCore {
    /// Whether this primary may serve a read of `shard` at `ts`.
    pub(super) fn under_lease(&self, shard: u32, ts: Timestamp) -> bool {
        !self.config.leases() || self.leases.covers(shard, ts)
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
            if group.primary == node && !self.takeovers.is_taking(shard) {
                requests.extend(group.backups.iter().map(|backup| (shard, group.epoch, backup.clone())));
            } else if let Some(position) = group.backups.iter().position(|backup| *backup == node) {
                let silent = self.leases.primary_silent_for(shard, now);
                let patience = self.config.suspect_after.as_nanos() as u64 * (position as u64 + 1);
                if !self.config.config_replicas.is_empty() && silent >= patience {
                    suspects.push((shard, group.epoch));
                }
            }
        }
        let mut points = BTreeMap::new();
        for &(shard, epoch, _) in &requests {
            points.entry(shard).or_insert_with(|| self.settle_shard(shard, epoch));
        }
        for (shard, epoch, backup) in requests {
            let call = self.ids.call();
            self.calls.insert(call, CallFor::Lease { shard, backup: backup.clone() });
            let (watermark, settled) = points.get(&shard).copied().unwrap_or_default();
            let request = LeaseRequest { shard, epoch, until, watermark, settled };
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
        if self.link.fetch_due(now, self.config.map_every.as_nanos() as u64) {
            self.fetch_map(now, out);
        }
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
            Err(refusal) => {
                // The shard's primary still asking at an older epoch (it has not fetched the
                // map that added or removed a backup yet) is alive: no reason to suspect it.
                let primary = self.map.group(ShardId(shard)).is_some_and(|group| group.primary == from);
                if primary && matches!(refusal, Response::WrongEpoch(epoch) if epoch > request.epoch) {
                    self.leases.heard_primary(shard, now);
                }
                return Some(refusal);
            }
        }
        let until = request.until;
        self.leases.heard_primary(shard, now);
        let replica = self.replicas.get_mut(&shard)?;
        // What no read at or above the primary's watermark sees goes here too (a backup
        // serves no reads, and a backup taking over serves none below it); so do the entries
        // of the transactions every replica holds decided.
        replica.raise_watermark(request.watermark);
        self.stats.settled += replica.learn_settled(request.epoch, request.settled) as u64;
        let response = Response::Grant(until);
        // A successor must honour every grant, so the log holds a ceiling above them: a
        // grant under the ceiling already logged costs no write; one above it logs a new
        // ceiling `LEASE_CEILINGS` lease lengths further (a successor's commit floor may be
        // that much higher than the grants it had to honour).
        if self.leases.under_ceiling(shard, until) {
            return Some(response);
        }
        let headroom = self.config.lease_length.as_nanos() as u64 * LEASE_CEILINGS;
        let ceiling = Timestamp::new(until.time.saturating_add(headroom), until.client);
        let record = ShardRecord::LeaseGranted { epoch: request.epoch, until: ceiling };
        replica.apply(&record);
        let after = AfterLog::LeaseGranted { shard, ceiling, to: from.to_string(), call, response };
        self.log.push(shard, &record, after);
        None
    }

    /// As the primary of `shard` at `epoch`: drops the entries every backup holds decided,
    /// and returns the watermark and settled point its lease requests carry.
    fn settle_shard(&mut self, shard: u32, epoch: u64) -> (Timestamp, Timestamp) {
        let Some(replica) = self.replicas.get_mut(&shard) else { return Default::default() };
        let replication = &self.replication;
        let before = replica.settled_entries();
        let early = crate::shard::replica::weakened!(self.config.weakened, settle_early);
        let settled = replica.settle(epoch, |txn| {
            !early
                && (replication.contains(&(shard, txn, PendingKind::Prepared))
                    || replication.contains(&(shard, txn, PendingKind::Decided)))
        });
        self.stats.settled += (replica.settled_entries() - before) as u64;
        (replica.watermark(), settled)
    }

    pub(super) fn on_grant(&mut self, shard: u32, backup: String, until: Timestamp) {
        let Some(group) = self.map.group(ShardId(shard)) else { return };
        if group.primary != self.config.node {
            return;
        }
        let (epoch, f) = (group.epoch, self.map.f());
        self.leases.granted(shard, epoch, backup, until, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time: u64) -> Timestamp {
        Timestamp::new(time, 0)
    }

    #[test]
    fn the_lease_is_the_highest_timestamp_f_backups_granted_and_never_moves_back() {
        let mut leases = Leases::default();
        leases.granted(0, 1, "b1".into(), at(100), 2);
        assert_eq!(leases.until(0), Some(Timestamp::ZERO), "one grant of the two needed");
        assert!(!leases.covers(0, Timestamp::ZERO));
        leases.granted(0, 1, "b2".into(), at(80), 2);
        assert_eq!(leases.until(0), Some(at(80)), "both granted 80");
        assert!(leases.covers(0, at(79)) && !leases.covers(0, at(80)));
        leases.granted(0, 1, "b1".into(), at(60), 2);
        assert_eq!(leases.until(0), Some(at(80)), "a lower grant does not shorten it");
        leases.granted(0, 1, "b2".into(), at(150), 1);
        assert_eq!(leases.until(0), Some(at(150)));
    }

    #[test]
    fn a_grant_of_a_new_epoch_starts_the_lease_again_and_a_dropped_lease_covers_nothing() {
        let mut leases = Leases::default();
        leases.granted(0, 1, "b1".into(), at(100), 1);
        leases.granted(0, 2, "b2".into(), at(40), 2);
        assert_eq!(leases.until(0), Some(Timestamp::ZERO), "the old epoch's grants count no more");
        leases.granted(0, 2, "b1".into(), at(50), 2);
        assert_eq!(leases.until(0), Some(at(40)));
        leases.drop_held(0);
        assert_eq!(leases.until(0), None);
        assert!(!leases.covers(0, Timestamp::ZERO));
    }

    #[test]
    fn a_backup_measures_its_primarys_silence_from_the_last_request() {
        let mut leases = Leases::default();
        assert_eq!(leases.primary_silent_for(3, 500), 0, "never heard: silence starts now");
        assert_eq!(leases.primary_silent_for(3, 800), 300);
        leases.heard_primary(3, 700);
        assert_eq!(leases.primary_heard_at(3), Some(700));
        assert_eq!(leases.primary_silent_for(3, 800), 100);
    }

    /// Node `b`, started, backing up the one shard that `p` leads at `epoch` (with `c`).
    fn backup_b_of_p(epoch: u64) -> DataCore {
        use crate::layout::{Partitioning, ReplicaGroup, ShardMap};
        use virga_net::role::{Event, Role};
        let group = ReplicaGroup { primary: "p".into(), backups: vec!["b".into(), "c".into()], epoch };
        let map = ShardMap::new(Partitioning::Hash { shards: 1 }, vec![group], 1).unwrap();
        let mut backup = DataCore::new(super::super::DataConfig::new("b", map), Vec::new());
        backup.step(0, Event::Start, &mut Vec::new());
        backup
    }

    /// Found by seed 284 of `virga sim dkv --faults disk`: a backup that adopted the map
    /// adding a backup before its primary did refused the primary's requests at the older
    /// epoch and took them for silence, deposing a live primary.
    #[test]
    fn a_primary_asking_at_an_older_epoch_is_heard_alive() {
        use virga_net::role::{Event, Role};
        let mut backup = backup_b_of_p(2);
        let request = |epoch| {
            let until = at(10);
            Request::Lease(LeaseRequest { shard: 0, epoch, until, watermark: at(0), settled: at(0) })
        };
        for (from, now, heard) in [("c", 300, None), ("p", 500, Some(500))] {
            let mut out = Vec::new();
            backup.step(now, Event::Request { from: from.into(), call: CallId(1), request: request(1) }, &mut out);
            assert!(out
                .iter()
                .any(|command| matches!(command, Command::Reply { response: Response::WrongEpoch(2), .. })));
            assert_eq!(backup.leases.primary_heard_at(0), heard, "a request from {from}");
        }
    }

    /// A grant is answered only once a ceiling above it is durable: a renewal that arrives
    /// while the ceiling's write is in flight waits for a write of its own.
    #[test]
    fn a_grant_under_a_ceiling_not_yet_durable_waits_and_one_under_a_durable_ceiling_does_not() {
        use crate::shard::{DataIo, DataIoDone};
        use virga_net::role::{Event, Role};
        let mut backup = backup_b_of_p(1);
        let ask = |backup: &mut DataCore, call: u64, until: u64| {
            let request = LeaseRequest { shard: 0, epoch: 1, until: at(until), watermark: at(0), settled: at(0) };
            let mut out = Vec::new();
            backup.step(
                0,
                Event::Request { from: "p".into(), call: CallId(call), request: Request::Lease(request) },
                &mut out,
            );
            out
        };
        let replied = |out: &[Command<crate::Dkv, DataIo>], call: u64| {
            out.iter()
                .any(|command| matches!(command, Command::Reply { call: CallId(answered), .. } if *answered == call))
        };
        let first = ask(&mut backup, 1, 100);
        let io = first.iter().find_map(|command| match command {
            Command::Io { io, .. } => Some(*io),
            _ => None,
        });
        assert!(!replied(&first, 1), "the first grant waits for its ceiling");
        let second = ask(&mut backup, 2, 150);
        assert!(!replied(&second, 2), "the ceiling is logged but not durable yet");
        let mut out = Vec::new();
        let io = io.expect("the ceiling is written");
        backup.step(0, Event::IoDone { io, result: DataIoDone::Appended(Ok(1)) }, &mut out);
        assert!(replied(&out, 1));
        let next = out.iter().find_map(|command| match command {
            Command::Io { io, .. } => Some(*io),
            _ => None,
        });
        let mut out = Vec::new();
        backup.step(
            0,
            Event::IoDone { io: next.expect("the second's write"), result: DataIoDone::Appended(Ok(2)) },
            &mut out,
        );
        assert!(replied(&out, 2));
        let third = ask(&mut backup, 3, 200);
        assert!(replied(&third, 3), "under a durable ceiling: answered at once");
        assert!(!third.iter().any(|command| matches!(command, Command::Io { .. })), "and nothing written");
    }
}
