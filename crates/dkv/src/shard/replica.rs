//! One shard's replica state: versions in a [`VersionedStore`], MILANA's per-key
//! concurrency-control state, and the transaction table. Pure: the core around it
//! ([`super::DataCore`]) does the messaging and the logging.
//!
//! A primary reads ([`ShardReplica::get`], raising the key's latest read), validates
//! ([`ShardReplica::validate`], the seed's Algorithm 1), prepares and decides. A backup only
//! records what its primary replicates ([`ShardReplica::apply`]) in its transaction table:
//! replication is unordered, so a decision may arrive before its prepare, and versions are
//! rebuilt in timestamp order from the table when a backup takes over.

mod scan;
mod settled;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use virga_storage::{MvStore, Timestamp, TxnId, Version, VersionedStore};
use virga_txn::AbortReason;

pub use self::scan::{ScanRange, ScanResult};
pub use self::settled::SettledTxn;

/// A transaction's id: its client in the high 32 bits, the client's sequence number in the
/// low 32 (the same id on every shard).
pub fn txn_id(client: u32, seq: u32) -> TxnId {
    (u64::from(client) << 32) | u64::from(seq)
}

/// The (client, seq) of a transaction id.
pub fn txn_parts(txn: TxnId) -> (u32, u32) {
    ((txn >> 32) as u32, txn as u32)
}

/// One write: a value, or a delete (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOp {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// One read: the key and the version it returned ([`Timestamp::ZERO`] when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOp {
    pub key: Bytes,
    pub version: Timestamp,
    /// The value came from the client's cache (KAIROS), possibly from long before this
    /// transaction began.
    pub cached: bool,
}

/// A transaction's state at a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    Prepared,
    Committed,
    Aborted,
}

/// A transaction in the table: what it writes here and who else takes part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnEntry {
    pub commit_ts: Timestamp,
    pub writes: Vec<WriteOp>,
    pub participants: Vec<u32>,
    pub status: TxnStatus,
    /// The KAIROS validators it passed over.
    pub takeover_of: Vec<u32>,
}

/// What a replica logs and replicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardRecord {
    /// The primary voted commit: the transaction holds its written keys.
    /// `takeover_of`: the KAIROS validators it passed over (this shard validated it in their
    /// place), kept so that every later primary knows how high their floors must go.
    Prepared { txn: TxnId, commit_ts: Timestamp, writes: Vec<WriteOp>, participants: Vec<u32>, takeover_of: Vec<u32> },
    /// The coordinator's decision.
    Decided { txn: TxnId, commit: bool },
    /// This backup granted the primary of `epoch` a read lease up to `until`.
    LeaseGranted { epoch: u64, until: Timestamp },
    /// This replica answered the fetch of the primary of `epoch`: it takes no record of an
    /// older epoch from then on.
    Fence { epoch: u64 },
    /// A part of the primary's settled state (see [`SettledPart`]).
    Settled(SettledPart),
}

/// Some keys' versions and some settled transactions of a shard, as its primary holds them:
/// what a backup that missed records (new to the group, or restarted with the end of its
/// log lost) can no longer get as prepares and decisions. Merged, never replacing anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettledPart {
    /// Per key, its versions newest first.
    pub versions: Vec<(Bytes, Vec<Version>)>,
    pub txns: Vec<(TxnId, SettledTxn)>,
    /// KAIROS: per validator, the highest commit timestamp prepared in its place.
    pub validator_floors: Vec<(u32, Timestamp)>,
}

/// What a get found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetResult {
    /// The visible version (None: no version, or a delete).
    pub value: Option<Bytes>,
    /// Its timestamp and writer ([`Timestamp::ZERO`] and writer 0 when the key had none).
    pub version: Timestamp,
    pub writer: TxnId,
    /// A transaction prepared on the key commits at or below the read timestamp.
    pub prepared_below: bool,
}

/// MILANA's per-key state, in memory only (the lease covers its loss on failover).
#[derive(Debug, Default, Clone)]
struct KeyCc {
    /// The largest timestamp any read of the key was served at.
    latest_read: Timestamp,
    /// The transactions prepared on the key, with their commit timestamps. A primary lets
    /// one at a time prepare, but a replica rebuilt from backups' unordered records may
    /// hold several: a writer the old primary decided, whose decision reached no backup,
    /// and the next writer of the key it then let prepare. Each holds the key until its own
    /// decision, and a read at or above any of them sees a prepared writer below it.
    prepared: Vec<(TxnId, Timestamp)>,
}

impl KeyCc {
    fn prepared_at_or_below(&self, ts: Timestamp) -> bool {
        self.prepared.iter().any(|(_, prepared_ts)| *prepared_ts <= ts)
    }

    fn held_by_other(&self, txn: TxnId) -> bool {
        self.prepared.iter().any(|(owner, _)| *owner != txn)
    }

    fn hold(&mut self, txn: TxnId, commit_ts: Timestamp) {
        if !self.prepared.iter().any(|(owner, _)| *owner == txn) {
            self.prepared.push((txn, commit_ts));
        }
    }

    fn release(&mut self, txn: TxnId) {
        self.prepared.retain(|(owner, _)| *owner != txn);
    }

    /// Held by no transaction, and read last where no write can commit any more: below
    /// the watermark, or never (a zero latest read aborts nothing).
    fn idle_below(&self, watermark: Timestamp) -> bool {
        self.prepared.is_empty() && (self.latest_read == Timestamp::ZERO || self.latest_read < watermark)
    }
}

/// The rule for collecting a key's concurrency-control state (one rule outside tests).
#[cfg(not(test))]
#[derive(Debug, Clone, Copy)]
enum CcRule {
    Idle,
}

impl CcRule {
    fn drops(self, cc: &KeyCc, watermark: Timestamp) -> bool {
        match self {
            CcRule::Idle => cc.idle_below(watermark),
            #[cfg(test)]
            CcRule::Keep => false,
            #[cfg(test)]
            CcRule::Eager => cc.prepared.is_empty(),
        }
    }
}

/// Deliberately broken variants, for the checkers to catch. The switches exist only in
/// test builds and under the `sim` feature; otherwise this is empty and every check runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weakened {
    /// The primary skips Algorithm 1's `latestRead >= ts_commit` check (of keys and of
    /// scanned ranges).
    #[cfg(any(test, feature = "sim"))]
    pub skip_latest_read: bool,
    /// Cooperative termination takes a participant that never received the prepare for
    /// one that voted commit (breaking rule 2), also once that participant has recorded the
    /// abort (asked again, it answers "voted abort").
    #[cfg(any(test, feature = "sim"))]
    pub terminate_ignoring_missing_prepare: bool,
    /// The primary skips the `latestCommitted` check (the version read is still the newest)
    /// for reads a client served from its cache.
    #[cfg(any(test, feature = "sim"))]
    pub skip_cached_latest_committed: bool,
    /// The primary validates a read-write transaction in place of a KAIROS validator it
    /// passed over at any commit timestamp, even one under the lease it granted that
    /// validator (whose reads it cannot see).
    #[cfg(any(test, feature = "sim"))]
    pub skip_validator_lease: bool,
    /// A restarted backup does not ask its primaries for their records again, so what a
    /// lost write took from the end of its log stays lost on it.
    #[cfg(any(test, feature = "sim"))]
    pub skip_resync: bool,
    /// A primary settles a decided transaction (drops its entry, and counts it below the
    /// settled point it sends) before every backup holds its prepare and decision.
    #[cfg(any(test, feature = "sim"))]
    pub settle_early: bool,
}

/// Whether a weakening switch is on: never, in a build without the switches.
macro_rules! weakened {
    ($weakened:expr, $switch:ident) => {{
        #[cfg(any(test, feature = "sim"))]
        let on = $weakened.$switch;
        #[cfg(not(any(test, feature = "sim")))]
        let on = {
            let _ = &$weakened;
            false
        };
        on
    }};
}
pub(crate) use weakened;

/// One shard's replica.
pub struct ShardReplica<S: VersionedStore = MvStore> {
    store: S,
    /// The largest read lease this replica granted (as a backup), and the epoch below which
    /// it takes no record.
    lease_granted: Timestamp,
    fence: u64,
    /// Commit timestamps at or below this are refused: a primary that took over may not
    /// know the reads its predecessor served under its lease.
    commit_floor: Timestamp,
    /// Garbage-collection watermark: versions no read at or above it can see may be
    /// dropped, so reads below it are refused.
    watermark: Timestamp,
    cc: HashMap<Bytes, KeyCc>,
    /// The keys some prepared transaction holds, in order, so a scan finds the writers
    /// prepared in its range without walking every key's state.
    held: BTreeSet<Bytes>,
    /// Ranges scanned, each with the largest timestamp it was read at.
    range_reads: Vec<ScanRange>,
    txns: HashMap<TxnId, TxnEntry>,
    /// The entries of `txns` by commit timestamp, oldest first (pruning walks them).
    by_ts: BTreeSet<(Timestamp, TxnId)>,
    /// Decided transactions whose entries were dropped, held by every replica of the group:
    /// what a late record, a retried prepare or a terminator can still ask of them.
    settled_txns: HashMap<TxnId, SettledTxn>,
    /// The group's settled point as this replica knows it, and the epoch of the primary that
    /// set it (see `settled`).
    settled: settled::SettledPoint,
    /// Decisions replicated before their prepare (a backup's unordered records).
    early_decisions: HashMap<TxnId, bool>,
    /// KAIROS: per validator, the highest commit timestamp of a transaction prepared here
    /// in its place (rebuilt from the records, so a new primary knows it too).
    validator_takeovers: BTreeMap<u32, Timestamp>,
    weakened: Weakened,
    /// Tests only: how concurrency-control state is collected (kept whole by the oracle the
    /// rule is held to, or too eagerly by the broken variant it must catch).
    #[cfg(test)]
    pub(crate) cc_rule: CcRule,
    /// Tests only, broken: settling drops a transaction's id with its entry.
    #[cfg(test)]
    pub(crate) forget_settled_ids: bool,
}

/// Tests only: the rule for collecting a key's concurrency-control state.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CcRule {
    /// Drop a key's state once no transaction holds it and it was read last below the
    /// watermark (the rule).
    Idle,
    /// Keep everything (the oracle).
    Keep,
    /// Broken: drop a key's state once no transaction holds it, whenever it was read.
    Eager,
}

impl ShardReplica<MvStore> {
    pub fn new() -> ShardReplica<MvStore> {
        ShardReplica::on(MvStore::new())
    }
}

impl Default for ShardReplica<MvStore> {
    fn default() -> Self {
        ShardReplica::new()
    }
}

impl<S: VersionedStore> ShardReplica<S> {
    pub fn on(store: S) -> ShardReplica<S> {
        ShardReplica {
            store,
            lease_granted: Timestamp::ZERO,
            fence: 0,
            commit_floor: Timestamp::ZERO,
            watermark: Timestamp::ZERO,
            cc: HashMap::new(),
            held: BTreeSet::new(),
            range_reads: Vec::new(),
            txns: HashMap::new(),
            by_ts: BTreeSet::new(),
            settled_txns: HashMap::new(),
            settled: settled::SettledPoint::default(),
            early_decisions: HashMap::new(),
            validator_takeovers: BTreeMap::new(),
            weakened: Weakened::default(),
            #[cfg(test)]
            cc_rule: CcRule::Idle,
            #[cfg(test)]
            forget_settled_ids: false,
        }
    }

    /// The highest commit timestamp of a transaction prepared here in `validator`'s place
    /// (zero: none).
    pub fn takeover_high(&self, validator: u32) -> Timestamp {
        self.validator_takeovers.get(&validator).copied().unwrap_or(Timestamp::ZERO)
    }

    pub fn weaken(&mut self, weakened: Weakened) {
        self.weakened = weakened;
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// A transaction's entry, while it has one (settled transactions have none).
    pub fn txn(&self, txn: TxnId) -> Option<&TxnEntry> {
        self.txns.get(&txn)
    }

    /// What this replica knows of a transaction's state, with an entry or settled.
    pub fn status(&self, txn: TxnId) -> Option<TxnStatus> {
        match (self.txns.get(&txn), self.settled_txns.get(&txn)) {
            (Some(entry), _) => Some(entry.status),
            (None, Some(settled)) if settled.commit => Some(TxnStatus::Committed),
            (None, Some(_)) => Some(TxnStatus::Aborted),
            (None, None) => None,
        }
    }

    /// Transactions prepared and not yet decided, in id order.
    pub fn prepared(&self) -> Vec<(TxnId, &TxnEntry)> {
        let mut prepared: Vec<(TxnId, &TxnEntry)> = self
            .txns
            .iter()
            .filter(|(_, entry)| entry.status == TxnStatus::Prepared)
            .map(|(txn, entry)| (*txn, entry))
            .collect();
        prepared.sort_unstable_by_key(|(txn, _)| *txn);
        prepared
    }

    /// A decision that arrived before the transaction's prepare, if any.
    pub fn decided_early(&self, txn: TxnId) -> Option<bool> {
        self.early_decisions.get(&txn).copied()
    }

    /// How many transactions are prepared and not yet decided.
    pub fn prepared_count(&self) -> usize {
        self.txns.values().filter(|entry| entry.status == TxnStatus::Prepared).count()
    }

    /// Loads a committed version outside any transaction (initial data, version zero). It
    /// goes below the versions the replica already holds: a node loads its data after its
    /// log replayed the transactions that wrote over it.
    pub fn load(&mut self, key: Bytes, value: Bytes) {
        let entry = self.store.entry(&key);
        insert_below_newer(&self.store, &entry, Version { ts: Timestamp::ZERO, writer: 0, value: Some(value) });
    }

    pub fn lease_granted(&self) -> Timestamp {
        self.lease_granted
    }

    pub fn fence(&self) -> u64 {
        self.fence
    }

    pub fn commit_floor(&self) -> Timestamp {
        self.commit_floor
    }

    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Raises the watermark (it never goes back); installs from then on drop what no read
    /// at or above it sees.
    pub fn raise_watermark(&mut self, watermark: Timestamp) {
        self.watermark = self.watermark.max(watermark);
        self.forget_ranges_below(self.watermark);
    }

    /// Drops, on every key, the versions no read at or above the watermark sees, and the
    /// concurrency-control state no longer able to abort anything: a key no transaction
    /// holds, read last below the watermark. (Every write from then on commits at or above
    /// the watermark, [`ShardReplica::validate`], so a latest read below it never aborts one.)
    pub fn collect(&mut self) -> u64 {
        let watermark = self.watermark;
        let rule = self.cc_rule();
        self.cc.retain(|_, cc| !rule.drops(cc, watermark));
        self.store.gc(self.watermark).versions_dropped
    }

    /// Keys with concurrency-control state (latest reads and prepared writers).
    pub fn cc_entries(&self) -> usize {
        self.cc.len()
    }

    /// Transactions in the table, and decisions waiting for their prepare.
    pub fn txn_entries(&self) -> usize {
        self.txns.len() + self.early_decisions.len()
    }

    /// The lowest commit timestamp a write may have here: above the commit floor of a
    /// takeover, and at or above the watermark (below it, the reads a write must not pass
    /// may be forgotten).
    pub fn write_floor(&self) -> Timestamp {
        self.commit_floor.max(self.watermark)
    }

    fn cc_rule(&self) -> CcRule {
        #[cfg(test)]
        return self.cc_rule;
        #[cfg(not(test))]
        return CcRule::Idle;
    }

    fn hold(&mut self, key: Bytes, txn: TxnId, commit_ts: Timestamp) {
        self.cc.entry(key.clone()).or_default().hold(txn, commit_ts);
        self.held.insert(key);
    }

    /// `txn` holds `key` no more; state that can no longer abort anything goes.
    fn release(&mut self, key: &Bytes, txn: TxnId) {
        let rule = self.cc_rule();
        let Some(cc) = self.cc.get_mut(key) else { return };
        cc.release(txn);
        if cc.prepared.is_empty() {
            self.held.remove(key);
            if rule.drops(cc, self.watermark) {
                self.cc.remove(key);
            }
        }
    }

    /// Every transaction this replica holds, as the records that rebuild it.
    pub fn records(&self) -> Vec<ShardRecord> {
        let mut txns: Vec<(&TxnId, &TxnEntry)> = self.txns.iter().collect();
        txns.sort_unstable_by_key(|(txn, _)| **txn);
        let mut records = Vec::with_capacity(txns.len() * 2);
        for (txn, entry) in txns {
            records.push(ShardRecord::Prepared {
                txn: *txn,
                commit_ts: entry.commit_ts,
                writes: entry.writes.clone(),
                participants: entry.participants.clone(),
                takeover_of: entry.takeover_of.clone(),
            });
            match entry.status {
                TxnStatus::Prepared => {}
                TxnStatus::Committed => records.push(ShardRecord::Decided { txn: *txn, commit: true }),
                TxnStatus::Aborted => records.push(ShardRecord::Decided { txn: *txn, commit: false }),
            }
        }
        let mut early: Vec<(&TxnId, &bool)> = self.early_decisions.iter().collect();
        early.sort_unstable();
        records.extend(early.into_iter().map(|(txn, commit)| ShardRecord::Decided { txn: *txn, commit: *commit }));
        records
    }

    /// Makes this replica serve after a takeover (Algorithm 2's end): prepared transactions
    /// hold their keys, no read is remembered, and commit timestamps at or below `floor` are
    /// refused. The versions stay: every committed decision this replica holds, its own or
    /// merged, installed them where they belong as it applied them (in any order).
    pub fn take_over(&mut self, floor: Timestamp) {
        self.cc.clear();
        self.held.clear();
        self.range_reads.clear();
        let prepared: Vec<(TxnId, Timestamp, Vec<Bytes>)> = self
            .prepared()
            .into_iter()
            .map(|(txn, entry)| (txn, entry.commit_ts, entry.writes.iter().map(|write| write.key.clone()).collect()))
            .collect();
        for (txn, commit_ts, keys) in prepared {
            for key in keys {
                self.hold(key, txn, commit_ts);
            }
        }
        self.commit_floor = self.commit_floor.max(floor);
    }

    /// MILANA's get at `ts`: the youngest committed version at or below it, whether a
    /// prepared writer commits at or below it, and the key's latest read raised to `ts`.
    pub fn get(&mut self, key: &Bytes, ts: Timestamp) -> GetResult {
        let cc = self.cc.entry(key.clone()).or_default();
        cc.latest_read = cc.latest_read.max(ts);
        let prepared_below = cc.prepared_at_or_below(ts);
        let visible = self.store.find(key).and_then(|entry| self.store.read_at(&entry, ts).visible);
        match visible {
            Some(version) => {
                GetResult { value: version.value, version: version.ts, writer: version.writer, prepared_below }
            }
            None => GetResult { prepared_below, ..GetResult::default() },
        }
    }

    fn newest(&self, key: &Bytes) -> Timestamp {
        self.store.find(key).map_or(Timestamp::ZERO, |entry| self.store.newest(&entry).ts)
    }

    /// The seed's Algorithm 1: whether `txn` may prepare here. Changes nothing.
    pub fn validate(
        &self,
        txn: TxnId,
        commit_ts: Timestamp,
        reads: &[ReadOp],
        scans: &[ScanRange],
        writes: &[WriteOp],
    ) -> Result<(), AbortReason> {
        let held_by_other = |key: &Bytes| self.cc.get(key).is_some_and(|cc| cc.held_by_other(txn));
        for read in reads {
            if held_by_other(&read.key) {
                return Err(AbortReason::ReadPrepared);
            }
            let skip = read.cached && weakened!(self.weakened, skip_cached_latest_committed);
            if !skip && self.newest(&read.key) != read.version {
                return Err(AbortReason::ReadStale);
            }
        }
        self.validate_scans(txn, scans)?;
        for write in writes {
            if held_by_other(&write.key) {
                return Err(AbortReason::WritePrepared);
            }
            let latest_read = self.cc.get(&write.key).map_or(Timestamp::ZERO, |cc| cc.latest_read);
            if !weakened!(self.weakened, skip_latest_read) && latest_read >= commit_ts {
                return Err(AbortReason::WriteAfterRead);
            }
            if !weakened!(self.weakened, skip_latest_read) && self.under_range_read(&write.key, commit_ts) {
                return Err(AbortReason::Phantom);
            }
            if self.newest(&write.key) >= commit_ts {
                return Err(AbortReason::WriteStale);
            }
        }
        // After a takeover: a read the old primary served under its lease may lie at or
        // above this commit timestamp, and its latest-read state is gone. Below the
        // watermark, the latest reads may be collected.
        if !writes.is_empty() && (commit_ts <= self.commit_floor || commit_ts < self.watermark) {
            return Err(AbortReason::BelowCommitFloor);
        }
        Ok(())
    }

    /// A read-only transaction validated here at `commit_ts` (nothing held or logged): its
    /// reads raise their keys' latest read and its scans are remembered, as gets and scans
    /// at that timestamp would.
    pub fn note_validated_reads(&mut self, commit_ts: Timestamp, reads: &[ReadOp], scans: &[ScanRange]) {
        for read in reads {
            let cc = self.cc.entry(read.key.clone()).or_default();
            cc.latest_read = cc.latest_read.max(commit_ts);
        }
        for range in scans {
            self.remember_range(ScanRange { ts: commit_ts, ..range.clone() });
        }
    }

    /// The keys of `reads` whose version is no longer the newest committed: what a caching
    /// client must drop after a stale read aborted its transaction.
    pub fn stale_reads(&self, reads: &[ReadOp]) -> Vec<Bytes> {
        reads.iter().filter(|read| self.newest(&read.key) != read.version).map(|read| read.key.clone()).collect()
    }

    /// Prepares a validated transaction at the primary (`record`, a [`ShardRecord::Prepared`]):
    /// its written keys are held, and its reads raise their keys' latest read to the commit
    /// timestamp (a later writer below it would invalidate what this transaction read).
    /// Returns the record to log and replicate.
    pub fn prepare(&mut self, record: ShardRecord, reads: &[ReadOp], scans: &[ScanRange]) -> ShardRecord {
        if let ShardRecord::Prepared { commit_ts, .. } = &record {
            self.note_validated_reads(*commit_ts, reads, scans);
        }
        self.apply(&record);
        record
    }

    /// Applies a record: a prepare holds the written keys; a commit installs the versions
    /// (on a replica that serves, in the store) and releases them; an abort releases them.
    /// Idempotent: a record seen twice changes nothing the second time.
    pub fn apply(&mut self, record: &ShardRecord) {
        match record {
            ShardRecord::Prepared { txn, commit_ts, writes, participants, takeover_of } => {
                if self.txns.contains_key(txn) || self.settled_txns.contains_key(txn) {
                    return;
                }
                for validator in takeover_of {
                    let high = self.validator_takeovers.entry(*validator).or_default();
                    *high = (*high).max(*commit_ts);
                }
                for write in writes {
                    self.hold(write.key.clone(), *txn, *commit_ts);
                }
                let entry = TxnEntry {
                    commit_ts: *commit_ts,
                    writes: writes.clone(),
                    participants: participants.clone(),
                    status: TxnStatus::Prepared,
                    takeover_of: takeover_of.clone(),
                };
                self.txns.insert(*txn, entry);
                self.by_ts.insert((*commit_ts, *txn));
                if let Some(commit) = self.early_decisions.remove(txn) {
                    self.decide(*txn, commit);
                }
            }
            ShardRecord::Decided { txn, commit } => {
                if self.settled_txns.contains_key(txn) {
                    return;
                }
                if self.txns.contains_key(txn) {
                    self.decide(*txn, *commit);
                } else {
                    self.early_decisions.insert(*txn, *commit);
                }
            }
            ShardRecord::LeaseGranted { until, .. } => self.lease_granted = self.lease_granted.max(*until),
            ShardRecord::Fence { epoch } => self.fence = self.fence.max(*epoch),
            ShardRecord::Settled(part) => self.merge_settled(part),
        }
    }

    fn decide(&mut self, txn: TxnId, commit: bool) {
        let Some(entry) = self.txns.get_mut(&txn) else { return };
        if entry.status != TxnStatus::Prepared {
            return;
        }
        entry.status = if commit { TxnStatus::Committed } else { TxnStatus::Aborted };
        let (commit_ts, writes) = (entry.commit_ts, entry.writes.clone());
        for write in &writes {
            self.release(&write.key, txn);
            if commit {
                let key_entry = self.store.entry(&write.key);
                let version = Version { ts: commit_ts, writer: txn, value: write.value.clone() };
                // Validation made the version the key's newest. On a replica rebuilt from
                // unordered records (a backup that took over holding this transaction
                // prepared but a later writer of the key committed, whose prepare the old
                // primary took only once this one was decided) it may come late: it goes
                // below the newer one, so reads between the two see it.
                if self.store.install(&key_entry, version.clone(), self.watermark).is_err() {
                    insert_below_newer(&self.store, &key_entry, version);
                }
            }
        }
    }

    /// How many transactions this replica holds as committed, with entries or settled.
    pub fn committed_count(&self) -> usize {
        let with_entries = self.txns.values().filter(|entry| entry.status == TxnStatus::Committed).count();
        with_entries + self.settled_txns.values().filter(|settled| settled.commit).count()
    }
}

/// Puts `version` into a key's history below the newer versions it already holds (the
/// store only appends newest-first): the history is read back version by version, and
/// rebuilt with `version` in its place. Nothing is collected; a version of the same
/// timestamp already there stands.
fn insert_below_newer<S: VersionedStore>(store: &S, entry: &S::Entry, version: Version) {
    let mut history = Vec::new();
    let mut at = Some(Timestamp::MAX);
    while let Some(ts) = at {
        let Some(visible) = store.read_at(entry, ts).visible else { break };
        at = just_below(visible.ts);
        history.push(visible);
    }
    if history.iter().any(|held| held.ts == version.ts) {
        return;
    }
    history.push(version);
    history.sort_by_key(|held| held.ts);
    let mut history = history.into_iter();
    if let Some(oldest) = history.next() {
        store.reset(entry, oldest);
    }
    for newer in history {
        // Strictly increasing timestamps: never refused.
        let _ = store.install(entry, newer, Timestamp::ZERO);
    }
}

/// The greatest timestamp below `ts`, if any.
fn just_below(ts: Timestamp) -> Option<Timestamp> {
    match (ts.time, ts.client) {
        (0, 0) => None,
        (time, 0) => Some(Timestamp::new(time - 1, u32::MAX)),
        (time, client) => Some(Timestamp::new(time, client - 1)),
    }
}
