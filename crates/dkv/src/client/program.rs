//! What a client's transactions do: the keys they read, and the writes they make from what
//! they read.

use std::collections::BTreeMap;

use bytes::Bytes;
use virga_storage::Timestamp;

/// One operation of a plain transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Get(Bytes),
    Put(Bytes, Bytes),
    Delete(Bytes),
    /// The live keys in `[start, end)` (`end` None: unbounded), at most `limit` (1 to 4096).
    Scan {
        start: Bytes,
        end: Option<Bytes>,
        limit: u32,
    },
}

/// A transaction's logic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// Reads its gets, then makes its puts and deletes (a later write to a key wins).
    Ops(Vec<TxnOp>),
    /// Moves `amount` from account `from` to account `to` (balances are decimal integers;
    /// a missing account holds 0) if `from` holds enough; otherwise writes nothing.
    Transfer { from: Bytes, to: Bytes, amount: u64 },
    /// Reads every account (read-only), so the caller can check their sum.
    Audit(Vec<Bytes>),
    /// Reads the keys as of timestamp `at` (a snapshot read in the past, read-only).
    SnapshotAt { keys: Vec<Bytes>, at: Timestamp },
}

/// A balance as stored: decimal digits. Anything else reads as 0 (and a transfer out of it
/// does not happen).
pub fn balance(value: Option<&Bytes>) -> u64 {
    value.and_then(|value| std::str::from_utf8(value).ok()).and_then(|text| text.parse().ok()).unwrap_or(0)
}

impl Program {
    /// The keys the program reads, in order, each once.
    pub fn read_keys(&self) -> Vec<Bytes> {
        let mut keys: Vec<Bytes> = match self {
            Program::Ops(ops) => ops
                .iter()
                .filter_map(|op| match op {
                    TxnOp::Get(key) => Some(key.clone()),
                    _ => None,
                })
                .collect(),
            Program::Transfer { from, to, .. } => vec![from.clone(), to.clone()],
            Program::Audit(keys) | Program::SnapshotAt { keys, .. } => keys.clone(),
        };
        let mut seen = std::collections::BTreeSet::new();
        keys.retain(|key| seen.insert(key.clone()));
        keys
    }

    /// The program's scans: (start, end, limit), in order.
    pub fn scans(&self) -> Vec<(Bytes, Option<Bytes>, u32)> {
        match self {
            Program::Ops(ops) => ops
                .iter()
                .filter_map(|op| match op {
                    TxnOp::Scan { start, end, limit } => Some((start.clone(), end.clone(), (*limit).clamp(1, 4096))),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The writes (None: delete) given what was read.
    pub fn writes(&self, reads: &BTreeMap<Bytes, Option<Bytes>>) -> BTreeMap<Bytes, Option<Bytes>> {
        let mut writes = BTreeMap::new();
        match self {
            Program::Ops(ops) => {
                for op in ops {
                    match op {
                        TxnOp::Put(key, value) => {
                            writes.insert(key.clone(), Some(value.clone()));
                        }
                        TxnOp::Delete(key) => {
                            writes.insert(key.clone(), None);
                        }
                        TxnOp::Get(_) | TxnOp::Scan { .. } => {}
                    }
                }
            }
            Program::Transfer { from, to, amount } => {
                let from_balance = balance(reads.get(from).and_then(Option::as_ref));
                let to_balance = balance(reads.get(to).and_then(Option::as_ref));
                if from != to && from_balance >= *amount {
                    if let Some(credited) = to_balance.checked_add(*amount) {
                        writes.insert(from.clone(), Some(Bytes::from((from_balance - amount).to_string())));
                        writes.insert(to.clone(), Some(Bytes::from(credited.to_string())));
                    }
                }
            }
            Program::Audit(_) | Program::SnapshotAt { .. } => {}
        }
        writes
    }

    /// The timestamp a snapshot read in the past reads at (others read at their begin).
    pub fn snapshot_at(&self) -> Option<Timestamp> {
        match self {
            Program::SnapshotAt { at, .. } => Some(*at),
            _ => None,
        }
    }
}
