//! ChainifyDB's pipeline as role cores (seed 002 §4.3): each server is a state machine of
//! events in and commands out, with no clock, socket, thread or database call of its own;
//! a database operation is a device operation ([`PipelineIo`]) that the organization's
//! device runs on its DBMS ([`device::OrganizationDevice`]). The same cores run in the
//! deterministic simulator ([`crate::sim`]) on in-memory SQLite.
//!
//! One transaction's path:
//!
//! 1. A [`client::ClientCore`] signs a [`Proposal`] and sends it to its organization's
//!    [`chainify_server::ChainifyServer`], which checks the client's signature and
//!    sequence number and gathers proposals into a [`ProposalBatch`].
//! 2. The ChainifyServer asks the other organizations' ChainifyServers to agree: each checks
//!    every proposal of the batch and signs the batch's hash ([`Agreement`]). With the
//!    agreements the policy asks for, the [`ChainedTx`] goes to the
//!    [`orderer::OrderingServer`].
//! 3. The ordering service, a Raft group of [`orderer::OrderingServer`] replicas, checks
//!    the agreements; its leader cuts blocks by size or time and replicates each cut; every
//!    replica derives the same signed block from it ([`OrderedBlock`]) and hands blocks to
//!    the execution servers that ask (a long poll).
//! 4. Each organization's [`execution::ExecutionServer`] checks the block and executes it
//!    on its database, builds its LedgerBlock and asks its
//!    [`commit::CommitServer`] to decide.
//! 5. The commit servers exchange signed votes ([`SignedVote`]) and decide by the c-of-k
//!    policy: commit (the execution server appends the LedgerBlock, checkpointing every K
//!    blocks), or recover towards the agreed hash (restore a checkpoint, replay, execute
//!    again). The execution server then tells its ChainifyServer, which answers the
//!    clients.

pub mod chainify_server;
pub mod client;
pub mod commit;
pub mod device;
pub mod execution;
pub mod node;
pub mod orderer;
mod refusal;
mod seq_window;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use alloy_primitives::Address;
pub use refusal::Refusal;
pub use virga_ledger::wlc::wire::{self, Decision, Outcome, Request, Response};
use virga_ledger::wlc::{AgreementPolicy, Hash, LedgerBlock, SignedVote};
use virga_net::role::Protocol;
use virga_net::WireProtocol;

use crate::organization::Transaction;

/// The node name of organization `org`'s server `role` (`chainify`, `exec`, `commit`).
pub fn node_name(org: &str, role: &str) -> String {
    format!("{org}/{role}")
}

/// The organization a node name belongs to (`org-1/commit` → `org-1`).
pub fn organization_of(node: &str) -> Option<&str> {
    node.split_once('/').map(|(org, _)| org)
}

/// The names of an ordering service of `replicas` replicas.
pub fn orderer_names(replicas: usize) -> Vec<String> {
    (1..=replicas).map(|at| format!("orderer-{at}")).collect()
}

/// The ordering service's Raft clock: a tick, and elections and heartbeats in ticks.
#[derive(Debug, Clone, Copy)]
pub struct RaftTiming {
    pub tick: Duration,
    /// Ticks without a leader before a follower campaigns (randomized in [n, 2n)).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
}

impl Default for RaftTiming {
    /// A 10 ms tick, elections after 10–20 ticks, heartbeats every 2.
    fn default() -> RaftTiming {
        RaftTiming { tick: Duration::from_millis(10), election_ticks: 10, heartbeat_ticks: 2 }
    }
}

/// The orderer replica a server sends to: the leader it was last pointed at, or the next
/// replica in turn after a failure.
#[derive(Debug, Clone, Default)]
pub struct OrdererTarget {
    at: usize,
}

impl OrdererTarget {
    pub fn name<'a>(&self, config: &'a PipelineConfig) -> &'a str {
        config.orderers.get(self.at % config.orderers.len().max(1)).map_or("", String::as_str)
    }

    /// A replica said who leads (empty: it knows no leader, so try the next).
    pub fn redirect(&mut self, config: &PipelineConfig, leader: &str) {
        match config.orderers.iter().position(|name| name == leader) {
            Some(at) => self.at = at,
            None => self.rotate(config),
        }
    }

    pub fn rotate(&mut self, config: &PipelineConfig) {
        self.at = (self.at + 1) % config.orderers.len().max(1);
    }
}

/// What every server knows of the consortium: its members and their public keys, the clients
/// and the organization each belongs to, the orderer's key, and the pipeline's settings.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The organizations' addresses by name (each signs agreements and votes).
    pub organizations: BTreeMap<String, Address>,
    /// The clients' addresses, and the organization each client belongs to.
    pub clients: BTreeMap<String, Address>,
    pub client_orgs: BTreeMap<String, String>,
    pub orderer: Address,
    /// The ordering service's replicas (Raft ids 1, 2, … in this order).
    pub orderers: Vec<String>,
    pub raft: RaftTiming,
    /// The c-of-k vote on LedgerBlock hashes.
    pub policy: AgreementPolicy,
    /// How many organizations (the origin included) must agree to a batch before it is
    /// ordered.
    pub agreements: usize,
    /// A ChainifyServer cuts a batch at this many proposals, or after `batch_wait`.
    pub batch_size: usize,
    pub batch_wait: Duration,
    /// The orderer cuts a block at this many transactions, or after `block_wait`.
    pub block_size: usize,
    pub block_wait: Duration,
    /// A checkpoint after every K-th committed block, and how many are kept.
    pub checkpoint_every: u64,
    pub keep_checkpoints: usize,
    /// How long a call waits for its answer, and how long a server waits before retrying
    /// a call that failed.
    pub call_deadline: Duration,
    pub retry_after: Duration,
}

impl PipelineConfig {
    pub fn client_org(&self, client: &str) -> Option<&str> {
        self.client_orgs.get(client).map(String::as_str)
    }

    /// Every organization but `org`.
    pub fn peers_of<'a>(&'a self, org: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.organizations.keys().map(String::as_str).filter(move |name| *name != org)
    }
}

/// The pipeline's protocol.
#[derive(Debug)]
pub struct ChainifyProtocol;

impl Protocol for ChainifyProtocol {
    type Request = Request;
    type Response = Response;

    fn request_kind(request: &Request) -> &'static str {
        match request {
            Request::Propose(_) => "propose",
            Request::Agree(_) => "agree",
            Request::Order(_) => "order",
            Request::Fetch { .. } => "fetch",
            Request::Decide { .. } => "decide",
            Request::Vote { .. } => "vote",
            Request::Committed(_) => "committed",
            Request::Raft(_) => "raft",
        }
    }

    fn response_kind(response: &Response) -> &'static str {
        match response {
            Response::Done(_) => "done",
            Response::Agreed(_) => "agreed",
            Response::Ordered => "ordered",
            Response::Blocks(_) => "blocks",
            Response::Decided(_) => "decided",
            Response::VoteAck(_) => "vote-ack",
            Response::Ack => "ack",
            Response::Refused(_) => "refused",
            Response::NotLeader(_) => "not-leader",
        }
    }

    /// The signed messages' own encodings; the small control messages a few bytes each.
    fn request_bytes(request: &Request) -> usize {
        match request {
            Request::Propose(proposal) => proposal.encode().len(),
            Request::Agree(batch) => batch.encode().len(),
            Request::Order(chained) => chained.encode().len(),
            Request::Fetch { .. } => 9,
            Request::Decide { .. } => 42,
            Request::Vote { vote, .. } => 9 + vote.as_ref().map_or(0, |vote| vote.encode().len()),
            Request::Committed(outcomes) => outcomes.iter().map(|outcome| outcome.client.len() + 18).sum(),
            Request::Raft(bytes) => bytes.len(),
        }
    }

    fn response_bytes(response: &Response) -> usize {
        match response {
            Response::Done(outcome) => outcome.client.len() + 18,
            Response::Agreed(agreement) => agreement.encode().len(),
            Response::Blocks(blocks) => blocks.iter().map(|block| block.encode().len()).sum(),
            Response::VoteAck(vote) => 1 + vote.as_ref().map_or(0, |vote| vote.encode().len()),
            Response::Refused(reason) | Response::NotLeader(reason) => reason.len(),
            Response::Ordered | Response::Decided(_) | Response::Ack => 34,
        }
    }

    fn refusal_reason(response: &Response) -> Option<&str> {
        match response {
            Response::Refused(reason) => Some(reason),
            _ => None,
        }
    }
}

/// On the wire, the pipeline's messages are `virga_ledger::wlc::wire`'s encoding: a kind
/// byte, then the kind's fields.
impl WireProtocol for ChainifyProtocol {
    const NAME: &'static str = "chainify";
    type DecodeError = wire::WireError;

    fn refusal(reason: String) -> Response {
        Response::Refused(reason)
    }

    fn encode_request(request: Request) -> Vec<u8> {
        wire::encode_request(&request)
    }

    fn decode_request(bytes: &[u8]) -> Result<Request, wire::WireError> {
        wire::decode_request(bytes)
    }

    fn encode_response(response: Response) -> Vec<u8> {
        wire::encode_response(&response)
    }

    fn decode_response(bytes: &[u8]) -> Result<Response, wire::WireError> {
        wire::decode_response(bytes)
    }
}

/// The devices' operations: an organization's database and ledger, and the orderer's log.
#[derive(Debug)]
pub enum PipelineIo {
    /// Bring the database to the organization's ledger (after a crash it may hold effects
    /// of a block the ledger lacks) and report the ledger's length and last hash.
    Load,
    /// Execute a block's transactions and build the organization's LedgerBlock.
    Execute {
        number: u64,
        previous: Hash,
        transactions: Vec<Transaction>,
    },
    /// Append the agreed LedgerBlock to the ledger; checkpoint if it is a K-th block.
    Append(LedgerBlock),
    /// Rebuild the database from a checkpoint (newest first, then a full replay) until
    /// executing the block again gives the `consensus` hash; then append it.
    Recover {
        number: u64,
        previous: Hash,
        transactions: Vec<Transaction>,
        consensus: Hash,
    },
    /// An orderer replica's Raft log: read every record, or append some.
    LoadRaft,
    AppendRaft(Vec<Vec<u8>>),
    /// A commit server's log of its own votes: read them, or log one before it is sent (so
    /// that a restarted commit server still answers for the blocks it voted on, and never
    /// votes two ways).
    LoadVotes,
    LogVote(SignedVote),
}

#[derive(Debug)]
pub enum PipelineIoDone {
    Loaded(Result<(u64, Hash), DeviceFailure>),
    Executed(Result<LedgerBlock, DeviceFailure>),
    Appended(Result<(), DeviceFailure>),
    /// The block agreed, and how many rebuild attempts it took.
    Recovered(Result<(LedgerBlock, usize), DeviceFailure>),
    LoadedRaft(Vec<Vec<u8>>),
    RaftAppended(Result<(), DeviceFailure>),
    LoadedVotes(Vec<SignedVote>),
    VoteLogged(u64),
}

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceFailure {
    #[error("{}: {error}", .dir.display())]
    Log { dir: std::path::PathBuf, error: virga_log::LogError },
    #[error(transparent)]
    Organization(#[from] crate::organization::OrganizationError),
    #[error(transparent)]
    Consortium(#[from] crate::consortium::ConsortiumError),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("the {0}'s lock is poisoned")]
    Poisoned(&'static str),
    /// An operation sent to a device that does not keep what it asks for.
    #[error("{0}")]
    WrongDevice(&'static str),
    #[error("a rebuild with a block to execute returned none")]
    NothingRebuilt,
}

/// The event and command types every pipeline core handles.
pub type PipelineEvent<Input> = virga_net::role::Event<ChainifyProtocol, PipelineIoDone, Input>;
pub type PipelineCommand = virga_net::role::Command<ChainifyProtocol, PipelineIo>;
