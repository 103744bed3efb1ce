//! Blocks: an Ethereum header and a list of signed transactions.
//!
//! The encoding is Ethereum's block `[header, [tx, …], ommers]` with the ommers list always
//! present and always empty (`0xc0`), so an Ethereum decoder reads a Virga block as a block
//! without ommers or withdrawals, and `header.ommers_hash` is [`EMPTY_OMMER_ROOT_HASH`].
//! Each transaction appears in its body form: a legacy RLP list, or a typed transaction's
//! EIP-2718 bytes in an RLP string. The header is London's: it carries the base fee.
//!
//! Decoding checks the format only. Whether the roots, the work, the gas, the fees and the
//! state are right is for `verify`; in particular headers carrying post-London fields
//! (withdrawals and later) decode, and it is for verification to refuse them.

use alloy_consensus::Header;
use alloy_primitives::B256;
use alloy_rlp::{Decodable, Encodable, Header as RlpHeader, EMPTY_LIST_CODE};
use virga_trie::Trie;

pub use alloy_consensus::EMPTY_OMMER_ROOT_HASH;

use crate::tx::{SignedTx, TxError};

/// Why bytes are not a block.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The input held no bytes at all.
    #[error("empty input: expected an RLP-encoded block")]
    Empty,
    /// The outer structure is not valid RLP; the text is alloy's.
    #[error("malformed block RLP: {0}")]
    Rlp(alloy_rlp::Error),
    /// The input is an RLP string where the block list belongs.
    #[error("expected a block (an RLP list), found an RLP string")]
    NotAList,
    /// A whole block was decoded but bytes were left over.
    #[error("{0} trailing byte(s) after the block")]
    TrailingBytes(usize),
    /// The block list does not hold exactly a header, a transaction list and an ommers list.
    #[error("wrong block shape: {0}; expected [header, [transactions], []]")]
    Shape(&'static str),
    /// The header could not be decoded; the text is alloy's.
    #[error("malformed block header: {0}")]
    Header(alloy_rlp::Error),
    /// A transaction in the body could not be decoded.
    #[error("transaction {index}: {source}")]
    Transaction {
        /// Position of the transaction in the block.
        index: usize,
        /// What is wrong with it.
        source: TxError,
    },
    /// The ommers list holds something.
    #[error("the block has ommers ({0} byte(s)); Virga blocks have none")]
    Ommers(usize),
}

/// A block: its header and the transactions it orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The Ethereum header; `ommers_hash` is [`EMPTY_OMMER_ROOT_HASH`], the base fee is
    /// set and the fields after London's are `None`.
    pub header: Header,
    /// The transactions, in execution order.
    pub transactions: Vec<SignedTx>,
}

impl Block {
    /// The block hash: keccak-256 of the header's RLP.
    pub fn hash(&self) -> B256 {
        self.header.hash_slow()
    }

    /// The length of [`Block::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        self.list_header().length_with_payload()
    }

    /// The RLP encoding `[header, [tx, …], []]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the RLP encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.list_header().encode(out);
        self.header.encode(out);
        self.transactions_header().encode(out);
        for tx in &self.transactions {
            tx.encode_body(out);
        }
        out.push(EMPTY_LIST_CODE);
    }

    fn transactions_header(&self) -> RlpHeader {
        let payload_length = self.transactions.iter().map(SignedTx::body_len).sum();
        RlpHeader { list: true, payload_length }
    }

    fn list_header(&self) -> RlpHeader {
        // The trailing 1 is the empty ommers list.
        let payload_length = self.header.length() + self.transactions_header().length_with_payload() + 1;
        RlpHeader { list: true, payload_length }
    }

    /// Decodes a block that must span all of `bytes`. Never panics; every failure names
    /// the part of the block that is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Block, BlockError> {
        let mut rest = bytes;
        let payload = list_payload(&mut rest).map_err(|err| match err {
            ListError::Empty => BlockError::Empty,
            ListError::NotAList => BlockError::NotAList,
            ListError::Rlp(err) => BlockError::Rlp(err),
        })?;
        if !rest.is_empty() {
            return Err(BlockError::TrailingBytes(rest.len()));
        }

        let mut items = payload;
        if items.is_empty() {
            return Err(BlockError::Shape("the block list is empty"));
        }
        let header = Header::decode(&mut items).map_err(BlockError::Header)?;

        if items.is_empty() {
            return Err(BlockError::Shape("the transaction list is missing"));
        }
        let mut body = list_payload(&mut items).map_err(|err| match err {
            ListError::NotAList => BlockError::Shape("the transaction list is an RLP string"),
            ListError::Rlp(err) => BlockError::Rlp(err),
            ListError::Empty => BlockError::Shape("the transaction list is missing"),
        })?;
        let mut transactions = Vec::new();
        while !body.is_empty() {
            let index = transactions.len();
            let tx = SignedTx::decode_body(&mut body).map_err(|source| BlockError::Transaction { index, source })?;
            transactions.push(tx);
        }

        if items.is_empty() {
            return Err(BlockError::Shape("the ommers list is missing"));
        }
        let ommers = list_payload(&mut items).map_err(|err| match err {
            ListError::NotAList => BlockError::Shape("the ommers list is an RLP string"),
            ListError::Rlp(err) => BlockError::Rlp(err),
            ListError::Empty => BlockError::Shape("the ommers list is missing"),
        })?;
        if !ommers.is_empty() {
            return Err(BlockError::Ommers(ommers.len()));
        }
        if !items.is_empty() {
            return Err(BlockError::Shape("items follow the ommers list"));
        }
        Ok(Block { header, transactions })
    }
}

enum ListError {
    Empty,
    NotAList,
    Rlp(alloy_rlp::Error),
}

/// Splits an RLP list off the front of `buf`, returning its payload and advancing `buf`
/// past it.
fn list_payload<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], ListError> {
    if buf.is_empty() {
        return Err(ListError::Empty);
    }
    let header = RlpHeader::decode(buf).map_err(ListError::Rlp)?;
    if !header.list {
        return Err(ListError::NotAList);
    }
    // `RlpHeader::decode` has checked that the payload is present.
    let (payload, rest) =
        buf.split_at_checked(header.payload_length).ok_or(ListError::Rlp(alloy_rlp::Error::InputTooShort))?;
    *buf = rest;
    Ok(payload)
}

/// The root of the trie mapping RLP(index) to each transaction's EIP-2718 encoding, as in
/// Ethereum's `transactionsRoot`, computed with Virga's trie.
pub fn transactions_root(txs: &[SignedTx]) -> B256 {
    let mut trie = Trie::new();
    let mut key = Vec::with_capacity(9);
    for (index, tx) in txs.iter().enumerate() {
        key.clear();
        index.encode(&mut key);
        trie.insert(&key, &tx.encode());
    }
    trie.root_hash()
}

#[cfg(test)]
mod tests {
    use alloy_primitives::{Address, Bytes, U256};

    use super::*;
    use crate::tx::SigningKey;

    fn transfers(n: usize) -> Vec<SignedTx> {
        (0..n)
            .map(|i| {
                let key = SigningKey::from_seed(i as u64 % 7);
                let to = Address::with_last_byte(i as u8);
                if i % 3 == 2 {
                    // Typed transactions sit in bodies as RLP strings.
                    let tx = alloy_consensus::TxEip1559 {
                        chain_id: 1337,
                        nonce: i as u64,
                        gas_limit: 21_000,
                        max_fee_per_gas: 9,
                        max_priority_fee_per_gas: 1,
                        to: alloy_primitives::TxKind::Call(to),
                        value: U256::from(i),
                        ..Default::default()
                    };
                    SignedTx::sign_eip1559(&key, tx)
                } else {
                    SignedTx::sign(&key, i as u64, to, U256::from(i), 1, 21_000, Some(1337))
                }
            })
            .collect()
    }

    fn block(n: usize) -> Block {
        let transactions = transfers(n);
        let header = Header {
            parent_hash: B256::repeat_byte(1),
            beneficiary: Address::repeat_byte(2),
            state_root: B256::repeat_byte(3),
            transactions_root: transactions_root(&transactions),
            difficulty: U256::from(4096),
            number: 12,
            gas_limit: 30_000_000,
            gas_used: 21_000 * n as u64,
            timestamp: 1_700_000_000,
            extra_data: Bytes::from_static(b"virga"),
            base_fee_per_gas: Some(7),
            ..Header::default()
        };
        Block { header, transactions }
    }

    #[test]
    fn transactions_root_matches_alloy() {
        for n in [0, 1, 2, 16, 127, 128, 129, 300] {
            let txs = transfers(n);
            let signed: Vec<_> = txs.iter().map(|tx| tx.envelope().clone()).collect();
            let expected = alloy_consensus::proofs::calculate_transaction_root(&signed);
            assert_eq!(transactions_root(&txs), expected, "{n} transactions");
        }
        assert_eq!(transactions_root(&[]), alloy_consensus::EMPTY_ROOT_HASH);
    }

    #[test]
    fn round_trip() {
        for n in [0, 1, 3, 100] {
            let block = block(n);
            let bytes = block.encode();
            assert_eq!(bytes.len(), block.encoded_len());
            let decoded = Block::decode(&bytes).expect("decodes");
            assert_eq!(decoded, block);
            assert_eq!(decoded.hash(), block.header.hash_slow());
            assert_eq!(decoded.header.ommers_hash, EMPTY_OMMER_ROOT_HASH);
        }
    }

    #[test]
    fn encoding_is_an_ethereum_block_without_ommers() {
        let block = block(2);
        let consensus = alloy_consensus::Block {
            header: block.header.clone(),
            body: alloy_consensus::BlockBody {
                transactions: block.transactions.iter().map(|tx| tx.envelope().clone()).collect::<Vec<_>>(),
                ommers: Vec::new(),
                withdrawals: None,
            },
        };
        assert_eq!(alloy_rlp::encode(&consensus), block.encode());
    }

    fn expect_err(bytes: &[u8], expected: &str) {
        let err = Block::decode(bytes).expect_err("malformed");
        assert!(err.to_string().contains(expected), "{err} lacks {expected:?}");
    }

    #[test]
    fn malformed_blocks_say_what_is_wrong() {
        let good = block(2).encode();
        expect_err(&[], "empty input");
        expect_err(&good[..good.len() - 1], "input too short");
        expect_err(&[good.as_slice(), &[0]].concat(), "1 trailing byte");
        expect_err(&[0x82, 1, 2], "found an RLP string");
        expect_err(&[0xc0], "the block list is empty");
        expect_err(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], "malformed block RLP");
        expect_err(&[0xc2, 0xc0, 0xc0], "malformed block header");

        let header = block(0).header;
        let with = |rest: &[u8]| {
            let mut payload = alloy_rlp::encode(&header);
            payload.extend_from_slice(rest);
            let mut out = Vec::new();
            RlpHeader { list: true, payload_length: payload.len() }.encode(&mut out);
            out.extend_from_slice(&payload);
            out
        };
        expect_err(&with(&[]), "the transaction list is missing");
        expect_err(&with(&[0xc0]), "the ommers list is missing");
        expect_err(&with(&[0x80, 0xc0]), "the transaction list is an RLP string");
        expect_err(&with(&[0xc0, 0x80]), "the ommers list is an RLP string");
        expect_err(&with(&[0xc0, 0xc1, 0xc0]), "has ommers");
        expect_err(&with(&[0xc0, 0xc0, 0xc0]), "items follow the ommers list");
        // A typed transaction wrapped in a string whose payload is no transaction.
        expect_err(&with(&[0xc4, 0x83, 0x02, 0xc1, 0xc0, 0xc0]), "transaction 0: malformed transaction RLP");
        expect_err(&with(&[0xc2, 0x81, 0x90, 0xc0]), "transaction 0: malformed transaction RLP");
        expect_err(&with(&[0xc1, 0xc0, 0xc0]), "transaction 0: malformed transaction RLP");
        // A legacy transaction wrapped in a string behind type 0x00 (it would re-encode bare).
        let typed_legacy = [&[0x00], transfers(1)[0].encode().as_slice()].concat();
        let mut item = Vec::new();
        RlpHeader { list: false, payload_length: typed_legacy.len() }.encode(&mut item);
        item.extend_from_slice(&typed_legacy);
        let mut body = Vec::new();
        RlpHeader { list: true, payload_length: item.len() }.encode(&mut body);
        body.extend_from_slice(&item);
        body.push(0xc0);
        expect_err(&with(&body), "transaction 0: a legacy transaction behind type byte 0x00");
        let tx = transfers(1)[0].encode();
        let mut list = Vec::new();
        RlpHeader { list: true, payload_length: tx.len() + 1 }.encode(&mut list);
        list.extend_from_slice(&tx);
        list.push(0xc0);
        list.push(0xc0);
        expect_err(&with(&list), "transaction 1: malformed transaction RLP");
    }
}
