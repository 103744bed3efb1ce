//! The c-of-k vote of the LedgerConsensus phase: each organization counts the LedgerBlock
//! hashes of all k organizations, its own included, and commits only if some hash occurs at
//! least c times and equals its own.

use std::collections::BTreeMap;

use super::Hash;

/// How many of the organizations must hold the same effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgreementPolicy {
    /// c: the hashes that must agree.
    pub agree: usize,
    /// k: the organizations voting.
    pub of: usize,
}

/// A policy that cannot decide safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("a policy of {agree} of {of}: at least one organization must vote")]
    Empty { agree: usize, of: usize },
    #[error(
        "a policy of {agree} of {of}: more than half must agree (at least {}), or two different effects could \
         both be committed",
        of / 2 + 1
    )]
    NoMajority { agree: usize, of: usize },
    #[error("a policy of {agree} of {of}: more agreements than organizations")]
    TooMany { agree: usize, of: usize },
}

/// What an organization does with a round of votes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoteOutcome {
    /// Its own hash reached the policy: it appends the block.
    Commit { hash: Hash, votes: usize },
    /// Another hash reached the policy: its effects differ, and it recovers towards that one.
    Recover { consensus: Hash, votes: usize },
    /// No hash reached the policy (yet): with every vote in, every organization recovers.
    Undecided { heard: usize },
}

impl AgreementPolicy {
    /// Any c of k. c must be a majority of k, so that at most one set of effects can reach it.
    pub fn new(agree: usize, of: usize) -> Result<AgreementPolicy, PolicyError> {
        if of == 0 || agree == 0 {
            return Err(PolicyError::Empty { agree, of });
        }
        if agree > of {
            return Err(PolicyError::TooMany { agree, of });
        }
        if 2 * agree <= of {
            return Err(PolicyError::NoMajority { agree, of });
        }
        Ok(AgreementPolicy { agree, of })
    }

    /// The outcome for an organization whose hash is `own`, given the hashes heard from the
    /// organizations (by name; its own among them or not, it is counted once). Names beyond
    /// k are the caller's to refuse; a name heard twice counts once.
    pub fn decide<'a>(
        &self,
        own_name: &'a str,
        own: Hash,
        heard: impl IntoIterator<Item = (&'a str, Hash)>,
    ) -> VoteOutcome {
        let mut by_org: BTreeMap<&str, Hash> = BTreeMap::new();
        by_org.insert(own_name, own);
        for (name, hash) in heard {
            by_org.entry(name).or_insert(hash);
        }
        let mut counts: BTreeMap<Hash, usize> = BTreeMap::new();
        for hash in by_org.values() {
            *counts.entry(*hash).or_insert(0) += 1;
        }
        let winner = counts.iter().find(|(_, count)| **count >= self.agree).map(|(hash, count)| (*hash, *count));
        match winner {
            Some((hash, votes)) if hash == own => VoteOutcome::Commit { hash, votes },
            Some((consensus, votes)) => VoteOutcome::Recover { consensus, votes },
            None => VoteOutcome::Undecided { heard: by_org.len() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Hash = [1; 32];
    const B: Hash = [2; 32];

    #[test]
    fn any_two_of_three() {
        let policy = AgreementPolicy::new(2, 3).unwrap();
        assert_eq!(policy.decide("o1", A, [("o2", A)]), VoteOutcome::Commit { hash: A, votes: 2 });
        assert_eq!(policy.decide("o3", B, [("o1", A), ("o2", A)]), VoteOutcome::Recover { consensus: A, votes: 2 });
        assert_eq!(policy.decide("o1", A, [("o2", B)]), VoteOutcome::Undecided { heard: 2 });
        assert_eq!(policy.decide("o1", A, [("o2", B), ("o3", [3; 32])]), VoteOutcome::Undecided { heard: 3 });
    }

    #[test]
    fn a_repeated_or_self_vote_counts_once() {
        let policy = AgreementPolicy::new(2, 3).unwrap();
        assert_eq!(policy.decide("o1", A, [("o1", A), ("o1", A)]), VoteOutcome::Undecided { heard: 1 });
        assert_eq!(policy.decide("o1", A, [("o2", A), ("o2", B)]), VoteOutcome::Commit { hash: A, votes: 2 });
        // An organization's own vote is its own hash, whatever a message claims it sent.
        assert_eq!(policy.decide("o1", A, [("o1", B), ("o2", B)]), VoteOutcome::Undecided { heard: 2 });
    }

    #[test]
    fn all_three() {
        let policy = AgreementPolicy::new(3, 3).unwrap();
        assert_eq!(policy.decide("o1", A, [("o2", A)]), VoteOutcome::Undecided { heard: 2 });
        assert_eq!(policy.decide("o1", A, [("o2", A), ("o3", A)]), VoteOutcome::Commit { hash: A, votes: 3 });
    }

    #[test]
    fn policies_without_a_majority_are_refused() {
        assert_eq!(AgreementPolicy::new(1, 2), Err(PolicyError::NoMajority { agree: 1, of: 2 }));
        assert_eq!(AgreementPolicy::new(2, 4), Err(PolicyError::NoMajority { agree: 2, of: 4 }));
        assert_eq!(AgreementPolicy::new(4, 3), Err(PolicyError::TooMany { agree: 4, of: 3 }));
        assert_eq!(AgreementPolicy::new(0, 3), Err(PolicyError::Empty { agree: 0, of: 3 }));
        assert!(AgreementPolicy::new(1, 1).is_ok());
    }
}
