//! `virga chainify up` and `virga chainify verify` end to end: a consortium run kept in a
//! directory verifies, and a database changed outside the chain afterwards is named.

use std::process::Command;

use virga_chainify::postgres_server::{find_binaries, INSTALL_HINT};
use virga_chainify::sqlite::SqliteSync;
use virga_chainify::{smallbank, Organization, SqliteOrganization};

fn virga(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_virga")).args(args).output().unwrap()
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_sqlite_consortium_recovers_from_tampering_and_its_directory_verifies() {
    let scratch = tempfile::tempdir().unwrap();
    let (dir, report) = (scratch.path().join("run"), scratch.path().join("report.json"));
    let (dir_arg, report_arg) = (dir.to_str().unwrap(), report.to_str().unwrap());
    let up = virga(&[
        "chainify",
        "up",
        "--sqlite-only",
        "--dir",
        dir_arg,
        "--blocks",
        "6",
        "--block-size",
        "40",
        "--customers",
        "300",
        "--tamper-before",
        "2",
        "--checkpoint-every",
        "2",
        "--zipf",
        "1.1",
        "--workers",
        "2",
        "--json",
        report_arg,
    ]);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let report = json(&report);
    assert_eq!(report["blocks"], 6);
    assert_eq!(report["agreed_blocks"], 7, "the load's block and six more");
    assert!(report["tps"].as_f64().unwrap() > 0.0);
    assert!(report["postgres_alone_tps"].is_null());
    assert_eq!(report["recoveries"][0]["organization"], "org-3", "{report}");
    assert_eq!((report["skew"].as_str(), report["workers"].as_u64()), (Some("zipf:1.1"), Some(2)));
    let verified = virga(&["chainify", "verify", "--dir", dir_arg]);
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
    assert!(String::from_utf8_lossy(&verified.stdout).starts_with("ok: 3 organizations, 7 agreed blocks"));

    // Afterwards, org-2's checking table is changed behind the ledger's back.
    let mut org = SqliteOrganization::open("org-2", &dir.join("org-2").join("db.sqlite"), SqliteSync::Full).unwrap();
    org.attach(&smallbank::tables()).unwrap();
    org.run_outside_chain("UPDATE checking SET bal = bal - 1 WHERE custid = 17").unwrap();
    drop(org);
    let differs = virga(&["chainify", "verify", "--dir", dir_arg]);
    assert_eq!(differs.status.code(), Some(1));
    let said = String::from_utf8_lossy(&differs.stdout);
    assert!(
        said.contains("organization org-2: table checking differs from the replay of its ledger's 7 blocks"),
        "{said}"
    );
}

#[test]
fn a_consortium_with_postgres_reports_postgres_alone_beside_it() {
    if find_binaries().is_none() {
        assert!(std::env::var_os("VIRGA_REQUIRE_POSTGRES").is_none(), "{INSTALL_HINT}");
        eprintln!("skipped: {INSTALL_HINT}");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report.json");
    let up = virga(&[
        "chainify",
        "up",
        "--blocks",
        "3",
        "--block-size",
        "50",
        "--customers",
        "500",
        "--json",
        report.to_str().unwrap(),
    ]);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let report = json(&report);
    assert_eq!(report["organizations"][0]["database"], "postgres");
    assert_eq!(report["organizations"][2]["database"], "sqlite");
    assert_eq!(report["agreed_blocks"], 4);
    assert!(report["postgres_alone_tps"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["failed"].as_array().unwrap().is_empty());
}

#[test]
fn bad_chainify_options_are_refused_with_what_is_wrong() {
    let refused = virga(&["chainify", "up", "--sqlite-only", "--blocks", "2", "--tamper-before", "5"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tamper-before 5 is not one of the 2 blocks"));
    let refused = virga(&["chainify", "up", "--customers", "3"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--customers"));
    let refused = virga(&["chainify", "up", "--sqlite-only", "--zipf", "0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("must be a number above 0 and at most 5"));
}
