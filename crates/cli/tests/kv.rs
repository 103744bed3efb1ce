//! The transactional engine from the command line: every workload runs and reports, the
//! JSON has its promised fields, and a `transfer` run killed with SIGKILL at random moments
//! never loses an acknowledged commit nor a unit of money.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

fn virga(args: &[&str]) -> Output {
    Command::new(VIRGA).args(args).output().expect("run virga")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_workload_runs_and_writes_the_promised_json() {
    let dir = tempfile::tempdir().unwrap();
    let runs: &[(&str, &[&str])] = &[
        ("ycsb-a", &["--keys", "2000"]),
        ("ycsb-b", &["--keys", "2000"]),
        ("ycsb-c", &["--keys", "2000"]),
        ("ycsb-d", &["--keys", "2000"]),
        ("ycsb-e", &["--keys", "2000"]),
        ("ycsb-f", &["--keys", "2000"]),
        ("smallbank", &["--keys", "1000", "--cc", "2pl"]),
        ("retwis", &["--keys", "2000", "--timestamps", "dst"]),
        ("transfer", &["--keys", "1000", "--timestamps", "hlc", "--clock-skew", "ntp"]),
    ];
    for (workload, extra) in runs {
        let json = dir.path().join(format!("{workload}.json"));
        let json_arg = json.display().to_string();
        let mut args = vec!["bench", "kv", "--workload", workload, "--duration", "0.3", "--quiet", "--json", &json_arg];
        args.extend_from_slice(extra);
        let output = virga(&args);
        assert!(output.status.success(), "{workload}: {}", text(&output.stderr));
        assert!(text(&output.stdout).contains("committed/s"), "{workload}: {}", text(&output.stdout));
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["workload"], *workload);
        assert_eq!(report["threads"], 2);
        assert!(report["committed_per_sec"].as_f64().unwrap() > 0.0, "{workload}: {report}");
        let abort_rate = report["abort_rate"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&abort_rate), "{workload}: {report}");
        assert!(report["p50_us"].as_f64().unwrap() <= report["p99_us"].as_f64().unwrap());
        // The names the options were given by are the names the report prints.
        for pair in extra.chunks(2).filter(|pair| pair[0] != "--keys") {
            let field = pair[0].trim_start_matches("--").replace('-', "_");
            assert_eq!(report["config"][&field], pair[1], "{workload}: {report}");
        }
    }
}

#[test]
fn bad_options_are_named() {
    let output = virga(&["bench", "kv", "--workload", "tpcz", "--duration", "0.1"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("unknown workload `tpcz`"), "{}", text(&output.stderr));
    let output = virga(&["bench", "kv", "--timestamps", "sundial"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("sundial"));
    let dir = tempfile::tempdir().unwrap();
    let output = virga(&["kv", "audit", "--dir", &dir.path().display().to_string()]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("holds no Virga key-value data"), "{}", text(&output.stderr));
}

fn audit(dir: &Path) -> Result<serde_json::Value, String> {
    let output = virga(&["kv", "audit", "--dir", &dir.display().to_string()]);
    if !output.status.success() {
        return Err(format!("audit failed: {}{}", text(&output.stdout), text(&output.stderr)));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("audit printed no JSON ({e}): {}", text(&output.stdout)))
}

/// Starts a durable transfer run, waits for a random number of `committed=K` lines plus a
/// random delay, kills it with SIGKILL, and returns the last K it printed.
fn run_and_kill(dir: &Path, rng: &mut impl Rng) -> u64 {
    let mut child = Command::new(VIRGA)
        .args(["bench", "kv", "--workload", "transfer", "--keys", "2000", "--threads", "2", "--duration", "60"])
        .args(["--sync", "group", "--quiet", "--dir", &dir.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start virga");
    let stdout = child.stdout.take().unwrap();
    let lines_wanted = rng.random_range(1..=3);
    let extra = Duration::from_millis(rng.random_range(0..900));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(k) = line.strip_prefix("committed=") {
                if tx.send(k.parse::<u64>().unwrap()).is_err() {
                    break;
                }
            }
        }
    });
    let mut last = 0;
    for _ in 0..lines_wanted {
        last = rx.recv_timeout(Duration::from_secs(60)).expect("the run prints committed= every second");
    }
    let kill_at = Instant::now() + extra;
    while let Some(left) = kill_at.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(k) => last = k,
            Err(_) => break,
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    // Lines already in the pipe were printed before the kill: they count too.
    while let Ok(k) = rx.try_recv() {
        last = k;
    }
    last
}

/// Kill rounds of the SIGKILL test: 3 in the default suite; a soak sets
/// `VIRGA_KILL_ROUNDS` (see docs/testing.md).
fn kill_rounds() -> u32 {
    std::env::var("VIRGA_KILL_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(3)
}

#[test]
fn sigkill_during_group_commit_loses_no_acknowledged_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("kv");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    let mut committed_before = 0;
    for round in 0..kill_rounds() {
        let acknowledged = run_and_kill(&data, &mut rng);
        assert!(acknowledged > 0, "round {round}: nothing was acknowledged");
        let report = audit(&data).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(report["accounts"], 2000, "round {round}: {report}");
        assert_eq!(report["total_balance"], report["expected_total_balance"], "round {round}: {report}");
        let committed = report["committed"].as_u64().unwrap();
        assert!(
            committed >= committed_before + acknowledged,
            "round {round}: {acknowledged} commits were acknowledged but only {} recovered",
            committed - committed_before
        );
        committed_before = committed;
    }
}

#[test]
fn a_torn_tail_is_cut_and_a_corrupt_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("kv");
    let data_arg = data.display().to_string();
    let output = virga(&[
        "bench",
        "kv",
        "--workload",
        "transfer",
        "--keys",
        "500",
        "--duration",
        "0.5",
        "--quiet",
        "--dir",
        &data_arg,
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let clean = audit(&data).unwrap();
    let mut segments: Vec<_> = std::fs::read_dir(data.join("wal")).unwrap().map(|e| e.unwrap().path()).collect();
    segments.sort();
    let last = segments.last().unwrap().clone();

    // Half a record at the end: the signature of a crash mid-write.
    let mut bytes = std::fs::read(&last).unwrap();
    let original = bytes.clone();
    bytes.extend_from_slice(&[0x42; 37]);
    std::fs::write(&last, &bytes).unwrap();
    let report = audit(&data).unwrap();
    assert_eq!(report["committed"], clean["committed"]);
    assert_eq!(report["total_balance"], clean["total_balance"]);
    assert!(report["truncated_bytes"].as_u64().unwrap() > 0, "{report}");

    // A flipped byte well inside the log is damage to acknowledged data: refused, named.
    // The byte flipped ends a 512-byte sector, and the sector end before it is no zero byte: in
    // the last segment, damage before a sector ending in zeros is taken for a torn write and
    // cut (the log's README states this known weakness), so flipping an arbitrary byte would
    // test that rule's luck instead of the refusal.
    let mut bytes = original;
    let middle = refusable_flip(&bytes).expect("a sector end with no zero byte nearby in the log");
    bytes[middle] ^= 0xff;
    std::fs::write(&last, &bytes).unwrap();
    let output = virga(&["kv", "audit", "--dir", &data_arg]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("error:") && !stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("wal"), "the error names the log: {stderr}");
}

/// The last byte of a 512-byte sector from a third of `log` on, neither 0 nor 0xff, whose
/// sector before also ends in a byte other than zero: records here are far shorter than a
/// sector, so no sector between the damaged record and the next ends in a zero byte.
fn refusable_flip(log: &[u8]) -> Option<usize> {
    const SECTOR: usize = 512;
    (log.len() / 3 / SECTOR + 1..log.len() / SECTOR)
        .map(|sector| sector * SECTOR)
        .find(|&end| !matches!(log[end - 1], 0 | 0xff) && log[end - SECTOR - 1] != 0)
        .map(|end| end - 1)
}

#[test]
fn the_clock_sweep_reports_both_profiles_per_point() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("clocks.json");
    let output = virga(&[
        "bench",
        "clocks",
        "--zipf",
        "0.5,1.2",
        "--duration",
        "0.3",
        "--keys",
        "2000",
        "--json",
        &json.display().to_string(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for point in points {
        for profile in ["ptp", "ntp"] {
            assert!(point[profile]["committed"].as_u64().unwrap() > 0, "{point}");
            assert!(point[profile]["abort_rate"].as_f64().is_some());
        }
    }
}
