#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on the stable toolchain: the same
# SanitizerCoverage instrumentation cargo-fuzz uses (AddressSanitizer, which needs
# nightly, is left out; Rust's own bounds and overflow checks stay on).
#
#   fuzz/run.sh                 # each target for 60 seconds, random seed
#   fuzz/run.sh --ci            # fixed seed and run counts: the same inputs every time
#   fuzz/run.sh --build         # only build the targets
set -euo pipefail
cd "$(dirname "$0")"
target_dir="${FUZZ_TARGET_DIR:-target}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation off build scripts and proc macros.
cargo build --release --target "$triple" --target-dir "$target_dir"
if [[ "${1:-}" == "--build" ]]; then
    exit 0
fi

run() {
    local name=$1; shift
    local log="$target_dir/$name.log"
    mkdir -p "corpus/$name"
    echo "== fuzz $name $*"
    # Tracked seed inputs (fuzz/seeds/NAME), where a target has any, start the search.
    local seeds=()
    if [[ -d "seeds/$name" ]]; then seeds=("seeds/$name"); fi
    if ! "$target_dir/$triple/release/$name" "corpus/$name" "${seeds[@]}" -max_len=4096 "$@" >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz $name failed: the input is saved as crash-* in $(pwd)"
        exit 1
    fi
    grep -E "^Done" "$log"
}

if [[ "${1:-}" == "--ci" ]]; then
    run node_decoder -seed=1 -runs=2000000
    run proof_verifier -seed=1 -runs=50000
    run bag_application -seed=1 -runs=20000
    run wal_record -seed=1 -runs=1000000
    run log_segment -seed=1 -runs=100000
    run tx_decode -seed=1 -runs=1000000
    run block_decode -seed=1 -runs=500000
    run storage_checkpoint -seed=1 -runs=150000
    run peer_request -seed=1 -runs=500000
    run dkv_decode -seed=1 -runs=1000000
    run raft_wire -seed=1 -runs=10000
    run dkv_shard -seed=1 -runs=25000
    run kv_session -seed=1 -runs=50000
    run kairos_validator -seed=1 -runs=75000
    run wlc_ledger_block -seed=1 -runs=500000
    run wlc_signed_vote -seed=1 -runs=100000
    run wlc_messages -seed=1 -runs=100000
    run wlc_wire -seed=1 -runs=200000
    run eth_transaction -seed=1 -runs=1000000
    run state_test -seed=1 -runs=100000
else
    for name in node_decoder proof_verifier bag_application wal_record log_segment tx_decode block_decode \
        storage_checkpoint peer_request dkv_decode raft_wire dkv_shard kv_session kairos_validator wlc_ledger_block wlc_signed_vote wlc_messages wlc_wire \
        eth_transaction state_test; do
        run "$name" -max_total_time="${FUZZ_SECONDS:-60}"
    done
fi
echo "fuzz: 20 passed, 0 failed"
