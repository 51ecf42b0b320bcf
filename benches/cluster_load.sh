#!/usr/bin/env bash
# Turns per second through N `agenthost serve` nodes over one PostgreSQL, or one node on the
# embedded store: starts the nodes (built-in mock provider), waits until every node holds
# partitions, runs one `agenthost loadtest --url` per node at once (SESSIONS / N sessions each,
# PROMPTS prompts each), and prints the sum.
#
#   AGENTHOST_PG_URL=postgresql://… benches/cluster_load.sh 1|2|3|redb SESSIONS PROMPTS
#
# Needs `cargo build --release` first. Sessions are created through the node that drives them,
# so each lands on that node: this measures the nodes' own work, not forwarding.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/agenthost
nodes=$1 sessions=$2 prompts=$3
work=$(mktemp -d)
pids=()
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap stop EXIT
if [[ $nodes == redb ]]; then
    count=1
    "$bin" serve --data-dir "$work/data" --bind 127.0.0.1:4800 >"$work/node0.log" 2>&1 &
    pids+=($!)
else
    : "${AGENTHOST_PG_URL:?set AGENTHOST_PG_URL (or run under .ci/with-postgres)}"
    count=$nodes
    printf '[store]\nkind = "postgres"\nschema = "load%s"\n' "$$" >"$work/pg.toml"
    for i in $(seq 0 $((count - 1))); do
        "$bin" serve --config "$work/pg.toml" --bind 127.0.0.1:$((4800 + i)) >"$work/node$i.log" 2>&1 &
        pids+=($!)
    done
fi
for _ in $(seq 1 200); do
    held=$(curl -sf localhost:4800/api/cluster |
        python3 -c 'import json,sys; print(sum(1 for n in json.load(sys.stdin)["data"]["nodes"] if n["partitions"]))' 2>/dev/null || echo 0)
    [[ $held == "$count" ]] && break
    sleep 0.2
done
start=$(date +%s.%N)
drivers=()
for i in $(seq 0 $((count - 1))); do
    "$bin" loadtest --url http://127.0.0.1:$((4800 + i)) --sessions $((sessions / count)) \
        --prompts "$prompts" >"$work/load$i.out" 2>&1 &
    drivers+=($!)
done
wait "${drivers[@]}" || true
end=$(date +%s.%N)
cat "$work"/load*.out | grep "turns ok"
python3 - "$start" "$end" "$work" "$count" <<'PY'
import re, sys
start, end, work, count = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ok = sum(int(re.search(r"(\d+) turns ok", open(f"{work}/load{i}.out").read()).group(1)) for i in range(count))
print(f"{count} node(s): {ok} turns in {end - start:.2f} s = {ok / (end - start):.0f} turns/s")
PY
