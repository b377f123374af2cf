#!/usr/bin/env bash
# The llamad demo: build release binaries, fetch SmolLM2, start two llamad workers on loopback,
# and let `llamactl run` split the model's layers across them (then, for comparison, run it
# in-process). The generated text goes to stdout, load progress and timings to stderr.
#
# Environment: LLAMAD_MODEL (a GGUF instead of SmolLM2), DEMO_PORTS ("P1 P2", default
# "50152 50153"), DEMO_PROMPT, DEMO_N (tokens, default 64), DEMO_LOCAL=0 to skip the local run,
# CARGO_TARGET_DIR (where cargo builds).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
read -r p1 p2 <<<"${DEMO_PORTS:-50152 50153}"
prompt=${DEMO_PROMPT:-"Explain in two sentences why the sky is blue."}
n=${DEMO_N:-64}

echo "==> building release binaries (llamad, llamactl)" >&2
# --workspace --bins as scripts/test.sh and packaging/build.sh build them (one feature set, no rebuilds).
cargo build --release --workspace --bins >&2
bin=$target/release

echo "==> model" >&2
model=${LLAMAD_MODEL:-$(scripts/fetch-model.sh)}
echo "    $model" >&2

logs=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
    local port=$1 i
    for i in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "worker on port $port did not start; its log:" >&2
    cat "$logs/$port.log" >&2
    return 1
}

for port in "$p1" "$p2"; do
    echo "==> starting llamad on 127.0.0.1:$port" >&2
    "$bin/llamad" -H 127.0.0.1 -p "$port" -t 1 --admin-listen off >"$logs/$port.log" 2>&1 &
    pids+=($!)
done
wait_port "$p1"
wait_port "$p2"

echo "==> llamactl run across two workers" >&2
"$bin/llamactl" run --workers "127.0.0.1:$p1,127.0.0.1:$p2" -m "$model" --chat -p "$prompt" -n "$n" \
    --temp 0 -t 1

if [ "${DEMO_LOCAL:-1}" != 0 ]; then
    echo "==> the same run in-process, for comparison" >&2
    "$bin/llamactl" run -m "$model" --chat -p "$prompt" -n "$n" --temp 0 -t 1
fi
