//! RainBlock's prefetching client as a sans-I/O core ([`ClientCore`]): pre-executes
//! transfers against the storage nodes, fetches and verifies their witnesses, bags them, and
//! submits transfers plus bag to the miner. A driver (`virga_net::driver`, or the simulator)
//! carries out its calls and timers and hands it its user's transfers as input.
//!
//! Each batch of up to `batch` transfers moves through its own state machine, keyed by the
//! calls it made: it asks the miner for its committed head, fetches the witnesses of its
//! accounts at that head from the storage nodes, and awaits the miner's answer to its
//! submission. At most `in_flight` batches are under way at once.
//!
//! A batch's witnesses are fetched at the miner's committed head, each storage node's bag
//! verified against that head's state root. A shard served by several storage nodes is
//! asked of each in turn, fetch after fetch; a refused, unavailable or bad witness is asked
//! again of the shard's next replica. The client then pre-executes the batch on the
//! witnessed accounts (and its own earlier transfers in the batch) and drops transfers that
//! would certainly fail, saying why. The surviving witnesses are merged into one bag with
//! every node once and the nodes above compaction level c left out. A sender has at most
//! one transfer in flight, so an abort never leaves a nonce gap behind it; aborted
//! transfers are retried with fresh witnesses, before any transfer that arrived after them.
//! A batch that cannot reach the miner, or cannot get its witnesses, waits `back_off` (a
//! timer) before its transfers are retried.

mod calls;
pub(crate) mod precheck;
mod prepare;
mod queue;
#[cfg(test)]
mod tests;
mod witness;

use crate::messages::{BlockId, Request, Response, Submission};
use crate::protocol::{refusal, Rainblock};
use alloy_primitives::{Address, B256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use virga_ledger::exec::ExecConfig;
use virga_ledger::tx::SignedTx;
use virga_net::role::{CallId, Command, Event, Ids, Nanos, Role, TimerId};
use virga_net::NetError;

use crate::storage::prefix_nibbles;
use queue::SenderQueues;
pub use witness::{check_contract_witness, check_witness, ContractWitness, WitnessError};
use witness::{Answered, WitnessFetch};

/// A user's transfer: signed, with the sender it claims (a hint for prefetching only; the
/// miner recovers the real sender from the signature).
#[derive(Clone, Debug)]
pub struct UserTransfer {
    pub tx: SignedTx,
    pub sender: Address,
}

/// The longest a client waits for any answer by default; no answer by then counts as an
/// unreachable peer.
pub const DEFAULT_CALL_DEADLINE: Duration = virga_net::driver::DEFAULT_DEADLINE;
/// How long a batch that could not reach a role waits before its transfers are retried,
/// so retries do not spin.
pub const DEFAULT_BACK_OFF: Duration = Duration::from_millis(50);

/// Retry reasons of the client's own (the miner's reasons, such as `block_refused`, are
/// recorded as it gives them).
pub const MINER_UNREACHABLE: &str = "miner_unreachable";
pub const BAD_WITNESS: &str = "bad_witness";
pub const SUBMISSION_FAILED: &str = "submission_failed";
pub const UNANSWERED: &str = "unanswered";
pub const COMPACTION_FAILED: &str = "compaction_failed";
/// Whether a miner's reason for leaving a transfer out is execution refusing it as invalid
/// (`virga_evm::ExecError::name`): retrying the same signed transfer cannot help.
fn is_invalid(reason: &str) -> bool {
    matches!(
        reason,
        "nonce_mismatch"
            | "insufficient_funds"
            | "fee_below_base_fee"
            | "wrong_chain_id"
            | "gas_limit_too_low"
            | "invalid_transaction"
    )
}

/// Filter reason of a transfer whose accounts the witnesses did not give.
pub const UNREADABLE_ACCOUNT: &str = "unreadable_account";

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub id: String,
    pub miner: String,
    pub storage_nodes: Vec<(String, Vec<usize>)>,
    pub shard_count: usize,
    /// Compaction level c: bag nodes above this trie level are left out.
    pub compaction: usize,
    /// Transfers per submission.
    pub batch: usize,
    /// Batches under way (head, witnesses, submission) at once.
    pub in_flight: usize,
    pub exec: ExecConfig,
    /// Every call's deadline.
    pub deadline: Duration,
    /// Wait before retrying a batch that could not reach a role.
    pub back_off: Duration,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Transfers handed to the client.
    pub accepted: u64,
    pub submitted: u64,
    pub committed: u64,
    pub committed_ok: u64,
    /// Of `committed`: transfers whose answer was lost (the miner failed first) and that a
    /// later pre-execution found committed by their sender's nonce; their receipts are not
    /// known here, so they are not in `committed_ok`.
    pub confirmed_late: u64,
    pub submissions: u64,
    /// Transfers dropped before submission because they would certainly fail, by reason.
    pub filtered: HashMap<String, u64>,
    /// Transfers the miner left out (or whose batch failed) and this client retried, by reason.
    pub retried: HashMap<String, u64>,
    /// Transfers the miner's execution refused as invalid (Ethereum leaves them out of the
    /// block for good), by reason; not retried.
    pub invalid: HashMap<String, u64>,
    /// Witnesses refused, by storage node and reason.
    pub bad_witnesses: Vec<(String, WitnessError)>,
    /// Bytes of each submitted transfer's own full witnesses (every node of both accounts'
    /// proofs, nothing shared).
    pub witness_bytes_full: u64,
    /// Bytes of the compacted, bagged witnesses actually sent.
    pub witness_bytes_compact: u64,
    /// Of `submitted`: contract calls (and creations), pre-executed with revm.
    pub calls_submitted: u64,
    /// Of `committed`: contract calls.
    pub calls_committed: u64,
    /// Witness fetch rounds beyond a batch's first (contract calls reaching further state).
    pub extra_rounds: u64,
    /// Of `witness_bytes_compact`: the slot bags and code sent with contract calls.
    pub contract_witness_bytes: u64,
}

/// Why the miner's head could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("miner unavailable: {0}")]
    Unavailable(NetError),
    #[error("the miner answered a head request with something else")]
    UnexpectedReply,
}

/// What a step of the core asks its driver to do.
type Commands = Vec<Command<Rainblock, std::convert::Infallible>>;

/// The miner's committed head: its number, hash and state root.
type Head = (u64, B256, B256);

/// Where a batch stands.
#[derive(Debug)]
enum Stage {
    AwaitingHead {
        call: CallId,
    },
    AwaitingWitnesses(Box<WitnessFetch>),
    AwaitingSubmission {
        call: CallId,
    },
    /// Waiting for `timer` before the transfers are retried for `reason`; `uncertain` when
    /// the miner may have included them.
    BackingOff {
        timer: TimerId,
        reason: &'static str,
        uncertain: bool,
    },
}

#[derive(Debug)]
struct Batch {
    /// One per sender; after pre-execution, only the transfers submitted.
    transfers: Vec<UserTransfer>,
    stage: Stage,
}

/// The prefetching client's core: a [`Role`] with no I/O of its own.
#[derive(Debug)]
pub struct ClientCore {
    config: ClientConfig,
    prefix_nibbles: usize,
    ids: Ids,
    stats: ClientStats,
    queues: SenderQueues,
    batches: BTreeMap<u64, Batch>,
    next_batch: u64,
    /// The batch each outstanding call belongs to.
    calls: HashMap<CallId, u64>,
    timers: HashMap<TimerId, u64>,
    /// Transfers submitted to a miner that failed before answering (by hash).
    uncertain: HashSet<B256>,
    /// Witness fetches so far: picks which replica of a shard is asked first.
    witness_fetches: usize,
    /// Verified contract code, by hash (code never changes, so it is fetched once).
    codes: HashMap<B256, Vec<u8>>,
    /// Contract calls submitted and not yet answered, by hash.
    calls_in_flight: HashSet<B256>,
    /// The time of the event being handled: a guessed block's timestamp comes from it.
    now: Nanos,
    /// What the client told its user, per transfer, when asked to keep it (the simulator's
    /// checks): the block each committed transfer was acknowledged in, and why each
    /// refused one was.
    outcomes: Option<UserOutcomes>,
}

/// What a client told its user about each transfer.
#[derive(Clone, Debug, Default)]
pub struct UserOutcomes {
    /// Transfer hash, and the number and hash of the block the miner said holds it.
    pub acknowledged: Vec<(B256, u64, B256)>,
    /// Transfer hash, and why it will not be submitted.
    pub refused: Vec<(B256, String)>,
    /// Transfers whose answer was lost and that a later pre-execution found committed (by
    /// their sender's nonce), in a block the client does not know.
    pub confirmed_late: Vec<B256>,
}

impl Role for ClientCore {
    type Protocol = Rainblock;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = Vec<UserTransfer>;

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Rainblock, Self::IoDone, Self::Input>,
        out: &mut Vec<Command<Rainblock, Self::Io>>,
    ) {
        self.now = now;
        match event {
            Event::Start => {}
            Event::Input(transfers) => {
                self.stats.accepted += transfers.len() as u64;
                for transfer in transfers {
                    self.queues.push(transfer);
                }
            }
            Event::Response { call, result } => {
                if let Some(batch) = self.calls.remove(&call) {
                    self.on_response(batch, call, result, out);
                }
            }
            Event::Timer(timer) => {
                if let Some(batch) = self.timers.remove(&timer) {
                    self.on_back_off_end(batch, timer);
                }
            }
            Event::Request { from, call, .. } => {
                out.push(Command::Reply { to: from, call, response: refusal("a client serves no requests") });
            }
            Event::IoDone { result, .. } => match result {},
        }
        self.start_batches(out);
    }
}

impl ClientCore {
    pub fn new(config: ClientConfig) -> ClientCore {
        ClientCore {
            prefix_nibbles: prefix_nibbles(config.shard_count).unwrap_or(0),
            config,
            ids: Ids::default(),
            stats: ClientStats::default(),
            queues: SenderQueues::default(),
            batches: BTreeMap::new(),
            next_batch: 0,
            calls: HashMap::new(),
            timers: HashMap::new(),
            uncertain: HashSet::new(),
            witness_fetches: 0,
            codes: HashMap::new(),
            calls_in_flight: HashSet::new(),
            now: 0,
            outcomes: None,
        }
    }

    /// Keeps every transfer's outcome from now on (see [`Self::outcomes`]).
    pub fn keep_outcomes(&mut self) {
        self.outcomes.get_or_insert_with(UserOutcomes::default);
    }

    /// The outcomes kept since [`Self::keep_outcomes`].
    pub fn outcomes(&self) -> Option<&UserOutcomes> {
        self.outcomes.as_ref()
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub fn stats(&self) -> ClientStats {
        self.stats.clone()
    }

    /// Transfers handed to the client so far.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted
    }

    /// Transfers known committed so far.
    pub fn committed(&self) -> u64 {
        self.stats.committed
    }

    /// Nothing waiting, under way or to be retried.
    pub fn is_idle(&self) -> bool {
        self.batches.is_empty() && self.queues.waiting() == 0
    }

    /// Batches under way (each awaiting the miner's head, witnesses, the miner's answer, or
    /// the end of a back-off).
    pub fn batches_in_flight(&self) -> usize {
        self.batches.len()
    }

    /// Transfers waiting for a batch.
    pub fn waiting(&self) -> usize {
        self.queues.waiting()
    }

    fn call(&mut self, batch: u64, to: &str, request: Request, out: &mut Commands) -> CallId {
        let call = self.ids.call();
        self.calls.insert(call, batch);
        out.push(Command::Call { to: to.to_string(), call, request, deadline: self.config.deadline });
        call
    }

    /// Starts batches while fewer than `in_flight` are under way and transfers can go.
    fn start_batches(&mut self, out: &mut Commands) {
        while self.batches.len() < self.config.in_flight.max(1) {
            let transfers = self.queues.take(self.config.batch.max(1));
            if transfers.is_empty() {
                return;
            }
            let id = self.next_batch;
            self.next_batch += 1;
            let miner = self.config.miner.clone();
            let call = self.call(id, &miner, Request::Head, out);
            self.batches.insert(id, Batch { transfers, stage: Stage::AwaitingHead { call } });
        }
    }

    fn on_response(&mut self, id: u64, call: CallId, result: Result<Response, NetError>, out: &mut Commands) {
        let Some(mut batch) = self.batches.remove(&id) else { return };
        match batch.stage {
            Stage::AwaitingHead { call: expected } if expected == call => match parse_head(result) {
                Ok(head) => self.fetch_witnesses(id, batch.transfers, head, out),
                Err(error) => {
                    tracing::warn!(client = %self.config.id, %error, "miner head unavailable");
                    self.back_off(id, batch.transfers, MINER_UNREACHABLE, false, out);
                }
            },
            Stage::AwaitingWitnesses(mut fetch) => {
                match fetch.answer(call, result, self.config.compaction) {
                    None | Some(Answered::Verified) => {}
                    Some(Answered::Failed { peer, error }) => {
                        if error.is_bad_witness() {
                            tracing::warn!(client = %self.config.id, peer = %peer, %error, "witness refused");
                            self.stats.bad_witnesses.push((peer.clone(), error.clone()));
                        } else {
                            tracing::warn!(client = %self.config.id, peer = %peer, %error, "witness unavailable");
                        }
                        if let Some(gave_up) = fetch.exhausted(&peer, &error) {
                            tracing::warn!(client = %self.config.id, error = %gave_up, "witness fetch failed");
                            for call in fetch.calls() {
                                self.calls.remove(&call);
                            }
                            return self.back_off(id, batch.transfers, BAD_WITNESS, false, out);
                        }
                        self.send_witness_calls(id, &mut fetch, out);
                    }
                }
                if fetch.is_complete() {
                    self.submit(id, batch.transfers, *fetch, out);
                } else {
                    batch.stage = Stage::AwaitingWitnesses(fetch);
                    self.batches.insert(id, batch);
                }
            }
            Stage::AwaitingSubmission { call: expected } if expected == call => {
                self.on_submitted(id, batch.transfers, result, out);
            }
            stage => {
                // An answer the batch no longer waits for (its fetch gave up, say).
                batch.stage = stage;
                self.batches.insert(id, batch);
            }
        }
    }

    fn fetch_witnesses(
        &mut self,
        id: u64,
        transfers: Vec<UserTransfer>,
        (number, hash, root): Head,
        out: &mut Commands,
    ) {
        let mut keys: Vec<B256> = transfers.iter().flat_map(|t| precheck::touched_keys(&t.tx, t.sender)).collect();
        keys.sort_unstable();
        keys.dedup();
        let turn = self.witness_fetches;
        self.witness_fetches += 1;
        let fetch =
            WitnessFetch::new(&keys, (number, hash), root, turn, &self.config.storage_nodes, self.prefix_nibbles);
        self.start_fetch(id, transfers, fetch, out);
    }

    /// Sends a fetch round's calls, the batch waiting for them; a fetch that cannot be made
    /// backs the batch off.
    fn start_fetch(
        &mut self,
        id: u64,
        transfers: Vec<UserTransfer>,
        fetch: Result<WitnessFetch, WitnessError>,
        out: &mut Commands,
    ) {
        match fetch {
            Ok(mut fetch) => {
                self.send_witness_calls(id, &mut fetch, out);
                self.batches.insert(id, Batch { transfers, stage: Stage::AwaitingWitnesses(Box::new(fetch)) });
            }
            Err(error) => {
                tracing::warn!(client = %self.config.id, %error, "witness fetch failed");
                self.back_off(id, transfers, BAD_WITNESS, false, out);
            }
        }
    }

    fn send_witness_calls(&mut self, id: u64, fetch: &mut WitnessFetch, out: &mut Commands) {
        for call in fetch.dispatch(&mut self.ids) {
            self.calls.insert(call.call, id);
            out.push(Command::Call {
                to: call.peer,
                call: call.call,
                request: Request::Witness(call.request),
                deadline: self.config.deadline,
            });
        }
    }
}

impl ClientCore {
    /// Pre-executes a batch whose witnesses are all in, and submits what survives; a batch
    /// whose contract calls reached unwitnessed state fetches it first.
    fn submit(&mut self, id: u64, transfers: Vec<UserTransfer>, mut fetch: WitnessFetch, out: &mut Commands) {
        for (hash, code) in std::mem::take(&mut fetch.witnesses.contracts.codes) {
            self.codes.insert(hash, code);
        }
        let (calls, mut transfers): (Vec<_>, Vec<_>) =
            transfers.into_iter().partition(|transfer| calls::is_call(transfer, &fetch.witnesses.values));
        let mut calls_kept = Vec::new();
        let mut code_used = std::collections::BTreeSet::new();
        if !calls.is_empty() {
            let calls = self.confirm_late_calls(calls, &fetch.witnesses.values);
            let state = calls::Witnessed::new(&fetch.witnesses, &self.codes);
            let block = calls::guessed_block(&self.config.exec, fetch.at.0, self.now / 1_000_000_000);
            let last_round = fetch.round >= calls::MAX_ROUNDS;
            let mut prepared = calls::pre_execute_calls(calls, &state, &block, fetch.at, last_round);
            self.report_filtered(&prepared.filtered);
            if !prepared.waiting.is_empty() {
                transfers.append(&mut prepared.kept);
                transfers.append(&mut prepared.waiting);
                return self.fetch_more(id, transfers, fetch, &prepared, out);
            }
            calls_kept = prepared.kept;
            code_used = prepared.code_used;
        }
        let WitnessFetch { at: (number, hash), root, witnesses, .. } = fetch;
        let mut done = prepare::pre_execute(&self.config.exec, transfers, &witnesses.values, &mut self.uncertain);
        let calls_submitted = calls_kept.len() as u64;
        self.calls_in_flight.extend(calls_kept.iter().map(|call| call.tx.hash()));
        done.kept.extend(calls_kept);
        self.stats.committed += done.confirmed_late.len() as u64;
        self.stats.confirmed_late += done.confirmed_late.len() as u64;
        for transfer in &done.confirmed_late {
            if let Some(outcomes) = self.outcomes.as_mut() {
                outcomes.confirmed_late.push(transfer.tx.hash());
            }
            self.queues.release(transfer.sender);
        }
        self.report_filtered(&done.filtered);
        let kept = done.kept;
        if kept.is_empty() {
            return;
        }
        // Calls may reach accounts beyond their sender and recipient: their batch's bag
        // keeps every account fetched.
        let narrow = !done.filtered.is_empty() && calls_submitted == 0;
        let contracts = prepare::contract_bags(&witnesses.contracts, &code_used, &self.codes, self.config.compaction);
        let bag = match prepare::bag_of(&kept, narrow, witnesses, root, self.config.compaction) {
            Ok(bag) => bag,
            Err(error) => {
                tracing::error!(client = %self.config.id, %error, "compacting a verified bag failed");
                return self.retry(kept, COMPACTION_FAILED);
            }
        };
        self.stats.submitted += kept.len() as u64;
        self.stats.submissions += 1;
        self.stats.witness_bytes_full += done.full_bytes;
        self.stats.witness_bytes_compact += bag.node_bytes() as u64;
        self.stats.calls_submitted += calls_submitted;
        let (storage, codes) = contracts;
        let slot_bytes: usize = storage.iter().flat_map(|entry| &entry.bag.nodes).map(Vec::len).sum();
        let contract_bytes = (slot_bytes + codes.iter().map(Vec::len).sum::<usize>()) as u64;
        self.stats.witness_bytes_compact += contract_bytes;
        self.stats.contract_witness_bytes += contract_bytes;
        let submission = Submission {
            transactions: kept.iter().map(|t| t.tx.encode()).collect(),
            bag,
            witness_at: BlockId::new(number, hash),
            witness_root: root,
            storage,
            codes,
        };
        let miner = self.config.miner.clone();
        let call = self.call(id, &miner, Request::Submit(submission), out);
        self.batches.insert(id, Batch { transfers: kept, stage: Stage::AwaitingSubmission { call } });
    }

    /// Transfers dropped before submission: counted, told to the user, their senders free.
    fn report_filtered(&mut self, filtered: &[(UserTransfer, &'static str)]) {
        for (transfer, reason) in filtered {
            *self.stats.filtered.entry((*reason).to_string()).or_default() += 1;
            if let Some(outcomes) = self.outcomes.as_mut() {
                outcomes.refused.push((transfer.tx.hash(), (*reason).to_string()));
            }
            self.queues.release(transfer.sender);
        }
    }

    /// Calls submitted to a miner that failed before answering whose sender's nonce has
    /// moved past them committed: counted and released; the rest go on.
    fn confirm_late_calls(
        &mut self,
        calls: Vec<UserTransfer>,
        values: &HashMap<B256, (Option<Vec<u8>>, usize)>,
    ) -> Vec<UserTransfer> {
        let mut going_on = Vec::with_capacity(calls.len());
        for call in calls {
            let nonce = match values.get(&alloy_primitives::keccak256(call.sender)) {
                Some((Some(raw), _)) => virga_trie::account::Account::decode_rlp(raw).map_or(0, |a| a.nonce),
                _ => 0,
            };
            if nonce > call.tx.nonce() && self.uncertain.remove(&call.tx.hash()) {
                self.stats.committed += 1;
                self.stats.confirmed_late += 1;
                if let Some(outcomes) = self.outcomes.as_mut() {
                    outcomes.confirmed_late.push(call.tx.hash());
                }
                self.queues.release(call.sender);
            } else {
                going_on.push(call);
            }
        }
        going_on
    }

    /// Starts the batch's next fetch round for what its calls reached.
    fn fetch_more(
        &mut self,
        id: u64,
        transfers: Vec<UserTransfer>,
        fetch: WitnessFetch,
        prepared: &calls::CallsPrepared,
        out: &mut Commands,
    ) {
        self.stats.extra_rounds += 1;
        let (storage_nodes, prefix) = (&self.config.storage_nodes, self.prefix_nibbles);
        let fetch = WitnessFetch::next_round(fetch, &prepared.need_keys, &prepared.need, storage_nodes, prefix);
        self.start_fetch(id, transfers, fetch, out);
    }

    /// The miner's answer to a submission: one outcome per transfer, in order.
    fn on_submitted(
        &mut self,
        id: u64,
        kept: Vec<UserTransfer>,
        result: Result<Response, NetError>,
        out: &mut Commands,
    ) {
        let (block, outcomes) = match result {
            Ok(reply) => match reply {
                Response::Submitted(submitted) => (submitted.block.map(BlockId::pair), submitted.outcomes),
                _ => (None, Vec::new()),
            },
            Err(error) => {
                tracing::warn!(client = %self.config.id, %error, "submission failed");
                return self.back_off(id, kept, SUBMISSION_FAILED, true, out);
            }
        };
        if outcomes.len() != kept.len() {
            tracing::warn!(client = %self.config.id, "the miner answered for {} of {} transfers", outcomes.len(), kept.len());
            self.mark_uncertain(&kept);
            return self.retry(kept, UNANSWERED);
        }
        for (transfer, outcome) in kept.into_iter().zip(outcomes) {
            let call = self.calls_in_flight.remove(&transfer.tx.hash());
            self.stats.calls_committed += u64::from(call && outcome.included);
            if outcome.included {
                if let (Some(outcomes), Some((number, hash))) = (self.outcomes.as_mut(), block) {
                    outcomes.acknowledged.push((transfer.tx.hash(), number, hash));
                }
                self.stats.committed += 1;
                self.stats.committed_ok += u64::from(outcome.succeeded);
                self.queues.release(transfer.sender);
            } else if is_invalid(&outcome.reason) {
                if let Some(outcomes) = self.outcomes.as_mut() {
                    outcomes.refused.push((transfer.tx.hash(), outcome.reason.clone()));
                }
                *self.stats.invalid.entry(outcome.reason).or_default() += 1;
                self.queues.release(transfer.sender);
            } else {
                *self.stats.retried.entry(outcome.reason).or_default() += 1;
                self.queues.requeue(transfer);
            }
        }
    }

    /// Holds a failed batch's transfers (and their senders) until `back_off` has passed.
    fn back_off(
        &mut self,
        id: u64,
        transfers: Vec<UserTransfer>,
        reason: &'static str,
        uncertain: bool,
        out: &mut Commands,
    ) {
        let timer = self.ids.timer();
        self.timers.insert(timer, id);
        out.push(Command::SetTimer { timer, after: self.config.back_off });
        self.batches.insert(id, Batch { transfers, stage: Stage::BackingOff { timer, reason, uncertain } });
    }

    fn on_back_off_end(&mut self, id: u64, fired: TimerId) {
        let Some(batch) = self.batches.remove(&id) else { return };
        let Stage::BackingOff { timer, reason, uncertain } = batch.stage else {
            unreachable!("batch {id} had a timer while {:?}", batch.stage)
        };
        assert_eq!(timer, fired, "batch {id} backs off on another timer");
        if uncertain {
            self.mark_uncertain(&batch.transfers);
        }
        self.retry(batch.transfers, reason);
    }

    fn mark_uncertain(&mut self, transfers: &[UserTransfer]) {
        self.uncertain.extend(transfers.iter().map(|transfer| transfer.tx.hash()));
    }

    /// Queues transfers again, ahead of their senders' later ones, counting them under `reason`.
    fn retry(&mut self, transfers: Vec<UserTransfer>, reason: &str) {
        *self.stats.retried.entry(reason.to_string()).or_default() += transfers.len() as u64;
        for transfer in transfers {
            self.queues.requeue(transfer);
        }
    }
}

/// The committed head in the miner's answer.
fn parse_head(result: Result<Response, NetError>) -> Result<Head, HeadError> {
    let Response::Head(head) = result.map_err(HeadError::Unavailable)? else {
        return Err(HeadError::UnexpectedReply);
    };
    Ok((head.head.number, head.head.hash, head.state_root))
}
