//! A tiny RainBlock sweep end to end: real clusters for Figs. 8 and 9a, the JSON and the SVG
//! plots written and readable.
//!
//! What is asserted is what the implementation guarantees:
//! - every offered transfer commits: aborted transfers are retried (a sender's later
//!   transfers wait behind its retried one), the generated transfers never fail, and the
//!   duration is generous;
//! - compacted, bagged witness bytes never exceed the full ones: a client's bag holds only
//!   nodes on the paths of the keys it submits, each once, while the full count charges every
//!   transfer both of its accounts' whole paths;
//! - with a budget of 0 the miner prunes to level r after every block, so its top layer ends
//!   as levels 0..=r of the trie plus the beneficiary's path. The trie's shape is the same at
//!   every r (the same accounts), so the node count (hash nodes included) cannot fall as r
//!   grows. The peak bytes are not compared: a peak is taken before a prune and includes
//!   whatever one block's witnesses attached, which depends on how submissions fell into
//!   blocks in that run.

use std::time::{Duration, Instant};
use virga_bench::rainblock::{self, RainblockResults, RunSummary, SweepConfig, SweepEvent};
use virga_node::cluster::{Quiet, TransportKind};

/// Every offered transfer committed and succeeded.
fn assert_accounted_for(run: &RunSummary) {
    let report = &run.report;
    assert_eq!(run.committed, run.offered as u64, "every transfer commits: {report:#}");
    assert_eq!(run.filtered, 0, "{report:#}");
    assert_eq!(run.succeeded, run.committed, "no committed transfer fails: {report:#}");
    assert!(run.committed > 0, "{report:#}");
    assert!(run.tps > 0.0);
    assert_eq!(report["committed"], run.committed, "the point keeps the run's report");
}

fn tiny_sweep() -> SweepConfig {
    SweepConfig {
        accounts: vec![2_000],
        retention: vec![1, 2],
        compaction: None,
        clients: vec![1, 2],
        fig8_clients: 2,
        fig9a_accounts: None,
        // Generous: a point ends as soon as every transfer has committed.
        duration: Duration::from_secs(60),
        transfers: 300,
        shards: 16,
        storage_nodes: 16,
        batch: 50,
        in_flight: 4,
        block_transfers: 2_000,
        top_budget_bytes: 0,
        transport: TransportKind::InProc,
        seed: 7,
        contracts: 0.0,
    }
}

#[test]
fn a_tiny_sweep_accounts_for_every_transfer_and_writes_json_and_plots() {
    let started = Instant::now();
    let config = tiny_sweep();
    let mut results = RainblockResults::new(config.clone());

    let mut finished = Vec::new();
    let fig8 = rainblock::fig8(&config, &Quiet, &mut |event| {
        if let SweepEvent::Finished { index, total, .. } = event {
            finished.push((index, total));
        }
    })
    .unwrap();
    assert_eq!(finished, vec![(0, 2), (1, 2)]);
    assert_eq!(fig8.len(), 2);
    for point in &fig8 {
        assert_eq!(point.run.offered, config.transfers);
        assert_accounted_for(&point.run);
        assert_eq!(point.compaction, point.retention + 1, "c follows r");
        assert!(point.witness_bytes_full_per_tx > 0.0, "{point:#?}");
        assert!(point.witness_bytes_compact_per_tx <= point.witness_bytes_full_per_tx, "{point:#?}");
        assert!(point.witness_compact_ratio > 0.0 && point.witness_compact_ratio <= 1.0);
        assert!(point.prunes >= 1, "a budget of 0 prunes after every block: {point:#?}");
        assert!(point.top_layer_peak_bytes > 0 && point.top_layer_nodes > 0);
        let aborts = point.run.report["aborts_by_reason"].as_object().unwrap();
        let aborted: u64 = aborts.values().map(|count| count.as_u64().unwrap()).sum();
        assert_eq!(point.run.aborted, aborted);
        let expected = aborted as f64 / (point.run.committed + aborted) as f64;
        assert!((point.run.abort_rate - expected).abs() < 1e-12 && point.run.abort_rate < 1.0);
    }
    eprintln!("{}", rainblock::Fig8Point::header());
    for point in &fig8 {
        eprintln!("{}", point.row());
    }
    let (r1, r2) = (&fig8[0], &fig8[1]);
    assert_eq!((r1.retention, r2.retention), (1, 2));
    assert!(
        r2.top_layer_nodes >= r1.top_layer_nodes,
        "a deeper cache holds at least as many nodes: r=1 {}, r=2 {}",
        r1.top_layer_nodes,
        r2.top_layer_nodes
    );

    let fig9a = rainblock::fig9a(&config, &Quiet, &mut |_| {}).unwrap();
    assert_eq!(
        fig9a.iter().map(|point| (point.clients, point.retention)).collect::<Vec<_>>(),
        vec![(1, 1), (1, 2), (2, 1), (2, 2)]
    );
    for point in &fig9a {
        assert_eq!(point.accounts, 2_000, "Fig. 9a runs at the largest N");
        assert_accounted_for(&point.run);
    }

    results.fig8 = fig8;
    results.fig9a = fig9a;
    let out = tempfile::tempdir().unwrap();
    let written = results.write(out.path()).unwrap();
    let names: Vec<String> =
        written.iter().map(|path| path.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            rainblock::RESULTS_FILE,
            rainblock::FIG8A_FILE,
            rainblock::FIG8B_FILE,
            rainblock::FIG8C_FILE,
            rainblock::FIG9A_FILE
        ]
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join(rainblock::RESULTS_FILE)).unwrap()).unwrap();
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(json["config"]["accounts"], serde_json::json!([2000]));
    assert_eq!(json["config"]["transport"], "inproc");
    assert_eq!(json["fig8"].as_array().unwrap().len(), 2);
    assert_eq!(json["fig9a"].as_array().unwrap().len(), 4);
    assert!(json["fig8"][0]["report"]["state_root"].as_str().unwrap().starts_with("0x"));
    assert_eq!(json["fig8"][0]["committed"], json["fig8"][0]["report"]["committed"]);

    // Text needs no font: the SVG backend writes it as <text> for the viewer to render.
    for (file, texts) in [
        (rainblock::FIG8A_FILE, &["Fig. 8a", "retention level r", "N = 2000"][..]),
        (rainblock::FIG8B_FILE, &["Fig. 8b", "compacted + bagged", "full (dashed)"][..]),
        (rainblock::FIG8C_FILE, &["Fig. 8c", "N = 2000"][..]),
        (rainblock::FIG9A_FILE, &["Fig. 9a", "prefetching clients", "r = 1", "r = 2"][..]),
    ] {
        let svg = std::fs::read_to_string(out.path().join(file)).unwrap();
        assert!(svg.contains("<svg"), "{file} is an SVG");
        assert!(svg.contains("<polyline") || svg.contains("<path"), "{file} has lines");
        for text in texts {
            assert!(svg.contains(text), "{file} lacks the text {text:?}");
        }
    }
    eprintln!("tiny sweep: {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn sweeps_that_cannot_run_are_refused_with_a_reason() {
    let mut config = tiny_sweep();
    config.compaction = Some(3);
    let error = rainblock::fig8(&config, &Quiet, &mut |_| {}).unwrap_err().to_string();
    assert!(error.contains("compaction level 3"), "{error}");

    let mut config = tiny_sweep();
    config.shards = 8;
    assert!(config.validate(rainblock::Figure::All).unwrap_err().to_string().contains("8 shards"));

    let mut config = tiny_sweep();
    config.accounts.clear();
    assert!(config.validate(rainblock::Figure::Fig8).is_err());
    config.fig9a_accounts = Some(2_000);
    assert!(config.validate(rainblock::Figure::Fig9a).is_ok());
}

/// The names `--fig` takes (clap derives the parser from them).
#[cfg(feature = "clap")]
#[test]
fn figure_names() {
    use clap::ValueEnum;
    assert_eq!(rainblock::Figure::from_str("9a", true), Ok(rainblock::Figure::Fig9a));
    assert_eq!(rainblock::Figure::from_str("Fig8", true), Ok(rainblock::Figure::Fig8));
    assert_eq!(rainblock::Figure::from_str("all", true), Ok(rainblock::Figure::All));
    assert!(rainblock::Figure::from_str("7", true).is_err());
}
