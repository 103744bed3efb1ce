#!/bin/bash
# One `virga node` cluster over gRPC on loopback: 4 storage nodes, 1 miner, 2 clients of
# 30,000 transfers each on 100,000 accounts. Prints the clients' summed throughput.
# usage: node-cluster.sh VIRGA_BINARY LABEL BASE_PORT
set -u
V=$1 L=$2 P=$3
D=$(mktemp -d)/cluster
"$V" node init --dir "$D" --accounts 100000 --storage-nodes 4 --base-port "$P" > /dev/null || exit 1
servers=()
for i in 0 1 2 3; do "$V" node --role storage --dir "$D" --id storage-$i > "$D.storage-$i.log" 2>&1 & servers+=($!); done
"$V" node --role miner --dir "$D" --id miner-0 > "$D.miner.log" 2>&1 & servers+=($!)
sleep 1
for i in 0 1; do
  "$V" node --role client --dir "$D" --id client-$i --clients 2 --index $i --transfers 60000 --json "$D.c$i.json" \
    > "$D.client-$i.log" 2>&1 &
  clients[$i]=$!
done
wait "${clients[0]}"; wait "${clients[1]}"
kill "${servers[@]}" 2>/dev/null; wait 2>/dev/null
python3 -c "import json,sys; print(sys.argv[1], round(sum(json.load(open(f))['tps'] for f in sys.argv[2:])))" \
  "$L" "$D.c0.json" "$D.c1.json"
rm -rf "$(dirname "$D")"
