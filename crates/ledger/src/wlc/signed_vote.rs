//! The vote an organization's commit server sends the others: its name, the block, the
//! hash of its LedgerBlock, signed with its secp256k1 key (membership is fixed, so every
//! organization knows every other's address). A vote is counted only after its signature,
//! signer and block are checked; one that fails is refused with the reason.

use std::collections::BTreeMap;

use alloy_primitives::{keccak256, Address, Signature, B256, U256};

use super::signature_counts::{recover, sign};
use super::Hash;
use crate::tx::{SigningKey, TxError};

const FORMAT: u8 = 1;
/// The longest organization name a vote may carry.
pub const MAX_NAME: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedVote {
    pub organization: String,
    pub block: u64,
    pub ledger_block_hash: Hash,
    pub signature: Signature,
}

/// Why bytes are not a vote, or why a vote is not counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VoteRefused {
    #[error("the vote ends inside its {0}")]
    Truncated(&'static str),
    #[error("the vote has format {0}; this build reads format {FORMAT}")]
    Format(u8),
    #[error("the vote's organization name is {0} bytes, more than {MAX_NAME}, or not UTF-8")]
    BadName(usize),
    #[error("{0} bytes follow the vote")]
    Trailing(usize),
    #[error("the vote's signature: {0}")]
    Signature(TxError),
    #[error("{0:?} is not an organization of the consortium")]
    Unknown(String),
    #[error("the vote claims to come from {organization:?} but is signed by {signer}")]
    WrongSigner { organization: String, signer: Address },
    #[error("the vote from {organization:?} is for block {got}, not block {expected} (replayed or late)")]
    WrongBlock { organization: String, expected: u64, got: u64 },
}

impl SignedVote {
    /// What is signed: a domain tag, then every field (the name after its length).
    fn digest(organization: &str, block: u64, ledger_block_hash: &Hash) -> B256 {
        let mut preimage = b"virga-wlc-vote-v1".to_vec();
        preimage.extend((organization.len() as u64).to_be_bytes());
        preimage.extend(organization.as_bytes());
        preimage.extend(block.to_be_bytes());
        preimage.extend(ledger_block_hash);
        keccak256(preimage)
    }

    pub fn sign(key: &SigningKey, organization: &str, block: u64, ledger_block_hash: Hash) -> SignedVote {
        let signature = sign(key, SignedVote::digest(organization, block, &ledger_block_hash));
        SignedVote { organization: organization.to_string(), block, ledger_block_hash, signature }
    }

    /// Checks the vote against the members' addresses and the block being decided.
    pub fn check(&self, members: &BTreeMap<String, Address>, block: u64) -> Result<(), VoteRefused> {
        let expected =
            members.get(&self.organization).ok_or_else(|| VoteRefused::Unknown(self.organization.clone()))?;
        let digest = SignedVote::digest(&self.organization, self.block, &self.ledger_block_hash);
        let signer = recover(digest, &self.signature).map_err(VoteRefused::Signature)?;
        if signer != *expected {
            return Err(VoteRefused::WrongSigner { organization: self.organization.clone(), signer });
        }
        if self.block != block {
            return Err(VoteRefused::WrongBlock {
                organization: self.organization.clone(),
                expected: block,
                got: self.block,
            });
        }
        Ok(())
    }

    /// Format, name (length and UTF-8), block, hash, and the signature's r, s and y parity.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT, self.organization.len() as u8];
        out.extend(self.organization.as_bytes());
        out.extend(self.block.to_be_bytes());
        out.extend(self.ledger_block_hash);
        out.extend(self.signature.r().to_be_bytes::<32>());
        out.extend(self.signature.s().to_be_bytes::<32>());
        out.push(u8::from(self.signature.v()));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SignedVote, VoteRefused> {
        let mut at = 0;
        let mut take = |len: usize, field: &'static str| {
            let taken = bytes.get(at..at + len).ok_or(VoteRefused::Truncated(field))?;
            at += len;
            Ok::<_, VoteRefused>(taken)
        };
        let format = take(1, "format")?[0];
        if format != FORMAT {
            return Err(VoteRefused::Format(format));
        }
        let len = usize::from(take(1, "name length")?[0]);
        let name = take(len, "organization name")?;
        let organization =
            std::str::from_utf8(name).ok().filter(|_| len <= MAX_NAME).ok_or(VoteRefused::BadName(len))?;
        let mut block = [0u8; 8];
        block.copy_from_slice(take(8, "block number")?);
        let mut ledger_block_hash = [0u8; 32];
        ledger_block_hash.copy_from_slice(take(32, "LedgerBlock hash")?);
        let r = U256::from_be_slice(take(32, "signature r")?);
        let s = U256::from_be_slice(take(32, "signature s")?);
        let parity = match take(1, "signature parity")?[0] {
            0 => false,
            1 => true,
            _ => return Err(VoteRefused::Signature(TxError::InvalidSignature("a y parity other than 0 or 1"))),
        };
        if at != bytes.len() {
            return Err(VoteRefused::Trailing(bytes.len() - at));
        }
        Ok(SignedVote {
            organization: organization.to_string(),
            block: u64::from_be_bytes(block),
            ledger_block_hash,
            signature: Signature::new(r, s, parity),
        })
    }
}

/// The votes to count for `block`: each checked, the first valid vote of each organization
/// kept, the others refused with their reasons.
pub fn counted_votes<'a>(
    votes: &'a [SignedVote],
    members: &BTreeMap<String, Address>,
    block: u64,
) -> (Vec<(&'a str, Hash)>, Vec<VoteRefused>) {
    let mut counted: Vec<(&str, Hash)> = Vec::new();
    let mut refused = Vec::new();
    for vote in votes {
        match vote.check(members, block) {
            Ok(()) if !counted.iter().any(|(name, _)| *name == vote.organization) => {
                counted.push((&vote.organization, vote.ledger_block_hash));
            }
            Ok(()) => {}
            Err(reason) => refused.push(reason),
        }
    }
    (counted, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> (Vec<SigningKey>, BTreeMap<String, Address>) {
        let keys: Vec<SigningKey> = (1..=3).map(SigningKey::from_seed).collect();
        let members = keys.iter().enumerate().map(|(at, key)| (format!("org-{}", at + 1), key.address())).collect();
        (keys, members)
    }

    #[test]
    fn signed_votes_are_counted_and_bad_ones_refused_by_name() {
        let (keys, members) = members();
        let good = SignedVote::sign(&keys[0], "org-1", 7, [1; 32]);
        assert_eq!(SignedVote::decode(&good.encode()), Ok(good.clone()));
        let forged = SignedVote::sign(&keys[2], "org-2", 7, [2; 32]);
        let replayed = SignedVote::sign(&keys[1], "org-2", 6, [1; 32]);
        let mut tampered = SignedVote::sign(&keys[2], "org-3", 7, [1; 32]);
        tampered.ledger_block_hash = [3; 32];
        let stranger = SignedVote::sign(&SigningKey::from_seed(9), "org-9", 7, [1; 32]);
        let twice = SignedVote::sign(&keys[0], "org-1", 7, [4; 32]);
        let votes = [good, forged, replayed, tampered, stranger, twice];
        let (counted, refused) = counted_votes(&votes, &members, 7);
        assert_eq!(counted, vec![("org-1", [1; 32])]);
        assert!(
            matches!(&refused[0], VoteRefused::WrongSigner { organization, signer } if organization == "org-2" && *signer == keys[2].address())
        );
        assert_eq!(refused[1], VoteRefused::WrongBlock { organization: "org-2".to_string(), expected: 7, got: 6 });
        assert!(
            matches!(&refused[2], VoteRefused::WrongSigner { organization, .. } if organization == "org-3"),
            "{:?}",
            refused[2]
        );
        assert_eq!(refused[3], VoteRefused::Unknown("org-9".to_string()));
        assert_eq!(refused.len(), 4, "a second vote of org-1 is ignored, not refused");
    }

    #[test]
    fn damaged_bytes_are_named() {
        let (keys, _) = members();
        let bytes = SignedVote::sign(&keys[0], "org-1", 7, [1; 32]).encode();
        for cut in 0..bytes.len() {
            assert!(matches!(SignedVote::decode(&bytes[..cut]), Err(VoteRefused::Truncated(_))), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(SignedVote::decode(&longer), Err(VoteRefused::Trailing(1)));
        let mut format = bytes.clone();
        format[0] = 9;
        assert_eq!(SignedVote::decode(&format), Err(VoteRefused::Format(9)));
        let mut name = bytes.clone();
        name[2] = 0xff;
        assert_eq!(SignedVote::decode(&name), Err(VoteRefused::BadName(5)));
        let mut parity = bytes.clone();
        *parity.last_mut().unwrap() = 2;
        assert!(matches!(SignedVote::decode(&parity), Err(VoteRefused::Signature(_))));
        let mut high_s = SignedVote::decode(&bytes).unwrap();
        high_s.signature = Signature::new(high_s.signature.r(), U256::MAX, false);
        let members = BTreeMap::from([("org-1".to_string(), keys[0].address())]);
        assert_eq!(high_s.check(&members, 7), Err(VoteRefused::Signature(TxError::HighS)));
    }
}
