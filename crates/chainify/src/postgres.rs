//! Organizations on PostgreSQL, through the synchronous `postgres` client.

use postgres::{Client, NoTls, SimpleQueryMessage};

use crate::dialect::Dialect;
use crate::organization::{DatabaseOrganization, OrganizationError, SqlSession};

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
        let failed = |what: &str, error: postgres::Error| OrganizationError::Database {
            org: name.to_string(),
            what: what.to_string(),
            error: error.to_string(),
        };
        let mut client = Client::connect(connection, NoTls).map_err(|error| failed("connecting", error))?;
        let setting = if synchronous_commit { "on" } else { "off" };
        client
            .batch_execute(&format!("SET synchronous_commit = {setting}; SET client_min_messages = warning"))
            .map_err(|error| failed("configuring the session", error))?;
        Ok(DatabaseOrganization::new(name, client))
    }
}

impl SqlSession for Client {
    const DIALECT: Dialect = Dialect::Postgres;

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        self.batch_execute(sql).map_err(|error| error.to_string())
    }

    fn atomically(&mut self, statements: &[String]) -> Result<(), String> {
        let mut transaction = self.transaction().map_err(|error| error.to_string())?;
        for statement in statements {
            transaction.batch_execute(statement).map_err(|error| error.to_string())?;
        }
        transaction.commit().map_err(|error| error.to_string())
    }

    fn texts(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        // The simple protocol returns every column as text.
        let messages = self.simple_query(sql).map_err(|error| error.to_string())?;
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
