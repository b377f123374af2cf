"""Long contexts over 2 workers: a ~4k-token prompt, then generation, at 8k and 32k context (issue 27).

Driven by bench/long_context.sh. For each context size, in one run, on fresh workers of one thread:

  layer   llamactl run over 2 llamad workers, split mode layer (prompt pipelined in micro-batches)
  row     llamactl run over 2 llamad workers, split mode row (tensor parallel)
  lcpp    llama.cpp's master (llama-cpp-python 0.3.36) over 2 of its reference RPC servers (layer split)

The prompt is text of about 4096 tokens (llamactl's count is given to llama.cpp, which decodes that
many random tokens: speed does not depend on which tokens); then 32 tokens are generated one at a
time at that depth. Figures: prompt processing and generation tokens/s (llamactl's own timing
lines; llama.cpp's llama_decode to llama_synchronize), the KV cache per worker (llamactl's load
summary; llama.cpp's "KV buffer size" log lines) and each worker's peak RSS (VmHWM).

SmolLM2-135M was trained at 8192 tokens: at 32768 both masters warn and run.
Prints a markdown table and writes it with the raw figures to target/bench/long-context-<time>.{md,json}.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
sys.path.insert(0, HERE)

import peer  # noqa: E402
from load import proc_status  # noqa: E402

MIB = 1 << 20


def log(msg: str) -> None:
    print(f"[long-context {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompt_text(n_words: int) -> str:
    """Deterministic English-like text; SmolLM2's tokenizer makes about 1.3 tokens of a word here."""
    subjects = ["The engineer", "A worker", "The master", "Every layer", "The cache", "One thread", "The model"]
    verbs = ["reads", "writes", "maps", "splits", "measures", "uploads", "computes"]
    objects = ["the weights", "a long prompt", "the key cache", "its share of rows", "the logits", "a new batch"]
    words, i = [], 0
    while len(words) < n_words:
        s = f"{subjects[i % 7]} {verbs[(i * 3) % 7]} {objects[(i * 5) % 6]} at step {i}."
        words.extend(s.split())
        i += 1
    return " ".join(words[:n_words])


def run_ours(cfg, model: str, prompt_file: str, n_ctx: int, mode: str) -> dict:
    workers = [peer.start_llamad(threads=cfg.threads) for _ in range(2)]
    try:
        argv = [cfg.llamactl, "run", "-m", model, "-f", prompt_file, "-n", str(cfg.n_gen), "--temp", "0",
                "-t", "1", "-c", str(n_ctx), "--no-progress", "--split-mode", mode, "--flash-attn", cfg.flash_attn,
                "--workers", ",".join(w.endpoint for w in workers)]
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
        hwm = [proc_status(w.proc.pid).get("VmHWM", 0) for w in workers]
        eps = [w.endpoint for w in workers]
    finally:
        for w in workers:
            w.stop()
    if r.returncode != 0:
        raise RuntimeError(f"llamactl run ({mode}, -c {n_ctx}) failed:\n{r.stderr[-4000:]}")
    err = r.stderr
    pp = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*?([\d.]+) tokens per second", err)
    tg = re.search(r"llamactl:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs.*?([\d.]+) tokens per second", err)
    if not pp or not tg:
        raise RuntimeError(f"no timing lines:\n{err[-3000:]}")
    kv = [float(m) * MIB for m in re.findall(r"KV cache ([\d.]+) MiB", err)]
    return {"pp_ts": float(pp.group(3)), "n_prompt": int(pp.group(2)), "tg_ts": float(tg.group(3)),
            "n_gen": int(tg.group(2)), "kv": kv, "hwm": hwm, "endpoints": eps,
            "warnings": [x for x in err.splitlines() if "warning" in x]}


def run_lcpp(cfg, model: str, n_ctx: int, n_prompt: int) -> dict:
    workers = [peer.start_reference_server(threads=cfg.threads) for _ in range(2)]
    try:
        with tempfile.TemporaryDirectory(prefix="long-lcpp-") as tmp:
            a, o = os.path.join(tmp, "args.json"), os.path.join(tmp, "out.json")
            with open(a, "w") as f:
                json.dump({"model": model, "endpoints": [w.endpoint for w in workers], "n_ctx": n_ctx,
                           "n_prompt": n_prompt, "n_gen": cfg.n_gen, "threads": 1,
                           "flash_attn": cfg.flash_attn == "on"}, f)
            r = subprocess.run([sys.executable, os.path.join(HERE, "lcpp_long.py"), a, o], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=3600)
            if r.returncode != 0 or not os.path.exists(o):
                raise RuntimeError(f"lcpp_long failed ({r.returncode}):\n{r.stdout[-4000:]}")
            with open(o) as f:
                out = json.load(f)
        out["hwm"] = [proc_status(w.proc.pid).get("VmHWM", 0) for w in workers]
    finally:
        for w in workers:
            w.stop()
    out["kv"] = [float(m.group(1)) * MIB for line in out["log"]
                 for m in [re.search(r"RPC\d*\[?.*KV buffer size =\s*([\d.]+) MiB", line)] if m]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamactl", required=True)
    ap.add_argument("--llamad", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--words", type=int, default=3150, help="prompt length in words (~4090 SmolLM2 tokens)")
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--who", default="layer,row,lcpp")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off",
                    help="flash attention on both sides (llama.cpp's master here defaults to off)")
    ap.add_argument("--quick", action="store_true", help="8k context only, ~1k-token prompt, 8 tokens")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"))
    cfg = ap.parse_args()
    if cfg.quick:
        cfg.ctx, cfg.words, cfg.n_gen = "8192", 780, 8
    os.environ["LLAMAD_BIN"] = cfg.llamad
    ctxs = [int(x) for x in cfg.ctx.split(",") if x]
    whos = [w.strip() for w in cfg.who.split(",") if w.strip()]
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": os.path.basename(cfg.model),
           "threads": cfg.threads, "loadavg_start": os.getloadavg(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="long-prompt-") as tmp:
        prompt_file = os.path.join(tmp, "prompt.txt")
        with open(prompt_file, "w") as f:
            f.write(prompt_text(cfg.words))
        n_prompt = None
        for n_ctx in ctxs:
            for who in whos:
                la = os.getloadavg()[0]
                if who == "lcpp":
                    r = run_lcpp(cfg, cfg.model, n_ctx, n_prompt or 4096)
                else:
                    r = run_ours(cfg, cfg.model, prompt_file, n_ctx, who)
                    n_prompt = r["n_prompt"]
                r["loadavg"] = la
                res["runs"][f"{who}@{n_ctx}"] = r
                log(f"{who} -c {n_ctx}: pp {r['pp_ts']:.1f} t/s ({r['n_prompt']} tokens), tg {r['tg_ts']:.1f} t/s, "
                    f"KV {[round(k / MIB, 2) for k in r['kv']]} MiB, peak RSS "
                    f"{[round(h / MIB) for h in r['hwm']]} MiB (load average {la:.2f})")
    res["loadavg_end"] = os.getloadavg()
    names = {"layer": "llamactl + 2 llamad, layer", "row": "llamactl + 2 llamad, row",
             "lcpp": "llama.cpp + 2 rpc-server"}
    rows = ["| ctx | master + workers | prompt tokens | pp t/s | tg t/s (at depth) | KV cache per worker | "
            "peak RSS per worker | load avg |", "|---:|---|---:|---:|---:|---|---|---:|"]
    for key, r in res["runs"].items():
        who, n_ctx = key.split("@")
        rows.append(f"| {n_ctx} | {names[who]} | {r['n_prompt']} | {r['pp_ts']:.1f} | {r['tg_ts']:.1f} | "
                    + " + ".join(f"{k / MIB:.2f}" for k in r["kv"]) + " MiB | "
                    + " / ".join(f"{h / MIB:.0f}" for h in r["hwm"]) + f" MiB | {r['loadavg']:.2f} |")
    ratios = []
    for n_ctx in ctxs:
        th = res["runs"].get(f"lcpp@{n_ctx}")
        for who in ("layer", "row"):
            o = res["runs"].get(f"{who}@{n_ctx}")
            if th and o:
                ratios.append(f"- ctx {n_ctx}, {who} / llama.cpp: pp {o['pp_ts'] / th['pp_ts']:.2f}x, "
                              f"tg {o['tg_ts'] / th['tg_ts']:.2f}x")
    text = "\n".join([f"model: {res['model']}, 2 workers of {cfg.threads} thread(s), {cfg.n_gen} generated tokens, flash attention {cfg.flash_attn}",
                      "", *rows, "", *ratios, "",
                      f"load average at start {res['loadavg_start'][0]:.2f}, at end {res['loadavg_end'][0]:.2f} "
                      f"({os.cpu_count()} CPUs)"])
    print(text)
    os.makedirs(cfg.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(cfg.out_dir, f"long-context-{stamp}.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(cfg.out_dir, f"long-context-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {cfg.out_dir}/long-context-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
