#!/usr/bin/env bash
# Paired A/B of two agenthost release binaries on the figure `loadtest --sessions 200 --prompts 10
# --url` reports: server CPU a turn, built-in mock. Both servers stay up; single runs alternate
# between them (A then B, B then A, ...), so each pair is measured within seconds and the host's
# drift, larger than most changes, falls on both sides of it. The load generator is always the
# second binary's `loadtest`.
#
#   benches/ab_paired.sh A_BINARY B_BINARY [PAIRS]
set -euo pipefail
a="$(realpath "$1")"; b="$(realpath "$2")"; pairs="${3:-12}"
work="$(mktemp -d /tmp/agenthost-ab.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
printf '' > empty.toml
"$a" serve --config empty.toml --bind 127.0.0.1:47510 --data-dir data-a >/dev/null 2>&1 &
"$b" serve --config empty.toml --bind 127.0.0.1:47511 --data-dir data-b >/dev/null 2>&1 &
for port in 47510 47511; do
  for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
done
run() {
  "$b" loadtest --sessions 200 --prompts 10 --url "http://127.0.0.1:$1" --json 2>/dev/null \
    | python3 -c "import json,sys; c = json.load(sys.stdin).get('cpu_ms_per_turn'); print('nan' if c is None else round(c, 3))"
}
run 47510 >/dev/null; run 47511 >/dev/null   # warm-up
results=()
for pair in $(seq 1 "$pairs"); do
  if (( pair % 2 )); then x=$(run 47510); y=$(run 47511); else y=$(run 47511); x=$(run 47510); fi
  echo "pair $pair: A $x  B $y"
  results+=("$x $y")
done
printf '%s\n' "${results[@]}" | python3 -c '
import sys
rows = [tuple(map(float, line.split())) for line in sys.stdin if line.strip()]
rows = [r for r in rows if r[0] == r[0] and r[1] == r[1]]   # a run without a figure drops its pair
a = sum(r[0] for r in rows) / len(rows); b = sum(r[1] for r in rows) / len(rows)
lower = sum(1 for r in rows if r[1] < r[0]); higher = sum(1 for r in rows if r[1] > r[0])
print(f"mean ms a turn: A {a:.4f}  B {b:.4f}  ({100 * (b - a) / a:+.1f} %); B lower in {lower} pairs, higher in {higher}")
'
