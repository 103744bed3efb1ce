//! The ordering service: checks each chained batch's agreements, cuts blocks by size or
//! time, logs every block on its device before anyone hears of it (a crash loses no block
//! it acknowledged), signs it, and hands blocks to the execution servers that ask.
//!
//! One orderer with a durable log: a crash stops ordering until it restarts, and a lost
//! device would lose the chain. The seed's orderer is a single untrusted node too; a Raft
//! group of orderers is the step after this one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{ChainedTx, Hash, OrderedBlock};
use virga_net::role::{CallId, Command, Event, Ids, IoId, Nanos, TimerId};

use super::{
    node_name, organization_of, PipelineCommand, PipelineConfig, PipelineEvent, PipelineIo, PipelineIoDone, Request,
    Response,
};

/// The most blocks one fetch returns.
const FETCH_BLOCKS: usize = 8;

#[derive(Debug, Clone, Default)]
pub struct OrdererStats {
    pub blocks: u64,
    pub batches: u64,
    pub refused: Vec<String>,
    /// Batches sent again after their acknowledgement was lost, answered from the log.
    pub duplicates: u64,
}

/// A block being logged: its device operation, and the calls to acknowledge once it is.
type Persisting = (IoId, OrderedBlock, Vec<(String, CallId)>);

pub struct OrderingServer {
    key: SigningKey,
    config: Arc<PipelineConfig>,
    ids: Ids,
    loaded: bool,
    blocks: Vec<OrderedBlock>,
    /// Every batch in a block.
    ordered: BTreeSet<Hash>,
    /// Batches waiting for a block, with the calls to acknowledge once it is logged.
    pending: Vec<(ChainedTx, Vec<(String, CallId)>)>,
    /// The block being logged, and the calls waiting for it.
    persisting: Option<Persisting>,
    cut_timer: Option<TimerId>,
    /// Each execution server's waiting fetch.
    fetchers: BTreeMap<String, (CallId, u64)>,
    stats: OrdererStats,
}

impl OrderingServer {
    pub fn new(key: SigningKey, config: Arc<PipelineConfig>) -> OrderingServer {
        OrderingServer {
            key,
            config,
            ids: Ids::default(),
            loaded: false,
            blocks: Vec::new(),
            ordered: BTreeSet::new(),
            pending: Vec::new(),
            persisting: None,
            cut_timer: None,
            fetchers: BTreeMap::new(),
            stats: OrdererStats::default(),
        }
    }

    pub fn stats(&self) -> &OrdererStats {
        &self.stats
    }

    pub fn blocks(&self) -> &[OrderedBlock] {
        &self.blocks
    }

    pub fn step(&mut self, _now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        match event {
            Event::Start => out.push(Command::Io { io: self.ids.io(), op: PipelineIo::LoadBlocks }),
            Event::IoDone { result: PipelineIoDone::LoadedBlocks(blocks), .. } => {
                self.ordered =
                    blocks.iter().flat_map(|block| &block.batches).map(|chained| chained.batch.hash()).collect();
                self.blocks = blocks;
                self.loaded = true;
            }
            Event::IoDone { io, result: PipelineIoDone::Persisted } => self.persisted(io, out),
            Event::IoDone { .. } | Event::Input(()) | Event::Response { .. } => {}
            Event::Timer(timer) => {
                if self.cut_timer == Some(timer) {
                    self.cut_timer = None;
                    self.cut(out);
                }
            }
            Event::Request { from, call, request } => {
                if let Err(reason) = self.request(&from, call, request, out) {
                    self.stats.refused.push(reason.clone());
                    out.push(Command::Reply { to: from, call, response: Response::Refused(reason) });
                }
            }
        }
    }

    fn request(
        &mut self,
        from: &str,
        call: CallId,
        request: Request,
        out: &mut Vec<PipelineCommand>,
    ) -> Result<(), String> {
        if !self.loaded {
            return Err("the orderer is still reading its log".to_string());
        }
        let org = organization_of(from).unwrap_or_default();
        match request {
            Request::Order(chained) if from == node_name(org, "chainify") && chained.batch.origin == org => {
                chained.check(&self.config.organizations, self.config.agreements).map_err(|error| error.to_string())?;
                self.order(from, call, chained, out);
                Ok(())
            }
            Request::Fetch { from: first } if from == node_name(org, "exec") => {
                self.fetchers.insert(from.to_string(), (call, first));
                self.answer_fetchers(out);
                Ok(())
            }
            other => Err(format!(
                "the orderer does not serve {} from {from}",
                <super::ChainifyProtocol as virga_net::role::Protocol>::request_kind(&other)
            )),
        }
    }

    fn order(&mut self, from: &str, call: CallId, chained: ChainedTx, out: &mut Vec<PipelineCommand>) {
        let hash = chained.batch.hash();
        let caller = (from.to_string(), call);
        if self.ordered.contains(&hash) {
            self.stats.duplicates += 1;
            match &mut self.persisting {
                Some((_, block, calls)) if block.batches.iter().any(|held| held.batch.hash() == hash) => {
                    calls.push(caller)
                }
                _ => out.push(Command::Reply { to: caller.0, call, response: Response::Ordered }),
            }
            return;
        }
        if let Some((_, calls)) = self.pending.iter_mut().find(|(held, _)| held.batch.hash() == hash) {
            calls.push(caller);
            return;
        }
        self.pending.push((chained, vec![caller]));
        let waiting: usize = self.pending.iter().map(|(held, _)| held.batch.proposals.len()).sum();
        if waiting >= self.config.block_size {
            self.cut(out);
        } else if self.cut_timer.is_none() {
            let timer = self.ids.timer();
            self.cut_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.block_wait });
        }
    }

    /// Cuts the next block from the waiting batches (up to the block size, at least one
    /// batch) and logs it; one block is logged at a time.
    fn cut(&mut self, out: &mut Vec<PipelineCommand>) {
        if self.persisting.is_some() || self.pending.is_empty() {
            return;
        }
        let mut batches = Vec::new();
        let mut calls = Vec::new();
        let mut size = 0;
        while let Some((chained, _)) = self.pending.first() {
            let len = chained.batch.proposals.len();
            if !batches.is_empty() && size + len > self.config.block_size {
                break;
            }
            size += len;
            let (chained, waiting) = self.pending.remove(0);
            self.ordered.insert(chained.batch.hash());
            batches.push(chained);
            calls.extend(waiting);
        }
        let previous = self.blocks.last().map_or([0; 32], OrderedBlock::hash);
        let block = OrderedBlock::sign(&self.key, self.blocks.len() as u64, previous, batches);
        let io = self.ids.io();
        out.push(Command::Io { io, op: PipelineIo::Persist(block.clone()) });
        self.persisting = Some((io, block, calls));
    }

    fn persisted(&mut self, io: IoId, out: &mut Vec<PipelineCommand>) {
        let Some((_, block, calls)) = self.persisting.take_if(|(logging, ..)| *logging == io) else {
            return;
        };
        self.stats.blocks += 1;
        self.stats.batches += block.batches.len() as u64;
        self.blocks.push(block);
        for (to, call) in calls {
            out.push(Command::Reply { to, call, response: Response::Ordered });
        }
        self.answer_fetchers(out);
        let waiting: usize = self.pending.iter().map(|(held, _)| held.batch.proposals.len()).sum();
        if waiting >= self.config.block_size {
            self.cut(out);
        } else if !self.pending.is_empty() && self.cut_timer.is_none() {
            let timer = self.ids.timer();
            self.cut_timer = Some(timer);
            out.push(Command::SetTimer { timer, after: self.config.block_wait });
        }
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
