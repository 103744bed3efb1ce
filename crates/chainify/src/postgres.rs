//! An organization on PostgreSQL, through the synchronous `postgres` client.

use postgres::{Client, NoTls};
use virga_ledger::wlc::{DigestOp, DigestRow};

use crate::dialect::Dialect;
use crate::organization::{BlockEffects, Organization, OrganizationError, Transaction};
use crate::schema::SharedTable;

pub struct PostgresOrganization {
    name: String,
    client: Client,
    tables: Vec<SharedTable>,
}

fn database(org: &str, what: &str, error: postgres::Error) -> OrganizationError {
    OrganizationError::Database { org: org.to_string(), what: what.to_string(), error: error.to_string() }
}

impl PostgresOrganization {
    /// Connects to the database `connection` names (`host=… port=… user=… dbname=…`);
    /// `synchronous_commit` is PostgreSQL's setting of that name for this session.
    pub fn connect(
        name: &str,
        connection: &str,
        synchronous_commit: bool,
    ) -> Result<PostgresOrganization, OrganizationError> {
        let mut client = Client::connect(connection, NoTls).map_err(|error| database(name, "connecting", error))?;
        let setting = if synchronous_commit { "on" } else { "off" };
        client
            .batch_execute(&format!("SET synchronous_commit = {setting}; SET client_min_messages = warning"))
            .map_err(|error| database(name, "configuring the session", error))?;
        Ok(PostgresOrganization { name: name.to_string(), client, tables: Vec::new() })
    }

    /// The client, for what happens outside the chain (an administrator's statements, or a
    /// test's tampering).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    fn take_digests(&mut self) -> Result<Vec<DigestRow>, OrganizationError> {
        let name = self.name.clone();
        let mut transaction =
            self.client.transaction().map_err(|error| database(&name, "taking the digests", error))?;
        let mut rows = Vec::new();
        for table in &self.tables {
            let digest = table.digest_table();
            let read = transaction
                .query(&format!("SELECT pk, serial, image, op FROM {digest}"), &[])
                .map_err(|error| database(&name, &format!("reading {digest}"), error))?;
            for row in read {
                let (pk, serial, image, op): (String, i64, String, String) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                let bad =
                    |op: String| OrganizationError::BadDigest { org: name.clone(), table: table.name.clone(), op };
                let kind = DigestOp::from_letter(&op).ok_or_else(|| bad(op.clone()))?;
                let serial = u64::try_from(serial).map_err(|_| bad(format!("serial {serial}")))?;
                rows.push(DigestRow { table: table.name.clone(), pk, serial, image, op: kind });
            }
            transaction
                .batch_execute(&format!("DELETE FROM {digest}"))
                .map_err(|error| database(&name, &format!("emptying {digest}"), error))?;
        }
        transaction.commit().map_err(|error| database(&name, "taking the digests", error))?;
        Ok(rows)
    }
}

impl Organization for PostgresOrganization {
    fn name(&self) -> &str {
        &self.name
    }

    fn install(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError> {
        for table in tables {
            table.check().map_err(|error| OrganizationError::Schema { org: self.name.clone(), error })?;
        }
        let name = self.name.clone();
        let mut transaction = self.client.transaction().map_err(|error| database(&name, "installing", error))?;
        for table in tables {
            let mut statements =
                vec![Dialect::Postgres.create_table(table), Dialect::Postgres.create_digest_table(table)];
            statements.extend(Dialect::Postgres.create_triggers(table));
            for statement in statements {
                transaction
                    .batch_execute(&statement)
                    .map_err(|error| database(&name, &format!("installing {}", table.name), error))?;
            }
        }
        transaction.commit().map_err(|error| database(&name, "installing", error))?;
        self.tables = tables.to_vec();
        Ok(())
    }

    fn check_installed(&mut self) -> Result<(), OrganizationError> {
        for table in &self.tables {
            let present = self
                .client
                .query_opt(
                    "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1",
                    &[&table.name],
                )
                .map_err(|error| database(&self.name, "checking the tables", error))?;
            if present.is_none() {
                return Err(OrganizationError::MissingTable { org: self.name.clone(), table: table.name.clone() });
            }
            for trigger in Dialect::Postgres.trigger_names(table) {
                // Present and enabled: a disabled trigger records nothing either.
                let present = self
                    .client
                    .query_opt(
                        "SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = $1 AND \
                         c.relname = $2 AND t.tgenabled <> 'D'",
                        &[&trigger, &table.name],
                    )
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
            let mut open =
                self.client.transaction().map_err(|error| database(&name, "beginning a transaction", error))?;
            // A failing statement leaves the transaction aborted; dropping `open` rolls it back.
            let ran = transaction.statements.iter().try_for_each(|statement| open.batch_execute(statement));
            let committed = ran.is_ok() && open.commit().is_ok();
            successful.push(committed);
        }
        let digests = self.take_digests()?;
        Ok(BlockEffects { successful, digests })
    }
}
