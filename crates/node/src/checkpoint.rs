//! A storage node's checkpoints: its served shards at one block, so a restart rebuilds that
//! version directly and applies only the logged blocks after it.
//!
//! File `checkpoint.bin` beside the log: an 8-byte magic, the CRC-32 of the payload, the
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
use std::io::Write;
use std::path::{Path, PathBuf};
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
pub fn write(path: &Path, header: &Header, shards: &ShardedTrie, served: &[usize]) -> Result<(), String> {
    let bytes = encode(header, shards, served)?;
    install(path, &bytes)
}

/// A checkpoint file's bytes.
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
fn install(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let temporary = path.with_extension("tmp");
    let failed = |what: &str, error: std::io::Error| format!("{what} {}: {error}", temporary.display());
    let mut file = std::fs::File::create(&temporary).map_err(|error| failed("creating", error))?;
    file.write_all(bytes).map_err(|error| failed("writing", error))?;
    file.sync_all().map_err(|error| failed("syncing", error))?;
    drop(file);
    if path.exists() {
        std::fs::rename(path, previous_of(path)).map_err(|error| failed("keeping the checkpoint before", error))?;
    }
    std::fs::rename(&temporary, path).map_err(|error| failed("renaming", error))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|error| failed("syncing the directory of", error))?;
    }
    Ok(())
}

/// A version rebuilt from a checkpoint.
#[derive(Debug)]
pub struct Loaded {
    pub header: Header,
    pub hash: B256,
    pub shards: ShardedTrie,
}

/// Reads and checks the checkpoint at `path` for a node serving `served` of `shard_count`
/// shards. Every failure names what is wrong; nothing is trusted unchecked.
pub fn read(path: &Path, served: &[usize], shard_count: usize) -> Result<Loaded, String> {
    let bytes = std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()))?;
    decode(&bytes, served, shard_count)
}

/// Checks and decodes a checkpoint file's bytes (see [`read`]).
pub fn decode(bytes: &[u8], served: &[usize], shard_count: usize) -> Result<Loaded, String> {
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut sharded = ShardedTrie::new(16).unwrap();
        for i in 0..200u8 {
            sharded.insert(alloy_primitives::keccak256([i]).as_slice(), &[i + 1; 40]).unwrap();
        }
        let header = Header { state_root: sharded.root_hash(), number: 5, ..Header::default() };
        write(&path, &header, &sharded, &[1, 2]).unwrap();
        let loaded = read(&path, &[1, 2], 16).unwrap();
        assert_eq!((loaded.header.number, loaded.hash), (5, header.hash_slow()));
        assert_eq!(loaded.shards.root_hash(), sharded.root_hash());
        assert!(loaded.shards.shard(3).unwrap().is_known_by_hash());

        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        assert!(read(&path, &[1, 2], 16).unwrap_err().contains("preamble says"));
        std::fs::write(&path, b"not a checkpoint at all").unwrap();
        assert!(read(&path, &[1, 2], 16).unwrap_err().contains("bad magic"));
        // Whole, but for a node serving a shard it does not hold.
        std::fs::write(&path, &whole).unwrap();
        assert!(read(&path, &[1, 2, 3], 16).unwrap_err().contains("served shard 3 is missing"));
        // Whole, but the recorded shard hashes do not give the header's root.
        let lying = Header { state_root: B256::repeat_byte(9), ..header };
        write(&path, &lying, &sharded, &[1, 2]).unwrap();
        assert!(read(&path, &[1, 2], 16).unwrap_err().contains("give state root"));
    }
}
