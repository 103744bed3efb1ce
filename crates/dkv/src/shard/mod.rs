//! SEMEL's sharded, replicated multi-version storage with MILANA's transactions at its
//! primaries: the data nodes' side of the distributed store.
//!
//! - [`ShardReplica`]: one shard's versions, per-key concurrency-control state and
//!   transaction table (Algorithm 1, prepare, decide, records).
//! - [`DataCore`]: a data node: the replicas of its shards, primary or backup, replication,
//!   group commit to its log.
//! - [`DataDisk`], [`open_data_node`]: the node's record log on a `Storage`.
//! - [`wire`]: the shard messages, checked.

mod core;
pub mod replica;
pub mod wire;

use std::sync::Arc;
use virga_core::device::IntoStorage;
use virga_log::{LogError, LogOptions, OpenMode, RecordLog, SyncPolicy};

use parking_lot::Mutex;

use crate::record_io::append_all;
use virga_net::role::{Detached, IoExecutor};

pub(crate) use self::core::termination_decision;
pub use self::core::{
    DataConfig, DataCore, DEFAULT_CHECKPOINT_EVERY, DEFAULT_LOG_SEGMENT_BYTES, DEFAULT_SNAPSHOT_WINDOW,
    MAX_KEYS_PER_GET, MAX_SNAPSHOT_WINDOW,
};
pub use self::replica::{
    txn_id, txn_parts, GetResult, ReadOp, ScanRange, ScanResult, SettledPart, SettledTxn, ShardRecord, ShardReplica,
    TxnEntry, TxnStatus, Weakened, WriteOp,
};
pub use self::wire::ShardWireError;

/// A data node's device operations.
#[derive(Debug)]
pub enum DataIo {
    /// Append these records, then fsync if `sync`. With `checkpoint_from`, the records from
    /// that index on are a checkpoint of every shard: they are fsynced whatever `sync`
    /// says, then the log drops the segments wholly before them.
    Append { records: Vec<Vec<u8>>, sync: bool, checkpoint_from: Option<usize> },
}

#[derive(Debug)]
pub enum DataIoDone {
    /// The LSN of the last record appended.
    Appended(Result<u64, LogError>),
}

/// What a data node counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataStats {
    pub gets: u64,
    pub scans: u64,
    /// Prepares voted commit, and voted abort.
    pub prepares: u64,
    /// Read-only transactions validated alone (KAIROS), nothing logged.
    pub validations: u64,
    /// EI: callbacks sent to clients holding a copy of a key just written.
    pub invalidations: u64,
    pub aborts: u64,
    pub decisions: u64,
    /// Records logged as a backup.
    pub replicated: u64,
    pub replication_retries: u64,
    /// Transactions this primary terminated for a silent coordinator.
    pub terminations: u64,
    /// Failovers this node proposed, shards it took over, records it merged doing so, and
    /// newer maps it adopted.
    pub failovers_proposed: u64,
    pub takeovers: u64,
    pub merged_records: u64,
    /// As a restarted backup, shards whose primary answered its resync; as a primary,
    /// resyncs it served (every record of the shard sent again to that backup).
    pub resyncs: u64,
    pub resyncs_served: u64,
    pub maps_adopted: u64,
    /// Reads refused because the primary's lease did not cover their timestamp, or because
    /// they were below the garbage-collection watermark; versions collected in full passes.
    pub lease_refusals: u64,
    pub too_old: u64,
    pub versions_collected: u64,
    /// Checkpoints of every shard written to the log (each lets it drop what came before).
    pub checkpoints: u64,
    /// Transaction entries dropped once every replica held them decided (ids kept), and
    /// settled states sent to backups that lacked them (new, or restarted with a lost tail).
    pub settled: u64,
    pub settled_states_sent: u64,
    /// KAIROS: read-write transactions validated here in place of a validator they passed
    /// over, and validator lease renewals refused because one did.
    pub validator_takeovers: u64,
    pub validator_lease_refusals: u64,
    /// Requests refused (malformed, wrong epoch, not this node's shard).
    pub refusals: u64,
    /// Device appends completed.
    pub writes: u64,
    /// From a prepare's arrival to its commit vote (logged here and held by f backups).
    pub prepare_latency: crate::metrics::LatencyHistogram,
}

/// A data node's record log. An append (and its fsync) runs on a blocking thread of its
/// own under the tokio driver ([`IoExecutor::detach`]), so the node goes on serving gets
/// while its log syncs; the core has one append in flight at a time, so the lock is never
/// contended. The simulator runs it in its loop.
pub struct DataDisk {
    log: Arc<Mutex<RecordLog>>,
}

impl IoExecutor<DataCore> for DataDisk {
    fn execute(&mut self, op: DataIo) -> DataIoDone {
        DataIoDone::Appended(write(&self.log, op))
    }

    fn detach(&mut self, op: DataIo) -> Result<Detached<DataIoDone>, DataIo> {
        let log = Arc::clone(&self.log);
        Ok(Box::new(move || DataIoDone::Appended(write(&log, op))))
    }
}

impl DataDisk {
    /// Segments of the node's log on its device.
    pub fn segments(&self) -> usize {
        self.log.lock().segment_count()
    }
}

/// One append; a checkpoint's is synced, and the segments before it go.
fn write(log: &Mutex<RecordLog>, op: DataIo) -> Result<u64, LogError> {
    let DataIo::Append { records, sync, checkpoint_from } = op;
    let last = append_all(log, &records, sync || checkpoint_from.is_some())?;
    if let Some(from) = checkpoint_from.filter(|from| *from < records.len()) {
        let first_of_checkpoint = last + 1 - (records.len() - from) as u64;
        log.lock().truncate_prefix(first_of_checkpoint)?;
    }
    Ok(last)
}

/// Why a data node cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DataOpenError {
    #[error("the node's record log: {0}")]
    Log(#[from] LogError),
    #[error("record {lsn} of the node's log: {error}")]
    Record { lsn: u64, error: ShardWireError },
}

/// Opens data node `config.node` on `at`, replaying its log (a torn tail, never
/// acknowledged, is cut).
pub fn open_data_node(config: DataConfig, at: impl IntoStorage) -> Result<(DataCore, DataDisk), DataOpenError> {
    let options =
        LogOptions { sync: SyncPolicy::None, segment_bytes: config.log_segment_bytes, ..LogOptions::default() };
    let mut records = Vec::new();
    let mut bad = None;
    let (log, recovered) =
        RecordLog::open_with(at, options, OpenMode::Repair, |lsn, payload| match wire::decode_log_record(payload) {
            Ok(record) => records.push(record),
            Err(error) => {
                bad.get_or_insert(DataOpenError::Record { lsn, error });
            }
        })?;
    if let Some(error) = bad {
        return Err(error);
    }
    // A log that held records, or lost a tail, is a restart: what the node acknowledged
    // before may be gone with that tail, so it catches up from its primaries.
    let restarted = !records.is_empty() || recovered.truncated_bytes > 0;
    let mut core = DataCore::new(config, records);
    if restarted {
        core.resync_on_start();
    }
    Ok((core, DataDisk { log: Arc::new(Mutex::new(log)) }))
}
