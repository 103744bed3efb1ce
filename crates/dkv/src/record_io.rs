//! The one device operation of the store's roles: append a group of records to a record
//! log, then fsync it (or only hand it to the device).

use parking_lot::Mutex;
use virga_log::{LogError, RecordLog};

/// Appends `records` in order and syncs if asked; the LSN of the last one.
pub(crate) fn append_all(log: &Mutex<RecordLog>, records: &[Vec<u8>], sync: bool) -> Result<u64, LogError> {
    let mut log = log.lock();
    let mut last = 0;
    for record in records {
        last = log.append(record)?;
    }
    if sync {
        log.sync()?;
    } else {
        log.flush()?;
    }
    Ok(last)
}
