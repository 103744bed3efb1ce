//! Criterion micro-benchmarks of what a miner pays per signed transfer before executing it:
//! decoding, and recovering the sender (libsecp256k1). Recovery is the largest single cost
//! of RainBlock's `virga up` (docs/benchmarks.md), so its per-core rate bounds the
//! cluster's throughput on a given machine.
//!
//!     cargo bench -p virga-ledger --bench transfers

use std::hint::black_box;

use alloy_primitives::U256;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use virga_ledger::tx::{recover_all, RecoveredTx, SignedTx, SigningKey};

const TRANSFERS: u64 = 256;

fn signed() -> Vec<SignedTx> {
    (0..TRANSFERS)
        .map(|i| {
            let key = SigningKey::from_seed(i);
            let to = SigningKey::from_seed(i + 1_000_000).address();
            SignedTx::sign(&key, i, to, U256::from(i + 1), 1, 21_000, Some(1))
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let transfers = signed();
    let encoded: Vec<Vec<u8>> = transfers.iter().map(SignedTx::encode).collect();

    let mut group = c.benchmark_group("transfers");
    group.throughput(Throughput::Elements(TRANSFERS));
    group.bench_function("decode", |b| {
        b.iter(|| encoded.iter().filter(|bytes| SignedTx::decode(black_box(bytes)).is_ok()).count())
    });
    group.bench_function("decode_and_recover", |b| {
        b.iter(|| {
            encoded
                .iter()
                .filter_map(|bytes| SignedTx::decode(black_box(bytes)).ok())
                .filter(|tx| RecoveredTx::recover(tx.clone()).is_ok())
                .count()
        })
    });
    group.bench_function("recover_all_parallel", |b| {
        b.iter(|| recover_all(black_box(&transfers)).iter().filter(|sender| sender.is_ok()).count())
    });
    group.finish();
}

criterion_group!(transfer_benches, benches);
criterion_main!(transfer_benches);
