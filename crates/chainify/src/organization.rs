//! What an organization's database does for the pipeline: install the shared tables with
//! their digest triggers, check that they are still there, execute a block (returning each
//! transaction's success and the digest rows its effects left), and keep the logical
//! checkpoints recovery restores.
//!
//! [`DatabaseOrganization`] does all of it over any [`SqlSession`] (SQLite's connection,
//! PostgreSQL's client), with the DDL of its [`Dialect`].

use virga_ledger::wlc::{digest_hash, DigestOp, DigestRow, Hash};

use crate::dialect::{checkpoint_block, checkpoint_table, image_expression, Dialect};
use crate::schema::{SchemaError, SharedTable};

/// One transaction of a block: SQL statements run in one database transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub statements: Vec<String>,
}

impl Transaction {
    pub fn new(statements: Vec<String>) -> Transaction {
        Transaction { statements }
    }

    /// The SQL text the LedgerBlock records.
    pub fn sql(&self) -> String {
        self.statements.join(";\n")
    }
}

/// What executing a block did at one organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockEffects {
    /// Whether each transaction committed at the database.
    pub successful: Vec<bool>,
    /// The digest rows of every shared table, emptied from the database for the next block.
    pub digests: Vec<DigestRow>,
}

impl BlockEffects {
    pub fn digest_hash(&self) -> Hash {
        digest_hash(&self.digests)
    }
}

/// What a database answered, whichever its driver.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Postgres(#[from] postgres::Error),
    /// A query of a table's state returned a NULL key or row image.
    #[error("table {table} returned a NULL key or image")]
    NullKeyOrImage { table: String },
    /// The organization's worker thread panicked before its database answered.
    #[error("the organization's thread panicked")]
    Panicked,
}

#[derive(Debug, thiserror::Error)]
pub enum OrganizationError {
    #[error("organization {org}: {what}: {error}")]
    Database { org: String, what: String, error: SqlError },
    #[error("organization {org}: table {table} lacks its digest trigger {trigger} (or it is disabled); reinstall it")]
    MissingTrigger { org: String, table: String, trigger: String },
    #[error("organization {org}: the shared table {table} is missing")]
    MissingTable { org: String, table: String },
    #[error("organization {org}: table {table} holds a digest row it cannot read: {problem}")]
    BadDigest { org: String, table: String, problem: String },
    #[error("organization {org}: no checkpoint of block {block}")]
    NoCheckpoint { org: String, block: u64 },
    #[error("organization {org}: {error}")]
    Schema { org: String, error: SchemaError },
}

/// An organization's database, whatever its kind.
pub trait Organization: Send {
    fn name(&self) -> &str;

    /// Creates the shared tables (if absent), their digest tables and triggers.
    fn install(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError>;

    /// Checks that every shared table and each of its digest triggers is present and
    /// enabled (at start and before every block: a restore or a careless administrator may
    /// have removed them, and effects without digests would go unseen).
    fn check_installed(&mut self) -> Result<(), OrganizationError>;

    /// Executes `transactions` in order, each in a database transaction of its own (rolled
    /// back if any statement fails), then takes the block's digest rows.
    fn execute_block(&mut self, transactions: &[Transaction]) -> Result<BlockEffects, OrganizationError>;

    /// Takes `tables` as the shared tables of a database that already holds them, changing
    /// nothing (to verify it).
    fn attach(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError>;

    /// Each shared table's hash over its rows' canonical images, in the tables' order.
    fn table_hashes(&mut self) -> Result<Vec<(String, Hash)>, OrganizationError>;

    /// A hash of every shared table's rows, to compare whole states.
    fn state_hash(&mut self) -> Result<Hash, OrganizationError> {
        let rows: Vec<DigestRow> = self
            .table_hashes()?
            .into_iter()
            .map(|(table, hash)| DigestRow {
                pk: String::new(),
                serial: 0,
                image: hash.iter().map(|byte| format!("{byte:02x}")).collect(),
                op: DigestOp::Insert,
                table,
            })
            .collect();
        Ok(digest_hash(&rows))
    }

    /// Copies every shared table as it is after block `block` (`CREATE TABLE … AS`).
    fn checkpoint(&mut self, block: u64) -> Result<(), OrganizationError>;

    /// The blocks this organization holds checkpoints of, oldest first.
    fn checkpoints(&mut self) -> Result<Vec<u64>, OrganizationError>;

    fn drop_checkpoint(&mut self, block: u64) -> Result<(), OrganizationError>;

    /// Replaces every shared table by its checkpoint of `block`, then reinstalls the
    /// constraints and digest triggers the copy does not carry.
    fn restore(&mut self, block: u64) -> Result<(), OrganizationError>;

    /// Drops every shared table and checkpoint and installs them empty (a full replay).
    fn reset(&mut self) -> Result<(), OrganizationError>;

    /// Runs `sql` outside the chain, as an administrator (or an attacker) with access to the
    /// database would: what the digests and the vote are there to catch.
    fn run_outside_chain(&mut self, sql: &str) -> Result<(), OrganizationError>;
}

/// A connection to a database, as the organization needs it.
pub trait SqlSession: Send {
    const DIALECT: Dialect;

    /// Runs statements that return nothing.
    fn batch(&mut self, sql: &str) -> Result<(), SqlError>;

    /// Runs `statements` in one database transaction; on the first error it is rolled back.
    fn atomically(&mut self, statements: &[String]) -> Result<(), SqlError>;

    /// Every row of a query whose columns are all text (cast in the query); NULL is None.
    fn texts(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, SqlError>;
}

/// An organization over a database session.
pub struct DatabaseOrganization<S> {
    name: String,
    session: S,
    /// More sessions to the same database: with any, a block runs in the stages of its
    /// semantic analysis, each stage's transactions spread over these sessions at once.
    workers: Vec<S>,
    tables: Vec<SharedTable>,
}

impl<S: SqlSession> DatabaseOrganization<S> {
    pub fn new(name: &str, session: S) -> DatabaseOrganization<S> {
        DatabaseOrganization { name: name.to_string(), session, workers: Vec::new(), tables: Vec::new() }
    }

    /// The worker sessions.
    pub fn workers_mut(&mut self) -> &mut [S] {
        &mut self.workers
    }

    /// Runs blocks in parallel stages over `workers` (see [`crate::analysis`]).
    pub fn with_workers(mut self, workers: Vec<S>) -> DatabaseOrganization<S> {
        self.workers = workers;
        self
    }

    /// Each transaction of `transactions` run once, stage by stage, the transactions of a
    /// stage spread over the worker sessions at once; success bits in block order.
    fn execute_staged(&mut self, transactions: &[Transaction]) -> Vec<bool> {
        let footprints: Vec<_> = transactions.iter().map(|txn| crate::analysis::footprint(txn, &self.tables)).collect();
        let mut successful = vec![false; transactions.len()];
        for stage in crate::analysis::stages(&footprints) {
            if stage.len() == 1 {
                successful[stage[0]] = self.session.atomically(&transactions[stage[0]].statements).is_ok();
                continue;
            }
            let lanes = self.workers.len();
            let results: Vec<Vec<(usize, bool)>> = std::thread::scope(|scope| {
                let running: Vec<_> = self
                    .workers
                    .iter_mut()
                    .enumerate()
                    .map(|(lane, worker)| {
                        let mine: Vec<usize> = stage.iter().copied().skip(lane).step_by(lanes).collect();
                        scope.spawn(move || {
                            mine.into_iter()
                                .map(|at| (at, worker.atomically(&transactions[at].statements).is_ok()))
                                .collect()
                        })
                    })
                    .collect();
                // A panicked lane's transactions count as failed; the vote then tells.
                running.into_iter().map(|lane| lane.join().unwrap_or_default()).collect()
            });
            for (at, ok) in results.into_iter().flatten() {
                successful[at] = ok;
            }
        }
        successful
    }

    /// The session, for what happens outside the chain (an administrator's statements, or a
    /// test's tampering).
    pub fn session(&mut self) -> &mut S {
        &mut self.session
    }

    fn failed(&self, what: &str, error: SqlError) -> OrganizationError {
        OrganizationError::Database { org: self.name.clone(), what: what.to_string(), error }
    }

    fn texts(&mut self, what: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>, OrganizationError> {
        self.session.texts(sql).map_err(|error| self.failed(what, error))
    }

    fn install_statements(table: &SharedTable) -> Vec<String> {
        let mut statements = vec![S::DIALECT.create_table(table), S::DIALECT.create_digest_table(table)];
        statements.extend(S::DIALECT.create_triggers(table));
        statements
    }

    /// Every digest row of every shared table, as the database holds them now.
    fn read_digests(&mut self) -> Result<Vec<DigestRow>, OrganizationError> {
        let mut rows = Vec::new();
        for table in self.tables.clone() {
            let digest = table.digest_table();
            let read = self
                .texts("reading the digests", &format!("SELECT pk, CAST(serial AS TEXT), image, op FROM {digest}"))?;
            for row in read {
                rows.push(self.digest_row(&table, row)?);
            }
        }
        Ok(rows)
    }

    fn take_digests(&mut self) -> Result<Vec<DigestRow>, OrganizationError> {
        let rows = self.read_digests()?;
        let empty: Vec<String> =
            self.tables.iter().map(|table| format!("DELETE FROM {}", table.digest_table())).collect();
        self.session.atomically(&empty).map_err(|error| self.failed("emptying the digest tables", error))?;
        Ok(rows)
    }

    /// Serial execution with one commit a block: each transaction inside a savepoint (a
    /// failing statement rolls back to it, so the transaction leaves no effect and no
    /// digest row, as on its own), the digests read and emptied, then one commit. A crash
    /// loses the whole block or nothing, and the pipeline answers no client before the
    /// block is decided, so every answered transaction is as durable as with a commit each.
    fn execute_in_one_transaction(&mut self, transactions: &[Transaction]) -> Result<BlockEffects, OrganizationError> {
        let result = self.run_in_one_transaction(transactions);
        if result.is_err() {
            let _ = self.session.batch("ROLLBACK");
        }
        result
    }

    fn run_in_one_transaction(&mut self, transactions: &[Transaction]) -> Result<BlockEffects, OrganizationError> {
        let batch =
            |this: &mut Self, sql: &str, what: &str| this.session.batch(sql).map_err(|error| this.failed(what, error));
        batch(self, "BEGIN", "starting the block's transaction")?;
        let mut successful = Vec::with_capacity(transactions.len());
        for transaction in transactions {
            batch(self, "SAVEPOINT chainify_txn", "opening a transaction's savepoint")?;
            let ok = transaction.statements.iter().all(|statement| self.session.batch(statement).is_ok());
            if !ok {
                batch(self, "ROLLBACK TO SAVEPOINT chainify_txn", "rolling a failed transaction back")?;
            }
            batch(self, "RELEASE SAVEPOINT chainify_txn", "releasing a transaction's savepoint")?;
            successful.push(ok);
        }
        let digests = self.read_digests()?;
        for table in self.tables.clone() {
            batch(self, &format!("DELETE FROM {}", table.digest_table()), "emptying the digest tables")?;
        }
        batch(self, "COMMIT", "committing the block")?;
        Ok(BlockEffects { successful, digests })
    }

    fn digest_row(&self, table: &SharedTable, row: Vec<Option<String>>) -> Result<DigestRow, OrganizationError> {
        let bad = |problem: String| OrganizationError::BadDigest {
            org: self.name.clone(),
            table: table.name.clone(),
            problem,
        };
        let [Some(pk), Some(serial), Some(image), Some(op)] =
            <[Option<String>; 4]>::try_from(row).map_err(|row| bad(format!("{} columns", row.len())))?
        else {
            return Err(bad("a NULL field".to_string()));
        };
        let serial = serial.parse::<u64>().map_err(|_| bad(format!("the serial {serial:?}")))?;
        let op = DigestOp::from_letter(&op).ok_or_else(|| bad(format!("the kind {op:?}")))?;
        Ok(DigestRow { table: table.name.clone(), pk, serial, image, op })
    }
}

impl<S: SqlSession> Organization for DatabaseOrganization<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn install(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError> {
        for table in tables {
            table.check().map_err(|error| OrganizationError::Schema { org: self.name.clone(), error })?;
        }
        let statements: Vec<String> = tables.iter().flat_map(Self::install_statements).collect();
        self.session.atomically(&statements).map_err(|error| self.failed("installing the shared tables", error))?;
        self.tables = tables.to_vec();
        Ok(())
    }

    fn check_installed(&mut self) -> Result<(), OrganizationError> {
        for table in self.tables.clone() {
            if self.texts("checking the tables", &S::DIALECT.table_exists(&table.name))?.is_empty() {
                return Err(OrganizationError::MissingTable { org: self.name.clone(), table: table.name.clone() });
            }
            for trigger in S::DIALECT.trigger_names(&table) {
                if self.texts("checking the triggers", &S::DIALECT.trigger_enabled(&table.name, &trigger))?.is_empty() {
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
        if self.workers.is_empty() {
            return self.execute_in_one_transaction(transactions);
        }
        // A statement that fails (a violated check, say) rolls its transaction back: the
        // block records it as unsuccessful, with no effect and no digest row.
        let successful = self.execute_staged(transactions);
        let digests = self.take_digests()?;
        Ok(BlockEffects { successful, digests })
    }

    fn attach(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError> {
        for table in tables {
            table.check().map_err(|error| OrganizationError::Schema { org: self.name.clone(), error })?;
        }
        self.tables = tables.to_vec();
        self.check_installed()
    }

    fn table_hashes(&mut self) -> Result<Vec<(String, Hash)>, OrganizationError> {
        let mut hashes = Vec::new();
        for table in self.tables.clone() {
            let sql = format!(
                "SELECT CAST(t.{key} AS TEXT), {image} FROM {name} t",
                key = table.primary_key,
                image = image_expression(&table, "t"),
                name = table.name
            );
            let mut rows = Vec::new();
            for row in self.texts("reading the state", &sql)? {
                let mut fields = row.into_iter();
                let (Some(Some(pk)), Some(Some(image))) = (fields.next(), fields.next()) else {
                    return Err(
                        self.failed("reading the state", SqlError::NullKeyOrImage { table: table.name.clone() })
                    );
                };
                rows.push(DigestRow { table: table.name.clone(), pk, serial: 0, image, op: DigestOp::Insert });
            }
            hashes.push((table.name.clone(), digest_hash(&rows)));
        }
        Ok(hashes)
    }

    fn checkpoint(&mut self, block: u64) -> Result<(), OrganizationError> {
        let statements: Vec<String> = self
            .tables
            .iter()
            .flat_map(|table| {
                let copy = checkpoint_table(block, &table.name);
                [format!("DROP TABLE IF EXISTS {copy}"), format!("CREATE TABLE {copy} AS SELECT * FROM {}", table.name)]
            })
            .collect();
        self.session
            .atomically(&statements)
            .map_err(|error| self.failed(&format!("checkpointing block {block}"), error))
    }

    fn checkpoints(&mut self) -> Result<Vec<u64>, OrganizationError> {
        let names = self.texts("listing the checkpoints", &S::DIALECT.checkpoint_tables())?;
        let mut blocks: Vec<u64> =
            names.into_iter().flatten().flatten().filter_map(|name| checkpoint_block(&name)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        // Only a checkpoint holding every shared table counts.
        let mut complete = Vec::new();
        for block in blocks {
            let mut whole = true;
            for table in self.tables.clone() {
                let exists = S::DIALECT.table_exists(&checkpoint_table(block, &table.name));
                whole &= !self.texts("listing the checkpoints", &exists)?.is_empty();
            }
            if whole {
                complete.push(block);
            }
        }
        Ok(complete)
    }

    fn drop_checkpoint(&mut self, block: u64) -> Result<(), OrganizationError> {
        let statements: Vec<String> = self
            .tables
            .iter()
            .map(|table| format!("DROP TABLE IF EXISTS {}", checkpoint_table(block, &table.name)))
            .collect();
        self.session.atomically(&statements).map_err(|error| self.failed("dropping a checkpoint", error))
    }

    fn restore(&mut self, block: u64) -> Result<(), OrganizationError> {
        if !self.checkpoints()?.contains(&block) {
            return Err(OrganizationError::NoCheckpoint { org: self.name.clone(), block });
        }
        let mut statements = Vec::new();
        for table in &self.tables {
            let columns: Vec<&str> = table.columns.iter().map(|column| column.name.as_str()).collect();
            let columns = columns.join(", ");
            statements.push(format!("DROP TABLE IF EXISTS {}", table.name));
            statements.push(S::DIALECT.create_table(table));
            statements.push(format!(
                "INSERT INTO {} ({columns}) SELECT {columns} FROM {}",
                table.name,
                checkpoint_table(block, &table.name)
            ));
            // Filled before the triggers return: the restore leaves no digest rows.
            statements.push(format!("DELETE FROM {}", table.digest_table()));
        }
        statements.extend(self.tables.iter().flat_map(Self::install_statements));
        self.session.atomically(&statements).map_err(|error| self.failed(&format!("restoring block {block}"), error))
    }

    fn reset(&mut self) -> Result<(), OrganizationError> {
        for block in self.checkpoints()? {
            self.drop_checkpoint(block)?;
        }
        let mut statements = Vec::new();
        for table in &self.tables {
            statements.push(format!("DROP TABLE IF EXISTS {}", table.name));
            statements.push(format!("DROP TABLE IF EXISTS {}", table.digest_table()));
        }
        statements.extend(self.tables.iter().flat_map(Self::install_statements));
        self.session.atomically(&statements).map_err(|error| self.failed("resetting the shared tables", error))
    }

    fn run_outside_chain(&mut self, sql: &str) -> Result<(), OrganizationError> {
        self.session.batch(sql).map_err(|error| self.failed("running a statement outside the chain", error))
    }
}
