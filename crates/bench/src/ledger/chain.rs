//! Builds a chain of signed value transfers (executed by revm) and verifies it, serially and
//! with the parallel executor.
//!
//! Senders and recipients are drawn uniformly from `accounts` funded accounts with
//! deterministic keys; one transfer in a hundred carries a nonce from the future, which the
//! builder leaves out (Ethereum's rule for invalid transactions). Verification recovers every
//! signature and re-executes every block from genesis, comparing each state root, exactly
//! as `virga verify` does.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, B256, U256};
use anyhow::{Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use virga_ledger::block::Block;
use virga_ledger::chain::{
    audit, genesis_json, read_genesis, stored_blocks, verify_blocks, AuditSummary, Chain, ChainGenesis, ChainOptions,
};
use virga_ledger::store::{StoreOptions, SyncPolicy};
use virga_ledger::tx::{RecoveredTx, SignedTx, SigningKey};
use virga_ledger::verify::ExecMode;

use super::median;

/// Chain parameters.
#[derive(Clone, Debug)]
pub struct ChainBenchOptions {
    pub accounts: usize,
    pub blocks: usize,
    pub block_size: usize,
    pub difficulty: u64,
    pub chain_id: u64,
    /// Threads of the parallel pool.
    pub threads: usize,
    /// Audits per mode; medians are reported.
    pub runs: usize,
    /// Keep the chain here (otherwise in a temporary directory, removed afterwards).
    pub dir: Option<PathBuf>,
    pub seed: u64,
}

impl Default for ChainBenchOptions {
    fn default() -> Self {
        Self {
            accounts: 10_000,
            blocks: 50,
            block_size: 1_000,
            difficulty: 1 << 12,
            chain_id: 1337,
            threads: 2,
            runs: 3,
            dir: None,
            seed: 4,
        }
    }
}

/// What the chain benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct ChainReport {
    pub accounts: usize,
    pub blocks: u64,
    pub transactions: u64,
    /// Candidates the builder left out as invalid (the future nonces).
    pub left_out_transactions: u64,
    pub difficulty: u64,
    pub signing_s: f64,
    /// Building (staged execution, roots, mining) and appending, per second of transactions.
    pub build_tps: f64,
    pub mining_attempts_per_block: f64,
    pub verify_serial_s: f64,
    pub verify_serial_tps: f64,
    pub verify_staged_s: f64,
    pub verify_staged_tps: f64,
    /// `verify_staged_tps / verify_serial_tps`.
    pub staged_speedup: f64,
    /// The whole `virga verify` (genesis, blocks, state store) in staged mode, seconds.
    pub audit_s: f64,
    pub threads: usize,
    pub head_hash: String,
    pub state_root: String,
    pub dir: Option<String>,
}

struct Workload {
    keys: Vec<SigningKey>,
    addresses: Vec<Address>,
    nonces: Vec<u64>,
    rng: SmallRng,
}

impl Workload {
    fn new(accounts: usize, seed: u64) -> Self {
        let keys: Vec<SigningKey> = (0..accounts as u64).into_par_iter().map(SigningKey::from_seed).collect();
        let addresses = keys.iter().map(SigningKey::address).collect();
        Self { keys, addresses, nonces: vec![0; accounts], rng: SmallRng::seed_from_u64(seed) }
    }

    /// The next block's transfers, unsigned: (sender index, nonce, recipient, value).
    fn draw(&mut self, count: usize) -> Vec<(usize, u64, Address, U256)> {
        (0..count)
            .map(|_| {
                let sender = self.rng.random_range(0..self.keys.len());
                let to = self.addresses[self.rng.random_range(0..self.addresses.len())];
                let value = U256::from(self.rng.random_range(1..1_000u64));
                let nonce = if self.rng.random_ratio(1, 100) {
                    self.nonces[sender] + 1_000
                } else {
                    self.nonces[sender] += 1;
                    self.nonces[sender] - 1
                };
                (sender, nonce, to, value)
            })
            .collect()
    }
}

fn sign_block(workload: &Workload, draws: &[(usize, u64, Address, U256)], chain_id: u64) -> Vec<RecoveredTx> {
    draws
        .par_iter()
        .map(|&(sender, nonce, to, value)| RecoveredTx {
            tx: SignedTx::sign(&workload.keys[sender], nonce, to, value, 1_000_000_000, 21_000, Some(chain_id)),
            sender: workload.addresses[sender],
        })
        .collect()
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build().context("building the thread pool")
}

/// Median seconds to verify `blocks` from `genesis` in `mode`, and the verified summary.
fn verify_runs(
    genesis: &ChainGenesis,
    blocks: &[(B256, Block)],
    mode: ExecMode,
    pool: &rayon::ThreadPool,
    runs: usize,
) -> Result<(f64, AuditSummary)> {
    let mut seconds = Vec::new();
    let mut last = None;
    for _ in 0..runs.max(1) {
        let copy = blocks.to_vec();
        let started = Instant::now();
        let verified = verify_blocks(genesis, copy.into_iter().map(Ok), mode, pool, &mut |_| {})?;
        seconds.push(started.elapsed().as_secs_f64());
        last = Some(verified.summary);
    }
    Ok((median(&mut seconds), last.context("at least one run")?))
}

/// Builds the chain, then audits it serially and in stages.
pub fn run(options: &ChainBenchOptions, mut progress: impl FnMut(&str, u64, u64)) -> Result<ChainReport> {
    let temporary;
    let dir = match &options.dir {
        Some(dir) => dir.clone(),
        None => {
            temporary = tempfile::tempdir().context("creating a temporary directory")?;
            temporary.path().join("chain")
        }
    };
    let parallel = pool(options.threads)?;
    let mut workload = Workload::new(options.accounts, options.seed);
    let genesis = genesis_json(
        options.chain_id,
        U256::from(options.difficulty),
        1_000_000_000,
        &workload.addresses,
        U256::from(10u64).pow(U256::from(24u64)),
    );
    let chain_options = ChainOptions {
        store: StoreOptions { sync: SyncPolicy::Every, ..StoreOptions::default() },
        ..ChainOptions::default()
    };
    let (mut chain, _) = Chain::create(&dir, &genesis, chain_options, &parallel)?;
    let beneficiary = Address::repeat_byte(0xbe);
    let (mut signing, mut building, mut attempts, mut left_out) = (Duration::ZERO, Duration::ZERO, 0u64, 0u64);
    for number in 1..=options.blocks as u64 {
        let draws = workload.draw(options.block_size);
        let started = Instant::now();
        let transfers = parallel.install(|| sign_block(&workload, &draws, options.chain_id));
        signing += started.elapsed();
        let started = Instant::now();
        let built = chain.build_next(transfers, beneficiary, number, &parallel)?;
        building += started.elapsed();
        attempts += built.attempts;
        left_out += built.refused.len() as u64;
        progress("build", number, options.blocks as u64);
    }
    chain.sync()?;
    drop(chain);
    let total = (options.blocks * options.block_size) as f64;
    let serial = pool(1)?;
    progress("load", 0, 1);
    let genesis = read_genesis(&dir)?;
    let blocks: Vec<(B256, Block)> = stored_blocks(&dir).collect::<Result<_, _>>()?;
    progress("verify serial", 0, 1);
    let (serial_s, summary) = verify_runs(&genesis, &blocks, ExecMode::Serial, &serial, options.runs)?;
    progress("verify staged", 0, 1);
    let (staged_s, staged) = verify_runs(&genesis, &blocks, ExecMode::Parallel, &parallel, options.runs)?;
    if staged.head_hash != summary.head_hash || staged.state_root != summary.state_root {
        anyhow::bail!("serial and staged verification disagree: {summary:?} vs {staged:?}");
    }
    progress("audit", 0, 1);
    let audit_summary = audit(&dir, ExecMode::Parallel, &parallel, &mut |_| {})?;
    let transactions = summary.transactions;
    Ok(ChainReport {
        accounts: options.accounts,
        blocks: options.blocks as u64,
        transactions,
        left_out_transactions: left_out,
        difficulty: options.difficulty,
        signing_s: signing.as_secs_f64(),
        build_tps: total / building.as_secs_f64().max(1e-9),
        mining_attempts_per_block: attempts as f64 / options.blocks.max(1) as f64,
        verify_serial_s: serial_s,
        verify_serial_tps: transactions as f64 / serial_s.max(1e-9),
        verify_staged_s: staged_s,
        verify_staged_tps: transactions as f64 / staged_s.max(1e-9),
        staged_speedup: serial_s / staged_s.max(1e-9),
        threads: options.threads,
        audit_s: audit_summary.elapsed.as_secs_f64(),
        head_hash: summary.head_hash.to_string(),
        state_root: summary.state_root.to_string(),
        dir: options.dir.as_ref().map(|dir| dir.display().to_string()),
    })
}
