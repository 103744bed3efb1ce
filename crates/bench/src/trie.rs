//! `virga bench trie`: the same secure state trie of N accounts built in Virga's
//! DSM-Tree and in peer tries, measured operation by operation.
//!
//! Each implementation runs in a child process of its own (see [`run_in_child`]) so its
//! resident memory is measured alone, with nothing freed by another implementation to
//! reuse or hide.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use alloy_primitives::U256;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use virga_trie::account::Account;
use virga_trie::SecureTrie;

use crate::trie_impl::{AccountBatch, BenchTrie};

/// The DSM-Tree as a benchmark subject.
#[derive(Default)]
pub struct VirgaTrie {
    trie: SecureTrie,
}

impl BenchTrie for VirgaTrie {
    fn name(&self) -> &'static str {
        "virga"
    }
    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]) {
        self.trie.insert(address, account_rlp);
    }
    fn insert_batch(&mut self, accounts: &AccountBatch) {
        self.trie.insert_many(accounts.iter().collect());
    }
    fn get(&mut self, address: &[u8; 20]) -> usize {
        self.trie.get(address).map_or(0, |value| value.len())
    }
    fn get_batch(&mut self, addresses: &[[u8; 20]]) -> usize {
        self.trie.get_many(addresses).iter().map(|value| value.as_ref().map_or(0, |v| v.len())).sum()
    }
    fn root(&mut self) -> [u8; 32] {
        self.trie.root_hash().0
    }
    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>> {
        self.trie.prove(address)
    }
}

/// Names accepted by `--impl-only`, in report order.
pub fn implementation_names(with_peers: bool) -> Vec<&'static str> {
    let mut names = vec!["virga"];
    if with_peers {
        names.extend(["eth_trie", "trie_db", "alloy_hash_builder"]);
    }
    names
}

fn make_impl(name: &str) -> anyhow::Result<Box<dyn BenchTrie>> {
    match name {
        "virga" => Ok(Box::new(VirgaTrie::default())),
        #[cfg(feature = "peers")]
        "eth_trie" => Ok(Box::new(crate::peers::EthTriePeer::new())),
        #[cfg(feature = "peers")]
        "trie_db" => Ok(Box::new(crate::peers::TrieDbPeer::new())),
        #[cfg(feature = "peers")]
        "alloy_hash_builder" => Ok(Box::new(crate::peers::HashBuilderPeer::new())),
        other => bail!("unknown trie implementation {other:?} (peers need the `peers` cargo feature)"),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrieBenchConfig {
    pub accounts: usize,
    pub gets: usize,
    pub blocks: usize,
    pub block_updates: usize,
    pub proofs: usize,
    pub single_inserts: usize,
    pub seed: u64,
}

impl TrieBenchConfig {
    pub fn new(accounts: usize) -> Self {
        Self {
            accounts,
            gets: 1_000_000,
            blocks: 100,
            block_updates: 1_000,
            proofs: 100_000,
            single_inserts: 100_000,
            seed: 42,
        }
    }

    /// A peer that recomputes every root from scratch gets fewer blocks and proofs, so
    /// one run finishes in minutes; its rates stay comparable.
    fn scaled_for(&self, name: &str) -> Self {
        let mut config = self.clone();
        if name == "alloy_hash_builder" {
            config.blocks = config.blocks.min(3);
            config.proofs = config.proofs.min(3);
        }
        config
    }
}

/// One measured operation of one implementation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpResult {
    #[serde(rename = "impl")]
    pub implementation: String,
    pub op: String,
    pub count: usize,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// Runs the rate is the median of.
    #[serde(default = "one")]
    pub runs: usize,
}

fn one() -> usize {
    1
}

/// Everything one implementation's child process reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImplReport {
    pub implementation: String,
    pub root: String,
    pub results: Vec<OpResult>,
    pub bytes_per_account: f64,
    pub proof_bytes_mean: f64,
    pub proof_nodes_mean: f64,
}

/// Deterministic accounts: random 20-byte addresses and plausible EOA balances.
pub struct Workload {
    pub addresses: Vec<[u8; 20]>,
    pub accounts: Vec<Account>,
}

impl Workload {
    pub fn generate(count: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut addresses = Vec::with_capacity(count);
        let mut accounts = Vec::with_capacity(count);
        for _ in 0..count {
            addresses.push(rng.random::<[u8; 20]>());
            let wei: u128 = rng.random_range(0..100_000_000_000_000_000_000_000u128);
            accounts.push(Account::with_balance(rng.random_range(0..1_000), U256::from(wei)));
        }
        Self { addresses, accounts }
    }
}

/// Resident set size of this process, from /proc (0 where unavailable).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

pub(crate) fn progress(total: usize, label: String) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    bar
}

fn measured(name: &str, op: &str, count: usize, elapsed: Duration) -> OpResult {
    let seconds = elapsed.as_secs_f64();
    OpResult {
        implementation: name.to_string(),
        op: op.to_string(),
        count,
        seconds,
        ops_per_sec: if seconds > 0.0 { count as f64 / seconds } else { 0.0 },
        runs: 1,
    }
}

const CHUNK: usize = 10_000;
/// Keys per batched lookup.
const GET_BATCH: usize = 1_024;

/// Runs every operation for one implementation in this process. `release_free_memory`
/// asks the allocator to return freed pages to the operating system; it is called
/// before both readings of resident memory, so that no implementation is credited
/// with pages another allocation freed, nor charged for temporaries it freed.
pub fn run_single(
    name: &str,
    config: &TrieBenchConfig,
    show_progress: bool,
    release_free_memory: &dyn Fn(),
) -> anyhow::Result<ImplReport> {
    let config = config.scaled_for(name);
    if config.accounts == 0 {
        bail!("a trie benchmark needs at least one account");
    }
    let workload = Workload::generate(config.accounts, config.seed);
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0x5eed);
    let hidden = |bar: ProgressBar| if show_progress { bar } else { ProgressBar::hidden() };

    let mut subject = make_impl(name)?;
    let mut results = Vec::new();

    // Bulk insert, no root: every implementation gets the whole batch.
    let batch = AccountBatch::new(&workload.addresses, &workload.accounts);
    release_free_memory();
    let resident_before = resident_bytes();
    let bar = hidden(progress(config.accounts, format!("{name}: insert")));
    let start = Instant::now();
    subject.insert_batch(&batch);
    results.push(measured(name, "insert", config.accounts, start.elapsed()));
    bar.finish_and_clear();
    let start = Instant::now();
    let root = subject.root();
    results.push(measured(name, "first_root", 1, start.elapsed()));
    release_free_memory();
    let bytes_per_account = resident_bytes().saturating_sub(resident_before) as f64 / config.accounts.max(1) as f64;
    drop(batch);

    // Random gets of existing accounts.
    let picks: Vec<usize> = (0..config.gets).map(|_| rng.random_range(0..config.accounts)).collect();
    let bar = hidden(progress(config.gets, format!("{name}: get")));
    let mut found_bytes = 0usize;
    let start = Instant::now();
    for chunk in picks.chunks(CHUNK) {
        for &index in chunk {
            found_bytes += subject.get(&workload.addresses[index]);
        }
        bar.inc(chunk.len() as u64);
    }
    results.push(measured(name, "get", config.gets, start.elapsed()));
    bar.finish_and_clear();
    if found_bytes == 0 && config.gets > 0 {
        bail!("{name}: gets found nothing");
    }

    // The same gets in batches of 1,024.
    let addresses: Vec<[u8; 20]> = picks.iter().map(|&index| workload.addresses[index]).collect();
    let bar = hidden(progress(config.gets, format!("{name}: get batch")));
    let mut batch_bytes = 0usize;
    let start = Instant::now();
    for batch in addresses.chunks(GET_BATCH) {
        batch_bytes += subject.get_batch(batch);
        bar.inc(batch.len() as u64);
    }
    results.push(measured(name, "get_batch", config.gets, start.elapsed()));
    bar.finish_and_clear();
    if batch_bytes != found_bytes {
        bail!("{name}: batched gets found {batch_bytes} bytes, single gets {found_bytes}");
    }

    // Proofs of random accounts at the current root.
    let bar = hidden(progress(config.proofs, format!("{name}: proof")));
    let (mut proof_bytes, mut proof_nodes) = (0usize, 0usize);
    let start = Instant::now();
    for _ in 0..config.proofs {
        let proof = subject.prove(&workload.addresses[rng.random_range(0..config.accounts)]);
        proof_nodes += proof.len();
        proof_bytes += proof.iter().map(Vec::len).sum::<usize>();
        bar.inc(1);
    }
    results.push(measured(name, "proof", config.proofs, start.elapsed()));
    bar.finish_and_clear();

    // Single inserts of new accounts into the full trie, one call each.
    let fresh = Workload::generate(config.single_inserts, config.seed ^ 0xf7e5);
    let fresh_rlps: Vec<Vec<u8>> = fresh.accounts.iter().map(Account::rlp).collect();
    let bar = hidden(progress(config.single_inserts, format!("{name}: insert one")));
    let start = Instant::now();
    for (address, rlp) in fresh.addresses.iter().zip(&fresh_rlps) {
        subject.insert(address, rlp);
    }
    results.push(measured(name, "insert_one", config.single_inserts, start.elapsed()));
    bar.finish_and_clear();
    subject.root();

    // Blocks of random balance updates, a root after each.
    let bar = hidden(progress(config.blocks, format!("{name}: blocks")));
    let updates = config.blocks * config.block_updates;
    let mut balances: Vec<Account> = workload.accounts.clone();
    let start = Instant::now();
    for _ in 0..config.blocks {
        for _ in 0..config.block_updates {
            let index = rng.random_range(0..config.accounts);
            let account = &mut balances[index];
            account.balance = account.balance.wrapping_add(U256::from(1u8));
            account.nonce += 1;
            subject.insert(&workload.addresses[index], &account.rlp());
        }
        subject.root();
        bar.inc(1);
    }
    results.push(measured(name, "block_with_root", updates, start.elapsed()));
    bar.finish_and_clear();

    let proofs = config.proofs.max(1) as f64;
    Ok(ImplReport {
        implementation: name.to_string(),
        root: virga_core::hex::encode_prefixed(root),
        results,
        bytes_per_account,
        proof_bytes_mean: proof_bytes as f64 / proofs,
        proof_nodes_mean: proof_nodes as f64 / proofs,
    })
}

/// Runs one implementation `runs` times, each in a fresh child process, and keeps the
/// median of every rate (and of the memory figure) across the runs.
pub fn run_median_in_children(
    exe: &Path,
    name: &str,
    config: &TrieBenchConfig,
    runs: usize,
) -> anyhow::Result<ImplReport> {
    let mut reports = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        reports.push(run_in_child(exe, name, config)?);
    }
    let mut median = reports[0].clone();
    for (index, result) in median.results.iter_mut().enumerate() {
        let mut rates: Vec<f64> = reports.iter().filter_map(|r| r.results.get(index)).map(|r| r.ops_per_sec).collect();
        result.ops_per_sec = crate::median(&mut rates);
        result.seconds = if result.ops_per_sec > 0.0 { result.count as f64 / result.ops_per_sec } else { 0.0 };
        result.runs = rates.len();
    }
    median.bytes_per_account = crate::median(&mut reports.iter().map(|r| r.bytes_per_account).collect::<Vec<_>>());
    if let Some(other) = reports.iter().find(|r| r.root != median.root) {
        bail!("{name}: runs disagree on the root ({} vs {})", median.root, other.root);
    }
    Ok(median)
}

/// Runs one implementation in a child process (`exe bench trie --impl-only NAME …`),
/// whose last stdout line is its JSON report.
pub fn run_in_child(exe: &Path, name: &str, config: &TrieBenchConfig) -> anyhow::Result<ImplReport> {
    let output = std::process::Command::new(exe)
        .args(["bench", "trie", "--impl-only", name])
        .args(["--accounts", &config.accounts.to_string()])
        .args(["--gets", &config.gets.to_string()])
        .args(["--blocks", &config.blocks.to_string()])
        .args(["--block-updates", &config.block_updates.to_string()])
        .args(["--proofs", &config.proofs.to_string()])
        .args(["--single-inserts", &config.single_inserts.to_string()])
        .args(["--seed", &config.seed.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("starting the {name} benchmark process"))?;
    if !output.status.success() {
        bail!("the {name} benchmark process failed ({})", output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().context("benchmark process printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("parsing the {name} report"))
}

/// Bytes of witnesses for transfers between random account pairs: one full proof per
/// account, one node bag for the whole batch, and compacted bags at levels 0..=8.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeBagReport {
    pub transfers: usize,
    pub full_witness_bytes: usize,
    pub node_bag_bytes: usize,
    pub compacted_bytes: BTreeMap<usize, usize>,
}

pub fn node_bag_experiment(trie: &SecureTrie, workload: &Workload, transfers: usize, seed: u64) -> NodeBagReport {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut keys = Vec::with_capacity(transfers * 2);
    let mut full_witness_bytes = 0;
    for _ in 0..transfers {
        for _ in 0..2 {
            let address = workload.addresses[rng.random_range(0..workload.addresses.len())];
            full_witness_bytes += trie.prove(&address).iter().map(Vec::len).sum::<usize>();
            keys.push(address);
        }
    }
    let node_bag_bytes = trie.prove_many(&keys, 0).node_bytes();
    let compacted_bytes = (0..=8).map(|level| (level, trie.prove_many(&keys, level).node_bytes())).collect();
    NodeBagReport { transfers, full_witness_bytes, node_bag_bytes, compacted_bytes }
}

/// What keccak-256 costs on this machine: every implementation hashes each address it
/// is given and every node of a root it computes, so these bound all of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeccakCost {
    /// Nanoseconds to hash a 20-byte address.
    pub address_ns: f64,
    /// Nanoseconds to hash a full branch node's 532-byte RLP (four keccak blocks).
    pub branch_node_ns: f64,
}

pub fn measure_keccak() -> KeccakCost {
    fn time_per_hash(input: &[u8], count: usize) -> f64 {
        let mut buffer = input.to_vec();
        let start = Instant::now();
        for i in 0..count {
            buffer[0] = i as u8;
            let hash = alloy_primitives::keccak256(&buffer);
            buffer[1] ^= hash[0];
        }
        std::hint::black_box(&buffer);
        start.elapsed().as_secs_f64() * 1e9 / count as f64
    }
    KeccakCost { address_ns: time_per_hash(&[7; 20], 1_000_000), branch_node_ns: time_per_hash(&[7; 532], 200_000) }
}

/// The whole run: every implementation, and the node-bag experiment on Virga's trie.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrieBenchReport {
    pub accounts: usize,
    pub runs: usize,
    pub machine: String,
    pub results: Vec<OpResult>,
    pub bytes_per_account: BTreeMap<String, f64>,
    pub proof_bytes_mean: BTreeMap<String, f64>,
    pub roots: BTreeMap<String, String>,
    pub node_bags: NodeBagReport,
    pub keccak: KeccakCost,
}

impl TrieBenchReport {
    pub fn assemble(
        accounts: usize,
        runs: usize,
        reports: Vec<ImplReport>,
        node_bags: NodeBagReport,
        keccak: KeccakCost,
    ) -> anyhow::Result<Self> {
        // Implementations that disagree on the root did different work: no rate is comparable.
        if let Some(first) = reports.first() {
            if let Some(other) = reports.iter().find(|r| r.root != first.root) {
                bail!(
                    "roots differ, so the implementations did not build the same trie: {} {} against {} {}",
                    first.implementation,
                    first.root,
                    other.implementation,
                    other.root
                );
            }
        }
        let mut report = Self {
            accounts,
            runs,
            machine: machine_description(),
            results: Vec::new(),
            bytes_per_account: BTreeMap::new(),
            proof_bytes_mean: BTreeMap::new(),
            roots: BTreeMap::new(),
            node_bags,
            keccak,
        };
        for implementation in reports {
            report.bytes_per_account.insert(implementation.implementation.clone(), implementation.bytes_per_account);
            report.proof_bytes_mean.insert(implementation.implementation.clone(), implementation.proof_bytes_mean);
            report.roots.insert(implementation.implementation.clone(), implementation.root);
            report.results.extend(implementation.results);
        }
        Ok(report)
    }

    fn rate(&self, implementation: &str, op: &str) -> Option<f64> {
        self.results.iter().find(|r| r.implementation == implementation && r.op == op).map(|r| r.ops_per_sec)
    }

    /// The human-readable table, with Virga's ratio to the best peer on each line.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut names: Vec<&str> = Vec::new();
        for result in &self.results {
            if !names.contains(&result.implementation.as_str()) {
                names.push(&result.implementation);
            }
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Trie benchmark: {} accounts (secure state trie, RLP accounts) on {}; median of {} run(s)",
            self.accounts, self.machine, self.runs
        );
        let _ = write!(out, "{:<18}", "operation");
        for name in &names {
            let _ = write!(out, "{name:>20}");
        }
        let _ = writeln!(out, "{:>16}", "virga/best peer");
        for op in ["insert", "insert_one", "get", "get_batch", "block_with_root", "proof"] {
            let _ = write!(out, "{:<18}", format!("{op} (ops/s)"));
            for name in &names {
                let cell = self.rate(name, op).map_or("-".to_string(), |r| format!("{r:.0}"));
                let _ = write!(out, "{cell:>20}");
            }
            let ratio = ratio_to_best_peer(&names, op, |name| self.rate(name, op), f64::max);
            let _ = writeln!(out, "{:>16}", ratio.map_or("-".to_string(), |r| format!("{r:.1}x")));
        }
        let _ = write!(out, "{:<18}", "bytes/account");
        for name in &names {
            let _ = write!(out, "{:>20.0}", self.bytes_per_account.get(*name).copied().unwrap_or(0.0));
        }
        let memory = ratio_to_best_peer(&names, "memory", |name| self.bytes_per_account.get(name).copied(), f64::min);
        let _ = writeln!(out, "{:>16}", memory.map_or("-".to_string(), |r| format!("{r:.2}x")));
        let _ = write!(out, "{:<18}", "proof bytes");
        for name in &names {
            let _ = write!(out, "{:>20.0}", self.proof_bytes_mean.get(*name).copied().unwrap_or(0.0));
        }
        let _ = writeln!(out);
        if names.contains(&"alloy_hash_builder") {
            let _ = writeln!(out, "(alloy_hash_builder keeps leaves in a BTreeMap and builds each root from scratch: it is a peer for roots and proofs only)");
        }
        for (name, root) in &self.roots {
            let _ = writeln!(out, "root {name:<20} {root}");
        }
        let _ = writeln!(
            out,
            "keccak-256 on this machine: {:.0} ns per address, {:.0} ns per full branch node",
            self.keccak.address_ns, self.keccak.branch_node_ns
        );
        let bags = &self.node_bags;
        let _ = writeln!(out, "\nWitnesses for {} two-account transfers:", bags.transfers);
        let _ = writeln!(out, "  full witnesses   {:>12} bytes", bags.full_witness_bytes);
        let _ = writeln!(
            out,
            "  node bag         {:>12} bytes ({:.1}% smaller)",
            bags.node_bag_bytes,
            reduction(bags.full_witness_bytes, bags.node_bag_bytes)
        );
        for (level, bytes) in &bags.compacted_bytes {
            let _ = writeln!(
                out,
                "  compacted c={level}    {bytes:>12} bytes ({:.1}% smaller)",
                reduction(bags.full_witness_bytes, *bytes)
            );
        }
        out
    }

    /// The JSON promised by `--json`: `{"accounts", "results": [{"impl", "op", "ops_per_sec"}], "bytes_per_account"}` and more.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// Virga's figure divided by the best peer's, where `better` picks the best of two.
fn ratio_to_best_peer(
    names: &[&str],
    op: &str,
    figure: impl Fn(&str) -> Option<f64>,
    better: fn(f64, f64) -> f64,
) -> Option<f64> {
    let best = names.iter().filter(|n| is_peer_for(n, op)).filter_map(|n| figure(n)).reduce(better)?;
    let ours = figure("virga")?;
    (best > 0.0).then(|| ours / best)
}

/// Whether `name` is a peer for `op` in the ratio column. alloy-trie's HashBuilder is a
/// root (and proof) builder over a sorted map, not a trie: its inserts, gets and memory
/// are a `BTreeMap`'s, so it is compared on roots and proofs only.
fn is_peer_for(name: &str, op: &str) -> bool {
    match name {
        "virga" => false,
        "alloy_hash_builder" => matches!(op, "block_with_root" | "proof"),
        // Memory is compared with the tries only (see above).
        _ => true,
    }
}

fn reduction(full: usize, smaller: usize) -> f64 {
    if full == 0 {
        0.0
    } else {
        100.0 * (1.0 - smaller as f64 / full as f64)
    }
}

/// "N cores, model" from /proc/cpuinfo, for the report's header.
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cores} cores, {model}")
}

/// Builds Virga's trie of the workload (for the node-bag experiment) with the bulk path.
pub fn build_virga(workload: &Workload) -> SecureTrie {
    let mut trie = SecureTrie::new();
    trie.insert_many(
        workload.addresses.iter().zip(&workload.accounts).map(|(a, account)| (a, account.rlp())).collect(),
    );
    trie
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(implementation: &str, root: &str) -> ImplReport {
        ImplReport {
            implementation: implementation.to_string(),
            root: root.to_string(),
            results: vec![measured(implementation, "insert", 10, Duration::from_millis(1))],
            bytes_per_account: 100.0,
            proof_bytes_mean: 500.0,
            proof_nodes_mean: 4.0,
        }
    }

    fn assemble(reports: Vec<ImplReport>) -> anyhow::Result<TrieBenchReport> {
        let bags =
            NodeBagReport { transfers: 0, full_witness_bytes: 0, node_bag_bytes: 0, compacted_bytes: BTreeMap::new() };
        TrieBenchReport::assemble(10, 1, reports, bags, KeccakCost { address_ns: 1.0, branch_node_ns: 1.0 })
    }

    #[test]
    fn a_report_needs_every_root_equal() {
        let same = assemble(vec![report("virga", "0xbd5c"), report("trie_db", "0xbd5c")]).unwrap();
        assert_eq!(same.roots.len(), 2);
        let error =
            assemble(vec![report("virga", "0xbd5c"), report("eth_trie", "0xbd5c"), report("trie_db", "0x6ca1")])
                .unwrap_err()
                .to_string();
        assert!(error.contains("roots differ") && error.contains("trie_db 0x6ca1"), "{error}");
    }

    #[test]
    fn no_accounts_is_an_error_not_a_panic() {
        let error = run_single("virga", &TrieBenchConfig::new(0), false, &|| {}).unwrap_err();
        assert!(error.to_string().contains("at least one account"), "{error}");
    }
}
