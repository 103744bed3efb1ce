//! ChainifyDB (seed 002 ch. 4) over real, unmodified databases: each organization keeps
//! its own DBMS, executes every block there however it does, and the organizations agree on
//! the block's effects through digest rows that triggers write (`virga_ledger::wlc`).
//!
//! - [`schema`]: the shared tables an organization exposes, with identifiers checked before
//!   they reach any SQL text.
//! - [`dialect`]: the digest tables and triggers each DBMS gets, built so that PostgreSQL and
//!   SQLite write the same canonical row image byte for byte.
//! - [`organization`]: what an organization's database does for the pipeline, and
//!   [`sqlite::SqliteOrganization`], SQLite through rusqlite (bundled), and
//!   [`postgres::PostgresOrganization`], PostgreSQL through the `postgres` client.
//! - [`postgres_server`]: a private PostgreSQL instance started for an organization.
//! - [`smallbank`]: SmallBank as portable SQL statement templates, and its blocks.
//! - [`analysis`]: each transaction's key intervals read and written, from its SQL
//!   (`sqlparser`), and the block's dependency stages.
//! - [`consortium`]: the organizations executing, voting, committing to their [`ledger`]s,
//!   checkpointing and recovering (in the order of [`recovery`]).
//! - [`run`]: `virga chainify up` (the consortium on SmallBank beside PostgreSQL alone) and
//!   `virga chainify verify`.

#![forbid(unsafe_code)]

pub mod analysis;
pub mod bench;
pub mod consortium;
#[cfg(feature = "grpc")]
pub mod deploy;
pub mod dialect;
pub mod keys;
pub mod ledger;
pub mod organization;
pub mod pipeline;
pub mod postgres;
pub mod postgres_server;
pub mod recovery;
pub mod run;
pub mod schema;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod smallbank;
pub mod sqlite;

pub use self::consortium::{BlockReport, Consortium, ConsortiumConfig, ConsortiumError, Member, NextBlock};
pub use self::dialect::Dialect;
pub use self::ledger::{Ledger, LedgerError};
pub use self::organization::{
    BlockEffects, DatabaseOrganization, Organization, OrganizationError, SqlSession, Transaction,
};
pub use self::postgres::PostgresOrganization;
pub use self::postgres_server::PostgresServer;
pub use self::schema::{Column, ColumnKind, SchemaError, SharedTable};
pub use self::sqlite::SqliteOrganization;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_consortium;
#[cfg(test)]
mod tests_postgres;
