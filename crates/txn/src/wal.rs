//! The engine's log records: one per committed read-write transaction, and batches of the
//! initial load. Decoding never trusts a length it has not checked against the record.

use bytes::Bytes;
use virga_storage::{Timestamp, TxnId};

const KIND_COMMIT: u8 = 1;
const KIND_LOAD: u8 = 2;

const TAG_DELETE: u8 = 0;
const TAG_PUT: u8 = 1;

/// A decoded log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// A committed transaction's writes (`None` = delete).
    Commit {
        /// The transaction.
        txn: TxnId,
        /// Its commit timestamp.
        ts: Timestamp,
        /// Its writes.
        writes: Vec<(Bytes, Option<Bytes>)>,
    },
    /// Part of the initial data.
    Load {
        /// Key-value pairs.
        pairs: Vec<(Bytes, Bytes)>,
    },
}

/// Appends a commit record for `writes` to `out`.
pub fn encode_commit<'a>(
    out: &mut Vec<u8>,
    txn: TxnId,
    ts: Timestamp,
    writes: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) {
    out.push(KIND_COMMIT);
    out.extend_from_slice(&txn.to_le_bytes());
    out.extend_from_slice(&ts.time.to_le_bytes());
    out.extend_from_slice(&ts.client.to_le_bytes());
    out.extend_from_slice(&(writes.len() as u32).to_le_bytes());
    for (key, value) in writes {
        put_bytes(out, key);
        match value {
            Some(value) => {
                out.push(TAG_PUT);
                put_bytes(out, value);
            }
            None => out.push(TAG_DELETE),
        }
    }
}

/// Appends a load record for `pairs` to `out`.
pub fn encode_load<'a>(out: &mut Vec<u8>, pairs: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>) {
    out.push(KIND_LOAD);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (key, value) in pairs {
        put_bytes(out, key);
        put_bytes(out, value);
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Why bytes are not a log record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalDecodeError {
    /// The record ends inside a field.
    #[error("record ends inside the {what} (needs {needs} bytes at {at}, record is {len})")]
    Truncated {
        /// The field.
        what: &'static str,
        /// Bytes the field needs.
        needs: usize,
        /// Where the field starts.
        at: usize,
        /// The record's length.
        len: usize,
    },
    /// A write is neither a put nor a delete.
    #[error("unknown write tag {tag} at byte {at}")]
    UnknownWriteTag {
        /// The tag found.
        tag: u8,
        /// Where it is.
        at: usize,
    },
    /// The record is of no kind this build writes.
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    /// Bytes follow the record's last field.
    #[error("{0} trailing bytes after the record")]
    Trailing(usize),
    /// A count of items larger than the bytes left could hold.
    #[error("{what} {count} does not fit in the {left} bytes left")]
    CountTooLarge {
        /// What is counted.
        what: &'static str,
        /// The count found.
        count: usize,
        /// Bytes left in the record.
        left: usize,
    },
}

/// Decodes one record, naming what is wrong when it is malformed.
pub fn decode(record: &[u8]) -> Result<LogRecord, WalDecodeError> {
    let mut r = Reader { buf: record, pos: 0 };
    let record = match r.u8("record kind")? {
        KIND_COMMIT => {
            let txn = r.u64("transaction id")?;
            let ts = Timestamp { time: r.u64("commit time")?, client: r.u32("commit client")? };
            let n = r.count("write count", 5)?;
            let mut writes = Vec::with_capacity(n);
            for _ in 0..n {
                let key = r.bytes("key")?;
                let value = match r.u8("write tag")? {
                    TAG_PUT => Some(r.bytes("value")?),
                    TAG_DELETE => None,
                    tag => return Err(WalDecodeError::UnknownWriteTag { tag, at: r.pos - 1 }),
                };
                writes.push((key, value));
            }
            LogRecord::Commit { txn, ts, writes }
        }
        KIND_LOAD => {
            let n = r.count("pair count", 8)?;
            let mut pairs = Vec::with_capacity(n);
            for _ in 0..n {
                pairs.push((r.bytes("key")?, r.bytes("value")?));
            }
            LogRecord::Load { pairs }
        }
        other => return Err(WalDecodeError::UnknownKind(other)),
    };
    if r.pos != r.buf.len() {
        return Err(WalDecodeError::Trailing(r.buf.len() - r.pos));
    }
    Ok(record)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], WalDecodeError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len()).ok_or(WalDecodeError::Truncated {
            what,
            needs: n,
            at: self.pos,
            len: self.buf.len(),
        })?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, WalDecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, WalDecodeError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, WalDecodeError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }

    /// A count of items of at least `min_item_bytes` each, checked against what is left so a
    /// corrupt count cannot make us allocate gigabytes.
    fn count(&mut self, what: &'static str, min_item_bytes: usize) -> Result<usize, WalDecodeError> {
        let n = self.u32(what)? as usize;
        let left = self.buf.len() - self.pos;
        if n.saturating_mul(min_item_bytes) > left {
            return Err(WalDecodeError::CountTooLarge { what, count: n, left });
        }
        Ok(n)
    }

    fn bytes(&mut self, what: &'static str) -> Result<Bytes, WalDecodeError> {
        let n = self.u32(what)? as usize;
        Ok(Bytes::copy_from_slice(self.take(n, what)?))
    }
}

/// Fuzz body: any bytes decode to a record or a named error, never a panic, and whatever
/// decodes re-encodes to exactly the same bytes (the format has one encoding per record).
pub fn fuzz_decode(data: &[u8]) {
    if let Ok(record) = decode(data) {
        let mut again = Vec::new();
        match &record {
            LogRecord::Commit { txn, ts, writes } => encode_commit(
                &mut again,
                *txn,
                *ts,
                writes.iter().map(|(k, v)| (k.as_ref(), v.as_ref().map(|v| v.as_ref()))),
            ),
            LogRecord::Load { pairs } => encode_load(&mut again, pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))),
        }
        assert_eq!(again, data, "a decoded record re-encodes differently");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            fuzz_decode(&data);
        }

        #[test]
        fn mutated_records_never_panic_the_decoder(flip in 0usize..64, mask in 1u8..=255) {
            let mut buf = Vec::new();
            let writes: Vec<(&[u8], Option<&[u8]>)> = vec![(b"key", Some(b"value")), (b"gone", None)];
            encode_commit(&mut buf, 3, Timestamp::new(4, 5), writes.into_iter());
            let at = flip % buf.len();
            buf[at] ^= mask;
            fuzz_decode(&buf);
        }
    }

    #[test]
    fn records_round_trip() {
        let mut buf = Vec::new();
        let writes: Vec<(&[u8], Option<&[u8]>)> = vec![(b"a", Some(b"1")), (b"b", None)];
        encode_commit(&mut buf, 7, Timestamp::new(9, 2), writes.into_iter());
        assert_eq!(
            decode(&buf).unwrap(),
            LogRecord::Commit {
                txn: 7,
                ts: Timestamp::new(9, 2),
                writes: vec![
                    (Bytes::from_static(b"a"), Some(Bytes::from_static(b"1"))),
                    (Bytes::from_static(b"b"), None)
                ]
            }
        );
        let mut buf = Vec::new();
        let pairs: Vec<(&[u8], &[u8])> = vec![(b"k", b"v")];
        encode_load(&mut buf, pairs.into_iter());
        assert_eq!(
            decode(&buf).unwrap(),
            LogRecord::Load { pairs: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))] }
        );
    }

    #[test]
    fn every_truncation_and_a_bad_kind_are_named_errors() {
        let mut buf = Vec::new();
        let writes: Vec<(&[u8], Option<&[u8]>)> = vec![(b"key", Some(b"value")), (b"gone", None)];
        encode_commit(&mut buf, 1, Timestamp::new(5, 1), writes.into_iter());
        for len in 0..buf.len() {
            assert!(decode(&buf[..len]).is_err(), "prefix of {len} bytes");
        }
        let mut bad = buf.clone();
        bad[0] = 9;
        assert_eq!(decode(&bad).unwrap_err(), WalDecodeError::UnknownKind(9));
        let mut long = buf.clone();
        long.push(0);
        assert_eq!(decode(&long).unwrap_err(), WalDecodeError::Trailing(1));
        let mut huge = vec![KIND_LOAD];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&huge).unwrap_err(), WalDecodeError::CountTooLarge { what: "pair count", .. }));
    }
}
