#!/usr/bin/env python3
"""Split mode row vs llama.cpp's layer split, on one machine, in one run (issue 8 point 4).

Measures prompt processing and generation tokens/s for:
  A  llamactl run --split-mode row   over 2 llamad workers (-t 1 each)
  B  llama.cpp (llama-cpp-python)    over 2 reference rpc-servers (-t 1 each), layer split
  C  llamactl run                    over 1 llamad worker with -t 2 (layer split)
  D  llamactl run --split-mode layer over 2 llamad workers (-t 1 each), for context
and prints the ratios A/B and A/C. Configurations alternate over the repetitions.

Run with the reference peer's Python (the native build is llama.cpp's fast path):
  ~/.cache/llamad-peer/venv-0.3.36-avx512-vnni-bf16-vbmi/bin/python bench/row_split.py \
      --llamad target/release/llamad --llamactl target/release/llamactl [-m MODEL] [-r 3]
Not part of the test suite.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
import peer  # noqa: E402

PROMPT = " ".join(
    ["The history of the city begins with a small settlement on the river, where traders met to exchange"
     " grain, salt and cloth; over the centuries it grew into a market town and then a capital."] * 8
)


def llamactl(bin_, model, workers, mode, n_gen, n_ctx):
    args = [bin_, "run", "-m", model, "-p", PROMPT, "-n", str(n_gen), "--temp", "0", "-c", str(n_ctx),
            "--flash-attn", "off", "--no-progress", "--workers", ",".join(workers), "--split-mode", mode]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"llamactl failed:\n{p.stderr}")
    pp = re.search(r"prompt eval time =.*?/\s*(\d+) tokens.*?([\d.]+) tokens per second", p.stderr)
    tg = re.search(r"\n.*?\beval time =.*?/\s*(\d+) runs.*?([\d.]+) tokens per second", p.stderr)
    return float(pp.group(2)), float(tg.group(2)), int(pp.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(HERE, "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llamad", required=True)
    ap.add_argument("--llamactl", required=True)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    a = ap.parse_args()
    os.environ["LLAMAD_BIN"] = os.path.abspath(a.llamad)
    model = os.path.abspath(a.model)
    res = {k: ([], []) for k in "ABCD"}
    n_prompt = 0
    for rep in range(a.reps):
        with peer.start_llamad(threads=1) as w1, peer.start_llamad(threads=1) as w2:
            pp, tg, n_prompt = llamactl(a.llamactl, model, [w1.endpoint, w2.endpoint], "row", a.n_gen, 1024)
            res["A"][0].append(pp); res["A"][1].append(tg)
            pp, tg, _ = llamactl(a.llamactl, model, [w1.endpoint, w2.endpoint], "layer", a.n_gen, 1024)
            res["D"][0].append(pp); res["D"][1].append(tg)
        with peer.start_reference_server(threads=1) as r1, peer.start_reference_server(threads=1) as r2:
            m = peer.run_master(model, [PROMPT], n_tokens=a.n_gen + 1, endpoints=[r1.endpoint, r2.endpoint],
                                n_ctx=1024, n_threads=1)
            s = m.speeds()
            res["B"][0].append(s["prompt_tok_s"]); res["B"][1].append(s["gen_tok_s"])
        with peer.start_llamad(threads=2) as w:
            pp, tg, _ = llamactl(a.llamactl, model, [w.endpoint], "layer", a.n_gen, 1024)
            res["C"][0].append(pp); res["C"][1].append(tg)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} pp {res[k][0][-1]:.1f} tg {res[k][1][-1]:.1f}" for k in "ABCD"),
              flush=True)
    med = {k: (statistics.median(v[0]), statistics.median(v[1])) for k, v in res.items()}
    names = {
        "A": "llamactl row, 2 llamad -t 1",
        "B": "llama.cpp, 2 reference servers -t 1",
        "C": "llamactl, 1 llamad -t 2",
        "D": "llamactl layer, 2 llamad -t 1",
    }
    print(f"\nprompt {n_prompt} tokens, {a.n_gen} generated, median of {a.reps}")
    print(f"{'configuration':40} {'pp tok/s':>10} {'tg tok/s':>10}")
    for k in "ABCD":
        print(f"{k} {names[k]:38} {med[k][0]:10.1f} {med[k][1]:10.1f}")
    print(f"A/B (target >= 1.5): pp {med['A'][0] / med['B'][0]:.2f}x, tg {med['A'][1] / med['B'][1]:.2f}x")
    print(f"A/C (target >= 0.8): pp {med['A'][0] / med['C'][0]:.2f}x, tg {med['A'][1] / med['C'][1]:.2f}x")


if __name__ == "__main__":
    main()
