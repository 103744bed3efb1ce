//! Append throughput and reopen time of the record log on files: `cargo run --release -p
//! virga-log --example append_throughput [records] [payload bytes]`. Appends buffered records
//! (`SyncPolicy::None`), syncs once, and reopens; prints the median of five runs.

use std::time::{Duration, Instant};

use virga_log::{LogOptions, RecordLog, SyncPolicy};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let payload_bytes: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let payload = vec![0x5a; payload_bytes];
    let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
    let (mut appends, mut reopens) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let dir = tempfile::tempdir()?;
        let (mut log, _) = RecordLog::open(dir.path(), options.clone())?;
        let started = Instant::now();
        for _ in 0..records {
            log.append(&payload)?;
        }
        log.sync()?;
        appends.push(started.elapsed());
        drop(log);
        let started = Instant::now();
        let (log, _) = RecordLog::open(dir.path(), options.clone())?;
        reopens.push(started.elapsed());
        assert_eq!(log.next_lsn(), records as u64 + 1);
    }
    let append = median(appends);
    println!(
        "{records} appends of {payload_bytes} bytes + sync: {append:?} ({:.0} ns/append); reopen: {:?}",
        append.as_nanos() as f64 / records as f64,
        median(reopens)
    );
    Ok(())
}
