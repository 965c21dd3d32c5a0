#!/usr/bin/env bash
# The PR gate: the PR scenarios must pass on the clean engines (with reuse firing, and the stress failure rate
# bounded at 1% with 95% confidence), and `kvproof mutants` must catch every fault of every engine they use.
#
# Writes reports/pr-<time>/ and reports/mutants-<time>/ (override the folder with KVPROOF_REPORTS), appends
# both summaries to $GITHUB_STEP_SUMMARY when it is set, and exits 0 only when both commands pass.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p kvproof --bin kvproof

reports=${KVPROOF_REPORTS:-reports}
stamp=$(date -u +%Y%m%d-%H%M%S)
run_dir="$reports/pr-$stamp"
mutants_dir="$reports/mutants-$stamp"
kvproof=./target/release/kvproof

start=$SECONDS
status=0
"$kvproof" run scenarios/pr --out "$run_dir" || status=$?
"$kvproof" mutants scenarios/pr --out "$mutants_dir" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
elapsed=$((SECONDS - start))

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  for f in "$run_dir/summary.md" "$mutants_dir/mutants.md"; do
    [ -f "$f" ] && cat "$f" >>"$GITHUB_STEP_SUMMARY"
  done
fi
echo "pr-gate: run + mutants took ${elapsed}s; reports in $run_dir and $mutants_dir"
exit "$status"
