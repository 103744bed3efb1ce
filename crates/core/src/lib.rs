//! Shared vocabulary of Virga's crates: 32-byte hashes, keccak-256, nibble paths, and the
//! clocks that timestamp transactions.
//!
//! Everything here is pure (no I/O, no threads) except [`clock`], which reads the system time.

pub mod clock;
pub mod device;
pub mod nibbles;

/// Hex encoding and decoding (`hex::encode_prefixed`, `hex::decode`), re-exported so every crate
/// spells bytes the same way.
pub use alloy_primitives::hex;
pub use alloy_primitives::{keccak256, Address, Bytes, B256, U256};
pub use clock::{Clock, HybridClock, ManualClock, SkewProfile, SkewedClock, SystemClock};
pub use device::{Device, FaultPlan, FaultyStorage, FileStorage, MemStorage, Storage};
pub use nibbles::Nibbles;

/// keccak-256 of the empty string: the code hash of an account without code.
pub const KECCAK_EMPTY: B256 =
    alloy_primitives::b256!("c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470");

/// Root of the empty Merkle Patricia trie: keccak-256 of RLP("") = keccak(0x80).
pub const EMPTY_ROOT: B256 =
    alloy_primitives::b256!("56e81f171bcc55a6ff8345e692c0f86e5b48e01b996cadc001622fb5e363b421");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_their_definitions() {
        assert_eq!(keccak256([]), KECCAK_EMPTY);
        assert_eq!(keccak256([0x80]), EMPTY_ROOT);
    }
}
