//! The Quick start's main job: build a realistic account state in the DSM-Tree, process
//! blocks of transfers with a state root per block, serve proofs and node bags, and
//! report throughput, memory and witness sizes.

use std::process::ExitCode;
use std::time::Instant;

use alloy_primitives::U256;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use virga_bench::trie::{node_bag_experiment, resident_bytes, Workload};
use virga_trie::{verify_proof, SecureTrie};

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Accounts in the state.
    #[arg(long, default_value_t = 1_000_000, value_parser = crate::limits::count(2))]
    accounts: usize,
    /// Blocks of transfers to process.
    #[arg(long, default_value_t = 50, value_parser = crate::limits::count(1))]
    blocks: usize,
    /// Transfers per block.
    #[arg(long, default_value_t = 1_000, value_parser = crate::limits::count(1))]
    transfers: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn bar(total: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>16} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

pub(crate) fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    println!(
        "Virga demo: DSM-Tree state of {} Ethereum accounts, {} blocks of {} transfers",
        args.accounts, args.blocks, args.transfers
    );
    let workload = Workload::generate(args.accounts, args.seed);
    let mut accounts = workload.accounts.clone();
    crate::release_free_memory();
    let resident_before = resident_bytes();

    let loading = bar(args.accounts as u64, "loading state");
    let start = Instant::now();
    let mut trie = SecureTrie::new();
    for (chunk_addresses, chunk_accounts) in workload.addresses.chunks(10_000).zip(accounts.chunks(10_000)) {
        for (address, account) in chunk_addresses.iter().zip(chunk_accounts) {
            trie.insert(address, &account.rlp());
        }
        loading.inc(chunk_addresses.len() as u64);
    }
    let load_seconds = start.elapsed().as_secs_f64();
    let genesis_root = trie.root_hash();
    let load_with_root_seconds = start.elapsed().as_secs_f64();
    loading.finish_and_clear();
    crate::release_free_memory();
    let memory_per_account = resident_bytes().saturating_sub(resident_before) as f64 / args.accounts as f64;

    let mut rng = StdRng::seed_from_u64(args.seed);
    let blocks = bar(args.blocks as u64, "blocks");
    let genesis = trie.snapshot();
    let start = Instant::now();
    let mut root = genesis_root;
    for _ in 0..args.blocks {
        for _ in 0..args.transfers {
            let from = rng.random_range(0..args.accounts);
            let to = rng.random_range(0..args.accounts);
            let amount = U256::from(rng.random_range(1..1_000_000u64));
            if from == to || accounts[from].balance < amount {
                continue;
            }
            accounts[from].balance -= amount;
            accounts[from].nonce += 1;
            accounts[to].balance += amount;
            trie.insert(&workload.addresses[from], &accounts[from].rlp());
            trie.insert(&workload.addresses[to], &accounts[to].rlp());
        }
        root = trie.root_hash();
        blocks.inc(1);
    }
    let block_seconds = start.elapsed().as_secs_f64();
    blocks.finish_and_clear();

    // Proofs at the newest root, each checked by the verifier; the genesis version stays readable.
    let proofs = 10_000.min(args.accounts);
    let start = Instant::now();
    let mut proof_bytes = 0;
    for _ in 0..proofs {
        let index = rng.random_range(0..args.accounts);
        let address = workload.addresses[index];
        let proof = trie.prove(&address);
        proof_bytes += proof.iter().map(Vec::len).sum::<usize>();
        let value = verify_proof(root, alloy_primitives::keccak256(address).as_slice(), &proof)?;
        anyhow::ensure!(
            value.as_deref() == trie.get(&address).as_deref(),
            "proof of account {index} disagrees with the trie"
        );
    }
    let proof_seconds = start.elapsed().as_secs_f64();
    anyhow::ensure!(genesis.root_hash() == genesis_root, "the genesis snapshot changed");

    let bags = node_bag_experiment(&trie, &workload, args.transfers, args.seed);
    let updates = (args.blocks * args.transfers * 2) as f64;
    println!();
    println!("state");
    println!("  accounts                 {:>14}", args.accounts);
    println!("  genesis root             {genesis_root}");
    println!("  root after {:>4} blocks   {root}", args.blocks);
    println!("throughput (one core)");
    println!("  load (no root)           {:>14.0} accounts/s", args.accounts as f64 / load_seconds);
    println!("  load + first root        {:>14.2} s", load_with_root_seconds);
    println!(
        "  blocks with root         {:>14.0} updates/s  ({:.1} ms per block)",
        updates / block_seconds,
        1000.0 * block_seconds / args.blocks.max(1) as f64
    );
    println!("  proofs (verified)        {:>14.0} proofs/s", proofs as f64 / proof_seconds);
    println!("memory");
    println!("  resident per account     {:>14.0} bytes", memory_per_account);
    println!("witnesses");
    println!("  mean proof size          {:>14.0} bytes", proof_bytes as f64 / proofs as f64);
    println!(
        "  {} transfers: full {} B, node bag {} B, compacted c=4 {} B, c=6 {} B",
        bags.transfers,
        bags.full_witness_bytes,
        bags.node_bag_bytes,
        bags.compacted_bytes.get(&4).copied().unwrap_or(0),
        bags.compacted_bytes.get(&6).copied().unwrap_or(0)
    );
    Ok(ExitCode::SUCCESS)
}
