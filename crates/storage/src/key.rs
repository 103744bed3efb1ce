//! Keys as hash indexes store and compare them.

/// The hasher of Virga's key indexes: fast, seeded per process.
pub type KeyHasher = foldhash::fast::RandomState;

const INLINE_KEY: usize = 24;

/// A key as a hash index holds it. Keys up to 24 bytes are held inline, zero-padded, so
/// probing compares three words instead of chasing a pointer and calling `memcmp` (the
/// index lookup is most of a short transaction's time).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InlineKey {
    /// A key of at most 24 bytes.
    Inline {
        /// Its length.
        len: u8,
        /// Its bytes, zero-padded.
        bytes: [u8; INLINE_KEY],
    },
    /// A longer key.
    Heap(Box<[u8]>),
}

impl InlineKey {
    /// The index form of `key`.
    #[inline]
    pub fn new(key: &[u8]) -> InlineKey {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            InlineKey::Inline { len: key.len() as u8, bytes }
        } else {
            InlineKey::Heap(key.into())
        }
    }
}
