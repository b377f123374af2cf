#!/usr/bin/env bash
# Cross-builds llama.cpp's RPC server (ggml-rpc-server, CPU backend) for aarch64 from the vendored
# llama.cpp of the llama-cpp-python 0.3.36 sdist, once per ggml CPU profile, into a cache folder outside
# the checkout, and prints the binary's path on the last line of stdout. Run the binary under qemu-user
# (tests/peer/ggml-rpc-server-aarch64 does).
#
#   tests/peer/build-peer-aarch64.sh [neon-dotprod|neon-i8mm|sve]     (default neon-dotprod)
#
# Profiles (-march for GGML_CPU_ARM_ARCH, from ggml/src/CMakeLists.txt's aarch64 variant list):
#   neon-dotprod  armv8.2-a+dotprod               variant armv8.2_1: Graviton 2 / Neoverse N1
#   neon-i8mm     armv8.6-a+dotprod+i8mm          NEON with the 2-row i8mm (smmla) kernels
#   sve           armv8.6-a+dotprod+fp16+sve+i8mm variant armv8.6_1, what ggml's loader picks on
#                                                 Graviton 3 / Neoverse V1 (SVE + i8mm)
# Only the ggml libraries and the rpc-server target are built (no llama, no tools), statically linked.
#
# Environment:
#   LLAMAD_PEER_CACHE  cache folder (default ~/.cache/llamad-peer); builds go to aarch64-<profile>/
# Installs Debian's aarch64 cross toolchain and qemu-user when missing (root or sudo), and cmake from
# pip when the system has none.
set -euo pipefail

PEER_VERSION=0.3.36
profile=${1:-neon-dotprod}
case "$profile" in
    neon-dotprod) march=armv8.2-a+dotprod ;;
    neon-i8mm) march=armv8.6-a+dotprod+i8mm ;;
    sve) march=armv8.6-a+dotprod+fp16+sve+i8mm ;;
    *) echo "unknown profile $profile (neon-dotprod|neon-i8mm|sve)" >&2; exit 2 ;;
esac
cache=${LLAMAD_PEER_CACHE:-$HOME/.cache/llamad-peer}
out="$cache/aarch64-$profile"
bin="$out/ggml-rpc-server"
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi

# Toolchain.
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if [ "${#need[@]}" -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi
if ! command -v cmake >/dev/null; then
    python3 -m pip install --quiet cmake >&2
fi

# Sources: the sdist from PyPI (a direct download of the .tar.gz; `pip download --no-binary` would
# build cmake from source).
src="$cache/src/llama_cpp_python-$PEER_VERSION"
if [ ! -f "$src/vendor/llama.cpp/tools/rpc/rpc-server.cpp" ]; then
    mkdir -p "$cache/src"
    python3 - "$PEER_VERSION" "$cache/src" >&2 <<'EOF'
import re, sys, tarfile, urllib.request, io
version, dest = sys.argv[1], sys.argv[2]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
name = f"llama_cpp_python-{version}.tar.gz"
links = [href for href in re.findall(r'href="([^"]+)"', index) if href.split("#")[0].endswith("/" + name)]
if not links:
    sys.exit(f"{name} not found on PyPI's simple index")
url = links[0].split("#")[0]
print(f"downloading {url}", file=sys.stderr)
data = urllib.request.urlopen(url, timeout=600).read()
import hashlib
frag = links[0].split("#", 1)[1] if "#" in links[0] else ""
if frag.startswith("sha256="):
    got = hashlib.sha256(data).hexdigest()
    if got != frag[len("sha256="):]:
        sys.exit(f"sha256 mismatch for {name}: {got}")
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    tar.extractall(dest, filter="data")
EOF
fi
llama="$src/vendor/llama.cpp"

# A minimal project: ggml and the rpc-server executable, nothing of llama.
echo "building ggml-rpc-server for aarch64 ($profile, -march=$march); several minutes on 2 cores" >&2
work="$out.build"
rm -rf "$work"
mkdir -p "$work/proj"
cat >"$work/proj/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.14)
project(ggml_rpc_server_aarch64 C CXX)
add_subdirectory("$llama/ggml" ggml)
add_executable(ggml-rpc-server "$llama/tools/rpc/rpc-server.cpp")
target_link_libraries(ggml-rpc-server PRIVATE ggml)
target_compile_features(ggml-rpc-server PRIVATE cxx_std_17)
EOF
cat >"$work/toolchain.cmake" <<'EOF'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
EOF
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$work/proj" -B "$work/build" "${generator[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$work/toolchain.cmake" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=ON -DGGML_RPC=ON -DGGML_NATIVE=OFF \
    -DGGML_CPU_ARM_ARCH="$march" -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=ON -DGGML_CPU_KLEIDIAI=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="-static" >&2
nice cmake --build "$work/build" --target ggml-rpc-server -j "$(nproc)" >&2
mkdir -p "$out"
cp "$work/build/ggml-rpc-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "-march=$march" >"$out/profile.txt"
rm -rf "$work"
echo "$bin"
