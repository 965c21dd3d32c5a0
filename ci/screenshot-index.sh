#!/usr/bin/env bash
# Render a run folder's index.html in headless Chromium, straight from the file system (no server), and save a
# screenshot: the check that the page opens offline with every plot visible.
#
#   ci/screenshot-index.sh RUN_DIR [OUT.png]        (default OUT: RUN_DIR/index.png)
#
# Chromium comes from $CHROME, else the first of chromium, chromium-browser, google-chrome on PATH
# (`apt-get install -y chromium`). Networking features are switched off and a fresh profile is used, so nothing
# but the file itself is loaded. HEIGHT sets the window height (default 2000).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 RUN_DIR [OUT.png]" >&2
  exit 2
fi
run_dir=$1
page="$run_dir/index.html"
if [ ! -f "$page" ]; then
  echo "$page: no such file (run \`kvproof run\` or \`kvproof report $run_dir\` first)" >&2
  exit 2
fi
out=${2:-$run_dir/index.png}

chrome=${CHROME:-}
if [ -z "$chrome" ]; then
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then chrome=$c; break; fi
  done
fi
if [ -z "$chrome" ]; then
  echo "no Chromium found: set CHROME or install one (apt-get install -y chromium)" >&2
  exit 2
fi

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
abs_page="$(cd "$(dirname "$page")" && pwd)/$(basename "$page")"
mkdir -p "$(dirname "$out")"
abs_out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
rm -f "$abs_out"

"$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --screenshot="$abs_out" --window-size=1280,"${HEIGHT:-2000}" \
  "file://$abs_page" >"$profile/chrome.log" 2>&1 || {
  echo "Chromium failed; its output:" >&2
  cat "$profile/chrome.log" >&2
  exit 1
}
if [ ! -s "$abs_out" ]; then
  echo "Chromium wrote no screenshot; its output:" >&2
  cat "$profile/chrome.log" >&2
  exit 1
fi
echo "screenshot: $abs_out"
