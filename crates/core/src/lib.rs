//! Shared vocabulary of Virga's crates: 32-byte hashes, keccak-256, nibble paths, and the
//! clocks that timestamp transactions.
//!
//! Everything here is pure (no I/O, no threads) except [`clock`], which reads the system time.

pub mod clock;
pub mod device;
pub mod nibbles;

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

/// Parses `0x`-prefixed (or bare) hex into bytes, naming what was wrong.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, HexError> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    if digits.len() % 2 == 1 {
        return Err(HexError::OddLength(text.len()));
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for (index, pair) in digits.as_bytes().chunks_exact(2).enumerate() {
        let high = hex_digit(pair[0]).ok_or(HexError::BadDigit(index * 2))?;
        let low = hex_digit(pair[1]).ok_or(HexError::BadDigit(index * 2 + 1))?;
        out.push(high << 4 | low);
    }
    Ok(out)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Formats bytes as `0x`-prefixed lowercase hex.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 15) as usize] as char);
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("hex string has an odd number of digits ({0} characters)")]
    OddLength(usize),
    #[error("not a hex digit at position {0}")]
    BadDigit(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_errors() {
        assert_eq!(parse_hex("0x00ff10").unwrap(), vec![0, 255, 16]);
        assert_eq!(to_hex(&[0, 255, 16]), "0x00ff10");
        assert_eq!(parse_hex("abc"), Err(HexError::OddLength(3)));
        assert_eq!(parse_hex("0xzz"), Err(HexError::BadDigit(0)));
    }

    #[test]
    fn constants_match_their_definitions() {
        assert_eq!(keccak256([]), KECCAK_EMPTY);
        assert_eq!(keccak256([0x80]), EMPTY_ROOT);
    }
}
