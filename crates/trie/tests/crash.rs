//! Crash test of the durable trie: a child process commits versions of deterministic
//! updates and prints each version once it is durable; the parent kills it with SIGKILL
//! at random moments, recovers, and checks that
//! - no acknowledged (printed) version is lost, and
//! - the recovered root is exactly the root of the recovered version's prefix of
//!   updates (computed independently in memory), never a mix.
//!
//! A second phase tears the log's tail (as a power loss would) and checks that
//! recovery drops the torn record and lands on an earlier prefix.
//!
//! Runs without the libtest harness: `crash child DIR SEED` is the child's entry point.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use alloy_primitives::{keccak256, B256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_log::SyncPolicy;
use virga_trie::durable::DurableOptions;
use virga_trie::versions::Update;
use virga_trie::{DurableTrie, Trie};

const ROUNDS: usize = 12;
const CHECKPOINT_EVERY: u64 = 40;

/// The updates of `version`: a pure function of the seed and the version.
fn updates(seed: u64, version: u64) -> Vec<Update> {
    let mut rng = StdRng::seed_from_u64(seed ^ version.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..rng.random_range(1..24))
        .map(|_| {
            let key = keccak256(rng.random_range(0u32..3000).to_be_bytes()).to_vec();
            let value =
                if rng.random_ratio(1, 5) { None } else { Some(vec![rng.random::<u8>() | 1; rng.random_range(1..90)]) };
            (key, value)
        })
        .collect()
}

fn options() -> DurableOptions {
    let mut options =
        DurableOptions { sync: SyncPolicy::Every, checkpoint_every: CHECKPOINT_EVERY, ..Default::default() };
    options.log.segment_bytes = 64 << 10;
    options
}

fn child(dir: &Path, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    let (mut trie, _) = DurableTrie::open(dir, options())?;
    loop {
        let version = trie.version() + 1;
        let (committed, root) = trie.commit(&updates(seed, version))?;
        // Printed only after `commit` returned, i.e. after the version's fsync.
        println!("durable {committed} {root}");
    }
}

/// Roots of versions 0..=max, by replaying the same updates in memory.
fn expected_roots(seed: u64, max: u64) -> Vec<B256> {
    let mut trie = Trie::new();
    let mut roots = vec![trie.root_hash()];
    for version in 1..=max {
        for (key, value) in updates(seed, version) {
            match value {
                Some(value) => trie.insert(&key, &value),
                None => {
                    trie.remove(&key);
                }
            }
        }
        roots.push(trie.root_hash());
    }
    roots
}

fn kill_at_random(dir: &Path, seed: u64, rng: &mut StdRng) -> u64 {
    let exe = std::env::current_exe().expect("test binary path");
    let mut process = Command::new(exe)
        .args(["child", &dir.display().to_string(), &seed.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = process.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        let mut acknowledged = 0u64;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(version) = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                acknowledged = version;
            }
        }
        acknowledged
    });
    std::thread::sleep(Duration::from_millis(rng.random_range(30..400)));
    process.kill().expect("SIGKILL the child");
    process.wait().expect("reap child");
    reader.join().expect("reader thread")
}

fn run() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let seed =
        std::env::var("VIRGA_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::rng().random());
    println!("crash test seed {seed} (replay with VIRGA_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut last_recovered = 0;
    for round in 0..ROUNDS {
        let acknowledged = kill_at_random(dir.path(), seed, &mut rng);
        let started = Instant::now();
        let (trie, report) =
            DurableTrie::open(dir.path(), options()).map_err(|e| format!("round {round}: recovery failed: {e}"))?;
        let recovered = trie.version();
        if recovered < acknowledged {
            return Err(format!("round {round}: acknowledged version {acknowledged} but recovered only {recovered}"));
        }
        if recovered < last_recovered {
            return Err(format!(
                "round {round}: recovered {recovered}, older than the {last_recovered} of the previous round"
            ));
        }
        let roots = expected_roots(seed, recovered);
        if trie.trie().root_hash() != roots[recovered as usize] {
            return Err(format!("round {round}: root of recovered version {recovered} is not the root of that prefix"));
        }
        println!(
            "round {round}: acknowledged {acknowledged}, recovered {recovered} (checkpoint {:?}, replayed {}) in {:?}",
            report.checkpoint_version,
            report.replayed_versions,
            started.elapsed()
        );
        last_recovered = recovered;
    }

    // Torn tails: cut the newest log segment at random points and flip a byte.
    for cut in 0..6 {
        let Some(segment) = newest_segment(&dir.path().join("wal")) else { break };
        let len = std::fs::metadata(&segment).map_err(|e| e.to_string())?.len();
        if len <= 64 {
            break;
        }
        let new_len = rng.random_range(len.saturating_sub(300).max(32)..len);
        let file = std::fs::OpenOptions::new().write(true).open(&segment).map_err(|e| e.to_string())?;
        file.set_len(new_len).map_err(|e| e.to_string())?;
        let before = DurableTrie::open(dir.path(), options()).map_err(|e| format!("torn tail {cut}: {e}"))?.0;
        let version = before.version();
        let roots = expected_roots(seed, version);
        if before.trie().root_hash() != roots[version as usize] {
            return Err(format!("torn tail {cut}: recovered root is not the root of prefix {version}"));
        }
        println!("torn tail {cut}: segment cut to {new_len} of {len} bytes, recovered version {version}");
    }
    Ok(())
}

fn newest_segment(dir: &Path) -> Option<std::path::PathBuf> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    segments.pop()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let (Some(dir), Some(seed)) = (args.get(2), args.get(3).and_then(|s| s.parse().ok())) else {
            eprintln!("usage: crash child DIR SEED");
            std::process::exit(2);
        };
        if let Err(error) = child(Path::new(dir), seed) {
            eprintln!("child failed: {error}");
            std::process::exit(1);
        }
        return;
    }
    // libtest-style listing requests (e.g. from nextest) get an empty answer.
    if args.iter().any(|a| a == "--list") {
        // It is no ignored test: asked for those, it lists nothing.
        if args.iter().any(|a| a == "--ignored") {
            return;
        }
        println!("crash_recovery_keeps_every_acknowledged_version: test");
        return;
    }
    match run() {
        Ok(()) => println!("test result: ok. 1 passed; 0 failed"),
        Err(error) => {
            println!("test result: FAILED. 0 passed; 1 failed: {error}");
            std::process::exit(1);
        }
    }
}
