//! Why a pipeline server refuses a request: one typed reason per rule it enforces. The
//! reason travels to the caller as its text (`Response::Refused`), and the server counts it.

use virga_ledger::wlc::{Refused, VoteRefused};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A server that is still reading its device answers nothing yet.
    #[error("the {server} is still reading its {log}")]
    Loading { server: &'static str, log: &'static str },
    /// A request of a kind this server does not serve, or from a peer it does not serve.
    #[error("{server} does not serve {kind} from {from}")]
    NotServed { server: &'static str, kind: &'static str, from: String },
    #[error("{from} sent a proposal of {client:?}; only {org}'s own clients propose here, each for itself")]
    ForeignProposal { from: String, client: String, org: String },
    #[error("proposal {seq} of {client} is a replay")]
    ReplayedProposal { client: String, seq: u64 },
    #[error("{from} asked for an agreement on a batch of {origin:?}")]
    ForeignBatch { from: String, origin: String },
    #[error("the batch holds proposal {seq} of {client} twice")]
    DuplicateInBatch { client: String, seq: u64 },
    #[error("the batch holds a proposal of {client:?}, not a client of {origin}")]
    StrangerInBatch { client: String, origin: String },
    #[error("the batch replays proposal {seq} of {client}")]
    ReplayedInBatch { client: String, seq: u64 },
    /// A signed message (a proposal, an agreement, a chained transaction) does not check.
    #[error(transparent)]
    Message(#[from] Refused),
    #[error("{from} is not another commit server of the consortium")]
    NotACommitPeer { from: String },
    #[error("{peer} sent a vote in the name of {organization:?}")]
    VoteInAnotherName { peer: String, organization: String },
    #[error("{peer}'s vote for block {block} is too far from block {around}")]
    VoteTooFar { peer: String, block: u64, around: u64 },
    #[error(transparent)]
    Vote(#[from] VoteRefused),
    #[error("{from} is not an orderer replica")]
    NotAnOrderer { from: String },
    #[error("a Raft batch that does not decode: {0}")]
    RaftBatch(#[from] prost::DecodeError),
}
