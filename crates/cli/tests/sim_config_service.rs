//! `virga sim config-service`: the configuration service's seeds from the command line, the
//! JSON they promise, the broken variant caught with replay commands that replay it, and
//! refused options.

use crate::support::{json, text, virga};

#[test]
fn seeds_pass_and_their_json_names_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seeds.json");
    let output =
        virga(&["sim", "config-service", "--seeds", "4", "--first-seed", "30", "--json", path.to_str().unwrap()]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("4 seed(s), 0 failure(s)"), "{stderr}");
    let report = json(&path);
    assert_eq!(report["seeds"], 4);
    assert_eq!(report["first_seed"], 30);
    assert_eq!(report["replicas"], 3);
    assert_eq!(report["failures"], serde_json::json!([]));
    let runs = report["runs"].as_array().unwrap();
    let seeds: Vec<u64> = runs.iter().map(|run| run["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds, [30, 31, 32, 33]);
    for run in runs {
        assert_eq!(run["passed"], true);
        assert_eq!(run["answered"], run["commands"], "{run}");
    }
    assert!(report["elections"].as_u64().unwrap() >= 4, "{report}");
    assert!(report["events"].as_u64().unwrap() > 0);
    assert!(report["timing"]["seconds_per_seed"].as_f64().unwrap() > 0.0);
}

/// Replicas that acknowledge before their writes are durable lose committed entries to power
/// failures: some of 60 seeds fail, the exit status says so, and each failure's replay
/// command runs that one seed again and fails the same way.
#[test]
fn the_broken_variant_fails_and_each_failure_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    let output = virga(&[
        "sim",
        "config-service",
        "--broken",
        "ack-before-write",
        "--seeds",
        "60",
        "--json",
        path.to_str().unwrap(),
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let report = json(&path);
    assert_eq!(report["broken"], "ack-before-write");
    let failures = report["failures"].as_array().unwrap();
    assert!(!failures.is_empty(), "{report}");
    for failure in failures {
        let seed = failure["seed"].as_u64().unwrap();
        let expected =
            format!("virga sim config-service --seeds 1 --first-seed {seed} --replicas 3 --broken ack-before-write");
        assert_eq!(failure["replay"], expected.as_str());
        assert!(stderr.contains(&format!("seed {seed} FAILED")), "{stderr}");
    }

    let first = &failures[0];
    let replay_json = dir.path().join("replay.json");
    let mut replay: Vec<&str> = first["replay"].as_str().unwrap().split_whitespace().skip(1).collect();
    replay.extend(["--json", replay_json.to_str().unwrap()]);
    let output = virga(&replay);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let replayed = json(&replay_json);
    assert_eq!(replayed["seeds"], 1);
    let again: Vec<_> = replayed["failures"].as_array().unwrap().iter().map(|failure| &failure["problem"]).collect();
    let before: Vec<_> =
        failures.iter().filter(|failure| failure["seed"] == first["seed"]).map(|failure| &failure["problem"]).collect();
    assert_eq!(again, before, "the replay fails exactly as the seed did");
}

/// Each case: one option out of range and what the error must name.
#[test]
fn out_of_range_options_are_refused_before_any_seed_runs() {
    let cases: &[(&[&str], &str, i32)] = &[
        (&["--seeds", "0"], "--seeds", 2),
        (&["--seeds", "10000001"], "--seeds", 2),
        (&[], "--seeds", 2),
        (&["--seeds", "1", "--replicas", "4"], "3 or 5 replicas", 2),
        (&["--seeds", "1", "--replicas", "1"], "3 or 5 replicas", 2),
        (&["--seeds", "1", "--workers", "0"], "--workers", 2),
        (&["--seeds", "1", "--first-seed=-1"], "--first-seed", 2),
        (&["--seeds", "1", "--first-seed", "18446744073709551616"], "--first-seed", 2),
        (&["--seeds", "1", "--broken", "slow-disk"], "--broken", 2),
        (&["--seeds", "2", "--first-seed", "18446744073709551615"], "--first-seed plus --seeds overflows", 1),
    ];
    for (options, named, status) in cases {
        let mut args = vec!["sim", "config-service"];
        args.extend_from_slice(options);
        let output = virga(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(*status), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} must name {named}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
