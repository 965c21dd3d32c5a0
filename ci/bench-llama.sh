#!/usr/bin/env bash
# Speed of the llama arch next to llama.cpp on the same GGUF, the same thread count, in the same run: prefill and
# decode tokens/s for prompts of 128, 512 and 2048 ids (32 decoded tokens each), and kvproof's share of
# llama.cpp's speed. llama.cpp is llama-server built from llama-cpp-python 0.3.36's vendored sources
# (`ci/build-llama-server.sh`), queried over HTTP for its own timings.
#
#   bash ci/bench-llama.sh [THREADS] [GGUF] [LLAMA_SERVER] [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
gguf=${2:-$(bash ci/fetch-smollm2.sh)}
server=${3:-${KVPROOF_CACHE:-$HOME/.cache/kvproof}/llama.cpp-0.3.36/build/bin/llama-server}
port=${4:-18093}
if [ ! -f "$gguf" ]; then
  echo "bench-llama: $gguf not found: fetch it with bash ci/fetch-smollm2.sh" >&2
  exit 2
fi
if [ ! -x "$server" ]; then
  echo "bench-llama: $server not found: build it with bash ci/build-llama-server.sh" >&2
  exit 2
fi

cargo build --release --quiet -p kvproof-engines --bin kvproof-engine
bin=${CARGO_TARGET_DIR:-target}/release/kvproof-engine
ours=$(RAYON_NUM_THREADS=$threads "$bin" --bench --gguf "$gguf")

"$server" -m "$gguf" -np 1 -c 4096 -t "$threads" --port "$port" >/tmp/bench-llama-server.$$.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
trap 'exit 143' INT TERM
python3 - "$port" "$ours" <<'PY'
import json, sys, time, urllib.request

port, ours = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
for _ in range(100):
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read()
        break
    except Exception:
        time.sleep(0.2)

def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)

rows = {}
for line in ours.splitlines():
    f = line.split()
    if f and f[0].isdigit():
        rows[int(f[0])] = (float(f[1]), float(f[3]))
vocab = 49152
print(f"{'prompt':>7} {'kvproof prefill':>16} {'llama.cpp prefill':>18} {'ratio':>6} "
      f"{'kvproof decode':>15} {'llama.cpp decode':>17} {'ratio':>6}   (tokens/s; ratio = llama.cpp / kvproof)")
def timed(ids):
    t = post("/completion", {"prompt": ids, "n_predict": 32, "temperature": 0, "cache_prompt": False,
                             "ignore_eos": True})["timings"]
    return t["prompt_per_second"], t["predicted_per_second"]

timed(list(range(100, 164)))  # warm-up
for n in (128, 512, 2048):
    ids = [(i * 7919 + 13) % (vocab - 100) + 100 for i in range(n)]
    # the better of two runs: the machine is shared
    runs = [timed(ids) for _ in range(2)]
    lp, ld = max(r[0] for r in runs), max(r[1] for r in runs)
    kp, kd = rows[n]
    print(f"{n:>7} {kp:>16.1f} {lp:>18.1f} {lp / kp:>6.2f} {kd:>15.1f} {ld:>17.1f} {ld / kd:>6.2f}")
PY
