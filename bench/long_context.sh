#!/usr/bin/env bash
# Long contexts over 2 workers: a ~4k-token prompt and generation at 8k and 32k context, llamactl
# (layer and row split) against llama.cpp's master over its own RPC servers, with the KV cache and
# peak RSS per worker (issue 27; see the header of bench/long_context.py). Not part of the test
# suite; options go to bench/long_context.py, e.g.
#   bench/long_context.sh --quick     # 8k only, ~1k-token prompt
#   bench/long_context.sh --ctx 8192,16384,32768
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

model=${LLAMAD_MODEL:-$(scripts/fetch-model.sh)}
py=${LLAMAD_PEER_PYTHON_NATIVE:-$(LLAMAD_PEER_ISA=native tests/peer/build-peer.sh | tail -n1)}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet -p llamad -p llamactl --bins
bin="$CARGO_TARGET_DIR/release"

exec "$py" bench/long_context.py --llamactl "$bin/llamactl" --llamad "$bin/llamad" --model "$model" "$@"
