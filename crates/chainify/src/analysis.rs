//! Semantic analysis of a block's SQL (seed 002 §4.6): each transaction's reads and writes
//! as intervals of each table's primary key, from its statements' WHERE clauses (`custid =
//! 100` → [100, 100], `custid > 42` → [43, ∞)), parsed with `sqlparser`; the dependency
//! graph in block order, and its topological stages.
//!
//! The analysis is conservative: whatever it cannot bound (a predicate on another column, a
//! function, a derived table, a statement kind it does not know) reads or writes the whole
//! table, and every table a statement names is accessed at least as a whole-table read
//! unless bounded. Two transactions conflict when they access a common table, one of them
//! writes it, and their intervals overlap. Transactions of one stage conflict with none of
//! the others in it, so they may run at once and leave the effects (and the digest rows'
//! serials) of the serial order.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    AssignmentTarget, BinaryOperator, Expr, FromTable, InTarget, JoinConstraint, JoinOperator, ObjectName, Query,
    SetExpr, Statement, TableFactor, TableObject, TableWithJoins, UnaryOperator, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::organization::Transaction;
use crate::schema::SharedTable;

/// Closed intervals of key values, sorted and disjoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys(Vec<(i64, i64)>);

impl Keys {
    pub fn all() -> Keys {
        Keys(vec![(i64::MIN, i64::MAX)])
    }

    pub fn none() -> Keys {
        Keys(Vec::new())
    }

    pub fn range(low: i64, high: i64) -> Keys {
        if low <= high {
            Keys(vec![(low, high)])
        } else {
            Keys::none()
        }
    }

    pub fn point(key: i64) -> Keys {
        Keys::range(key, key)
    }

    pub fn is_all(&self) -> bool {
        self.0 == [(i64::MIN, i64::MAX)]
    }

    pub fn union(&self, other: &Keys) -> Keys {
        let mut all: Vec<(i64, i64)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(all.len());
        for (low, high) in all {
            match merged.last_mut() {
                Some(last) if low <= last.1.saturating_add(1) => last.1 = last.1.max(high),
                _ => merged.push((low, high)),
            }
        }
        Keys(merged)
    }

    pub fn intersect(&self, other: &Keys) -> Keys {
        let mut out = Vec::new();
        for (a_low, a_high) in &self.0 {
            for (b_low, b_high) in &other.0 {
                let (low, high) = ((*a_low).max(*b_low), (*a_high).min(*b_high));
                if low <= high {
                    out.push((low, high));
                }
            }
        }
        Keys(Vec::new()).union(&Keys(out))
    }

    pub fn overlaps(&self, other: &Keys) -> bool {
        !self.intersect(other).0.is_empty()
    }
}

/// One table accessed by a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub table: String,
    pub write: bool,
    pub keys: Keys,
}

impl Access {
    fn conflicts(&self, other: &Access) -> bool {
        self.table == other.table && (self.write || other.write) && self.keys.overlaps(&other.keys)
    }
}

/// What the analysis found in a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    pub accesses: Vec<Access>,
    /// A statement that did not parse, or of a kind the analysis does not know (DDL, say):
    /// the transaction conflicts with every other, so it runs alone in its stage.
    pub barrier: bool,
}

impl Footprint {
    pub fn conflicts(&self, other: &Footprint) -> bool {
        self.barrier
            || other.barrier
            || self.accesses.iter().any(|mine| other.accesses.iter().any(|theirs| mine.conflicts(theirs)))
    }
}

/// The footprint of `transaction` over the shared `tables` (their primary keys bound the
/// intervals).
pub fn footprint(transaction: &Transaction, tables: &[SharedTable]) -> Footprint {
    let mut accesses = Vec::new();
    for sql in &transaction.statements {
        let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
            return Footprint { accesses: Vec::new(), barrier: true };
        };
        for statement in &statements {
            if !matches!(
                statement,
                Statement::Update(_) | Statement::Delete(_) | Statement::Insert(_) | Statement::Query(_)
            ) {
                return Footprint { accesses: Vec::new(), barrier: true };
            }
            accesses.extend(Analyzer { tables }.statement(statement));
        }
    }
    Footprint { accesses, barrier: false }
}

/// The stages of a block: indices of transactions in block order within each stage; a
/// transaction's stage is one past the latest stage of any earlier transaction it conflicts
/// with (the longest path to it in the dependency graph).
pub fn stages(footprints: &[Footprint]) -> Vec<Vec<usize>> {
    let mut level: Vec<usize> = Vec::with_capacity(footprints.len());
    let mut stages: Vec<Vec<usize>> = Vec::new();
    for (index, footprint) in footprints.iter().enumerate() {
        let after = (0..index)
            .filter(|earlier| footprints[*earlier].conflicts(footprint))
            .map(|earlier| level[earlier] + 1)
            .max();
        let mine = after.unwrap_or(0);
        level.push(mine);
        if stages.len() == mine {
            stages.push(Vec::new());
        }
        stages[mine].push(index);
    }
    stages
}

/// A table in a statement's scope, under its alias.
struct Scoped {
    table: String,
    alias: String,
    key: Option<String>,
}

struct Analyzer<'a> {
    tables: &'a [SharedTable],
}

impl Analyzer<'_> {
    fn key_of(&self, table: &str) -> Option<String> {
        self.tables.iter().find(|shared| shared.name == table).map(|shared| shared.primary_key.clone())
    }

    fn scoped(&self, name: &ObjectName, alias: Option<&str>) -> Scoped {
        let table = name.to_string().to_lowercase();
        Scoped { key: self.key_of(&table), alias: alias.map_or_else(|| table.clone(), str::to_lowercase), table }
    }

    fn statement(&self, statement: &Statement) -> Vec<Access> {
        let mut accesses = match statement {
            Statement::Update(update) => self.update(&update.table, &update.assignments, update.selection.as_ref()),
            Statement::Delete(delete) => {
                let from = match &delete.from {
                    FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from) => from,
                };
                match from.as_slice() {
                    [TableWithJoins { relation: TableFactor::Table { name, alias, .. }, joins }]
                        if joins.is_empty() =>
                    {
                        let target = self.scoped(name, alias.as_ref().map(|alias| alias.name.value.as_str()));
                        let keys = self.keys_of(&target, &[&target], delete.selection.as_ref());
                        vec![Access { table: target.table.clone(), write: true, keys }]
                    }
                    _ => Vec::new(),
                }
            }
            Statement::Insert(insert) => self.insert(insert),
            Statement::Query(query) => self.query(query),
            // Other kinds are barriers (see `footprint`).
            _ => Vec::new(),
        };
        // Every subquery's own level (nested ones are found by the same walk).
        let _ = sqlparser::ast::visit_expressions(statement, |expr| {
            match expr {
                Expr::Subquery(query) | Expr::Exists { subquery: query, .. } => accesses.extend(self.query(query)),
                Expr::In { target: InTarget::Subquery(query), .. } => accesses.extend(self.query(query)),
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
        // Every table named and not yet accounted for: read whole (a derived table, a
        // function, a statement kind not analysed).
        let mut named = BTreeSet::new();
        let _ = sqlparser::ast::visit_relations(statement, |name| {
            named.insert(name.to_string().to_lowercase());
            ControlFlow::<()>::Continue(())
        });
        let unknown_kind = !matches!(
            statement,
            Statement::Update(_) | Statement::Delete(_) | Statement::Insert(_) | Statement::Query(_)
        );
        for table in named {
            if unknown_kind {
                accesses.push(Access { table, write: true, keys: Keys::all() });
            } else if !accesses.iter().any(|access| access.table == table) {
                accesses.push(Access { table, write: false, keys: Keys::all() });
            }
        }
        accesses
    }

    fn update(
        &self,
        table: &TableWithJoins,
        assignments: &[sqlparser::ast::Assignment],
        selection: Option<&Expr>,
    ) -> Vec<Access> {
        let TableFactor::Table { name, alias, .. } = &table.relation else { return Vec::new() };
        if !table.joins.is_empty() {
            return Vec::new();
        }
        let target = self.scoped(name, alias.as_ref().map(|alias| alias.name.value.as_str()));
        let mut keys = self.keys_of(&target, &[&target], selection);
        // Setting the key moves rows anywhere in the table.
        let rekeys = assignments.iter().any(|assignment| match &assignment.target {
            AssignmentTarget::ColumnName(column) => column
                .0
                .last()
                .and_then(|part| part.as_ident())
                .is_some_and(|ident| Some(ident.value.to_lowercase()) == target.key),
            AssignmentTarget::Tuple(_) => true,
        });
        if rekeys {
            keys = Keys::all();
        }
        vec![Access { table: target.table.clone(), write: true, keys }]
    }

    fn insert(&self, insert: &sqlparser::ast::Insert) -> Vec<Access> {
        let TableObject::TableName(name) = &insert.table else { return Vec::new() };
        let target = self.scoped(name, None);
        let position = insert.columns.iter().position(|column| {
            column
                .0
                .last()
                .and_then(|part| part.as_ident())
                .is_some_and(|ident| Some(ident.value.to_lowercase()) == target.key)
        });
        let values = insert.source.as_ref().and_then(|source| match source.body.as_ref() {
            SetExpr::Values(values) => Some(values),
            _ => None,
        });
        let keys = match (position, values) {
            (Some(position), Some(values)) => values.rows.iter().try_fold(Keys::none(), |keys, row| {
                row.content.get(position).and_then(integer).map(|key| keys.union(&Keys::point(key)))
            }),
            _ => None,
        };
        vec![Access { table: target.table, write: true, keys: keys.unwrap_or_else(Keys::all) }]
    }

    /// The reads of a query's own level: each table of its FROM, bounded by its WHERE and
    /// its inner joins' conditions.
    fn query(&self, query: &Query) -> Vec<Access> {
        let SetExpr::Select(select) = query.body.as_ref() else { return Vec::new() };
        let mut scope = Vec::new();
        let mut conditions: Vec<&Expr> = select.selection.iter().collect();
        for from in &select.from {
            for (factor, operator) in std::iter::once((&from.relation, None))
                .chain(from.joins.iter().map(|join| (&join.relation, Some(&join.join_operator))))
            {
                let TableFactor::Table { name, alias, .. } = factor else { continue };
                scope.push(self.scoped(name, alias.as_ref().map(|alias| alias.name.value.as_str())));
                if let Some(JoinOperator::Join(JoinConstraint::On(on)) | JoinOperator::Inner(JoinConstraint::On(on))) =
                    operator
                {
                    conditions.push(on);
                }
            }
        }
        let scope_refs: Vec<&Scoped> = scope.iter().collect();
        let mut keys: Vec<Keys> = scope
            .iter()
            .map(|scoped| {
                conditions.iter().fold(Keys::all(), |keys, condition| {
                    keys.intersect(&self.keys_of(scoped, &scope_refs, Some(condition)))
                })
            })
            .collect();
        // `a.key = b.key` among the conditions' conjuncts: each side bounds the other.
        let mut equal = Vec::new();
        for condition in &conditions {
            for conjunct in conjuncts(condition) {
                if let Expr::BinaryOp { left, op: BinaryOperator::Eq, right } = conjunct {
                    if let (Some(a), Some(b)) = (key_column(left, &scope_refs), key_column(right, &scope_refs)) {
                        equal.push((a, b));
                    }
                }
            }
        }
        for _ in 0..2 {
            for (a, b) in &equal {
                let both = keys[*a].intersect(&keys[*b]);
                keys[*a] = both.clone();
                keys[*b] = both;
            }
        }
        scope.into_iter().zip(keys).map(|(scoped, keys)| Access { table: scoped.table, write: false, keys }).collect()
    }

    /// The keys of `target` that rows satisfying `condition` can have.
    fn keys_of(&self, target: &Scoped, scope: &[&Scoped], condition: Option<&Expr>) -> Keys {
        let Some(condition) = condition else { return Keys::all() };
        let is_key = |expr: &Expr| key_column(expr, scope).is_some_and(|at| std::ptr::eq(scope[at], target));
        bound(condition, &is_key)
    }
}

/// The top-level AND-ed parts of a condition.
fn conjuncts(expr: &Expr) -> Vec<&Expr> {
    match expr {
        Expr::BinaryOp { left, op: BinaryOperator::And, right } => {
            let mut parts = conjuncts(left);
            parts.extend(conjuncts(right));
            parts
        }
        Expr::Nested(inner) => conjuncts(inner),
        other => vec![other],
    }
}

/// Which table of `scope` has `expr` as its key column: `alias.key`, or `key` when one table
/// in scope has a key of that name.
fn key_column(expr: &Expr, scope: &[&Scoped]) -> Option<usize> {
    match expr {
        Expr::Identifier(ident) => {
            let name = ident.value.to_lowercase();
            let mut matching =
                scope.iter().enumerate().filter(|(_, scoped)| scoped.key.as_deref() == Some(name.as_str()));
            let (at, _) = matching.next()?;
            matching.next().is_none().then_some(at)
        }
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [alias, column] => scope.iter().position(|scoped| {
                scoped.alias == alias.value.to_lowercase()
                    && scoped.key.as_deref() == Some(column.value.to_lowercase().as_str())
            }),
            _ => None,
        },
        Expr::Nested(inner) => key_column(inner, scope),
        _ => None,
    }
}

/// An integer literal (possibly negated).
fn integer(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Value(value) => match &value.value {
            Value::Number(text, _) => text.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => integer(expr)?.checked_neg(),
        Expr::Nested(inner) => integer(inner),
        _ => None,
    }
}

/// The key values a row satisfying `expr` can have, `is_key` naming the key column.
fn bound(expr: &Expr, is_key: &dyn Fn(&Expr) -> bool) -> Keys {
    match expr {
        Expr::BinaryOp { left, op: BinaryOperator::And, right } => bound(left, is_key).intersect(&bound(right, is_key)),
        Expr::BinaryOp { left, op: BinaryOperator::Or, right } => bound(left, is_key).union(&bound(right, is_key)),
        Expr::BinaryOp { left, op, right } => {
            let (op, value) = match (is_key(left), integer(right), is_key(right), integer(left)) {
                (true, Some(value), _, _) => (op.clone(), value),
                (_, _, true, Some(value)) => (flipped(op), value),
                _ => return Keys::all(),
            };
            match op {
                BinaryOperator::Eq => Keys::point(value),
                BinaryOperator::Gt => Keys::range(value.saturating_add(1), i64::MAX),
                BinaryOperator::GtEq => Keys::range(value, i64::MAX),
                BinaryOperator::Lt => Keys::range(i64::MIN, value.saturating_sub(1)),
                BinaryOperator::LtEq => Keys::range(i64::MIN, value),
                _ => Keys::all(),
            }
        }
        Expr::Between { expr, negated: false, low, high } if is_key(expr) => match (integer(low), integer(high)) {
            (Some(low), Some(high)) => Keys::range(low, high),
            _ => Keys::all(),
        },
        Expr::In { expr, target: InTarget::List(list), negated: false, .. } if is_key(expr) => list
            .iter()
            .try_fold(Keys::none(), |keys, item| integer(item).map(|key| keys.union(&Keys::point(key))))
            .unwrap_or_else(Keys::all),
        Expr::Nested(inner) => bound(inner, is_key),
        _ => Keys::all(),
    }
}

/// `value op key` as `key op' value`.
fn flipped(op: &BinaryOperator) -> BinaryOperator {
    match op {
        BinaryOperator::Gt => BinaryOperator::Lt,
        BinaryOperator::GtEq => BinaryOperator::LtEq,
        BinaryOperator::Lt => BinaryOperator::Gt,
        BinaryOperator::LtEq => BinaryOperator::GtEq,
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smallbank::{self, Kind};

    fn of(sql: &str) -> Footprint {
        footprint(&Transaction::new(vec![sql.to_string()]), &smallbank::tables())
    }

    fn access(table: &str, write: bool, keys: Keys) -> Access {
        Access { table: table.to_string(), write, keys }
    }

    #[test]
    fn key_predicates_become_intervals() {
        let cases = [
            ("UPDATE checking SET bal = bal + 1 WHERE custid = 5", Keys::point(5)),
            ("UPDATE checking SET bal = 1 WHERE custid > 42", Keys::range(43, i64::MAX)),
            ("UPDATE checking SET bal = 1 WHERE 42 >= custid", Keys::range(i64::MIN, 42)),
            (
                "UPDATE checking SET bal = 1 WHERE custid BETWEEN 1 AND 3 OR custid = 9",
                Keys::range(1, 3).union(&Keys::point(9)),
            ),
            ("UPDATE checking SET bal = 1 WHERE custid IN (4, -2) AND bal > 7", Keys::point(-2).union(&Keys::point(4))),
            ("UPDATE checking SET bal = 1 WHERE bal > 7", Keys::all()),
            ("UPDATE checking SET bal = 1 WHERE custid = 3 OR bal > 7", Keys::all()),
            ("UPDATE checking SET custid = 8 WHERE custid = 3", Keys::all()),
            ("DELETE FROM checking WHERE custid < 0", Keys::range(i64::MIN, -1)),
            ("INSERT INTO checking (custid, bal) VALUES (3, 1), (9, 2)", Keys::point(3).union(&Keys::point(9))),
        ];
        for (sql, keys) in cases {
            assert_eq!(of(sql).accesses, vec![access("checking", true, keys)], "{sql}");
        }
    }

    #[test]
    fn smallbank_transactions_touch_their_customers_only() {
        let tables = smallbank::tables();
        let amalgamate = footprint(&smallbank::statements(Kind::Amalgamate, 3, 7, 0), &tables);
        for expected in [
            access("checking", true, Keys::point(7)),
            access("savings", false, Keys::point(3)),
            access("checking", false, Keys::point(3)),
            access("savings", true, Keys::point(3)),
            access("checking", true, Keys::point(3)),
        ] {
            assert!(amalgamate.accesses.contains(&expected), "{expected:?} in {:?}", amalgamate.accesses);
        }
        let balance = footprint(&smallbank::statements(Kind::Balance, 5, 0, 0), &tables);
        assert_eq!(
            balance.accesses,
            vec![access("savings", false, Keys::point(5)), access("checking", false, Keys::point(5))]
        );
        let pay = footprint(&smallbank::statements(Kind::SendPayment, 1, 2, 10), &tables);
        assert!(pay.conflicts(&footprint(&smallbank::statements(Kind::WriteCheck, 1, 0, 10), &tables)));
        assert!(!pay.conflicts(&footprint(&smallbank::statements(Kind::WriteCheck, 3, 0, 10), &tables)));
        assert!(
            !balance.conflicts(&footprint(&smallbank::statements(Kind::Balance, 5, 0, 0), &tables)),
            "reads commute"
        );
    }

    #[test]
    fn what_cannot_be_bounded_is_taken_whole() {
        let drop = of("DROP TABLE savings");
        assert!(drop.barrier && drop.conflicts(&of("SELECT 1")));
        // A derived table is not analysed: the table inside it is read whole.
        let derived = of("SELECT * FROM (SELECT bal FROM savings WHERE custid = 1) t");
        assert_eq!(derived.accesses, vec![access("savings", false, Keys::all())]);
        let garbage = of("UPDATE checking SET WHERE");
        assert!(garbage.barrier);
        assert!(garbage.conflicts(&of("SELECT 1")));
    }

    #[test]
    fn stages_follow_block_order() {
        let tables = smallbank::tables();
        let block = [
            smallbank::statements(Kind::DepositChecking, 1, 0, 5),
            smallbank::statements(Kind::DepositChecking, 2, 0, 5),
            smallbank::statements(Kind::SendPayment, 1, 2, 5),
            smallbank::statements(Kind::Balance, 3, 0, 0),
            smallbank::statements(Kind::WriteCheck, 2, 0, 5),
        ];
        let footprints: Vec<Footprint> = block.iter().map(|txn| footprint(txn, &tables)).collect();
        assert_eq!(stages(&footprints), vec![vec![0, 1, 3], vec![2], vec![4]]);
    }

    #[test]
    fn key_sets_merge_and_intersect() {
        let a = Keys::range(1, 5).union(&Keys::range(6, 8)).union(&Keys::point(20));
        assert_eq!(a, Keys(vec![(1, 8), (20, 20)]));
        assert_eq!(a.intersect(&Keys::range(7, 30)), Keys(vec![(7, 8), (20, 20)]));
        assert!(!a.overlaps(&Keys::range(9, 19)));
        assert!(Keys::all().union(&a).is_all());
        assert_eq!(Keys::range(5, 1), Keys::none());
    }
}
