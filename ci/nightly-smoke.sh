#!/usr/bin/env bash
# ci/nightly.sh end to end, the three ways CI runs it, on two tiny scenarios (a growth curve and a stress scenario
# whose failure-rate bound is required) so it takes about a minute after the release build:
#   1. whole: exit 0, a PASS report, a history row per scenario under the label, the trend page, the step summary;
#   2. as 2 shards plus a merge (ci/workflows/nightly.yml): each shard exits 0 into its own folder and records no
#      history; the merge's report holds every trial of the whole run with the same verdicts and is recorded;
#   3. with a planted fault in the stress scenario: exit 1, the failure named, the run still recorded.
# The full fault sweep at the end of the nightly is skipped here (KVPROOF_SWEEP=0): the PR gate runs `kvproof
# mutants` on the same scenarios, and the nightly runs the full sweep itself.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "nightly-smoke: $*" >&2
  exit 1
}

mkdir -p "$tmp/scenarios" "$tmp/faulty"
cat >"$tmp/scenarios/growth.json" <<'EOF'
{
  "name": "smoke-growth",
  "engine": { "arch": "inkling", "preset": "tiny", "seed": 0 },
  "kind": "growth-curve",
  "seed": 3,
  "params": { "turns": 5, "opening": 24, "user_len": 30, "max_tokens": 8, "repeats": 2, "cold_repeats": 2 },
  "assert": { "min_reuse_fraction": 0.7 }
}
EOF
stress='{
  "name": "smoke-stress",
  "engine": { "arch": "deepseek", "preset": "tiny", "seed": 0 },
  "kind": "stress-pairs",
  "seed": 7,
  "params": { "pairs": 40, "turns": [2, 4], "user_len": [1, 12], "max_tokens": 4 },
  "assert": { "max_failure_rate": 0.2, "require": ["rate", "tokens"] }
}'
echo "$stress" >"$tmp/scenarios/stress.json"
cp "$tmp/scenarios/growth.json" "$tmp/faulty/"
sed 's/"seed": 0 }/"seed": 0, "fault": "bulk-record" }/' "$tmp/scenarios/stress.json" >"$tmp/faulty/stress.json"
grep -q bulk-record "$tmp/faulty/stress.json" || fail "the faulty scenario has no fault"

export KVPROOF_SWEEP=0 KVPROOF_LABEL=smoke KVPROOF_NIGHTLY="$tmp/scenarios"

# The one run folder nightly.sh made under $1 (nightly-<time>).
run_folder() {
  local found=("$1"/nightly-2*)
  [ "${#found[@]}" -eq 1 ] && [ -d "${found[0]}" ] || fail "expected one nightly-<time> folder in $1, found: ${found[*]}"
  echo "${found[0]}"
}

# Trials of a results.jsonl as sorted (scenario, plan, step, verdict) lines: what must not depend on sharding.
verdicts() {
  python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in sorted(rows, key=lambda r: (r["scenario"], r["plan_index"], r["step_index"])):
    print(r["scenario"], r["plan_index"], r["step_index"], r["verdict"])
' "$1"
}

# 1. whole
KVPROOF_REPORTS="$tmp/whole" GITHUB_STEP_SUMMARY="$tmp/whole-step.md" bash ci/nightly.sh >"$tmp/whole.log" 2>&1 ||
  fail "the whole run exited $? (expected 0): $(tail -20 "$tmp/whole.log")"
whole=$(run_folder "$tmp/whole")
head -1 "$whole/summary.md" | grep -q ': PASS$' || fail "$whole/summary.md does not say PASS"
for f in results.jsonl index.html junit.xml growth.csv; do
  [ -s "$whole/$f" ] || fail "the whole run wrote no $f"
done
for s in smoke-growth smoke-stress; do
  grep -q ",smoke,$s,pass,1.0$" "$tmp/whole/history/history.csv" || fail "history.csv has no passing $s row under the label"
done
[ -s "$tmp/whole/history/index.html" ] || fail "the trend page was not drawn"
grep -q '# kvproof run' "$tmp/whole-step.md" || fail "the run's summary was not appended to GITHUB_STEP_SUMMARY"
grep -q 'full fault sweep skipped' "$tmp/whole.log" || fail "KVPROOF_SWEEP=0 did not say it skipped the sweep"

# 2. two shards and a merge
for k in 1 2; do
  KVPROOF_REPORTS="$tmp/sharded" KVPROOF_SHARD="$k/2" bash ci/nightly.sh >"$tmp/shard-$k.log" 2>&1 ||
    fail "shard $k/2 exited $? (expected 0): $(tail -20 "$tmp/shard-$k.log")"
  [ -s "$tmp/sharded/nightly-shard-$k-of-2/results.jsonl" ] || fail "shard $k/2 wrote no results"
done
[ ! -e "$tmp/sharded/history" ] || fail "a shard recorded history (only the merge should)"
# the folders one a line, as `ls -d` prints them (the workflow passes them separated by spaces)
KVPROOF_REPORTS="$tmp/sharded" KVPROOF_MERGE="$(ls -d "$tmp"/sharded/nightly-shard-*)" \
  bash ci/nightly.sh >"$tmp/merge.log" 2>&1 || fail "the merge exited $? (expected 0): $(tail -20 "$tmp/merge.log")"
merged=$(run_folder "$tmp/sharded")
head -1 "$merged/summary.md" | grep -q ': PASS$' || fail "the merged summary does not say PASS"
diff <(verdicts "$whole/results.jsonl") <(verdicts "$merged/results.jsonl") >"$tmp/verdicts.diff" ||
  fail "the merged run's trials differ from the whole run's: $(head -20 "$tmp/verdicts.diff")"
grep -q ",smoke,smoke-stress,pass,1.0$" "$tmp/sharded/history/history.csv" || fail "the merge was not recorded"

# 3. a planted fault fails the night and is still recorded
status=0
KVPROOF_REPORTS="$tmp/faulty-run" KVPROOF_NIGHTLY="$tmp/faulty" bash ci/nightly.sh >"$tmp/faulty.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "a night with bulk-record exited $status (expected 1): $(tail -20 "$tmp/faulty.log")"
grep -q 'failure rate bound 100.0% > limit 20.0%' "$tmp/faulty.log" || fail "the faulty night does not name its failed bound"
grep -q ",smoke,smoke-stress,pass,0.0$" "$tmp/faulty-run/history/history.csv" || fail "the failing night was not recorded"

echo "nightly-smoke: ci/nightly.sh whole, 2 shards + merge, and a planted fault: as expected"
