#!/bin/bash
# Before/after, interleaved: ROUNDS rounds of each shape, the BEFORE binary first in each.
# usage: compare.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]
here=$(dirname "$0")
for round in $(seq 1 "${3:-5}"); do
  "$here/node-cluster.sh" "$1" "node before" 7600
  "$here/node-cluster.sh" "$2" "node after" 7620
  "$here/up.sh" "$1" "up before"
  "$here/up.sh" "$2" "up after"
done
