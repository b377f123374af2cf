#!/usr/bin/env bash
# Bounded fuzz run: every cargo-fuzz target in fuzz/ for SECONDS_PER_TARGET (default 180), seeded
# from the captured master session and SmolLM2's GGUF header. Not part of scripts/test.sh.
#
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# needs: the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Crash inputs are written to fuzz/artifacts/<target>/; logs to fuzz/logs/<target>.log. Exit status
# 1 when any target crashed. Reproduce one with `cargo +nightly fuzz run TARGET ARTIFACT`.
# CARGO_TARGET_DIR defaults to fuzz/target.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
SECS="${1:-180}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(frame command session gguf cache_index admin_body)
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs the nightly toolchain and cargo-fuzz (cargo install cargo-fuzz)" >&2
    exit 2
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/fuzz/target}"

# Largest generated input per target (seeds above it are cut): big enough for captured graphs'
# prefixes, small enough to keep executions fast.
max_len() {
    case "$1" in
        gguf) echo 16384 ;; # more coverage per second than whole headers (1 241 vs 859 edges in 150 s)
        frame | session | command) echo 262144 ;;
        *) echo 65536 ;;
    esac
}

python3 fuzz/make_seeds.py fuzz/corpus
cargo +nightly fuzz build --target-dir "$CARGO_TARGET_DIR" 2>&1 | tail -n 3
bin="$CARGO_TARGET_DIR/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}"
mkdir -p fuzz/logs fuzz/artifacts
status=0
printf '%-12s %12s %10s %8s %s\n' target executions exec/s crashes artifacts >fuzz/logs/summary.txt
for t in "${TARGETS[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    echo "== $t: ${SECS}s"
    set +e
    # The binaries built above run directly, so that editing sources meanwhile changes nothing.
    "$bin/$t" "fuzz/corpus/$t" -max_total_time="$SECS" -timeout=30 -rss_limit_mb=4096 \
        -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" \
        >"fuzz/logs/$t.log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "fuzz/logs/$t.log" | grep -o '[0-9]*$' | tail -n 1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "fuzz/logs/$t.log" | grep -o '[0-9]*$' | tail -n 1)
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        status=1
        grep -m 3 -E 'panicked|ERROR: (AddressSanitizer|libFuzzer)|SUMMARY' "fuzz/logs/$t.log" || true
    fi
    printf '%-12s %12s %10s %8s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes" "fuzz/artifacts/$t/" \
        | tee -a fuzz/logs/summary.txt
done
echo
cat fuzz/logs/summary.txt
exit "$status"
