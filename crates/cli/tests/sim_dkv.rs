//! `virga sim dkv`: the distributed store's seeds from the command line, the JSON they
//! promise, a weakened variant caught with replay commands that replay it, refused options,
//! and the scripted lease scenario.

use crate::support::{json, text, virga};

#[test]
fn seeds_with_faults_pass_and_their_json_names_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seeds.json");
    let output = virga(&["sim", "dkv", "--seeds", "3", "--first-seed", "40", "--json", path.to_str().unwrap()]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("3 seed(s), 0 failure(s)"), "{stderr}");
    let report = json(&path);
    assert_eq!(report["seeds"], 3);
    assert_eq!(report["first_seed"], 40);
    assert_eq!(
        (&report["faults"], &report["weaken"], &report["clock"], &report["skew"], &report["leases"]),
        (&"all".into(), &serde_json::Value::Null, &"physical".into(), &"ntp".into(), &true.into())
    );
    assert_eq!(report["session_clients"], 1);
    assert_eq!(report["failures"], serde_json::json!([]));
    let runs = report["runs"].as_array().unwrap();
    let seeds: Vec<u64> = runs.iter().map(|run| run["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds, [40, 41, 42]);
    for run in runs {
        assert_eq!(run["passed"], true);
        assert!(run["committed"].as_u64().unwrap() > 0, "{run}");
    }
    let totals = &report["totals"];
    let sum = |field: &str| runs.iter().map(|run| run[field].as_u64().unwrap()).sum::<u64>();
    let fields = ["committed", "committed_read_only", "aborted_attempts", "crashes", "failovers", "events"];
    for field in fields.into_iter().chain(["session_committed", "session_aborted_attempts", "session_unavailable"]) {
        assert_eq!(totals[field].as_u64(), Some(sum(field)), "{field}: {totals}");
    }
    let crashes = totals["crashes"].as_u64().unwrap();
    let kinds = ["backup_crashes", "client_crashes", "primary_crashes"];
    assert_eq!(kinds.iter().map(|kind| totals[kind].as_u64().unwrap()).sum::<u64>(), crashes, "{totals}");
    assert!(totals["committed_read_only"].as_u64().unwrap() > 0, "the audits commit read-only: {totals}");
    assert!(totals["session_committed"].as_u64().unwrap() > 0, "the session client commits: {totals}");
    assert!(report["timing"]["seconds_per_seed"].as_f64().unwrap() > 0.0);
}

/// `--faults none` turns off the network's faults and every crash: with no skew either,
/// every program of every client commits (60 programs × 3 clients per seed), here all three
/// clients running theirs as sessions.
#[test]
fn without_faults_nothing_crashes_and_every_program_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calm.json");
    let output = virga(&[
        "sim",
        "dkv",
        "--seeds",
        "2",
        "--faults",
        "none",
        "--skew",
        "none",
        "--clock",
        "hybrid",
        "--session-clients",
        "3",
        "--json",
        path.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report = json(&path);
    assert_eq!(
        (&report["faults"], &report["skew"], &report["clock"]),
        (&"none".into(), &"none".into(), &"hybrid".into())
    );
    let totals = &report["totals"];
    for field in ["crashes", "partitions", "failovers", "session_unavailable", "session_outcome_unknown"] {
        assert_eq!(totals[field], 0, "{field}: {totals}");
    }
    // Every program commits, but for one that contention on the hot accounts may leave
    // without attempts (an OCC outcome, not a fault).
    let (committed, gave_up) = (totals["committed"].as_u64().unwrap(), totals["gave_up"].as_u64().unwrap());
    assert_eq!(committed + gave_up, 2 * 180, "{totals}");
    assert!(gave_up <= 1, "{totals}");
    assert_eq!(report["session_clients"], 3, "{totals}");
    assert_eq!(totals["session_committed"], totals["committed"], "{totals}");
}

/// Read-only transactions that skip local validation let audits see money in flight: some
/// of 6 seeds fail, the exit status says so, and each failure's replay command runs that one
/// seed again and fails with the same violations.
#[test]
fn skipping_local_validation_is_caught_and_each_failure_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weakened.json");
    let output =
        virga(&["sim", "dkv", "--weaken", "skip-local-validation", "--seeds", "6", "--json", path.to_str().unwrap()]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let report = json(&path);
    assert_eq!(report["weaken"], "skip-local-validation");
    let failures = report["failures"].as_array().unwrap();
    assert!(!failures.is_empty(), "{report}");
    for failure in failures {
        let seed = failure["seed"].as_u64().unwrap();
        let expected = format!("virga sim dkv --seeds 1 --first-seed {seed} --weaken skip-local-validation");
        assert_eq!(failure["replay"], expected.as_str());
        assert!(!failure["violations"].as_array().unwrap().is_empty(), "{failure}");
        assert!(stderr.contains(&format!("seed {seed} FAILED")), "{stderr}");
    }
    assert!(
        failures
            .iter()
            .flat_map(|failure| failure["violations"].as_array().unwrap())
            .any(|violation| violation.as_str().unwrap().starts_with("money: audit")),
        "{report}"
    );

    let first = &failures[0];
    let replay_json = dir.path().join("replay.json");
    let mut replay: Vec<&str> = first["replay"].as_str().unwrap().split_whitespace().skip(1).collect();
    replay.extend(["--json", replay_json.to_str().unwrap()]);
    let output = virga(&replay);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let replayed = json(&replay_json);
    assert_eq!(replayed["seeds"], 1);
    let again = &replayed["failures"].as_array().unwrap()[0];
    assert_eq!((&again["seed"], &again["violations"]), (&first["seed"], &first["violations"]));
    let run = |report: &serde_json::Value| {
        let seed = first["seed"].as_u64().unwrap();
        report["runs"].as_array().unwrap().iter().find(|run| run["seed"] == seed).unwrap()["trace_digest"].clone()
    };
    assert_eq!(run(&replayed), run(&report), "the replay runs the same trace");
}

/// KAIROS's validators: the seeds pass, and the JSON counts their crashes and votes.
#[test]
fn seeds_with_validators_pass_and_count_what_the_validators_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("validators.json");
    let args = ["sim", "dkv", "--seeds", "3", "--first-seed", "70", "--cache", "lease", "--validators", "2"];
    let output = virga(&[&args[..], &["--json", path.to_str().unwrap()]].concat());
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("2 validator(s)") && stderr.contains("3 seed(s), 0 failure(s)"), "{stderr}");
    let report = json(&path);
    assert_eq!(report["validators"], 2);
    let totals = &report["totals"];
    assert!(totals["validator_votes"].as_u64().unwrap() > 100, "{totals}");
    let kinds = ["backup_crashes", "client_crashes", "primary_crashes", "validator_crashes"];
    let crashes = kinds.iter().map(|kind| totals[kind].as_u64().unwrap()).sum::<u64>();
    assert_eq!(Some(crashes), totals["crashes"].as_u64(), "{totals}");
}

/// Each case: options and what the error must name. None of them starts a seed.
#[test]
fn bad_options_are_refused_before_any_seed_runs() {
    let cases: &[(&[&str], &str)] = &[
        (&["--seeds", "0"], "--seeds"),
        (&["--seeds", "10000001"], "--seeds"),
        (&[], "--seeds"),
        (&["--seeds", "1", "--weaken", "skip-everything"], "skip-latest-read, skip-local-validation,"),
        (&["--seeds", "1", "--weaken", "skip-everything"], "skip-cached-latest-committed"),
        (&["--seeds", "1", "--cache", "lru"], "static:X"),
        (&["--seeds", "1", "--cache", "static:1.5"], "--cache"),
        (&["--seeds", "1", "--weaken", "skip-everything"], "--weaken"),
        (&["--seeds", "1", "--faults", "some"], "--faults"),
        (&["--seeds", "1", "--clock", "lamport"], "--clock"),
        (&["--seeds", "1", "--skew", "gps"], "--skew"),
        (&["--seeds", "1", "--workers", "0"], "--workers"),
        (&["--seeds", "1", "--session-clients", "4"], "--session-clients"),
        (&["--seeds", "1", "--validators", "9"], "--validators"),
        (&["--seeds", "1", "--weaken", "skip-everything"], "validator-skip-freshness"),
        (&["--lease-scenario", "--validators", "2"], "--validators"),
        (&["--seeds", "1", "--workers", "1025"], "--workers"),
        (&["--seeds", "1", "--first-seed=-1"], "--first-seed"),
        (&["--seeds", "1", "--first-seed", "18446744073709551616"], "--first-seed"),
        (&["--seeds", "2", "--first-seed", "18446744073709551615"], "--first-seed 18446744073709551615 plus --seeds 2"),
        (&["--lease-scenario", "--seeds", "1"], "--seeds"),
        (&["--lease-scenario", "--no-leases"], "--no-leases"),
    ];
    for (options, named) in cases {
        let mut args = vec!["sim", "dkv"];
        args.extend_from_slice(options);
        let output = virga(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} must name {named}: {stderr}");
        assert!(!stderr.contains("running") && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// The scripted failover: without leases the same snapshot read returns two values (the
/// write's t1 lies below the read's t2); with leases it returns one.
#[test]
fn the_lease_scenario_shows_the_anomaly_only_without_leases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease.json");
    let output = virga(&["sim", "dkv", "--lease-scenario", "--json", path.to_str().unwrap()]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    assert!(stdout.contains("the anomaly, as expected without leases"), "{stdout}");
    assert!(stdout.contains("no anomaly"), "{stdout}");
    let runs = json(&path);
    let (without, with) = (&runs[0], &runs[1]);
    assert_eq!((&without["leases"], &with["leases"]), (&false.into(), &true.into()));
    assert_eq!((&without["anomaly"], &with["anomaly"]), (&true.into(), &false.into()));
    assert_ne!(without["first_read_value"], without["second_read_value"], "{without}");
    let time = |at: &serde_json::Value| at["time"].as_u64().unwrap();
    assert!(time(&without["write_committed_at"]) < time(&without["first_read_at"]), "t1 < t2: {without}");
    if !with["write_committed_at"].is_null() {
        assert!(time(&with["write_committed_at"]) > time(&with["first_read_at"]), "t1 > t2: {with}");
    }
    assert_eq!(with["first_read_value"], with["second_read_value"], "{with}");
    assert_eq!(with["second_read_ran"], true);
    assert_eq!((&without["failovers"], &with["failovers"]), (&1.into(), &1.into()));
}
