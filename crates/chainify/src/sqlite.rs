//! An organization on SQLite (rusqlite, the library built in): real and deterministic, so
//! the simulator's organizations run on it in memory.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};
use virga_ledger::wlc::{DigestOp, DigestRow};

use crate::dialect::Dialect;
use crate::organization::{BlockEffects, Organization, OrganizationError, Transaction};
use crate::schema::SharedTable;

/// How SQLite makes a commit durable (its `synchronous` setting, in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqliteSync {
    /// Every commit is synced (`synchronous = FULL`).
    Full,
    /// The WAL is synced at checkpoints only (`synchronous = NORMAL`): a power loss may lose
    /// the newest commits, never corrupt.
    Normal,
}

pub struct SqliteOrganization {
    name: String,
    connection: Connection,
    tables: Vec<SharedTable>,
}

impl SqliteOrganization {
    /// A database in a file, in WAL mode with the given durability.
    pub fn open(name: &str, path: &Path, sync: SqliteSync) -> Result<SqliteOrganization, OrganizationError> {
        let connection =
            Connection::open(path).map_err(|error| database(name, &format!("opening {}", path.display()), error))?;
        let sync = match sync {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        };
        connection
            .execute_batch(&format!("PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync};"))
            .map_err(|error| database(name, "setting the journal mode", error))?;
        Ok(SqliteOrganization { name: name.to_string(), connection, tables: Vec::new() })
    }

    /// A database in memory (the simulator's organizations, and tests).
    pub fn in_memory(name: &str) -> Result<SqliteOrganization, OrganizationError> {
        let connection = Connection::open_in_memory().map_err(|error| database(name, "opening in memory", error))?;
        Ok(SqliteOrganization { name: name.to_string(), connection, tables: Vec::new() })
    }

    /// The connection, for what happens outside the chain (an administrator's statements, or
    /// a test's tampering).
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.connection
    }

    fn take_digests(&mut self) -> Result<Vec<DigestRow>, OrganizationError> {
        let name = self.name.clone();
        let transaction =
            self.connection.transaction().map_err(|error| database(&name, "taking the digests", error))?;
        let mut rows = Vec::new();
        for table in &self.tables {
            let digest = table.digest_table();
            let mut select = transaction
                .prepare(&format!("SELECT pk, serial, image, op FROM {digest}"))
                .map_err(|error| database(&name, &format!("reading {digest}"), error))?;
            let read = select
                .query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                    ))
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|error| database(&name, &format!("reading {digest}"), error))?;
            for (pk, serial, image, op) in read {
                let op = DigestOp::from_letter(&op).ok_or_else(|| OrganizationError::BadDigest {
                    org: name.clone(),
                    table: table.name.clone(),
                    op: op.clone(),
                })?;
                let serial = u64::try_from(serial).map_err(|_| OrganizationError::BadDigest {
                    org: name.clone(),
                    table: table.name.clone(),
                    op: format!("serial {serial}"),
                })?;
                rows.push(DigestRow { table: table.name.clone(), pk, serial, image, op });
            }
            drop(select);
            transaction
                .execute(&format!("DELETE FROM {digest}"), [])
                .map_err(|error| database(&name, &format!("emptying {digest}"), error))?;
        }
        transaction.commit().map_err(|error| database(&name, "taking the digests", error))?;
        Ok(rows)
    }
}

fn database(org: &str, what: &str, error: rusqlite::Error) -> OrganizationError {
    OrganizationError::Database { org: org.to_string(), what: what.to_string(), error: error.to_string() }
}

impl Organization for SqliteOrganization {
    fn name(&self) -> &str {
        &self.name
    }

    fn install(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError> {
        for table in tables {
            table.check().map_err(|error| OrganizationError::Schema { org: self.name.clone(), error })?;
        }
        let name = self.name.clone();
        let transaction = self.connection.transaction().map_err(|error| database(&name, "installing", error))?;
        for table in tables {
            let mut statements = vec![Dialect::Sqlite.create_table(table), Dialect::Sqlite.create_digest_table(table)];
            statements.extend(Dialect::Sqlite.create_triggers(table));
            for statement in statements {
                transaction
                    .execute_batch(&statement)
                    .map_err(|error| database(&name, &format!("installing {}", table.name), error))?;
            }
        }
        transaction.commit().map_err(|error| database(&name, "installing", error))?;
        self.tables = tables.to_vec();
        Ok(())
    }

    fn check_installed(&mut self) -> Result<(), OrganizationError> {
        let find = |connection: &Connection, kind: &str, object: &str| {
            connection
                .query_row("SELECT name FROM sqlite_master WHERE type = ?1 AND name = ?2", [kind, object], |row| {
                    row.get::<_, String>(0)
                })
                .optional()
        };
        for table in &self.tables {
            let present = find(&self.connection, "table", &table.name)
                .map_err(|error| database(&self.name, "checking the tables", error))?;
            if present.is_none() {
                return Err(OrganizationError::MissingTable { org: self.name.clone(), table: table.name.clone() });
            }
            for trigger in Dialect::Sqlite.trigger_names(table) {
                let present = find(&self.connection, "trigger", &trigger)
                    .map_err(|error| database(&self.name, "checking the triggers", error))?;
                if present.is_none() {
                    return Err(OrganizationError::MissingTrigger {
                        org: self.name.clone(),
                        table: table.name.clone(),
                        trigger,
                    });
                }
            }
        }
        Ok(())
    }

    fn execute_block(&mut self, transactions: &[Transaction]) -> Result<BlockEffects, OrganizationError> {
        self.check_installed()?;
        let mut successful = Vec::with_capacity(transactions.len());
        for transaction in transactions {
            let name = self.name.clone();
            let open =
                self.connection.transaction().map_err(|error| database(&name, "beginning a transaction", error))?;
            // A statement that fails (a violated check, say) rolls the transaction back when
            // `open` is dropped: the block records it as unsuccessful.
            let ran = transaction.statements.iter().try_for_each(|statement| open.execute_batch(statement));
            let committed = ran.is_ok() && open.commit().is_ok();
            successful.push(committed);
        }
        let digests = self.take_digests()?;
        Ok(BlockEffects { successful, digests })
    }
}
