//! A primary taking over a shard (after a failover, or its own restart): the seed's
//! Algorithm 2.
//!
//! It fetches the transaction tables of f other replicas of the group (which, on answering,
//! fence the old primary out: they take no record of an older epoch), merges them with its
//! own (a transaction committed anywhere is committed; one decided aborted anywhere is
//! aborted; one prepared stays prepared, and cooperative termination decides it if its
//! client does not), rebuilds its versions in commit order, refuses commit timestamps at or
//! below the largest lease granted, and pushes the merged table to its backups. It serves
//! nothing until then.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::messages::{Fetch, FetchTable, RefusalKind, Request, Response};
use crate::Dkv;
use virga_net::role::{CallId, Command, Nanos};
use virga_storage::Timestamp;

use super::group_log::AfterLog;
use super::replication::pending_key;
use super::{CallFor, DataCore};
use crate::layout::ShardId;
use crate::shard::replica::{ShardRecord, TxnStatus};
use crate::shard::DataIo;

/// One shard being taken over: the tables fetched so far and the fetches out.
#[derive(Debug, Default)]
struct Takeover {
    epoch: u64,
    /// Tables received, by replica: the records and the highest lease it granted.
    tables: BTreeMap<String, (Vec<ShardRecord>, Timestamp)>,
    calls: HashMap<CallId, String>,
}

/// What the fetched tables of a takeover add up to: every record they hold, prepares
/// first (so that every decision finds its transaction), and the highest lease granted.
#[derive(Debug, PartialEq)]
pub(super) struct Fetched {
    pub(super) records: Vec<ShardRecord>,
    pub(super) lease: Timestamp,
}

/// The shards this node is taking over.
#[derive(Debug, Default)]
pub(super) struct Takeovers {
    shards: BTreeMap<u32, Takeover>,
}

impl Takeovers {
    pub(super) fn start(&mut self, shard: u32, epoch: u64) {
        self.shards.insert(shard, Takeover { epoch, ..Takeover::default() });
    }

    pub(super) fn is_taking(&self, shard: u32) -> bool {
        self.shards.contains_key(&shard)
    }

    pub(super) fn shards(&self) -> Vec<u32> {
        self.shards.keys().copied().collect()
    }

    /// Stops taking `shard` over (this node no longer leads it).
    pub(super) fn cancel(&mut self, shard: u32) {
        self.shards.remove(&shard);
    }

    /// The epoch the takeover of `shard` fetches at, and the `backups` to ask now: neither
    /// heard from nor being asked. None if `shard` is not being taken over.
    pub(super) fn unasked(&self, shard: u32, backups: &[String]) -> Option<(u64, Vec<String>)> {
        let takeover = self.shards.get(&shard)?;
        let unasked = backups
            .iter()
            .filter(|backup| {
                !takeover.tables.contains_key(*backup) && !takeover.calls.values().any(|asked| asked == *backup)
            })
            .cloned()
            .collect();
        Some((takeover.epoch, unasked))
    }

    pub(super) fn asked(&mut self, shard: u32, call: CallId, backup: String) {
        if let Some(takeover) = self.shards.get_mut(&shard) {
            takeover.calls.insert(call, backup);
        }
    }

    /// A fetch ended: the replica it asked, if the takeover still waits for it.
    pub(super) fn call_ended(&mut self, shard: u32, call: CallId) -> Option<String> {
        self.shards.get_mut(&shard)?.calls.remove(&call)
    }

    /// A replica's table (only records of `shard`'s transactions are kept); the number of
    /// tables the takeover holds now.
    pub(super) fn table(&mut self, shard: u32, from: String, records: Vec<ShardRecord>, lease: Timestamp) -> usize {
        let Some(takeover) = self.shards.get_mut(&shard) else { return 0 };
        // A prepare of another shard's transaction is no part of this shard's table.
        let records = records
            .into_iter()
            .filter(|record| match record {
                ShardRecord::Prepared { participants, .. } => participants.contains(&shard),
                _ => true,
            })
            .collect();
        takeover.tables.insert(from, (records, lease));
        takeover.tables.len()
    }

    /// Ends the takeover of `shard` with what its tables add up to.
    pub(super) fn finish(&mut self, shard: u32) -> Option<Fetched> {
        let takeover = self.shards.remove(&shard)?;
        let mut fetched = Fetched { records: Vec::new(), lease: Timestamp::ZERO };
        for (records, lease) in takeover.tables.into_values() {
            fetched.lease = fetched.lease.max(lease);
            fetched.records.extend(records);
        }
        fetched.records.sort_by_key(|record| !matches!(record, ShardRecord::Prepared { .. }));
        Some(fetched)
    }
}

impl DataCore {
    /// Starts taking over `shard` at `epoch`: fetches from every backup of the group.
    pub(super) fn start_takeover(&mut self, shard: u32, epoch: u64, out: &mut Vec<Command<Dkv, DataIo>>) {
        self.stats.takeovers += 1;
        tracing::info!(node = %self.config.node, shard, epoch, "taking over the shard as its primary");
        self.leases.drop_held(shard);
        self.assume_validator_leases(shard);
        self.takeovers.start(shard, epoch);
        self.send_fetches(shard, out);
    }

    /// Fetches from each backup not yet heard and not being asked.
    pub(super) fn send_fetches(&mut self, shard: u32, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(group) = self.map.group(ShardId(shard)).cloned() else { return };
        let Some((epoch, unasked)) = self.takeovers.unasked(shard, &group.backups) else { return };
        for backup in unasked {
            let call = self.ids.call();
            self.takeovers.asked(shard, call, backup.clone());
            self.calls.insert(call, CallFor::Fetch { shard });
            out.push(Command::Call {
                to: backup,
                call,
                request: Request::Fetch(Fetch { shard, epoch }),
                deadline: self.config.replicate_deadline,
            });
        }
        if group.backups.is_empty() {
            self.finish_takeover(shard, out);
        }
    }

    /// A replica answers a new primary's fetch: it fences older epochs out (durably), then
    /// sends its table.
    pub(super) fn on_fetch(&mut self, from: &str, call: CallId, fetch: Fetch) -> Option<Response> {
        let shard = fetch.shard;
        let Some(group) = self.map.group(ShardId(shard)) else {
            return Some(Response::refused(RefusalKind::NotServing, format!("shard {shard} is not in the map")));
        };
        let known_primary = group.primary == from && group.epoch == fetch.epoch;
        // The node may not have the new map yet: a member of the group asking for a newer
        // epoch is taken at its word (the configuration service made it primary; if not,
        // it cannot gather the f backups it needs anyway).
        let newer_member = fetch.epoch > group.epoch && group.replicas().any(|replica| replica == from);
        if !known_primary && !newer_member {
            return Some(Response::WrongEpoch(group.epoch));
        }
        let replica = self.replicas.get_mut(&shard)?;
        if fetch.epoch < replica.fence() {
            return Some(Response::WrongEpoch(replica.fence()));
        }
        let record = ShardRecord::Fence { epoch: fetch.epoch };
        replica.apply(&record);
        let table = FetchTable { records: replica.records(), lease: replica.lease_granted() };
        let after = AfterLog::Reply { to: from.to_string(), call, response: Response::Table(table) };
        self.log.push(shard, &record, after);
        // A newer epoch than this node's map: fetch the map at the next check.
        self.link.refresh_soon();
        None
    }

    /// A fetched table (or its failure: the next check asks again).
    pub(super) fn on_table(
        &mut self,
        now: Nanos,
        call: CallId,
        shard: u32,
        body: Option<Response>,
        out: &mut Vec<Command<Dkv, DataIo>>,
    ) {
        let Some(from) = self.takeovers.call_ended(shard, call) else { return };
        let held = match body {
            Some(Response::Table(table)) => self.takeovers.table(shard, from, table.records, table.lease),
            Some(Response::WrongEpoch(_)) => {
                // This node's map may be the stale one.
                self.fetch_map(now, out);
                return;
            }
            _ => return,
        };
        if held >= self.map.f() {
            self.finish_takeover(shard, out);
        }
    }

    /// Algorithm 2's merge and what follows it.
    fn finish_takeover(&mut self, shard: u32, out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(fetched) = self.takeovers.finish(shard) else { return };
        let leases = self.config.leases();
        let Some(replica) = self.replicas.get_mut(&shard) else { return };
        let floor = replica.lease_granted().max(fetched.lease);
        for record in &fetched.records {
            replica.apply(record);
        }
        replica.take_over(if leases { floor } else { Timestamp::ZERO });
        let mut records = replica.records();
        // A replica that holds prepared a transaction this one settled lost its decision
        // (the end of its log): it gets the decision again.
        for record in &fetched.records {
            let ShardRecord::Prepared { txn, .. } = record else { continue };
            if replica.txn(*txn).is_none() {
                if let Some(status) = replica.status(*txn) {
                    records.push(ShardRecord::Decided { txn: *txn, commit: status == TxnStatus::Committed });
                }
            }
        }
        let prepared: Vec<u64> = replica.prepared().into_iter().map(|(txn, _)| txn).collect();
        self.stats.merged_records += records.len() as u64;
        for record in records {
            let Some(key) = pending_key(shard, &record) else { continue };
            self.replicate(key, record, None, out);
        }
        for txn in prepared {
            self.termination.prepared((shard, txn), self.now);
        }
    }

    /// Sends every record this primary holds for `shard` to its backups, without logging
    /// them again (records already on their way are left to their own replication), and
    /// its settled state to the backups `added` to the group (they start empty).
    pub(super) fn push_table(&mut self, shard: u32, added: &[String], out: &mut Vec<Command<Dkv, DataIo>>) {
        let Some(replica) = self.replicas.get(&shard) else { return };
        for record in replica.records() {
            let Some(key) = pending_key(shard, &record) else { continue };
            if self.replication.contains(&key) {
                continue;
            }
            self.replication.durable(key, record, BTreeSet::new(), true, self.now);
            self.send_replicas(key, out);
        }
        if !added.is_empty() {
            self.send_settled_state(shard, added, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(txn: u64, participants: Vec<u32>) -> ShardRecord {
        ShardRecord::Prepared {
            txn,
            commit_ts: Timestamp::ZERO,
            writes: Vec::new(),
            participants,
            takeover_of: Vec::new(),
        }
    }

    fn backups() -> Vec<String> {
        vec!["b1".to_string(), "b2".to_string()]
    }

    #[test]
    fn each_backup_is_asked_once_until_its_fetch_ends() {
        let mut takeovers = Takeovers::default();
        assert_eq!(takeovers.unasked(0, &backups()), None, "no takeover of shard 0");
        takeovers.start(0, 4);
        assert_eq!(takeovers.unasked(0, &backups()), Some((4, backups())));
        takeovers.asked(0, CallId(1), "b1".into());
        assert_eq!(takeovers.unasked(0, &backups()), Some((4, vec!["b2".to_string()])));
        assert_eq!(takeovers.call_ended(0, CallId(1)), Some("b1".to_string()));
        assert_eq!(takeovers.call_ended(0, CallId(1)), None, "ended once");
        assert_eq!(takeovers.unasked(0, &backups()), Some((4, backups())), "a failed fetch is asked again");
        assert_eq!(takeovers.table(0, "b1".into(), Vec::new(), Timestamp::ZERO), 1);
        assert_eq!(takeovers.unasked(0, &backups()), Some((4, vec!["b2".to_string()])), "b1's table is in");
        takeovers.cancel(0);
        assert!(!takeovers.is_taking(0));
    }

    #[test]
    fn the_tables_merge_with_prepares_first_the_highest_lease_and_only_this_shards_prepares() {
        let mut takeovers = Takeovers::default();
        takeovers.start(1, 2);
        let decided = ShardRecord::Decided { txn: 7, commit: true };
        let lease = |time| Timestamp::new(time, 0);
        takeovers.table(1, "b1".into(), vec![decided.clone(), prepared(7, vec![1, 2])], lease(30));
        takeovers.table(1, "b2".into(), vec![prepared(8, vec![0, 2])], lease(50));
        let fetched = takeovers.finish(1).expect("shard 1 was being taken over");
        assert_eq!(fetched.lease, lease(50));
        assert_eq!(fetched.records, vec![prepared(7, vec![1, 2]), decided], "prepare 8 is not shard 1's");
        assert_eq!(takeovers.finish(1), None);
    }
}
