//! The read-only audit reader, [`scan`], and the index rules both it and
//! [`super::ChainStore::open`] apply to the records the log holds intact.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use alloy_primitives::B256;
use virga_core::device::{IntoStorage, Storage};
use virga_log::RecordLog;

use super::format::{decode_prefix, number_at, segment_file_name, PREFIX_LEN};
use super::view::{open_intact_prefix, Ending};
use super::{log_options, place_of, refuse_older_format, Damage, StoreError, StoreOptions, StoredBlock};

/// The chain's rules for the records of its log, checked one record at a time: block `n`
/// lies at LSN `n + 1`, carries number `n` in its prefix, and a hash no earlier block has.
#[derive(Debug, Default)]
pub(super) struct ChainIndex {
    /// Hash of each block, by number.
    pub hashes: Vec<B256>,
    pub by_hash: HashMap<B256, u64>,
    /// The first record breaking the rules: its LSN and what is wrong. Indexing stops there.
    pub violation: Option<(u64, Damage)>,
}

impl ChainIndex {
    /// Indexes the record at `lsn` whose payload starts with `prefix`.
    pub(super) fn visit(&mut self, lsn: u64, prefix: &[u8]) {
        if self.violation.is_none() {
            if let Err(damage) = self.admit(lsn, prefix) {
                self.violation = Some((lsn, damage));
            }
        }
    }

    fn admit(&mut self, lsn: u64, prefix: &[u8]) -> Result<(), Damage> {
        let expected = self.hashes.len() as u64;
        let found = number_at(lsn).unwrap_or(0);
        if found != expected {
            // The log's LSNs are consecutive, so only the first record can be off: the
            // segments before it are gone.
            return Err(Damage::MissingBlocks { first: found });
        }
        let (number, hash) = decode_prefix(prefix)?;
        if number != expected {
            return Err(Damage::WrongNumber { found: number, expected });
        }
        if let Some(&first) = self.by_hash.get(&hash) {
            return Err(Damage::DuplicateHash { hash, first });
        }
        self.hashes.push(hash);
        self.by_hash.insert(hash, number);
        Ok(())
    }

    /// The violation found, as an error naming where it lies. `log` must index the record.
    pub(super) fn violation_error(&self, log: &RecordLog) -> Option<StoreError> {
        let (lsn, damage) = self.violation.clone()?;
        let block = number_at(lsn).unwrap_or(0);
        let storage = log.storage();
        let (file, offset) = match (&damage, log.location(lsn)) {
            (Damage::MissingBlocks { first }, _) => (storage.path_of(&segment_file_name(*first)), 0),
            (_, Some(at)) => (storage.path_of(&at.segment), at.offset),
            (_, None) => (storage.location(), 0),
        };
        let block = if matches!(damage, Damage::MissingBlocks { .. }) { 0 } else { block };
        Some(StoreError::Corrupt { file, offset, block, damage })
    }
}

/// Reads the store at `at` (its directory, or any [`Storage`]) without changing anything,
/// yielding every intact block in order and ending with an error at the first damage:
/// [`StoreError::TornTail`] for a torn tail (which [`super::ChainStore::open`] would cut),
/// [`StoreError::Corrupt`] for anything else, each naming the file, byte offset and block
/// number (the count of intact blocks before it). A directory without segments holds no
/// blocks; one written by the older chain-store format is [`StoreError::OlderFormat`].
///
/// This is the audit entry point. The log is first indexed up to its first damage (one
/// read of every record), then each block is read back and checked again as the iterator
/// advances. Memory use is the log's index and the map of hashes seen, which catches
/// repeated hashes.
pub fn scan(at: impl IntoStorage) -> Scan {
    let location = at.location();
    let storage = at.into_storage(false).map_err(|source| StoreError::Io { op: "open", path: location, source });
    Scan { state: State::Start(Some(storage)), index: ChainIndex::default(), torn_tail_bytes: 0 }
}

/// The iterator returned by [`scan`].
pub struct Scan {
    state: State,
    index: ChainIndex,
    torn_tail_bytes: u64,
}

enum State {
    Start(Option<Result<Arc<dyn Storage>, StoreError>>),
    Reading { log: RecordLog, ending: Ending },
    Done,
}

impl fmt::Debug for Scan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scan")
            .field("blocks", &self.blocks())
            .field("done", &matches!(self.state, State::Done))
            .finish()
    }
}

impl Scan {
    /// Intact blocks yielded so far.
    pub fn blocks(&self) -> u64 {
        self.index.hashes.len() as u64
    }

    /// Bytes of the torn tail, once the scan has ended with [`StoreError::TornTail`]; 0
    /// otherwise. Lets an audit that accepts a torn tail report it after the loop.
    pub fn torn_tail_bytes(&self) -> u64 {
        self.torn_tail_bytes
    }

    fn start(storage: Result<Arc<dyn Storage>, StoreError>) -> Result<State, StoreError> {
        let storage = storage?;
        refuse_older_format(&*storage)?;
        let (log, ending) = open_intact_prefix(&storage, &log_options(&StoreOptions::default()))?;
        Ok(State::Reading { log, ending })
    }

    fn advance(&mut self) -> Result<Option<StoredBlock>, StoreError> {
        if let State::Start(storage) = &mut self.state {
            let storage = storage.take().expect("a scan starts once");
            self.state = Scan::start(storage)?;
        }
        let number = self.blocks();
        let State::Reading { log, ending } = &mut self.state else { return Ok(None) };
        let lsn = number + 1;
        if lsn < log.first_lsn() {
            let file = log.storage().path_of(&virga_log::segment_file_name(log.first_lsn()));
            let damage = Damage::MissingBlocks { first: log.first_lsn() - 1 };
            return Err(StoreError::Corrupt { file, offset: 0, block: 0, damage });
        }
        if lsn >= log.next_lsn() {
            return match std::mem::replace(ending, Ending::Clean) {
                Ending::Clean => Ok(None),
                Ending::Torn(tail) => {
                    self.torn_tail_bytes = tail.bytes;
                    Err(StoreError::from_log(virga_log::LogError::TornTail { tail }, number))
                }
                Ending::Damaged(error) => Err(StoreError::from_log(error, number)),
            };
        }
        let mut payload = log.read(lsn).map_err(|e| {
            let (file, offset) = place_of(log, number);
            StoreError::from_read(e, number, file, offset)
        })?;
        self.index.visit(lsn, &payload);
        if let Some(error) = self.index.violation_error(log) {
            return Err(error);
        }
        let hash = self.index.hashes[number as usize];
        payload.drain(..PREFIX_LEN);
        Ok(Some(StoredBlock { number, hash, payload }))
    }
}

impl Iterator for Scan {
    type Item = Result<StoredBlock, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if matches!(self.state, State::Done) {
            return None;
        }
        let item = self.advance().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.state = State::Done;
        }
        item
    }
}
