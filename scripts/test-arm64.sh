#!/usr/bin/env bash
# Cross-builds the compute crate for aarch64 and runs its tests under qemu on three CPUs, one per
# NEON kernel level: `max` (dotprod and i8mm: the neon, neon-dotprod and neon-i8mm sets all run),
# `neoverse-n1` (dotprod without i8mm) and `cortex-a72` (NEON without dotprod). Each run names the
# features its CPU must have in LLAMAD_EXPECT_AARCH64; the test
# quant::tests::neon::detected_levels_match_the_runner fails if the detected ones differ, so a qemu
# CPU that silently falls back cannot pass. Prints the test count per CPU at the end.
# Installs Debian's cross toolchain on first use (ref: /work/shared/notes/arm64-cross.md).
# Arguments go to every `cargo test` (e.g. `--lib`); without any, the library tests and the integration
# tests that mean something on aarch64 run. Left out: model_llamacpp (asserts logits bit-identical to the
# x86 AVX2 llama.cpp peer, which needs our AVX2 kernels: it fails on x86 too with LLAMAD_KERNELS=scalar)
# and tokenizer (architecture-independent, needs the x86 peer's Python; covered by the host suite).
set -euo pipefail
cd "$(dirname "$0")/.."

need_install=0
for bin in /usr/bin/rustc /usr/bin/aarch64-linux-gnu-gcc /usr/bin/qemu-aarch64-static; do
    [ -x "$bin" ] || need_install=1
done
dpkg -s libstd-rust-web-dev:arm64 >/dev/null 2>&1 || need_install=1
if [ "$need_install" = 1 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static
fi

# Rustup's compiler has no aarch64 standard library; Debian's does (trap 2 of the note).
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_ARM64:-$PWD/target/aarch64}"
target=aarch64-unknown-linux-gnu
# The runs must not inherit a forced kernel set.
unset LLAMAD_KERNELS

if [ "$#" = 0 ]; then
    set -- --lib --test ops --test gguf --test model_gguf --test model_graphs --test model_sampler \
        --test model_session --test model_smollm2
fi
log_dir="$CARGO_TARGET_DIR/test-arm64"
mkdir -p "$log_dir"
summary=()
# cpu:features (what `is_aarch64_feature_detected!` must report on that qemu CPU)
for run in max:neon,dotprod,i8mm neoverse-n1:neon,dotprod cortex-a72:neon; do
    cpu=${run%%:*}
    features=${run#*:}
    echo "== aarch64, QEMU_CPU=$cpu (expects $features)" >&2
    log="$log_dir/$cpu.log"
    QEMU_CPU=$cpu LLAMAD_EXPECT_AARCH64=$features cargo test -p compute --target "$target" "$@" 2>&1 | tee "$log"
    passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
    summary+=("$cpu ($features): $passed tests passed")
done
echo "== aarch64 summary" >&2
printf '%s\n' "${summary[@]}" >&2
