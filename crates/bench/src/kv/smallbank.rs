//! SmallBank (Alomari, Cahill, Fekete and Röhm, "The cost of serializability on platforms that
//! use snapshot isolation", ICDE 2008), as used by H-Store and OLTP-Bench.
//!
//! Each customer `N` has a checking and a savings account. Keys are a table tag (`b'c'` for
//! checking, `b's'` for savings) followed by `N` in big-endian; values are the balance as an
//! `i64` in little-endian (8 bytes). Balances are signed because standard SmallBank lets
//! [`SmallBankTxn::WriteCheck`] overdraw a checking account. The name-to-id `Accounts` table of
//! the original schema is left out: it is read-only and every transaction here starts from ids.
//!
//! The six transactions and their mix (semantics in each variant's documentation):
//!
//! | transaction      | share | reads                    | writes when it goes through |
//! |------------------|-------|--------------------------|-----------------------------|
//! | Amalgamate       | 15%   | savings N1, checking N1, checking N2 | all three |
//! | Balance          | 15%   | savings N, checking N    | none (read-only)            |
//! | DepositChecking  | 15%   | checking N               | checking N                  |
//! | SendPayment      | 25%   | checking N1, checking N2 | both                        |
//! | TransactSavings  | 15%   | savings N                | savings N                   |
//! | WriteCheck       | 15%   | savings N, checking N    | checking N                  |
//!
//! A transaction whose business rule fails (too little money) commits without writing; only
//! malformed or missing data aborts (`bad-value`, `missing-key`). Money enters the bank only
//! through DepositChecking and positive TransactSavings, and leaves only through negative
//! TransactSavings and WriteCheck (the amount plus a penalty of 1 on an overdraft);
//! Amalgamate and SendPayment move it around.
//!
//! Customers are chosen with a scrambled Zipf sampler; two-customer transactions use two
//! distinct customers. Amounts are uniform in `1..=max_amount` (TransactSavings: either sign).

use anyhow::{ensure, Result};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::zipf::Zipf;
use super::{KvTx, KvWorkload, TxAbort};

/// Table tag of checking balances.
pub const CHECKING: u8 = b'c';
/// Table tag of savings balances.
pub const SAVINGS: u8 = b's';

/// Abort for a stored value that is not a balance, or arithmetic on it that overflows.
pub const BAD_VALUE: TxAbort = TxAbort { reason: "bad-value" };
/// Abort for an account the load should have created but the store does not have.
pub const MISSING_KEY: TxAbort = TxAbort { reason: "missing-key" };

/// The key of customer `id`'s account in `table` ([`CHECKING`] or [`SAVINGS`]).
pub fn key(table: u8, id: u64) -> [u8; 9] {
    let mut key = [table; 9];
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// The balance stored in `value`, or `None` unless it is exactly 8 bytes.
pub fn decode_balance(value: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(value.try_into().ok()?))
}

/// Like [`decode_balance`], as a transaction step: a malformed value aborts with `bad-value`.
pub fn decode_i64(value: &Bytes) -> Result<i64, TxAbort> {
    decode_balance(value).ok_or(BAD_VALUE)
}

fn read(tx: &mut dyn KvTx, table: u8, id: u64) -> Result<i64, TxAbort> {
    decode_i64(&tx.get(&key(table, id))?.ok_or(MISSING_KEY)?)
}

fn write(tx: &mut dyn KvTx, table: u8, id: u64, balance: i64) -> Result<(), TxAbort> {
    tx.put(&key(table, id), &balance.to_le_bytes())
}

/// Sum that aborts with `bad-value` instead of overflowing (only a corrupted store gets there).
fn add(a: i64, b: i64) -> Result<i64, TxAbort> {
    a.checked_add(b).ok_or(BAD_VALUE)
}

/// SmallBank parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmallBankConfig {
    /// Number of customers (default 100,000).
    pub accounts: u64,
    /// Zipf exponent of the customer choice (default 0.99, as YCSB; 0 is uniform).
    pub zipf: f64,
    /// Starting balance of every checking and every savings account (default 10,000).
    pub initial_balance: i64,
    /// Largest amount a transaction moves (default 100).
    pub max_amount: i64,
}

impl Default for SmallBankConfig {
    fn default() -> Self {
        Self { accounts: 100_000, zipf: 0.99, initial_balance: 10_000, max_amount: 100 }
    }
}

/// The kinds of SmallBank transaction, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmallBankKind {
    /// See [`SmallBankTxn::Amalgamate`].
    Amalgamate,
    /// See [`SmallBankTxn::Balance`].
    Balance,
    /// See [`SmallBankTxn::DepositChecking`].
    DepositChecking,
    /// See [`SmallBankTxn::SendPayment`].
    SendPayment,
    /// See [`SmallBankTxn::TransactSavings`].
    TransactSavings,
    /// See [`SmallBankTxn::WriteCheck`].
    WriteCheck,
}

/// One SmallBank transaction with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallBankTxn {
    /// Moves all of `from`'s money (savings and checking) into `to`'s checking account and
    /// zeroes both of `from`'s accounts. Always goes through, even when `from` is overdrawn.
    Amalgamate {
        /// Customer emptied.
        from: u64,
        /// Customer credited.
        to: u64,
    },
    /// Reads the customer's savings and checking balances. Read-only.
    Balance {
        /// Customer.
        account: u64,
    },
    /// Adds `amount` (positive) to the customer's checking balance.
    DepositChecking {
        /// Customer.
        account: u64,
        /// Amount deposited, at least 1.
        amount: i64,
    },
    /// Moves `amount` from `from`'s checking to `to`'s checking if `from`'s checking balance
    /// covers it; otherwise writes nothing.
    SendPayment {
        /// Payer.
        from: u64,
        /// Payee.
        to: u64,
        /// Amount, at least 1.
        amount: i64,
    },
    /// Adds `amount` (a deposit if positive, a withdrawal if negative) to the customer's
    /// savings, unless the balance would become negative; then writes nothing.
    TransactSavings {
        /// Customer.
        account: u64,
        /// Signed amount, never 0.
        amount: i64,
    },
    /// Cashes a check of `amount` against the customer's checking account. If savings plus
    /// checking covers it, checking decreases by `amount`; otherwise the check still clears
    /// (checking may go negative) and checking decreases by `amount + 1`, the overdraft penalty.
    WriteCheck {
        /// Customer.
        account: u64,
        /// Amount of the check, at least 1.
        amount: i64,
    },
}

impl SmallBankTxn {
    /// The transaction's kind.
    pub fn kind(&self) -> SmallBankKind {
        match self {
            SmallBankTxn::Amalgamate { .. } => SmallBankKind::Amalgamate,
            SmallBankTxn::Balance { .. } => SmallBankKind::Balance,
            SmallBankTxn::DepositChecking { .. } => SmallBankKind::DepositChecking,
            SmallBankTxn::SendPayment { .. } => SmallBankKind::SendPayment,
            SmallBankTxn::TransactSavings { .. } => SmallBankKind::TransactSavings,
            SmallBankTxn::WriteCheck { .. } => SmallBankKind::WriteCheck,
        }
    }
}

/// The SmallBank workload.
#[derive(Debug)]
pub struct SmallBankWorkload {
    config: SmallBankConfig,
    customers: Zipf,
}

impl SmallBankWorkload {
    /// A workload over `config`. Fails with fewer than two customers, a `max_amount` below 1,
    /// a negative initial balance, or an invalid Zipf exponent.
    pub fn new(config: SmallBankConfig) -> Result<Self> {
        ensure!(config.accounts >= 2, "smallbank: need at least two accounts");
        ensure!(config.max_amount >= 1, "smallbank: max_amount must be at least 1");
        ensure!(config.initial_balance >= 0, "smallbank: initial_balance must not be negative");
        let customers = Zipf::scrambled(config.accounts, config.zipf)?;
        Ok(Self { config, customers })
    }

    /// The parameters.
    pub fn config(&self) -> &SmallBankConfig {
        &self.config
    }

    /// The total of all balances right after loading.
    pub fn initial_total(&self) -> i128 {
        2 * i128::from(self.config.accounts) * i128::from(self.config.initial_balance)
    }

    fn two_customers(&self, rng: &mut SmallRng) -> (u64, u64) {
        let first = self.customers.sample(rng);
        loop {
            let second = self.customers.sample(rng);
            if second != first {
                return (first, second);
            }
        }
    }
}

impl KvWorkload for SmallBankWorkload {
    type Txn = SmallBankTxn;

    fn name(&self) -> &str {
        "smallbank"
    }

    fn load(&self, sink: &mut dyn FnMut(&[u8], &[u8])) {
        let balance = self.config.initial_balance.to_le_bytes();
        for id in 0..self.config.accounts {
            sink(&key(CHECKING, id), &balance);
            sink(&key(SAVINGS, id), &balance);
        }
    }

    fn next_txn(&self, _client: usize, rng: &mut SmallRng) -> SmallBankTxn {
        let amount = rng.random_range(1..=self.config.max_amount);
        match rng.random_range(0..100u32) {
            0..15 => {
                let (from, to) = self.two_customers(rng);
                SmallBankTxn::Amalgamate { from, to }
            }
            15..30 => SmallBankTxn::Balance { account: self.customers.sample(rng) },
            30..45 => SmallBankTxn::DepositChecking { account: self.customers.sample(rng), amount },
            45..70 => {
                let (from, to) = self.two_customers(rng);
                SmallBankTxn::SendPayment { from, to, amount }
            }
            70..85 => {
                let amount = if rng.random() { amount } else { -amount };
                SmallBankTxn::TransactSavings { account: self.customers.sample(rng), amount }
            }
            _ => SmallBankTxn::WriteCheck { account: self.customers.sample(rng), amount },
        }
    }

    fn is_read_only(&self, txn: &SmallBankTxn) -> bool {
        matches!(txn, SmallBankTxn::Balance { .. })
    }

    fn execute(&self, txn: &SmallBankTxn, tx: &mut dyn KvTx) -> Result<(), TxAbort> {
        match *txn {
            SmallBankTxn::Amalgamate { from, to } => {
                let savings = read(tx, SAVINGS, from)?;
                let checking = read(tx, CHECKING, from)?;
                let target = read(tx, CHECKING, to)?;
                let moved = add(savings, checking)?;
                write(tx, SAVINGS, from, 0)?;
                write(tx, CHECKING, from, 0)?;
                write(tx, CHECKING, to, add(target, moved)?)
            }
            SmallBankTxn::Balance { account } => {
                let savings = read(tx, SAVINGS, account)?;
                let checking = read(tx, CHECKING, account)?;
                // The sum is the transaction's answer; computing it validates both values.
                add(savings, checking).map(drop)
            }
            SmallBankTxn::DepositChecking { account, amount } => {
                let checking = read(tx, CHECKING, account)?;
                write(tx, CHECKING, account, add(checking, amount)?)
            }
            SmallBankTxn::SendPayment { from, to, amount } => {
                let payer = read(tx, CHECKING, from)?;
                let payee = read(tx, CHECKING, to)?;
                if payer < amount {
                    return Ok(());
                }
                write(tx, CHECKING, from, add(payer, -amount)?)?;
                write(tx, CHECKING, to, add(payee, amount)?)
            }
            SmallBankTxn::TransactSavings { account, amount } => {
                let savings = add(read(tx, SAVINGS, account)?, amount)?;
                if savings < 0 {
                    return Ok(());
                }
                write(tx, SAVINGS, account, savings)
            }
            SmallBankTxn::WriteCheck { account, amount } => {
                let savings = read(tx, SAVINGS, account)?;
                let checking = read(tx, CHECKING, account)?;
                let charge = if add(savings, checking)? < amount { add(amount, 1)? } else { amount };
                write(tx, CHECKING, account, add(checking, -charge)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::testing::{assert_retries_deterministic, Oracle, WriteSet};
    use rand::SeedableRng;
    use std::collections::HashMap;

    fn workload(accounts: u64, zipf: f64) -> SmallBankWorkload {
        let config = SmallBankConfig { accounts, zipf, initial_balance: 300, max_amount: 100 };
        SmallBankWorkload::new(config).unwrap()
    }

    fn balance(oracle: &Oracle, table: u8, id: u64) -> i64 {
        decode_balance(oracle.get(&key(table, id)).expect("account exists")).expect("balance decodes")
    }

    fn total(oracle: &Oracle) -> i128 {
        oracle.iter().map(|(_, v)| i128::from(decode_balance(v).expect("balance decodes"))).sum()
    }

    /// An independent statement of the semantics: the writes `txn` must make on `oracle`'s
    /// state, and by how much it changes the bank's total.
    fn expected_effect(oracle: &Oracle, txn: &SmallBankTxn) -> (Vec<([u8; 9], i64)>, i64) {
        let b = |table, id| balance(oracle, table, id);
        match *txn {
            SmallBankTxn::Amalgamate { from, to } => {
                let moved = b(SAVINGS, from) + b(CHECKING, from);
                let writes = vec![
                    (key(SAVINGS, from), 0),
                    (key(CHECKING, from), 0),
                    (key(CHECKING, to), b(CHECKING, to) + moved),
                ];
                (writes, 0)
            }
            SmallBankTxn::Balance { .. } => (vec![], 0),
            SmallBankTxn::DepositChecking { account, amount } => {
                (vec![(key(CHECKING, account), b(CHECKING, account) + amount)], amount)
            }
            SmallBankTxn::SendPayment { from, to, amount } if b(CHECKING, from) >= amount => (
                vec![(key(CHECKING, from), b(CHECKING, from) - amount), (key(CHECKING, to), b(CHECKING, to) + amount)],
                0,
            ),
            SmallBankTxn::SendPayment { .. } => (vec![], 0),
            SmallBankTxn::TransactSavings { account, amount } if b(SAVINGS, account) + amount >= 0 => {
                (vec![(key(SAVINGS, account), b(SAVINGS, account) + amount)], amount)
            }
            SmallBankTxn::TransactSavings { .. } => (vec![], 0),
            SmallBankTxn::WriteCheck { account, amount } => {
                let overdraft = b(SAVINGS, account) + b(CHECKING, account) < amount;
                let charge = amount + i64::from(overdraft);
                (vec![(key(CHECKING, account), b(CHECKING, account) - charge)], -charge)
            }
        }
    }

    fn as_balances(writes: &WriteSet) -> Vec<([u8; 9], i64)> {
        writes
            .iter()
            .map(|(k, v)| {
                let key: [u8; 9] = k.as_slice().try_into().expect("9-byte key");
                (key, decode_balance(v.as_ref().expect("no deletes")).expect("balance decodes"))
            })
            .collect()
    }

    #[test]
    fn mix_proportions() {
        let workload = workload(1_000, 0.99);
        let mut rng = SmallRng::seed_from_u64(21);
        let mut counts: HashMap<SmallBankKind, u64> = HashMap::new();
        let draws = 100_000;
        for _ in 0..draws {
            let txn = workload.next_txn(0, &mut rng);
            *counts.entry(txn.kind()).or_default() += 1;
            assert_eq!(workload.is_read_only(&txn), txn.kind() == SmallBankKind::Balance);
            match txn {
                SmallBankTxn::Amalgamate { from, to } | SmallBankTxn::SendPayment { from, to, .. } => {
                    assert_ne!(from, to)
                }
                SmallBankTxn::TransactSavings { amount, .. } => assert!(amount != 0 && amount.abs() <= 100),
                SmallBankTxn::DepositChecking { amount, .. } | SmallBankTxn::WriteCheck { amount, .. } => {
                    assert!((1..=100).contains(&amount))
                }
                SmallBankTxn::Balance { .. } => {}
            }
        }
        let expected = [
            (SmallBankKind::Amalgamate, 15.0),
            (SmallBankKind::Balance, 15.0),
            (SmallBankKind::DepositChecking, 15.0),
            (SmallBankKind::SendPayment, 25.0),
            (SmallBankKind::TransactSavings, 15.0),
            (SmallBankKind::WriteCheck, 15.0),
        ];
        for (kind, want) in expected {
            let seen = counts[&kind] as f64 * 100.0 / draws as f64;
            assert!((seen - want).abs() < 0.6, "{kind:?}: {seen:.2}% vs {want}%");
        }
    }

    /// 20k transactions on a small, skewed bank: every transaction writes exactly what the
    /// semantics say, the total moves only by deposits, withdrawals and checks, and every
    /// stored value decodes.
    #[test]
    fn follows_the_semantics() {
        for zipf in [0.0, 0.99] {
            let workload = workload(100, zipf);
            let mut oracle = Oracle::loaded(&workload);
            assert_eq!(oracle.len(), 200);
            let mut expected_total = workload.initial_total();
            assert_eq!(total(&oracle), expected_total);
            let mut rng = SmallRng::seed_from_u64(22);
            let mut no_ops: HashMap<SmallBankKind, u64> = HashMap::new();
            let mut overdrafts = 0;
            for _ in 0..20_000 {
                let txn = workload.next_txn(0, &mut rng);
                let (mut want, delta) = expected_effect(&oracle, &txn);
                if let SmallBankTxn::WriteCheck { amount, .. } = txn {
                    overdrafts += u64::from(delta == -(amount + 1));
                }
                let (_, writes) = oracle.execute(&workload, &txn).expect("oracle never aborts");
                want.sort();
                assert_eq!(as_balances(&writes), want, "{txn:?}");
                if writes.is_empty() {
                    *no_ops.entry(txn.kind()).or_default() += 1;
                }
                expected_total += i128::from(delta);
                assert_eq!(total(&oracle), expected_total, "{txn:?}");
            }
            assert_eq!(oracle.len(), 200);
            // The run exercised the business-rule failures, not just the happy paths.
            assert!(no_ops.get(&SmallBankKind::SendPayment).is_some_and(|&n| n > 0), "zipf {zipf}: {no_ops:?}");
            assert!(no_ops.get(&SmallBankKind::TransactSavings).is_some_and(|&n| n > 0), "zipf {zipf}: {no_ops:?}");
            assert!(overdrafts > 0, "zipf {zipf}");
        }
    }

    #[test]
    fn retries_are_deterministic() {
        assert_retries_deterministic(&workload(50, 0.99), 0, 23, 2_000);
    }

    #[test]
    fn malformed_values_abort() {
        let workload = workload(10, 0.0);
        let mut oracle = Oracle::loaded(&workload);
        oracle.insert(&key(CHECKING, 2), b"short");
        oracle.insert(&key(SAVINGS, 3), &i64::MAX.to_le_bytes());
        let bad = oracle.execute(&workload, &SmallBankTxn::Balance { account: 2 });
        assert_eq!(bad.unwrap_err(), BAD_VALUE);
        let overflow = oracle.execute(&workload, &SmallBankTxn::TransactSavings { account: 3, amount: 1 });
        assert_eq!(overflow.unwrap_err(), BAD_VALUE);
        let missing = oracle.execute(&workload, &SmallBankTxn::DepositChecking { account: 10, amount: 1 });
        assert_eq!(missing.unwrap_err(), MISSING_KEY);
    }

    #[test]
    fn rejects_bad_configs() {
        let base = SmallBankConfig::default();
        assert!(SmallBankWorkload::new(SmallBankConfig { accounts: 1, ..base.clone() }).is_err());
        assert!(SmallBankWorkload::new(SmallBankConfig { max_amount: 0, ..base.clone() }).is_err());
        assert!(SmallBankWorkload::new(SmallBankConfig { initial_balance: -1, ..base.clone() }).is_err());
        assert!(SmallBankWorkload::new(SmallBankConfig { zipf: f64::NAN, ..base }).is_err());
    }
}
