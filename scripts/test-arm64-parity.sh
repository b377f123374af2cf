#!/usr/bin/env bash
# aarch64 parity with llama.cpp under qemu-user (issue 25, point 4): builds llamad for aarch64 and
# llama.cpp's ggml-rpc-server for each aarch64 profile (tests/peer/build-peer-aarch64.sh, cached
# outside the checkout), then runs the differential op tests (tests/tests/opdiff.rs, on the x86 host,
# over TCP) with both servers emulated, per kernel family, requiring bit-identical results where the
# case is marked exact:
#
#   qemu CPU      llamad --numerics  reference profile (GGML_CPU_ARM_ARCH)
#   neoverse-n1   neon-dotprod       neon-dotprod (armv8.2-a+dotprod)
#   max           neon-i8mm          neon-i8mm    (armv8.6-a+dotprod+i8mm)
#   max, SVE 256  sve                sve          (armv8.6-a+dotprod+fp16+sve+i8mm; the SVE build's
#                                                 orders llamad reproduces: F32/F16, SOFT_MAX/GLU,
#                                                 Q4_0/Q8_0/Q2_K one-row, Q4_K/Q6_K two-row, ROPE;
#                                                 the rest is the NEON build's code there)
#
#   scripts/test-arm64-parity.sh [--quick] [--profiles "neon-dotprod neon-i8mm sve"] [--gate "legacy ..."]
#                                [--cpu QEMU_CPU] [--families "kquants float"]
#
# llamad runs with `--numerics <profile>` and its best kernel set, so the profile alone decides the
# kernels (e.g. `--profiles neon-dotprod --cpu max`: the dotprod profile on an i8mm CPU).
# --cpu: the qemu CPU for every profile (default: the table's). --families: run only these families.
#
# --gate: only these families of the gating profiles decide the exit status (default: every family);
# the others are measured and reported. scripts/test.sh gates on the families already in ggml's order.
#
# --quick: one subset per kernel family (legacy and K-quant MUL_MAT, F32/F16 MUL_MAT, the grid IQ
# and TQ types' MUL_MAT, SOFT_MAX, RMS_NORM, ROPE, GLU). Exit status: non-zero when a gated family
# (--gate; default every family) of any profile has a failing case. Prints a summary table per
# profile and family at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quick=0
profiles="neon-dotprod neon-i8mm sve"
gate_families=""
cpu_override=""
only_families=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --profiles) profiles=$2; shift ;;
        --gate) gate_families=$2; shift ;;
        --cpu) cpu_override=$2; shift ;;
        --families) only_families=$2; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

# Toolchain (ref: /work/shared/notes/arm64-cross.md).
need_install=0
for bin in /usr/bin/rustc /usr/bin/aarch64-linux-gnu-gcc /usr/bin/aarch64-linux-gnu-g++ /usr/bin/qemu-aarch64-static; do
    [ -x "$bin" ] || need_install=1
done
dpkg -s libstd-rust-web-dev:arm64 >/dev/null 2>&1 || need_install=1
if [ "$need_install" = 1 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu g++-aarch64-linux-gnu \
        libc6-dev-arm64-cross qemu-user-static
fi

echo "== building llamad for aarch64" >&2
# No debug info in the cross build: the binary only runs under qemu here, and it links much faster.
(export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_PROFILE_RELEASE_DEBUG=false && unset CARGO_TARGET_DIR &&
    nice cargo build --release -p llamad --target aarch64-unknown-linux-gnu) || exit 1
export LLAMAD_AARCH64_BIN="$root/target/aarch64-unknown-linux-gnu/release/llamad"

for p in $profiles; do
    echo "== reference ggml-rpc-server for $p" >&2
    tests/peer/build-peer-aarch64.sh "$p" >/dev/null || exit 1
done

echo "== building the host op differential test" >&2
(unset RUSTC RUSTDOC && cargo test --release -p e2e --test opdiff --no-run) || exit 1

if [ "$quick" = 1 ]; then
    families=(
        "legacy:mul_mat/q4_0/|mul_mat/q4_1/|mul_mat/q5_0/|mul_mat/q5_1/|mul_mat/q8_0/|mul_mat/q1_0/|mul_mat/q2_0/|mul_mat/nvfp4/"
        "float:mul_mat/f32/|mul_mat/f16/"
        "kquants:mul_mat/q4_k/|mul_mat/q6_k/"
        "grid:mul_mat/iq2_xxs/|mul_mat/iq2_xs/|mul_mat/iq2_s/|mul_mat/iq3_xxs/|mul_mat/iq3_s/|mul_mat/iq1_s/|mul_mat/iq1_m/|mul_mat/tq1_0/|mul_mat/tq2_0/"
        "soft_max:soft_max/"
        "rms_norm:rms_norm"
        "rope:rope/"
        "glu:glu/"
    )
else
    families=(
        "legacy:mul_mat/q4_0/|mul_mat/q4_1/|mul_mat/q5_0/|mul_mat/q5_1/|mul_mat/q8_0/|mul_mat/iq4_nl/|mul_mat/mxfp4/|mul_mat/q1_0/|mul_mat/q2_0/|mul_mat/nvfp4/"
        "float:mul_mat/f32/|mul_mat/f16/|mul_mat/bf16/"
        "kquants:mul_mat/q2_k/|mul_mat/q3_k/|mul_mat/q4_k/|mul_mat/q5_k/|mul_mat/q6_k/|mul_mat/iq4_xs/"
        "grid:mul_mat/iq2_xxs/|mul_mat/iq2_xs/|mul_mat/iq2_s/|mul_mat/iq3_xxs/|mul_mat/iq3_s/|mul_mat/iq1_s/|mul_mat/iq1_m/|mul_mat/tq1_0/|mul_mat/tq2_0/"
        "mul_mat_id:mul_mat_id/"
        "soft_max:soft_max/"
        "rms_norm:rms_norm|norm/"
        "rope:rope/"
        "glu:glu/|unary/"
        "all:"
    )
fi

log_dir="$root/target/test-arm64-parity"
mkdir -p "$log_dir"
summary=()
status=0
for p in $profiles; do
    case "$p" in
        neon-dotprod) cpu=neoverse-n1; gate=1 ;;
        neon-i8mm) cpu=max; gate=1 ;;
        sve) cpu=max,sve-default-vector-length=32; gate=1 ;;
        *) echo "unknown profile $p" >&2; exit 2 ;;
    esac
    [ -n "$cpu_override" ] && cpu=$cpu_override
    for fam in "${families[@]}"; do
        name=${fam%%:*}
        filter=${fam#*:}
        if [ -n "$only_families" ] && ! [[ " $only_families " == *" $name "* ]]; then continue; fi
        log="$log_dir/$p-$name.log"
        echo "== $p (qemu -cpu $cpu, llamad --numerics $p): $name" >&2
        LLAMAD_BIN="$root/scripts/llamad-qemu-aarch64" LLAMAD_QEMU_CPU=$cpu \
            LLAMAD_OPDIFF_REF_CMD="$root/tests/peer/ggml-rpc-server-aarch64 $p -H 127.0.0.1 -p {port} -t 1" \
            LLAMAD_OPDIFF_PROFILE=$p LLAMAD_OPDIFF_EXACT=1 LLAMAD_OPDIFF_FILTER="$filter" \
            cargo test --release -p e2e --test opdiff -- --nocapture >"$log" 2>&1
        rc=$?
        # The per-op table of the run: "op cases identical exact-req max-nmse max-rel failed".
        rows=$(awk '/^op +cases/{t=1; next} t && NF==7 {print}' "$log")
        cases=$(echo "$rows" | awk '{s+=$2} END {print s+0}')
        ident=$(echo "$rows" | awk '{s+=$3} END {print s+0}')
        failed=$(echo "$rows" | awk '{s+=$7} END {print s+0}')
        summary+=("$(printf '%-13s %-12s %-10s %6s %10s %7s  rc=%s' "$p" "$cpu" "$name" "$cases" "$ident" "$failed" "$rc")")
        gated=$gate
        if [ -n "$gate_families" ] && ! [[ " $gate_families " == *" $name "* ]]; then gated=0; fi
        if [ "$rc" != 0 ] && [ "$gated" = 1 ]; then status=1; fi
    done
done
echo "== aarch64 parity summary (logs in $log_dir)" >&2
printf '%-13s %-12s %-10s %6s %10s %7s\n' profile qemu-cpu family cases identical failed >&2
printf '%s\n' "${summary[@]}" >&2
exit $status
