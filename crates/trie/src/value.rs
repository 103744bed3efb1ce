//! How leaves store their values.
//!
//! Most leaves of a state trie hold an externally owned account: the RLP list
//! `[nonce, balance, EMPTY_ROOT, KECCAK_EMPTY]`, whose last 66 bytes are always the same.
//! Such a value is stored as its first two RLP items only and expanded again whenever it
//! is read or hashed, which makes a million-account trie about a quarter smaller. Every
//! other value is stored as is. A value is stored compactly only if expanding the compact
//! form gives back exactly the same bytes, so the codec can never change a root.

use std::borrow::Cow;

use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};

use crate::rlp;

const RAW: u8 = 0;
const ACCOUNT: u8 = 1;

/// The 66 bytes every code-less, storage-less account ends with.
fn account_tail() -> [u8; 66] {
    let mut tail = [0u8; 66];
    tail[0] = rlp::HASH_HEADER;
    tail[1..33].copy_from_slice(EMPTY_ROOT.as_slice());
    tail[33] = rlp::HASH_HEADER;
    tail[34..].copy_from_slice(KECCAK_EMPTY.as_slice());
    tail
}

/// Appends the stored form of `value`.
pub(crate) fn store<S: crate::path::ByteSink + std::ops::Deref<Target = [u8]>>(value: &[u8], out: &mut S) {
    if let Some(items) = account_items(value) {
        // `account_items` accepts exactly what `expand` reproduces only for canonical
        // headers; check the round trip before committing to the compact form.
        if expand(items) == value {
            out.push_byte(ACCOUNT);
            out.extend_bytes(items);
            return;
        }
    }
    out.push_byte(RAW);
    out.extend_bytes(value);
}

/// The nonce and balance items of an account value whose storage root and code hash
/// are the empty ones; `None` for anything else.
fn account_items(value: &[u8]) -> Option<&[u8]> {
    let tail = account_tail();
    let (&first, _) = value.split_first()?;
    let header_len = match first {
        0xc0..=0xf7 => 1,
        0xf8 => 2,
        _ => return None,
    };
    if value.len() < header_len + tail.len() || !value.ends_with(&tail) {
        return None;
    }
    let items = &value[header_len..value.len() - tail.len()];
    // Exactly two short strings (nonce ≤ 8 bytes, balance ≤ 32 bytes) must remain.
    let mut rest = items;
    for max in [8usize, 32] {
        let (&head, _) = rest.split_first()?;
        let len = match head {
            0x00..=0x7f => 0,
            0x80..=0xb7 => (head - 0x80) as usize,
            _ => return None,
        };
        if len > max || rest.len() < 1 + len {
            return None;
        }
        rest = &rest[1 + len..];
    }
    rest.is_empty().then_some(items)
}

/// The full account RLP of compactly stored items.
fn expand(items: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.len() + 70);
    let start = rlp::begin_list(&mut out);
    out.extend_from_slice(items);
    out.extend_from_slice(&account_tail());
    rlp::end_list(&mut out, start);
    out
}

/// The value a stored form holds.
pub(crate) fn load(stored: &[u8]) -> Cow<'_, [u8]> {
    match stored.split_first() {
        Some((&ACCOUNT, items)) => Cow::Owned(expand(items)),
        Some((_, raw)) => Cow::Borrowed(raw),
        None => Cow::Borrowed(&[]),
    }
}

/// Whether `stored` holds exactly `value`.
pub(crate) fn holds(stored: &[u8], value: &[u8]) -> bool {
    match stored.split_first() {
        // The same items are not enough: the list header must be the canonical one the
        // expansion writes, or a differently encoded value would pass for this one.
        Some((&ACCOUNT, items)) => {
            value.len() == items.len() + 68
                && value[..2] == [0xf8, (items.len() + 66) as u8]
                && account_items(value) == Some(items)
        }
        Some((_, raw)) => raw == value,
        None => value.is_empty(),
    }
}

/// Appends the RLP string of the value a stored form holds (an expanded account is
/// written in place: its list payload is always 66 to 108 bytes long).
pub(crate) fn append_rlp_string(stored: &[u8], out: &mut Vec<u8>) {
    match stored.split_first() {
        Some((&ACCOUNT, items)) => {
            let payload = items.len() + 66;
            out.extend_from_slice(&[0xb8, (payload + 2) as u8, 0xf8, payload as u8]);
            out.extend_from_slice(items);
            out.extend_from_slice(&account_tail());
        }
        Some((_, raw)) => rlp::append_string(raw, out),
        None => rlp::append_string(&[], out),
    }
}

#[cfg(test)]
mod tests {
    use alloy_primitives::U256;

    use super::*;
    use crate::account::Account;

    fn round_trip(value: &[u8]) -> Vec<u8> {
        let mut stored = Vec::new();
        store(value, &mut stored);
        assert!(holds(&stored, value));
        load(&stored).into_owned()
    }

    #[test]
    fn accounts_are_stored_compactly_and_come_back_exactly() {
        for (nonce, balance) in
            [(0u64, U256::ZERO), (1, U256::from(1u8)), (u64::MAX, U256::MAX), (300, U256::from(10u64.pow(18)))]
        {
            let value = Account::with_balance(nonce, balance).rlp();
            let mut stored = Vec::new();
            store(&value, &mut stored);
            assert_eq!(stored[0], ACCOUNT);
            assert!(stored.len() < value.len() - 60);
            assert_eq!(round_trip(&value), value);
        }
        // An account with code or storage, and other values, stay raw.
        let mut contract = Account::with_balance(1, U256::from(5u8));
        contract.code_hash = alloy_primitives::B256::repeat_byte(1);
        for value in [contract.rlp(), vec![], vec![0x01], b"hello".to_vec(), vec![0xc0], account_tail().to_vec()] {
            let mut stored = Vec::new();
            store(&value, &mut stored);
            assert_eq!(stored[0], RAW, "{value:?}");
            assert_eq!(round_trip(&value), value);
        }
    }

    #[test]
    fn a_differently_encoded_value_is_not_held_by_a_compact_leaf() {
        let canonical = Account::with_balance(1, U256::from(2u8)).rlp();
        let mut stored = Vec::new();
        store(&canonical, &mut stored);
        assert_eq!(stored[0], ACCOUNT);
        let mut longer_header = canonical.clone();
        longer_header[1] += 1;
        let mut short_header = vec![0xc0];
        short_header.extend_from_slice(&canonical[2..]);
        for other in [longer_header, short_header] {
            assert!(!holds(&stored, &other));
        }
        assert!(holds(&stored, &canonical));
    }

    #[test]
    fn non_canonical_lookalikes_stay_raw() {
        // A long-form list header for a short payload: expanding would re-encode it
        // canonically, so it must not be stored compactly.
        let canonical = Account::with_balance(1, U256::from(2u8)).rlp();
        let payload = &canonical[1..];
        let mut odd = vec![0xf8, payload.len() as u8];
        odd.extend_from_slice(payload);
        let mut stored = Vec::new();
        store(&odd, &mut stored);
        assert_eq!(stored[0], RAW);
        assert_eq!(round_trip(&odd), odd);
    }
}
