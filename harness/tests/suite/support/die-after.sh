#!/usr/bin/env bash
# die-after.sh MODE N ENGINE-COMMAND...
#
# Runs ENGINE-COMMAND and forwards the harness's frames to it line by line. When the (N+1)th SUBMIT arrives:
#   MODE=die   kill the engine with SIGKILL (a crash, not a shutdown) and exit;
#   MODE=hang  stop forwarding and never answer (the harness's per-request timeout must fire).
# Tests use it to check that a dying or hanging engine becomes an error trial and the run goes on.
set -u
mode=$1
n=$2
shift 2
fifo=$(mktemp -u "${TMPDIR:-/tmp}/die-after.XXXXXX")
mkfifo "$fifo"
"$@" <"$fifo" &
pid=$!
exec 3>"$fifo"
rm -f "$fifo"
count=0
while IFS= read -r line; do
  case $line in
    SUBMIT\ *)
      count=$((count + 1))
      if [ "$count" -gt "$n" ]; then
        if [ "$mode" = hang ]; then
          echo "die-after: hanging at request $count" >&2
          exec 3>&-
          while :; do sleep 1; done
        fi
        echo "die-after: killing the engine at request $count" >&2
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        exit 137
      fi
      ;;
  esac
  printf '%s\n' "$line" >&3
done
exec 3>&-
wait "$pid"
