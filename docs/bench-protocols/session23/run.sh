#!/usr/bin/env bash
set -u
r=$1
for which in old new; do
  bin=/tmp/perf2/$which
  d=$(mktemp -d)
  $bin up --accounts 50000 --transfers 150000 --clients 4 --dir $d/up --json /tmp/perf2/up-$which-$r.json > /tmp/perf2/up-$which-$r.log 2>&1
  rm -rf $d
  $bin bench dkv --duration 5 --runs 1 --clients 64 --json /tmp/perf2/dkv-inproc-$which-$r.json > /tmp/perf2/dkv-inproc-$which-$r.log 2>&1
  $bin bench dkv --duration 5 --runs 1 --clients 64 --transport grpc --json /tmp/perf2/dkv-grpc-$which-$r.json > /tmp/perf2/dkv-grpc-$which-$r.log 2>&1
  $bin bench kairos --modes none,lease --runs 1 --duration 3 --json /tmp/perf2/kairos-$which-$r.json > /tmp/perf2/kairos-$which-$r.log 2>&1
done
