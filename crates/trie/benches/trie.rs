//! Criterion micro-benchmarks of the DSM-Tree's hot operations on a deterministic
//! 100,000-account secure trie (the 1M-account comparison with peers is `virga bench trie`).
//!
//!     cargo bench -p virga-trie

use std::hint::black_box;

use alloy_primitives::{keccak256, U256};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use virga_trie::account::Account;
use virga_trie::SecureTrie;

const ACCOUNTS: u32 = 100_000;

fn address(i: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out.copy_from_slice(&keccak256(i.to_le_bytes())[..20]);
    out
}

fn account(i: u32) -> Vec<u8> {
    Account::with_balance(u64::from(i % 1000), U256::from(u64::from(i) * 1_000_000_007)).rlp()
}

fn state() -> SecureTrie {
    let mut trie = SecureTrie::new();
    trie.insert_many((0..ACCOUNTS).map(|i| (address(i), account(i))).collect());
    trie.root_hash();
    trie
}

fn benches(c: &mut Criterion) {
    let trie = state();
    let probes: Vec<[u8; 20]> = (0..1024).map(|i| address((i * 7919) % ACCOUNTS)).collect();

    let mut group = c.benchmark_group("trie_100k");
    group.throughput(Throughput::Elements(probes.len() as u64));
    group
        .bench_function("get", |b| b.iter(|| probes.iter().map(|a| trie.get(a).map_or(0, |v| v.len())).sum::<usize>()));
    group.bench_function("get_many", |b| b.iter(|| trie.get_many(black_box(&probes)).len()));
    group.bench_function("prove", |b| b.iter(|| probes.iter().map(|a| trie.prove(a).len()).sum::<usize>()));
    group.bench_function("update_then_root", |b| {
        b.iter_batched(
            || trie.snapshot(),
            |mut version| {
                for (n, a) in probes.iter().enumerate() {
                    version.insert(a, &account(n as u32 + ACCOUNTS));
                }
                version.root_hash()
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();

    let mut load = c.benchmark_group("load_100k");
    load.sample_size(10);
    load.throughput(Throughput::Elements(u64::from(ACCOUNTS)));
    let pairs: Vec<([u8; 20], Vec<u8>)> = (0..ACCOUNTS).map(|i| (address(i), account(i))).collect();
    load.bench_function("insert_many", |b| {
        b.iter_batched(|| pairs.clone(), |pairs| SecureTrie::new().insert_many(pairs), BatchSize::LargeInput)
    });
    load.finish();
}

criterion_group!(trie, benches);
criterion_main!(trie);
