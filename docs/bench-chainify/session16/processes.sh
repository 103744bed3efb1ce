#!/bin/bash
# ChainifyDB's pipeline as processes over gRPC on loopback, measured (docs/benchmarks.md,
# session 16): three orderer replicas (a process each), three organizations (two
# PostgreSQL, one SQLite; a process each for its chainify, exec and commit servers), and
# 24 SmallBank clients in one process; three rounds of 500 proposals a client.
# Usage: processes.sh [VIRGA] [OUT]   (VIRGA: a release build; OUT: where JSON goes)
set -u
V=${1:-target/release/virga}
OUT=${2:-/tmp/chainify-processes}
D=$OUT/deployment
rm -rf "$OUT"; mkdir -p "$OUT"
"$V" chainify node init --dir "$D" --customers 100000 --clients 24 --batch-size 32 \
  --checkpoint-every 1000000 --base-port 7400 > "$OUT/init.out" 2>&1 || exit 1
pids=()
for n in orderer-1 orderer-2 orderer-3; do
  "$V" chainify node run --dir "$D" --name $n > "$OUT/$n.out" 2>&1 & pids+=($!)
done
for o in org-1 org-2 org-3; do
  "$V" chainify node run --dir "$D" --name $o/chainify --name $o/exec --name $o/commit > "$OUT/$o.out" 2>&1 & pids+=($!)
done
names=""; for c in $(seq 1 24); do names="$names --name client-$c"; done
until [ "$(cat "$OUT"/*.out | grep -c 'serving at')" -ge 12 ]; do sleep 0.2; done
# The first client's answers wait for the genesis blocks (100,000 customers) to load.
until "$V" chainify node client --dir "$D" --name client-1 --transactions 20 > "$OUT/warm.out" 2>&1; do sleep 1; done
for round in 1 2 3; do
  "$V" chainify node client --dir "$D" $names --transactions 500 --window 8 \
    --json "$OUT/processes-24-clients-$round.json" 2>/dev/null | tail -1
done
kill -TERM "${pids[@]}"; wait
