//! Organizations on SQLite (rusqlite, the library built in): real and deterministic, so the
//! simulator's organizations can run on it in memory.

use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::Connection;

use crate::dialect::Dialect;
use crate::organization::{DatabaseOrganization, OrganizationError, SqlError, SqlSession};

/// An organization whose database is SQLite.
pub type SqliteOrganization = DatabaseOrganization<Connection>;

/// How SQLite makes a commit durable (its `synchronous` setting, in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqliteSync {
    /// Every commit is synced (`synchronous = FULL`).
    Full,
    /// The WAL is synced at checkpoints only (`synchronous = NORMAL`): a power loss may lose
    /// the newest commits, never corrupt.
    Normal,
}

impl SqliteSync {
    pub fn name(self) -> &'static str {
        match self {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        }
    }
}

fn opening(name: &str, what: String, error: rusqlite::Error) -> OrganizationError {
    OrganizationError::Database { org: name.to_string(), what, error: error.into() }
}

impl SqliteOrganization {
    /// A database in a file, in WAL mode with the given durability.
    pub fn open(name: &str, path: &Path, sync: SqliteSync) -> Result<SqliteOrganization, OrganizationError> {
        SqliteOrganization::open_with_workers(name, path, sync, 0)
    }

    /// As [`SqliteOrganization::open`], with `workers` more connections that run each
    /// block's stages at once (SQLite still lets one writer in at a time; they wait for it).
    pub fn open_with_workers(
        name: &str,
        path: &Path,
        sync: SqliteSync,
        workers: usize,
    ) -> Result<SqliteOrganization, OrganizationError> {
        let open = || {
            let connection =
                Connection::open(path).map_err(|error| opening(name, format!("opening {}", path.display()), error))?;
            connection
                .execute_batch(&format!("PRAGMA journal_mode = WAL; PRAGMA synchronous = {};", sync.name()))
                .and_then(|()| connection.busy_timeout(std::time::Duration::from_secs(30)))
                .map_err(|error| opening(name, "setting the journal mode".to_string(), error))?;
            Ok(connection)
        };
        let main = open()?;
        let workers = (0..workers).map(|_| open()).collect::<Result<Vec<_>, OrganizationError>>()?;
        Ok(DatabaseOrganization::new(name, main).with_workers(workers))
    }

    /// A database in memory (the simulator's organizations, and tests).
    pub fn in_memory(name: &str) -> Result<SqliteOrganization, OrganizationError> {
        let connection =
            Connection::open_in_memory().map_err(|error| opening(name, "opening in memory".to_string(), error))?;
        Ok(DatabaseOrganization::new(name, connection))
    }
}

impl SqlSession for Connection {
    const DIALECT: Dialect = Dialect::Sqlite;

    fn batch(&mut self, sql: &str) -> Result<(), SqlError> {
        self.execute_batch(sql).map_err(SqlError::from)
    }

    fn atomically(&mut self, statements: &[String]) -> Result<(), SqlError> {
        let transaction = self.transaction().map_err(SqlError::from)?;
        for statement in statements {
            transaction.execute_batch(statement).map_err(SqlError::from)?;
        }
        transaction.commit().map_err(SqlError::from)
    }

    fn texts(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, SqlError> {
        let mut statement = self.prepare(sql).map_err(SqlError::from)?;
        let columns = statement.column_count();
        let rows = statement
            .query_map([], |row| {
                (0..columns)
                    .map(|at| {
                        Ok(match row.get_ref(at)? {
                            ValueRef::Null => None,
                            ValueRef::Integer(value) => Some(value.to_string()),
                            ValueRef::Real(value) => Some(value.to_string()),
                            ValueRef::Text(text) | ValueRef::Blob(text) => {
                                Some(String::from_utf8_lossy(text).into_owned())
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, rusqlite::Error>>()
            })
            .map_err(SqlError::from)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(SqlError::from)
    }
}
