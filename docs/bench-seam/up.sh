#!/bin/bash
# `virga up` in-process: 50,000 accounts, 150,000 transfers, 4 clients. Prints tps and CPU µs per transfer.
# usage: up.sh VIRGA_BINARY LABEL
set -u
V=$1 L=$2
D=$(mktemp -d)
"$V" up --dir "$D/data" --accounts 50000 --transfers 150000 --clients 4 --json "$D/up.json" > "$D/up.log" 2>&1 || exit 1
python3 -c "import json,sys; d=json.load(open(sys.argv[2])); print(sys.argv[1], round(d['tps']), round(d['cpu_us_per_tx'], 1))" \
  "$L" "$D/up.json"
rm -rf "$D"
