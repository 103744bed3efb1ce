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

/// The encoding's version byte.
const FORMAT: u8 = 1;
/// The most transactions a block may hold, and the longest SQL text of one, that a decoder
/// accepts: a length field beyond them is damage, not a reason to allocate.
pub const MAX_TRANSACTIONS: usize = 1 << 20;
pub const MAX_SQL: usize = 1 << 20;

/// Why bytes are not a LedgerBlock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the LedgerBlock ends after {at} bytes, inside its {field}")]
    Truncated { at: usize, field: &'static str },
    #[error("the LedgerBlock has format {0}; this build reads format {FORMAT}")]
    Format(u8),
    #[error("the LedgerBlock claims {0} transactions, more than {MAX_TRANSACTIONS}")]
    TooManyTransactions(u64),
    #[error("transaction {index} of the LedgerBlock claims {len} bytes of SQL, more than {MAX_SQL}")]
    SqlTooLong { index: usize, len: u64 },
    #[error("transaction {index} of the LedgerBlock is not UTF-8")]
    NotUtf8 { index: usize },
    #[error("the LedgerBlock's success bits set bits past its {count} transactions")]
    StrayBits { count: usize },
    #[error("{0} bytes follow the LedgerBlock")]
    Trailing(usize),
}

impl LedgerBlock {
    /// The block's bytes: version, number, previous hash, digest, the transactions (count,
    /// then each as length and UTF-8), and the success bits packed eight to a byte.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        out.extend(self.number.to_be_bytes());
        out.extend(self.previous);
        out.extend(self.digest);
        out.extend((self.transactions.len() as u64).to_be_bytes());
        for sql in &self.transactions {
            out.extend((sql.len() as u64).to_be_bytes());
            out.extend(sql.as_bytes());
        }
        let mut bits = vec![0u8; self.transactions.len().div_ceil(8)];
        for (index, ok) in self.successful.iter().enumerate().take(self.transactions.len()) {
            if *ok {
                bits[index / 8] |= 1 << (index % 8);
            }
        }
        out.extend(bits);
        out
    }

    /// The block `bytes` hold, or what is wrong with them.
    pub fn decode(bytes: &[u8]) -> Result<LedgerBlock, DecodeError> {
        let mut reader = Reader { bytes, at: 0 };
        let format = reader.take(1, "format")?[0];
        if format != FORMAT {
            return Err(DecodeError::Format(format));
        }
        let number = reader.u64("number")?;
        let previous = reader.hash("previous hash")?;
        let digest = reader.hash("digest hash")?;
        let count = reader.u64("transaction count")?;
        let count = usize::try_from(count)
            .ok()
            .filter(|count| *count <= MAX_TRANSACTIONS)
            .ok_or(DecodeError::TooManyTransactions(count))?;
        let mut transactions = Vec::with_capacity(count.min(1024));
        for index in 0..count {
            let len = reader.u64("transaction length")?;
            let len = usize::try_from(len)
                .ok()
                .filter(|len| *len <= MAX_SQL)
                .ok_or(DecodeError::SqlTooLong { index, len })?;
            let sql =
                std::str::from_utf8(reader.take(len, "transaction")?).map_err(|_| DecodeError::NotUtf8 { index })?;
            transactions.push(sql.to_string());
        }
        let bits = reader.take(count.div_ceil(8), "success bits")?;
        let successful: Vec<bool> = (0..count).map(|index| bits[index / 8] & (1 << (index % 8)) != 0).collect();
        // Bits past the last transaction would give two encodings of one block.
        if count % 8 != 0 && bits.last().is_some_and(|last| last >> (count % 8) != 0) {
            return Err(DecodeError::StrayBits { count });
        }
        if reader.at != bytes.len() {
            return Err(DecodeError::Trailing(bytes.len() - reader.at));
        }
        Ok(LedgerBlock { number, transactions, successful, digest, previous })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(len).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or(DecodeError::Truncated { at: self.bytes.len(), field })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_be_bytes(word))
    }

    fn hash(&mut self, field: &'static str) -> Result<Hash, DecodeError> {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(self.take(32, field)?);
        Ok(hash)
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
    fn blocks_round_trip_and_damage_is_named() {
        for block in chain(4).into_iter().chain([LedgerBlock {
            number: 9,
            transactions: (0..11).map(|i| format!("SELECT {i} -- é")).collect(),
            successful: (0..11).map(|i| i % 3 != 0).collect(),
            digest: [7; 32],
            previous: [8; 32],
        }]) {
            let bytes = block.encode();
            assert_eq!(LedgerBlock::decode(&bytes), Ok(block.clone()));
            for cut in 0..bytes.len() {
                assert!(
                    matches!(LedgerBlock::decode(&bytes[..cut]), Err(DecodeError::Truncated { .. })),
                    "cut at {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(LedgerBlock::decode(&longer), Err(DecodeError::Trailing(1)));
        }
        let mut bytes = chain(1)[0].encode();
        bytes[0] = 2;
        assert_eq!(LedgerBlock::decode(&bytes), Err(DecodeError::Format(2)));
        let mut stray = chain(1)[0].encode();
        *stray.last_mut().unwrap() |= 0b10;
        assert_eq!(LedgerBlock::decode(&stray), Err(DecodeError::StrayBits { count: 1 }));
        let mut huge = chain(1)[0].encode();
        huge[73..81].copy_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(LedgerBlock::decode(&huge), Err(DecodeError::TooManyTransactions(u64::MAX)));
        let mut not_utf8 = chain(1)[0].encode();
        not_utf8[89] = 0xff;
        assert_eq!(LedgerBlock::decode(&not_utf8), Err(DecodeError::NotUtf8 { index: 0 }));
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
