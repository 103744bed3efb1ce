//! Runs a [`KvWorkload`] on a [`KvBackend`] with one session per thread for a fixed time,
//! and measures committed transactions per second, aborts by reason and latency.
//!
//! An aborted transaction is retried at once with the same operations (MILANA's Retwis
//! clients do the same), and every failed attempt counts as an abort. A commit counts only
//! once it is acknowledged: at once without durability, and after the log flush covering it
//! with group commit. Workers do not wait for that flush: they keep the pending
//! acknowledgements in order and release them as the durable ticket advances, the way a
//! server answers its clients. Latency runs from the first attempt to the acknowledgement.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;

use super::{Ack, KvBackend, KvSession, KvWorkload};

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Worker threads, one session (client) each.
    pub threads: usize,
    /// Measured time.
    pub duration: Duration,
    /// Seeds each worker's transaction generator.
    pub seed: u64,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Print `committed=K` on stdout every second, K counting only acknowledged commits.
    pub durable_lines: bool,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Workload name.
    pub workload: String,
    /// Engine name.
    pub engine: String,
    /// Worker threads.
    pub threads: usize,
    /// Measured seconds (from start to the last acknowledgement).
    pub duration_s: f64,
    /// Acknowledged commits.
    pub committed: u64,
    /// Of which read-only.
    pub committed_read_only: u64,
    /// `committed / duration_s`.
    pub committed_per_sec: f64,
    /// Aborted attempts.
    pub aborts: u64,
    /// `aborts / (aborts + committed)`.
    pub abort_rate: f64,
    /// Aborted attempts by reason.
    pub abort_reasons: BTreeMap<String, u64>,
    /// Median latency, first attempt to acknowledgement.
    pub p50_us: f64,
    /// 99th percentile latency.
    pub p99_us: f64,
    /// 99.9th percentile latency.
    pub p999_us: f64,
    /// Mean latency.
    pub mean_us: f64,
}

impl RunReport {
    /// A multi-line human-readable summary.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} on {} ({} threads, {:.1} s): {:.0} committed/s ({} committed, {} read-only)\n  \
             abort rate {:.2}% ({} aborted attempts)\n  latency p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us",
            self.workload,
            self.engine,
            self.threads,
            self.duration_s,
            self.committed_per_sec,
            self.committed,
            self.committed_read_only,
            self.abort_rate * 100.0,
            self.aborts,
            self.p50_us,
            self.p99_us,
            self.p999_us,
        );
        if !self.abort_reasons.is_empty() {
            let reasons: Vec<String> = self.abort_reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
            out.push_str(&format!("\n  aborts by reason: {}", reasons.join(", ")));
        }
        out
    }
}

/// Loads `workload`'s initial data into `backend`.
pub fn load<W: KvWorkload, B: KvBackend>(workload: &W, backend: &B) -> anyhow::Result<u64> {
    let mut pairs = Vec::new();
    workload.load(&mut |k, v| pairs.push((k.to_vec(), v.to_vec())));
    let n = pairs.len() as u64;
    backend.load(&mut pairs.into_iter())?;
    Ok(n)
}

/// One worker's tallies.
struct WorkerResult {
    committed: u64,
    committed_read_only: u64,
    aborts: Vec<(&'static str, u64)>,
    latency_ns: Histogram<u64>,
}

/// Latencies in nanoseconds from 1 ns to an hour, three significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap_or_else(|e| panic!("histogram bounds: {e}"))
}

#[repr(align(64))]
struct Counter(AtomicU64);

/// Runs `workload` on `backend` (already loaded) and reports.
pub fn run<W: KvWorkload, B: KvBackend>(workload: &W, backend: &B, options: &RunOptions) -> RunReport {
    let threads = options.threads.max(1);
    let stop = AtomicBool::new(false);
    let acked: Vec<Counter> = (0..threads).map(|_| Counter(AtomicU64::new(0))).collect();
    let started = Instant::now();
    let results: Vec<WorkerResult> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|client| {
                let (stop, acked) = (&stop, &acked[client].0);
                scope.spawn(move || worker(workload, backend, client, options.seed, stop, acked))
            })
            .collect();
        report_progress(options, &stop, &acked, started);
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| panic!("a benchmark worker panicked"))).collect()
    });
    let duration = started.elapsed().as_secs_f64();

    let mut latency = latency_histogram();
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let (mut committed, mut committed_read_only) = (0, 0);
    for result in &results {
        committed += result.committed;
        committed_read_only += result.committed_read_only;
        let _ = latency.add(&result.latency_ns);
        for (reason, n) in &result.aborts {
            *reasons.entry((*reason).to_string()).or_default() += n;
        }
    }
    let aborts: u64 = reasons.values().sum();
    let us = |q: f64| latency.value_at_quantile(q) as f64 / 1_000.0;
    RunReport {
        workload: workload.name().to_string(),
        engine: backend.name(),
        threads,
        duration_s: duration,
        committed,
        committed_read_only,
        committed_per_sec: committed as f64 / duration.max(1e-9),
        aborts,
        abort_rate: if aborts + committed == 0 { 0.0 } else { aborts as f64 / (aborts + committed) as f64 },
        abort_reasons: reasons,
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        mean_us: latency.mean() / 1_000.0,
    }
}

/// Ticks the progress bar and the per-second durable lines until the measured time is up,
/// then tells the workers to stop.
fn report_progress(options: &RunOptions, stop: &AtomicBool, acked: &[Counter], started: Instant) {
    let total = |acked: &[Counter]| acked.iter().map(|c| c.0.load(Ordering::Acquire)).sum::<u64>();
    let bar = options.progress.then(|| {
        let bar = ProgressBar::new(options.duration.as_millis() as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let mut next_line = Duration::from_secs(1);
    let mut last = (Duration::ZERO, 0u64);
    loop {
        let elapsed = started.elapsed();
        if elapsed >= options.duration {
            break;
        }
        std::thread::sleep(Duration::from_millis(50).min(options.duration - elapsed));
        let elapsed = started.elapsed();
        let done = total(acked);
        if let Some(bar) = &bar {
            if elapsed - last.0 >= Duration::from_millis(500) {
                let rate = (done - last.1) as f64 / (elapsed - last.0).as_secs_f64();
                bar.set_message(format!("{done} committed, {rate:.0}/s"));
                last = (elapsed, done);
            }
            bar.set_position(elapsed.as_millis() as u64);
        }
        if options.durable_lines && elapsed >= next_line {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "committed={done}");
            let _ = out.flush();
            next_line += Duration::from_secs(1);
        }
    }
    stop.store(true, Ordering::Release);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

fn worker<W: KvWorkload, B: KvBackend>(
    workload: &W,
    backend: &B,
    client: usize,
    seed: u64,
    stop: &AtomicBool,
    acked: &AtomicU64,
) -> WorkerResult {
    let mut session = backend.session(client);
    let mut rng = SmallRng::seed_from_u64(seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut latency = latency_histogram();
    let mut aborts: Vec<(&'static str, u64)> = Vec::new();
    // (ticket, started, read-only) of commits waiting for their log flush, in ticket order.
    let mut pending: VecDeque<(u64, Instant, bool)> = VecDeque::new();
    let (mut committed, mut committed_read_only) = (0u64, 0u64);
    let mut since_publish = 0u32;

    let release = |pending: &mut VecDeque<(u64, Instant, bool)>,
                   durable: u64,
                   committed: &mut u64,
                   committed_read_only: &mut u64,
                   latency: &mut Histogram<u64>| {
        let now = Instant::now();
        while let Some(&(ticket, started, read_only)) = pending.front() {
            if ticket > durable {
                break;
            }
            pending.pop_front();
            *committed += 1;
            *committed_read_only += u64::from(read_only);
            latency.saturating_record((now - started).as_nanos() as u64);
        }
    };

    'run: while !stop.load(Ordering::Relaxed) {
        let txn = workload.next_txn(client, &mut rng);
        let read_only = workload.is_read_only(&txn);
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            match session.run(read_only, &mut |tx| workload.execute(&txn, tx)) {
                Ok(Ack::Now) => {
                    // Earlier commits may still wait for their flush; this one is covered.
                    committed += 1;
                    committed_read_only += u64::from(read_only);
                    latency.saturating_record(started.elapsed().as_nanos() as u64);
                    break;
                }
                Ok(Ack::After(ticket)) => {
                    pending.push_back((ticket, started, read_only));
                    break;
                }
                Err(abort) => {
                    match aborts.iter_mut().find(|(r, _)| *r == abort.reason) {
                        Some((_, n)) => *n += 1,
                        None => aborts.push((abort.reason, 1)),
                    }
                    attempts += 1;
                    // The conflicting transaction may be descheduled while it holds keys
                    // (there are more threads than cores once a log flusher runs): give it
                    // the core rather than spin on the same conflict.
                    if attempts.is_multiple_of(2) {
                        std::thread::yield_now();
                    }
                    if stop.load(Ordering::Relaxed) {
                        break 'run;
                    }
                }
            }
        }
        since_publish += 1;
        if since_publish >= 32 || pending.len() >= 4096 {
            since_publish = 0;
            let durable = session.durable_ticket();
            release(&mut pending, durable, &mut committed, &mut committed_read_only, &mut latency);
            // Back-pressure: a worker does not run far ahead of the disk.
            while pending.len() >= 1 << 16 && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(100));
                let durable = session.durable_ticket();
                release(&mut pending, durable, &mut committed, &mut committed_read_only, &mut latency);
            }
            acked.store(committed, Ordering::Release);
        }
    }
    // Acknowledge what is still in flight once its flush lands.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pending.is_empty() && Instant::now() < deadline {
        let durable = session.durable_ticket();
        release(&mut pending, durable, &mut committed, &mut committed_read_only, &mut latency);
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    acked.store(committed, Ordering::Release);
    WorkerResult { committed, committed_read_only, aborts, latency_ns: latency }
}
