//! `virga chainify up` and `virga chainify verify`: a consortium of three organizations
//! (two on PostgreSQL and one on SQLite, or three on SQLite) running SmallBank, with the
//! same transactions on one PostgreSQL alone for comparison; and the check of a kept
//! directory's databases against its ledgers.
//!
//! A directory holds `consortium.json` (the organizations and their kinds) and, per
//! organization, `ledger/` (its LedgerBlocks) and its database (`db.sqlite`, or a
//! PostgreSQL cluster in `pgdata/`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use virga_ledger::wlc::{AgreementPolicy, LedgerBlock};

use crate::consortium::{replay_transactions, Consortium, ConsortiumConfig, ConsortiumError, Member};
use crate::dialect::Dialect;
use crate::ledger::{Ledger, LedgerError};
use crate::organization::{Organization, OrganizationError, SqlSession, Transaction};
use crate::postgres_server::{PostgresServer, ServerError};
use crate::smallbank;
use crate::sqlite::SqliteSync;
use crate::{PostgresOrganization, SqliteOrganization};

/// The file naming a kept directory's organizations.
pub const LAYOUT_FILE: &str = "consortium.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatabaseKind {
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrganizationInfo {
    pub name: String,
    pub database: DatabaseKind,
}

#[derive(Debug, Clone)]
pub struct UpConfig {
    pub dir: PathBuf,
    pub sqlite_only: bool,
    /// Blocks of SmallBank after the load.
    pub blocks: u64,
    pub block_size: usize,
    pub customers: u64,
    pub policy: AgreementPolicy,
    pub checkpoint_every: u64,
    /// Before this workload block, the last organization's administrator changes a balance
    /// outside the chain (the recovery it causes is measured).
    pub tamper_before: Option<u64>,
    pub seed: u64,
    /// Connections per organization that run each block's stages in parallel (0: serial).
    pub workers: usize,
    pub skew: smallbank::Skew,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Organization(#[from] OrganizationError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Consortium(#[from] ConsortiumError),
    #[error("{path}: {problem}")]
    Layout { path: PathBuf, problem: String },
    #[error("{0}")]
    Io(String),
}

/// What `virga chainify up` measured.
#[derive(Debug, Clone, Serialize)]
pub struct UpReport {
    pub organizations: Vec<OrganizationInfo>,
    pub policy: String,
    pub customers: u64,
    pub block_size: usize,
    /// How the transactions pick customers: `uniform` or `zipf:S`.
    pub skew: String,
    /// SmallBank blocks run (after the load).
    pub blocks: u64,
    /// Blocks whose LedgerBlock hash the policy's number of organizations shared (the load
    /// blocks included).
    pub agreed_blocks: u64,
    pub transactions: u64,
    pub successful: u64,
    pub tps: f64,
    pub seconds: f64,
    pub load_seconds: f64,
    /// The same SmallBank transactions on one PostgreSQL alone (no triggers, no consortium),
    /// with the same durability and as many connections as each organization uses, in the
    /// same run.
    pub postgres_alone_tps: Option<f64>,
    pub durability: String,
    /// Connections per organization running a block's stages in parallel (0: serial).
    pub workers: usize,
    /// Where the time went, summed over the SmallBank blocks (execution runs at every
    /// organization at once).
    pub execute_seconds: f64,
    pub agree_seconds: f64,
    pub checkpoint_seconds: f64,
    pub recover_seconds: f64,
    /// Signing and checking the votes (one signature per organization a block, every vote
    /// checked by every organization), within `agree_seconds`.
    pub crypto_seconds: f64,
    pub recoveries: Vec<Recovery>,
    /// Organizations that could not recover, by block.
    pub failed: Vec<(u64, String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub block: u64,
    pub organization: String,
    pub attempts: usize,
    pub seconds: f64,
}

/// The running databases of a directory's organizations.
pub(crate) struct Opened {
    /// Kept running for as long as the organizations use them.
    pub(crate) servers: Vec<PostgresServer>,
    pub(crate) organizations: Vec<Box<dyn Organization>>,
}

pub(crate) fn layout(sqlite_only: bool) -> Vec<OrganizationInfo> {
    (1..=3)
        .map(|index| OrganizationInfo {
            name: format!("org-{index}"),
            database: if sqlite_only || index == 3 { DatabaseKind::Sqlite } else { DatabaseKind::Postgres },
        })
        .collect()
}

/// Opens (creating them if absent) the databases of `dir`'s organizations, starting their
/// servers. `install`: create the shared tables and triggers; else attach to them as they are.
pub(crate) fn open(dir: &Path, infos: &[OrganizationInfo], install: bool, workers: usize) -> Result<Opened, RunError> {
    let mut servers = Vec::new();
    let mut organizations = Vec::new();
    for info in infos {
        let (organization, server) = open_organization(dir, info, install, workers)?;
        servers.extend(server);
        organizations.push(organization);
    }
    Ok(Opened { servers, organizations })
}

/// Opens one organization's database in `dir` (its SQLite file, or its PostgreSQL cluster,
/// started and handed back to be kept running).
pub(crate) fn open_organization(
    dir: &Path,
    info: &OrganizationInfo,
    install: bool,
    workers: usize,
) -> Result<(Box<dyn Organization>, Option<PostgresServer>), RunError> {
    let home = dir.join(&info.name);
    let (mut organization, server): (Box<dyn Organization>, _) = match info.database {
        DatabaseKind::Sqlite => {
            std::fs::create_dir_all(&home).map_err(|error| RunError::Io(format!("{}: {error}", home.display())))?;
            let org =
                SqliteOrganization::open_with_workers(&info.name, &home.join("db.sqlite"), SqliteSync::Full, workers)?;
            (Box::new(org), None)
        }
        DatabaseKind::Postgres => {
            let server = PostgresServer::start(&home.join("pgdata"), 5432)?;
            let org =
                PostgresOrganization::connect_with_workers(&info.name, &server.connection_string(), true, workers)?;
            (Box::new(org), Some(server))
        }
    };
    if install {
        organization.install(&smallbank::tables())?;
    } else {
        organization.attach(&smallbank::tables())?;
    }
    Ok((organization, server))
}

/// The SmallBank blocks of a run: the same for every organization and for PostgreSQL alone.
fn workload(config: &UpConfig) -> Vec<Vec<Transaction>> {
    let mut rng = SmallRng::seed_from_u64(config.seed);
    (0..config.blocks)
        .map(|_| smallbank::random_block_skewed(&mut rng, config.customers, config.block_size, config.skew))
        .collect()
}

/// Runs the consortium; `progress` hears of each block (its number among the workload's,
/// and the committed transactions so far).
pub fn up(config: &UpConfig, progress: &mut dyn FnMut(u64, u64)) -> Result<UpReport, RunError> {
    let infos = layout(config.sqlite_only);
    let layout_path = config.dir.join(LAYOUT_FILE);
    std::fs::create_dir_all(&config.dir).map_err(|error| RunError::Io(format!("{}: {error}", config.dir.display())))?;
    if layout_path.exists() {
        return Err(RunError::Layout {
            path: layout_path,
            problem: "already holds a consortium: give a new directory".to_string(),
        });
    }
    let json = serde_json::to_string_pretty(&infos).map_err(|error| RunError::Io(error.to_string()))?;
    std::fs::write(&layout_path, json).map_err(|error| RunError::Io(format!("{}: {error}", layout_path.display())))?;
    let opened = open(&config.dir, &infos, true, config.workers)?;
    let mut members = Vec::new();
    for (organization, info) in opened.organizations.into_iter().zip(&infos) {
        members.push(Member::new(organization, Ledger::open(&config.dir.join(&info.name).join("ledger"))?));
    }
    let consortium_config = ConsortiumConfig {
        policy: config.policy,
        checkpoint_every: config.checkpoint_every.max(1),
        keep_checkpoints: 3,
    };
    let mut consortium = Consortium::new(members, consortium_config)?;
    let started = Instant::now();
    for block in smallbank::load_blocks(config.customers, 5_000) {
        consortium.run_block(&block)?;
    }
    let load_seconds = started.elapsed().as_secs_f64();
    let mut report = UpReport {
        organizations: infos.clone(),
        policy: format!("any {} of {}", config.policy.agree, config.policy.of),
        customers: config.customers,
        block_size: config.block_size,
        skew: match config.skew {
            smallbank::Skew::Uniform => "uniform".to_string(),
            smallbank::Skew::Zipf(exponent) => format!("zipf:{exponent}"),
        },
        blocks: config.blocks,
        agreed_blocks: 0,
        transactions: 0,
        successful: 0,
        tps: 0.0,
        seconds: 0.0,
        load_seconds,
        postgres_alone_tps: None,
        durability: crate::bench::durability(config.workers, ""),
        workers: config.workers,
        execute_seconds: 0.0,
        agree_seconds: 0.0,
        checkpoint_seconds: 0.0,
        recover_seconds: 0.0,
        crypto_seconds: 0.0,
        recoveries: Vec::new(),
        failed: Vec::new(),
    };
    let blocks = workload(config);
    let started = Instant::now();
    for (index, block) in blocks.iter().enumerate() {
        if config.tamper_before == Some(index as u64) {
            if let Some(last) = consortium.members_mut().last_mut() {
                last.organization.run_outside_chain("UPDATE checking SET bal = bal + 1000 WHERE custid = 0")?;
            }
        }
        let done = consortium.run_block(block)?;
        report.transactions += done.transactions as u64;
        report.successful += done.successful as u64;
        report.execute_seconds += done.execute.as_secs_f64();
        report.agree_seconds += done.agree.as_secs_f64();
        report.checkpoint_seconds += done.checkpoint.as_secs_f64();
        report.recover_seconds += done.recover.as_secs_f64();
        report.crypto_seconds += done.crypto.as_secs_f64();
        for (organization, attempts) in done.recovered {
            let seconds = done.recover.as_secs_f64();
            report.recoveries.push(Recovery { block: done.number, organization, attempts, seconds });
        }
        report.failed.extend(done.failed.into_iter().map(|(org, why)| (done.number, org, why)));
        progress(index as u64 + 1, report.transactions);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.tps = report.transactions as f64 / report.seconds.max(1e-9);
    report.agreed_blocks = consortium.chain().len() as u64;
    drop(consortium);
    if !config.sqlite_only {
        report.postgres_alone_tps = Some(postgres_alone(&config.dir.join("alone"), config, &blocks)?);
    }
    drop(opened.servers);
    Ok(report)
}

/// The same transactions on one PostgreSQL alone (see [`Alone`]); transactions a second.
fn postgres_alone(dir: &Path, config: &UpConfig, blocks: &[Vec<Transaction>]) -> Result<f64, RunError> {
    let mut alone = Alone::start(dir, config.customers, config.workers.max(1))?;
    let transactions: Vec<Transaction> = blocks.iter().flatten().cloned().collect();
    Ok(alone.run(&transactions))
}

/// One PostgreSQL alone, for comparison: the shared tables without triggers, loaded alike,
/// run on as many connections as asked (as many as each organization runs its stages on,
/// or as there are clients), each connection taking the next transaction in order and
/// PostgreSQL's own locking ordering the conflicts.
pub(crate) struct Alone {
    organization: PostgresOrganization,
    _server: PostgresServer,
}

impl Alone {
    pub(crate) fn start(dir: &Path, customers: u64, connections: usize) -> Result<Alone, RunError> {
        let server = PostgresServer::start(dir, 5432)?;
        let mut organization =
            PostgresOrganization::connect_with_workers("alone", &server.connection_string(), true, connections.max(1))?;
        let failed = |error: crate::organization::SqlError| RunError::Io(format!("PostgreSQL alone: {error}"));
        let tables: Vec<String> =
            smallbank::tables().iter().map(|table| Dialect::Postgres.create_table(table)).collect();
        organization.session().atomically(&tables).map_err(failed)?;
        for block in smallbank::load_blocks(customers, 5_000) {
            for transaction in block {
                organization.session().atomically(&transaction.statements).map_err(failed)?;
            }
        }
        Ok(Alone { organization, _server: server })
    }

    /// Runs `transactions` on every connection at once; transactions a second.
    pub(crate) fn run(&mut self, transactions: &[Transaction]) -> f64 {
        let connections = self.organization.workers_mut().len();
        self.run_on(connections, transactions)
    }

    /// Runs `transactions` on the first `connections` connections at once.
    pub(crate) fn run_on(&mut self, connections: usize, transactions: &[Transaction]) -> f64 {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for worker in self.organization.workers_mut().iter_mut().take(connections.max(1)) {
                let next = &next;
                scope.spawn(move || loop {
                    let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(transaction) = transactions.get(at) else { break };
                    // A failing transaction (a withdrawal past the balance) counts, as the
                    // consortium's do.
                    let _ = worker.atomically(&transaction.statements);
                });
            }
        });
        transactions.len() as f64 / started.elapsed().as_secs_f64().max(1e-9)
    }
}

/// What `virga chainify verify` found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub organizations: usize,
    pub blocks: u64,
}

/// Where a kept directory differs from its ledgers.
#[derive(Debug, thiserror::Error)]
pub enum VerifyProblem {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("organization {org}: its ledger differs from {other}'s at block {block}")]
    Ledgers { org: String, other: String, block: u64 },
    #[error("organization {org}: replaying its ledger gives other effects than it records at block {block}")]
    Replay { org: String, block: u64 },
    #[error("organization {org}: table {table} differs from the replay of its ledger's {blocks} blocks")]
    Table { org: String, table: String, blocks: u64 },
}

/// Checks every organization of `dir`: its ledger chains, agrees with the others' (a shorter
/// one must be a prefix: that organization lags), replays to the effects it records, and
/// leaves exactly the database the organization holds.
pub fn verify(dir: &Path) -> Result<VerifyReport, VerifyProblem> {
    let layout_path = dir.join(LAYOUT_FILE);
    let text = std::fs::read_to_string(&layout_path)
        .map_err(|error| RunError::Layout { path: layout_path.clone(), problem: error.to_string() })?;
    let infos: Vec<OrganizationInfo> = serde_json::from_str(&text)
        .map_err(|error| RunError::Layout { path: layout_path.clone(), problem: error.to_string() })?;
    let ledgers: Vec<Vec<LedgerBlock>> = infos
        .iter()
        .map(|info| Ledger::read(&dir.join(&info.name).join("ledger")))
        .collect::<Result<_, _>>()
        .map_err(RunError::from)?;
    let longest = (0..ledgers.len()).max_by_key(|at| ledgers[*at].len()).unwrap_or(0);
    for (at, ledger) in ledgers.iter().enumerate() {
        if let Some(block) = ledger.iter().zip(&ledgers[longest]).position(|(one, other)| one != other) {
            return Err(VerifyProblem::Ledgers {
                org: infos[at].name.clone(),
                other: infos[longest].name.clone(),
                block: block as u64,
            });
        }
    }
    let mut opened = open(dir, &infos, false, 0).map_err(VerifyProblem::Run)?;
    for (organization, ledger) in opened.organizations.iter_mut().zip(&ledgers) {
        let name = organization.name().to_string();
        let mut replay = SqliteOrganization::in_memory("replay").map_err(RunError::from)?;
        replay.install(&smallbank::tables()).map_err(RunError::from)?;
        for block in ledger {
            let effects = replay.execute_block(&replay_transactions(block)).map_err(RunError::from)?;
            if effects.successful != block.successful || effects.digest_hash() != block.digest {
                return Err(VerifyProblem::Replay { org: name, block: block.number });
            }
        }
        let expected = replay.table_hashes().map_err(RunError::from)?;
        let actual = organization.table_hashes().map_err(RunError::from)?;
        if let Some((table, _)) = expected.iter().zip(&actual).find(|(one, other)| one != other).map(|(one, _)| one) {
            return Err(VerifyProblem::Table { org: name, table: table.clone(), blocks: ledger.len() as u64 });
        }
    }
    let blocks = ledgers.get(longest).map_or(0, |ledger| ledger.len() as u64);
    drop(opened.organizations);
    drop(opened.servers);
    Ok(VerifyReport { organizations: infos.len(), blocks })
}
