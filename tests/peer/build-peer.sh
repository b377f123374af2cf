#!/usr/bin/env bash
# Builds llama-cpp-python 0.3.36 with RPC (the reference llama.cpp peer) into a wheel cache outside the
# checkout, once, and installs it into a venv that the interop tests use.
#
# Environment:
#   LLAMAD_PEER_CACHE  where wheels and the venv live (default: ~/.cache/llamad-peer)
# Prints the venv's python path on the last line of stdout.
set -euo pipefail

PEER_VERSION=0.3.36
cache=${LLAMAD_PEER_CACHE:-$HOME/.cache/llamad-peer}

# Instruction sets: explicit (never -march=native, which enables AMX where present and crashes
# llama.cpp's CPU path), chosen from what this CPU has, so the reference is as fast as it can be here.
#
# LLAMAD_PEER_ISA=avx2 builds the AVX2 baseline (the parity reference: llamad's x86 kernels reproduce
# ggml's AVX2 arithmetic); the default, native, adds the AVX-512 extensions this CPU has (the
# performance reference).
isa=${LLAMAD_PEER_ISA:-native}
flags="-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
tag=avx2
if [ "$isa" = native ] && grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
    flags="$flags -DGGML_AVX512=ON"
    tag=avx512
    if grep -qw avx512_vnni /proc/cpuinfo; then flags="$flags -DGGML_AVX512_VNNI=ON"; tag="$tag-vnni"; fi
    if grep -qw avx512_bf16 /proc/cpuinfo; then flags="$flags -DGGML_AVX512_BF16=ON"; tag="$tag-bf16"; fi
    if grep -qw avx512vbmi /proc/cpuinfo; then flags="$flags -DGGML_AVX512_VBMI=ON"; tag="$tag-vbmi"; fi
fi
[ "$(uname -m)" = x86_64 ] || { flags="-DGGML_RPC=ON"; tag=$(uname -m); }

wheels="$cache/wheels-$PEER_VERSION-$tag"
venv="$cache/venv-$PEER_VERSION-$tag"
mkdir -p "$wheels"

if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $PEER_VERSION ($tag); this takes 7-9 minutes on 2 cores" >&2
    tmp=$(mktemp -d "$cache/build.XXXXXX")
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$PEER_VERSION" >&2
    mv "$tmp"/llama_cpp_python-*.whl "$wheels"/
    rm -rf "$tmp"
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet "$wheels"/llama_cpp_python-*.whl numpy >&2
fi
echo "$venv/bin/python"
