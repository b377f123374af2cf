#!/usr/bin/env bash
# Load of a multi-GB synthesized model over RPC, llamactl + llamad against llama.cpp's master (over
# llamad and over its own rpc-server), cold and warm worker caches, with each worker's memory
# (issue 27; see the header of bench/load.py). Not part of the test suite; options go to
# bench/load.py, e.g.
#   bench/load.sh --quick            # the 8B shape cut to 4 layers (0.7 GiB): a few minutes
#   bench/load.sh                    # 8B shape cut to 16 layers, Q4_0 (2.1 GiB), 2 workers
#   bench/load.sh --shape 8b:24 --workers 3
# Needs several GB of disk next to the model (the workers' caches, removed afterwards).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

model=${LLAMAD_MODEL:-$(scripts/fetch-model.sh)}
py=${LLAMAD_PEER_PYTHON_NATIVE:-$(LLAMAD_PEER_ISA=native tests/peer/build-peer.sh | tail -n1)}

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet -p llamad -p llamactl --bins
bin="$CARGO_TARGET_DIR/release"

exec "$py" bench/load.py --llamactl "$bin/llamactl" --llamad "$bin/llamad" \
    --vocab-from "$model" --models-dir "$CARGO_TARGET_DIR/bench/models" "$@"
