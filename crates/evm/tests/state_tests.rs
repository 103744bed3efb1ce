//! Ethereum's GeneralStateTests (a pinned selection, `testdata/ethereum/GeneralStateTests`,
//! sources in its `SOURCES.tsv`) through Virga's executor.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use virga_evm::statetest::{run_file, run_json, CaseResult, Tally, Verdict};
use virga_evm::Fork;

fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/ethereum/GeneralStateTests")
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the state tests directory is in the repository") {
        let path = entry.expect("readable directory entry").path();
        if path.is_dir() {
            files.extend(json_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "json") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn every_case_from_berlin_on_passes() {
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let mut directories = BTreeSet::new();
    let mut forks = BTreeSet::new();
    for file in json_files(&tests_dir()) {
        let results = run_file(&file, None).unwrap_or_else(|error| panic!("{error}"));
        for result in &results {
            tally.add(result);
            if let Verdict::Fail(_) = result.verdict {
                failures.push(format!("{}: {result}", file.display()));
            }
            if result.verdict == Verdict::Pass {
                forks.insert(result.fork.clone());
                directories.insert(file.parent().and_then(Path::file_name).map(|name| name.to_owned()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        tally.passed + tally.failed,
        failures.join("\n")
    );
    assert!(tally.passed >= 500, "only {} cases passed", tally.passed);
    assert!(directories.len() >= 10, "cases from only {} directories", directories.len());
    assert_eq!(forks.len(), 5, "passing forks: {forks:?}");
}

/// One file's text with `edit` applied to its JSON.
fn edited(file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let text = std::fs::read_to_string(tests_dir().join(file)).expect("state test file");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    edit(&mut json);
    json.to_string()
}

fn first_unit(json: &mut serde_json::Value) -> &mut serde_json::Value {
    json.as_object_mut().and_then(|units| units.values_mut().next()).expect("a test in the file")
}

fn verdicts(text: &str) -> Vec<CaseResult> {
    run_json(text, None).expect("a well-formed file")
}

#[test]
fn a_wrong_expected_state_root_fails_the_case() {
    let text = edited("stExample/add11.json", |json| {
        first_unit(json)["post"]["Cancun"][0]["hash"] = format!("0x{}", "11".repeat(32)).into();
    });
    let results = verdicts(&text);
    let cancun: Vec<_> = results.iter().filter(|result| result.fork == "Cancun").collect();
    assert!(matches!(&cancun[0].verdict, Verdict::Fail(why) if why.contains("expected state root")), "{}", cancun[0]);
    assert!(results.iter().filter(|result| result.fork != "Cancun").all(|result| result.verdict == Verdict::Pass));
}

#[test]
fn a_wrong_logs_hash_fails_the_case() {
    let text = edited("stLogTests/log1_logMemsizeZero.json", |json| {
        first_unit(json)["post"]["London"][0]["logs"] = format!("0x{}", "22".repeat(32)).into();
    });
    let london = verdicts(&text).into_iter().find(|result| result.fork == "London").expect("a London case");
    assert!(matches!(&london.verdict, Verdict::Fail(why) if why.contains("expected logs hash")), "{london}");
}

#[test]
fn running_a_case_under_the_wrong_fork_fails_it() {
    // From Paris on, opcode 0x44 is PREVRANDAO rather than DIFFICULTY: executed as London,
    // the contract stores the difficulty and the root differs.
    let text = edited("stExample/mergeTest.json", |json| {
        let post = first_unit(json)["post"].as_object_mut().expect("post is an object");
        let paris = post.remove("Paris").expect("a Paris post");
        post.clear();
        post.insert("London".into(), paris);
    });
    let results = verdicts(&text);
    assert!(!results.is_empty());
    assert!(results.iter().all(|result| matches!(result.verdict, Verdict::Fail(_))), "{results:?}");
}

#[test]
fn an_invalid_transaction_the_file_calls_valid_fails_the_case() {
    // The Berlin case of eip1559 is a type-2 transaction, refused before London.
    let text = edited("stExample/eip1559.json", |json| {
        let berlin = first_unit(json)["post"]["Berlin"].as_array_mut().expect("Berlin cases");
        for case in berlin {
            case.as_object_mut().expect("a case").remove("expectException");
        }
    });
    let berlin = verdicts(&text).into_iter().find(|result| result.fork == "Berlin").expect("a Berlin case");
    assert!(matches!(&berlin.verdict, Verdict::Fail(why) if why.contains("got a refusal")), "{berlin}");
}

#[test]
fn forks_before_berlin_are_skipped_with_the_reason_and_a_fork_filter_keeps_one_fork() {
    let all = run_file(&tests_dir().join("stExample/accessListExample.json"), None).expect("runs");
    let istanbul: Vec<_> = all.iter().filter(|result| result.fork == "Istanbul").collect();
    assert!(!istanbul.is_empty());
    assert!(istanbul
        .iter()
        .all(|result| matches!(&result.verdict, Verdict::Skip(why) if why.contains("before Berlin"))));
    let london = run_file(&tests_dir().join("stExample/add11.json"), Some(Fork::London)).expect("runs");
    assert!(
        !london.is_empty() && london.iter().all(|result| result.fork == "London" && result.verdict == Verdict::Pass)
    );
    assert_eq!(london[0].to_string(), "PASS add11/London/d0g0v0");
}

#[test]
fn a_file_that_is_not_a_state_test_is_refused_with_the_reason() {
    let error = run_json(r#"{"t": {"env": {}}}"#, None).expect_err("not a state test");
    assert!(error.to_string().contains("missing field"), "{error}");
    let text = edited("stExample/add11.json", |json| {
        first_unit(json)["pre"] =
            serde_json::json!({"0x01": {"balance": "0xzz", "code": "0x", "nonce": "0x00", "storage": {}}});
    });
    assert!(run_json(&text, None).is_err());
}
