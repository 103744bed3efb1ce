#!/usr/bin/env bash
# Interleaved before/after runs: $1 = round number. Binaries: /tmp/perf/before, /tmp/perf/after.
set -u
r=$1
for which in before after; do
  bin=/tmp/perf/$which
  d=$(mktemp -d)
  $bin up --accounts 50000 --transfers 150000 --clients 4 --dir $d/up --json /tmp/perf/up-$which-$r.json > /tmp/perf/up-$which-$r.log 2>&1
  rm -rf $d
  $bin bench dkv --duration 5 --runs 1 --clients 64 --json /tmp/perf/dkv-inproc-$which-$r.json > /tmp/perf/dkv-inproc-$which-$r.log 2>&1
  $bin bench dkv --duration 5 --runs 1 --clients 64 --transport grpc --json /tmp/perf/dkv-grpc-$which-$r.json > /tmp/perf/dkv-grpc-$which-$r.log 2>&1
  $bin bench kairos --modes none,lease --runs 1 --duration 3 --json /tmp/perf/kairos-$which-$r.json > /tmp/perf/kairos-$which-$r.log 2>&1
  $bin bench chainify --customers 100000 --clients 24 --skew uniform --runs 1 --duration 6 --warmup 2 --no-tamper --json /tmp/perf/chainify-$which-$r.json > /tmp/perf/chainify-$which-$r.log 2>&1
done
