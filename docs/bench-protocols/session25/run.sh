#!/usr/bin/env bash
# Interleaved runs of issue 41's base and its end: $1 = round number; odd rounds run
# before then after, even rounds after then before. Binaries (`cargo build --release --bin
# virga --features virga/peers`): /tmp/perf3/before at bfd0c2d, /tmp/perf3/after at the end.
set -u
r=$1
order="before after"
if [ $((r % 2)) -eq 0 ]; then order="after before"; fi
for which in $order; do
  bin=/tmp/perf3/$which
  out=/tmp/perf3
  d=$(mktemp -d)
  $bin up --accounts 50000 --transfers 150000 --clients 4 --dir $d/up --json $out/up-$which-$r.json > $out/up-$which-$r.log 2>&1
  rm -rf $d
  $bin bench dkv --duration 5 --runs 1 --clients 64 --json $out/dkv-inproc-$which-$r.json > $out/dkv-inproc-$which-$r.log 2>&1
  $bin bench dkv --duration 5 --runs 1 --clients 64 --transport grpc --json $out/dkv-grpc-$which-$r.json > $out/dkv-grpc-$which-$r.log 2>&1
  $bin bench kairos --modes none,lease --runs 1 --duration 3 --json $out/kairos-$which-$r.json > $out/kairos-$which-$r.log 2>&1
  $bin bench chainify --customers 100000 --clients 24 --skew uniform --runs 1 --duration 6 --warmup 2 --no-tamper --json $out/chainify-$which-$r.json > $out/chainify-$which-$r.log 2>&1
done
