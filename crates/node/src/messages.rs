//! RainBlock's messages as its roles hold them: hashes are `B256`, headers and blocks are
//! decoded, bags are `NodeBag`s. The cores take and emit these; the wire form
//! (`proto/rainblock.proto`) exists only at the transports, where [`crate::codec`] converts,
//! refusing whatever does not decode and naming the field.
//!
//! What stays bytes is what a role judges piece by piece rather than as a message: a
//! submission's transactions (the miner answers for each one, a malformed one included), trie
//! nodes and code (proved by hash where they are used), and RLP values.

use alloy_consensus::Header;
use alloy_primitives::B256;
use virga_ledger::block::Block;
use virga_trie::proof::NodeBag;

/// A block, named by number and hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    pub number: u64,
    pub hash: B256,
}

impl BlockId {
    pub fn new(number: u64, hash: B256) -> BlockId {
        BlockId { number, hash }
    }

    pub fn pair(self) -> (u64, B256) {
        (self.number, self.hash)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// To a storage node.
    Witness(WitnessRequest),
    /// To a storage node.
    Top(TopRequest),
    /// To a storage node.
    ApplyBlock(Box<BlockUpdates>),
    /// To a storage node or a miner.
    Head,
    /// To a miner.
    Submit(Submission),
    /// To a peer miner.
    Announce(Box<BlockAnnouncement>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Witness(WitnessReply),
    Top(TopReply),
    /// The block acknowledged: applied and durable.
    BlockAck(BlockId),
    Head(HeadReply),
    Submitted(SubmissionReply),
    Verdict(Verdict),
    /// The request was refused; the peer's reason.
    Refused(String),
}

/// Witnesses for `keys` at block `at` (absent: the storage node's head), leaving out the
/// nodes above trie level `compaction`; and, for contracts of the served shards, witnesses of
/// storage slots (whole proofs from each account's storage root) and code by hash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WitnessRequest {
    pub keys: Vec<B256>,
    pub compaction: u32,
    pub at: Option<BlockId>,
    pub slots: Vec<SlotKeys>,
    pub code_hashes: Vec<B256>,
}

/// Storage slots of one account: its secure-trie key and the slots' (keccak of the slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotKeys {
    pub account: B256,
    pub slots: Vec<B256>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WitnessReply {
    pub at: BlockId,
    pub state_root: B256,
    pub bag: NodeBag,
    /// One bag per entry of the request's `slots`, in its order.
    pub storage: Vec<StorageBag>,
    /// The code of each of the request's `code_hashes`, in its order.
    pub codes: Vec<Vec<u8>>,
}

/// Slot witnesses in one account's storage trie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageBag {
    pub account: B256,
    pub bag: NodeBag,
}

/// The nodes of the served shards above trie level `levels`, for a miner filling its top layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopRequest {
    pub levels: u32,
    pub at: Option<BlockId>,
}

/// `nodes` also carries the account paths of the served contracts (those with storage), and
/// `storage` the top levels of their storage tries (bags without keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopReply {
    pub at: BlockId,
    pub state_root: B256,
    pub nodes: Vec<Vec<u8>>,
    pub storage: Vec<StorageBag>,
}

/// A block for storage nodes: its header (enough to check work and parent; the transactions
/// stay in the miners' chain), the new subtree hash of every shard (in shard order), and the
/// logical updates of the receiver's shards. `cleared` names accounts whose storage the
/// block wiped (before `slots` apply), and `codes` holds code the block deployed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockUpdates {
    pub header: Header,
    pub shard_hashes: Vec<B256>,
    pub updates: Vec<KeyUpdate>,
    pub slots: Vec<SlotUpdate>,
    pub cleared: Vec<B256>,
    pub codes: Vec<Vec<u8>>,
}

/// The new RLP value of a state-trie key (empty: deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyUpdate {
    pub key: B256,
    pub value: Vec<u8>,
}

/// The new RLP value (empty: deleted) of slot `slot` of the account with secure-trie key
/// `account`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotUpdate {
    pub account: B256,
    pub slot: B256,
    pub value: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadReply {
    pub head: BlockId,
    pub state_root: B256,
}

/// Encoded transactions from a prefetching client with the node bag proving what they touch,
/// taken at block `witness_at` whose state root is `witness_root`: accounts in `bag`,
/// contracts' slots in `storage`, and the code they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub transactions: Vec<Vec<u8>>,
    pub bag: NodeBag,
    pub witness_at: BlockId,
    pub witness_root: B256,
    pub storage: Vec<StorageBag>,
    pub codes: Vec<Vec<u8>>,
}

/// What became of one submitted transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    pub tx_hash: B256,
    /// Included in a block (successfully, or failed with a receipt).
    pub included: bool,
    pub succeeded: bool,
    /// Why it failed or was left out: a receipt's failure, or an abort's code such as
    /// `stale_witness`; empty when it succeeded.
    pub reason: String,
}

/// The block the submission's included transactions are in (none when it was abandoned),
/// and an outcome per transaction, in the submission's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmissionReply {
    pub block: Option<BlockId>,
    pub outcomes: Vec<TxOutcome>,
}

/// A block gossiped to the other miners, with the bag they need to verify it from their top
/// layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockAnnouncement {
    pub block: Block,
    pub bag: NodeBag,
    pub storage: Vec<StorageBag>,
    pub codes: Vec<Vec<u8>>,
}

/// A peer miner's judgement of an announced block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Verified by re-execution and stored.
    Accepted,
    Rejected(String),
}
