//! Opening a storage node (recovery from its checkpoint and log) and the in-process driver
//! that runs its core: a request is a step of the core on the caller's task; its device
//! operations run on the node's disk with the core unlocked, so reads go on meanwhile.

use super::*;
use parking_lot::MutexGuard;
use std::collections::HashMap;
use tokio::sync::oneshot;

/// What an opened node is: its core and, when it owns a log, the disk that core writes.
pub struct Opened {
    pub core: StorageCore,
    pub disk: Option<StorageDisk>,
    /// Blocks applied from the log.
    pub replayed: u64,
}

/// Where a node keeps its log and checkpoints.
pub enum NodeStorage {
    None,
    /// The node's storage (checkpoints) and the log's, owned: recovered and appended to.
    Owned {
        node: SharedStorage,
        log: SharedStorage,
        options: LogOptions,
    },
    /// Read only: nothing is changed (the audit).
    ReadOnly {
        node: SharedStorage,
        log: SharedStorage,
    },
}

impl NodeStorage {
    /// A node's storage on any `Storage` (memory devices in the simulator): checkpoints in
    /// it, the log in its namespace [`LOG_DIR`].
    pub fn on(storage: SharedStorage, options: LogOptions) -> Result<NodeStorage, StorageError> {
        let log = storage.sub(LOG_DIR).map_err(|source| {
            StorageError::Log(LogError::Io { op: "open the storage of", path: storage.path_of(LOG_DIR), source })
        })?;
        Ok(NodeStorage::Owned { node: storage, log, options })
    }

    fn of(access: LogAccess<'_>) -> Result<NodeStorage, StorageError> {
        Ok(match access {
            LogAccess::None => NodeStorage::None,
            LogAccess::Owned(path, options) => {
                let (node, log) = storage_of_log(path, true)?;
                NodeStorage::Owned { node, log, options }
            }
            LogAccess::ReadOnly(path) => {
                let (node, log) = storage_of_log(path, false)?;
                NodeStorage::ReadOnly { node, log }
            }
        })
    }
}

/// Opens a node's core serving `served` of `shard_count` shards of `genesis_state` (the node
/// keeps its shards and only the others' hashes), replaying what its log already holds:
/// from the newest sound checkpoint (a damaged one is refused with a warning and, when the
/// node owns the storage, set aside), applying only the blocks logged after it.
pub fn open_core(
    id: impl Into<String>,
    served: Served,
    genesis: Header,
    genesis_state: &ShardedTrie,
    storage: NodeStorage,
) -> Result<Opened, StorageError> {
    let id = id.into();
    let prefix = prefix_nibbles(served.shard_count).ok_or(StorageError::ShardCount(served.shard_count))?;
    if let Some(&bad) = served.shards.iter().find(|&&index| index >= served.shard_count) {
        return Err(StorageError::NoShard(bad));
    }
    if genesis_state.shard_count() != served.shard_count {
        return Err(StorageError::ShardCount(genesis_state.shard_count()));
    }
    let shards = keep_served(genesis_state, &served.shards, prefix)?;
    let versions = Versions::new(genesis, shards);
    let (node_storage, log_storage, options, owned) = match storage {
        NodeStorage::None => {
            return Ok(Opened { core: StorageCore::new(id, served, versions, false), disk: None, replayed: 0 })
        }
        NodeStorage::Owned { node, log, options } => (node, log, options, true),
        NodeStorage::ReadOnly { node, log } => (node, log, log_options(), false),
    };
    let mut core = StorageCore::new(id, served, versions, owned);
    let base = load_checkpoint(&mut core, &*node_storage, owned);
    let mode = if owned { OpenMode::Repair } else { OpenMode::ReadOnly };
    // Blocks are replayed as the log's index is built, one record at a time.
    let mut replayed = 0;
    let mut first = true;
    let mut failure = None;
    let (log, recovered) = RecordLog::open_with(log_storage, options, mode, |lsn, payload| {
        if failure.is_some() {
            return;
        }
        if first && base.is_none() && lsn > 1 {
            failure = Some(StorageError::CutBelowMissingCheckpoint { first_lsn: lsn });
            return;
        }
        first = false;
        let replay = decode_logged_payload(lsn, payload).and_then(|updates| core.replay(base, lsn, &updates));
        match replay {
            Ok(applied) => replayed += u64::from(applied),
            Err(error) => failure = Some(error),
        }
    })?;
    if let Some(error) = failure {
        return Err(error);
    }
    if base.is_none() && recovered.first_lsn > 1 {
        return Err(StorageError::CutBelowMissingCheckpoint { first_lsn: recovered.first_lsn });
    }
    let disk = owned.then(|| StorageDisk::new(log, node_storage));
    Ok(Opened { core, disk, replayed })
}

/// Makes the newest sound checkpoint in `storage` (the newest, else the previous one) the
/// head version, and returns its block number. A node that owns the storage sets a damaged
/// newest checkpoint aside, so the next one does not push the sound one out.
fn load_checkpoint(core: &mut StorageCore, storage: &dyn Storage, owned: bool) -> Option<u64> {
    for name in [checkpoint::CHECKPOINT_FILE, checkpoint::PREVIOUS_FILE] {
        match storage.exists(name) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(node = %core.id(), path = %storage.path_of(name).display(), %error, "checkpoint unreadable");
                continue;
            }
        }
        match checkpoint::read(storage, name, core.served(), core.served_shards().shard_count) {
            Ok(loaded) => {
                let number = loaded.header.number;
                core.install_checkpoint(loaded);
                return Some(number);
            }
            Err(reason) => {
                tracing::warn!(node = %core.id(), path = %storage.path_of(name).display(), %reason, "checkpoint unusable");
                if owned && name == checkpoint::CHECKPOINT_FILE {
                    if let Err(error) = storage.rename(name, checkpoint::DAMAGED_FILE) {
                        tracing::warn!(node = %core.id(), %error, "setting the damaged checkpoint aside failed");
                    }
                }
            }
        }
    }
    None
}

/// A checkpoint's device operation and its outcome (its block number, or why it failed).
type WrittenCheckpoint = (virga_net::role::IoId, Result<u64, CheckpointError>);

type StorageEvent = Event<Rainblock, StorageIoDone, std::convert::Infallible>;
type StorageCommand = Command<Rainblock, StorageIo>;

/// What is behind the core's lock.
struct Inner {
    core: StorageCore,
    next_call: u64,
    /// Where the answer of each call the core has not answered yet goes (a block's
    /// acknowledgement comes after its log record is durable, possibly on another caller's
    /// thread when two calls bring the same block).
    answers: HashMap<CallId, oneshot::Sender<Response>>,
    /// The thread writing a checkpoint, joined before the node goes (so a node reopened on
    /// the same directory never races it).
    checkpoint_writer: Option<std::thread::JoinHandle<()>>,
    /// A checkpoint written in the background, taken up by the next request.
    checkpoint_done: Arc<Mutex<Option<WrittenCheckpoint>>>,
}

impl Inner {
    /// A new call whose answer goes to `answer`.
    fn call(&mut self, answer: oneshot::Sender<Response>) -> CallId {
        let call = CallId(self.next_call);
        self.next_call += 1;
        self.answers.insert(call, answer);
        call
    }
}

/// A storage node in this process, served as a [`Handler`]: a request is a step of its core
/// on the caller's task. The core and the disk have locks of their own so that witnesses are
/// served while a block is fsynced; the disk's lock is taken before the core's is let go,
/// so device operations run in the order the core asked for them.
pub struct StorageNode {
    id: String,
    served: Vec<usize>,
    inner: Mutex<Inner>,
    disk: Mutex<Option<StorageDisk>>,
}

impl StorageNode {
    /// A node logging to `log_path` (see [`open_core`]). Returns the node and the number of
    /// blocks applied from the log.
    pub fn open(
        id: impl Into<String>,
        served: Vec<usize>,
        shard_count: usize,
        config: ChainConfig,
        genesis: Header,
        genesis_state: &ShardedTrie,
        log_path: Option<&Path>,
    ) -> Result<(Arc<StorageNode>, u64), StorageError> {
        let access = log_path.map_or(LogAccess::None, |path| LogAccess::Owned(path, log_options()));
        Self::open_with(id, served, shard_count, config, genesis, genesis_state, access)
    }

    /// [`Self::open`] with the log used as `access` says: owned with other options (tests use
    /// small segments), or read only, changing nothing on disk and keeping no log
    /// afterwards (the audit of a log its node may still own).
    pub fn open_with(
        id: impl Into<String>,
        served: Vec<usize>,
        shard_count: usize,
        config: ChainConfig,
        genesis: Header,
        genesis_state: &ShardedTrie,
        access: LogAccess<'_>,
    ) -> Result<(Arc<StorageNode>, u64), StorageError> {
        let id = id.into();
        let served = Served { shards: served, shard_count, config, retained: DEFAULT_RETAINED_VERSIONS };
        let opened = open_core(id.clone(), served, genesis, genesis_state, NodeStorage::of(access)?)?;
        let replayed = opened.replayed;
        Ok((Arc::new(StorageNode::from_opened(id, opened)), replayed))
    }

    /// The node of an opened core (and its disk, if it has one).
    pub fn from_opened(id: impl Into<String>, opened: Opened) -> StorageNode {
        let Opened { core, disk, .. } = opened;
        let served = core.served().to_vec();
        let inner = Mutex::new(Inner {
            core,
            next_call: 0,
            answers: HashMap::new(),
            checkpoint_writer: None,
            checkpoint_done: Arc::default(),
        });
        StorageNode { id: id.into(), served, inner, disk: Mutex::new(disk) }
    }

    /// Steps the core with `events`, after carrying out `commands` (of a step already
    /// taken), until it asks for nothing more: answers go to their callers, device
    /// operations run on the disk with the core unlocked. Checkpoints (a few MB encoded and
    /// fsynced) are written on a thread of their own, off the acknowledgement's path, when
    /// `background`; the next request takes the result up.
    fn carry_out(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        mut events: Vec<StorageEvent>,
        mut commands: Vec<StorageCommand>,
        background: bool,
    ) {
        let finished = inner.checkpoint_done.lock().take();
        if let Some((io, result)) = finished {
            inner.checkpoint_writer = None;
            events.push(Event::IoDone { io, result: StorageIoDone::CheckpointWritten(result) });
        }
        loop {
            let mut device_ops = Vec::new();
            for command in commands.drain(..) {
                match command {
                    Command::Reply { call, response, .. } => {
                        if let Some(answer) = inner.answers.remove(&call) {
                            let _ = answer.send(response);
                        }
                    }
                    Command::Io { io, op: StorageIo::WriteCheckpoint { header, shards, served } } if background => {
                        let op = StorageIo::WriteCheckpoint { header, shards, served };
                        if let Some(done) = self.write_checkpoint_in_background(inner, io, op) {
                            events.push(done);
                        }
                    }
                    Command::Io { io, op } => device_ops.push((io, op)),
                    Command::Call { .. } | Command::SetTimer { .. } => {}
                }
            }
            for (io, result) in self.execute(inner, device_ops) {
                events.push(Event::IoDone { io, result });
            }
            let Some(event) = events.pop() else { break };
            inner.core.step(0, event, &mut commands);
        }
    }

    /// Runs `ops` on the disk in order, the core unlocked meanwhile.
    fn execute(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        ops: Vec<(virga_net::role::IoId, StorageIo)>,
    ) -> Vec<(virga_net::role::IoId, StorageIoDone)> {
        if ops.is_empty() {
            return Vec::new();
        }
        let disk = self.disk.lock();
        if disk.is_none() {
            tracing::error!(node = %self.id, ?ops, "device operations without a disk");
            return Vec::new();
        }
        MutexGuard::unlocked(inner, move || {
            // The disk's guard ends in here, before the core is locked again (the order is
            // always core, then disk).
            let mut disk = disk;
            let Some(disk) = disk.as_mut() else { return Vec::new() };
            ops.into_iter().map(|(io, op)| (io, disk.execute(op))).collect()
        })
    }

    /// Starts writing a checkpoint on a thread; the completion at once if the thread
    /// could not start.
    fn write_checkpoint_in_background(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        io: virga_net::role::IoId,
        op: StorageIo,
    ) -> Option<StorageEvent> {
        let StorageIo::WriteCheckpoint { header, shards, served } = op else { return None };
        let storage = self.disk.lock().as_ref()?.checkpoint_storage();
        let done = Arc::clone(&inner.checkpoint_done);
        let spawned = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
            let result = checkpoint::write(&*storage, &header, &shards, &served).map(|()| header.number);
            *done.lock() = Some((io, result));
        });
        match spawned {
            Ok(writer) => {
                inner.checkpoint_writer = Some(writer);
                None
            }
            Err(error) => {
                let done = StorageIoDone::CheckpointWritten(Err(CheckpointError::Writer(error)));
                Some(Event::IoDone { io, result: done })
            }
        }
    }

    /// One request as a step of the core; the answer once the core gives it.
    fn serve(&self, from: String, request: Request) -> oneshot::Receiver<Response> {
        let (answer, answered) = oneshot::channel();
        let mut inner = self.inner.lock();
        let call = inner.call(answer);
        self.carry_out(&mut inner, vec![Event::Request { from, call, request }], Vec::new(), true);
        answered
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn served(&self) -> &[usize] {
        &self.served
    }

    pub fn stats(&self) -> StorageStats {
        self.inner.lock().core.stats()
    }

    pub fn head(&self) -> (u64, B256, B256) {
        self.inner.lock().core.head()
    }

    /// Versions held (for tests of fork collection).
    pub fn version_count(&self) -> usize {
        self.inner.lock().core.version_count()
    }

    /// Subtree hashes of the served shards at block `hash`.
    pub fn shard_hashes(&self, hash: &B256) -> Option<Vec<(usize, B256)>> {
        self.inner.lock().core.shard_hashes(hash)
    }

    pub fn set_checkpoint_interval(&self, blocks: u64) {
        self.inner.lock().core.set_checkpoint_interval(blocks);
    }

    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&self, fault: StorageFault) {
        self.inner.lock().core.set_fault(fault);
    }

    /// Writes a checkpoint now (none if the newest is of the same block), cuts the log below
    /// the previous one, and returns the checkpoint's block number.
    pub fn checkpoint_now(&self) -> Result<u64, StorageError> {
        // After the one being written in the background, if any.
        let writer = self.inner.lock().checkpoint_writer.take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        let mut inner = self.inner.lock();
        self.carry_out(&mut inner, Vec::new(), Vec::new(), false);
        let mut commands = Vec::new();
        let number = inner.core.checkpoint_now(&mut commands)?;
        for command in commands {
            let Command::Io { io, op } = command else { continue };
            for (io, result) in self.execute(&mut inner, vec![(io, op)]) {
                if let StorageIoDone::CheckpointWritten(Err(error)) = result {
                    return Err(error.into());
                }
                self.carry_out(&mut inner, vec![Event::IoDone { io, result }], Vec::new(), false);
            }
        }
        Ok(number)
    }

    /// Accepts a block from a miner: check, apply, log (durably), then acknowledge.
    pub fn apply_block(&self, updates: &BlockUpdates) -> Result<(u64, B256), StorageError> {
        let (answer, mut answered) = oneshot::channel();
        let mut inner = self.inner.lock();
        let call = inner.call(answer);
        let mut commands = Vec::new();
        if let Err(refused) = inner.core.admit_block(self.id.clone(), call, updates.clone(), &mut commands) {
            inner.answers.remove(&call);
            return Err(refused.into());
        }
        self.carry_out(&mut inner, Vec::new(), commands, true);
        drop(inner);
        let unacknowledged = |reason: &str| StorageError::Unacknowledged { reason: reason.to_string() };
        let response = answered.try_recv().map_err(|_| unacknowledged("the block is still being logged"))?;
        match response.body {
            Some(virga_net::ResponseBody::BlockAck(ack)) => {
                let acked = crate::codec::parse_block_id(ack.block.as_ref(), "block").map_err(BlockRefusal::from)?;
                acked.ok_or_else(|| unacknowledged("acknowledged no block"))
            }
            Some(virga_net::ResponseBody::Error(reason)) => Err(StorageError::Unacknowledged { reason }),
            _ => Err(unacknowledged("the storage node answered a block with something else")),
        }
    }

    /// A node bag for `keys` at block `at` (default: head), leaving out levels above `compaction`.
    pub fn witness(&self, request: &proto::WitnessRequest) -> Result<proto::WitnessReply, ReadRefusal> {
        self.inner.lock().core.witness(request)
    }
}

impl Drop for StorageNode {
    fn drop(&mut self) {
        if let Some(writer) = self.inner.get_mut().checkpoint_writer.take() {
            let _ = writer.join();
        }
    }
}

impl Handler<Rainblock> for StorageNode {
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
        let answered = self.serve(from, request);
        Box::pin(async move { answered.await.unwrap_or_else(|_| refusal("the storage node stopped before answering")) })
    }
}
