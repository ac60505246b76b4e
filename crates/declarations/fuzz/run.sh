#!/usr/bin/env bash
# Runs the declarations fuzz target for a bounded time (default 20 s): ./run.sh [seconds]
# Needs cargo-fuzz (installed here with `cargo install --locked cargo-fuzz` when missing, ~1 min)
# and nightly features, which RUSTC_BOOTSTRAP=1 unlocks on the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
mkdir -p corpus/render_schema
# Seed the corpus with real schemas so the fuzzer starts from realistic shapes.
for f in ../fixtures/*.json; do cp "$f" "corpus/render_schema/$(basename "$f")"; done
RUSTC_BOOTSTRAP=1 cargo fuzz run render_schema corpus/render_schema -- -max_total_time="$seconds" -max_len=65536
