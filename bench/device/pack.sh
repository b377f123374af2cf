#!/usr/bin/env bash
# Prepares what bench/device/scaling.sh needs on a machine that builds nothing (the 16-core device
# machine of DEVELOPERS.md): stripped release binaries, llama.cpp's C-API bench linked against the
# reference wheels' libraries (the AVX2 build and the native AVX-512 build; scaling.sh picks the one
# the CPU runs), and a small donor GGUF holding SmolLM2's tokenizer for `llamactl synth`.
#
# Usage: bench/device/pack.sh [PACK_DIR]   (default target/device-pack, git-ignored; well under 64 MiB)
# Then, with the device tool: carry ["target/device-pack"], command "bench/device/scaling.sh".
set -euo pipefail
cd "$(dirname "$0")/../.."
pack=${1:-target/device-pack}
peer=${LLAMAD_PEER_CACHE:-$HOME/.cache/llamad-peer}
src=$(ls -d "$peer"/src/llama_cpp_python-*/vendor/llama.cpp | head -1)
model=${LLAMAD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || bash scripts/fetch-model.sh
rm -rf "$pack" && mkdir -p "$pack/bin"
cargo build --release --quiet -p llamad -p llamactl --bins
for b in llamad llamactl; do
    strip -o "$pack/bin/$b" "target/release/$b"
done
for build in avx2 native; do
    case $build in
        avx2) venv=$(ls -d "$peer"/venv-*-avx2 | head -1) ;;
        native) venv=$(ls -d "$peer"/venv-*-avx512* 2>/dev/null | head -1 || true) ;;
    esac
    [ -n "$venv" ] || { echo "pack: no $build peer venv under $peer (tests/peer/build-peer.sh)"; continue; }
    lib=$(ls -d "$venv"/lib/python3*/site-packages/llama_cpp/lib | head -1)
    out="$pack/lcpp-$build"
    mkdir -p "$out"
    # Only the .so.0 names: the soname libllama links against (one ggml backend registry).
    for so in libllama libggml libggml-base libggml-cpu libggml-rpc; do
        strip -o "$out/$so.so.0" "$lib/$so.so.0"
    done
    gcc -O2 -std=c11 -D_POSIX_C_SOURCE=199309L -I"$src/include" -I"$src/ggml/include" \
        bench/device/lcpp_bench.c -o "$out/lcpp_bench" "$out/libllama.so.0" "$out/libggml.so.0" \
        -Wl,-rpath,'$ORIGIN'
done
# A one-layer model whose only purpose is SmolLM2's tokenizer (synth copies it from here).
"$pack/bin/llamactl" synth --shape 1b --layers 1 --embd 64 --ff 128 --heads 2 --kv-heads 1 \
    --type q4_0 --vocab-from "$model" -o "$pack/donor.gguf" >/dev/null
du -sh "$pack"
