//! Why the miner left a transfer out, refused an announced block or a storage node's
//! answer, or could not store a block. Peers hear these as text (their `Display`), produced
//! where the reply is made.

use alloy_primitives::B256;
use virga_ledger::store::StoreError;
use virga_ledger::verify::VerifyError;
use virga_trie::partial::BagError;
use virga_trie::{ShardError, Stopped};

use crate::codec::WireError;
use virga_net::NetError;

/// Why a transfer was left out at admission. Its client hears [`LeftOut::code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeftOut {
    #[error("malformed_transaction")]
    MalformedTransaction,
    #[error("bad_signature")]
    BadSignature,
    /// An earlier transfer of the same sender in the batch was left out: this one's nonce
    /// would fail.
    #[error("earlier_transfer_aborted")]
    EarlierTransferAborted,
    /// The transfer's accounts cannot be read from the top layer with its bag attached.
    #[error("stale_witness")]
    StaleWitness,
    /// The sender has used the nonce (in the chain or earlier in the batch).
    #[error("nonce_used")]
    NonceUsed,
}

impl LeftOut {
    /// The reason code a client reads in its transfer's outcome.
    pub const fn code(self) -> &'static str {
        match self {
            LeftOut::MalformedTransaction => "malformed_transaction",
            LeftOut::BadSignature => "bad_signature",
            LeftOut::EarlierTransferAborted => "earlier_transfer_aborted",
            LeftOut::StaleWitness => "stale_witness",
            LeftOut::NonceUsed => "nonce_used",
        }
    }
}

/// Why a built block's logical updates could not be collected (a broken invariant: every
/// written account was read from the layer).
#[derive(Debug, thiserror::Error)]
pub enum UpdatesError {
    #[error("written account not held: {0}")]
    NotHeld(#[source] Stopped),
    #[error("{0}")]
    Shard(#[from] ShardError),
    #[error("shard {shard}: {source}")]
    ShardHash {
        shard: usize,
        #[source]
        source: virga_trie::partial::SubtreeError,
    },
}

/// Why a block another miner announced was refused. The announcer hears the text.
#[derive(Debug, thiserror::Error)]
pub enum AnnouncementRefusal {
    #[error("node bag refused: {0}")]
    BagKeys(#[source] WireError),
    #[error("node bag refused: {0}")]
    Bag(#[from] BagError),
    #[error("node bag refused: {0}")]
    ContractBag(#[source] super::contract_bags::ContractBagError),
    /// The block does not check or re-execute on this miner's tip.
    #[error("{0}")]
    Invalid(#[from] VerifyError),
}

/// What is wrong with a storage node's answer to `ApplyBlock`.
#[derive(Debug, thiserror::Error)]
pub enum AckError {
    #[error("answered a block with something other than an acknowledgement")]
    NotAnAck,
    #[error("acknowledged block {acked} ({acked_hash}) instead of block {number} ({hash})")]
    OtherBlock { acked: u64, acked_hash: B256, number: u64, hash: B256 },
}

/// Why a warm-up round failed (the miner tries again on a timer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WarmUpFailure {
    #[error("no storage node left to ask for shard {shard}")]
    NoReplicaLeft { shard: usize },
    #[error("a storage node answered a top request with something else")]
    UnexpectedTopReply,
    #[error("top layer: {0}")]
    Top(#[source] NetError),
    #[error("top-layer nodes: {0}")]
    TopNodes(#[source] BagError),
    #[error("beneficiary witness: {0}")]
    BeneficiaryWitness(#[source] BagError),
    #[error("top of a contract's storage: {0}")]
    StorageTop(#[source] virga_evm::WitnessJoinError),
    #[error("the top layer's root changed while warming up")]
    RootChanged,
}

/// Why the miner's device did not store a block.
#[derive(Debug, thiserror::Error)]
pub enum ChainDiskError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The driver gave the operation to another role's device, or to none.
    #[error("{op} asked of another role's device, or of none")]
    WrongDevice { op: String },
}
