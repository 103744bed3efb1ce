//! `virga sim rainblock`: the cost model's command line.

use crate::support::{json, text, virga};

/// Each case: one option out of range, and the option clap must name (exit status 2,
/// before any calibration runs).
#[test]
fn predict_refuses_out_of_range_options() {
    let cases: &[(&[&str], &str)] = &[
        (&["--machines", "0"], "--machines"),
        (&["--machines", "100001"], "--machines"),
        (&["--threads", "0"], "--threads"),
        (&["--threads", "5000"], "--threads"),
        (&["--clients", "0"], "--clients"),
        (&["--miners", "0"], "--miners"),
        (&["--storage-nodes", "0"], "--storage-nodes"),
        (&["--accounts", "1"], "--accounts"),
        (&["-r", "65"], "--retention"),
        (&["--batch", "0"], "--batch"),
        (&["--in-flight", "0"], "--in-flight"),
        (&["--block-transfers", "0"], "--block-transfers"),
        (&["--latency-ms=-1"], "--latency-ms"),
        (&["--wan-latency-ms", "NaN"], "--wan-latency-ms"),
        (&["--wan-latency-ms", "20000"], "--wan-latency-ms"),
        (&["--bandwidth-mbit", "0"], "--bandwidth-mbit"),
        (&["--bandwidth-mbit", "inf"], "--bandwidth-mbit"),
        (&["--regions", "0"], "--regions"),
        (&["--rounds", "0"], "--rounds"),
        (&["--transport", "udp"], "--transport"),
    ];
    for (options, option) in cases {
        let mut args = vec!["sim", "rainblock", "--predict"];
        args.extend_from_slice(options);
        let output = virga(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(option), "{args:?} must name {option}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A calibration saved once is used as it is: predictions for this machine and the seed's
/// scale, with the fields the issue names, and extrapolation marked.
#[test]
fn predict_writes_its_prediction_and_the_calibration_used() {
    let dir = tempfile::tempdir().unwrap();
    let calibration = dir.path().join("calibration.json");
    let here = dir.path().join("here.json");
    let output = virga(&[
        "sim",
        "rainblock",
        "--predict",
        "--save-calibration",
        calibration.to_str().unwrap(),
        "--json",
        here.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let here = json(&here);
    assert!(here["predicted_tps"].as_f64().unwrap() > 0.0);
    assert!(here["predicted_latency_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(here["extrapolated"], false);
    assert_eq!(here["calibration"], json(&calibration));

    let scale = dir.path().join("scale.json");
    let output = virga(&[
        "sim",
        "rainblock",
        "--predict",
        "--seed-setups",
        "--calibration",
        calibration.to_str().unwrap(),
        "--machines",
        "21",
        "--threads",
        "48",
        "--json",
        scale.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let scale = json(&scale);
    assert_eq!(scale["extrapolated"], true);
    assert_eq!(scale["calibration"], json(&calibration));
    let setups = scale["seed_setups"].as_array().unwrap();
    assert_eq!(setups.len(), 5);
    assert!(
        setups
            .iter()
            .all(|setup| setup["seed_reported_tps"].as_f64().unwrap() > 0.0
                && setup["prediction"]["extrapolated"] == true)
    );
    assert!(text(&output.stdout).contains("30000"), "{}", text(&output.stdout));
}

#[test]
fn a_calibration_file_that_is_not_one_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, "{\"format\": 1}").unwrap();
    let output = virga(&["sim", "rainblock", "--predict", "--calibration", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("bad.json") && stderr.contains("not a calibration"), "{stderr}");
}
