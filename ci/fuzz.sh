#!/usr/bin/env bash
# Long fuzzing with libFuzzer: every target (or the ones named) for SECONDS each, new inputs kept in
# fuzz/work/<target>/ (seeds stay in fuzz/corpus/<target>/). Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Prints executions and crashes per target; crashing inputs land in
# fuzz/artifacts/<target>/. Usage: ci/fuzz.sh [SECONDS] [TARGET...]   (default 600 s, all targets)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
cd fuzz
cargo +nightly fuzz build -O
status=0
for t in "${targets[@]}"; do
  mkdir -p "work/$t"
  log="work/$t.log"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes a target allocate what a header claims is a crash
  if cargo +nightly fuzz run -O "$t" "work/$t" "corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  crashes=$(find "artifacts/$t" -type f 2>/dev/null | wc -l)
  echo "$t: ${runs:-?} executions in ${seconds} s, $result, $crashes crashing input(s) in fuzz/artifacts/$t (log fuzz/$log)"
done
exit $status
