//! A storage node's write-ahead log: every accepted block's logical updates, appended and
//! fsynced before the node acknowledges the block.
//!
//! Record: `len: u32 LE | crc32(payload): u32 LE | payload` where the payload is the
//! protobuf `BlockUpdates` as received (block, every shard's hash, this node's updates).
//! Reading stops at a torn tail (short or mismatching last record), which opening cuts off;
//! a bad record followed by good ones is damage and is refused.

use prost::Message;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use virga_net::proto::BlockUpdates;

const HEADER_BYTES: usize = 8;
/// No honest record comes near this; a larger length is damage, not an allocation to try.
const MAX_RECORD_BYTES: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: record at byte {offset} is damaged ({what}) but later records follow")]
    Corrupt { path: PathBuf, offset: u64, what: String },
}

pub struct UpdatesLog {
    path: PathBuf,
    file: File,
}

/// What reading a log found.
pub struct Replay {
    pub records: Vec<BlockUpdates>,
    /// Bytes of a torn tail after the last whole record.
    pub torn_bytes: u64,
    pub valid_len: u64,
}

impl UpdatesLog {
    /// Opens (creating) the log, returns its records and cuts off a torn tail.
    pub fn open(path: &Path) -> Result<(UpdatesLog, Replay), LogError> {
        let io = |source| LogError::Io { path: path.to_path_buf(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let replay =
            if path.exists() { read(path)? } else { Replay { records: Vec::new(), torn_bytes: 0, valid_len: 0 } };
        let mut file = OpenOptions::new()
            .create(true)
            .append(false)
            .write(true)
            .read(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        if replay.torn_bytes > 0 {
            file.set_len(replay.valid_len).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        file.seek(SeekFrom::Start(replay.valid_len)).map_err(io)?;
        Ok((UpdatesLog { path: path.to_path_buf(), file }, replay))
    }

    /// Appends one record and fsyncs it.
    pub fn append(&mut self, record: &BlockUpdates) -> Result<(), LogError> {
        let payload = record.encode_to_vec();
        let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let io = |source| LogError::Io { path: self.path.clone(), source };
        self.file.write_all(&bytes).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// Reads every whole record of a log without changing it.
pub fn read(path: &Path) -> Result<Replay, LogError> {
    let io = |source| LogError::Io { path: path.to_path_buf(), source };
    let mut bytes = Vec::new();
    File::open(path).map_err(io)?.read_to_end(&mut bytes).map_err(io)?;
    let mut records = Vec::new();
    let mut offset = 0usize;
    while offset < bytes.len() {
        let problem = match bytes.get(offset..offset + HEADER_BYTES) {
            None => Some("short header".to_string()),
            Some(header) => {
                let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
                let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
                let start = offset + HEADER_BYTES;
                match bytes.get(start..start.saturating_add(len)) {
                    _ if len > MAX_RECORD_BYTES => Some(format!("length {len}")),
                    None => Some("short payload".to_string()),
                    Some(payload) if crc32fast::hash(payload) != crc => Some("checksum mismatch".to_string()),
                    Some(payload) => match BlockUpdates::decode(payload) {
                        Ok(record) => {
                            records.push(record);
                            offset = start + len;
                            None
                        }
                        Err(error) => Some(format!("undecodable payload: {error}")),
                    },
                }
            }
        };
        if let Some(what) = problem {
            // Only the last record may be torn: anything after it means the middle is damaged.
            if has_later_record(&bytes, offset) {
                return Err(LogError::Corrupt { path: path.to_path_buf(), offset: offset as u64, what });
            }
            return Ok(Replay { records, torn_bytes: (bytes.len() - offset) as u64, valid_len: offset as u64 });
        }
    }
    Ok(Replay { records, torn_bytes: 0, valid_len: offset as u64 })
}

/// Whether a well-formed record starts anywhere after `offset` (a torn append leaves only
/// a prefix of one record; a flipped byte in the middle leaves whole records behind it).
fn has_later_record(bytes: &[u8], offset: usize) -> bool {
    (offset + 1..bytes.len().saturating_sub(HEADER_BYTES)).any(|start| {
        let header = &bytes[start..start + HEADER_BYTES];
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        len > 0
            && bytes
                .get(start + HEADER_BYTES..start + HEADER_BYTES + len)
                .is_some_and(|payload| crc32fast::hash(payload) == crc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u8) -> BlockUpdates {
        BlockUpdates { header: vec![n; 40], shard_hashes: vec![vec![n; 32]], updates: Vec::new() }
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("updates.log");
        let (mut log, replay) = UpdatesLog::open(&path).unwrap();
        assert!(replay.records.is_empty());
        for n in 0..5 {
            log.append(&record(n)).unwrap();
        }
        drop(log);
        let full = std::fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(full - 7).unwrap();
        let (mut log, replay) = UpdatesLog::open(&path).unwrap();
        assert_eq!(replay.records, (0..4).map(record).collect::<Vec<_>>());
        assert!(replay.torn_bytes > 0);
        log.append(&record(9)).unwrap();
        let replay = read(&path).unwrap();
        assert_eq!(replay.records.last(), Some(&record(9)));
        assert_eq!(replay.records.len(), 5);
    }

    #[test]
    fn damage_before_good_records_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("updates.log");
        let (mut log, _) = UpdatesLog::open(&path).unwrap();
        for n in 0..4 {
            log.append(&record(n)).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + 3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read(&path), Err(LogError::Corrupt { offset: 0, .. })));
        assert!(UpdatesLog::open(&path).is_err(), "a damaged log is not truncated away");
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }
}
