//! Bank transfers between accounts: the simplest workload with an invariant to audit.
//!
//! Keys are `b'a'` followed by the account id in big-endian; values are the balance as a
//! `u64` in little-endian (8 bytes). Every transaction moves an amount between two distinct
//! accounts, or does nothing when the source cannot cover it, so the total of all balances
//! never changes. After a run, [`audit`] over the store's contents must report
//! [`TransferWorkload::expected_total`]; anything else means an engine lost or invented an
//! update (a lost update, a torn commit, a bad recovery).

use anyhow::{ensure, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::zipf::Zipf;
use super::{KvTx, KvWorkload, TxAbort};

/// Table tag of account keys.
pub const TAG: u8 = b'a';

/// Abort for a stored value that is not a balance.
pub const BAD_VALUE: TxAbort = TxAbort { reason: "bad-value" };
/// Abort for an account the load should have created but the store does not have.
pub const MISSING_KEY: TxAbort = TxAbort { reason: "missing-key" };

/// The key of account `id`.
pub fn key(id: u64) -> [u8; 9] {
    let mut key = [TAG; 9];
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// Whether `key` is an account key of this workload.
pub fn is_account_key(key: &[u8]) -> bool {
    key.len() == 9 && key[0] == TAG
}

/// The balance stored in `value`, or `None` unless it is exactly 8 bytes.
pub fn decode_balance(value: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(value.try_into().ok()?))
}

/// Like [`decode_balance`], as a transaction step: a malformed value aborts with `bad-value`.
pub fn decode_u64(value: &Bytes) -> Result<u64, TxAbort> {
    decode_balance(value).ok_or(BAD_VALUE)
}

/// Reads and decodes a balance inside a transaction.
fn read_balance(tx: &mut dyn KvTx, account: u64) -> Result<u64, TxAbort> {
    decode_u64(&tx.get(&key(account))?.ok_or(MISSING_KEY)?)
}

/// Transfer parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferConfig {
    /// Number of accounts (default 100,000).
    pub accounts: u64,
    /// Zipf exponent of the account choice (default 0, uniform).
    pub zipf: f64,
    /// Starting balance of every account (default 1,000,000).
    pub initial_balance: u64,
    /// Largest amount moved; amounts are uniform in `1..=max_amount` (default 100).
    pub max_amount: u64,
}

impl Default for TransferConfig {
    fn default() -> Self {
        Self { accounts: 100_000, zipf: 0.0, initial_balance: 1_000_000, max_amount: 100 }
    }
}

/// Moves `amount` from account `from` to account `to` (`from != to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferTxn {
    /// Source account.
    pub from: u64,
    /// Destination account.
    pub to: u64,
    /// Amount, at least 1.
    pub amount: u64,
}

/// The transfer workload.
#[derive(Debug)]
pub struct TransferWorkload {
    config: TransferConfig,
    accounts: Zipf,
}

impl TransferWorkload {
    /// A workload over `config`. Fails with fewer than two accounts, a zero `max_amount`, an
    /// invalid Zipf exponent, or a total balance beyond `u64` (so no single balance can
    /// overflow either).
    pub fn new(config: TransferConfig) -> Result<Self> {
        ensure!(config.accounts >= 2, "transfer: need at least two accounts");
        ensure!(config.max_amount >= 1, "transfer: max_amount must be at least 1");
        ensure!(
            u128::from(config.accounts) * u128::from(config.initial_balance) <= u128::from(u64::MAX),
            "transfer: total balance overflows u64"
        );
        let accounts = Zipf::scrambled(config.accounts, config.zipf)?;
        Ok(Self { config, accounts })
    }

    /// The parameters.
    pub fn config(&self) -> &TransferConfig {
        &self.config
    }

    /// The total every audit must find: `accounts × initial_balance`.
    pub fn expected_total(&self) -> u128 {
        u128::from(self.config.accounts) * u128::from(self.config.initial_balance)
    }
}

impl KvWorkload for TransferWorkload {
    type Txn = TransferTxn;

    fn name(&self) -> &str {
        "transfer"
    }

    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        let balance = self.config.initial_balance.to_le_bytes();
        for id in 0..self.config.accounts {
            sink(&key(id), &balance);
        }
    }

    fn next_txn(&self, _client: usize, rng: &mut SmallRng) -> TransferTxn {
        let from = self.accounts.sample(rng);
        let to = loop {
            let to = self.accounts.sample(rng);
            if to != from {
                break to;
            }
        };
        TransferTxn { from, to, amount: rng.random_range(1..=self.config.max_amount) }
    }

    fn is_read_only(&self, _txn: &TransferTxn) -> bool {
        // Whether it writes depends on the balance it reads.
        false
    }

    /// Reads both balances; if the source covers the amount, writes both, else writes nothing.
    fn execute(&self, txn: &TransferTxn, tx: &mut dyn KvTx) -> Result<(), TxAbort> {
        let from = read_balance(tx, txn.from)?;
        let to = read_balance(tx, txn.to)?;
        if from < txn.amount {
            return Ok(());
        }
        // The total fits in u64 (checked at construction), so this overflows only on a
        // corrupted store.
        let to = to.checked_add(txn.amount).ok_or(BAD_VALUE)?;
        tx.put(&key(txn.from), &(from - txn.amount).to_le_bytes())?;
        tx.put(&key(txn.to), &to.to_le_bytes())
    }
}

/// What [`audit`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferAudit {
    /// Account keys seen.
    pub accounts: u64,
    /// Sum of their balances.
    pub total_balance: u128,
}

/// An account key whose value is not a balance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("account {account}: value is {bytes} bytes, not an 8-byte balance")]
pub struct NotABalance {
    pub account: u64,
    pub bytes: usize,
}

/// Sums the balances of every account key in `pairs`, ignoring other keys (an engine may keep
/// its own metadata in the same key space). Fails on the first account whose value is not a
/// balance.
pub fn audit<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Result<TransferAudit, NotABalance> {
    let mut found = TransferAudit { accounts: 0, total_balance: 0 };
    for (key, value) in pairs.filter(|(key, _)| is_account_key(key)) {
        let balance = decode_balance(value).ok_or_else(|| NotABalance {
            account: u64::from_be_bytes(key[1..].try_into().expect("account keys are 9 bytes")),
            bytes: value.len(),
        })?;
        found.accounts += 1;
        found.total_balance += u128::from(balance);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::testing::{assert_retries_deterministic, Oracle};
    use rand::SeedableRng;

    fn workload(accounts: u64, zipf: f64) -> TransferWorkload {
        TransferWorkload::new(TransferConfig { accounts, zipf, initial_balance: 500, ..TransferConfig::default() })
            .unwrap()
    }

    #[test]
    fn codec() {
        assert!(is_account_key(&key(3)));
        assert!(!is_account_key(&key(3)[..8]));
        assert!(!is_account_key(&crate::kv::ycsb::key(3)));
        assert_eq!(decode_balance(&7u64.to_le_bytes()), Some(7));
        assert_eq!(decode_balance(&[1, 2, 3]), None);
        assert_eq!(decode_u64(&Bytes::from_static(b"123456789")), Err(BAD_VALUE));
    }

    /// 20k transfers under low and high skew: the audited total never changes, every
    /// transaction writes both accounts or nothing, and a short source writes nothing.
    #[test]
    fn total_is_conserved() {
        for zipf in [0.0, 0.99, 2.0] {
            // Few accounts and small balances, so insufficient funds actually happen.
            let workload = workload(200, zipf);
            let mut oracle = Oracle::loaded(&workload);
            let expected = TransferAudit { accounts: 200, total_balance: workload.expected_total() };
            assert_eq!(audit(oracle.iter()), Ok(expected));
            let mut rng = SmallRng::seed_from_u64(11);
            let mut refused = 0;
            for _ in 0..20_000 {
                let txn = workload.next_txn(0, &mut rng);
                assert_ne!(txn.from, txn.to);
                assert!((1..=100).contains(&txn.amount));
                let before = decode_balance(oracle.get(&key(txn.from)).unwrap()).unwrap();
                let (_, writes) = oracle.execute(&workload, &txn).unwrap();
                if before < txn.amount {
                    assert!(writes.is_empty());
                    refused += 1;
                } else {
                    assert_eq!(writes.len(), 2);
                }
            }
            assert_eq!(audit(oracle.iter()), Ok(expected), "zipf {zipf}");
            if zipf == 2.0 {
                assert!(refused > 0, "skewed transfers should drain some accounts");
            }
        }
    }

    #[test]
    fn retries_are_deterministic() {
        assert_retries_deterministic(&workload(1_000, 0.99), 0, 12, 1_000);
    }

    #[test]
    fn malformed_values_abort_and_fail_the_audit() {
        let workload = workload(10, 0.0);
        let mut oracle = Oracle::loaded(&workload);
        oracle.insert(&key(3), b"oops");
        let txn = TransferTxn { from: 3, to: 4, amount: 1 };
        assert_eq!(oracle.execute(&workload, &txn).unwrap_err(), BAD_VALUE);
        let txn = TransferTxn { from: 4, to: 99, amount: 1 };
        assert_eq!(oracle.execute(&workload, &txn).unwrap_err(), MISSING_KEY);
        let err = audit(oracle.iter()).unwrap_err();
        assert_eq!(err.account, 3, "{err}");
        // Foreign keys are ignored.
        let mut oracle = Oracle::loaded(&workload);
        oracle.insert(b"zz-meta", b"x");
        assert_eq!(audit(oracle.iter()).unwrap().accounts, 10);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(TransferWorkload::new(TransferConfig { accounts: 1, ..TransferConfig::default() }).is_err());
        assert!(TransferWorkload::new(TransferConfig { max_amount: 0, ..TransferConfig::default() }).is_err());
        let huge = TransferConfig { initial_balance: u64::MAX, ..TransferConfig::default() };
        assert!(TransferWorkload::new(huge).is_err());
    }
}
