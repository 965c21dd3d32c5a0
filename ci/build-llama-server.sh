#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for the nightly's reference runs (kvproof's HTTP driver against a real
# serving engine). Everything comes from PyPI with pip: the llama-cpp-python sdist vendors llama.cpp with
# tools/server, and cmake and ninja come as wheels. Nothing is fetched at run time after this.
#
#   bash ci/build-llama-server.sh [CACHE_DIR]     # default ~/.cache/kvproof; prints the binary's path
#
# Takes several minutes on 2 cores; the result is reused when it exists.
set -euo pipefail
cache=${1:-${KVPROOF_CACHE:-$HOME/.cache/kvproof}}
version=0.3.36
out="$cache/llama.cpp-$version"
bin="$out/build/bin/llama-server"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
if [ ! -x "$cache/venv/bin/pip" ]; then
  python3 -m venv "$cache/venv"
fi
"$cache/venv/bin/pip" install --quiet --disable-pip-version-check scikit-build-core cmake ninja
sdist="$cache/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  # --no-build-isolation: the sdist's metadata is read with the scikit-build-core just installed, instead of pip
  # building every build dependency (cmake among them) from source
  "$cache/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python --no-build-isolation \
    "llama-cpp-python==$version" -d "$cache"
fi
src="$cache/src-$version"
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$sdist" -C "$src" --strip-components=1
"$cache/venv/bin/cmake" -S "$src/vendor/llama.cpp" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_MAKE_PROGRAM="$cache/venv/bin/ninja" >&2
"$cache/venv/bin/cmake" --build "$out/build" --target llama-server -j "$(nproc)" >&2
echo "$bin"
