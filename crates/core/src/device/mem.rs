//! [`Storage`] in memory, with durable and volatile state kept apart so that tests can crash
//! it.
//!
//! # Crash model
//!
//! [`MemStorage::crash`] returns the storage as a power failure could leave it:
//!
//! * **Object contents.** Each object keeps its contents as of its last `sync` (durable) and
//!   as reads see them now (volatile). Writes and truncations since the last `sync` mark
//!   [`CRASH_BLOCK_BYTES`]-byte blocks (disk sectors, aligned at multiples of the block size)
//!   dirty. After a crash an object holds its durable contents with **any subset** of its
//!   dirty blocks replaced by their volatile contents; **one** surviving block may be torn
//!   (only a prefix of its new bytes written, the rest as before). The length is either the
//!   durable or the volatile one; bytes past the durable length that no surviving block
//!   covers read as zeros, as in a file whose size reached the disk before its data.
//! * **Directory operations.** `create`, `remove` and `rename` since the namespace's last
//!   `sync_dir` each survive or not, independently, applied in their original order (an
//!   operation whose source no longer exists is skipped). An object that no surviving entry
//!   names is gone.
//! * **Namespaces** made by [`Storage::sub`] are durable at once.
//!
//! Which blocks and operations survive is drawn from the seed, so a crash replays exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{check_name, Device, Storage};

/// Granularity of the crash model: a crash keeps or drops unsynced data in blocks of this
/// many bytes (a disk sector), at offsets that are multiples of it.
pub const CRASH_BLOCK_BYTES: u64 = 512;

/// In-memory [`Storage`] that a test can crash (see the module documentation). Cloning gives
/// another handle on the same storage; [`snapshot`](MemStorage::snapshot) copies it.
#[derive(Clone)]
pub struct MemStorage {
    state: Arc<Mutex<MemState>>,
    /// Path of this namespace below the root, `""` for the root.
    namespace: String,
}

#[derive(Clone, Default)]
struct MemState {
    objects: BTreeMap<u64, MemObject>,
    namespaces: BTreeMap<String, Namespace>,
    next_id: u64,
}

#[derive(Clone, Default)]
struct MemObject {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    /// Blocks written or truncated since the last sync.
    dirty: BTreeSet<u64>,
}

#[derive(Clone, Default)]
struct Namespace {
    volatile: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
    /// Directory operations since the last `sync_dir`, oldest first.
    pending: Vec<DirOp>,
}

#[derive(Clone, Debug)]
enum DirOp {
    Create { name: String, id: u64 },
    Remove { name: String },
    Rename { from: String, to: String },
}

impl fmt::Debug for MemStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemStorage").field("namespace", &self.location()).finish()
    }
}

impl Default for MemStorage {
    fn default() -> Self {
        MemStorage::new()
    }
}

impl MemStorage {
    /// An empty storage.
    pub fn new() -> MemStorage {
        let mut state = MemState::default();
        state.namespaces.insert(String::new(), Namespace::default());
        MemStorage { state: Arc::new(Mutex::new(state)), namespace: String::new() }
    }

    /// An independent copy of the whole storage (durable and volatile state), so that the
    /// same moment can be crashed in several ways. The copy is rooted where `self` is.
    pub fn snapshot(&self) -> MemStorage {
        let state = self.lock().clone();
        MemStorage { state: Arc::new(Mutex::new(state)), namespace: self.namespace.clone() }
    }

    /// What a crash at this moment could leave, drawn from `seed` (see the module
    /// documentation). `self` is unchanged and devices opened from it keep working on the old
    /// state; the result is a new storage rooted where `self` is.
    pub fn crash(&self, seed: u64) -> MemStorage {
        self.crash_with(&mut StdRng::seed_from_u64(seed))
    }

    /// As [`crash`](MemStorage::crash), drawing from `rng`.
    pub fn crash_with(&self, rng: &mut impl Rng) -> MemStorage {
        let state = self.lock();
        let mut after = MemState { next_id: state.next_id, ..MemState::default() };
        for (path, namespace) in &state.namespaces {
            let mut entries = namespace.durable.clone();
            for op in &namespace.pending {
                if rng.random_bool(0.5) {
                    apply(&mut entries, op);
                }
            }
            after
                .namespaces
                .insert(path.clone(), Namespace { durable: entries.clone(), volatile: entries, pending: Vec::new() });
        }
        let reachable: BTreeSet<u64> = after.namespaces.values().flat_map(|n| n.durable.values().copied()).collect();
        for id in reachable {
            if let Some(object) = state.objects.get(&id) {
                let bytes = crash_object(object, rng);
                after.objects.insert(id, MemObject { volatile: bytes.clone(), durable: bytes, dirty: BTreeSet::new() });
            }
        }
        MemStorage { state: Arc::new(Mutex::new(after)), namespace: self.namespace.clone() }
    }

    /// The worst crash for durability: every unsynced block and directory operation lost.
    pub fn crash_losing_unsynced(&self) -> MemStorage {
        let state = self.lock();
        let mut after = MemState { next_id: state.next_id, ..MemState::default() };
        for (path, namespace) in &state.namespaces {
            let entries = namespace.durable.clone();
            after
                .namespaces
                .insert(path.clone(), Namespace { durable: entries.clone(), volatile: entries, pending: Vec::new() });
            for id in namespace.durable.values() {
                if let Some(object) = state.objects.get(id) {
                    let bytes = object.durable.clone();
                    after
                        .objects
                        .insert(*id, MemObject { volatile: bytes.clone(), durable: bytes, dirty: BTreeSet::new() });
                }
            }
        }
        MemStorage { state: Arc::new(Mutex::new(after)), namespace: self.namespace.clone() }
    }

    /// Number of blocks written since their object's last sync, over all objects.
    pub fn unsynced_blocks(&self) -> usize {
        self.lock().objects.values().map(|o| o.dirty.len()).sum()
    }

    /// Number of directory operations not yet made durable, over all namespaces.
    pub fn unsynced_dir_ops(&self) -> usize {
        self.lock().namespaces.values().map(|n| n.pending.len()).sum()
    }

    fn lock(&self) -> MutexGuard<'_, MemState> {
        // Every operation leaves the state consistent before it can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_namespace<T>(&self, f: impl FnOnce(&mut Namespace, &mut MemState) -> io::Result<T>) -> io::Result<T> {
        let mut state = self.lock();
        let mut namespace = state
            .namespaces
            .remove(&self.namespace)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "namespace no longer exists"))?;
        let result = f(&mut namespace, &mut state);
        state.namespaces.insert(self.namespace.clone(), namespace);
        result
    }

    /// As [`Storage::sub`], keeping the concrete type.
    pub fn sub_mem(&self, name: &str) -> io::Result<MemStorage> {
        let path = self.nested(name)?;
        self.lock().namespaces.entry(path.clone()).or_default();
        Ok(MemStorage { state: Arc::clone(&self.state), namespace: path })
    }

    /// As [`Storage::open_sub`], keeping the concrete type.
    pub fn open_sub_mem(&self, name: &str) -> io::Result<MemStorage> {
        let path = self.nested(name)?;
        if !self.lock().namespaces.contains_key(&path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no namespace mem:/{path}")));
        }
        Ok(MemStorage { state: Arc::clone(&self.state), namespace: path })
    }

    fn nested(&self, name: &str) -> io::Result<String> {
        check_name(name)?;
        Ok(if self.namespace.is_empty() { name.to_string() } else { format!("{}/{name}", self.namespace) })
    }

    fn device(&self, id: u64, name: &str) -> Arc<dyn Device> {
        Arc::new(MemDevice { state: Arc::clone(&self.state), id, path: self.path_of(name) })
    }
}

fn apply(entries: &mut BTreeMap<String, u64>, op: &DirOp) {
    match op {
        DirOp::Create { name, id } => {
            entries.insert(name.clone(), *id);
        }
        DirOp::Remove { name } => {
            entries.remove(name);
        }
        DirOp::Rename { from, to } => {
            if let Some(id) = entries.remove(from) {
                entries.insert(to.clone(), id);
            }
        }
    }
}

/// The contents a crash leaves of one object.
fn crash_object(object: &MemObject, rng: &mut impl Rng) -> Vec<u8> {
    let volatile_len = object.volatile.len();
    let mut bytes = object.durable.clone();
    let len = if volatile_len != bytes.len() && rng.random_bool(0.5) { volatile_len } else { bytes.len() };
    bytes.resize(len, 0);
    let surviving: Vec<u64> = object.dirty.iter().copied().filter(|_| rng.random_bool(0.5)).collect();
    let torn = if !surviving.is_empty() && rng.random_bool(0.5) {
        Some((surviving[rng.random_range(0..surviving.len())], rng.random_range(0..CRASH_BLOCK_BYTES) as usize))
    } else {
        None
    };
    let copy_end = len.min(volatile_len);
    for block in surviving {
        let start = (block * CRASH_BLOCK_BYTES) as usize;
        let mut end = start + CRASH_BLOCK_BYTES as usize;
        if let Some((torn_block, prefix)) = torn {
            if torn_block == block {
                end = start + prefix;
            }
        }
        let end = end.min(copy_end);
        if start < end {
            bytes[start..end].copy_from_slice(&object.volatile[start..end]);
        }
    }
    bytes
}

fn mark_dirty(object: &mut MemObject, from: u64, to: u64) {
    if to <= from {
        return;
    }
    let first = from / CRASH_BLOCK_BYTES;
    let last = (to - 1) / CRASH_BLOCK_BYTES;
    object.dirty.extend(first..=last);
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no object named {name:?}"))
}

impl Storage for MemStorage {
    fn create(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        check_name(name)?;
        let id = self.with_namespace(|namespace, state| {
            if namespace.volatile.contains_key(name) {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("object {name:?} exists")));
            }
            let id = state.next_id;
            state.next_id += 1;
            state.objects.insert(id, MemObject::default());
            namespace.volatile.insert(name.to_string(), id);
            namespace.pending.push(DirOp::Create { name: name.to_string(), id });
            Ok(id)
        })?;
        Ok(self.device(id, name))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn Device>> {
        check_name(name)?;
        let id =
            self.with_namespace(|namespace, _| namespace.volatile.get(name).copied().ok_or_else(|| not_found(name)))?;
        Ok(self.device(id, name))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        self.with_namespace(|namespace, _| Ok(namespace.volatile.keys().cloned().collect()))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        self.with_namespace(|namespace, _| {
            namespace.volatile.remove(name).ok_or_else(|| not_found(name))?;
            namespace.pending.push(DirOp::Remove { name: name.to_string() });
            Ok(())
        })
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        check_name(from)?;
        check_name(to)?;
        self.with_namespace(|namespace, _| {
            let id = namespace.volatile.remove(from).ok_or_else(|| not_found(from))?;
            namespace.volatile.insert(to.to_string(), id);
            namespace.pending.push(DirOp::Rename { from: from.to_string(), to: to.to_string() });
            Ok(())
        })
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.with_namespace(|namespace, _| {
            namespace.durable = namespace.volatile.clone();
            namespace.pending.clear();
            Ok(())
        })
    }

    fn sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.sub_mem(name)?))
    }

    fn open_sub(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.open_sub_mem(name)?))
    }

    /// Durable at once, as creating a namespace is.
    fn remove_sub(&self, name: &str) -> io::Result<()> {
        let path = self.nested(name)?;
        let nested = format!("{path}/");
        let mut state = self.lock();
        if !state.namespaces.contains_key(&path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no namespace mem:/{path}")));
        }
        let removed: Vec<String> =
            state.namespaces.keys().filter(|key| **key == path || key.starts_with(&nested)).cloned().collect();
        for key in removed {
            if let Some(namespace) = state.namespaces.remove(&key) {
                for id in namespace.volatile.values().chain(namespace.durable.values()) {
                    state.objects.remove(id);
                }
            }
        }
        Ok(())
    }

    fn path_of(&self, name: &str) -> PathBuf {
        let mut path = self.location();
        path.push(name);
        path
    }

    fn location(&self) -> PathBuf {
        PathBuf::from(format!("mem:/{}", self.namespace))
    }
}

/// One object of a [`MemStorage`].
struct MemDevice {
    state: Arc<Mutex<MemState>>,
    id: u64,
    path: PathBuf,
}

impl fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemDevice").field("path", &self.path).finish()
    }
}

impl MemDevice {
    fn with_object<T>(&self, f: impl FnOnce(&mut MemObject) -> T) -> io::Result<T> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A removed object stays readable and writable through open handles, as on POSIX.
        let object = state.objects.get_mut(&self.id).ok_or_else(|| not_found(&self.path.display().to_string()))?;
        Ok(f(object))
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.with_object(|object| {
            let len = object.volatile.len() as u64;
            if offset >= len {
                return 0;
            }
            let start = offset as usize;
            let n = buf.len().min(object.volatile.len() - start);
            buf[..n].copy_from_slice(&object.volatile[start..start + n]);
            n
        })
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let end = offset.checked_add(data.len() as u64).ok_or_else(|| io::Error::other("write past 2^64 bytes"))?;
        self.with_object(|object| {
            let old_len = object.volatile.len() as u64;
            if end > old_len {
                object.volatile.resize(end as usize, 0);
            }
            object.volatile[offset as usize..end as usize].copy_from_slice(data);
            // A write that leaves a hole also changes the bytes of the hole.
            mark_dirty(object, offset.min(old_len), end);
        })
    }

    fn append(&self, data: &[u8]) -> io::Result<u64> {
        self.with_object(|object| {
            let offset = object.volatile.len() as u64;
            object.volatile.extend_from_slice(data);
            mark_dirty(object, offset, offset + data.len() as u64);
            offset
        })
    }

    fn sync(&self) -> io::Result<()> {
        self.with_object(|object| {
            let len = object.volatile.len();
            object.durable.resize(len, 0);
            for block in std::mem::take(&mut object.dirty) {
                let start = (block * CRASH_BLOCK_BYTES) as usize;
                let end = (start + CRASH_BLOCK_BYTES as usize).min(len);
                if start < end {
                    object.durable[start..end].copy_from_slice(&object.volatile[start..end]);
                }
            }
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with_object(|object| object.volatile.len() as u64)
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let new_len = usize::try_from(len).map_err(|_| io::Error::other("length too large for memory"))?;
        self.with_object(|object| {
            let old_len = object.volatile.len() as u64;
            object.volatile.resize(new_len, 0);
            mark_dirty(object, old_len.min(len), old_len.max(len).max(len + 1));
        })
    }
}
