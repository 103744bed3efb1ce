//! `Genesis::state_root` against the roots of real genesis files (sources in
//! testdata/genesis/README.md).

use std::path::PathBuf;

#[test]
fn real_genesis_files_give_their_published_state_roots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/genesis");
    let roots: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("roots.json")).unwrap()).unwrap();
    assert!(roots.len() >= 5);
    for (file, root) in roots {
        let genesis = virga_trie::genesis::Genesis::from_file(&dir.join(&file)).unwrap();
        let actual = virga_core::hex::encode_prefixed(genesis.state_root());
        assert_eq!(actual, root.as_str().unwrap(), "{file}");
    }
}
