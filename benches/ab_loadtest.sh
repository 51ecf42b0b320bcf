#!/usr/bin/env bash
# A/B of two agenthost release binaries, interleaved, on this machine:
#   server with the built-in mock, 200 sessions x 25 prompts (server CPU per turn);
#   server with an OpenAI-wire provider (`mock-provider`, HTTP/1.1 keep-alive, pinned to core 1);
#   embedded runtime, 10 000 sessions x 5 prompts (turns/s, peak RSS).
# The load generator is always the second binary's `loadtest`.
#
#   benches/ab_loadtest.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
old="$(realpath "$1")"; new="$(realpath "$2")"; rounds="${3:-3}"
work="$(mktemp -d /tmp/agenthost-ab.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
printf '' > empty.toml
cat > wire.toml <<'T'
[providers.mock]
kind = "openai"
base_url = "http://127.0.0.1:47501/v1"
[models.default]
provider = "mock"
model = "mock-1"
T
taskset -c 1 "$new" mock-provider --bind 127.0.0.1:47501 >/dev/null 2>&1 &
sleep 0.5
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
for round in $(seq 1 "$rounds"); do
  for name in old new; do
    bin="${!name}"
    for cfg in empty wire; do
      rm -rf data
      "$bin" serve --config $cfg.toml --bind 127.0.0.1:47500 --data-dir data >/dev/null 2>&1 &
      server=$!
      for _ in $(seq 1 50); do curl -sf http://127.0.0.1:47500/healthz >/dev/null && break; sleep 0.1; done
      "$new" loadtest --sessions 200 --prompts 25 --url http://127.0.0.1:47500 --json 2>/dev/null \
        | json "'round $round $name $cfg: cpu ms/turn', d['cpu_ms_per_turn'], 'turns/s', round(d['turns_per_second'])"
      kill "$server"; wait "$server" 2>/dev/null || true
    done
    "$bin" loadtest --sessions 10000 --prompts 5 --json 2>/dev/null \
      | json "'round $round $name embedded: turns/s', round(d['turns_per_second']), 'peak MiB', d['peak_rss_kib'] // 1024"
  done
done
