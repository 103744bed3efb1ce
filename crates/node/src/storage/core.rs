//! The storage node's core: requests in, replies and device operations out.
//!
//! A block's updates are checked and applied as a version at once, but acknowledged only
//! once the device has logged them ([`StorageIo::Append`] then [`StorageIoDone::Appended`]);
//! a duplicate of a block still being logged waits for the same record. Every
//! `checkpoint_interval` blocks the core asks for a checkpoint of the head's ancestor
//! [`CHECKPOINT_LAG`] blocks down, and once one is written, for the log to be cut below the
//! checkpoint before it.

use crate::messages::{BlockId, BlockUpdates, HeadReply, Request, Response, WitnessReply, WitnessRequest};
use crate::protocol::{refusal, Rainblock};
use alloy_consensus::Header;
use alloy_primitives::B256;
use prost::Message;
use std::collections::{HashMap, VecDeque};
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role};
use virga_trie::shard::ShardedTrie;

use super::versions::{Accepted, BlockRefusal, ReadRefusal, Served, Versions};
use super::{Contracts, StorageError, StorageStats, CHECKPOINT_LAG, DEFAULT_CHECKPOINT_INTERVAL};
use crate::checkpoint::CheckpointError;
use virga_log::LogError;

/// What a storage node asks of its device.
#[derive(Debug)]
pub enum StorageIo {
    /// Append one accepted block's updates to the log and make it durable.
    Append { record: Vec<u8> },
    /// Write (and make durable) the checkpoint of `header`'s version.
    WriteCheckpoint { header: Box<Header>, shards: ShardedTrie, contracts: Contracts, served: Vec<usize> },
    /// Remove the log's segments wholly below record `below`.
    CutLog { below: u64 },
}

/// What the device answers.
#[derive(Debug)]
pub enum StorageIoDone {
    /// The record's log sequence number.
    Appended(Result<u64, LogError>),
    /// The checkpoint's block number.
    CheckpointWritten(Result<u64, CheckpointError>),
    /// Segments removed, and the log's first record after the cut.
    LogCut(Result<(usize, u64), LogError>),
}

/// A storage node's deliberate misbehaviour, for the trust tests and the simulator's
/// broken variants (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageFault {
    /// Honest.
    #[default]
    None,
    /// Every witness bag served has one byte flipped in one of its nodes.
    CorruptWitness,
    /// Every witness is proved from the parent of the version asked for (when held), while
    /// the reply claims the block and state root asked for.
    StaleWitness,
    /// Blocks are acknowledged before their log record is durable (a broken variant the
    /// simulator must catch: a crash then loses an acknowledged block).
    AckBeforeLog,
}

/// A block being logged, and the calls waiting for its acknowledgement.
struct Logging {
    number: u64,
    hash: B256,
    waiters: Vec<(String, CallId)>,
}

/// Checkpoint bookkeeping.
#[derive(Default)]
struct Checkpoints {
    newest: Option<u64>,
    previous: Option<u64>,
    /// The block of the checkpoint being written.
    writing: Option<u64>,
}

pub struct StorageCore {
    id: String,
    served: Served,
    versions: Versions,
    /// Whether the node has a log (a node without one acknowledges at once and never checkpoints).
    logged: bool,
    /// The block and LSN of each record the log still holds, in log order.
    log_blocks: VecDeque<(u64, u64)>,
    logging: HashMap<IoId, Logging>,
    checkpoints: Checkpoints,
    checkpoint_interval: u64,
    ids: Ids,
    stats: StorageStats,
    #[cfg(feature = "fault-injection")]
    fault: StorageFault,
}

impl StorageCore {
    pub(crate) fn new(id: String, served: Served, versions: Versions, logged: bool) -> StorageCore {
        StorageCore {
            id,
            served,
            versions,
            logged,
            log_blocks: VecDeque::new(),
            logging: HashMap::new(),
            checkpoints: Checkpoints::default(),
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            ids: Ids::default(),
            stats: StorageStats::default(),
            #[cfg(feature = "fault-injection")]
            fault: StorageFault::None,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn served(&self) -> &[usize] {
        &self.served.shards
    }

    pub fn stats(&self) -> StorageStats {
        self.stats
    }

    /// The head block (highest number applied) and its state root.
    pub fn head(&self) -> (u64, B256, B256) {
        self.versions.head()
    }

    /// Blocks whose log record is being written.
    pub fn appends_in_flight(&self) -> usize {
        self.logging.len()
    }

    pub fn version_count(&self) -> usize {
        self.versions.by_hash.len()
    }

    /// Subtree hashes of the served shards at block `hash`.
    pub fn shard_hashes(&self, hash: &B256) -> Option<Vec<(usize, B256)>> {
        let version = self.versions.by_hash.get(hash)?;
        Some(
            self.served
                .shards
                .iter()
                .filter_map(|&index| version.shards.shard(index).map(|shard| (index, shard.subtree_hash())))
                .collect(),
        )
    }

    /// Blocks between checkpoints (0 turns them off).
    pub fn set_checkpoint_interval(&mut self, blocks: u64) {
        self.checkpoint_interval = blocks;
    }

    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&mut self, fault: StorageFault) {
        tracing::info!(node = %self.id, ?fault, "fault injected");
        self.fault = fault;
    }

    pub fn served_shards(&self) -> &Served {
        &self.served
    }

    /// Recovery: makes a checkpoint's version the head.
    pub(crate) fn install_checkpoint(&mut self, loaded: crate::checkpoint::Loaded) {
        let number = loaded.header.number;
        self.versions.install(loaded.hash, loaded.header, loaded.shards, loaded.contracts);
        self.checkpoints.newest = Some(number);
        self.stats.opened_from_checkpoint = Some(number);
    }

    /// Recovery: replays logged block `lsn` on top of the checkpoint at block `base` (if
    /// any); returns whether it was applied (it is skipped when the checkpoint holds it
    /// already, or when it lies on a fork that left the chain below the checkpoint).
    pub(crate) fn replay(&mut self, base: Option<u64>, lsn: u64, updates: &BlockUpdates) -> Result<bool, StorageError> {
        let logged_block = |source| StorageError::LoggedBlock { lsn, source };
        let header = &updates.header;
        self.log_blocks.push_back((header.number, lsn));
        if let Some(base) = base {
            if header.number <= base || !self.versions.by_hash.contains_key(&header.parent_hash) {
                return Ok(false);
            }
        }
        self.accept(updates).map_err(logged_block)?;
        Ok(true)
    }

    fn accept(&mut self, updates: &BlockUpdates) -> Result<Accepted, BlockRefusal> {
        let (accepted, collected) = self.versions.accept(&self.served, updates)?;
        self.stats.fork_versions_collected += collected;
        Ok(accepted)
    }

    /// Asks for a checkpoint now (none if the newest is of the same block); returns its block.
    pub fn checkpoint_now(&mut self, out: &mut Vec<Command<Rainblock, StorageIo>>) -> Result<u64, StorageError> {
        if !self.logged {
            return Err(StorageError::NoLog);
        }
        let (header, shards, contracts) = self.versions.ancestor(CHECKPOINT_LAG).ok_or(StorageError::HeadNotHeld)?;
        let number = header.number;
        if self.checkpoints.newest != Some(number) && self.checkpoints.writing != Some(number) {
            self.start_checkpoint(header, shards, contracts, out);
        }
        Ok(number)
    }

    fn start_checkpoint(
        &mut self,
        header: Header,
        shards: ShardedTrie,
        contracts: Contracts,
        out: &mut Vec<Command<Rainblock, StorageIo>>,
    ) {
        self.checkpoints.writing = Some(header.number);
        let served = self.served.shards.clone();
        let op = StorageIo::WriteCheckpoint { header: Box::new(header), shards, contracts, served };
        out.push(Command::Io { io: self.ids.io(), op });
    }

    /// Once the head is an interval past the newest checkpoint, asks for the next one.
    fn maybe_checkpoint(&mut self, out: &mut Vec<Command<Rainblock, StorageIo>>) {
        let interval = self.checkpoint_interval;
        if !self.logged || interval == 0 || self.checkpoints.writing.is_some() {
            return;
        }
        let due = self.checkpoints.newest.unwrap_or(0).saturating_add(interval).saturating_add(CHECKPOINT_LAG);
        if self.versions.head_number < due {
            return;
        }
        match self.versions.ancestor(CHECKPOINT_LAG) {
            Some((header, shards, contracts)) => self.start_checkpoint(header, shards, contracts, out),
            None => tracing::warn!(node = %self.id, "checkpoint skipped: the head version is not held"),
        }
    }

    /// A block from a peer; its refusal goes back to it as text.
    fn apply_block(
        &mut self,
        from: String,
        call: CallId,
        updates: Box<BlockUpdates>,
        out: &mut Vec<Command<Rainblock, StorageIo>>,
    ) {
        if let Err(refused) = self.admit_block(from.clone(), call, updates, out) {
            out.push(Command::Reply { to: from, call, response: refusal(refused.to_string()) });
        }
    }

    /// Checks and applies a block, then asks for it to be logged (the call `call` of `from`
    /// is acknowledged once it is); a block refused is not answered here.
    pub(crate) fn admit_block(
        &mut self,
        from: String,
        call: CallId,
        updates: Box<BlockUpdates>,
        out: &mut Vec<Command<Rainblock, StorageIo>>,
    ) -> Result<(), BlockRefusal> {
        let accepted = match self.accept(&updates) {
            Ok(accepted) => accepted,
            Err(reason) => {
                self.stats.blocks_rejected += 1;
                tracing::warn!(node = %self.id, peer = %from, %reason, "block refused");
                return Err(reason);
            }
        };
        let Accepted { number, hash, new } = accepted;
        if !new {
            // A duplicate of a block still being logged is acknowledged with it.
            match self.logging.values_mut().find(|logging| logging.hash == hash) {
                Some(logging) => logging.waiters.push((from, call)),
                None => out.push(Command::Reply { to: from, call, response: ack(number, hash) }),
            }
            return Ok(());
        }
        if !self.logged {
            self.stats.blocks_applied += 1;
            out.push(Command::Reply { to: from, call, response: ack(number, hash) });
            return Ok(());
        }
        let io = self.ids.io();
        out.push(Command::Io {
            io,
            op: StorageIo::Append { record: crate::codec::block_updates_to_wire(*updates).encode_to_vec() },
        });
        let waiters = vec![(from, call)];
        #[cfg(feature = "fault-injection")]
        let waiters = if self.fault == StorageFault::AckBeforeLog {
            for (to, call) in waiters {
                out.push(Command::Reply { to, call, response: ack(number, hash) });
            }
            Vec::new()
        } else {
            waiters
        };
        self.logging.insert(io, Logging { number, hash, waiters });
        Ok(())
    }

    fn logged_block(&mut self, io: IoId, result: Result<u64, LogError>, out: &mut Vec<Command<Rainblock, StorageIo>>) {
        let Some(Logging { number, hash, waiters }) = self.logging.remove(&io) else { return };
        match result {
            Ok(lsn) => {
                self.log_blocks.push_back((number, lsn));
                self.stats.blocks_applied += 1;
                for (to, call) in waiters {
                    out.push(Command::Reply { to, call, response: ack(number, hash) });
                }
                self.maybe_checkpoint(out);
            }
            Err(source) => {
                // Not durable, so not acknowledged: the version goes. The log refuses further
                // appends until the node restarts (which recovers it).
                self.versions.forget(&hash);
                let refused = BlockRefusal::LogFailed { number, source };
                tracing::error!(node = %self.id, %refused, "block not logged");
                for (to, call) in waiters {
                    out.push(Command::Reply { to, call, response: refusal(refused.to_string()) });
                }
            }
        }
    }

    /// Checkpoint `number` is the newest: the log is cut below the one before it, which
    /// stays as the fallback should the newest be found damaged.
    fn checkpoint_written(
        &mut self,
        result: Result<u64, CheckpointError>,
        out: &mut Vec<Command<Rainblock, StorageIo>>,
    ) {
        self.checkpoints.writing = None;
        let number = match result {
            Ok(number) => number,
            Err(reason) => return tracing::warn!(node = %self.id, %reason, "checkpoint failed"),
        };
        self.checkpoints.previous = self.checkpoints.newest.replace(number);
        self.stats.checkpoints_written += 1;
        let Some(previous) = self.checkpoints.previous else { return };
        // Every record before the first one above the previous checkpoint is covered by it
        // (or is of a fork that left the chain below it).
        if let Some(&(_, below)) = self.log_blocks.iter().find(|(block, _)| *block > previous) {
            out.push(Command::Io { io: self.ids.io(), op: StorageIo::CutLog { below } });
        }
    }

    fn log_cut(&mut self, result: Result<(usize, u64), LogError>) {
        match result {
            Ok((removed, first)) => {
                while self.log_blocks.front().is_some_and(|&(_, lsn)| lsn < first) {
                    self.log_blocks.pop_front();
                }
                self.stats.log_segments_removed += removed as u64;
            }
            Err(reason) => tracing::warn!(node = %self.id, %reason, "cutting the log below a checkpoint failed"),
        }
    }

    /// Answers a read request (witness, top, head) from the versions.
    pub fn serve(&mut self, request: Request) -> Response {
        let reply = match request {
            Request::Witness(request) => self.witness(&request).map(Response::Witness),
            Request::Top(request) => self.versions.top(&request).map(Response::Top),
            Request::Head => {
                let (number, hash, state_root) = self.head();
                Ok(Response::Head(HeadReply { head: BlockId::new(number, hash), state_root }))
            }
            Request::ApplyBlock(_) | Request::Submit(_) | Request::Announce(_) => Err(ReadRefusal::Unsupported),
        };
        match reply {
            Ok(response) => response,
            Err(reason) => {
                tracing::warn!(node = %self.id, %reason, "refused");
                refusal(reason.to_string())
            }
        }
    }

    /// A node bag for the request's keys at its block (default: head).
    pub fn witness(&mut self, request: &WitnessRequest) -> Result<WitnessReply, ReadRefusal> {
        #[cfg(feature = "fault-injection")]
        let fault = self.fault;
        let reply = self.versions.witness(request, &self.served.shards, |versions, version| {
            #[cfg(feature = "fault-injection")]
            if fault == StorageFault::StaleWitness && version.header.number > 0 {
                if let Some(parent) = versions.by_hash.get(&version.header.parent_hash) {
                    return parent.shards.clone();
                }
            }
            let _ = versions;
            version.shards.clone()
        })?;
        #[cfg(feature = "fault-injection")]
        let reply = {
            let mut reply = reply;
            if self.fault == StorageFault::CorruptWitness {
                if let Some(byte) = reply.bag.nodes.last_mut().and_then(|node| node.last_mut()) {
                    *byte ^= 0x01;
                }
                // Slot witnesses lie too.
                let slot_nodes = reply.storage.iter_mut().map(|storage| &mut storage.bag);
                if let Some(byte) =
                    slot_nodes.flat_map(|bag| bag.nodes.last_mut()).next().and_then(|node| node.last_mut())
                {
                    *byte ^= 0x01;
                }
            }
            reply
        };
        self.stats.witnesses_served += 1;
        Ok(reply)
    }
}

fn ack(number: u64, hash: B256) -> Response {
    Response::BlockAck(BlockId::new(number, hash))
}

impl Role for StorageCore {
    type Protocol = Rainblock;
    type Io = StorageIo;
    type IoDone = StorageIoDone;
    type Input = std::convert::Infallible;

    fn step(
        &mut self,
        _now: Nanos,
        event: Event<Rainblock, StorageIoDone, std::convert::Infallible>,
        out: &mut Vec<Command<Rainblock, StorageIo>>,
    ) {
        match event {
            Event::Request { from, call, request } => match request {
                Request::ApplyBlock(updates) => self.apply_block(from, call, updates, out),
                request => {
                    let response = self.serve(request);
                    out.push(Command::Reply { to: from, call, response });
                }
            },
            Event::IoDone { io, result } => match result {
                StorageIoDone::Appended(result) => self.logged_block(io, result, out),
                StorageIoDone::CheckpointWritten(result) => self.checkpoint_written(result, out),
                StorageIoDone::LogCut(result) => self.log_cut(result),
            },
            Event::Start | Event::Response { .. } | Event::Timer(_) => {}
            Event::Input(never) => match never {},
        }
    }
}
