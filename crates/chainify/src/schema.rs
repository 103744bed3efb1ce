//! The shared tables: the part of each organization's database the consortium agrees on.

/// A column's type, as both PostgreSQL and SQLite store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// A 64-bit integer (`BIGINT` in PostgreSQL, `INTEGER` in SQLite).
    Integer,
    Text,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub kind: ColumnKind,
    pub nullable: bool,
}

impl Column {
    pub fn new(name: &str, kind: ColumnKind) -> Column {
        Column { name: name.to_string(), kind, nullable: false }
    }
}

/// A table every organization holds, with a one-column primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTable {
    pub name: String,
    /// In the order the canonical image lists them; the primary key among them.
    pub columns: Vec<Column>,
    pub primary_key: String,
    /// Extra `CHECK` conditions (SQL both dialects accept), reinstalled with the table.
    pub checks: Vec<String>,
}

/// A shared table that cannot be installed as described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "{0:?} is not an identifier Virga splices into SQL: use 1 to 32 of a-z, 0-9 and _, not starting with a digit"
    )]
    BadIdentifier(String),
    #[error("table {table}: the primary key {key:?} is not one of its columns")]
    NoPrimaryKey { table: String, key: String },
    #[error("table {table}: the primary key {key:?} may not be NULL")]
    NullableKey { table: String, key: String },
    #[error("table {table}: column {column:?} appears twice")]
    DuplicateColumn { table: String, column: String },
    #[error("table {table}: the names starting with chainify_ are Virga's own")]
    Reserved { table: String },
}

/// The longest shared table or column name: Virga's own names add up to 31 characters to
/// a table's (a checkpoint's), and PostgreSQL cuts identifiers at 63.
pub const MAX_IDENTIFIER: usize = 32;

/// Whether `name` is safe to splice into SQL unquoted in both dialects (lower case, so that
/// PostgreSQL's folding leaves it as written).
pub fn check_identifier(name: &str) -> Result<(), SchemaError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IDENTIFIER
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(SchemaError::BadIdentifier(name.to_string()))
    }
}

impl SharedTable {
    /// Checks the names and the key.
    pub fn check(&self) -> Result<(), SchemaError> {
        check_identifier(&self.name)?;
        if self.name.starts_with("chainify_") {
            return Err(SchemaError::Reserved { table: self.name.clone() });
        }
        for (at, column) in self.columns.iter().enumerate() {
            check_identifier(&column.name)?;
            if self.columns[..at].iter().any(|other| other.name == column.name) {
                return Err(SchemaError::DuplicateColumn { table: self.name.clone(), column: column.name.clone() });
            }
        }
        let key = self
            .key_column()
            .ok_or_else(|| SchemaError::NoPrimaryKey { table: self.name.clone(), key: self.primary_key.clone() })?;
        if key.nullable {
            return Err(SchemaError::NullableKey { table: self.name.clone(), key: self.primary_key.clone() });
        }
        Ok(())
    }

    pub fn key_column(&self) -> Option<&Column> {
        self.columns.iter().find(|column| column.name == self.primary_key)
    }

    /// The digest table the triggers write this table's changes into.
    pub fn digest_table(&self) -> String {
        format!("chainify_digest_{}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, key: &str) -> SharedTable {
        SharedTable {
            name: name.to_string(),
            columns: vec![Column::new("custid", ColumnKind::Integer), Column::new("bal", ColumnKind::Integer)],
            primary_key: key.to_string(),
            checks: Vec::new(),
        }
    }

    #[test]
    fn identifiers_that_could_break_out_of_sql_are_refused() {
        for bad in ["", "Checking", "bal; DROP TABLE x", "1abc", "a-b", "\"q\"", &"x".repeat(33)] {
            assert_eq!(check_identifier(bad), Err(SchemaError::BadIdentifier(bad.to_string())), "{bad:?}");
        }
        for good in ["checking", "_t", "t2", "custid"] {
            assert_eq!(check_identifier(good), Ok(()));
        }
    }

    #[test]
    fn a_table_needs_its_key_and_distinct_columns() {
        assert_eq!(table("checking", "custid").check(), Ok(()));
        assert!(matches!(table("checking", "id").check(), Err(SchemaError::NoPrimaryKey { .. })));
        assert!(matches!(table("chainify_x", "custid").check(), Err(SchemaError::Reserved { .. })));
        let mut twice = table("checking", "custid");
        twice.columns.push(Column::new("bal", ColumnKind::Text));
        assert!(matches!(twice.check(), Err(SchemaError::DuplicateColumn { .. })));
        let mut nullable = table("checking", "custid");
        nullable.columns[0].nullable = true;
        assert!(matches!(nullable.check(), Err(SchemaError::NullableKey { .. })));
    }
}
