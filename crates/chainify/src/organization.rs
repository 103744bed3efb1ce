//! What an organization's database does for the pipeline: install the shared tables with
//! their digest triggers, check that they are still there, and execute a block, returning
//! each transaction's success and the digest rows its effects left.

use virga_ledger::wlc::{digest_hash, DigestRow, Hash};

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

#[derive(Debug, thiserror::Error)]
pub enum OrganizationError {
    #[error("organization {org}: {what}: {error}")]
    Database { org: String, what: String, error: String },
    #[error("organization {org}: table {table} lacks its digest trigger {trigger}; reinstall it before executing")]
    MissingTrigger { org: String, table: String, trigger: String },
    #[error("organization {org}: the shared table {table} is missing")]
    MissingTable { org: String, table: String },
    #[error("organization {org}: table {table} holds a digest row with the unknown kind {op:?}")]
    BadDigest { org: String, table: String, op: String },
    #[error("organization {org}: {error}")]
    Schema { org: String, error: SchemaError },
}

/// An organization's database, whatever its kind.
pub trait Organization {
    fn name(&self) -> &str;

    /// Creates the shared tables (if absent), their digest tables and triggers.
    fn install(&mut self, tables: &[SharedTable]) -> Result<(), OrganizationError>;

    /// Checks that every shared table and each of its digest triggers is present (at start
    /// and before every block: a checkpoint restore or a careless administrator may have
    /// removed them, and effects without digests would go unseen).
    fn check_installed(&mut self) -> Result<(), OrganizationError>;

    /// Executes `transactions` in order, each in a database transaction of its own (rolled
    /// back if any statement fails), then takes the block's digest rows.
    fn execute_block(&mut self, transactions: &[Transaction]) -> Result<BlockEffects, OrganizationError>;
}
