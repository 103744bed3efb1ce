//! The ordering service: a Raft group of orderer replicas (raft-rs through `virga-raft`),
//! so that an orderer crash loses no block and stops ordering only while a majority is down.
//!
//! The leader checks each chained batch's agreements and cuts blocks by size or time; a cut
//! is a Raft entry holding the block's batches ([`BlockCut`]). Every replica applies the
//! committed entries in log order and derives the same block from each: its number and
//! previous hash from the blocks before it, batches already ordered dropped (a batch retried
//! after a leader change may sit in two entries), and the ordering service's signature (one
//! key for the group, whose replicas fail by crashing, not by lying: Raft tolerates no more).
//! The leader acknowledges a batch once the block holding it is applied; any replica serves
//! the applied blocks to the execution servers that ask (a long poll), since a committed
//! block never changes. A replica that does not lead answers an order with the leader it
//! knows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Refusal;
use prost::Message as _;
use raft::eraftpb::{Entry, EntryType};
use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{BlockCut, ChainedTx, Hash, OrderedBlock};
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, TimerId};
use virga_raft::proto;
use virga_raft::{Output, RaftLog, Replica, ReplicaSettings};

use super::{
    node_name, organization_of, PipelineCommand, PipelineConfig, PipelineEvent, PipelineIo, PipelineIoDone, Request,
    Response,
};

/// The most blocks one fetch returns.
const FETCH_BLOCKS: usize = 8;
/// The most cuts a leader has proposed and not yet applied.
const MAX_IN_FLIGHT: usize = 4;

#[derive(Debug, Clone, Default)]
pub struct OrdererStats {
    pub blocks: u64,
    pub batches: u64,
    pub refused: Vec<String>,
    /// Batches sent again after their acknowledgement was lost, answered from the log.
    pub duplicates: u64,
    /// Batches dropped at apply because an earlier block already held them.
    pub reordered_batches: u64,
    /// Peer Raft messages refused by the wire checks.
    pub refused_messages: u64,
    /// Committed entries that were not cuts (a new leader's empty entry) or held only
    /// batches already ordered.
    pub empty_entries: u64,
}

/// A caller waiting for its batch to be in an applied block.
type Caller = (String, CallId);

pub struct OrderingServer {
    name: String,
    key: SigningKey,
    config: Arc<PipelineConfig>,
    seed: u64,
    ids: Ids,
    /// Raft, once the replica's log is read.
    replica: Option<Replica>,
    tick_timer: Option<TimerId>,
    /// The device append in flight for Raft.
    write: Option<IoId>,
    /// A device write failed: the replica stops (it must not promise what is not durable).
    failed: Option<String>,
    /// Raft batches in flight: to which Raft id.
    raft_calls: BTreeMap<CallId, u64>,
    blocks: Vec<OrderedBlock>,
    /// Every batch in an applied block.
    ordered: BTreeSet<Hash>,
    /// The leader's batches waiting for a cut, and the cuts proposed and not yet applied.
    pending: Vec<ChainedTx>,
    in_flight: Vec<Vec<Hash>>,
    /// The calls to acknowledge once a batch is in an applied block.
    waiters: BTreeMap<Hash, Vec<Caller>>,
    cut_timer: Option<TimerId>,
    /// Each execution server's waiting fetch.
    fetchers: BTreeMap<String, (CallId, u64)>,
    stats: OrdererStats,
}

impl OrderingServer {
    /// Replica `name` (one of `config.orderers`); `key` is the ordering service's.
    pub fn new(name: &str, key: SigningKey, config: Arc<PipelineConfig>, seed: u64) -> OrderingServer {
        OrderingServer {
            name: name.to_string(),
            key,
            config,
            seed,
            ids: Ids::default(),
            replica: None,
            tick_timer: None,
            write: None,
            failed: None,
            raft_calls: BTreeMap::new(),
            blocks: Vec::new(),
            ordered: BTreeSet::new(),
            pending: Vec::new(),
            in_flight: Vec::new(),
            waiters: BTreeMap::new(),
            cut_timer: None,
            fetchers: BTreeMap::new(),
            stats: OrdererStats::default(),
        }
    }

    pub fn stats(&self) -> &OrdererStats {
        &self.stats
    }

    /// The blocks this replica has applied (a prefix of every other replica's, or longer).
    pub fn blocks(&self) -> &[OrderedBlock] {
        &self.blocks
    }

    pub fn is_leader(&self) -> bool {
        self.replica.as_ref().is_some_and(Replica::is_leader)
    }

    /// The terms this replica led in since it last started.
    pub fn led_terms(&self) -> &[u64] {
        self.replica.as_ref().map_or(&[], Replica::led_terms)
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The Raft id of a replica name (its place in `config.orderers`, from 1).
    fn raft_id(&self, name: &str) -> Option<u64> {
        self.config.orderers.iter().position(|held| held == name).map(|at| at as u64 + 1)
    }

    fn replica_name(&self, id: u64) -> Option<&str> {
        let at = usize::try_from(id.checked_sub(1)?).ok()?;
        self.config.orderers.get(at).map(String::as_str)
    }

    fn leader_name(&self) -> String {
        let leader = self.replica.as_ref().map_or(0, Replica::leader);
        self.replica_name(leader).unwrap_or_default().to_string()
    }

    pub fn step(&mut self, _now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        if self.failed.is_some() {
            return;
        }
        let mut raft = Output::default();
        match event {
            Event::Start => out.push(Command::Io { io: self.ids.io(), op: PipelineIo::LoadRaft }),
            Event::IoDone { result: PipelineIoDone::LoadedRaft(records), .. } => self.open(records, out),
            Event::IoDone { io, result: PipelineIoDone::RaftAppended(result) } if self.write == Some(io) => {
                self.write = None;
                match (result, self.replica.as_mut()) {
                    (Ok(()), Some(replica)) => replica.written(&mut raft),
                    (Err(error), _) => {
                        tracing::error!(replica = %self.name, %error, "a Raft log append failed: the replica stops");
                        self.failed = Some(format!("a Raft log append failed: {error}"));
                        return;
                    }
                    (Ok(()), None) => {}
                }
            }
            Event::IoDone { .. } | Event::Input(()) => {}
            Event::Timer(timer) if self.tick_timer == Some(timer) => {
                if let Some(replica) = self.replica.as_mut() {
                    replica.tick();
                }
                self.arm_tick(out);
            }
            Event::Timer(timer) => {
                if self.cut_timer == Some(timer) {
                    self.cut_timer = None;
                    self.cut(out);
                }
            }
            Event::Response { call, result } => {
                if let (Some(to), Err(_)) = (self.raft_calls.remove(&call), &result) {
                    if let Some(replica) = self.replica.as_mut() {
                        replica.unreachable(to);
                    }
                }
            }
            Event::Request { from, call, request } => {
                if let Err(reason) = self.request(&from, call, request, out) {
                    let reason = reason.to_string();
                    self.stats.refused.push(reason.clone());
                    out.push(Command::Reply { to: from, call, response: Response::Refused(reason) });
                }
            }
        }
        self.drain(raft, out);
    }

    /// Builds Raft over the replica's records (founding the group when there are none).
    fn open(&mut self, mut records: Vec<Vec<u8>>, out: &mut Vec<PipelineCommand>) {
        if records.is_empty() {
            let voters: Vec<u64> = (1..=self.config.orderers.len() as u64).collect();
            let founding = RaftLog::bootstrap_record(&voters);
            // Founding is the same every time, so losing this write to a crash loses nothing.
            out.push(Command::Io { io: self.ids.io(), op: PipelineIo::AppendRaft(vec![founding.clone()]) });
            records.push(founding);
        }
        let log = RaftLog::replay(records.iter().enumerate().map(|(lsn, record)| (lsn as u64, record.as_slice())));
        let settings = ReplicaSettings::new(
            self.raft_id(&self.name).unwrap_or(0),
            self.config.raft.election_ticks,
            self.config.raft.heartbeat_ticks,
            self.seed,
        );
        match log.map_err(|error| error.to_string()).and_then(|log| {
            Replica::new(&settings, log).map_err(|error| format!("raft-rs refused the replica: {error}"))
        }) {
            Ok(replica) => {
                self.replica = Some(replica);
                self.arm_tick(out);
            }
            Err(error) => {
                tracing::error!(replica = %self.name, %error, "the orderer's Raft log does not open");
                self.failed = Some(error);
            }
        }
    }

    fn arm_tick(&mut self, out: &mut Vec<PipelineCommand>) {
        let timer = self.ids.timer();
        self.tick_timer = Some(timer);
        out.push(Command::SetTimer { timer, after: self.config.raft.tick });
    }

    fn request(
        &mut self,
        from: &str,
        call: CallId,
        request: Request,
        out: &mut Vec<PipelineCommand>,
    ) -> Result<(), Refusal> {
        if self.replica.is_none() {
            return Err(Refusal::Loading { server: "orderer", log: "log" });
        }
        let org = organization_of(from).unwrap_or_default();
        match request {
            Request::Raft(bytes) => {
                let sender = self.raft_id(from).ok_or_else(|| Refusal::NotAnOrderer { from: from.to_string() })?;
                let batch = proto::RaftBatch::decode(bytes.as_slice())?;
                let refused = match self.replica.as_mut() {
                    Some(replica) => replica.step_batch(sender, batch.messages, &check_cut),
                    None => Vec::new(),
                };
                if let Some(first) = refused.first() {
                    tracing::warn!(replica = %self.name, peer = from, error = %first, "refused Raft messages");
                    self.stats.refused_messages += refused.len() as u64;
                }
                out.push(Command::Reply { to: from.to_string(), call, response: Response::Ack });
                Ok(())
            }
            Request::Order(chained) if from == node_name(org, "chainify") && chained.batch.origin == org => {
                if !self.is_leader() {
                    let leader = self.leader_name();
                    out.push(Command::Reply { to: from.to_string(), call, response: Response::NotLeader(leader) });
                    return Ok(());
                }
                chained.check(&self.config.organizations, self.config.agreements)?;
                self.order(from, call, chained, out);
                Ok(())
            }
            Request::Fetch { from: first } if from == node_name(org, "exec") => {
                self.fetchers.insert(from.to_string(), (call, first));
                self.answer_fetchers(out);
                Ok(())
            }
            other => Err(Refusal::NotServed {
                server: "the orderer",
                kind: <super::ChainifyProtocol as virga_net::role::Protocol>::request_kind(&other),
                from: from.to_string(),
            }),
        }
    }

    fn order(&mut self, from: &str, call: CallId, chained: ChainedTx, out: &mut Vec<PipelineCommand>) {
        let hash = chained.batch.hash();
        let caller = (from.to_string(), call);
        if self.ordered.contains(&hash) {
            self.stats.duplicates += 1;
            out.push(Command::Reply { to: caller.0, call, response: Response::Ordered });
            return;
        }
        if let Some(callers) = self.waiters.get_mut(&hash) {
            callers.push(caller);
            return;
        }
        self.waiters.insert(hash, vec![caller]);
        self.pending.push(chained);
        if self.waiting_transactions() >= self.config.block_size {
            self.cut(out);
        } else {
            self.arm_cut(out);
        }
    }

    fn waiting_transactions(&self) -> usize {
        self.pending.iter().map(|held| held.batch.proposals.len()).sum()
    }

    fn arm_cut(&mut self, out: &mut Vec<PipelineCommand>) {
        if self.cut_timer.is_none() && !self.pending.is_empty() {
            let timer = self.ids.timer();
            self.cut_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.block_wait });
        }
    }

    /// Proposes the next cut (up to the block size, at least one batch) as a Raft entry.
    fn cut(&mut self, out: &mut Vec<PipelineCommand>) {
        if self.pending.is_empty() || self.in_flight.len() >= MAX_IN_FLIGHT || !self.is_leader() {
            return;
        }
        let mut size = 0;
        let mut take = 0;
        for chained in &self.pending {
            let len = chained.batch.proposals.len();
            if take > 0 && size + len > self.config.block_size {
                break;
            }
            size += len;
            take += 1;
        }
        let cut = BlockCut { batches: self.pending.drain(..take).collect() };
        let hashes: Vec<Hash> = cut.batches.iter().map(|chained| chained.batch.hash()).collect();
        let proposed = self.replica.as_mut().map(|replica| replica.propose(cut.encode()));
        match proposed {
            Some(Ok(())) => self.in_flight.push(hashes),
            _ => {
                // raft-rs dropped it (a leader transfer is under way): wait and try again.
                self.pending.splice(0..0, cut.batches);
                self.arm_cut(out);
            }
        }
    }

    /// Hands Raft's output to the world: batches to peers, committed entries applied, the
    /// device write started; then answers what a lost leadership leaves unanswered.
    fn drain(&mut self, mut raft: Output, out: &mut Vec<PipelineCommand>) {
        let Some(replica) = self.replica.as_mut() else { return };
        replica.drain(&mut raft);
        for (to, messages) in std::mem::take(&mut raft.messages) {
            let Some(name) = self.replica_name(to).map(str::to_string) else { continue };
            let call = self.ids.call();
            self.raft_calls.insert(call, to);
            let bytes = proto::RaftBatch { messages }.encode_to_vec();
            out.push(Command::Call {
                to: name,
                call,
                request: Request::Raft(bytes),
                deadline: self.config.call_deadline,
            });
        }
        if let Some(records) = raft.write.take() {
            let io = self.ids.io();
            self.write = Some(io);
            out.push(Command::Io { io, op: PipelineIo::AppendRaft(records) });
        }
        let applied_any = !raft.committed.is_empty();
        for entry in raft.committed {
            self.apply(entry, out);
        }
        if applied_any {
            self.answer_fetchers(out);
        }
        if self.is_leader() {
            if self.waiting_transactions() >= self.config.block_size {
                self.cut(out);
            } else {
                self.arm_cut(out);
            }
        } else {
            self.step_down(out);
        }
    }

    /// Applies one committed entry: the next block, from the cut's batches not yet ordered.
    fn apply(&mut self, entry: Entry, out: &mut Vec<PipelineCommand>) {
        if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
            self.stats.empty_entries += 1;
            return;
        }
        let Ok(cut) = BlockCut::decode(&entry.data) else {
            // The wire checks refuse such entries from peers; a leader never proposes one.
            self.stats.empty_entries += 1;
            return;
        };
        let mut batches = Vec::new();
        let mut fresh = BTreeSet::new();
        for chained in cut.batches {
            let hash = chained.batch.hash();
            if self.ordered.contains(&hash) || !fresh.insert(hash) {
                self.stats.reordered_batches += 1;
            } else {
                batches.push(chained);
            }
        }
        if batches.is_empty() {
            self.stats.empty_entries += 1;
            return;
        }
        let previous = self.blocks.last().map_or([0; 32], OrderedBlock::hash);
        let block = OrderedBlock::sign(&self.key, self.blocks.len() as u64, previous, batches);
        self.stats.blocks += 1;
        self.stats.batches += block.batches.len() as u64;
        self.ordered.extend(fresh.iter().copied());
        for hash in &fresh {
            for (to, call) in self.waiters.remove(hash).unwrap_or_default() {
                out.push(Command::Reply { to, call, response: Response::Ordered });
            }
        }
        let ordered = &self.ordered;
        self.in_flight.retain(|hashes| !hashes.iter().all(|hash| ordered.contains(hash)));
        self.blocks.push(block);
    }

    /// This replica no longer leads: whoever waits on it is sent to the leader it knows,
    /// and retries there (a batch it proposed may still be ordered; the retry then finds it).
    fn step_down(&mut self, out: &mut Vec<PipelineCommand>) {
        if self.waiters.is_empty() && self.pending.is_empty() && self.in_flight.is_empty() {
            return;
        }
        let leader = self.leader_name();
        for (to, call) in std::mem::take(&mut self.waiters).into_values().flatten() {
            out.push(Command::Reply { to, call, response: Response::NotLeader(leader.clone()) });
        }
        self.pending.clear();
        self.in_flight.clear();
    }

    fn answer_fetchers(&mut self, out: &mut Vec<PipelineCommand>) {
        let ready: Vec<String> = self
            .fetchers
            .iter()
            .filter(|(_, (_, first))| (*first as usize) < self.blocks.len())
            .map(|(name, _)| name.clone())
            .collect();
        for name in ready {
            if let Some((call, first)) = self.fetchers.remove(&name) {
                let first = first as usize;
                let blocks = self.blocks[first..(first + FETCH_BLOCKS).min(self.blocks.len())].to_vec();
                out.push(Command::Reply { to: name, call, response: Response::Blocks(blocks) });
            }
        }
    }
}

/// What an orderer's Raft entry must hold: a block cut.
fn check_cut(data: &[u8]) -> Result<(), virga_raft::EntryRefusal> {
    BlockCut::decode(data).map(drop).map_err(|error| virga_raft::EntryRefusal::new("a block cut", error))
}

/// The records that found an ordering group whose log starts with `genesis` (each a cut,
/// committed at once), for every replica's device.
pub fn founding_records(replicas: usize, genesis: &[BlockCut]) -> Vec<Vec<u8>> {
    let voters: Vec<u64> = (1..=replicas as u64).collect();
    let entries: Vec<Vec<u8>> = genesis.iter().map(BlockCut::encode).collect();
    vec![RaftLog::bootstrap_record_with(&voters, &entries)]
}
