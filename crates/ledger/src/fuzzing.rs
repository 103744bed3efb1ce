//! Bodies of the ledger's fuzz targets (`fuzz/fuzz_targets/tx_decode.rs` and
//! `block_decode.rs`), kept in the library so the regular test suite runs them too.
//!
//! Each panics only on a real bug: a decoder that panics, accepts bytes it would not
//! produce itself, or yields a value whose checks panic.

use alloy_primitives::keccak256;

use crate::block::{transactions_root, Block};
use crate::tx::{recover_all, SignedTx};

/// Any bytes through the transaction decoder: an error, or a transfer that re-encodes to
/// exactly the input, whose hash is the input's keccak and whose sender recovery returns.
pub fn tx_decode(data: &[u8]) {
    let Ok(tx) = SignedTx::decode(data) else {
        return;
    };
    assert_eq!(tx.encode(), data, "a decoded transaction re-encodes differently");
    assert_eq!(tx.encoded_len(), data.len());
    assert_eq!(tx.hash(), keccak256(data));
    let _ = tx.recover_sender();
}

/// Any bytes through the block decoder: an error, or a block that re-encodes to exactly
/// the input and whose senders and transaction root can be computed.
pub fn block_decode(data: &[u8]) {
    let Ok(block) = Block::decode(data) else {
        return;
    };
    assert_eq!(block.encode(), data, "a decoded block re-encodes differently");
    assert_eq!(block.encoded_len(), data.len());
    let _ = block.hash();
    assert_eq!(recover_all(&block.transactions).len(), block.transactions.len());
    let _ = transactions_root(&block.transactions);
}

/// Any bytes as a WLC LedgerBlock: a named error, or a block whose encoding is exactly the
/// input (one encoding per block) and whose chain of one verifies as the first block or not.
pub fn wlc_ledger_block(data: &[u8]) {
    let Ok(block) = crate::wlc::LedgerBlock::decode(data) else {
        return;
    };
    assert_eq!(block.encode(), data, "a decoded LedgerBlock re-encodes differently");
    assert_eq!(block.successful.len(), block.transactions.len());
    let _ = block.hash();
    let _ = crate::wlc::verify_chain(std::slice::from_ref(&block));
}

/// Any bytes as a WLC signed vote: a named error, or a vote that re-encodes to exactly the
/// input and whose check against a fixed membership names a reason or passes, never panics.
pub fn wlc_signed_vote(data: &[u8]) {
    let Ok(vote) = crate::wlc::SignedVote::decode(data) else {
        return;
    };
    assert_eq!(vote.encode(), data, "a decoded vote re-encodes differently");
    let members = std::collections::BTreeMap::from([
        ("org-1".to_string(), crate::tx::SigningKey::from_seed(1).address()),
        ("org-2".to_string(), crate::tx::SigningKey::from_seed(2).address()),
    ]);
    let _ = vote.check(&members, vote.block);
    let _ = crate::wlc::counted_votes(std::slice::from_ref(&vote), &members, 0);
}

/// Any bytes as one of ChainifyDB's signed pipeline messages, the first byte choosing which
/// (proposal, batch, agreement, chained batch, ordered block): a named error, or a message
/// that re-encodes to exactly the rest of the input and whose checks against fixed keys
/// name a reason or pass, never panic.
pub fn wlc_messages(data: &[u8]) {
    use crate::wlc::{Agreement, ChainedTx, OrderedBlock, Proposal, ProposalBatch};
    let Some((kind, bytes)) = data.split_first() else {
        return;
    };
    let key = crate::tx::SigningKey::from_seed(1);
    let known = std::collections::BTreeMap::from([("org-1".to_string(), key.address())]);
    match kind % 5 {
        0 => {
            if let Ok(proposal) = Proposal::decode(bytes) {
                assert_eq!(proposal.encode(), bytes, "a decoded proposal re-encodes differently");
                let _ = proposal.check(&known);
            }
        }
        1 => {
            if let Ok(batch) = ProposalBatch::decode(bytes) {
                assert_eq!(batch.encode(), bytes, "a decoded batch re-encodes differently");
                let _ = batch.hash();
            }
        }
        2 => {
            if let Ok(agreement) = Agreement::decode(bytes) {
                assert_eq!(agreement.encode(), bytes, "a decoded agreement re-encodes differently");
                let _ = agreement.check(&known, &agreement.batch);
            }
        }
        3 => {
            if let Ok(chained) = ChainedTx::decode(bytes) {
                assert_eq!(chained.encode(), bytes, "a decoded chained batch re-encodes differently");
                let _ = chained.check(&known, 1);
            }
        }
        _ => {
            if let Ok(block) = OrderedBlock::decode(bytes) {
                assert_eq!(block.encode(), bytes, "a decoded ordered block re-encodes differently");
                let _ = block.check(key.address());
                assert_eq!(
                    block.proposals().count(),
                    block.batches.iter().map(|b| b.batch.proposals.len()).sum::<usize>()
                );
            }
        }
    }
}

/// Any bytes as a ChainifyDB pipeline request (first byte even) or response (odd): a named
/// `WireError`, or a message that re-encodes to exactly the rest of the input.
pub fn wlc_wire(data: &[u8]) {
    use crate::wlc::wire::{decode_request, decode_response, encode_request, encode_response};
    let Some((kind, bytes)) = data.split_first() else {
        return;
    };
    if kind % 2 == 0 {
        if let Ok(request) = decode_request(bytes) {
            assert_eq!(encode_request(&request), bytes, "a decoded request re-encodes differently");
        }
    } else if let Ok(response) = decode_response(bytes) {
        assert_eq!(encode_response(&response), bytes, "a decoded response re-encodes differently");
    }
}

#[cfg(test)]
mod tests {
    use alloy_consensus::Header;
    use alloy_primitives::{Address, U256};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::*;
    use crate::tx::SigningKey;

    fn sample_block() -> Block {
        let transactions = (0..3u64)
            .map(|i| {
                let key = SigningKey::from_seed(i);
                let chain_id = if i == 0 { None } else { Some(i) };
                SignedTx::sign(&key, i, Address::with_last_byte(9), U256::from(i), 2, 21_000, chain_id)
            })
            .collect::<Vec<_>>();
        let header = Header {
            transactions_root: transactions_root(&transactions),
            difficulty: U256::from(1),
            number: 1,
            ..Header::default()
        };
        Block { header, transactions }
    }

    /// Random bytes rarely get past the first RLP header, so most cases mutate valid
    /// encodings: flipped bytes, truncation, insertion and deletion.
    fn mutate(rng: &mut StdRng, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..rng.random_range(1..4) {
            let len = data.len();
            match rng.random_range(0..5) {
                0 if len > 0 => data[rng.random_range(0..len)] ^= 1 << rng.random_range(0..8),
                1 if len > 0 => data[rng.random_range(0..len)] = rng.random(),
                2 => data.truncate(rng.random_range(0..=len)),
                3 => data.insert(rng.random_range(0..=len), rng.random()),
                _ if len > 0 => {
                    data.remove(rng.random_range(0..len));
                }
                _ => {}
            }
        }
        data
    }

    #[test]
    fn smoke_tx_decode() {
        let mut rng = StdRng::seed_from_u64(1);
        let block = sample_block();
        let seeds: Vec<Vec<u8>> = block.transactions.iter().map(SignedTx::encode).collect();
        for seed in &seeds {
            tx_decode(seed);
        }
        // The tracked seeds of `fuzz/seeds/tx_decode` (inputs the fuzzer found worth keeping).
        let tracked = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/tx_decode");
        for entry in std::fs::read_dir(tracked).unwrap() {
            tx_decode(&std::fs::read(entry.unwrap().path()).unwrap());
        }
        for _ in 0..3000 {
            let seed = &seeds[rng.random_range(0..seeds.len())];
            tx_decode(&mutate(&mut rng, seed));
            let len = rng.random_range(0..120);
            tx_decode(&(0..len).map(|_| rng.random()).collect::<Vec<u8>>());
        }
    }

    #[test]
    fn smoke_block_decode() {
        let mut rng = StdRng::seed_from_u64(2);
        let seed = sample_block().encode();
        block_decode(&seed);
        for _ in 0..2000 {
            block_decode(&mutate(&mut rng, &seed));
        }
        for _ in 0..2000 {
            let len = rng.random_range(0..64);
            block_decode(&(0..len).map(|_| rng.random()).collect::<Vec<u8>>());
        }
    }

    #[test]
    fn smoke_wlc_ledger_block() {
        let mut rng = StdRng::seed_from_u64(3);
        let seed = crate::wlc::LedgerBlock {
            number: 4,
            transactions: vec![
                "UPDATE checking SET bal = bal + 1 WHERE custid = 3".to_string(),
                "SELECT 1".to_string(),
            ],
            successful: vec![true, false],
            digest: [5; 32],
            previous: [6; 32],
        }
        .encode();
        wlc_ledger_block(&seed);
        for _ in 0..2000 {
            wlc_ledger_block(&mutate(&mut rng, &seed));
        }
    }

    #[test]
    fn smoke_wlc_signed_vote() {
        let mut rng = StdRng::seed_from_u64(4);
        let seed = crate::wlc::SignedVote::sign(&crate::tx::SigningKey::from_seed(1), "org-1", 3, [9; 32]).encode();
        wlc_signed_vote(&seed);
        for _ in 0..500 {
            wlc_signed_vote(&mutate(&mut rng, &seed));
        }
    }

    #[test]
    fn smoke_wlc_messages() {
        use crate::wlc::{Agreement, ChainedTx, OrderedBlock, Proposal, ProposalBatch};
        let mut rng = StdRng::seed_from_u64(5);
        let key = SigningKey::from_seed(1);
        let proposal = Proposal::sign(&key, "client-1", 1, vec!["UPDATE t SET v = 1 WHERE k = 2".to_string()]);
        let batch = ProposalBatch { origin: "org-1".to_string(), number: 1, proposals: vec![proposal.clone()] };
        let agreement = Agreement::sign(&key, "org-1", batch.hash());
        let chained = ChainedTx { batch: batch.clone(), agreements: vec![agreement.clone()] };
        let block = OrderedBlock::sign(&key, 2, [3; 32], vec![chained.clone()]);
        let seeds = [proposal.encode(), batch.encode(), agreement.encode(), chained.encode(), block.encode()];
        for (kind, seed) in seeds.iter().enumerate() {
            let framed: Vec<u8> = std::iter::once(kind as u8).chain(seed.iter().copied()).collect();
            wlc_messages(&framed);
            for _ in 0..300 {
                wlc_messages(&mutate(&mut rng, &framed));
            }
        }
    }

    #[test]
    fn smoke_wlc_wire() {
        use crate::wlc::wire::{encode_request, encode_response};
        let mut rng = StdRng::seed_from_u64(6);
        let (requests, responses) = crate::wlc::wire::tests::samples();
        let framed = requests
            .iter()
            .map(|request| std::iter::once(0).chain(encode_request(request)).collect::<Vec<u8>>())
            .chain(responses.iter().map(|response| std::iter::once(1).chain(encode_response(response)).collect()));
        for seed in framed {
            wlc_wire(&seed);
            for _ in 0..200 {
                wlc_wire(&mutate(&mut rng, &seed));
            }
        }
    }
}
