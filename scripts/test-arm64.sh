#!/usr/bin/env bash
# Cross-builds the compute crate for aarch64 and runs its tests under qemu twice: on qemu's default
# CPU (which has dotprod) and on a Cortex-A72 (NEON without dotprod), so both kernel paths run.
# Installs Debian's cross toolchain on first use (ref: /work/shared/notes/arm64-cross.md).
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

echo "== aarch64, default qemu CPU (dotprod)" >&2
cargo test -p compute --target "$target" "$@"
echo "== aarch64, QEMU_CPU=cortex-a72 (no dotprod)" >&2
QEMU_CPU=cortex-a72 cargo test -p compute --target "$target" "$@"
