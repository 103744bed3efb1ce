//! The SmallBank sweep of seed 002 Fig. 3.10 through Virga's simulate–order–validate pipeline
//! ([`virga_ledger::fabric`]): committed transactions per block and per second under arrival
//! order (vanilla Fabric) and Fabric++ (reordering and early abort), for Zipf exponents and
//! write probabilities, both variants on the same proposal stream in one run.

use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use virga_ledger::fabric::{BlockReport, Pipeline, PipelineConfig, Simulation, VersionedState};
use virga_txn::schedule::Scheduler;

use super::median;
use crate::kv::smallbank::{SmallBankConfig, SmallBankWorkload};
use crate::kv::{KvTx, KvWorkload, TxAbort};

/// Sweep parameters.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// SmallBank customers (the thesis uses 100,000).
    pub users: u64,
    pub zipfs: Vec<f64>,
    /// Probabilities of a modifying transaction (P_w).
    pub write_probabilities: Vec<f64>,
    /// Blocks measured per point.
    pub blocks: usize,
    pub block_size: usize,
    pub seed: u64,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            users: 100_000,
            zipfs: (0..=10).map(|step| f64::from(step) * 0.2).collect(),
            write_probabilities: vec![0.05, 0.5, 0.95],
            blocks: 20,
            block_size: 1024,
            seed: 2,
        }
    }
}

/// One variant at one point of the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct VariantResult {
    pub scheduler: String,
    pub blocks: usize,
    pub transactions: usize,
    pub committed: usize,
    pub committed_per_block: f64,
    /// Committed transactions over the pipeline's whole time (simulation, ordering,
    /// validation and commit on one thread).
    pub committed_per_sec: f64,
    pub aborted_in_simulation: usize,
    pub aborted_in_orderer: usize,
    pub invalid_at_validation: usize,
    pub schedule_median_us: f64,
}

/// Both variants at one point.
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    pub zipf: f64,
    pub write_probability: f64,
    pub arrival: VariantResult,
    pub fabricpp: VariantResult,
    /// `fabricpp.committed_per_block / arrival.committed_per_block`.
    pub gain_per_block: f64,
    pub gain_per_sec: f64,
}

/// Lets SmallBank's transaction logic run inside a simulation.
struct SimulatedTx<'s, 'a> {
    simulation: &'s mut Simulation<'a>,
}

const UNSUPPORTED: TxAbort = TxAbort { reason: "unsupported" };

impl KvTx for SimulatedTx<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        Ok(self.simulation.get(key).map(Bytes::from))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        self.simulation.put(key, value);
        Ok(())
    }
    fn delete(&mut self, _key: &[u8]) -> Result<(), TxAbort> {
        Err(UNSUPPORTED)
    }
    fn scan(&mut self, _start: &[u8], _limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        Err(UNSUPPORTED)
    }
}

fn initial_state(workload: &SmallBankWorkload) -> VersionedState {
    let mut pairs = Vec::with_capacity(2 * workload.config().accounts as usize);
    workload.load(&mut |key, value| pairs.push((key.to_vec(), value.to_vec())));
    VersionedState::load(pairs)
}

/// Runs one variant on the proposal stream seeded by `seed`.
fn run_variant(
    workload: &SmallBankWorkload,
    state: VersionedState,
    write_probability: f64,
    scheduler: Scheduler,
    options: &SweepOptions,
) -> VariantResult {
    let config = PipelineConfig {
        block_size: options.block_size,
        overlap: options.block_size / 2,
        ..PipelineConfig::thesis(scheduler)
    };
    let mut pipeline = Pipeline::new(state, config);
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let mut simulate = |simulation: &mut Simulation<'_>| {
        let modifying = rng.random_bool(write_probability.clamp(0.0, 1.0));
        let txn = loop {
            let txn = workload.next_txn(0, &mut rng);
            if workload.is_read_only(&txn) != modifying {
                break txn;
            }
        };
        // A business-rule refusal is a committed no-op, as in the KV benchmarks.
        let _ = workload.execute(&txn, &mut SimulatedTx { simulation });
    };
    let started = Instant::now();
    let mut reports: Vec<BlockReport> = Vec::with_capacity(options.blocks);
    // One block more than measured: the first step only fills the pipeline.
    for _ in 0..options.blocks {
        reports.extend(pipeline.step(&mut simulate));
    }
    reports.extend(pipeline.finish());
    let elapsed = started.elapsed();
    summarize(scheduler, &reports, elapsed)
}

fn summarize(scheduler: Scheduler, reports: &[BlockReport], elapsed: Duration) -> VariantResult {
    let committed: usize = reports.iter().map(|r| r.committed).sum();
    let mut schedule_us: Vec<f64> = reports.iter().map(|r| r.schedule_time.as_secs_f64() * 1e6).collect();
    VariantResult {
        scheduler: scheduler.to_string(),
        blocks: reports.len(),
        transactions: reports.iter().map(|r| r.transactions).sum(),
        committed,
        committed_per_block: committed as f64 / reports.len().max(1) as f64,
        committed_per_sec: committed as f64 / elapsed.as_secs_f64().max(1e-9),
        aborted_in_simulation: reports.iter().map(|r| r.aborted_in_simulation).sum(),
        aborted_in_orderer: reports.iter().flat_map(|r| r.aborted_in_orderer.iter().map(|(_, n)| n)).sum(),
        invalid_at_validation: reports.iter().map(|r| r.invalid).sum(),
        schedule_median_us: median(&mut schedule_us),
    }
}

/// One point of the sweep: both variants on the same stream.
pub fn point(zipf: f64, write_probability: f64, options: &SweepOptions) -> Result<SweepPoint> {
    let config = SmallBankConfig { accounts: options.users, zipf, ..SmallBankConfig::default() };
    let workload = SmallBankWorkload::new(config)?;
    let state = initial_state(&workload);
    let arrival = run_variant(&workload, state.clone(), write_probability, Scheduler::Arrival, options);
    let fabricpp = run_variant(&workload, state, write_probability, Scheduler::FabricPlusPlus, options);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    Ok(SweepPoint {
        zipf,
        write_probability,
        gain_per_block: ratio(fabricpp.committed_per_block, arrival.committed_per_block),
        gain_per_sec: ratio(fabricpp.committed_per_sec, arrival.committed_per_sec),
        arrival,
        fabricpp,
    })
}

/// The whole sweep.
pub fn sweep(options: &SweepOptions, mut progress: impl FnMut(&SweepPoint)) -> Result<Vec<SweepPoint>> {
    let mut points = Vec::new();
    for &write_probability in &options.write_probabilities {
        for &zipf in &options.zipfs {
            let result = point(zipf, write_probability, options)?;
            progress(&result);
            points.push(result);
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_plus_plus_gains_under_contention_and_not_without() {
        let options = SweepOptions { users: 1_000, blocks: 6, block_size: 256, ..SweepOptions::default() };
        let skewed = point(2.0, 0.95, &options).expect("valid parameters");
        assert!(
            skewed.fabricpp.committed > skewed.arrival.committed,
            "Zipf 2.0: Fabric++ {} vs arrival {}",
            skewed.fabricpp.committed,
            skewed.arrival.committed
        );
        let uniform = point(0.0, 0.05, &options).expect("valid parameters");
        assert!(uniform.fabricpp.committed >= uniform.arrival.committed);
        assert_eq!(uniform.arrival.transactions, 6 * 256);
    }
}
