//! RainBlock's miner: executes against its private top layer with no state I/O.
//!
//! The miner is a core ([`MinerCore`]: events in, commands out) split along its concerns:
//! [`warm_up`] fills the top layer, [`batching`] hands out the next block to build,
//! [`commit`] sends blocks to the storage nodes and commits them in order, [`follower`]
//! hands out blocks other miners announce to be verified and adopts them, and [`top_layer`]
//! keeps the tip, the committed head and pruning. Building and verifying are jobs the core
//! hands to its device ([`build_job`], [`verify_job`]), which runs them on the execution
//! pool it owns ([`device`]); [`driver::Miner`] runs the core in this process. The top layer
//! is pruned to retention level r whenever it outgrows its memory budget.

mod batching;
mod build_job;
mod commit;
mod contract_bags;
pub mod device;
pub mod driver;
mod errors;
mod follower;
mod top_layer;
mod verify_job;
pub mod warm_up;

pub use build_job::{BuildJob, BuildOutcome, NONCE_USED};
pub use device::{execution_pool, open_store, open_store_on, ChainDisk, PoolError};
pub use driver::Miner;
pub use errors::{AckError, AnnouncementRefusal, ChainDiskError, LeftOut, UpdatesError, WarmUpFailure};
pub use verify_job::{VerifyJob, VerifyOutcome};

use crate::messages::{BlockId, BlockUpdates, HeadReply, Request, Submission, SubmissionReply, TxOutcome};
use crate::protocol::{refusal, Rainblock, Response};
use alloy_consensus::Header;
use alloy_primitives::{Address, B256};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use virga_ledger::block::Block;
use virga_ledger::verify::ChainConfig;
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, Role, TimerId};
use virga_trie::proof::NodeBag;

use crate::storage::prefix_nibbles;
use commit::Committing;
use top_layer::{Layer, TopLayer};
use warm_up::WarmUp;

#[derive(Clone, Debug)]
pub struct MinerConfig {
    pub id: String,
    pub chain: ChainConfig,
    pub shard_count: usize,
    /// Storage nodes by peer id, with the shards each serves.
    pub storage_nodes: Vec<(String, Vec<usize>)>,
    /// Other miners that verify this miner's blocks.
    pub peers: Vec<String>,
    /// Retention level r: the top layer keeps trie levels 0..=r when pruned.
    pub retention: usize,
    /// The top layer is pruned once its estimated memory exceeds this.
    pub top_budget_bytes: usize,
    /// Transfers per block at most (also bounded by the gas limit).
    pub max_block_transfers: usize,
    pub beneficiary: Address,
}

/// Why transfers did not make it into a block, and other counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MinerStats {
    pub blocks: u64,
    pub included: u64,
    pub succeeded: u64,
    /// Transfers left out, by reason (`stale_witness`, `bad_signature`, …).
    pub aborted: HashMap<String, u64>,
    /// Receipts of failed transfers, by reason.
    pub failed: HashMap<String, u64>,
    /// Submissions whose witness was taken at an older root than the miner's.
    pub revised_submissions: u64,
    pub rejected_submissions: u64,
    pub prunes: u64,
    /// Nodes of the top layer (hash nodes included) when the stats were read.
    pub top_nodes: usize,
    /// The top layer's memory: its bound after the last prune, measured when the stats are read.
    pub top_bytes: usize,
    /// The largest measured (at whole prunes and when the stats were read).
    pub peak_top_bytes: usize,
    /// Blocks from other miners verified (follower) and refused.
    pub verified_blocks: u64,
    pub refused_blocks: u64,
    /// This miner's blocks dropped uncommitted: refused by a storage node, or built on one
    /// that was. Their transfers count in `aborted` as `block_refused`.
    pub abandoned_blocks: u64,
    /// Refusals of this miner's blocks: the storage node or follower miner, and its reason.
    pub block_refusals: Vec<(String, String)>,
    /// Witnesses from storage nodes refused while warming up: the node, and why.
    pub bad_witnesses: Vec<(String, crate::client::WitnessError)>,
}

impl MinerStats {
    /// Adds the counters a block's build gathered off the core.
    fn absorb(&mut self, build: MinerStats) {
        for (reason, count) in build.aborted {
            *self.aborted.entry(reason).or_default() += count;
        }
        self.revised_submissions += build.revised_submissions;
        self.rejected_submissions += build.rejected_submissions;
        self.prunes += build.prunes;
        if build.top_bytes > 0 {
            self.top_bytes = build.top_bytes;
        }
        self.peak_top_bytes = self.peak_top_bytes.max(build.peak_top_bytes);
    }
}

/// A miner's deliberate misbehaviour, for the trust tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinerFault {
    /// Honest.
    #[default]
    None,
    /// Every block built announces a state root with one byte flipped; its work is then
    /// done again, so the header is otherwise valid.
    WrongRoot,
    /// A broken follower: announced blocks are adopted without being re-executed (the
    /// simulator's checks must catch it once a lying miner announces a wrong root).
    SkipBlockCheck,
}

/// Why a transfer of a dropped block was not included: its client submits it again.
pub const BLOCK_REFUSED: &str = "block_refused";

/// Built blocks waiting for the block before them to commit.
const COMMIT_QUEUE: usize = 1;

/// The longest the miner waits for a peer's answer; an unreachable storage node is then
/// asked again.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(crate) struct Pending {
    from: String,
    call: CallId,
    submission: Submission,
}

/// Each submission's caller and call, with the outcomes of its transfers.
pub(crate) type Replies = Vec<(String, CallId, Vec<TxOutcome>)>;

/// A built block ready to commit.
pub(crate) struct Built {
    block: Block,
    hash: B256,
    updates: Vec<(String, BlockUpdates)>,
    bag: NodeBag,
    /// The slot witnesses and code the block's transactions came with.
    contracts: contract_bags::ContractBags,
    replies: Replies,
    /// The top layer after the block.
    layer: Layer,
    /// The tip's epoch the block was built in.
    epoch: u64,
}

/// What each call of the miner is for.
enum Outstanding {
    Top {
        round: u64,
    },
    BeneficiaryWitness {
        round: u64,
        peer: String,
    },
    ApplyBlock {
        peer: String,
        number: u64,
        next_delay: Duration,
    },
    /// An announcement of block `number`; `awaited` if the commit waits for its verdict.
    Gossip {
        peer: String,
        number: u64,
        awaited: bool,
    },
}

enum TimerPurpose {
    RetryBlock { peer: String, number: u64, delay: Duration },
    RetryWarmUp,
}

/// What a block being stored is for.
enum StoreFor {
    Committed,
    Followed { from: String, call: CallId },
}

/// The miner's device operations: storing a committed block in its chain store, and
/// building a block (a computation handed out, so that the core is free meanwhile).
#[derive(Debug)]
pub enum MinerIo {
    Store {
        number: u64,
        hash: B256,
        block: Vec<u8>,
    },
    Build(Box<BuildJob>),
    /// Verifying a block another miner announced (re-executing it on the tip).
    Verify(Box<VerifyJob>),
}

/// How a [`MinerIo`] ended.
#[derive(Debug)]
pub enum MinerIoDone {
    Stored(Result<(), ChainDiskError>),
    Built(Box<BuildOutcome>),
    Verified(Box<VerifyOutcome>),
}

pub struct MinerCore {
    config: Arc<MinerConfig>,
    deadline: Duration,
    ids: Ids,
    layer: TopLayer,
    warm: WarmUp,
    inbox: VecDeque<Pending>,
    /// The block being built off the core, if one is.
    building: Option<IoId>,
    /// Built blocks waiting for the committing one.
    queued: VecDeque<Built>,
    committing: Option<Committing>,
    calls: HashMap<CallId, Outstanding>,
    timers: HashMap<TimerId, TimerPurpose>,
    stores: HashMap<IoId, StoreFor>,
    /// Peer miners that did not answer their last announcement: they are sent the next ones
    /// without the commit waiting for them, until one answers again.
    silent_peers: BTreeSet<String>,
    following: follower::Following,
    stats: MinerStats,
    /// The clock reading of the latest event: the timestamp of a block built on a completion.
    last_now: Nanos,
    #[cfg(feature = "fault-injection")]
    fault: MinerFault,
}

/// Why a miner cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MinerError {
    #[error("shard count {0} is not 1, 16 or 256")]
    ShardCount(usize),
    #[error("the execution thread pool: {0}")]
    Pool(#[source] device::PoolError),
    #[error("the block store {}: {source}", .path.display())]
    StoreDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the block store: {0}")]
    Store(#[from] virga_ledger::store::StoreError),
    #[error("the block store: block {number}: {source}")]
    StoredBlock {
        number: u64,
        #[source]
        source: crate::codec::WireError,
    },
    #[error("warming up: {0}")]
    WarmUp(#[source] WarmUpFailure),
    #[error("the stored genesis {stored} is not this genesis {genesis}")]
    OtherGenesis { stored: B256, genesis: B256 },
    #[error("block {0} is indexed in the chain store but not readable")]
    Unreadable(u64),
}

impl MinerCore {
    /// A miner whose committed head is `header`, with an empty top layer; it warms up when
    /// it starts.
    pub fn new(config: MinerConfig, header: Header) -> Result<MinerCore, MinerError> {
        prefix_nibbles(config.shard_count).ok_or(MinerError::ShardCount(config.shard_count))?;
        Ok(MinerCore {
            config: Arc::new(config),
            deadline: CALL_DEADLINE,
            ids: Ids::default(),
            layer: TopLayer::new(header),
            warm: WarmUp::default(),
            inbox: VecDeque::new(),
            building: None,
            queued: VecDeque::new(),
            committing: None,
            calls: HashMap::new(),
            timers: HashMap::new(),
            stores: HashMap::new(),
            silent_peers: BTreeSet::new(),
            following: follower::Following::default(),
            stats: MinerStats::default(),
            last_now: 0,
            #[cfg(feature = "fault-injection")]
            fault: MinerFault::None,
        })
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// The deadline of every call the miner makes.
    pub fn set_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    /// Makes this miner misbehave (or behave again) from the next block it builds on.
    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&mut self, fault: MinerFault) {
        tracing::info!(miner = %self.config.id, ?fault, "fault injected");
        self.fault = fault;
    }

    /// Counters, with the top layer's size measured now.
    pub fn stats(&self) -> MinerStats {
        let top = &self.layer.tip.top;
        let (top_nodes, top_bytes) = (top.node_count(), top.memory_bytes());
        MinerStats {
            top_nodes,
            top_bytes,
            peak_top_bytes: self.stats.peak_top_bytes.max(top_bytes),
            ..self.stats.clone()
        }
    }

    /// The committed head: number, hash and state root.
    pub fn head(&self) -> (u64, B256, B256) {
        self.layer.head()
    }

    /// The tip's header and top layer: what the next block builds on (the cost calibration
    /// times admission and building on a copy of it).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn tip(&self) -> (&Header, &virga_evm::PartialState) {
        (&self.layer.tip.header, &self.layer.tip.top)
    }

    /// Whether the top layer is warm (the miner builds blocks only then), and why the last
    /// warm-up round failed, if it did.
    pub fn warm_up_state(&self) -> (bool, Option<(u64, &WarmUpFailure)>) {
        (self.warm.done, self.warm.last_failure.as_ref().map(|(round, reason)| (*round, reason)))
    }

    /// Nothing queued, being built or committed.
    pub fn is_idle(&self) -> bool {
        self.inbox.is_empty()
            && self.building.is_none()
            && self.queued.is_empty()
            && self.committing.is_none()
            && self.following.is_idle()
    }

    /// Starts the next commit, then hands out the next block to build if the commit queue
    /// has room (one build at a time: it builds on the block before it).
    fn pump_at(&mut self, now: Nanos, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if !self.warm.done {
            return;
        }
        self.start_next_commit(out);
        if self.building.is_none() && !self.inbox.is_empty() && self.queued.len() < COMMIT_QUEUE {
            let batch = self.take_batch();
            let job = self.build_job(now, batch);
            let io = self.ids.io();
            self.building = Some(io);
            out.push(Command::Io { io, op: MinerIo::Build(Box::new(job)) });
        }
    }

    /// A block is built: it waits for its commit, unless the tip fell back meanwhile (a
    /// block it builds on was refused), in which case it is abandoned at once.
    fn built(&mut self, io: IoId, outcome: BuildOutcome, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        if self.building != Some(io) {
            return;
        }
        self.building = None;
        let BuildOutcome { built, answers, stats, pruning } = outcome;
        self.stats.absorb(stats);
        self.layer.pruning = pruning;
        out.extend(answers);
        if let Some(built) = built {
            if built.epoch == self.layer.epoch {
                self.layer.tip = built.layer.clone();
                self.queued.push_back(built);
            } else {
                let number = built.block.header.number;
                self.abandon(number, built.epoch, built.replies, Vec::new(), out);
            }
        }
        self.pump(out);
    }

    /// [`Self::pump_at`] from a completion, where no clock reading is at hand: the next
    /// block's timestamp comes from the previous step's reading.
    fn pump(&mut self, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        self.pump_at(self.last_now, out);
    }

    /// Under [`MinerFault::WrongRoot`] blocks announce a wrong state root, and are gossiped
    /// before the storage nodes answer.
    fn builds_wrong_roots(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.fault == MinerFault::WrongRoot {
            return true;
        }
        false
    }

    fn announces_before_commit(&self) -> bool {
        self.builds_wrong_roots()
    }

    fn skips_block_check(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.fault == MinerFault::SkipBlockCheck {
            return true;
        }
        false
    }

    /// The job that builds a block from the queued submissions, whatever the miner's state:
    /// with [`Self::drop_built`], the fuzz target's way through submission decoding and
    /// verification with no transport.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn queued_job(&mut self) -> Option<BuildJob> {
        let batch = self.take_batch();
        (!batch.is_empty()).then(|| self.build_job(self.last_now, batch))
    }

    /// Drops a block [`Self::queued_job`] built, answering its submissions as for a refused
    /// block. The tip stays where it was.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn drop_built(&mut self, outcome: BuildOutcome, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        let BuildOutcome { built, answers, stats, .. } = outcome;
        self.stats.absorb(stats);
        out.extend(answers);
        if let Some(built) = built {
            self.abandon(built.block.header.number, built.epoch, built.replies, Vec::new(), out);
        }
    }

    fn request(&mut self, from: String, call: CallId, request: Request, out: &mut Vec<Command<Rainblock, MinerIo>>) {
        match request {
            Request::Submit(submission) => {
                self.inbox.push_back(Pending { from, call, submission });
                self.pump(out);
            }
            Request::Head => {
                let (number, hash, state_root) = self.head();
                let head = HeadReply { head: BlockId::new(number, hash), state_root };
                out.push(Command::Reply { to: from, call, response: Response::Head(head) });
            }
            Request::Announce(announcement) => self.announced(from, call, *announcement, out),
            Request::Witness(_) | Request::Top(_) | Request::ApplyBlock(_) => out.push(Command::Reply {
                to: from,
                call,
                response: refusal("miners serve submit, head and announce requests"),
            }),
        }
    }

    fn response(
        &mut self,
        call: CallId,
        result: Result<Response, virga_net::NetError>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        match self.calls.remove(&call) {
            Some(Outstanding::Top { round }) => self.top_answered(round, result, out),
            Some(Outstanding::BeneficiaryWitness { round, peer }) => self.witness_answered(round, peer, result, out),
            Some(Outstanding::ApplyBlock { peer, number, next_delay }) => {
                self.block_answered(peer, number, next_delay, result, out)
            }
            Some(Outstanding::Gossip { peer, number, awaited }) => {
                self.gossip_answered(peer, number, awaited, result, out)
            }
            None => {}
        }
    }
}

impl Role for MinerCore {
    type Protocol = Rainblock;
    type Io = MinerIo;
    type IoDone = MinerIoDone;
    type Input = std::convert::Infallible;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Rainblock, MinerIoDone, std::convert::Infallible>,
        out: &mut Vec<Command<Rainblock, MinerIo>>,
    ) {
        self.last_now = now;
        match event {
            Event::Start => self.start_warm_up(out),
            Event::Request { from, call, request } => self.request(from, call, request, out),
            Event::Response { call, result } => self.response(call, result, out),
            Event::Timer(timer) => match self.timers.remove(&timer) {
                Some(TimerPurpose::RetryBlock { peer, number, delay }) => self.retry_block(peer, number, delay, out),
                Some(TimerPurpose::RetryWarmUp) => self.start_warm_up(out),
                None => {}
            },
            Event::IoDone { io, result: MinerIoDone::Built(outcome) } => self.built(io, *outcome, out),
            Event::IoDone { io, result: MinerIoDone::Verified(outcome) } => self.verified(io, *outcome, out),
            Event::IoDone { io, result: MinerIoDone::Stored(result) } => match self.stores.remove(&io) {
                Some(StoreFor::Committed) => self.stored(result, out),
                Some(StoreFor::Followed { from, call }) => self.followed_stored(from, call, result, out),
                None => {}
            },
            Event::Input(never) => match never {},
        }
    }
}

/// A submission refused whole (a malformed bag or root): its caller hears why.
pub(crate) fn refuse_submission(
    miner: &str,
    stats: &mut MinerStats,
    from: String,
    call: CallId,
    reason: &str,
    out: &mut Vec<Command<Rainblock, MinerIo>>,
) {
    tracing::warn!(%miner, peer = %from, %reason, "submission refused");
    stats.rejected_submissions += 1;
    out.push(Command::Reply { to: from, call, response: refusal(reason.to_string()) });
}

pub(crate) fn outcomes_reply(block: Option<(u64, B256)>, outcomes: Vec<TxOutcome>) -> Response {
    Response::Submitted(SubmissionReply { block: block.map(|(number, hash)| BlockId::new(number, hash)), outcomes })
}
