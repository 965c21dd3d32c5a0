#!/usr/bin/env bash
# The nightly job: every scenario in scenarios/nightly/ — growth curves on the small and bench presets (per-turn
# wall time warm vs cold as a conversation grows to thousands of tokens), semantic staleness on every engine, and
# stress scenarios of 3000 pairs per engine (0 failures bounds the failure rate below 0.1%) — then the run's
# headline numbers appended to reports/history/history.csv and the trend plots redrawn; then the PR gate's full
# fault sweep (`kvproof mutants scenarios/pr --full`: every fault on every scenario it applies to), which fails
# when the recorded kill map scenarios/pr/kills.json is stale and prints the map it learned (also written to the
# sweep's folder as kills.json, to commit).
#
# Environment: KVPROOF_REPORTS (default reports) holds the run folder reports/nightly-<time>/ and the history
# folder reports/history/; KVPROOF_NIGHTLY (default scenarios/nightly) picks the scenarios (a file or folder, or
# several separated by spaces); KVPROOF_LABEL labels the history rows (default: the commit); KVPROOF_JOBS sets
# `--jobs` (units side by side; default one per core); KVPROOF_SWEEP=0 skips the full fault sweep (ci/nightly-smoke.sh,
# which checks this script end to end in minutes). The run's summary is appended to $GITHUB_STEP_SUMMARY when it is
# set.
#
# Sharded (ci/workflows/nightly.yml runs it so): KVPROOF_SHARD=K/N runs only shard K of N into
# reports/nightly-shard-K-of-N/ and stops there (no history: a shard is a part of the run); KVPROOF_MERGE="DIR..."
# (separated by spaces or newlines, as `ls -d` prints them) then combines the N shard folders with `kvproof merge`
# into reports/nightly-<time>/ instead of running anything, and records that folder in the history as an unsharded
# run would be. With neither set the whole set runs here.
#
# Exit status: that of `kvproof run` (0 pass, 1 a check or assertion failed, 2 input error); a failure to record
# the history, a surviving fault or a stale kill map is reported and turns a passing run into exit 1. The whole
# set takes on the order of an hour on a 2-core machine (most of it in the stress scenarios); the growth curves alone take about ten minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=ci/prepare-run.sh
source ci/prepare-run.sh
run_dir="$reports/nightly-$stamp"
history_dir="$reports/history"
# words split on any whitespace, newlines included (`$(ls -d ...)` gives one folder a line)
read -r -d '' -a scenarios <<<"${KVPROOF_NIGHTLY:-scenarios/nightly}" || true
label=${KVPROOF_LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

jobs=()
[ -z "${KVPROOF_JOBS:-}" ] || jobs=(--jobs "$KVPROOF_JOBS")

start=$SECONDS
status=0
if [ -n "${KVPROOF_SHARD:-}" ]; then
  shard_dir="$reports/nightly-shard-${KVPROOF_SHARD/\//-of-}"
  "$kvproof" run "${scenarios[@]}" --shard "$KVPROOF_SHARD" "${jobs[@]}" --out "$shard_dir" || status=$?
  # A shard's own verdict is partial (a 1/N share of a stress scenario's pairs cannot bound its failure rate below
  # the limit): the merge gives the night's verdict, so only an input error (exit 2) fails a shard.
  [ "$status" -ne 1 ] || status=0
  echo "nightly: shard $KVPROOF_SHARD took $((SECONDS - start))s; folder $shard_dir (merge it with the others)"
  exit "$status"
elif [ -n "${KVPROOF_MERGE:-}" ]; then
  read -r -d '' -a shard_dirs <<<"$KVPROOF_MERGE" || true
  "$kvproof" merge "${shard_dirs[@]}" --out "$run_dir" || status=$?
else
  "$kvproof" run "${scenarios[@]}" "${jobs[@]}" --out "$run_dir" || status=$?
fi
elapsed=$((SECONDS - start))

# A run that could not start (exit 2 before anything ran) has no results to record.
if [ -f "$run_dir/results.jsonl" ] && [ -f "$run_dir/run.json" ]; then
  if ! "$kvproof" history "$run_dir" --dir "$history_dir" --label "$label"; then
    echo "nightly: could not record $run_dir in $history_dir/history.csv" >&2
    [ "$status" -ne 0 ] || status=1
  fi
fi

# A picture of the report for the artifact, when a Chromium is installed (the PR gate's tests check rendering).
if [ -f "$run_dir/index.html" ] && { [ -n "${CHROME:-}" ] || command -v chromium >/dev/null 2>&1; }; then
  HEIGHT=4000 bash ci/screenshot-index.sh "$run_dir" "$run_dir/index.png" ||
    echo "nightly: the screenshot of $run_dir/index.html failed (the run's verdict stands)" >&2
fi

if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$run_dir/summary.md" ]; then
  cat "$run_dir/summary.md" >>"$GITHUB_STEP_SUMMARY"
fi

# The full fault sweep (in the merge job when sharded), and whether the PR gate's kill map still says what it learns.
if [ "${KVPROOF_SWEEP:-1}" = 0 ]; then
  echo "nightly: the full fault sweep skipped (KVPROOF_SWEEP=0)"
else
  sweep_dir="$reports/mutants-full-$stamp"
  sweep_start=$SECONDS
  if ! "$kvproof" mutants scenarios/pr --full --check-kills --kills scenarios/pr/kills.json \
    --write-kills "$sweep_dir.kills.json" --out "$sweep_dir"; then
    echo "nightly: the full fault sweep failed (a survivor or a stale kill map: see above and $sweep_dir/mutants.md)" >&2
    [ "$status" -ne 0 ] || status=1
  fi
  [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$sweep_dir/mutants.md" ] && cat "$sweep_dir/mutants.md" >>"$GITHUB_STEP_SUMMARY"
  echo "nightly: the full fault sweep took $((SECONDS - sweep_start))s; the map it learned: $sweep_dir.kills.json"
fi
echo "nightly: ${KVPROOF_MERGE:+merge }took ${elapsed}s; report in $run_dir (open $run_dir/index.html), trend in $history_dir/index.html"
exit "$status"
