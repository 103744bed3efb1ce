//! Whatever-Ledger Consensus (ChainifyDB, seed 002 ch. 4): organizations execute a block
//! however their own databases do, then agree on its *effects*.
//!
//! - [`digest`]: the rows the digest triggers write ([`DigestRow`]), each hashed by the
//!   organization's execution server, and the block's digest hash over them in
//!   `[table, PK, serial]` order.
//! - [`ledger_block`]: the [`LedgerBlock`] (the transactions' SQL, a success bit each, the
//!   digest hash, the previous block's hash) and the check of a chain of them.
//! - [`messages`]: what flows before the vote, each signed: a client's [`Proposal`], an
//!   organization's [`ProposalBatch`] and the others' [`Agreement`]s on it, the agreed
//!   [`ChainedTx`] the ordering service orders, and its signed [`OrderedBlock`].
//! - [`wire`]: the pipeline servers' requests and responses and their bytes.
//! - [`vote`]: the c-of-k vote over the organizations' LedgerBlock hashes, and
//!   [`signed_vote`]: the signed votes it counts, checked before counting.
//!
//! All of it is pure: the databases, the servers and their messages live in
//! `virga-chainify`.

pub mod digest;
pub mod ledger_block;
pub mod messages;
pub mod signature_counts;
pub mod signed_vote;
pub mod vote;
pub mod wire;

pub use self::digest::{digest_hash, DigestOp, DigestRow};
pub use self::ledger_block::{verify_chain, ChainProblem, DecodeError, LedgerBlock};
pub use self::messages::{
    Agreement, BlockCut, ChainedTx, MessageError, OrderedBlock, Proposal, ProposalBatch, Refused,
};
pub use self::signature_counts::SignatureCounts;
pub use self::signed_vote::{counted_votes, SignedVote, VoteRefused};
pub use self::vote::{AgreementPolicy, PolicyError, VoteOutcome};

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// Feeds `bytes` to `hasher` after their length, so that no two sequences of fields hash
/// alike by shifting bytes from one field to the next.
fn update_field(hasher: &mut sha2::Sha256, bytes: &[u8]) {
    use sha2::Digest;
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}
