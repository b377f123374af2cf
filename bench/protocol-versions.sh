#!/usr/bin/env bash
# Generation speed of llamactl over two llamad workers announcing RPC protocol 8.0.0 against two
# announcing 7.0.0, in split mode layer and row (relayed through the master, where 8.0.0 replays
# each phase graph by uid), rotated A B B A so that the machine's drift falls on both sides.
#
# usage: bench/protocol-versions.sh [ROUNDS] [N_GEN]   (defaults 2 rounds, tg128; 1-thread workers)
# Builds the release binaries and fetches the model if needed. Prints one line per run and a summary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rounds=${1:-2}
n=${2:-128}
cargo build --release --bins -q
model=$(scripts/fetch-model.sh)
bin="${CARGO_TARGET_DIR:-$root/target}/release"
logs=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # protocol → address
    local p; p=$(port)
    "$bin/llamad" -H 127.0.0.1 -p "$p" -t 1 --protocol "$1" --admin-listen off >"$logs/$p.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null && break; sleep 0.05; done
    echo "127.0.0.1:$p"
}
v8="$(start 8),$(start 8)"
v7="$(start 7),$(start 7)"
run() { # version workers mode → t/s
    "$bin/llamactl" bench -m "$model" -p 0 -n "$n" -r 3 -t 1 --workers "$2" --split-mode "$3" \
        ${4:+$4} -o json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); r=r[0] if isinstance(r,list) else r; print("%.1f %.1f" % (r["avg_ts"], r["stddev_ts"]))'
}
declare -A sum cnt
for round in $(seq "$rounds"); do
    order="8 7 7 8"
    [ $((round % 2)) = 0 ] && order="7 8 8 7"
    for mode in layer row; do
        extra=""
        [ "$mode" = row ] && extra="--no-worker-links"
        [ "$round" = 1 ] && run 8 "$v8" "$mode" "$extra" >/dev/null
        for v in $order; do
            w=$v8; [ "$v" = 7 ] && w=$v7
            read -r ts sd < <(run "$v" "$w" "$mode" "$extra")
            echo "round $round  $mode  protocol $v.0.0  tg$n  $ts ± $sd t/s"
            sum[$mode$v]=$(python3 -c "print(${sum[$mode$v]:-0} + $ts)")
            cnt[$mode$v]=$(( ${cnt[$mode$v]:-0} + 1 ))
        done
    done
done
echo
for mode in layer row; do
    a=$(python3 -c "print(${sum[${mode}8]} / ${cnt[${mode}8]})")
    b=$(python3 -c "print(${sum[${mode}7]} / ${cnt[${mode}7]})")
    python3 -c "print(f'$mode: 8.0.0 {$a:.1f} t/s, 7.0.0 {$b:.1f} t/s, ratio 8/7 = {$a/$b:.3f}')"
done
