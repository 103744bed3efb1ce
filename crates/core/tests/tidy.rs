//! The tidy test: protocol cores stay pure. A core (events in, commands out; see "Cores and
//! drivers" in `docs/ARCHITECTURE.md`) reads no clock, touches no file, sleeps nowhere and
//! starts no thread, runtime or pool: its driver does all of that. This test reads the
//! source of every core module of the workspace and fails on any use of what only a driver
//! may use, naming the file, the line and what to do instead.

use std::path::{Path, PathBuf};

/// The core modules, relative to the workspace root: a file, or a folder whose `.rs` files
/// are all core (test files excepted). Keep this list and the table in
/// `docs/ARCHITECTURE.md` the same.
const CORES: &[&str] = &[
    // The distributed store: data nodes, the transaction client, the configuration
    // service's replica, KAIROS's validators, and the state machines they share.
    "crates/dkv/src/shard/core.rs",
    "crates/dkv/src/shard/core",
    "crates/dkv/src/shard/replica.rs",
    "crates/dkv/src/shard/replica",
    "crates/dkv/src/client",
    "crates/dkv/src/service/core.rs",
    "crates/dkv/src/config.rs",
    "crates/dkv/src/kairos/validator_core.rs",
    "crates/dkv/src/kairos/validator.rs",
    "crates/dkv/src/kairos/grants.rs",
    "crates/dkv/src/kairos/client_cache.rs",
    // RainBlock: the storage node's, the prefetching client's and the miner's cores.
    "crates/node/src/storage/core.rs",
    "crates/node/src/storage/versions.rs",
    "crates/node/src/storage/contracts.rs",
    "crates/node/src/client",
    "crates/node/src/miner/mod.rs",
    "crates/node/src/miner/batching.rs",
    "crates/node/src/miner/commit.rs",
    "crates/node/src/miner/contract_bags.rs",
    "crates/node/src/miner/errors.rs",
    "crates/node/src/miner/follower.rs",
    "crates/node/src/miner/top_layer.rs",
    "crates/node/src/miner/warm_up.rs",
    // ChainifyDB's pipeline servers.
    "crates/chainify/src/pipeline/chainify_server.rs",
    "crates/chainify/src/pipeline/client.rs",
    "crates/chainify/src/pipeline/commit.rs",
    "crates/chainify/src/pipeline/execution.rs",
    "crates/chainify/src/pipeline/orderer.rs",
    "crates/chainify/src/pipeline/seq_window.rs",
    // Raft as every replicated core drives it.
    "crates/raft/src/replica.rs",
    "crates/raft/src/log.rs",
    "crates/raft/src/wire.rs",
];

/// What a core must not use, and what it does instead.
const FORBIDDEN: &[(&str, &str)] = &[
    ("std::fs", "ask the driver for a device operation (Command::Io); files go through Storage"),
    ("Instant::now", "use the `now` the driver passes to `step`"),
    ("SystemTime::now", "use the `now` the driver passes to `step`"),
    ("thread::sleep", "set a timer (Command::SetTimer)"),
    ("thread::spawn", "hand the work to the driver as a detached device operation"),
    ("tokio", "the driver runs the core on tokio; the core knows nothing of it"),
    ("rayon", "the driver owns thread pools; hand parallel work to it as a device operation"),
    ("std::net", "peers are reached through Command::Call"),
];

#[derive(Debug, PartialEq, Eq)]
struct Violation {
    line: usize,
    forbidden: &'static str,
    advice: &'static str,
}

/// The uses of forbidden names in `source`, outside comments and outside its test modules
/// (everything after a `#[cfg(test)]` that opens a `mod`).
fn violations(source: &str) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut lines = source.lines().enumerate().peekable();
    while let Some((index, line)) = lines.next() {
        let code = line.split("//").next().unwrap_or_default();
        if code.trim() == "#[cfg(test)]" && lines.peek().is_some_and(|(_, next)| next.trim_start().starts_with("mod "))
        {
            break;
        }
        for (forbidden, advice) in FORBIDDEN {
            if contains_path(code, forbidden) {
                found.push(Violation { line: index + 1, forbidden, advice });
            }
        }
    }
    found
}

/// Whether `code` names `path` as a path (not as part of a longer identifier: `tokio_like`
/// or `my_rayon` are someone else's).
fn contains_path(code: &str, path: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(path).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + path.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The core source files: each listed file, and every `.rs` file of each listed folder but
/// its tests.
fn core_files(root: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    for entry in CORES {
        let path = root.join(entry);
        assert!(path.exists(), "core module {entry} is listed but does not exist: update CORES");
        if path.is_dir() {
            let mut stack = vec![path];
            while let Some(dir) = stack.pop() {
                for item in std::fs::read_dir(&dir).expect("a core folder reads") {
                    let item = item.expect("a core folder's entry reads").path();
                    let name = item.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_string();
                    if item.is_dir() {
                        stack.push(item);
                    } else if name.ends_with(".rs") && !is_test_file(&name) {
                        let relative = item.strip_prefix(root).unwrap_or(&item).display().to_string();
                        files.push((relative, item));
                    }
                }
            }
        } else {
            files.push((entry.to_string(), path));
        }
    }
    files
}

fn is_test_file(name: &str) -> bool {
    name == "tests.rs" || name.ends_with("_tests.rs")
}

#[test]
fn tidy_no_core_module_reads_a_clock_touches_a_file_sleeps_or_starts_threads() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for (name, path) in core_files(&root) {
        let source = std::fs::read_to_string(&path).expect("a core module reads");
        for violation in violations(&source) {
            problems.push(format!(
                "{name}:{}: a core uses `{}`; {}",
                violation.line, violation.forbidden, violation.advice
            ));
        }
    }
    assert!(problems.is_empty(), "core modules break the rules of a core:\n{}", problems.join("\n"));
}

#[test]
fn tidy_catches_each_forbidden_use_and_passes_clean_code() {
    let dirty = "use std::fs::File;\n\
                 fn step(&mut self) {\n\
                 \x20   let started = std::time::Instant::now(); // timing\n\
                 \x20   std::thread::sleep(DELAY);\n\
                 \x20   tokio::spawn(async {});\n\
                 \x20   rayon::join(a, b);\n\
                 \x20   let at = SystemTime::now();\n\
                 }\n";
    let found: Vec<(usize, &str)> = violations(dirty).iter().map(|v| (v.line, v.forbidden)).collect();
    assert_eq!(
        found,
        [(1, "std::fs"), (3, "Instant::now"), (4, "thread::sleep"), (5, "tokio"), (6, "rayon"), (7, "SystemTime::now")]
    );
    let clean = "// The driver reads Instant::now and runs on tokio.\n\
                 /// Never std::fs here.\n\
                 fn step(&mut self, now: Nanos) { let my_tokio_count = 1; let not_rayon_ = 2; }\n\
                 #[cfg(test)]\n\
                 mod tests {\n\
                 \x20   fn helper() { std::thread::sleep(SHORT); }\n\
                 }\n";
    assert_eq!(violations(clean), []);
}

#[test]
fn tidy_every_listed_core_exists_and_holds_code() {
    let files = core_files(&workspace_root());
    assert!(files.len() >= CORES.len(), "{files:?}");
    assert!(files.iter().any(|(name, _)| name.ends_with("shard/core/replication.rs")), "folders are walked");
    assert!(!files.iter().any(|(name, _)| name.ends_with("client/tests.rs")), "test files are left out");
}
