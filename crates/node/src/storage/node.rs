//! Opening a storage node (recovery from its checkpoint and log) and the in-process driver
//! that runs its core: a request is one step of the core, its device operations carried
//! out on the node's disk before the next request is taken.

use super::*;

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
    genesis_state: &ShardedState,
    storage: NodeStorage,
) -> Result<Opened, StorageError> {
    let id = id.into();
    let prefix = prefix_nibbles(served.shard_count).ok_or(StorageError::ShardCount(served.shard_count))?;
    if let Some(&bad) = served.shards.iter().find(|&&index| index >= served.shard_count) {
        return Err(StorageError::NoShard(bad));
    }
    if genesis_state.accounts.shard_count() != served.shard_count {
        return Err(StorageError::ShardCount(genesis_state.accounts.shard_count()));
    }
    let shards = keep_served(&genesis_state.accounts, &served.shards, prefix)?;
    let contracts = genesis_state.contracts.keep_served(&served.shards, prefix);
    let versions = Versions::new(genesis, shards, contracts);
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

struct Inner {
    core: StorageCore,
    disk: Option<StorageDisk>,
    next_call: u64,
    /// The thread writing a checkpoint, joined before the node goes (so a node reopened on
    /// the same directory never races it).
    checkpoint_writer: Option<std::thread::JoinHandle<()>>,
    /// A checkpoint written in the background, taken up by the next request.
    checkpoint_done: Arc<Mutex<Option<WrittenCheckpoint>>>,
}

impl Inner {
    /// Steps the core with `event` and carries out what it asks, device completions
    /// included, until it asks for nothing more; hands each reply to `reply` as it comes.
    /// Checkpoints (a few MB encoded and fsynced) are written on a thread of their own, off
    /// the acknowledgement's path, when `background`; the next request takes the result up.
    fn run(
        &mut self,
        event: Event<Rainblock, StorageIoDone, std::convert::Infallible>,
        reply: &mut dyn FnMut(CallId, Response),
        background: bool,
    ) {
        self.carry_out(vec![event], Vec::new(), reply, background);
    }

    /// [`Self::run`] from the core's `commands` of a step already taken, then `events`.
    fn carry_out(
        &mut self,
        mut events: Vec<Event<Rainblock, StorageIoDone, std::convert::Infallible>>,
        mut commands: Vec<Command<Rainblock, StorageIo>>,
        reply: &mut dyn FnMut(CallId, Response),
        background: bool,
    ) {
        if let Some((io, result)) = self.checkpoint_done.lock().take() {
            self.checkpoint_writer = None;
            events.push(Event::IoDone { io, result: StorageIoDone::CheckpointWritten(result) });
        }
        loop {
            for command in commands.drain(..) {
                match command {
                    Command::Reply { call, response, .. } => reply(call, response),
                    Command::Io { io, op: StorageIo::WriteCheckpoint { header, shards, contracts, served } }
                        if background =>
                    {
                        let Some(disk) = self.disk.as_ref() else { continue };
                        let (done, storage) = (Arc::clone(&self.checkpoint_done), disk.checkpoint_storage());
                        let spawned = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
                            let result = checkpoint::write(&*storage, &header, (&shards, &contracts), &served)
                                .map(|()| header.number);
                            *done.lock() = Some((io, result));
                        });
                        match spawned {
                            Ok(writer) => self.checkpoint_writer = Some(writer),
                            Err(error) => {
                                let done = StorageIoDone::CheckpointWritten(Err(CheckpointError::Writer(error)));
                                events.push(Event::IoDone { io, result: done });
                            }
                        }
                    }
                    Command::Io { io, op } => match self.disk.as_mut() {
                        Some(disk) => events.push(Event::IoDone { io, result: disk.execute(op) }),
                        None => tracing::error!(node = %self.core.id(), ?op, "a device operation without a disk"),
                    },
                    Command::Call { .. } | Command::SetTimer { .. } => {}
                }
            }
            let Some(event) = events.pop() else { break };
            self.core.step(0, event, &mut commands);
        }
    }

    fn request(&mut self, from: String, request: Request) -> Response {
        let call = CallId(self.next_call);
        self.next_call += 1;
        let mut answer = None;
        let mut reply = |replied, response| {
            if replied == call {
                answer = Some(response);
            }
        };
        self.run(Event::Request { from, call, request }, &mut reply, true);
        answer.unwrap_or_else(|| refusal("the storage node did not answer"))
    }

    /// A block from this process, its refusal kept typed: the answer once it is logged.
    fn apply(&mut self, from: String, updates: BlockUpdates) -> Result<Response, BlockRefusal> {
        // A checkpoint written meanwhile is taken up first, as for a request.
        self.carry_out(Vec::new(), Vec::new(), &mut |_, _| {}, true);
        let call = CallId(self.next_call);
        self.next_call += 1;
        let mut commands = Vec::new();
        self.core.admit_block(from, call, Box::new(updates), &mut commands)?;
        let mut answer = None;
        let mut reply = |replied, response| {
            if replied == call {
                answer = Some(response);
            }
        };
        self.carry_out(Vec::new(), commands, &mut reply, true);
        Ok(answer.unwrap_or_else(|| refusal("the storage node did not answer")))
    }
}

/// A storage node in this process: its core and disk behind a lock, served as a [`Handler`].
pub struct StorageNode {
    id: String,
    served: Vec<usize>,
    inner: Arc<Mutex<Inner>>,
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
        genesis_state: &ShardedState,
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
        genesis_state: &ShardedState,
        access: LogAccess<'_>,
    ) -> Result<(Arc<StorageNode>, u64), StorageError> {
        let id = id.into();
        let served = Served { shards: served, shard_count, config, retained: DEFAULT_RETAINED_VERSIONS };
        let Opened { core, disk, replayed } =
            open_core(id.clone(), served.clone(), genesis, genesis_state, NodeStorage::of(access)?)?;
        let inner = Arc::new(Mutex::new(Inner {
            core,
            disk,
            next_call: 0,
            checkpoint_writer: None,
            checkpoint_done: Arc::default(),
        }));
        Ok((Arc::new(StorageNode { id, served: served.shards, inner }), replayed))
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
        let finished = inner.checkpoint_done.lock().take();
        if let Some((io, result)) = finished {
            inner.checkpoint_writer = None;
            let done = Event::IoDone { io, result: StorageIoDone::CheckpointWritten(result) };
            inner.run(done, &mut |_, _| {}, false);
        }
        let mut commands = Vec::new();
        let number = inner.core.checkpoint_now(&mut commands)?;
        for command in commands {
            if let Command::Io { io, op } = command {
                let Some(disk) = inner.disk.as_mut() else { continue };
                let result = match disk.execute(op) {
                    StorageIoDone::CheckpointWritten(Err(error)) => return Err(error.into()),
                    result => result,
                };
                inner.run(Event::IoDone { io, result }, &mut |_, _| {}, false);
            }
        }
        Ok(number)
    }

    /// Accepts a block from a miner: check, apply, log (durably), then acknowledge.
    pub fn apply_block(&self, updates: &BlockUpdates) -> Result<(u64, B256), StorageError> {
        let response = self.inner.lock().apply(self.id.clone(), updates.clone())?;
        let unacknowledged = |reason: &str| StorageError::Unacknowledged { reason: reason.to_string() };
        match response {
            Response::BlockAck(acked) => Ok(acked.pair()),
            Response::Refused(reason) => Err(StorageError::Unacknowledged { reason }),
            _ => Err(unacknowledged("the storage node answered a block with something else")),
        }
    }

    /// A node bag for `keys` at block `at` (default: head), leaving out levels above `compaction`.
    pub fn witness(
        &self,
        request: &crate::messages::WitnessRequest,
    ) -> Result<crate::messages::WitnessReply, ReadRefusal> {
        self.inner.lock().core.witness(request)
    }
}

impl Drop for StorageNode {
    fn drop(&mut self) {
        let writer = self.inner.lock().checkpoint_writer.take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
    }
}

impl Handler<Rainblock> for StorageNode {
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
        let response = self.inner.lock().request(from, request);
        Box::pin(std::future::ready(response))
    }
}
