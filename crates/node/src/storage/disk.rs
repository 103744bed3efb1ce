//! The storage node's device: its log and its checkpoints, on any `Storage` (files for a
//! real node, memory devices in the simulator).

use std::sync::Arc;
use virga_core::device::Storage;
use virga_log::RecordLog;

use super::core::{StorageCore, StorageIo, StorageIoDone};
use crate::checkpoint;
use virga_net::role::IoExecutor;

/// Carries out a storage core's device operations.
pub struct StorageDisk {
    log: RecordLog,
    /// Where checkpoints go: the storage holding the log (for files, its parent directory).
    checkpoints: Arc<dyn Storage>,
}

impl StorageDisk {
    pub fn new(log: RecordLog, checkpoints: Arc<dyn Storage>) -> StorageDisk {
        StorageDisk { log, checkpoints }
    }

    /// Where checkpoints go (a driver may write them off its request path).
    pub fn checkpoint_storage(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.checkpoints)
    }
}

impl IoExecutor<StorageCore> for StorageDisk {
    fn execute(&mut self, op: StorageIo) -> StorageIoDone {
        match op {
            StorageIo::Append { record } => StorageIoDone::Appended(self.log.append(&record)),
            StorageIo::WriteCheckpoint { header, shards, contracts, served } => StorageIoDone::CheckpointWritten(
                checkpoint::write(&*self.checkpoints, &header, (&shards, &contracts), &served).map(|()| header.number),
            ),
            StorageIo::CutLog { below } => {
                StorageIoDone::LogCut(self.log.truncate_prefix(below).map(|removed| (removed, self.log.first_lsn())))
            }
        }
    }
}
