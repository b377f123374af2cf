#!/usr/bin/env bash
# Where a row-split (tensor-parallel) generation spends its time on each worker: starts two 1-thread
# llamad workers on this machine, runs `llamactl bench --split-mode row` over them, and prints, per
# rank, the percentiles of compute and exchange time per ubatch from llamad's debug line (one per
# EXT_TP_RUN). Not part of the test suite.
#   bench/row-split-profile.sh                # tg128, workers unpinned
#   bench/row-split-profile.sh 0 1            # each worker pinned to a CPU (taskset)
#   P=512 N=0 bench/row-split-profile.sh      # a 512-token prompt instead
# Environment: M (model, default: the demo model), P, N, R (llamactl bench's -p, -n, -r).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=${M:-$(scripts/fetch-model.sh)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --workspace --bins
bin="$CARGO_TARGET_DIR/release"
logs=$(mktemp -d)
pin() { if [ -n "${1:-}" ]; then echo "taskset -c $1"; fi; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
p1=$(port); p2=$(port)
RUST_LOG=llamad=debug $(pin "${1:-}") "$bin/llamad" -p "$p1" -t 1 --admin-listen off >"$logs/w1.log" 2>&1 &
w1=$!
RUST_LOG=llamad=debug $(pin "${2:-}") "$bin/llamad" -p "$p2" -t 1 --admin-listen off >"$logs/w2.log" 2>&1 &
w2=$!
trap 'kill $w1 $w2 2>/dev/null; rm -rf "$logs"' EXIT
sleep 1
"$bin/llamactl" bench -m "$model" -p "${P:-0}" -n "${N:-128}" -r "${R:-3}" -t 1 \
    --workers "127.0.0.1:$p1,127.0.0.1:$p2" --split-mode row
kill $w1 $w2
wait $w1 $w2 2>/dev/null || true
for rank in 1 2; do
    python3 - "$logs/w$rank.log" "$rank" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"tp_run rank=(\d+) tokens=(\d+) compute_us=(\d+) exchange_us=(\d+)", line)
    if m:
        rows.setdefault(int(m[2]), []).append((int(m[3]), int(m[4])))
for tokens, v in sorted(rows.items()):
    c = sorted(x for x, _ in v)
    e = sorted(y for _, y in v)
    n = len(v)
    pct = lambda s: f"{s[n // 10] / 1000:.2f}/{s[n // 2] / 1000:.2f}/{s[9 * n // 10] / 1000:.2f}"
    print(f"worker {sys.argv[2]}, {tokens}-token ubatches ({n}): compute ms p10/p50/p90 {pct(c)}, "
          f"exchange ms {pct(e)}")
PY
done
