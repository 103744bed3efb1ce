//! Conformance with the Ethereum TrieTests vectors (copied from ethereum/tests into
//! testdata/ethereum; see testdata/ethereum/README.md).

use std::path::PathBuf;

fn vector(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/ethereum").join(name)
}

fn assert_all_pass(name: &str, secure: bool) {
    let outcomes = virga_trie::trietest::run_file(&vector(name), secure).expect("vector file parses");
    assert!(!outcomes.is_empty(), "{name} has cases");
    let failures: Vec<_> = outcomes.iter().filter(|o| !o.passed()).collect();
    assert!(failures.is_empty(), "{name}: failing cases {failures:#?}");
}

#[test]
fn trietest_json_cases_all_pass() {
    assert_all_pass("trietest.json", false);
}

#[test]
fn trieanyorder_json_cases_all_pass() {
    assert_all_pass("trieanyorder.json", false);
}
