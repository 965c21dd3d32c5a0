#!/usr/bin/env bash
# misbehave.sh MODE N ARG ENGINE-COMMAND...
#
# Runs ENGINE-COMMAND and forwards the harness's frames to it line by line (prompts must be token ids on one line:
# no audio). From the (N+1)th SUBMIT (or DUMP, for MODE=dump) on, it answers in the engine's place instead:
#   MODE=flood      DATA frames for the request, without end and without DONE;
#   MODE=over-max   max_tokens + 1 DATA frames, then DONE;
#   MODE=long-line  one line that never ends;
#   MODE=error      ERROR <id> INTERNAL ARG (ARG is the detail);
#   MODE=dump       DUMPED for a copy of the file ARG at the asked path (a dump whose contents lie).
# Tests use it to check that an engine breaking the protocol costs one trial, never the run.
set -u
mode=$1
n=$2
arg=$3
shift 3
fifo=$(mktemp -u "${TMPDIR:-/tmp}/misbehave.XXXXXX")
mkfifo "$fifo"
"$@" <"$fifo" &
pid=$!
exec 3>"$fifo"
rm -f "$fifo"
submits=0
dumps=0
while IFS= read -r line; do
  case $line in
    SUBMIT\ *)
      submits=$((submits + 1))
      if [ "$mode" != dump ] && [ "$submits" -gt "$n" ]; then
        IFS= read -r _payload
        set -- $line
        id=$2
        max=$5
        case $mode in
          flood) while :; do printf 'DATA %s 1 tid=65 gap=1\nA\n' "$id"; done ;;
          over-max)
            for _ in $(seq 0 "$max"); do printf 'DATA %s 1 tid=65 gap=1\nA\n' "$id"; done
            printf 'DONE %s STAT %s 1.0 0.0 0.0 1 1 0\n' "$id" $((max + 1))
            ;;
          long-line) while :; do printf 'DATADATADATADATADATADATADATADATA'; done ;;
          error) printf 'ERROR %s INTERNAL %s\n' "$id" "$arg" ;;
        esac
        continue
      fi
      ;;
    DUMP\ *)
      dumps=$((dumps + 1))
      if [ "$mode" = dump ] && [ "$dumps" -gt "$n" ]; then
        set -- $line
        id=$2
        path=${line#DUMP "$2" "$3" }
        cp "$arg" "$path"
        printf 'DUMPED %s %s %s\n' "$id" "$path" "$(wc -c <"$arg" | tr -d ' ')"
        continue
      fi
      ;;
  esac
  printf '%s\n' "$line" >&3
done
exec 3>&-
wait "$pid"
