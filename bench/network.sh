#!/usr/bin/env bash
# Distributed inference over emulated links (bench/network.py): llamactl's split modes over llamad
# workers and llama.cpp's layer split over its own RPC server, per link profile, workers in network
# namespaces joined by bench/netem. Needs root (namespaces, TUN devices); without it, says so and
# exits 0. Options go to bench/network.py, e.g.
#   bench/network.sh --quick                 # two profiles (1g, wifi), pp32/tg8: a few minutes
#   bench/network.sh --profiles 25g,1g -p 512 -n 64
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

model=${LLAMAD_MODEL:-$(scripts/fetch-model.sh)}
# The AVX2 build is the one the test suite always has; speed ratios over links are about the
# network, not the kernels.
py=${LLAMAD_PEER_PYTHON:-$(LLAMAD_PEER_ISA=avx2 tests/peer/build-peer.sh | tail -n1)}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --workspace --bins
bin="$CARGO_TARGET_DIR/release"

exec "$py" bench/network.py --llamactl "$bin/llamactl" --llamad "$bin/llamad" --netem "$bin/llamad-netem" \
    --model "$model" "$@"
