//! SmallBank as portable SQL: the same statement text runs at every organization, whatever
//! its DBMS. Conditions (TransactSavings' non-negative savings, WriteCheck's overdraft
//! penalty, SendPayment's funds) are written into the statements themselves, so a
//! transaction's effects depend on the data alone, as both PostgreSQL and SQLite evaluate
//! it. A savings balance that would go negative violates the table's check: the transaction
//! fails and the block records it.

use rand::Rng;

use crate::organization::Transaction;
use crate::schema::{Column, ColumnKind, SharedTable};

/// The shared tables: accounts, savings and checking, keyed by customer.
pub fn tables() -> Vec<SharedTable> {
    let balance = |name: &str, checks: Vec<String>| SharedTable {
        name: name.to_string(),
        columns: vec![Column::new("custid", ColumnKind::Integer), Column::new("bal", ColumnKind::Integer)],
        primary_key: "custid".to_string(),
        checks,
    };
    vec![
        SharedTable {
            name: "accounts".to_string(),
            columns: vec![Column::new("custid", ColumnKind::Integer), Column::new("name", ColumnKind::Text)],
            primary_key: "custid".to_string(),
            checks: Vec::new(),
        },
        balance("savings", vec!["bal >= 0".to_string()]),
        balance("checking", Vec::new()),
    ]
}

/// The load of `customers` customers, as blocks of `per_block` customers (block 0 onwards of
/// the chain: the initial state is agreed like any other effects).
pub fn load_blocks(customers: u64, per_block: u64) -> Vec<Vec<Transaction>> {
    let per_block = per_block.max(1);
    let mut blocks = Vec::new();
    let mut first = 0;
    while first < customers {
        let last = (first + per_block).min(customers);
        let rows = |make: &dyn Fn(u64) -> String| (first..last).map(make).collect::<Vec<_>>().join(", ");
        blocks.push(vec![Transaction::new(vec![
            format!("INSERT INTO accounts (custid, name) VALUES {}", rows(&|id| format!("({id}, 'customer-{id}')"))),
            format!(
                "INSERT INTO savings (custid, bal) VALUES {}",
                rows(&|id| format!("({id}, {})", 10_000 + id % 100))
            ),
            format!("INSERT INTO checking (custid, bal) VALUES {}", rows(&|id| format!("({id}, {})", 5_000 + id % 50))),
        ])]);
        first = last;
    }
    blocks
}

/// SmallBank's six transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Balance,
    DepositChecking,
    TransactSavings,
    Amalgamate,
    WriteCheck,
    SendPayment,
}

/// One transaction's statements.
pub fn statements(kind: Kind, a: u64, b: u64, amount: i64) -> Transaction {
    let statements = match kind {
        Kind::Balance => vec![format!(
            "SELECT s.bal + c.bal FROM savings s JOIN checking c ON c.custid = s.custid WHERE s.custid = {a}"
        )],
        Kind::DepositChecking => vec![format!("UPDATE checking SET bal = bal + {} WHERE custid = {a}", amount.abs())],
        // A withdrawal past the savings balance violates savings' check: the transaction fails.
        Kind::TransactSavings => vec![format!("UPDATE savings SET bal = bal + {amount} WHERE custid = {a}")],
        // b receives all of a's money, then a's balances go to zero (read before written).
        Kind::Amalgamate => vec![
            format!(
                "UPDATE checking SET bal = bal + (SELECT s.bal FROM savings s WHERE s.custid = {a}) + (SELECT c.bal \
                 FROM checking c WHERE c.custid = {a}) WHERE custid = {b}"
            ),
            format!("UPDATE savings SET bal = 0 WHERE custid = {a}"),
            format!("UPDATE checking SET bal = 0 WHERE custid = {a}"),
        ],
        // An overdraft of the two balances together costs a penalty of 1.
        Kind::WriteCheck => vec![format!(
            "UPDATE checking SET bal = bal - (CASE WHEN bal + (SELECT s.bal FROM savings s WHERE s.custid = {a}) < \
             {amount} THEN {amount} + 1 ELSE {amount} END) WHERE custid = {a}",
            amount = amount.abs()
        )],
        // Nothing moves unless a's checking covers the amount: the credit checks it first, the
        // debit after it sees the same balance.
        Kind::SendPayment => vec![
            format!(
                "UPDATE checking SET bal = bal + {amount} WHERE custid = {b} AND (SELECT c.bal FROM checking c WHERE \
                 c.custid = {a}) >= {amount}",
                amount = amount.abs()
            ),
            format!(
                "UPDATE checking SET bal = bal - {amount} WHERE custid = {a} AND bal >= {amount}",
                amount = amount.abs()
            ),
        ],
    };
    Transaction::new(statements)
}

/// How a block's transactions pick their customers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Skew {
    Uniform,
    /// Zipf with this exponent over the customers (the seed's hot setting: 1.1), customer 0
    /// the hottest.
    Zipf(f64),
}

/// SmallBank's mix (Balance, DepositChecking, TransactSavings, Amalgamate and WriteCheck
/// 15% each, SendPayment 25%) over customers drawn uniformly from `0..customers`.
pub fn random_block<R: Rng>(rng: &mut R, customers: u64, size: usize) -> Vec<Transaction> {
    random_block_skewed(rng, customers, size, Skew::Uniform)
}

/// As [`random_block`], the customers drawn as `skew` says.
pub fn random_block_skewed<R: Rng>(rng: &mut R, customers: u64, size: usize, skew: Skew) -> Vec<Transaction> {
    let customers = customers.max(2);
    // An exponent rand_distr refuses (negative, not a number) falls back to uniform.
    let zipf = match skew {
        Skew::Zipf(exponent) => rand_distr::Zipf::new(customers as f64, exponent).ok(),
        Skew::Uniform => None,
    };
    let pick = |rng: &mut R| match &zipf {
        Some(zipf) => (rand_distr::Distribution::sample(zipf, rng) as u64).saturating_sub(1).min(customers - 1),
        None => rng.random_range(0..customers),
    };
    (0..size)
        .map(|_| {
            let a = pick(rng);
            let mut b = pick(rng);
            if b == a {
                b = (a + 1) % customers;
            }
            let kind = match rng.random_range(0..100) {
                0..15 => Kind::Balance,
                15..30 => Kind::DepositChecking,
                30..45 => Kind::TransactSavings,
                45..60 => Kind::Amalgamate,
                60..75 => Kind::WriteCheck,
                _ => Kind::SendPayment,
            };
            // TransactSavings withdraws as often as it deposits, sometimes past the balance.
            let amount = match kind {
                Kind::TransactSavings => rng.random_range(-12_000..2_000),
                _ => rng.random_range(1..3_000),
            };
            statements(kind, a, b, amount)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    /// How often customer 0 is the first customer of a transaction, over 50 blocks of 100.
    fn share_of_customer_zero(skew: Skew) -> f64 {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut hits = 0;
        for _ in 0..50 {
            for transaction in random_block_skewed(&mut rng, 1_000, 100, skew) {
                let sql = transaction.sql();
                assert!(!sql.contains("custid = 1000"), "customers stay below 1000: {sql}");
                hits += usize::from(
                    sql.contains("custid = 0\n") || sql.contains("custid = 0;") || sql.ends_with("custid = 0"),
                );
            }
        }
        hits as f64 / 5_000.0
    }

    #[test]
    fn zipf_makes_the_first_customers_hot_and_uniform_does_not() {
        let hot = share_of_customer_zero(Skew::Zipf(1.1));
        let flat = share_of_customer_zero(Skew::Uniform);
        assert!(hot > 0.1, "customer 0 appears in {hot} of Zipf(1.1) transactions");
        assert!(flat < 0.02, "customer 0 appears in {flat} of uniform transactions");
    }
}
