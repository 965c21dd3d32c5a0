#!/usr/bin/env bash
# The PR gate, one command: `kvproof mutants scenarios/pr`. Its clean pass is the PR run — the PR scenarios must
# pass on the clean engines (with reuse firing, and the stress failure rate bounded at 1% with 95% confidence) —
# and every fault of every engine they use must then be caught. The clean scenarios run once; each fault then runs
# only the cheapest scenario that killed it in the last full sweep (scenarios/pr/kills.json, docs/mutants.md), or
# every scenario it applies to when the map cannot vouch for it. A fault the map's choice no longer catches fails
# the gate with the command that re-records the map; the nightly runs the full sweep and checks the map.
#
# Writes reports/mutants-<time>/ (the PR run's reports in its clean/ folder; override the parent folder with
# KVPROOF_REPORTS), appends the PR run's summary and the mutants table to $GITHUB_STEP_SUMMARY when it is set,
# and exits 0 only when the clean pass passes and every fault is caught.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=ci/prepare-run.sh
source ci/prepare-run.sh
mutants_dir="$reports/mutants-$stamp"

start=$SECONDS
status=0
"$kvproof" mutants scenarios/pr --out "$mutants_dir" || status=$?
elapsed=$((SECONDS - start))

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  for f in "$mutants_dir/clean/summary.md" "$mutants_dir/mutants.md"; do
    [ -f "$f" ] && cat "$f" >>"$GITHUB_STEP_SUMMARY"
  done
fi
echo "pr-gate: the PR run and every fault took ${elapsed}s; the PR run's reports in $mutants_dir/clean"
# where the time went: the clean pass and the fault passes, per engine (mutants.md's Time section)
[ -f "$mutants_dir/mutants.md" ] && sed -n '/^## Time/,/^$/{/^## Time/d;/^$/d;p}; /^| engine/,$p' "$mutants_dir/mutants.md"
exit "$status"
