//! `virga bench evm`: ERC-20 transfers executed by Virga's executor (revm over the DSM-Tree
//! with a per-block overlay) and by revm alone over its in-memory `CacheDB`, on the same
//! blocks over the same state, in interleaved runs.
//!
//! The state: `accounts` holders, each an account with ether and a token balance (one
//! storage slot each in the token's storage trie). Senders are the first `senders` holders,
//! whose keys are derived; 90% of transfers are sent by the hottest 10% of senders and 90%
//! go to the hottest 10% of holders (RainBlock's skew).

use std::time::Instant;

use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy_primitives::{keccak256, Address, TxKind, B256, U256};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use virga_evm::contracts::{token, TOKEN};
use virga_evm::parallel::ParallelTotals;
use virga_evm::reference::{execute_reference, genesis_reference, GenesisAccount, ReferenceDb};
use virga_evm::speculation::{pre_execute, Footprint};
use virga_evm::{BlockContext, CachedState, DecimalHashes, EthTransaction, Fork};
use virga_ledger::tx::SigningKey;
use virga_trie::account::StateTrie;

use crate::evm_runs::{run_side_by_side, Genesis};
use crate::median;
use crate::rainblock::Machine;

/// Where the token lives.
pub const TOKEN_ADDRESS: Address = Address::new([0x7a; 20]);
const CHAIN_ID: u64 = 1;
const BASE_FEE: u64 = 7;
const TRANSFER_GAS_LIMIT: u64 = 100_000;
/// A RainBlock client's batch and compaction level (`virga up`'s defaults).
const WITNESS_BATCH: usize = 250;
const WITNESS_COMPACTION: usize = 5;

#[derive(Clone, Debug, Serialize)]
pub struct EvmBenchConfig {
    /// Token holders (each also an account with ether).
    pub accounts: usize,
    /// Holders with keys, who send the transfers.
    pub senders: usize,
    pub transactions: usize,
    pub block_size: usize,
    /// Interleaved runs of each executor.
    pub runs: usize,
    pub seed: u64,
    /// The executors measured ([`EXECUTORS`]' names); empty: all of them.
    pub executors: Vec<String>,
}

impl Default for EvmBenchConfig {
    fn default() -> Self {
        Self {
            accounts: 1_000_000,
            senders: 10_000,
            transactions: 100_000,
            block_size: 1_000,
            runs: 3,
            seed: 7,
            executors: Vec::new(),
        }
    }
}

/// One timed run.
#[derive(Clone, Debug, Serialize)]
pub struct RunSample {
    pub executor: &'static str,
    pub run: usize,
    pub seconds: f64,
    pub tx_per_sec: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EvmBenchReport {
    pub machine: Machine,
    pub config: EvmBenchConfig,
    pub blocks: usize,
    /// Transactions every executor included (all of them, on this workload).
    pub included: usize,
    /// Execution alone: Virga's executor reading a flat copy of the state kept beside the
    /// DSM-Tree, in write-back: the trie's updates made once, when the root is asked for
    /// after the last block.
    pub virga_tx_per_sec: f64,
    /// The same with reads served by the DSM-Tree itself, through the executor's cache of
    /// what earlier blocks read (no flat copy).
    pub virga_trie_reads_tx_per_sec: f64,
    pub virga_trie_reads_over_revm: f64,
    /// Each block's writes put into the trie as it ends (no hashing): what a node that
    /// needs every block's root pays before hashing.
    pub virga_write_through_tx_per_sec: f64,
    pub revm_tx_per_sec: f64,
    /// `virga_tx_per_sec` over `revm_tx_per_sec` (medians).
    pub virga_over_revm: f64,
    pub virga_write_through_over_revm: f64,
    /// Execution alone with the parallel executor on every core (write-back, as
    /// `virga_tx_per_sec`).
    pub virga_parallel_tx_per_sec: f64,
    pub virga_parallel_over_revm: f64,
    /// `virga_parallel_tx_per_sec` over `virga_tx_per_sec`.
    pub parallel_speedup: f64,
    /// The parallel executor's stages per block: 1, or 2 where a transaction ran again.
    pub parallel_rounds_per_block: f64,
    /// Re-executions per transaction.
    pub parallel_reexecuted_share: f64,
    /// Blocks the parallel executor handed to the serial one, over all runs.
    pub parallel_serial_blocks: usize,
    /// What two cores give work that shares nothing: two threads each running revm alone
    /// over its own copy of the state at once, their rates summed, over one thread's
    /// (medians of `runs` tries). The ceiling any parallel executor meets on this machine.
    pub independent_two_thread_scaling: f64,
    pub roots_agree: bool,
    /// Virga's executor writing each block into the DSM-Tree and hashing the state root
    /// after it (write-through, roots per block).
    pub virga_root_per_block_tx_per_sec: f64,
    /// revm alone with `eth_trie` keeping the same state's tries, root after every block
    /// (only with the `peers` feature).
    pub revm_eth_trie_root_per_block_tx_per_sec: Option<f64>,
    /// Every block's root the same from both (only with the `peers` feature).
    pub block_roots_agree: Option<bool>,
    /// Witnesses of the first block's calls (each sender's first), from their speculative
    /// pre-execution (a guessed block one later than the genesis's child): what RainBlock's
    /// clients would fetch.
    pub witnesses: WitnessBytes,
    pub virga_root: B256,
    pub revm_root: B256,
    pub setup_seconds: f64,
    pub samples: Vec<RunSample>,
}

/// The state and the blocks every executor runs.
pub struct EvmWorkload {
    pub genesis: Vec<GenesisAccount>,
    pub blocks: Vec<(BlockContext, Vec<EthTransaction>)>,
}

/// The address of holder `index`: the key-derived one for senders, a hash for the rest.
fn holder(index: usize, keys: &[SigningKey]) -> Address {
    match keys.get(index) {
        Some(key) => key.address(),
        None => Address::from_slice(&keccak256(format!("virga/holder/{index}"))[12..]),
    }
}

/// Index in `0..n`, within the hottest `n / 10` with probability 0.9.
fn skewed(rng: &mut StdRng, n: usize) -> usize {
    let hot = (n / 10).max(1);
    if n <= hot || rng.random_bool(0.9) {
        rng.random_range(0..hot)
    } else {
        rng.random_range(hot..n)
    }
}

pub fn block_context(number: u64, transactions: usize) -> BlockContext {
    BlockContext {
        fork: Fork::Cancun,
        chain_id: CHAIN_ID,
        number,
        timestamp: 1_700_000_000 + 12 * number,
        coinbase: Address::new([0xcb; 20]),
        gas_limit: TRANSFER_GAS_LIMIT * transactions.max(1) as u64,
        base_fee: BASE_FEE,
        difficulty: U256::ZERO,
        prev_randao: B256::from(U256::from(number)),
        excess_blob_gas: 0,
    }
}

/// Builds the genesis and signs the blocks' transfers (on rayon's pool).
pub fn build_workload(config: &EvmBenchConfig, progress: &(dyn Fn(&str) + Sync)) -> EvmWorkload {
    let senders = config.senders.clamp(1, config.accounts.max(1));
    progress(&format!("deriving {senders} sender keys"));
    let keys: Vec<SigningKey> = (0..senders as u64).into_par_iter().map(SigningKey::from_seed).collect();
    progress(&format!("building {} holders", config.accounts));
    let holders: Vec<Address> = (0..config.accounts).into_par_iter().map(|index| holder(index, &keys)).collect();
    let holding = U256::from(10u64).pow(U256::from(24));
    let mut genesis: Vec<GenesisAccount> = holders
        .iter()
        .map(|address| GenesisAccount { address: *address, balance: holding, ..GenesisAccount::default() })
        .collect();
    let storage = holders.iter().map(|address| (token::balance_slot(*address), holding)).collect();
    genesis.push(GenesisAccount { address: TOKEN_ADDRESS, code: TOKEN.runtime_code(), storage, ..Default::default() });

    progress(&format!("signing {} ERC-20 transfers", config.transactions));
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut nonces = vec![0u64; senders];
    let plan: Vec<(usize, u64, Address, u64)> = (0..config.transactions)
        .map(|_| {
            let sender = skewed(&mut rng, senders);
            let nonce = nonces[sender];
            nonces[sender] += 1;
            (sender, nonce, holders[skewed(&mut rng, holders.len())], rng.random_range(1..1_000u64))
        })
        .collect();
    let txs: Vec<EthTransaction> = plan
        .into_par_iter()
        .map(|(sender, nonce, to, amount)| {
            let tx = TxEip1559 {
                chain_id: CHAIN_ID,
                nonce,
                gas_limit: TRANSFER_GAS_LIMIT,
                max_fee_per_gas: 100,
                max_priority_fee_per_gas: 1,
                to: TxKind::Call(TOKEN_ADDRESS),
                value: U256::ZERO,
                access_list: Default::default(),
                input: token::transfer(to, U256::from(amount)),
            };
            let signature = keys[sender].sign_hash(tx.signature_hash());
            let envelope = TxEnvelope::from(tx.into_signed(signature));
            EthTransaction::signed_by(envelope, keys[sender].address())
        })
        .collect();
    let block_size = config.block_size.max(1);
    let blocks = txs
        .chunks(block_size)
        .enumerate()
        .map(|(index, chunk)| (block_context(index as u64 + 1, chunk.len()), chunk.to_vec()))
        .collect();
    EvmWorkload { genesis, blocks }
}

/// Witness bytes per ERC-20 call: each call's own proofs (accounts, storage slots, code)
/// against the bag a client sends for a batch (proofs merged, each node once, the top
/// `compaction` levels left out, code once).
#[derive(Clone, Debug, Default, Serialize)]
pub struct WitnessBytes {
    pub calls: usize,
    pub batch: usize,
    pub compaction: usize,
    pub accounts_per_call: f64,
    pub slots_per_call: f64,
    pub full_per_call: f64,
    pub bagged_per_call: f64,
    /// Of `full_per_call`: the contract's code.
    pub code_per_call: f64,
}

/// Pre-executes the first block's calls against the genesis with a guessed context and
/// sizes their witnesses, full and bagged (batches of `batch`, compaction `compaction`).
pub fn witness_bytes(state: &StateTrie, workload: &EvmWorkload, batch: usize, compaction: usize) -> WitnessBytes {
    let Some((context, txs)) = workload.blocks.first() else { return WitnessBytes::default() };
    let mut guessed = context.clone();
    guessed.number += 1;
    guessed.timestamp += 12;
    // Each call is pre-executed alone on the genesis, so only a sender's first call is valid
    // there; the others (later nonces) are left out of the count.
    let footprints: Vec<Footprint> = txs
        .iter()
        .filter_map(|tx| pre_execute(state, &DecimalHashes, &guessed, tx).ok())
        .filter(|(_, executed)| executed.refused.is_empty())
        .map(|(footprint, _)| footprint)
        .collect();
    let proof_bytes = |proof: Vec<Vec<u8>>| proof.iter().map(Vec::len).sum::<usize>();
    let code_bytes = |footprint: &Footprint| -> usize {
        footprint.code.iter().map(|hash| state.code(hash).map_or(0, <[u8]>::len)).sum()
    };
    let (mut full, mut code, mut accounts, mut slots) = (0usize, 0usize, 0usize, 0usize);
    for footprint in &footprints {
        accounts += footprint.accounts.len();
        slots += footprint.slots.len();
        full += footprint
            .accounts
            .iter()
            .map(|address| proof_bytes(state.accounts().prove(address.as_slice())))
            .sum::<usize>();
        full += footprint
            .slots
            .iter()
            .filter_map(|(address, slot)| {
                state.storage_trie(address).map(|trie| proof_bytes(trie.prove(B256::from(*slot).as_slice())))
            })
            .sum::<usize>();
        code += code_bytes(footprint);
    }
    let mut bagged = 0usize;
    for chunk in footprints.chunks(batch.max(1)) {
        let mut bag = Footprint::default();
        chunk.iter().for_each(|footprint| bag.extend(footprint));
        let addresses: Vec<Address> = bag.accounts.iter().copied().collect();
        bagged += state.accounts().prove_many(&addresses, compaction).node_bytes();
        let mut by_contract: std::collections::BTreeMap<Address, Vec<B256>> = Default::default();
        for (address, slot) in &bag.slots {
            by_contract.entry(*address).or_default().push(B256::from(*slot));
        }
        for (address, slots) in by_contract {
            if let Some(trie) = state.storage_trie(&address) {
                bagged += trie.prove_many(&slots, compaction).node_bytes();
            }
        }
        bagged += code_bytes(&bag);
    }
    let calls = footprints.len().max(1) as f64;
    WitnessBytes {
        calls: footprints.len(),
        batch,
        compaction,
        accounts_per_call: accounts as f64 / calls,
        slots_per_call: slots as f64 / calls,
        full_per_call: (full + code) as f64 / calls,
        bagged_per_call: bagged as f64 / calls,
        code_per_call: code as f64 / calls,
    }
}

/// The executors each run measures, in the order of the first run.
#[cfg(feature = "peers")]
pub const EXECUTORS: [&str; 7] = [
    "virga",
    "virga-parallel",
    "virga-write-through",
    "revm",
    "virga-trie-reads",
    "virga-root-per-block",
    "revm-eth_trie",
];
#[cfg(not(feature = "peers"))]
pub const EXECUTORS: [&str; 6] =
    ["virga", "virga-parallel", "virga-write-through", "revm", "virga-trie-reads", "virga-root-per-block"];

fn run_revm(db: &mut ReferenceDb, workload: &EvmWorkload) -> (f64, usize) {
    let begun = Instant::now();
    let mut included = 0;
    for (context, txs) in &workload.blocks {
        included += execute_reference(db, context, txs).receipts.len();
    }
    (begun.elapsed().as_secs_f64(), included)
}

/// Two threads each running revm alone over its own copy of the genesis at once, their
/// rates summed, over one thread alone: the median of `tries` such pairs.
fn two_thread_scaling(
    genesis: &ReferenceDb,
    workload: &EvmWorkload,
    tries: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> f64 {
    let rate = |db: &mut ReferenceDb| {
        let (seconds, included) = run_revm(db, workload);
        included as f64 / seconds.max(1e-9)
    };
    let mut ratios = Vec::with_capacity(tries);
    for _ in 0..tries {
        let one = rate(&mut genesis.clone());
        let (mut first, mut second) = (genesis.clone(), genesis.clone());
        let (a, b) = std::thread::scope(|scope| {
            let a = scope.spawn(|| rate(&mut first));
            let b = scope.spawn(|| rate(&mut second));
            (a.join().unwrap_or(0.0), b.join().unwrap_or(0.0))
        });
        let ratio = if one > 0.0 { (a + b) / one } else { 0.0 };
        progress(&format!("two threads of revm alone, sharing nothing: {ratio:.2}x one thread"));
        ratios.push(ratio);
    }
    median(&mut ratios)
}

/// Builds the workload, then runs Virga (write-back and write-through) and revm alone
/// `runs` times each, interleaved (the order rotating per run), each run from the genesis.
pub fn run(config: &EvmBenchConfig, progress: &(dyn Fn(&str) + Sync)) -> EvmBenchReport {
    let begun = Instant::now();
    let workload = build_workload(config, progress);
    progress("loading the genesis into the DSM-Tree (with its flat copy) and into revm's CacheDB");
    let mut genesis_flat = CachedState::from_genesis(&workload.genesis);
    // The trie alone: cloning the whole `CachedState` would copy the flat maps too.
    let genesis_trie = genesis_flat.state().clone();
    let genesis_db = genesis_reference(&workload.genesis);
    let setup_seconds = begun.elapsed().as_secs_f64();
    let transactions: usize = workload.blocks.iter().map(|(_, txs)| txs.len()).sum();

    let genesis = Genesis { workload: &workload, flat: genesis_flat, trie: genesis_trie, db: genesis_db };
    let executors: Vec<&'static str> = EXECUTORS
        .into_iter()
        .filter(|name| config.executors.is_empty() || config.executors.iter().any(|chosen| chosen == name))
        .collect();
    let mut samples = Vec::new();
    let mut totals = ParallelTotals::default();
    // Virga's root, revm's, and whether all of Virga's modes agreed.
    let mut roots = (B256::ZERO, B256::ZERO, true);
    let mut included = 0;
    let mut block_roots: (Vec<B256>, Vec<B256>) = (Vec::new(), Vec::new());
    for run in 0..config.runs.max(1) {
        let outcome = run_side_by_side(&executors, &genesis, run, run == 0, &mut totals);
        for (index, &executor) in executors.iter().enumerate() {
            let seconds = outcome.seconds[index];
            included = outcome.included[index];
            let tx_per_sec = transactions as f64 / seconds.max(1e-9);
            progress(&format!("run {} {executor}: {tx_per_sec:.0} tx/s", run + 1));
            samples.push(RunSample { executor, run, seconds, tx_per_sec });
            let Some(final_roots) = &outcome.final_roots else { continue };
            let root = final_roots[index];
            match executor {
                "revm" => roots.1 = root,
                "revm-eth_trie" => block_roots.1 = outcome.block_roots[index].clone().unwrap_or_default(),
                _ => {
                    roots.2 &= roots.0 == B256::ZERO || roots.0 == root;
                    roots.0 = root;
                    if let Some(per_block) = &outcome.block_roots[index] {
                        block_roots.0 = per_block.clone();
                    }
                }
            }
        }
    }
    let independent_two_thread_scaling = two_thread_scaling(&genesis.db, &workload, config.runs.max(1), progress);
    let rate = |name: &str| {
        let mut rates: Vec<f64> =
            samples.iter().filter(|sample| sample.executor == name).map(|sample| sample.tx_per_sec).collect();
        median(&mut rates)
    };
    let (virga, write_through, revm) = (rate("virga"), rate("virga-write-through"), rate("revm"));
    let (parallel, trie_reads) = (rate("virga-parallel"), rate("virga-trie-reads"));
    let peer_measured = EXECUTORS.contains(&"revm-eth_trie");
    let ParallelTotals { blocks: blocks_run, rounds, reexecutions, serial_blocks } = totals;
    let over = |rate: f64| if revm > 0.0 { rate / revm } else { 0.0 };
    EvmBenchReport {
        machine: Machine::detect(),
        config: config.clone(),
        blocks: workload.blocks.len(),
        included,
        virga_tx_per_sec: virga,
        virga_trie_reads_tx_per_sec: trie_reads,
        virga_trie_reads_over_revm: over(trie_reads),
        virga_write_through_tx_per_sec: write_through,
        revm_tx_per_sec: revm,
        virga_over_revm: over(virga),
        virga_write_through_over_revm: over(write_through),
        virga_parallel_tx_per_sec: parallel,
        virga_parallel_over_revm: over(parallel),
        parallel_speedup: if virga > 0.0 { parallel / virga } else { 0.0 },
        parallel_rounds_per_block: rounds as f64 / blocks_run.max(1) as f64,
        parallel_reexecuted_share: reexecutions as f64 / (transactions * config.runs.max(1)) as f64,
        parallel_serial_blocks: serial_blocks,
        independent_two_thread_scaling,
        roots_agree: roots.0 == roots.1 && roots.2,
        virga_root_per_block_tx_per_sec: rate("virga-root-per-block"),
        revm_eth_trie_root_per_block_tx_per_sec: peer_measured.then(|| rate("revm-eth_trie")),
        block_roots_agree: peer_measured.then(|| block_roots.0 == block_roots.1 && !block_roots.0.is_empty()),
        witnesses: witness_bytes(&genesis.trie, &workload, WITNESS_BATCH, WITNESS_COMPACTION),
        virga_root: roots.0,
        revm_root: roots.1,
        setup_seconds,
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_agrees_with_revm_alone_and_includes_every_transfer() {
        let config = EvmBenchConfig {
            accounts: 500,
            senders: 50,
            transactions: 300,
            block_size: 100,
            runs: 1,
            seed: 3,
            ..Default::default()
        };
        let report = run(&config, &|_| {});
        assert!(report.roots_agree, "{} vs {}", report.virga_root, report.revm_root);
        assert_eq!((report.blocks, report.included), (3, 300));
        assert!(report.virga_parallel_tx_per_sec > 0.0 && report.parallel_serial_blocks == 0);
        assert!(report.virga_tx_per_sec > 0.0 && report.revm_tx_per_sec > 0.0);
        assert!(report.virga_root_per_block_tx_per_sec > 0.0 && report.virga_trie_reads_tx_per_sec > 0.0);
        assert!(report.independent_two_thread_scaling > 0.0, "{}", report.independent_two_thread_scaling);
        let witnesses = &report.witnesses;
        assert!(witnesses.calls > 10, "{witnesses:?}");
        assert!(witnesses.slots_per_call > 1.5, "two balances per transfer (one for a self-transfer): {witnesses:?}");
        assert!(witnesses.accounts_per_call >= 3.0, "sender, token and beneficiary: {witnesses:?}");
        assert!(witnesses.bagged_per_call < witnesses.full_per_call, "{witnesses:?}");
        if cfg!(feature = "peers") {
            assert_eq!(report.block_roots_agree, Some(true), "every block's root, Virga against eth_trie");
        }
    }

    #[test]
    fn only_the_chosen_executors_run() {
        let executors = vec!["virga".to_string(), "revm".to_string()];
        let config = EvmBenchConfig {
            accounts: 300,
            senders: 30,
            transactions: 100,
            block_size: 50,
            runs: 1,
            seed: 5,
            executors,
        };
        let report = run(&config, &|_| {});
        let ran: Vec<&str> = report.samples.iter().map(|sample| sample.executor).collect();
        assert_eq!(ran, ["virga", "revm"]);
        assert!(report.roots_agree && report.virga_tx_per_sec > 0.0);
        assert_eq!(report.virga_parallel_tx_per_sec, 0.0);
    }
}
