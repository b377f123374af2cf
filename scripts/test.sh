#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests, then the interop tests against the real
# llama.cpp (llama-cpp-python 0.3.36 built with RPC, cached outside the checkout).
# Installs what it needs itself (pip, cargo); safe to run on a fresh machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

echo "== model and reference peer"
LLAMAD_MODEL=$(scripts/fetch-model.sh)
LLAMAD_PEER_PYTHON=$(tests/peer/build-peer.sh | tail -n 1)
export LLAMAD_MODEL LLAMAD_PEER_PYTHON
"$LLAMAD_PEER_PYTHON" -m pip install --quiet pytest >/dev/null

echo "== cargo build"
cargo build --workspace --release --bins

echo "== cargo test"
cargo test --workspace --release

if [ -d tests/interop ]; then
    echo "== interop tests (pytest)"
    LLAMAD_BIN="$root/target/release/llamad" "$LLAMAD_PEER_PYTHON" -m pytest -q tests/interop
fi
