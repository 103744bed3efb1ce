//! The messages of ChainifyDB's pipeline before the vote, each signed by its author:
//!
//! - [`Proposal`]: a client's transaction (its SQL statements) with the client's name and
//!   sequence number, signed by the client;
//! - [`ProposalBatch`] and [`Agreement`]: an organization's ChainifyServer gathers its
//!   clients' proposals into a batch and asks the other organizations to agree to it; each
//!   agreement signs the batch's hash, so a signature covers a batch, not one transaction;
//! - [`ChainedTx`]: a batch with the agreements the agreement policy asks for, as the
//!   ordering service receives it;
//! - [`OrderedBlock`]: the ordering service's block of chained batches, signed by it and
//!   chained to the block before.
//!
//! (The vote, `CommitBlock` in the seed, is [`super::SignedVote`].) Each message has one
//! encoding, decoded with every length bounded and every error named ([`MessageError`]),
//! and a `check` that a receiver runs before using it ([`Refused`]).

use std::collections::{BTreeMap, BTreeSet};

use alloy_primitives::{keccak256, Address, Signature, B256, U256};

use super::signature_counts::{recover, sign};
use super::Hash;
use crate::tx::{SigningKey, TxError};

/// The encoding's version byte, first in every message.
const FORMAT: u8 = 1;
/// The longest client or organization name.
pub const MAX_NAME: usize = 64;
/// The most statements in one proposal, and the longest statement.
pub const MAX_STATEMENTS: usize = 64;
pub const MAX_STATEMENT: usize = 16 * 1024;
/// The most proposals in one batch, agreements on one batch, and batches in one block.
pub const MAX_PROPOSALS: usize = 4096;
pub const MAX_AGREEMENTS: usize = 64;
pub const MAX_BATCHES: usize = 4096;

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("the {message} ends after {at} bytes, inside its {field}")]
    Truncated { message: &'static str, at: usize, field: &'static str },
    #[error("the {message} has format {format}; this build reads format {FORMAT}")]
    Format { message: &'static str, format: u8 },
    #[error("the {message}'s {field} claims {len}, more than {max}")]
    TooLong { message: &'static str, field: &'static str, len: u64, max: usize },
    #[error("the {message}'s {field} is not UTF-8")]
    NotUtf8 { message: &'static str, field: &'static str },
    #[error("the {message}'s signature has a y parity of {parity}, not 0 or 1")]
    Parity { message: &'static str, parity: u8 },
    #[error("{trailing} bytes follow the {message}")]
    Trailing { message: &'static str, trailing: usize },
}

/// Why a well-formed message is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the {message}'s signature: {error}")]
    Signature { message: &'static str, error: TxError },
    #[error("the {message} names {name:?}, which is not a {role} of the consortium")]
    Unknown { message: &'static str, name: String, role: &'static str },
    #[error("the {message} claims to come from {name:?} but is signed by {signer}")]
    WrongSigner { message: &'static str, name: String, signer: Address },
    #[error("the batch's agreement from {organization:?} is for another batch")]
    OtherBatch { organization: String },
    #[error("the batch has agreements from {have} organizations; the policy asks for {need}")]
    NotAgreed { have: usize, need: usize },
    #[error("the proposal holds no statement")]
    Empty,
    #[error("the proposal's {field} is {len}, more than {max}")]
    TooLarge { field: &'static str, len: usize, max: usize },
}

/// A client's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub client: String,
    /// Counts the client's proposals from 1; a server refuses one it has seen (a replay).
    pub seq: u64,
    pub statements: Vec<String>,
    pub signature: Signature,
}

/// An organization's batch of its clients' proposals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalBatch {
    /// The organization whose ChainifyServer formed the batch.
    pub origin: String,
    /// Counts the origin's batches; with the origin it names the batch in logs.
    pub number: u64,
    pub proposals: Vec<Proposal>,
}

/// An organization's signature on a batch's hash: it checked every proposal in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    pub organization: String,
    pub batch: Hash,
    pub signature: Signature,
}

/// A batch and its agreements, as the ordering service receives and orders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedTx {
    pub batch: ProposalBatch,
    pub agreements: Vec<Agreement>,
}

/// A block the ordering service cut, signed by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderedBlock {
    /// Blocks count from 0.
    pub number: u64,
    /// [`OrderedBlock::hash`] of block `number - 1`; zeros for block 0.
    pub previous: Hash,
    pub batches: Vec<ChainedTx>,
    pub signature: Signature,
}

fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u64).to_be_bytes());
    out.extend(bytes);
}

fn signer(message: &'static str, digest: B256, signature: &Signature) -> Result<Address, Refused> {
    recover(digest, signature).map_err(|error| Refused::Signature { message, error })
}

fn check_signer(
    message: &'static str,
    role: &'static str,
    name: &str,
    digest: B256,
    signature: &Signature,
    known: &BTreeMap<String, Address>,
) -> Result<(), Refused> {
    let expected = known.get(name).ok_or_else(|| Refused::Unknown { message, name: name.to_string(), role })?;
    let signer = signer(message, digest, signature)?;
    if signer != *expected {
        return Err(Refused::WrongSigner { message, name: name.to_string(), signer });
    }
    Ok(())
}

impl Proposal {
    fn digest(client: &str, seq: u64, statements: &[String]) -> B256 {
        let mut preimage = b"virga-wlc-proposal-v1".to_vec();
        put_field(&mut preimage, client.as_bytes());
        preimage.extend(seq.to_be_bytes());
        preimage.extend((statements.len() as u64).to_be_bytes());
        for statement in statements {
            put_field(&mut preimage, statement.as_bytes());
        }
        keccak256(preimage)
    }

    pub fn sign(key: &SigningKey, client: &str, seq: u64, statements: Vec<String>) -> Proposal {
        let signature = sign(key, Proposal::digest(client, seq, &statements));
        Proposal { client: client.to_string(), seq, statements, signature }
    }

    /// Signed by the client it names, one of `clients`, and not empty.
    pub fn check(&self, clients: &BTreeMap<String, Address>) -> Result<(), Refused> {
        if self.statements.is_empty() {
            return Err(Refused::Empty);
        }
        let longest = self.statements.iter().map(String::len).max().unwrap_or(0);
        for (field, len, max) in [
            ("client name", self.client.len(), MAX_NAME),
            ("statement count", self.statements.len(), MAX_STATEMENTS),
            ("longest statement", longest, MAX_STATEMENT),
        ] {
            if len > max {
                return Err(Refused::TooLarge { field, len, max });
            }
        }
        let digest = Proposal::digest(&self.client, self.seq, &self.statements);
        check_signer("proposal", "client", &self.client, digest, &self.signature, clients)
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_name(out, &self.client);
        out.extend(self.seq.to_be_bytes());
        out.extend((self.statements.len() as u16).to_be_bytes());
        for statement in &self.statements {
            out.extend((statement.len() as u32).to_be_bytes());
            out.extend(statement.as_bytes());
        }
        put_signature(out, &self.signature);
    }

    fn take(reader: &mut Reader) -> Result<Proposal, MessageError> {
        let client = reader.name("client name")?;
        let seq = reader.u64("sequence number")?;
        let count = reader.count16("statement count", MAX_STATEMENTS)?;
        let mut statements = Vec::with_capacity(count);
        for _ in 0..count {
            let len = reader.count32("statement length", MAX_STATEMENT)?;
            statements.push(reader.text(len, "statement")?);
        }
        let signature = reader.signature()?;
        Ok(Proposal { client, seq, statements, signature })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_with(|out| self.put(out))
    }

    pub fn decode(bytes: &[u8]) -> Result<Proposal, MessageError> {
        decode_with("proposal", bytes, Proposal::take)
    }
}

impl ProposalBatch {
    /// Keccak over the origin, the number and every proposal's bytes (signature included):
    /// what an agreement signs.
    pub fn hash(&self) -> Hash {
        let mut preimage = b"virga-wlc-batch-v1".to_vec();
        self.put(&mut preimage);
        keccak256(preimage).0
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_name(out, &self.origin);
        out.extend(self.number.to_be_bytes());
        out.extend((self.proposals.len() as u32).to_be_bytes());
        for proposal in &self.proposals {
            proposal.put(out);
        }
    }

    fn take(reader: &mut Reader) -> Result<ProposalBatch, MessageError> {
        let origin = reader.name("origin name")?;
        let number = reader.u64("batch number")?;
        let count = reader.count32("proposal count", MAX_PROPOSALS)?;
        let proposals = (0..count).map(|_| Proposal::take(reader)).collect::<Result<_, _>>()?;
        Ok(ProposalBatch { origin, number, proposals })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_with(|out| self.put(out))
    }

    pub fn decode(bytes: &[u8]) -> Result<ProposalBatch, MessageError> {
        decode_with("proposal batch", bytes, ProposalBatch::take)
    }
}

impl Agreement {
    fn digest(organization: &str, batch: &Hash) -> B256 {
        let mut preimage = b"virga-wlc-agreement-v1".to_vec();
        put_field(&mut preimage, organization.as_bytes());
        preimage.extend(batch);
        keccak256(preimage)
    }

    pub fn sign(key: &SigningKey, organization: &str, batch: Hash) -> Agreement {
        let signature = sign(key, Agreement::digest(organization, &batch));
        Agreement { organization: organization.to_string(), batch, signature }
    }

    /// Signed by the member it names, for the batch whose hash is `batch`.
    pub fn check(&self, members: &BTreeMap<String, Address>, batch: &Hash) -> Result<(), Refused> {
        if self.batch != *batch {
            return Err(Refused::OtherBatch { organization: self.organization.clone() });
        }
        let digest = Agreement::digest(&self.organization, &self.batch);
        check_signer("agreement", "organization", &self.organization, digest, &self.signature, members)
    }

    fn put(&self, out: &mut Vec<u8>) {
        put_name(out, &self.organization);
        out.extend(self.batch);
        put_signature(out, &self.signature);
    }

    fn take(reader: &mut Reader) -> Result<Agreement, MessageError> {
        let organization = reader.name("organization name")?;
        let batch = reader.hash("batch hash")?;
        let signature = reader.signature()?;
        Ok(Agreement { organization, batch, signature })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_with(|out| self.put(out))
    }

    pub fn decode(bytes: &[u8]) -> Result<Agreement, MessageError> {
        decode_with("agreement", bytes, Agreement::take)
    }
}

impl ChainedTx {
    /// At least `need` distinct members agreed to the batch, each agreement checked; the
    /// first bad agreement is named. (The agreeing organizations checked the clients'
    /// signatures; a receiver of a chained batch checks the agreements alone.)
    pub fn check(&self, members: &BTreeMap<String, Address>, need: usize) -> Result<(), Refused> {
        let hash = self.batch.hash();
        let mut agreed = BTreeSet::new();
        for agreement in &self.agreements {
            agreement.check(members, &hash)?;
            agreed.insert(agreement.organization.as_str());
        }
        if agreed.len() < need {
            return Err(Refused::NotAgreed { have: agreed.len(), need });
        }
        Ok(())
    }

    fn put(&self, out: &mut Vec<u8>) {
        self.batch.put(out);
        out.push(self.agreements.len() as u8);
        for agreement in &self.agreements {
            agreement.put(out);
        }
    }

    fn take(reader: &mut Reader) -> Result<ChainedTx, MessageError> {
        let batch = ProposalBatch::take(reader)?;
        let count = usize::from(reader.bytes(1, "agreement count")?[0]);
        if count > MAX_AGREEMENTS {
            return Err(reader.too_long("agreement count", count as u64, MAX_AGREEMENTS));
        }
        let agreements = (0..count).map(|_| Agreement::take(reader)).collect::<Result<_, _>>()?;
        Ok(ChainedTx { batch, agreements })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_with(|out| self.put(out))
    }

    pub fn decode(bytes: &[u8]) -> Result<ChainedTx, MessageError> {
        decode_with("chained transaction", bytes, ChainedTx::take)
    }
}

impl OrderedBlock {
    fn digest(number: u64, previous: &Hash, batches: &[ChainedTx]) -> B256 {
        let mut preimage = b"virga-wlc-ordered-block-v1".to_vec();
        preimage.extend(number.to_be_bytes());
        preimage.extend(previous);
        preimage.extend((batches.len() as u64).to_be_bytes());
        for chained in batches {
            preimage.extend(chained.batch.hash());
        }
        keccak256(preimage)
    }

    pub fn sign(key: &SigningKey, number: u64, previous: Hash, batches: Vec<ChainedTx>) -> OrderedBlock {
        let signature = sign(key, OrderedBlock::digest(number, &previous, &batches));
        OrderedBlock { number, previous, batches, signature }
    }

    /// What the next block names as its previous: the signed digest (number, previous and
    /// the batches' hashes; the agreements are checked on their own).
    pub fn hash(&self) -> Hash {
        OrderedBlock::digest(self.number, &self.previous, &self.batches).0
    }

    /// Signed by the ordering service, whose address is `orderer`.
    pub fn check(&self, orderer: Address) -> Result<(), Refused> {
        let digest = OrderedBlock::digest(self.number, &self.previous, &self.batches);
        let signer = signer("ordered block", digest, &self.signature)?;
        if signer != orderer {
            return Err(Refused::WrongSigner { message: "ordered block", name: "the orderer".to_string(), signer });
        }
        Ok(())
    }

    /// The block's transactions in order: every proposal of every batch.
    pub fn proposals(&self) -> impl Iterator<Item = &Proposal> {
        self.batches.iter().flat_map(|chained| &chained.batch.proposals)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        out.extend(self.number.to_be_bytes());
        out.extend(self.previous);
        out.extend((self.batches.len() as u32).to_be_bytes());
        for chained in &self.batches {
            chained.put(&mut out);
        }
        put_signature(&mut out, &self.signature);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<OrderedBlock, MessageError> {
        let mut reader = Reader::open("ordered block", bytes)?;
        let number = reader.u64("block number")?;
        let previous = reader.hash("previous hash")?;
        let count = reader.count32("batch count", MAX_BATCHES)?;
        let batches = (0..count).map(|_| ChainedTx::take(&mut reader)).collect::<Result<_, _>>()?;
        let signature = reader.signature()?;
        reader.finish()?;
        Ok(OrderedBlock { number, previous, batches, signature })
    }
}

/// The batches of one block as an ordering service replicates them before the block is
/// numbered, chained and signed (a Raft entry: every replica derives the same block from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockCut {
    pub batches: Vec<ChainedTx>,
}

impl BlockCut {
    pub fn encode(&self) -> Vec<u8> {
        encode_with(|out| {
            out.extend((self.batches.len() as u32).to_be_bytes());
            for chained in &self.batches {
                chained.put(out);
            }
        })
    }

    pub fn decode(bytes: &[u8]) -> Result<BlockCut, MessageError> {
        decode_with("block cut", bytes, |reader| {
            let count = reader.count32("batch count", MAX_BATCHES)?;
            let batches = (0..count).map(|_| ChainedTx::take(reader)).collect::<Result<_, _>>()?;
            Ok(BlockCut { batches })
        })
    }
}

/// A message's bytes: the format byte, then what `put` writes.
fn encode_with(put: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = vec![FORMAT];
    put(&mut out);
    out
}

/// A message from exactly `bytes`: the format byte, what `take` reads, and nothing after.
fn decode_with<T>(
    message: &'static str,
    bytes: &[u8],
    take: impl FnOnce(&mut Reader) -> Result<T, MessageError>,
) -> Result<T, MessageError> {
    let mut reader = Reader::open(message, bytes)?;
    let value = take(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    out.push(name.len() as u8);
    out.extend(name.as_bytes());
}

fn put_signature(out: &mut Vec<u8>, signature: &Signature) {
    out.extend(signature.r().to_be_bytes::<32>());
    out.extend(signature.s().to_be_bytes::<32>());
    out.push(u8::from(signature.v()));
}

/// Reads one message's fields in order, naming the field where the bytes end or go wrong.
struct Reader<'a> {
    message: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn open(message: &'static str, bytes: &'a [u8]) -> Result<Reader<'a>, MessageError> {
        let mut reader = Reader { message, bytes, at: 0 };
        let format = reader.bytes(1, "format")?[0];
        if format != FORMAT {
            return Err(MessageError::Format { message, format });
        }
        Ok(reader)
    }

    fn bytes(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], MessageError> {
        let taken = self.bytes.get(self.at..self.at.saturating_add(len)).ok_or(MessageError::Truncated {
            message: self.message,
            at: self.bytes.len(),
            field,
        })?;
        self.at += len;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], MessageError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.bytes(N, field)?);
        Ok(array)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, MessageError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    fn hash(&mut self, field: &'static str) -> Result<Hash, MessageError> {
        self.array(field)
    }

    fn too_long(&self, field: &'static str, len: u64, max: usize) -> MessageError {
        MessageError::TooLong { message: self.message, field, len, max }
    }

    fn count16(&mut self, field: &'static str, max: usize) -> Result<usize, MessageError> {
        let count = u16::from_be_bytes(self.array(field)?);
        if usize::from(count) > max {
            return Err(self.too_long(field, u64::from(count), max));
        }
        Ok(usize::from(count))
    }

    fn count32(&mut self, field: &'static str, max: usize) -> Result<usize, MessageError> {
        let count = u32::from_be_bytes(self.array(field)?);
        if count as usize > max {
            return Err(self.too_long(field, u64::from(count), max));
        }
        Ok(count as usize)
    }

    fn text(&mut self, len: usize, field: &'static str) -> Result<String, MessageError> {
        let bytes = self.bytes(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| MessageError::NotUtf8 { message: self.message, field })
    }

    fn name(&mut self, field: &'static str) -> Result<String, MessageError> {
        let len = usize::from(self.bytes(1, field)?[0]);
        if len > MAX_NAME {
            return Err(self.too_long(field, len as u64, MAX_NAME));
        }
        self.text(len, field)
    }

    fn signature(&mut self) -> Result<Signature, MessageError> {
        let r = U256::from_be_bytes(self.array::<32>("signature r")?);
        let s = U256::from_be_bytes(self.array::<32>("signature s")?);
        let parity = self.bytes(1, "signature parity")?[0];
        if parity > 1 {
            return Err(MessageError::Parity { message: self.message, parity });
        }
        Ok(Signature::new(r, s, parity == 1))
    }

    fn finish(self) -> Result<(), MessageError> {
        if self.at != self.bytes.len() {
            return Err(MessageError::Trailing { message: self.message, trailing: self.bytes.len() - self.at });
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "messages_tests.rs"]
mod tests;
