//! Fabric++'s reordering on the thesis's two microbenchmarks (seed 002 §3.5.1).
//!
//! Workload 1 (Fig. 3.6) interleaves single-write and single-read transactions; shifting reads
//! in front of writes varies how many conflicts arrival order suffers. Workload 2 (Fig. 3.7)
//! is made of conflict cycles of a given length. For each input the benchmark reports how many
//! transactions arrival order and Fabric++ keep, and the median time Fabric++ takes.

use std::time::Instant;

use serde::Serialize;
use virga_txn::schedule::{cycles_of_length, interleaved_conflicts, schedule, ScheduleConfig, Scheduler, TxAccess};

use super::median;

/// One input of a microbenchmark.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleCase {
    /// `interleaved` (Fig. 3.6) or `cycles` (Fig. 3.7).
    pub workload: &'static str,
    /// The shift of reads in front of writes, or the cycle length.
    pub parameter: usize,
    pub transactions: usize,
    pub kept_arrival: usize,
    pub kept_fabricpp: usize,
    /// Elementary cycles Fabric++ enumerated.
    pub cycles: usize,
    /// Whether the cycle budget ran out (the fallback broke cycles).
    pub budget_exhausted: bool,
    /// Median time to schedule the block with Fabric++, in microseconds.
    pub fabricpp_median_us: f64,
    /// Median time of arrival order (its validation pass), in microseconds.
    pub arrival_median_us: f64,
}

fn time_schedule(txs: &[TxAccess<u64>], scheduler: Scheduler, repetitions: usize) -> (f64, usize) {
    let config = ScheduleConfig { scheduler, ..ScheduleConfig::default() };
    let mut times = Vec::with_capacity(repetitions);
    let mut kept = 0;
    for _ in 0..repetitions.max(1) {
        let started = Instant::now();
        let result = schedule(txs, &config);
        times.push(started.elapsed().as_secs_f64() * 1e6);
        kept = result.order.len();
    }
    (median(&mut times), kept)
}

fn case(workload: &'static str, parameter: usize, txs: &[TxAccess<u64>], repetitions: usize) -> ScheduleCase {
    let (fabricpp_median_us, kept_fabricpp) = time_schedule(txs, Scheduler::FabricPlusPlus, repetitions);
    let (arrival_median_us, kept_arrival) = time_schedule(txs, Scheduler::Arrival, repetitions);
    let stats =
        schedule(txs, &ScheduleConfig { scheduler: Scheduler::FabricPlusPlus, ..ScheduleConfig::default() }).stats;
    ScheduleCase {
        workload,
        parameter,
        transactions: txs.len(),
        kept_arrival,
        kept_fabricpp,
        cycles: stats.cycles,
        budget_exhausted: stats.budget_exhausted_rounds > 0,
        fabricpp_median_us,
        arrival_median_us,
    }
}

/// Both microbenchmarks on blocks of `n` transactions, each input scheduled `repetitions`
/// times.
pub fn run(n: usize, repetitions: usize, mut progress: impl FnMut(&ScheduleCase)) -> Vec<ScheduleCase> {
    let mut cases = Vec::new();
    let half = n / 2;
    for step in 0..=4 {
        let shift = half * step / 4;
        let result = case("interleaved", shift, &interleaved_conflicts(n, shift), repetitions);
        progress(&result);
        cases.push(result);
    }
    let mut length = 2;
    while length <= n {
        let result = case("cycles", length, &cycles_of_length(n, length), repetitions);
        progress(&result);
        cases.push(result);
        length *= 2;
    }
    cases
}
