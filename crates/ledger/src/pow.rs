//! Simulated proof of work: a keccak-256 puzzle whose expected cost is `difficulty`
//! hashes, standing in for Ethash so that block production has a tunable, real cost.
//!
//! A header carries valid work when
//! - `mix_hash` equals its seal hash (the header's hash with `nonce` and `mix_hash`
//!   zeroed), and
//! - keccak-256(seal hash ‖ nonce as 8 big-endian bytes), read as a big-endian number, is
//!   at most `U256::MAX / difficulty`.
//!
//! Requiring `mix_hash` to be the seal hash leaves no header field outside the work:
//! otherwise anyone could change `mix_hash` and obtain a second valid block with another
//! hash.

use alloy_consensus::Header;
use alloy_primitives::{keccak256, B256, B64, U256};

/// Why a header's work is not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    /// Difficulty zero admits no target.
    #[error("difficulty is zero, which no work can meet")]
    ZeroDifficulty,
    /// `mix_hash` is not the header's seal hash.
    #[error("mix_hash {found} is not the header's seal hash {expected}")]
    MixHash {
        /// The seal hash.
        expected: B256,
        /// The header's `mix_hash`.
        found: B256,
    },
    /// The nonce's hash is above the target.
    #[error("nonce {nonce:#018x} does not meet difficulty {difficulty}")]
    InsufficientWork {
        /// The header's difficulty.
        difficulty: U256,
        /// The header's nonce.
        nonce: u64,
    },
}

/// keccak-256 of the header's RLP with `nonce` and `mix_hash` zeroed: everything the work
/// commits to.
pub fn seal_hash(header: &Header) -> B256 {
    let mut unsealed = header.clone();
    unsealed.nonce = B64::ZERO;
    unsealed.mix_hash = B256::ZERO;
    unsealed.hash_slow()
}

/// Whether the header's work is valid (see [`check_work`] for the reason when not).
pub fn work_ok(header: &Header) -> bool {
    check_work(header).is_ok()
}

/// Checks the header's work, naming what is wrong: difficulty zero, a `mix_hash` that is
/// not the seal hash, or a nonce whose hash misses the difficulty's target.
pub fn check_work(header: &Header) -> Result<(), PowError> {
    let target = target(header.difficulty).ok_or(PowError::ZeroDifficulty)?;
    let seal = seal_hash(header);
    if header.mix_hash != seal {
        return Err(PowError::MixHash { expected: seal, found: header.mix_hash });
    }
    let nonce = u64::from_be_bytes(header.nonce.0);
    if meets(&seal, nonce, target) {
        Ok(())
    } else {
        Err(PowError::InsufficientWork { difficulty: header.difficulty, nonce })
    }
}

/// Searches nonces from `start_nonce` upwards (wrapping) until the work is valid, then
/// sets `header.nonce` and `header.mix_hash` (to the seal hash). Returns the number of
/// nonces tried, about `difficulty` on average.
///
/// Difficulty zero has no solution: the header is left unchanged and 0 is returned. Any
/// other difficulty terminates, though a huge one takes correspondingly long.
pub fn mine(header: &mut Header, start_nonce: u64) -> u64 {
    let Some(target) = target(header.difficulty) else {
        return 0;
    };
    let seal = seal_hash(header);
    let mut nonce = start_nonce;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        if meets(&seal, nonce, target) {
            header.nonce = B64::from(nonce.to_be_bytes());
            header.mix_hash = seal;
            return attempts;
        }
        nonce = nonce.wrapping_add(1);
    }
}

fn target(difficulty: U256) -> Option<U256> {
    U256::MAX.checked_div(difficulty)
}

fn meets(seal: &B256, nonce: u64, target: U256) -> bool {
    let mut preimage = [0u8; 40];
    preimage[..32].copy_from_slice(seal.as_slice());
    preimage[32..].copy_from_slice(&nonce.to_be_bytes());
    U256::from_be_bytes(keccak256(preimage).0) <= target
}

#[cfg(test)]
mod tests {
    use alloy_primitives::{Address, Bloom, Bytes};

    use super::*;

    fn header(difficulty: u64) -> Header {
        Header {
            parent_hash: B256::repeat_byte(0x11),
            beneficiary: Address::repeat_byte(0x22),
            state_root: B256::repeat_byte(0x33),
            difficulty: U256::from(difficulty),
            number: 5,
            gas_limit: 8_000_000,
            gas_used: 42_000,
            timestamp: 1_600_000_000,
            extra_data: Bytes::from_static(b"pow test"),
            ..Header::default()
        }
    }

    #[test]
    fn difficulty_one_passes_at_the_first_nonce() {
        let mut h = header(1);
        assert_eq!(mine(&mut h, 12345), 1);
        assert_eq!(u64::from_be_bytes(h.nonce.0), 12345);
        assert_eq!(h.mix_hash, seal_hash(&h));
        assert!(work_ok(&h));
        assert_eq!(check_work(&h), Ok(()));
    }

    #[test]
    fn mining_at_256_and_4096_verifies() {
        for difficulty in [256, 4096] {
            let mut h = header(difficulty);
            let attempts = mine(&mut h, 0);
            assert!(attempts >= 1);
            assert!(work_ok(&h), "difficulty {difficulty}");
            // The nonce found is the first that works: every earlier one fails.
            let found = u64::from_be_bytes(h.nonce.0);
            assert_eq!(found + 1, attempts);
            if found > 0 {
                let mut earlier = h.clone();
                earlier.nonce = B64::from((found - 1).to_be_bytes());
                assert!(!work_ok(&earlier));
            }
        }
    }

    #[test]
    fn zero_difficulty_is_invalid() {
        let mut h = header(0);
        assert_eq!(mine(&mut h, 0), 0);
        h.mix_hash = seal_hash(&h);
        assert!(!work_ok(&h));
        let err = check_work(&h).expect_err("zero");
        assert!(err.to_string().contains("difficulty is zero"));
    }

    #[test]
    fn insufficient_work_names_the_difficulty() {
        let mut h = header(4096);
        mine(&mut h, 0);
        let good = u64::from_be_bytes(h.nonce.0);
        // Whichever nonce fails first after the good one gives a deterministic error.
        let mut bad = h.clone();
        let failing = (1..)
            .map(|step| {
                bad.nonce = B64::from(good.wrapping_add(step).to_be_bytes());
                check_work(&bad)
            })
            .find_map(Result::err)
            .expect("a failing nonce exists");
        assert!(failing.to_string().contains("difficulty 4096"), "{failing}");
    }

    type Change = fn(&mut Header);

    #[test]
    fn changing_any_field_after_mining_breaks_the_work() {
        let mut sealed = header(4096);
        mine(&mut sealed, 0);
        assert!(work_ok(&sealed));
        let changes: [(&str, Change); 13] = [
            ("parent_hash", |h| h.parent_hash.0[0] ^= 1),
            ("ommers_hash", |h| h.ommers_hash.0[31] ^= 1),
            ("beneficiary", |h| h.beneficiary.0[0] ^= 1),
            ("state_root", |h| h.state_root.0[0] ^= 1),
            ("transactions_root", |h| h.transactions_root.0[0] ^= 1),
            ("receipts_root", |h| h.receipts_root.0[0] ^= 1),
            ("logs_bloom", |h| h.logs_bloom = Bloom::repeat_byte(1)),
            ("difficulty", |h| h.difficulty += U256::from(1)),
            ("number", |h| h.number += 1),
            ("gas_limit", |h| h.gas_limit += 1),
            ("gas_used", |h| h.gas_used += 1),
            ("timestamp", |h| h.timestamp += 1),
            ("extra_data", |h| h.extra_data = Bytes::from_static(b"pow tesu")),
        ];
        for (field, change) in changes {
            let mut changed = sealed.clone();
            change(&mut changed);
            // Always true: the seal hash commits to the field, and mix_hash must equal it.
            assert_ne!(seal_hash(&changed), sealed.mix_hash, "{field}");
            assert!(matches!(check_work(&changed), Err(PowError::MixHash { .. })), "{field}");
            // Even a forger who refreshes mix_hash keeps a nonce that meets the new seal's
            // target with probability 1/4096; the inputs are fixed, so this outcome is too.
            changed.mix_hash = seal_hash(&changed);
            assert!(!work_ok(&changed), "{field}: the old nonce still works");
        }
        let mut changed = sealed.clone();
        changed.mix_hash.0[0] ^= 1;
        assert!(!work_ok(&changed), "mix_hash");
    }
}
