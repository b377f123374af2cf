#!/usr/bin/env bash
# The dot products of the IQ and TQ weight types, llamad's against ggml's own (the reference peer's
# CPU backend, built for AVX2), same run: ns per 256-element block, best of 200 calls over a row of
# 2048 blocks (compute/tests/quant_peer.rs, bench_iq_tq_dots_against_ggml). Prints the table and
# writes it to bench/results/iq-dots.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
LLAMAD_PEER_PYTHON=${LLAMAD_PEER_PYTHON:-$(LLAMAD_PEER_ISA=${LLAMAD_PEER_ISA:-avx2} tests/peer/build-peer.sh | tail -n 1)}
export LLAMAD_PEER_PYTHON
out=bench/results/iq-dots.txt
{
    echo "# bench/iq-dots.sh, $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    cargo test --release -p compute --test quant_peer -- --ignored --nocapture bench_iq_tq_dots_against_ggml 2>&1 |
        grep -E '^(ns per|type|iq|tq|q4_K)'
} | tee "$out"
