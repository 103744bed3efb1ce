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

use alloy_consensus::Header;
use alloy_primitives::B256;
use prost::Message;
use std::path::{Path, PathBuf};
use virga_core::device::Storage;
use virga_net::proto::{KeyUpdate, ShardEntries, StorageCheckpoint};
use virga_trie::shard::{Shard, ShardedTrie};

use crate::codec::{b256, decode_header};
use crate::storage::prefix_nibbles;

pub const CHECKPOINT_FILE: &str = "checkpoint.bin";
/// The checkpoint before the newest one.
pub const PREVIOUS_FILE: &str = "checkpoint.prev.bin";
/// A newest checkpoint found damaged is renamed to this, for inspection, so that the next
/// checkpoint does not rotate it into the place of the sound previous one.
pub const DAMAGED_FILE: &str = "checkpoint.damaged";
const MAGIC: &[u8; 8] = b"VRGCKPT1";
/// Bytes before the payload: magic, checksum, length.
pub const PREAMBLE: usize = MAGIC.len() + 4 + 8;

/// The (newest) checkpoint file kept beside a storage node's log.
pub fn path_beside(log: &Path) -> PathBuf {
    log.with_file_name(CHECKPOINT_FILE)
}

/// The previous checkpoint, beside the newest one at `path`.
pub fn previous_of(path: &Path) -> PathBuf {
    path.with_file_name(PREVIOUS_FILE)
}

/// Writes the served shards of `shards` at `header` as the newest checkpoint at `path`; the
/// one it replaces becomes the previous checkpoint.
/// Writes the checkpoint of `header` into `storage`, keeping the one it replaces as
/// [`PREVIOUS_FILE`].
pub fn write(storage: &dyn Storage, header: &Header, shards: &ShardedTrie, served: &[usize]) -> Result<(), String> {
    let bytes = encode(header, shards, served)?;
    install(storage, &bytes)
}

pub fn encode(header: &Header, shards: &ShardedTrie, served: &[usize]) -> Result<Vec<u8>, String> {
    let mut images = Vec::with_capacity(served.len());
    for &index in served {
        let shard = shards.shard(index).ok_or_else(|| format!("no shard {index}"))?;
        let entries = shard.entries().map_err(|error| error.to_string())?;
        images.push(ShardEntries {
            index: index as u32,
            entries: entries.into_iter().map(|(key, value)| KeyUpdate { key, value }).collect(),
        });
    }
    let checkpoint = StorageCheckpoint {
        header: alloy_rlp::encode(header),
        shard_hashes: shards.shards().iter().map(|shard| shard.subtree_hash().to_vec()).collect(),
        shards: images,
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
fn install(storage: &dyn Storage, bytes: &[u8]) -> Result<(), String> {
    let temporary = format!("{CHECKPOINT_FILE}.tmp");
    let failed =
        |what: &str, name: &str, error: std::io::Error| format!("{what} {}: {error}", storage.path_of(name).display());
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
}

/// Reads and checks the checkpoint at `path` for a node serving `served` of `shard_count`
/// shards. Every failure names what is wrong; nothing is trusted unchecked.
pub fn read(storage: &dyn Storage, name: &str, served: &[usize], shard_count: usize) -> Result<Loaded, String> {
    let bytes = storage
        .open(name)
        .and_then(|device| device.read_all())
        .map_err(|error| format!("{}: {error}", storage.path_of(name).display()))?;
    decode(&bytes, served, shard_count)
}

/// Checks and decodes a checkpoint file's bytes (see [`read`]).
pub fn decode(bytes: &[u8], served: &[usize], shard_count: usize) -> Result<Loaded, String> {
    // The magic's last byte is the format version: `VRGCKPT` followed by another one is a
    // checkpoint this build does not read, named as such rather than as garbage.
    let family = &MAGIC[..MAGIC.len() - 1];
    if bytes.len() >= MAGIC.len() && bytes.starts_with(family) && bytes[MAGIC.len() - 1] != MAGIC[MAGIC.len() - 1] {
        return Err(format!(
            "storage checkpoint of format {:?}; this build reads format {:?}",
            char::from(bytes[MAGIC.len() - 1]),
            char::from(MAGIC[MAGIC.len() - 1])
        ));
    }
    if bytes.len() < PREAMBLE || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a storage checkpoint (bad magic or too short)".to_string());
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().map_err(|_| "short checksum")?);
    let length = u64::from_le_bytes(bytes[12..20].try_into().map_err(|_| "short length")?);
    let payload = &bytes[PREAMBLE..];
    if payload.len() as u64 != length {
        return Err(format!("payload is {} bytes, the preamble says {length}", payload.len()));
    }
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".to_string());
    }
    let checkpoint = StorageCheckpoint::decode(payload).map_err(|error| format!("malformed payload: {error}"))?;
    let header = decode_header(&checkpoint.header)?;
    if checkpoint.shard_hashes.len() != shard_count {
        return Err(format!("{} shard hashes for {shard_count} shards", checkpoint.shard_hashes.len()));
    }
    let prefix = prefix_nibbles(shard_count).ok_or_else(|| format!("shard count {shard_count} is not 1, 16 or 256"))?;
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
            .ok_or_else(|| format!("served shard {index} is missing"))?;
        let mut shard = Shard::new(index, prefix);
        for entry in &image.entries {
            shard.insert(&entry.key, &entry.value).map_err(|error| format!("shard {index}: {error}"))?;
        }
        let rebuilt = shard.subtree_hash();
        if rebuilt != recorded {
            return Err(format!("shard {index} rebuilds to {rebuilt}, the checkpoint records {recorded}"));
        }
        shards.push(shard);
    }
    let shards = ShardedTrie::from_shards(shards).map_err(|error| error.to_string())?;
    let root = shards.root_hash();
    if root != header.state_root {
        return Err(format!("the shards give state root {root}, block {} says {}", header.number, header.state_root));
    }
    let hash = header.hash_slow();
    Ok(Loaded { header, hash, shards })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_whole_checkpoint_is_refused_with_the_reason() {
        let storage = virga_core::device::MemStorage::new();
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..200u8 {
            sharded.insert(alloy_primitives::keccak256([i]).as_slice(), &[i + 1; 40]).unwrap();
        }
        let header = Header { state_root: sharded.root_hash(), number: 5, ..Header::default() };
        write(&storage, &header, &sharded, &[1, 2]).unwrap();
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
        put(&whole[..whole.len() - 1]);
        assert!(read(&storage, CHECKPOINT_FILE, &[1, 2], 16).unwrap_err().contains("preamble says"));
        put(b"not a checkpoint at all");
        assert!(read(&storage, CHECKPOINT_FILE, &[1, 2], 16).unwrap_err().contains("bad magic"));
        let mut newer = whole.clone();
        newer[MAGIC.len() - 1] = b'2';
        assert!(decode(&newer, &[1, 2], 16).unwrap_err().contains("format '2'; this build reads format '1'"));
        // Whole, but for a node serving a shard it does not hold.
        put(&whole);
        assert!(read(&storage, CHECKPOINT_FILE, &[1, 2, 3], 16).unwrap_err().contains("served shard 3 is missing"));
        // Whole, but the recorded shard hashes do not give the header's root; the sound one
        // before it is kept as the previous checkpoint.
        let lying = Header { state_root: B256::repeat_byte(9), ..header };
        write(&storage, &lying, &sharded, &[1, 2]).unwrap();
        assert!(read(&storage, CHECKPOINT_FILE, &[1, 2], 16).unwrap_err().contains("give state root"));
        assert_eq!(read(&storage, PREVIOUS_FILE, &[1, 2], 16).unwrap().header.number, 5);
        // Both are durable: a crash now keeps them.
        let crashed = storage.crash(7);
        assert!(read(&crashed, PREVIOUS_FILE, &[1, 2], 16).is_ok());
        assert!(crashed.exists(CHECKPOINT_FILE).unwrap());
        let missing = read(&storage, "absent", &[1, 2], 16).unwrap_err();
        assert!(missing.contains("mem:/absent"), "{missing}");
    }

    /// Writes checkpoints of blocks 1, 2 and 3 into `storage`; returns the operation count
    /// when each was installed.
    fn write_three(storage: &virga_core::device::CrashPoint) -> Vec<u64> {
        let mut installed = Vec::new();
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..200u8 {
            sharded.insert(alloy_primitives::keccak256([i]).as_slice(), &[i + 1; 40]).unwrap();
        }
        for number in 1..=3u64 {
            sharded.insert(alloy_primitives::keccak256([number as u8]).as_slice(), &[number as u8; 20]).unwrap();
            let header = Header { state_root: sharded.root_hash(), number, ..Header::default() };
            write(storage, &header, &sharded, &[1, 2]).unwrap();
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
