//! An organization's ExecutionServer: fetches ordered blocks, checks them (the orderer's
//! signature and chaining, each batch's agreements), has its database execute each one (a
//! device operation: the Whatever phase), asks its commit server to decide on the
//! resulting LedgerBlock, and then appends it or recovers towards the agreed hash. Blocks
//! are executed one at a time, in order.

use std::collections::VecDeque;
use std::sync::Arc;

use virga_ledger::wlc::{Hash, LedgerBlock, OrderedBlock};
use virga_net::role::{CallId, Command, Event, Ids, Nanos, TimerId};

use super::{
    node_name, Decision, Outcome, PipelineCommand, PipelineConfig, PipelineEvent, PipelineIo, PipelineIoDone, Request,
    Response,
};
use crate::organization::Transaction;

/// How many fetched blocks wait for execution at most.
const QUEUE: usize = 8;

/// An execution server's deliberate fault: it reports a wrong LedgerBlock hash for every
/// block (an organization that lies about its effects). Its variants exist only in test
/// builds and under the `sim` feature; elsewhere it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionWeakness {
    #[cfg(any(test, feature = "sim"))]
    LieAboutEffects,
}

#[derive(Debug, Clone, Default)]
pub struct ExecutionStats {
    pub executed: u64,
    pub committed: u64,
    pub recovered: u64,
    /// Rebuild attempts over all recoveries.
    pub recovery_attempts: u64,
    /// Blocks refused (bad signature or chaining) and batches dropped (bad agreements).
    pub refused_blocks: u64,
    pub dropped_batches: u64,
    /// Device failures, each retried.
    pub failures: Vec<String>,
    /// Time (on the server's clock) spent executing blocks on the database, waiting for the
    /// commit server's decision, and appending or recovering.
    pub execute_ns: u64,
    pub decide_ns: u64,
    pub apply_ns: u64,
}

/// The block in hand and where it is in the pipeline.
struct Current {
    block: OrderedBlock,
    transactions: Vec<Transaction>,
    outcomes: Vec<Outcome>,
    own: Option<LedgerBlock>,
}

enum Phase {
    Loading,
    Idle,
    Executing,
    Deciding,
    Appending,
    Recovering { consensus: Hash },
}

enum TimerFor {
    Load,
    Fetch,
    Decide,
    Recover,
}

pub struct ExecutionServer {
    org: String,
    config: Arc<PipelineConfig>,
    weakness: Option<ExecutionWeakness>,
    ids: Ids,
    phase: Phase,
    /// The next block to execute, the hash of the last LedgerBlock appended, and the hash
    /// of the last ordered block executed (unknown right after a restart).
    next: u64,
    last_ledger_hash: Hash,
    last_ordered_hash: Option<Hash>,
    queue: VecDeque<OrderedBlock>,
    fetching: Option<CallId>,
    deciding: Option<CallId>,
    current: Option<Current>,
    timers: std::collections::BTreeMap<TimerId, TimerFor>,
    /// The clock at this step, and when the current phase began.
    now: Nanos,
    phase_since: Nanos,
    orderer: super::OrdererTarget,
    /// Rebuilds (loads or recoveries) failed in a row (their retries back off).
    failed_recoveries: u32,
    stats: ExecutionStats,
}

impl ExecutionServer {
    pub fn new(org: &str, config: Arc<PipelineConfig>, weakness: Option<ExecutionWeakness>) -> ExecutionServer {
        ExecutionServer {
            org: org.to_string(),
            config,
            weakness,
            ids: Ids::default(),
            phase: Phase::Loading,
            next: 0,
            last_ledger_hash: [0; 32],
            last_ordered_hash: None,
            queue: VecDeque::new(),
            fetching: None,
            deciding: None,
            current: None,
            timers: Default::default(),
            now: 0,
            phase_since: 0,
            orderer: super::OrdererTarget::default(),
            failed_recoveries: 0,
            stats: ExecutionStats::default(),
        }
    }

    pub fn stats(&self) -> &ExecutionStats {
        &self.stats
    }

    /// The number of LedgerBlocks this organization has appended.
    pub fn height(&self) -> u64 {
        self.next
    }

    /// The time since the current phase began, and the phase now begins anew.
    fn lap(&mut self) -> u64 {
        let elapsed = self.now.saturating_sub(self.phase_since);
        self.phase_since = self.now;
        elapsed
    }

    pub fn step(&mut self, now: Nanos, event: PipelineEvent<()>, out: &mut Vec<PipelineCommand>) {
        self.now = now;
        match event {
            Event::Start => out.push(Command::Io { io: self.ids.io(), op: PipelineIo::Load }),
            Event::IoDone { result, .. } => self.device_done(result, out),
            Event::Response { call, result } if self.fetching == Some(call) => {
                self.fetching = None;
                match result {
                    Ok(Response::Blocks(blocks)) => self.fetched(blocks),
                    // A replica that is down, or has nothing newer before the deadline (it
                    // may be cut off from the others): ask the next one.
                    _ => {
                        self.orderer.rotate(&self.config);
                        self.later(TimerFor::Fetch, out);
                    }
                }
            }
            Event::Response { call, result } if self.deciding == Some(call) => {
                self.deciding = None;
                match result {
                    Ok(Response::Decided(decision)) => self.decided(decision, out),
                    _ => self.later(TimerFor::Decide, out),
                }
            }
            // The ChainifyServer's acknowledgement of outcomes: nothing waits for it.
            Event::Response { .. } => {}
            Event::Timer(timer) => match self.timers.remove(&timer) {
                Some(TimerFor::Fetch) | None => {}
                Some(TimerFor::Load) => out.push(Command::Io { io: self.ids.io(), op: PipelineIo::Load }),
                Some(TimerFor::Decide) => self.ask_commit_server(out),
                Some(TimerFor::Recover) => {
                    if let Phase::Recovering { consensus } = self.phase {
                        self.recover(consensus, out);
                    }
                }
            },
            Event::Request { from, call, .. } => out.push(Command::Reply {
                to: from,
                call,
                response: Response::Refused("an execution server serves no requests".to_string()),
            }),
            Event::Input(()) => {}
        }
        self.advance(out);
    }

    /// Keeps a fetch in flight while the queue has room, and starts the next block when idle.
    fn advance(&mut self, out: &mut Vec<PipelineCommand>) {
        if matches!(self.phase, Phase::Loading) {
            return;
        }
        if self.fetching.is_none()
            && self.queue.len() < QUEUE
            && !self.timers.values().any(|t| matches!(t, TimerFor::Fetch))
        {
            let call = self.ids.call();
            self.fetching = Some(call);
            let from = self.next + self.queue.len() as u64 + u64::from(self.current.is_some());
            out.push(Command::Call {
                to: self.orderer.name(&self.config).to_string(),
                call,
                request: Request::Fetch { from },
                deadline: self.config.call_deadline,
            });
        }
        if matches!(self.phase, Phase::Idle) {
            if let Some(block) = self.queue.pop_front() {
                self.execute(block, out);
            }
        }
    }

    /// A rebuild replays history: one that keeps failing (no checkpoint and no replay
    /// reaches the agreed hash, or the ledger's own) is retried ever less often, up to 256
    /// times the retry interval.
    fn back_off(&mut self, purpose: TimerFor, out: &mut Vec<PipelineCommand>) {
        self.failed_recoveries = self.failed_recoveries.saturating_add(1);
        let after = self.config.retry_after.saturating_mul(1 << self.failed_recoveries.min(8));
        let timer = self.ids.timer();
        self.timers.insert(timer, purpose);
        out.push(Command::SetTimer { timer, after });
    }

    fn later(&mut self, purpose: TimerFor, out: &mut Vec<PipelineCommand>) {
        let timer = self.ids.timer();
        self.timers.insert(timer, purpose);
        out.push(Command::SetTimer { timer, after: self.config.retry_after });
    }

    /// Keeps the fetched blocks that come next, signed by the orderer and chained.
    fn fetched(&mut self, blocks: Vec<OrderedBlock>) {
        for block in blocks {
            let expected = self.next + self.queue.len() as u64 + u64::from(self.current.is_some());
            if block.number != expected {
                continue;
            }
            let previous = self
                .queue
                .back()
                .map(OrderedBlock::hash)
                .or_else(|| self.current.as_ref().map(|current| current.block.hash()).or(self.last_ordered_hash));
            let chained = previous.is_none_or(|previous| previous == block.previous);
            if !chained || block.check(self.config.orderer).is_err() {
                self.stats.refused_blocks += 1;
                break;
            }
            self.queue.push_back(block);
        }
    }

    /// Executes a block: the proposals of its batches whose agreements check out, in order
    /// (every organization drops the same batches, since the checks are pure).
    fn execute(&mut self, block: OrderedBlock, out: &mut Vec<PipelineCommand>) {
        let mut transactions = Vec::new();
        let mut outcomes = Vec::new();
        for chained in &block.batches {
            if chained.check(&self.config.organizations, self.config.agreements).is_err() {
                self.stats.dropped_batches += 1;
                continue;
            }
            for proposal in &chained.batch.proposals {
                transactions.push(Transaction::new(proposal.statements.clone()));
                outcomes.push(Outcome {
                    client: proposal.client.clone(),
                    seq: proposal.seq,
                    block: block.number,
                    successful: false,
                });
            }
        }
        let op = PipelineIo::Execute {
            number: self.next,
            previous: self.last_ledger_hash,
            transactions: transactions.clone(),
        };
        self.current = Some(Current { block, transactions, outcomes, own: None });
        self.phase = Phase::Executing;
        self.phase_since = self.now;
        out.push(Command::Io { io: self.ids.io(), op });
    }

    fn lies_about_effects(&self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self.weakness == Some(ExecutionWeakness::LieAboutEffects);
        #[cfg(not(any(test, feature = "sim")))]
        return self.weakness.is_some();
    }

    fn ask_commit_server(&mut self, out: &mut Vec<PipelineCommand>) {
        let Some(current) = &self.current else {
            return;
        };
        let mut hash = current.own.as_ref().map(LedgerBlock::hash);
        if self.lies_about_effects() {
            hash = hash.map(|mut hash| {
                hash[0] ^= 1;
                hash
            });
        }
        let call = self.ids.call();
        self.deciding = Some(call);
        out.push(Command::Call {
            to: node_name(&self.org, "commit"),
            call,
            request: Request::Decide { block: self.next, hash },
            deadline: self.config.call_deadline,
        });
    }

    fn decided(&mut self, decision: Decision, out: &mut Vec<PipelineCommand>) {
        if matches!(self.phase, Phase::Deciding) {
            self.stats.decide_ns += self.lap();
        }
        let Some(current) = &self.current else {
            return;
        };
        match (decision, &current.own) {
            (Decision::Commit, Some(own)) => {
                self.phase = Phase::Appending;
                out.push(Command::Io { io: self.ids.io(), op: PipelineIo::Append(own.clone()) });
            }
            (Decision::Commit, None) => self.later(TimerFor::Decide, out),
            (Decision::Recover { consensus }, _) => {
                self.phase = Phase::Recovering { consensus };
                self.recover(consensus, out);
            }
        }
    }

    fn recover(&mut self, consensus: Hash, out: &mut Vec<PipelineCommand>) {
        let Some(current) = &self.current else {
            return;
        };
        let op = PipelineIo::Recover {
            number: self.next,
            previous: self.last_ledger_hash,
            transactions: current.transactions.clone(),
            consensus,
        };
        out.push(Command::Io { io: self.ids.io(), op });
    }

    fn device_done(&mut self, result: PipelineIoDone, out: &mut Vec<PipelineCommand>) {
        match (result, &self.phase) {
            (PipelineIoDone::Loaded(Ok((height, last))), Phase::Loading) => {
                self.failed_recoveries = 0;
                self.next = height;
                self.last_ledger_hash = last;
                self.phase = Phase::Idle;
            }
            (PipelineIoDone::Loaded(Err(error)), Phase::Loading) => {
                self.stats.failures.push(error.to_string());
                self.back_off(TimerFor::Load, out);
            }
            (PipelineIoDone::Executed(result), Phase::Executing) => {
                self.stats.execute_ns += self.lap();
                match result {
                    Ok(own) => {
                        self.stats.executed += 1;
                        if let Some(current) = &mut self.current {
                            current.own = Some(own);
                        }
                    }
                    Err(error) => self.stats.failures.push(error.to_string()),
                }
                self.phase = Phase::Deciding;
                self.ask_commit_server(out);
            }
            (PipelineIoDone::Appended(Ok(())), Phase::Appending) => {
                self.stats.committed += 1;
                self.finish(out);
            }
            (PipelineIoDone::Recovered(Ok((block, attempts))), Phase::Recovering { .. }) => {
                self.failed_recoveries = 0;
                self.stats.recovered += 1;
                self.stats.recovery_attempts += attempts as u64;
                if let Some(current) = &mut self.current {
                    current.own = Some(block);
                }
                self.finish(out);
            }
            (PipelineIoDone::Appended(Err(error)), Phase::Appending) => {
                // The ledger could not take the block: rebuild towards it as if it lost.
                self.stats.failures.push(error.to_string());
                if let Some(consensus) =
                    self.current.as_ref().and_then(|current| current.own.as_ref()).map(LedgerBlock::hash)
                {
                    self.phase = Phase::Recovering { consensus };
                    self.later(TimerFor::Recover, out);
                }
            }
            (PipelineIoDone::Recovered(Err(error)), Phase::Recovering { .. }) => {
                self.stats.failures.push(error.to_string());
                self.back_off(TimerFor::Recover, out);
            }
            _ => {}
        }
    }

    /// The block is in the ledger: tell the ChainifyServer what its clients' transactions
    /// came to, and move on.
    fn finish(&mut self, out: &mut Vec<PipelineCommand>) {
        self.stats.apply_ns += self.lap();
        let Some(current) = self.current.take() else {
            return;
        };
        let Some(appended) = current.own else {
            return;
        };
        let outcomes: Vec<Outcome> = current
            .outcomes
            .into_iter()
            .zip(&appended.successful)
            .map(|(outcome, ok)| Outcome { successful: *ok, ..outcome })
            .collect();
        self.next += 1;
        self.last_ledger_hash = appended.hash();
        self.last_ordered_hash = Some(current.block.hash());
        self.phase = Phase::Idle;
        out.push(Command::Call {
            to: node_name(&self.org, "chainify"),
            call: self.ids.call(),
            request: Request::Committed(outcomes),
            deadline: self.config.call_deadline,
        });
    }
}
