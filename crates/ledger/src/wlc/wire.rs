//! The requests and responses of ChainifyDB's pipeline (its servers are role cores in
//! `virga-chainify`), and their bytes: a kind tag, then the fields, every signed message in
//! its own encoding ([`super::messages`]), every count and length bounded. Decoding names
//! what is wrong ([`WireError`]); a peer's bytes reach a core only decoded.

use super::{Agreement, ChainedTx, Hash, MessageError, OrderedBlock, Proposal, ProposalBatch, SignedVote, VoteRefused};

/// What a client's transaction came to at its organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub client: String,
    pub seq: u64,
    /// The block it was executed in.
    pub block: u64,
    /// Whether it committed at the database (a SmallBank transaction whose condition fails
    /// is rolled back the same way at every organization).
    pub successful: bool,
}

/// What a commit server decided for its execution server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The organization's own LedgerBlock hash reached the policy.
    Commit,
    /// Another hash did: the organization recovers towards it.
    Recover { consensus: Hash },
}

/// The pipeline's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Client → its ChainifyServer.
    Propose(Proposal),
    /// ChainifyServer → another organization's ChainifyServer.
    Agree(ProposalBatch),
    /// ChainifyServer → orderer.
    Order(ChainedTx),
    /// Execution server → orderer: the blocks from `from` on (held until there is one).
    Fetch { from: u64 },
    /// Execution server → its commit server: its LedgerBlock hash for `block`, or none
    /// when its database failed to execute the block.
    Decide { block: u64, hash: Option<Hash> },
    /// Commit server → another organization's: its vote for `block`, if it has one.
    Vote { block: u64, vote: Option<SignedVote> },
    /// Execution server → its ChainifyServer: what the clients' transactions came to.
    Committed(Vec<Outcome>),
    /// Orderer replica → another: a batch of Raft messages, as the Raft layer encodes them
    /// (decoded and checked by the receiving replica, not here).
    Raft(Vec<u8>),
}

/// The pipeline's responses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Done(Outcome),
    Agreed(Agreement),
    Ordered,
    Blocks(Vec<OrderedBlock>),
    Decided(Decision),
    /// The callee's own vote for the block asked about, if it has voted.
    VoteAck(Option<SignedVote>),
    Ack,
    /// The request was refused; the reason names what was wrong.
    Refused(String),
    /// An orderer replica that does not lead: the leader it knows (empty when none).
    NotLeader(String),
}

/// The most blocks in one answer, outcomes in one notice, and bytes of one refusal.
pub const MAX_BLOCKS: usize = 64;
pub const MAX_OUTCOMES: usize = 1 << 20;
pub const MAX_REASON: usize = 4096;
/// The longest nested message (an ordered block of the largest batches).
pub const MAX_NESTED: usize = 256 << 20;
/// The longest orderer replica name in a redirect.
pub const MAX_LEADER_NAME: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the pipeline message is empty")]
    Empty,
    #[error("the pipeline message has kind {0}, which this build does not know")]
    UnknownKind(u8),
    #[error("the {kind} message ends inside its {field}")]
    Truncated { kind: &'static str, field: &'static str },
    #[error("the {kind} message's {field} claims {len}, more than {max}")]
    TooLong { kind: &'static str, field: &'static str, len: u64, max: usize },
    #[error("the {kind} message's {field} is not UTF-8")]
    NotUtf8 { kind: &'static str, field: &'static str },
    #[error("the {kind} message's {field} is {value}, not 0 or 1")]
    BadFlag { kind: &'static str, field: &'static str, value: u8 },
    #[error("{trailing} bytes follow the {kind} message")]
    Trailing { kind: &'static str, trailing: usize },
    #[error("the {kind} message: {error}")]
    Message { kind: &'static str, error: MessageError },
    #[error("the {kind} message's vote: {error}")]
    Vote { kind: &'static str, error: VoteRefused },
}

pub fn encode_request(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    match request {
        Request::Propose(proposal) => nested(&mut out, 1, &proposal.encode()),
        Request::Agree(batch) => nested(&mut out, 2, &batch.encode()),
        Request::Order(chained) => nested(&mut out, 3, &chained.encode()),
        Request::Fetch { from } => {
            out.push(4);
            out.extend(from.to_be_bytes());
        }
        Request::Decide { block, hash } => {
            out.push(5);
            out.extend(block.to_be_bytes());
            out.push(u8::from(hash.is_some()));
            if let Some(hash) = hash {
                out.extend(hash);
            }
        }
        Request::Vote { block, vote } => {
            out.push(6);
            out.extend(block.to_be_bytes());
            out.push(u8::from(vote.is_some()));
            if let Some(vote) = vote {
                put_bytes(&mut out, &vote.encode());
            }
        }
        Request::Raft(batch) => nested(&mut out, 8, batch),
        Request::Committed(outcomes) => {
            out.push(7);
            out.extend((outcomes.len() as u32).to_be_bytes());
            for outcome in outcomes {
                put_outcome(&mut out, outcome);
            }
        }
    }
    out
}

pub fn decode_request(bytes: &[u8]) -> Result<Request, WireError> {
    let (&tag, body) = bytes.split_first().ok_or(WireError::Empty)?;
    let kind = match tag {
        1 => "propose",
        2 => "agree",
        3 => "order",
        4 => "fetch",
        5 => "decide",
        6 => "vote",
        7 => "committed",
        8 => "raft",
        other => return Err(WireError::UnknownKind(other)),
    };
    let mut reader = Reader { kind, bytes: body, at: 0 };
    let message = |error| WireError::Message { kind, error };
    let request = match tag {
        1 => Request::Propose(Proposal::decode(reader.nested()?).map_err(message)?),
        2 => Request::Agree(ProposalBatch::decode(reader.nested()?).map_err(message)?),
        3 => Request::Order(ChainedTx::decode(reader.nested()?).map_err(message)?),
        4 => Request::Fetch { from: reader.u64("first block")? },
        5 => {
            let block = reader.u64("block")?;
            let hash = if reader.flag("hash flag")? { Some(reader.hash("hash")?) } else { None };
            Request::Decide { block, hash }
        }
        6 => {
            let block = reader.u64("block")?;
            let vote = if reader.flag("vote flag")? {
                Some(SignedVote::decode(reader.nested()?).map_err(|error| WireError::Vote { kind, error })?)
            } else {
                None
            };
            Request::Vote { block, vote }
        }
        8 => Request::Raft(reader.nested()?.to_vec()),
        _ => {
            let count = reader.count("outcome count", MAX_OUTCOMES)?;
            Request::Committed((0..count).map(|_| reader.outcome()).collect::<Result<_, _>>()?)
        }
    };
    reader.finish()?;
    Ok(request)
}

pub fn encode_response(response: &Response) -> Vec<u8> {
    let mut out = Vec::new();
    match response {
        Response::Done(outcome) => {
            out.push(1);
            put_outcome(&mut out, outcome);
        }
        Response::Agreed(agreement) => nested(&mut out, 2, &agreement.encode()),
        Response::Ordered => out.push(3),
        Response::Blocks(blocks) => {
            out.push(4);
            out.extend((blocks.len() as u32).to_be_bytes());
            for block in blocks {
                put_bytes(&mut out, &block.encode());
            }
        }
        Response::Decided(decision) => {
            out.push(5);
            match decision {
                Decision::Commit => out.push(0),
                Decision::Recover { consensus } => {
                    out.push(1);
                    out.extend(consensus);
                }
            }
        }
        Response::VoteAck(vote) => {
            out.push(6);
            out.push(u8::from(vote.is_some()));
            if let Some(vote) = vote {
                put_bytes(&mut out, &vote.encode());
            }
        }
        Response::Ack => out.push(7),
        Response::Refused(reason) => {
            out.push(8);
            put_bytes(&mut out, reason.as_bytes());
        }
        Response::NotLeader(leader) => {
            out.push(9);
            put_bytes(&mut out, leader.as_bytes());
        }
    }
    out
}

pub fn decode_response(bytes: &[u8]) -> Result<Response, WireError> {
    let (&tag, body) = bytes.split_first().ok_or(WireError::Empty)?;
    let kind = match tag {
        1 => "done",
        2 => "agreed",
        3 => "ordered",
        4 => "blocks",
        5 => "decided",
        6 => "vote-ack",
        7 => "ack",
        8 => "refused",
        9 => "not-leader",
        other => return Err(WireError::UnknownKind(other)),
    };
    let mut reader = Reader { kind, bytes: body, at: 0 };
    let message = |error| WireError::Message { kind, error };
    let response = match tag {
        1 => Response::Done(reader.outcome()?),
        2 => Response::Agreed(Agreement::decode(reader.nested()?).map_err(message)?),
        3 => Response::Ordered,
        4 => {
            let count = reader.count("block count", MAX_BLOCKS)?;
            let blocks = (0..count)
                .map(|_| OrderedBlock::decode(reader.nested()?).map_err(message))
                .collect::<Result<_, _>>()?;
            Response::Blocks(blocks)
        }
        5 => {
            if reader.flag("decision")? {
                Response::Decided(Decision::Recover { consensus: reader.hash("consensus hash")? })
            } else {
                Response::Decided(Decision::Commit)
            }
        }
        6 => {
            let vote = if reader.flag("vote flag")? {
                Some(SignedVote::decode(reader.nested()?).map_err(|error| WireError::Vote { kind, error })?)
            } else {
                None
            };
            Response::VoteAck(vote)
        }
        7 => Response::Ack,
        8 => Response::Refused(reader.text("reason", MAX_REASON)?),
        _ => Response::NotLeader(reader.text("leader", MAX_LEADER_NAME)?),
    };
    reader.finish()?;
    Ok(response)
}

fn nested(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_bytes(out, bytes);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u32).to_be_bytes());
    out.extend(bytes);
}

fn put_outcome(out: &mut Vec<u8>, outcome: &Outcome) {
    put_bytes(out, outcome.client.as_bytes());
    out.extend(outcome.seq.to_be_bytes());
    out.extend(outcome.block.to_be_bytes());
    out.push(u8::from(outcome.successful));
}

struct Reader<'a> {
    kind: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        let taken = self
            .bytes
            .get(self.at..self.at.saturating_add(len))
            .ok_or(WireError::Truncated { kind: self.kind, field })?;
        self.at += len;
        Ok(taken)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        let mut array = [0; 8];
        array.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_be_bytes(array))
    }

    fn hash(&mut self, field: &'static str) -> Result<[u8; 32], WireError> {
        let mut array = [0; 32];
        array.copy_from_slice(self.take(32, field)?);
        Ok(array)
    }

    fn flag(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.take(1, field)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(WireError::BadFlag { kind: self.kind, field, value }),
        }
    }

    fn count(&mut self, field: &'static str, max: usize) -> Result<usize, WireError> {
        let mut array = [0; 4];
        array.copy_from_slice(self.take(4, field)?);
        let count = u32::from_be_bytes(array);
        if count as usize > max {
            return Err(WireError::TooLong { kind: self.kind, field, len: u64::from(count), max });
        }
        Ok(count as usize)
    }

    /// A length-prefixed UTF-8 text of at most `max` bytes.
    fn text(&mut self, field: &'static str, max: usize) -> Result<String, WireError> {
        let len = self.count(field, max)?;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::NotUtf8 { kind: self.kind, field })
    }

    fn nested(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.count("nested length", MAX_NESTED)?;
        self.take(len, "nested message")
    }

    fn outcome(&mut self) -> Result<Outcome, WireError> {
        let len = self.count("client name length", super::messages::MAX_NAME)?;
        let client = String::from_utf8(self.take(len, "client name")?.to_vec())
            .map_err(|_| WireError::NotUtf8 { kind: self.kind, field: "client name" })?;
        let seq = self.u64("sequence number")?;
        let block = self.u64("block")?;
        let successful = self.flag("success")?;
        Ok(Outcome { client, seq, block, successful })
    }

    fn finish(self) -> Result<(), WireError> {
        if self.at != self.bytes.len() {
            return Err(WireError::Trailing { kind: self.kind, trailing: self.bytes.len() - self.at });
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
pub(crate) mod tests;
