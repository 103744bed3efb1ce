//! The SQL each DBMS gets for a shared table: the table, its digest table and the triggers
//! that fill it.
//!
//! The canonical row image is built by SQL both dialects evaluate alike: each column in the
//! table's order, `~` for NULL or else `<characters>:<text>` (an integer in decimal, text as
//! stored), joined by `|`. The length prefix keeps a value containing `|` or `~` from being
//! read as a field boundary; `length` counts characters in both PostgreSQL and SQLite.

use crate::schema::{ColumnKind, SharedTable};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    fn type_name(self, kind: ColumnKind) -> &'static str {
        match (self, kind) {
            (Dialect::Sqlite, ColumnKind::Integer) => "INTEGER",
            (Dialect::Postgres, ColumnKind::Integer) => "BIGINT",
            (_, ColumnKind::Text) => "TEXT",
        }
    }

    /// `CREATE TABLE` for the shared table itself, with its key and checks (the
    /// constraints a recovery reinstalls).
    pub fn create_table(self, table: &SharedTable) -> String {
        let mut parts: Vec<String> = table
            .columns
            .iter()
            .map(|column| {
                let null = if column.nullable { "" } else { " NOT NULL" };
                format!("{} {}{null}", column.name, self.type_name(column.kind))
            })
            .collect();
        parts.push(format!("PRIMARY KEY ({})", table.primary_key));
        parts.extend(table.checks.iter().map(|check| format!("CHECK ({check})")));
        format!("CREATE TABLE IF NOT EXISTS {} ({})", table.name, parts.join(", "))
    }

    /// `CREATE TABLE` for the table's digest rows, with the index a trigger's serial lookup
    /// uses (without it, a block changing n rows scans the digest table n times).
    pub fn create_digest_table(self, table: &SharedTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {digest} (pk TEXT NOT NULL, serial {integer} NOT NULL, image TEXT NOT NULL, op \
             TEXT NOT NULL); CREATE INDEX IF NOT EXISTS {digest}_pk ON {digest} (pk, serial)",
            digest = table.digest_table(),
            integer = self.type_name(ColumnKind::Integer)
        )
    }

    /// The names of the triggers [`Dialect::create_triggers`] installs, to check their
    /// presence.
    pub fn trigger_names(self, table: &SharedTable) -> Vec<String> {
        match self {
            Dialect::Sqlite => ["insert", "update", "rekey", "delete"]
                .iter()
                .map(|kind| format!("chainify_{}_{kind}", table.name))
                .collect(),
            Dialect::Postgres => vec![format!("chainify_{}", table.name)],
        }
    }

    /// The statements that install the digest triggers (after the digest table).
    pub fn create_triggers(self, table: &SharedTable) -> Vec<String> {
        let insert = |row: &str, op: &str| {
            format!(
                "INSERT INTO {digest} (pk, serial, image, op) VALUES (CAST({row}.{key} AS TEXT), (SELECT \
                 COALESCE(MAX(serial), -1) + 1 FROM {digest} WHERE pk = CAST({row}.{key} AS TEXT)), {image}, '{op}');",
                digest = table.digest_table(),
                key = table.primary_key,
                image = image_expression(table, row),
            )
        };
        let name = &table.name;
        match self {
            Dialect::Sqlite => vec![
                format!(
                    "CREATE TRIGGER IF NOT EXISTS chainify_{name}_insert AFTER INSERT ON {name} FOR EACH ROW BEGIN {} \
                     END",
                    insert("NEW", "I")
                ),
                // A key that changes is a delete of the old row, then the new row.
                format!(
                    "CREATE TRIGGER IF NOT EXISTS chainify_{name}_rekey AFTER UPDATE ON {name} FOR EACH ROW WHEN \
                     OLD.{key} IS NOT NEW.{key} BEGIN {} END",
                    insert("OLD", "D"),
                    key = table.primary_key
                ),
                format!(
                    "CREATE TRIGGER IF NOT EXISTS chainify_{name}_update AFTER UPDATE ON {name} FOR EACH ROW BEGIN {} \
                     END",
                    insert("NEW", "U")
                ),
                format!(
                    "CREATE TRIGGER IF NOT EXISTS chainify_{name}_delete AFTER DELETE ON {name} FOR EACH ROW BEGIN {} \
                     END",
                    insert("OLD", "D")
                ),
            ],
            Dialect::Postgres => vec![
                format!(
                    "CREATE OR REPLACE FUNCTION chainify_{name}_digest() RETURNS trigger LANGUAGE plpgsql AS $body$ \
                     BEGIN IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.{key} IS DISTINCT FROM NEW.{key}) THEN {} \
                     END IF; IF TG_OP = 'INSERT' THEN {} ELSIF TG_OP = 'UPDATE' THEN {} END IF; RETURN NULL; END \
                     $body$",
                    insert("OLD", "D"),
                    insert("NEW", "I"),
                    insert("NEW", "U"),
                    key = table.primary_key
                ),
                format!("DROP TRIGGER IF EXISTS chainify_{name} ON {name}"),
                format!(
                    "CREATE TRIGGER chainify_{name} AFTER INSERT OR UPDATE OR DELETE ON {name} FOR EACH ROW EXECUTE \
                     FUNCTION chainify_{name}_digest()"
                ),
            ],
        }
    }
}

impl Dialect {
    /// A query with one row if the table `name` exists (names are checked identifiers).
    pub fn table_exists(self, name: &str) -> String {
        match self {
            Dialect::Sqlite => format!("SELECT name FROM sqlite_master WHERE type = 'table' AND name = '{name}'"),
            Dialect::Postgres => {
                format!("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename = '{name}'")
            }
        }
    }

    /// A query with one row if `trigger` is installed on `table` and enabled (a disabled
    /// trigger records nothing either).
    pub fn trigger_enabled(self, table: &str, trigger: &str) -> String {
        match self {
            Dialect::Sqlite => format!(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name = '{trigger}' AND tbl_name = '{table}'"
            ),
            Dialect::Postgres => format!(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = '{trigger}' \
                 AND c.relname = '{table}' AND t.tgenabled <> 'D'"
            ),
        }
    }

    /// A query of the names of the tables whose names start with `chainify_ckpt_`.
    pub fn checkpoint_tables(self) -> String {
        match self {
            Dialect::Sqlite => {
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'chainify_ckpt_%'".to_string()
            }
            Dialect::Postgres => "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename \
                                  LIKE 'chainify_ckpt_%'"
                .to_string(),
        }
    }
}

/// The table holding `table`'s rows as of the end of block `block`.
pub fn checkpoint_table(block: u64, table: &str) -> String {
    format!("chainify_ckpt_{block:016x}_{table}")
}

/// The block a checkpoint table's name gives, if it is one.
pub fn checkpoint_block(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("chainify_ckpt_")?;
    let (hex, _) = rest.split_at_checked(16)?;
    u64::from_str_radix(hex, 16).ok()
}

/// The canonical image of `row` (`NEW` or `OLD` in a trigger; a table alias in a query).
pub fn image_expression(table: &SharedTable, row: &str) -> String {
    let fields: Vec<String> = table
        .columns
        .iter()
        .map(|column| {
            let value = format!("CAST({row}.{} AS TEXT)", column.name);
            format!("(CASE WHEN {value} IS NULL THEN '~' ELSE CAST(length({value}) AS TEXT) || ':' || {value} END)")
        })
        .collect();
    fields.join(" || '|' || ")
}
