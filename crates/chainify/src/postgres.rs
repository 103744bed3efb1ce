//! Organizations on PostgreSQL, through the synchronous `postgres` client.

use postgres::{Client, NoTls, SimpleQueryMessage};

use crate::dialect::Dialect;
use crate::organization::{DatabaseOrganization, OrganizationError, SqlError, SqlSession};

/// An organization whose database is PostgreSQL.
pub type PostgresOrganization = DatabaseOrganization<Client>;

impl PostgresOrganization {
    /// Connects to the database `connection` names (`host=… port=… user=… dbname=…`);
    /// `synchronous_commit` is PostgreSQL's setting of that name for this session.
    pub fn connect(
        name: &str,
        connection: &str,
        synchronous_commit: bool,
    ) -> Result<PostgresOrganization, OrganizationError> {
        PostgresOrganization::connect_with_workers(name, connection, synchronous_commit, 0)
    }

    /// As [`PostgresOrganization::connect`], with `workers` more connections that run each
    /// block's stages in parallel (none: serial execution).
    pub fn connect_with_workers(
        name: &str,
        connection: &str,
        synchronous_commit: bool,
        workers: usize,
    ) -> Result<PostgresOrganization, OrganizationError> {
        let open = || {
            session(connection, synchronous_commit).map_err(|error| OrganizationError::Database {
                org: name.to_string(),
                what: "connecting".to_string(),
                error: error.into(),
            })
        };
        let main = open()?;
        let workers = (0..workers).map(|_| open()).collect::<Result<Vec<_>, _>>()?;
        Ok(DatabaseOrganization::new(name, main).with_workers(workers))
    }
}

/// A connection with the session's settings.
fn session(connection: &str, synchronous_commit: bool) -> Result<Client, postgres::Error> {
    let mut client = Client::connect(connection, NoTls)?;
    let setting = if synchronous_commit { "on" } else { "off" };
    client.batch_execute(&format!("SET synchronous_commit = {setting}; SET client_min_messages = warning"))?;
    Ok(client)
}

impl SqlSession for Client {
    const DIALECT: Dialect = Dialect::Postgres;

    fn batch(&mut self, sql: &str) -> Result<(), SqlError> {
        self.batch_execute(sql).map_err(SqlError::from)
    }

    fn atomically(&mut self, statements: &[String]) -> Result<(), SqlError> {
        let mut transaction = self.transaction().map_err(SqlError::from)?;
        for statement in statements {
            transaction.batch_execute(statement).map_err(SqlError::from)?;
        }
        transaction.commit().map_err(SqlError::from)
    }

    fn texts(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, SqlError> {
        // The simple protocol returns every column as text.
        let messages = self.simple_query(sql).map_err(SqlError::from)?;
        Ok(messages
            .into_iter()
            .filter_map(|message| match message {
                SimpleQueryMessage::Row(row) => {
                    Some((0..row.len()).map(|at| row.get(at).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect())
    }
}
