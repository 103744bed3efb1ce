//! The configuration service: the shard map, group memberships and epochs
//! ([`crate::ConfigState`]) replicated by Raft over 3 or 5 replicas.
//!
//! Raft is raft-rs 0.7 (tikv), not Virga's own: its `RawNode` is a state machine with no
//! clock, thread or I/O (time enters as ticks, messages and persistence leave as a Ready),
//! which is the shape of a Virga core, so the same [`ConfigCore`] runs in the simulator, in
//! one process and over gRPC. openraft runs as async tasks with its own timers and needs
//! forked crates to be deterministic.
//!
//! - [`ConfigCore`]: one replica (Raft, the configuration state, client sessions).
//! - [`ConfigClient`]: proposes configuration commands, following the leader and retrying
//!   with the same sequence number, so each command applies once.
//! - [`ConfigLog`]: the replica's log in memory, rebuilt from its records.
//! - [`ConfigDisk`], [`open_replica`]: the replica's record log on a `Storage`.

mod client;
mod core;
mod image;

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;
use virga_core::device::IntoStorage;
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, SyncPolicy};

use parking_lot::Mutex;

use crate::config::ConfigState;
use crate::record_io::append_all;
use virga_net::role::{Detached, IoExecutor};

pub use self::client::{ClientOutcome, ConfigClient, ConfigClientConfig};
pub use self::core::{ConfigCore, Outcome};
pub use self::image::{decode_image, encode_image, ConfigImage, ImageError};
use crate::raft_wire::RaftWireError;
pub use virga_raft::log::{RaftLog as ConfigLog, RaftLogError as ConfigLogError};

/// One replica's settings.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// This replica's Raft id (from 1).
    pub id: u64,
    /// Every replica of the service, this one included: Raft id and peer name.
    pub peers: Vec<(u64, String)>,
    /// How often Raft's logical clock ticks.
    pub tick: Duration,
    /// Ticks without a leader before a follower campaigns (randomized in [n, 2n)).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Fsync each group of log records before acknowledging it (`--sync group`). Without it
    /// (`--sync none`) a crashed replica may forget votes and entries it acknowledged, which
    /// voids Raft's guarantees, as etcd's `--unsafe-no-fsync` does.
    pub sync: bool,
    /// Deadline of a Raft batch to a peer.
    pub message_deadline: Duration,
    /// Seeds the election timeouts.
    pub seed: u64,
    /// Keep (index, chain) of every applied entry (for checkers).
    pub keep_history: bool,
    /// Compact the log behind a snapshot of the configuration once this many applied
    /// entries follow the last one (1 to 1,000,000,000).
    pub compact_every: u64,
    /// A deliberately broken variant, for the checkers to catch: acknowledge (votes, appends)
    /// before the log write is durable. Only in test builds and under `sim`.
    #[cfg(any(test, feature = "sim"))]
    pub unsafe_ack_before_write: bool,
}

impl ReplicaConfig {
    /// Replica `id` of the service whose replicas are `peers`, with the defaults: a 10 ms
    /// tick, elections after 10–20 ticks, heartbeats every 2, group sync.
    pub fn new(id: u64, peers: Vec<(u64, String)>, seed: u64) -> ReplicaConfig {
        ReplicaConfig {
            id,
            peers,
            tick: Duration::from_millis(10),
            election_ticks: 10,
            heartbeat_ticks: 2,
            sync: true,
            message_deadline: Duration::from_millis(500),
            seed,
            keep_history: false,
            compact_every: 1000,
            #[cfg(any(test, feature = "sim"))]
            unsafe_ack_before_write: false,
        }
    }

    /// Checks the settings; names what is wrong.
    pub fn validate(&self) -> Result<(), ServiceError> {
        let bad = |field: &'static str, reason: String| Err(ServiceError::BadConfig { field, reason });
        if self.id == 0 {
            return bad("id", "Raft ids start at 1".to_string());
        }
        if !self.peers.iter().any(|(id, _)| *id == self.id) {
            return bad("peers", format!("replica {} is not among the peers", self.id));
        }
        if !(1..=7).contains(&self.peers.len()) {
            return bad("peers", format!("{} replicas; the service runs 1 to 7", self.peers.len()));
        }
        for (position, (id, name)) in self.peers.iter().enumerate() {
            if *id == 0 || self.peers[..position].iter().any(|(other, other_name)| other == id || other_name == name) {
                return bad("peers", format!("replica {id} ({name}) is 0 or listed twice"));
            }
        }
        if self.tick.is_zero() || self.tick > Duration::from_secs(10) {
            return bad("tick", format!("{:?}; it must be in (0, 10 s]", self.tick));
        }
        if !(1..=1000).contains(&self.heartbeat_ticks) || self.election_ticks <= self.heartbeat_ticks {
            return bad(
                "election_ticks",
                format!(
                    "{} election and {} heartbeat ticks; heartbeats are 1 to 1000 ticks and elections take more",
                    self.election_ticks, self.heartbeat_ticks
                ),
            );
        }
        if self.election_ticks > 100_000 {
            return bad("election_ticks", format!("{} is more than 100000", self.election_ticks));
        }
        if self.message_deadline.is_zero() {
            return bad("message_deadline", "it must be above 0".to_string());
        }
        if !(1..=1_000_000_000).contains(&self.compact_every) {
            return bad("compact_every", format!("{}; it must be 1 to 1000000000 entries", self.compact_every));
        }
        Ok(())
    }
}

/// Why a replica cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("bad configuration service setting {field}: {reason}")]
    BadConfig { field: &'static str, reason: String },
    #[error("the replica's record log: {0}")]
    Log(#[from] LogError),
    #[error("the replica's log records: {0}")]
    Records(#[from] ConfigLogError),
    #[error("raft-rs refused to start the replica: {0}")]
    Raft(#[from] raft::Error),
    #[error("the replica's snapshot: {0}")]
    Image(#[from] ImageError),
}

/// A replica's device operations.
#[derive(Debug)]
pub enum ConfigIo {
    /// Append these records (one per Ready written), then fsync if `sync`; then drop
    /// the records before `records[truncate_before]`, which stands alone (a snapshot).
    Append { records: Vec<Vec<u8>>, sync: bool, truncate_before: Option<usize> },
}

#[derive(Debug)]
pub enum ConfigIoDone {
    /// The LSN of the last record appended.
    Appended(Result<u64, LogError>),
}

/// What a replica counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub messages_sent: u64,
    /// Peer messages refused before raft-rs saw them, by the check's name.
    pub refused: Vec<(String, u64)>,
    /// Peer messages raft-rs itself refused, or from a peer that is not a replica.
    pub refused_messages: u64,
    pub proposals: u64,
    pub applied: u64,
    /// Committed entries of a proposal already applied (a retry proposed twice).
    pub duplicate_entries: u64,
    pub undecodable_entries: u64,
    /// Device appends completed.
    pub writes: u64,
    /// Compactions of the log behind a snapshot of the configuration, and leaders'
    /// snapshots installed.
    pub compactions: u64,
    pub snapshots_installed: u64,
}

impl ServiceStats {
    fn refuse(&mut self, error: &RaftWireError) {
        let name = format!("{error:?}");
        let name = name.split([' ', '(', '{']).next().unwrap_or_default().to_string();
        match self.refused.iter_mut().find(|(known, _)| *known == name) {
            Some((_, count)) => *count += 1,
            None => self.refused.push((name, 1)),
        }
    }
}

/// A replica's record log. Appends run on a blocking thread under the tokio driver (see
/// `shard::DataDisk`); one is in flight at a time.
pub struct ConfigDisk {
    log: Arc<Mutex<RecordLog>>,
}

impl IoExecutor<ConfigCore> for ConfigDisk {
    fn execute(&mut self, op: ConfigIo) -> ConfigIoDone {
        let ConfigIo::Append { records, sync, truncate_before } = op;
        ConfigIoDone::Appended(append_and_truncate(&self.log, &records, sync, truncate_before))
    }

    fn detach(&mut self, op: ConfigIo) -> Result<Detached<ConfigIoDone>, ConfigIo> {
        let ConfigIo::Append { records, sync, truncate_before } = op;
        let log = Arc::clone(&self.log);
        Ok(Box::new(move || ConfigIoDone::Appended(append_and_truncate(&log, &records, sync, truncate_before))))
    }
}

impl ConfigDisk {
    /// Segments of the replica's record log (for gauges).
    pub fn segments(&self) -> usize {
        self.log.lock().segment_count()
    }
}

/// Appends `records` (and syncs if asked); once they are durable, drops the whole segments
/// before `records[truncate_before]`, a record that stands alone. A crash between the two
/// leaves old records that replay skips.
fn append_and_truncate(
    log: &Mutex<RecordLog>,
    records: &[Vec<u8>],
    sync: bool,
    truncate_before: Option<usize>,
) -> Result<u64, LogError> {
    let Some(position) = truncate_before.filter(|position| *position < records.len()) else {
        return append_all(log, records, sync);
    };
    append_all(log, &records[..position], false)?;
    let standalone = log.lock().next_lsn();
    let last = append_all(log, &records[position..], sync)?;
    log.lock().truncate_prefix(standalone)?;
    Ok(last)
}

/// Opens (or founds) replica `config.id` on `at`: replays its records into its log, or, on an
/// empty device, writes the founding record (the voters, term 1) first. A torn tail (a crash
/// during an append) is cut: those records were never acknowledged.
pub fn open_replica(config: ReplicaConfig, at: impl IntoStorage) -> Result<(ConfigCore, ConfigDisk), ServiceError> {
    config.validate()?;
    let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
    let mut records = Vec::new();
    let (mut log, recovered) = RecordLog::open_with(at, options, OpenMode::Repair, |lsn, payload| {
        records.push((lsn, payload.to_vec()));
    })?;
    if let Some(repair) = &recovered.repair {
        // Repair takes damage at the log's end for a write a crash cut short (see virga-log).
        tracing::warn!(replica = config.id, ?repair, "cut the log's torn tail");
    }
    if records.is_empty() {
        let voters: Vec<u64> = config.peers.iter().map(|(id, _)| *id).collect();
        let founding = ConfigLog::bootstrap_record(&voters);
        let lsn = log.append(&founding)?;
        log.sync()?;
        records.push((lsn, founding));
    }
    let replica_log = ConfigLog::replay(records.iter().map(|(lsn, bytes)| (*lsn, bytes.as_slice())))?;
    let core = ConfigCore::new(config, replica_log)?;
    Ok((core, ConfigDisk { log: Arc::new(Mutex::new(log)) }))
}

/// The configuration a stopped replica's log holds committed: every entry up to its hard
/// state's commit index applied in order, a proposal retried under the same (client, seq)
/// once, as the running replica applies them. For audits: the replica must not be running.
pub fn read_committed_state(at: impl IntoStorage) -> Result<ConfigState, ServiceError> {
    use raft::{GetEntriesContext, Storage as _};
    let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
    let mut records = Vec::new();
    RecordLog::open_with(at, options, OpenMode::Repair, |lsn, payload| records.push((lsn, payload.to_vec())))?;
    let log = ConfigLog::replay(records.iter().map(|(lsn, bytes)| (*lsn, bytes.as_slice())))?;
    let commit = log.hard_state().commit.min(log.last_index().unwrap_or(0));
    let (mut state, mut sessions) = match log.snapshot_state() {
        Some((_, image)) => {
            let image = decode_image(image)?;
            (image.state, image.sessions.into_iter().map(|(client, (seq, _))| (client, seq)).collect())
        }
        None => (ConfigState::new(), BTreeMap::new()),
    };
    if commit <= log.offset() {
        return Ok(state);
    }
    let entries = log
        .entries(log.offset() + 1, commit + 1, None, GetEntriesContext::empty(false))
        .map_err(|error| ServiceError::BadConfig { field: "log", reason: error.to_string() })?;
    let mut sessions: BTreeMap<String, u64> = std::mem::take(&mut sessions);
    for entry in entries {
        let proposal = (entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal && !entry.data.is_empty())
            .then(|| crate::wire::decode_proposal(&entry.data).ok())
            .flatten();
        match proposal {
            Some(proposal) if sessions.get(&proposal.client).is_none_or(|seq| *seq < proposal.seq) => {
                let _ = state.apply(entry.index, &proposal.command);
                sessions.insert(proposal.client, proposal.seq);
            }
            _ => state.skip_to(entry.index),
        }
    }
    Ok(state)
}
