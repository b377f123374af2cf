#!/usr/bin/env bash
# The 16-core scaling table of issue 27: llamactl against llama.cpp (libllama through
# bench/device/lcpp_bench.c, the same wheel the tests use), 1 to N threads, in one run, plus the
# memory bandwidth per thread count, generation as a fraction of it, and two llamad workers of N/2
# threads each (layer split and split mode row) against one N-thread process.
#
# Builds nothing: run bench/device/pack.sh first (here), then on the device machine, from the repo
# root: bench/device/scaling.sh [PACK_DIR]   (PACK_DIR default target/device-pack)
# Env: THREADS (default "1 2 4 8 16", capped at the cores), REPS (2), PP (256), TG (64),
#      SHAPE (1b), WTYPE (q4_0), OUT (where scaling.md / scaling.jsonl go; default $OUT or /tmp).
# Takes about 6-8 minutes on a 16-core machine with the defaults.
set -uo pipefail
cd "$(dirname "$0")/../.."
pack=${1:-target/device-pack}
out=${OUT:-/tmp}
mkdir -p "$out"
cores=$(nproc)
threads=${THREADS:-"1 2 4 8 16"}
reps=${REPS:-2}
pp=${PP:-256}
tg=${TG:-64}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
log="$out/scaling.jsonl"
: > "$log"
ctl="$pack/bin/llamactl"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
# The llama.cpp build this CPU runs, and the profile that reproduces it.
if has avx512f && has avx512bw && has avx512vl && has avx512_vnni && has avx512_bf16 && has avx512vbmi \
    && [ -x "$pack/lcpp-native/lcpp_bench" ]; then
    build=native numerics=avx512
else
    build=avx2 numerics=avx2
fi
lcpp="$pack/lcpp-$build/lcpp_bench"
echo "== machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/ {print $2}') GiB; llama.cpp build $build, llamactl --numerics $numerics"
lscpu | grep -E '^(Socket|NUMA node\(s\)|Thread|Core|L3)' || true

model="$work/model.gguf"
"$ctl" synth --shape "${SHAPE:-1b}" --type "${WTYPE:-q4_0}" --vocab-from "$pack/donor.gguf" -o "$model" \
    --seed 7 2>&1 | tail -1

echo "== memory bandwidth"
tlist=$(for t in $threads; do [ "$t" -le "$cores" ] && echo "$t"; done | paste -sd, -)
"$ctl" bench --mem-bandwidth 1024 -t "$tlist" -r 3 -o json > "$work/bw.json" && cat "$work/bw.json" |
    python3 -c 'import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]' >> "$log"

echo "== llamactl and llama.cpp, pp$pp and tg$tg, threads $tlist"
for t in ${tlist//,/ }; do
    "$ctl" bench -m "$model" -p "$pp" -n "$tg" -r "$reps" -t "$t" --numerics "$numerics" -o json 2>/dev/null |
        python3 -c 'import json,sys; [print(json.dumps(dict(r, side="llamactl"))) for r in json.load(sys.stdin)]' \
        | tee -a "$log" | cut -c1-160
    for args in "$pp 0" "0 $tg"; do
        "$lcpp" "$model" "$t" $args "$reps" | sed 's/^{/{"side":"llama.cpp",/' | tee -a "$log"
    done
done

half=$((cores / 2))
echo "== two llamad workers of $half threads against one process of $cores"
"$pack/bin/llamad" -p 50161 -t "$half" --admin-listen off --numerics "$numerics" > "$work/w1.log" 2>&1 &
"$pack/bin/llamad" -p 50162 -t "$half" --admin-listen off --numerics "$numerics" > "$work/w2.log" 2>&1 &
sleep 2
export H=$half
for mode in layer row; do
    "$ctl" bench -m "$model" -p "$pp" -n "$tg" -r "$reps" -t 1 --workers 127.0.0.1:50161,127.0.0.1:50162 \
        --split-mode "$mode" --numerics "$numerics" -o json 2>/dev/null |
        python3 -c 'import json,sys,os; [print(json.dumps(dict(r, side="llamactl-2x", worker_threads=int(os.environ["H"])))) for r in json.load(sys.stdin)]' \
        | tee -a "$log" | cut -c1-160
done
python3 bench/device/table.py "$log" | tee "$out/scaling.md"
