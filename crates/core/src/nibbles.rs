//! Nibble paths and Ethereum's hex-prefix (compact) encoding of them.

/// The `index`-th 4-bit nibble of `key`, high nibble first.
#[inline(always)]
pub fn nibble_at(key: &[u8], index: usize) -> u8 {
    let byte = key[index / 2];
    if index.is_multiple_of(2) {
        byte >> 4
    } else {
        byte & 0x0f
    }
}

/// A path of nibbles, one nibble per byte (values 0..=15).
///
/// Used where paths are built or compared; nodes store their paths packed
/// (two nibbles per byte) to save memory.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nibbles(Vec<u8>);

impl Nibbles {
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// Every nibble of `bytes`, high nibble first.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut out = Vec::with_capacity(bytes.len() * 2);
        for byte in bytes {
            out.push(byte >> 4);
            out.push(byte & 0x0f);
        }
        Self(out)
    }

    /// Wraps nibbles; every element must be below 16.
    pub fn from_nibbles(nibbles: Vec<u8>) -> Self {
        assert!(nibbles.iter().all(|n| *n < 16), "nibble out of range");
        Self(nibbles)
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn push(&mut self, nibble: u8) {
        debug_assert!(nibble < 16);
        self.0.push(nibble);
    }

    pub fn extend_from_slice(&mut self, nibbles: &[u8]) {
        self.0.extend_from_slice(nibbles);
    }

    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    /// Packs an even-length path back into bytes; `None` for odd lengths.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        if self.0.len() % 2 == 1 {
            return None;
        }
        Some(self.0.chunks_exact(2).map(|pair| pair[0] << 4 | pair[1]).collect())
    }
}

impl std::fmt::Debug for Nibbles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nibbles(")?;
        for nibble in &self.0 {
            write!(f, "{nibble:x}")?;
        }
        write!(f, ")")
    }
}

/// Hex-prefix encoding (Ethereum yellow paper, appendix C): a flag nibble
/// (2 for leaves, +1 for odd length) followed by the nibbles, packed.
pub fn encode_hex_prefix(nibbles: &[u8], is_leaf: bool, out: &mut Vec<u8>) {
    let flag = if is_leaf { 2 } else { 0 };
    let odd = nibbles.len() % 2 == 1;
    let rest = if odd {
        out.push((flag + 1) << 4 | nibbles[0]);
        &nibbles[1..]
    } else {
        out.push(flag << 4);
        nibbles
    };
    for pair in rest.chunks_exact(2) {
        out.push(pair[0] << 4 | pair[1]);
    }
}

/// Decodes a hex-prefix path into `(nibbles, is_leaf)`, or `None` if the flag is invalid.
pub fn decode_hex_prefix(bytes: &[u8]) -> Option<(Vec<u8>, bool)> {
    let (&first, rest) = bytes.split_first()?;
    let flag = first >> 4;
    if flag > 3 {
        return None;
    }
    let is_leaf = flag & 2 != 0;
    let odd = flag & 1 != 0;
    let mut nibbles = Vec::with_capacity(rest.len() * 2 + 1);
    if odd {
        nibbles.push(first & 0x0f);
    } else if first & 0x0f != 0 {
        return None;
    }
    for byte in rest {
        nibbles.push(byte >> 4);
        nibbles.push(byte & 0x0f);
    }
    Some((nibbles, is_leaf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_prefix_matches_the_yellow_paper_examples() {
        let cases: [(&[u8], bool, &[u8]); 4] = [
            (&[1, 2, 3, 4, 5], false, &[0x11, 0x23, 0x45]),
            (&[0, 1, 2, 3, 4, 5], false, &[0x00, 0x01, 0x23, 0x45]),
            (&[0, 15, 1, 12, 11, 8], true, &[0x20, 0x0f, 0x1c, 0xb8]),
            (&[15, 1, 12, 11, 8], true, &[0x3f, 0x1c, 0xb8]),
        ];
        for (nibbles, leaf, encoded) in cases {
            let mut out = Vec::new();
            encode_hex_prefix(nibbles, leaf, &mut out);
            assert_eq!(out, encoded);
            assert_eq!(decode_hex_prefix(encoded), Some((nibbles.to_vec(), leaf)));
        }
    }

    #[test]
    fn invalid_hex_prefix_flags_are_rejected() {
        assert_eq!(decode_hex_prefix(&[0x40]), None);
        assert_eq!(decode_hex_prefix(&[0x01]), None);
        assert_eq!(decode_hex_prefix(&[]), None);
    }

    #[test]
    fn nibble_access() {
        let key = [0xab, 0xcd];
        let all: Vec<u8> = (0..4).map(|i| nibble_at(&key, i)).collect();
        assert_eq!(all, vec![0xa, 0xb, 0xc, 0xd]);
        assert_eq!(Nibbles::from_bytes(&key).as_slice(), &all[..]);
        assert_eq!(Nibbles::from_bytes(&key).to_bytes(), Some(key.to_vec()));
    }
}
