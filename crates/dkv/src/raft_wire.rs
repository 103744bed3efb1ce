//! The configuration service's Raft messages: [`virga_raft::wire`]'s conversions and checks,
//! with the service's own rule for what an entry holds (a configuration proposal).

pub use virga_raft::wire::*;

use crate::proto;
use raft::eraftpb;

use crate::wire;

/// Checks a received message (see [`virga_raft::wire::message_from_wire`]); every appended
/// entry's data must decode as a configuration proposal.
pub fn message_from_wire(message: proto::RaftMessage, at: &Receiver) -> Result<eraftpb::Message, RaftWireError> {
    virga_raft::wire::message_from_wire(message, at, &check_proposal)
}

/// What an entry of the configuration service must hold: a configuration proposal.
pub(crate) fn check_proposal(data: &[u8]) -> Result<(), EntryRefusal> {
    wire::decode_proposal(data).map(drop).map_err(|error| EntryRefusal::new("a configuration proposal", error))
}
