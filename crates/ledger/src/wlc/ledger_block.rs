//! The LedgerBlock: what the organizations agree on for each block, chained by hashes so
//! that the whole ledger is checked in one pass.

use sha2::{Digest, Sha256};

use super::{update_field, Hash};

/// One block's agreed outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerBlock {
    /// Blocks count from 0.
    pub number: u64,
    /// The SQL of each transaction, in block order.
    pub transactions: Vec<String>,
    /// Whether each transaction committed at the database: part of what is agreed.
    pub successful: Vec<bool>,
    /// The digest hash of the block's effects ([`super::digest_hash`]).
    pub digest: Hash,
    /// The hash of block `number - 1`; zeros for block 0.
    pub previous: Hash,
}

impl LedgerBlock {
    /// SHA-256 over every field (each variable-length one after its length).
    pub fn hash(&self) -> Hash {
        let mut hasher = Sha256::new();
        hasher.update(b"virga-wlc-ledger-block-v1");
        hasher.update(self.number.to_be_bytes());
        hasher.update(self.previous);
        hasher.update((self.transactions.len() as u64).to_be_bytes());
        for sql in &self.transactions {
            update_field(&mut hasher, sql.as_bytes());
        }
        let bits: Vec<u8> = self.successful.iter().map(|ok| u8::from(*ok)).collect();
        update_field(&mut hasher, &bits);
        hasher.update(self.digest);
        hasher.finalize().into()
    }
}

/// Where a chain of LedgerBlocks is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainProblem {
    #[error("block {at} is numbered {number}; blocks count from 0 without gaps")]
    Numbering { at: usize, number: u64 },
    #[error("block {number} does not chain to block {}: its previous hash is not that block's hash", number - 1)]
    Unchained { number: u64 },
    #[error("block 0 names a previous block; the first block's previous hash is zeros")]
    GenesisPrevious,
    #[error("block {number} has {transactions} transactions but {bits} success bits")]
    Bits { number: u64, transactions: usize, bits: usize },
}

/// Checks that `blocks` count from 0, each chains to the one before, and each has a success
/// bit per transaction.
pub fn verify_chain(blocks: &[LedgerBlock]) -> Result<(), ChainProblem> {
    let mut previous = [0u8; 32];
    for (at, block) in blocks.iter().enumerate() {
        if block.number != at as u64 {
            return Err(ChainProblem::Numbering { at, number: block.number });
        }
        if block.transactions.len() != block.successful.len() {
            return Err(ChainProblem::Bits {
                number: block.number,
                transactions: block.transactions.len(),
                bits: block.successful.len(),
            });
        }
        if block.previous != previous {
            return Err(if at == 0 {
                ChainProblem::GenesisPrevious
            } else {
                ChainProblem::Unchained { number: block.number }
            });
        }
        previous = block.hash();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(length: u64) -> Vec<LedgerBlock> {
        let mut blocks: Vec<LedgerBlock> = Vec::new();
        for number in 0..length {
            let previous = blocks.last().map_or([0; 32], LedgerBlock::hash);
            blocks.push(LedgerBlock {
                number,
                transactions: vec![format!("UPDATE checking SET bal = bal + 1 WHERE custid = {number}")],
                successful: vec![number % 2 == 0],
                digest: [number as u8; 32],
                previous,
            });
        }
        blocks
    }

    #[test]
    fn a_built_chain_verifies() {
        assert_eq!(verify_chain(&chain(5)), Ok(()));
        assert_eq!(verify_chain(&[]), Ok(()));
    }

    #[test]
    fn every_kind_of_break_is_named() {
        let mut flipped = chain(4);
        flipped[1].successful[0] = !flipped[1].successful[0];
        assert_eq!(verify_chain(&flipped), Err(ChainProblem::Unchained { number: 2 }));

        let mut edited = chain(4);
        edited[2].transactions[0].push(' ');
        assert_eq!(verify_chain(&edited), Err(ChainProblem::Unchained { number: 3 }));

        let mut renumbered = chain(3);
        renumbered.remove(1);
        assert_eq!(verify_chain(&renumbered), Err(ChainProblem::Numbering { at: 1, number: 2 }));

        let mut genesis = chain(2);
        genesis[0].previous = [1; 32];
        assert_eq!(verify_chain(&genesis), Err(ChainProblem::GenesisPrevious));

        let mut bits = chain(2);
        bits[1].successful.push(true);
        assert_eq!(verify_chain(&bits), Err(ChainProblem::Bits { number: 1, transactions: 1, bits: 2 }));
    }

    #[test]
    fn the_last_block_is_covered_by_its_own_hash() {
        // verify_chain cannot see a change to the newest block; its hash, which the vote
        // compares, does.
        let blocks = chain(3);
        let mut changed = blocks[2].clone();
        changed.digest[0] ^= 1;
        assert_ne!(changed.hash(), blocks[2].hash());
    }
}
