//! A storage node's checkpoints: its served shards at one block, so a restart rebuilds that
//! version directly and applies only the logged blocks after it.
//!
//! Object `checkpoint.bin` in the storage that holds the log (for files: beside the log's
//! directory): an 8-byte magic, the CRC-32 of the payload, the
//! payload's length (u64, little endian), then the payload, a protobuf `StorageCheckpoint`
//! (header, every shard's subtree hash, the served shards' entries). A new checkpoint is
//! written to a temporary file and fsynced; the current one is then renamed to
//! `checkpoint.prev.bin` and the new one into its place, so a crash at any point leaves at
//! least one whole checkpoint, and a damaged newest one still has a predecessor (the log is
//! only ever cut below the older of the two). Loading checks everything it can: the
//! checksum, each served shard rebuilt to the hash recorded for it, and all shard hashes
//! assembled to the header's state root.

use crate::proto::{KeyUpdate, ShardEntries, StorageCheckpoint};
use alloy_consensus::Header;
use alloy_primitives::B256;
use prost::Message;
use std::path::{Path, PathBuf};
use virga_core::device::Storage;
use virga_trie::shard::{Shard, ShardError, ShardedTrie};

use crate::codec::{b256, decode_header, WireError};
use crate::storage::{prefix_nibbles, ContractRefusal, Contracts};

pub const CHECKPOINT_FILE: &str = "checkpoint.bin";
/// The checkpoint before the newest one.
pub const PREVIOUS_FILE: &str = "checkpoint.prev.bin";
/// A newest checkpoint found damaged is renamed to this, for inspection, so that the next
/// checkpoint does not rotate it into the place of the sound previous one.
pub const DAMAGED_FILE: &str = "checkpoint.damaged";
const MAGIC: &[u8; 8] = b"VRGCKPT1";
/// Bytes before the payload: magic, checksum, length.
pub const PREAMBLE: usize = MAGIC.len() + 4 + 8;

/// Why a checkpoint could not be written or read: the device operation and object, or the
/// file's defect with its path.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done, e.g. "syncing".
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is there but is not a sound checkpoint for this node.
    #[error("{}: {defect}", .path.display())]
    Unusable {
        path: PathBuf,
        #[source]
        defect: CheckpointDefect,
    },
    /// The node's state cannot be encoded (a broken invariant of its versions).
    #[error(transparent)]
    Encode(CheckpointDefect),
    #[error("starting the writer: {0}")]
    Writer(#[source] std::io::Error),
}

/// What is wrong with a checkpoint's bytes (or with the state to be written as one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointDefect {
    #[error("storage checkpoint of format {found:?}; this build reads format {supported:?}")]
    Format { found: char, supported: char },
    #[error("not a storage checkpoint (bad magic or too short)")]
    NotACheckpoint,
    #[error("payload is {actual} bytes, the preamble says {recorded}")]
    Length { actual: usize, recorded: u64 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed payload: {0}")]
    Payload(#[from] prost::DecodeError),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{recorded} shard hashes for {shard_count} shards")]
    ShardHashCount { recorded: usize, shard_count: usize },
    #[error("shard count {0} is not 1, 16 or 256")]
    ShardCount(usize),
    #[error("served shard {0} is missing")]
    MissingShard(usize),
    #[error("no shard {0}")]
    NoShard(usize),
    #[error("shard {shard}: {source}")]
    Shard {
        shard: usize,
        #[source]
        source: ShardError,
    },
    #[error("shard {shard} rebuilds to {rebuilt}, the checkpoint records {recorded}")]
    ShardHash { shard: usize, rebuilt: B256, recorded: B256 },
    #[error("{0}")]
    Shards(#[source] ShardError),
    #[error("contract storage: {0}")]
    Contract(Box<ContractRefusal>),
    #[error("the shards give state root {computed}, block {number} says {header}")]
    StateRoot { number: u64, computed: B256, header: B256 },
}

/// The (newest) checkpoint file kept beside a storage node's log.
pub fn path_beside(log: &Path) -> PathBuf {
    log.with_file_name(CHECKPOINT_FILE)
}

/// The previous checkpoint, beside the newest one at `path`.
pub fn previous_of(path: &Path) -> PathBuf {
    path.with_file_name(PREVIOUS_FILE)
}

/// Writes the checkpoint of `header` into `storage`, keeping the one it replaces as
/// [`PREVIOUS_FILE`].
pub fn write(
    storage: &dyn Storage,
    header: &Header,
    state: (&ShardedTrie, &Contracts),
    served: &[usize],
) -> Result<(), CheckpointError> {
    let bytes = encode(header, state, served).map_err(CheckpointError::Encode)?;
    install(storage, &bytes)
}

pub fn encode(
    header: &Header,
    (shards, contracts): (&ShardedTrie, &Contracts),
    served: &[usize],
) -> Result<Vec<u8>, CheckpointDefect> {
    let mut images = Vec::with_capacity(served.len());
    for &index in served {
        let shard = shards.shard(index).ok_or(CheckpointDefect::NoShard(index))?;
        let entries = shard.entries().map_err(CheckpointDefect::Shards)?;
        images.push(ShardEntries {
            index: index as u32,
            entries: entries.into_iter().map(|(key, value)| KeyUpdate { key, value }).collect(),
        });
    }
    let (slots, codes) = contracts.entries();
    let checkpoint = StorageCheckpoint {
        header: alloy_rlp::encode(header),
        shard_hashes: shards.shards().iter().map(|shard| shard.subtree_hash().to_vec()).collect(),
        shards: images,
        slots: slots.into_iter().map(crate::codec::slot_update_to_wire).collect(),
        codes,
    };
    Ok(frame(&checkpoint.encode_to_vec()))
}

/// A checkpoint file around `payload`: magic, checksum, length, payload.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(PREAMBLE + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// Puts `bytes` durably at `path`, moving what was there to the previous checkpoint's place.
fn install(storage: &dyn Storage, bytes: &[u8]) -> Result<(), CheckpointError> {
    let temporary = format!("{CHECKPOINT_FILE}.tmp");
    let failed = |op: &'static str, name: &str, source: std::io::Error| CheckpointError::Io {
        op,
        path: storage.path_of(name),
        source,
    };
    match storage.remove(&temporary) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(failed("removing", &temporary, error));
        }
        _ => {}
    }
    let device = storage.create(&temporary).map_err(|error| failed("creating", &temporary, error))?;
    device.write_at(bytes, 0).map_err(|error| failed("writing", &temporary, error))?;
    device.sync().map_err(|error| failed("syncing", &temporary, error))?;
    drop(device);
    if storage.exists(CHECKPOINT_FILE).map_err(|error| failed("looking for", CHECKPOINT_FILE, error))? {
        storage
            .rename(CHECKPOINT_FILE, PREVIOUS_FILE)
            .map_err(|error| failed("keeping the checkpoint before", CHECKPOINT_FILE, error))?;
    }
    storage.rename(&temporary, CHECKPOINT_FILE).map_err(|error| failed("renaming", &temporary, error))?;
    storage.sync_dir().map_err(|error| failed("syncing the directory of", CHECKPOINT_FILE, error))
}

#[derive(Debug)]
pub struct Loaded {
    pub header: Header,
    pub hash: B256,
    pub shards: ShardedTrie,
    pub contracts: Contracts,
}

/// Reads and checks the checkpoint at `path` for a node serving `served` of `shard_count`
/// shards. Every failure names what is wrong; nothing is trusted unchecked.
pub fn read(
    storage: &dyn Storage,
    name: &str,
    served: &[usize],
    shard_count: usize,
) -> Result<Loaded, CheckpointError> {
    let bytes = storage
        .open(name)
        .and_then(|device| device.read_all())
        .map_err(|source| CheckpointError::Unreadable { path: storage.path_of(name), source })?;
    decode(&bytes, served, shard_count)
        .map_err(|defect| CheckpointError::Unusable { path: storage.path_of(name), defect })
}

/// Checks and decodes a checkpoint file's bytes (see [`read`]).
pub fn decode(bytes: &[u8], served: &[usize], shard_count: usize) -> Result<Loaded, CheckpointDefect> {
    // The magic's last byte is the format version: `VRGCKPT` followed by another one is a
    // checkpoint this build does not read, named as such rather than as garbage.
    let family = &MAGIC[..MAGIC.len() - 1];
    if bytes.len() >= MAGIC.len() && bytes.starts_with(family) && bytes[MAGIC.len() - 1] != MAGIC[MAGIC.len() - 1] {
        return Err(CheckpointDefect::Format {
            found: char::from(bytes[MAGIC.len() - 1]),
            supported: char::from(MAGIC[MAGIC.len() - 1]),
        });
    }
    if bytes.len() < PREAMBLE || &bytes[..MAGIC.len()] != MAGIC {
        return Err(CheckpointDefect::NotACheckpoint);
    }
    // Both fit: the preamble is there.
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[12..20]);
    let length = u64::from_le_bytes(length);
    let payload = &bytes[PREAMBLE..];
    if payload.len() as u64 != length {
        return Err(CheckpointDefect::Length { actual: payload.len(), recorded: length });
    }
    if crc32fast::hash(payload) != crc {
        return Err(CheckpointDefect::Checksum);
    }
    let checkpoint = StorageCheckpoint::decode(payload)?;
    let header = decode_header(&checkpoint.header)?;
    if checkpoint.shard_hashes.len() != shard_count {
        return Err(CheckpointDefect::ShardHashCount { recorded: checkpoint.shard_hashes.len(), shard_count });
    }
    let prefix = prefix_nibbles(shard_count).ok_or(CheckpointDefect::ShardCount(shard_count))?;
    let contracts = decode_contracts(&checkpoint)?;
    let mut shards = Vec::with_capacity(shard_count);
    for (index, recorded) in checkpoint.shard_hashes.iter().enumerate() {
        let recorded = b256(recorded, &format!("shard hash {index}"))?;
        if !served.contains(&index) {
            shards.push(Shard::known_by_hash(index, prefix, recorded));
            continue;
        }
        let image = checkpoint
            .shards
            .iter()
            .find(|image| image.index as usize == index)
            .ok_or(CheckpointDefect::MissingShard(index))?;
        let mut shard = Shard::new(index, prefix);
        for entry in &image.entries {
            shard
                .insert(&entry.key, &entry.value)
                .map_err(|source| CheckpointDefect::Shard { shard: index, source })?;
            let key = b256(&entry.key, "account key")?;
            contracts.check_account_value(&key, Some(&entry.value)).map_err(contract_defect)?;
        }
        let rebuilt = shard.subtree_hash();
        if rebuilt != recorded {
            return Err(CheckpointDefect::ShardHash { shard: index, rebuilt, recorded });
        }
        shards.push(shard);
    }
    let shards = ShardedTrie::from_shards(shards).map_err(CheckpointDefect::Shards)?;
    // Storage whose account is not in a served shard, or absent from it.
    for account in contracts.accounts_with_storage() {
        let raw = shards.get(account.as_slice()).map_err(CheckpointDefect::Shards)?;
        contracts.check_account_value(account, raw.as_deref()).map_err(contract_defect)?;
    }
    let computed = shards.root_hash();
    if computed != header.state_root {
        return Err(CheckpointDefect::StateRoot { number: header.number, computed, header: header.state_root });
    }
    let hash = header.hash_slow();
    Ok(Loaded { header, hash, shards, contracts })
}

fn contract_defect(refusal: ContractRefusal) -> CheckpointDefect {
    CheckpointDefect::Contract(Box::new(refusal))
}

/// The checkpoint's contract storage and code, every key checked for length.
fn decode_contracts(checkpoint: &StorageCheckpoint) -> Result<Contracts, CheckpointDefect> {
    let slots = checkpoint
        .slots
        .iter()
        .map(|slot| Ok((b256(&slot.account, "slot account")?, b256(&slot.slot, "slot key")?, slot.value.clone())))
        .collect::<Result<Vec<_>, WireError>>()?;
    Ok(Contracts::from_entries(slots, checkpoint.codes.iter().cloned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_whole_checkpoint_is_refused_with_the_reason() {
        let storage = virga_core::device::MemStorage::new();
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..200u8 {
            sharded
                .insert(
                    alloy_primitives::keccak256([i]).as_slice(),
                    &virga_trie::account::Account::with_balance(0, alloy_primitives::U256::from(i + 1)).rlp(),
                )
                .unwrap();
        }
        let header = Header { state_root: sharded.root_hash(), number: 5, ..Header::default() };
        write(&storage, &header, (&sharded, &Contracts::default()), &[1, 2]).unwrap();
        let loaded = read(&storage, CHECKPOINT_FILE, &[1, 2], 16).unwrap();
        assert_eq!((loaded.header.number, loaded.hash), (5, header.hash_slow()));
        assert_eq!(loaded.shards.root_hash(), sharded.root_hash());
        assert!(loaded.shards.shard(3).unwrap().is_known_by_hash());
        assert!(!storage.exists(PREVIOUS_FILE).unwrap());

        let whole = storage.open(CHECKPOINT_FILE).unwrap().read_all().unwrap();
        let put = |bytes: &[u8]| {
            let device = storage.open(CHECKPOINT_FILE).unwrap();
            device.truncate(0).unwrap();
            device.write_at(bytes, 0).unwrap();
        };
        let defect = |result: Result<Loaded, CheckpointError>| match result {
            Err(CheckpointError::Unusable { path, defect }) => {
                assert_eq!(path, storage.path_of(CHECKPOINT_FILE));
                defect
            }
            other => panic!("not an unusable checkpoint: {other:?}"),
        };
        put(&whole[..whole.len() - 1]);
        let short = defect(read(&storage, CHECKPOINT_FILE, &[1, 2], 16));
        assert_eq!(
            short,
            CheckpointDefect::Length { actual: whole.len() - PREAMBLE - 1, recorded: (whole.len() - PREAMBLE) as u64 }
        );
        put(b"not a checkpoint at all");
        assert_eq!(defect(read(&storage, CHECKPOINT_FILE, &[1, 2], 16)), CheckpointDefect::NotACheckpoint);
        let mut newer = whole.clone();
        newer[MAGIC.len() - 1] = b'2';
        let format = decode(&newer, &[1, 2], 16).unwrap_err();
        assert_eq!(format, CheckpointDefect::Format { found: '2', supported: '1' });
        assert!(format.to_string().contains("format '2'; this build reads format '1'"), "{format}");
        // Whole, but for a node serving a shard it does not hold.
        put(&whole);
        assert_eq!(defect(read(&storage, CHECKPOINT_FILE, &[1, 2, 3], 16)), CheckpointDefect::MissingShard(3));
        // Whole, but the recorded shard hashes do not give the header's root; the sound one
        // before it is kept as the previous checkpoint.
        let lying = Header { state_root: B256::repeat_byte(9), ..header };
        write(&storage, &lying, (&sharded, &Contracts::default()), &[1, 2]).unwrap();
        let root = defect(read(&storage, CHECKPOINT_FILE, &[1, 2], 16));
        assert!(
            matches!(root, CheckpointDefect::StateRoot { number: 5, header, .. } if header == B256::repeat_byte(9))
        );
        assert_eq!(read(&storage, PREVIOUS_FILE, &[1, 2], 16).unwrap().header.number, 5);
        // Both are durable: a crash now keeps them.
        let crashed = storage.crash(7);
        assert!(read(&crashed, PREVIOUS_FILE, &[1, 2], 16).is_ok());
        assert!(crashed.exists(CHECKPOINT_FILE).unwrap());
        let missing = read(&storage, "absent", &[1, 2], 16).unwrap_err();
        assert!(matches!(&missing, CheckpointError::Unreadable { path, .. } if path == &storage.path_of("absent")));
        assert!(missing.to_string().contains("mem:/absent"), "{missing}");
    }

    #[test]
    fn a_checkpoint_with_a_bad_header_is_refused_as_such_with_its_path() {
        let storage = virga_core::device::MemStorage::new();
        let sharded = ShardedTrie::new(16).unwrap();
        let checkpoint = StorageCheckpoint {
            header: vec![0xc0, 0x01, 0x02],
            shard_hashes: sharded.shards().iter().map(|shard| shard.subtree_hash().to_vec()).collect(),
            shards: Vec::new(),
            ..Default::default()
        };
        install(&storage, &frame(&checkpoint.encode_to_vec())).unwrap();
        match read(&storage, CHECKPOINT_FILE, &[], 16) {
            Err(CheckpointError::Unusable { path, defect: CheckpointDefect::Wire(WireError::Header(_)) }) => {
                assert_eq!(path, storage.path_of(CHECKPOINT_FILE));
            }
            other => panic!("a bad header must be refused as one: {other:?}"),
        }
    }

    /// Writes checkpoints of blocks 1, 2 and 3 into `storage`; returns the operation count
    /// when each was installed.
    fn write_three(storage: &virga_core::device::CrashPoint) -> Vec<u64> {
        let mut installed = Vec::new();
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..200u8 {
            sharded
                .insert(
                    alloy_primitives::keccak256([i]).as_slice(),
                    &virga_trie::account::Account::with_balance(0, alloy_primitives::U256::from(i + 1)).rlp(),
                )
                .unwrap();
        }
        for number in 1..=3u64 {
            sharded
                .insert(
                    alloy_primitives::keccak256([number as u8]).as_slice(),
                    &virga_trie::account::Account::with_balance(0, alloy_primitives::U256::from(number)).rlp(),
                )
                .unwrap();
            let header = Header { state_root: sharded.root_hash(), number, ..Header::default() };
            write(storage, &header, (&sharded, &Contracts::default()), &[1, 2]).unwrap();
            installed.push(storage.operations());
        }
        installed
    }

    #[test]
    fn a_crash_at_any_operation_of_installing_a_checkpoint_leaves_a_whole_one() {
        use virga_core::device::{CrashPoint, MemStorage};
        let total = write_three(&CrashPoint::new(MemStorage::new(), 0))[2];
        for crash_at in 1..=total {
            let storage = CrashPoint::new(MemStorage::new(), crash_at);
            let installed = write_three(&storage);
            // Blocks whose checkpoint was installed (write returned) before the crash.
            let newest_installed = installed.iter().filter(|&&at| at < crash_at).count() as u64;
            let state = storage.state_at_crash().unwrap();
            for seed in 0..4 {
                let crashed = state.crash(seed);
                let sound: Vec<u64> = [CHECKPOINT_FILE, PREVIOUS_FILE]
                    .into_iter()
                    .filter_map(|name| read(&crashed, name, &[1, 2], 16).ok())
                    .map(|loaded| loaded.header.number)
                    .collect();
                // An installed checkpoint (or a newer one) is always there; before the first
                // was installed there may be none.
                let newest = sound.iter().copied().max().unwrap_or(0);
                assert!(newest >= newest_installed, "operation {crash_at}, seed {seed}: {sound:?}");
            }
        }
    }
}
