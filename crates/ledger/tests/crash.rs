//! Crash test of the chain store: a child process appends blocks with an fsync each and
//! prints `acked=N` once block `N` is durable; the parent kills it with SIGKILL at random
//! moments, several times over the same store, and checks that every block the child
//! reported durable is read back with identical bytes, that nothing half-written is ever
//! returned, and that before repair the read-only scan finds at most a torn tail.
//!
//! Runs without the libtest harness, so the child is not counted as a test of its own:
//! `crash child DIR` is the child's entry point.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use alloy_primitives::{keccak256, B256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_ledger::store::{scan, ChainStore, StoreError, StoreOptions, StoredBlock, SyncPolicy};

const ROUNDS: usize = 16;
const CRASH_SALT: u64 = 0x5EED;

type Failure = Box<dyn std::error::Error>;

fn block_hash(number: u64, salt: u64) -> B256 {
    keccak256([number.to_le_bytes(), salt.to_le_bytes()].concat())
}

fn crash_options() -> StoreOptions {
    // Blocks up to 20 KB span several pages, so a kill can land inside a write; 64 KiB
    // segments make kills land around segment creation too.
    StoreOptions { sync: SyncPolicy::Every, segment_bytes: 64 << 10 }
}

/// Deterministic bytes per block number, so a record read from the wrong place never matches.
fn crash_payload(number: u64) -> Vec<u8> {
    let seed = block_hash(number, CRASH_SALT);
    let len = 1 + usize::from(u16::from_le_bytes([block_hash(number, 1)[0], block_hash(number, 1)[1]])) % 20_000;
    (0..len).map(|i| seed[i % 32] ^ (i / 32) as u8).collect()
}

fn child(dir: &Path) -> Result<(), Failure> {
    let (mut store, _) = ChainStore::open(dir, crash_options())?;
    let mut out = std::io::stdout().lock();
    let start = store.len();
    for n in start..start + 100_000 {
        store.append(n, block_hash(n, CRASH_SALT), &crash_payload(n))?;
        writeln!(out, "acked={n}")?;
        out.flush()?;
    }
    Ok(())
}

fn scan_all(dir: &Path) -> (Vec<StoredBlock>, Option<StoreError>) {
    let mut blocks = Vec::new();
    for item in scan(dir) {
        match item {
            Ok(block) => blocks.push(block),
            Err(e) => return (blocks, Some(e)),
        }
    }
    (blocks, None)
}

fn sigkill_loses_no_acknowledged_block() -> Result<(), Failure> {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut rng = StdRng::seed_from_u64(6);
    let mut acked: Option<u64> = None;
    let (mut torn_tails, mut repairs) = (0, 0);
    for round in 0..ROUNDS {
        let kill_after = rng.random_range(1..60);
        let mut child =
            Command::new(&exe).arg("child").arg(dir.path()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let mut seen = 0;
        let mut lines = BufReader::new(child.stdout.take().ok_or("no child stdout")?).lines();
        while seen < kill_after {
            let Some(line) = lines.next() else { break };
            let line = line?;
            let Some(n) = line.strip_prefix("acked=") else { continue };
            let n: u64 = n.trim().parse()?;
            if acked.is_some_and(|a| n <= a) {
                return Err(format!("round {round}: ack {n} does not go up from {acked:?}").into());
            }
            acked = Some(n);
            seen += 1;
        }
        // Vary where in the following appends the kill lands.
        std::thread::sleep(Duration::from_micros(rng.random_range(0..500)));
        child.kill()?;
        child.wait()?;
        if seen < kill_after {
            let mut stderr = String::new();
            child.stderr.take().ok_or("no child stderr")?.read_to_string(&mut stderr)?;
            return Err(format!("round {round}: the child stopped after {seen} acks: {stderr}").into());
        }
        let acked = acked.ok_or("no ack")?;

        let (scanned, error) = scan_all(dir.path());
        match error {
            None => {}
            Some(StoreError::TornTail { .. }) => torn_tails += 1,
            Some(other) => return Err(format!("round {round}: {other}").into()),
        }
        if scanned.len() as u64 <= acked {
            return Err(format!("round {round}: scan found {} blocks, {acked} acked", scanned.len()).into());
        }
        let (store, recovery) = ChainStore::open(dir.path(), crash_options())?;
        if store.len() != scanned.len() as u64 {
            return Err(format!("round {round}: open kept {}, scan found {} intact", store.len(), scanned.len()).into());
        }
        // A kill between creating a segment file and writing its header leaves a repair
        // that removes nothing: the header is rewritten.
        if recovery.truncated_bytes != 0 && recovery.repair.is_none() {
            return Err(format!("round {round}: bytes cut without a repair report").into());
        }
        repairs += usize::from(recovery.repair.is_some());
        for block in store.iter() {
            let block = block?;
            if block.hash != block_hash(block.number, CRASH_SALT) || block.payload != crash_payload(block.number) {
                return Err(format!("round {round}: block {} differs from what was appended", block.number).into());
            }
        }
    }
    eprintln!("sigkill: {ROUNDS} kills, {torn_tails} left a torn tail, {repairs} repaired on open");
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let Some(dir) = args.get(2) else {
            eprintln!("usage: crash child DIR");
            std::process::exit(2);
        };
        if let Err(error) = child(Path::new(dir)) {
            eprintln!("child failed: {error}");
            std::process::exit(1);
        }
        return;
    }
    // libtest-style listing requests (e.g. from nextest) get the one test.
    if args.iter().any(|a| a == "--list") {
        // It is no ignored test: asked for those, it lists nothing.
        if args.iter().any(|a| a == "--ignored") {
            return;
        }
        println!("sigkill_loses_no_acknowledged_block: test");
        return;
    }
    match sigkill_loses_no_acknowledged_block() {
        Ok(()) => println!("test result: ok. 1 passed; 0 failed"),
        Err(error) => {
            println!("test result: FAILED. 0 passed; 1 failed: {error}");
            std::process::exit(1);
        }
    }
}
