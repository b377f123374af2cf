"""Side-by-side performance of llamad/llamactl and llama.cpp (llama-cpp-python 0.3.36 with RPC) on
this machine, in one run; driven by bench/compare.sh, which builds the binaries and picks the peer.

Cases (issue 8):
  a  local compute: `llamactl bench` vs llama.cpp's CPU backend, pp/tg, per weight type (the two
     sides' repetitions interleaved, one per process)
  b  llama.cpp master with one llamad worker vs with llama.cpp's reference RPC server (interleaved
     as in a, a fresh worker per repetition)
  c  llamactl over 2 llamad workers (1 thread each, split mode row) vs llama.cpp over 2 reference
     servers (1 thread each), and vs llamactl over one 2-thread llamad worker; also llamactl in
     llama.cpp's split mode (layer, prompts pipelined in micro-batches) vs llama.cpp (the four in
     rotation, fresh workers per repetition)
  fa prompt processing with flash attention on: llamactl in-process (FA on, FA off) and over 2 llamad
     workers of 1 thread (layer split and split mode row, FA on and off) vs llama.cpp with FA on
     (its CPU backend; its 2 reference servers), all in rotation in one run
  d  model load with a cold vs a warm worker cache (llamad -c, llama.cpp's server with its cache)
  e  a llamad worker's peak RSS (VmHWM) vs the bytes of the buffers it holds (admin API)
  bw streaming-read memory bandwidth, and generation's weight bytes/s as a fraction of it

Prints a table with ratios (ours / theirs, higher is better for speeds) and writes everything
to target/bench/compare-<time>.json (and target/bench/compare.json).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))

import peer  # noqa: E402

# llama_ftype values (llama.h) for the requantized copies. llama.cpp's quantizer refuses IQ2_XXS, IQ2_XS,
# IQ2_S and the IQ1 types without an importance matrix, and SmolLM2's 576-wide rows keep most tensors of
# a 256-block "mostly IQ3_XXS" file in fallback types: for those, --synth makes models whose every
# matrix is of the type.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K": 14, "Q6_K": 18, "IQ3_XXS": 23, "IQ4_XS": 30, "TQ2_0": 37}
SYNTH_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
               "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"]
ALL_CASES = ["a", "b", "c", "fa", "d", "e", "bw"]


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Models


def quantized(base: str, wtype: str, out_dir: str) -> str:
    """The base model requantized to `wtype` with llama.cpp's quantize API, made once."""
    if wtype == "Q4_1" and base.endswith("Q4_1.gguf"):
        return base
    stem = os.path.basename(base).rsplit(".", 2)[0]
    out = os.path.join(out_dir, f"{stem}.{wtype}.gguf")
    if os.path.exists(out) and os.path.getsize(out) > 0:
        return out
    os.makedirs(out_dir, exist_ok=True)
    log(f"quantizing {os.path.basename(base)} to {wtype} (once, into {out_dir})")
    code = (
        "import sys, ctypes, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        "p.ftype = int(sys.argv[3]); p.allow_requantize = True; p.nthread = 2\n"
        "rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))\n"
        "sys.exit(rc)\n"
    )
    tmp = out + ".part"
    subprocess.run([sys.executable, "-c", code, base, tmp, str(FTYPES[wtype])], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(tmp, out)
    return out


def synthesized(llamactl: str, vocab_from: str, shape: str, wtype: str, out_dir: str) -> str:
    """A `llamactl synth` model of `shape` (`1b`, `8b:4` = 8B layers cut to 4) with every matrix in
    `wtype`, made once."""
    name, _, layers = shape.partition(":")
    out = os.path.join(out_dir, f"synth-{name}-L{layers or 'all'}.{wtype.lower()}.gguf")
    if os.path.exists(out) and os.path.getsize(out) > 0:
        return out
    os.makedirs(out_dir, exist_ok=True)
    argv = [llamactl, "synth", "--shape", name, "-t", wtype.lower(), "--vocab-from", vocab_from, "-o", out + ".part"]
    if layers:
        argv += ["--layers", layers]
    log(f"synthesizing {os.path.basename(out)}")
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    os.replace(out + ".part", out)
    return out


# ---------------------------------------------------------------------------------------------
# Runners


def llamactl_bench(bin_: str, model: str, p, n, reps: int, threads: int, workers=(), extra=()) -> list:
    argv = [bin_, "bench", "-m", model, "-p", ",".join(map(str, p)), "-n", ",".join(map(str, n)),
            "-r", str(reps), "-t", str(threads), "-o", "json", *extra]
    if workers:
        argv += ["--workers", ",".join(workers)]
        if "--split-mode" not in extra:
            argv += ["--split-mode", "layer"]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=3600)
    return json.loads(out.stdout)


def lcpp_bench(model: str, p, n, reps: int, threads: int, endpoints=(), load_only=False, flash_attn=False) -> dict:
    with tempfile.TemporaryDirectory(prefix="compare-lcpp-") as tmp:
        a, o = os.path.join(tmp, "args.json"), os.path.join(tmp, "out.json")
        with open(a, "w") as f:
            json.dump({"model": model, "endpoints": list(endpoints), "threads": threads, "reps": reps,
                       "n_prompt": list(p), "n_gen": list(n), "load_only": load_only, "flash_attn": flash_attn}, f)
        r = subprocess.run([sys.executable, os.path.join(HERE, "lcpp_bench.py"), a, o],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=3600)
        if r.returncode != 0 or not os.path.exists(o):
            raise RuntimeError(f"lcpp_bench failed ({r.returncode}):\n{r.stdout.decode(errors='replace')[-4000:]}")
        with open(o) as f:
            return json.load(f)


def by_test(rows: list) -> dict:
    return {(r["n_prompt"], r["n_gen"]): r for r in rows}


def llamad(threads: int, extra=(), env=None) -> peer.Server:
    return peer.start_llamad(threads=threads, extra_args=list(extra), env_extra=env)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read().rsplit(")", 1)[1].split()
    return (int(s[11]) + int(s[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# Table


class Table:
    def __init__(self):
        self.rows = []

    def section(self, title: str) -> None:
        self.rows.append(("section", title))

    def speed(self, case: str, what: str, test: str, ours: dict, theirs: dict, target: float,
              ours_label="ours", theirs_label="llama.cpp") -> dict:
        ratio = ours["avg_ts"] / theirs["avg_ts"] if theirs["avg_ts"] > 0 else float("nan")
        row = {"case": case, "what": what, "test": test, "ours": ours["avg_ts"], "ours_sd": ours["stddev_ts"],
               "theirs": theirs["avg_ts"], "theirs_sd": theirs["stddev_ts"], "ratio": ratio, "target": target,
               "ours_label": ours_label, "theirs_label": theirs_label, "unit": "t/s"}
        self.rows.append(("row", row))
        return row

    def value(self, case: str, what: str, test: str, ours: float, theirs: float, target, unit: str,
              ratio: float, ours_label="ours", theirs_label="ref", note="") -> dict:
        row = {"case": case, "what": what, "test": test, "ours": ours, "ours_sd": None, "theirs": theirs,
               "theirs_sd": None, "ratio": ratio, "target": target, "ours_label": ours_label,
               "theirs_label": theirs_label, "unit": unit, "note": note}
        self.rows.append(("row", row))
        return row

    def render(self) -> str:
        lines = []
        hdr = f"| {'case':<4} | {'configuration':<72} | {'test':<7} | {'ours':>18} | {'theirs':>18} | {'ratio':>6} | {'target':>7} | {'':<4} |"
        sep = "|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|"
        for kind, r in self.rows:
            if kind == "section":
                lines += ["", f"### {r}", "", hdr, sep]
                continue

            def fmt(v, sd):
                if v is None:
                    return "-"
                if sd is None:
                    return f"{v:.2f} {r['unit']}" if r["unit"] != "t/s" else f"{v:.2f}"
                return f"{v:.2f} ± {sd:.2f}"

            tgt = r["target"]
            ok = "" if tgt is None or r["ratio"] != r["ratio"] else ("ok" if r["ratio"] >= tgt else "MISS")
            tgt_s = "-" if tgt is None else f"≥{tgt:g}"
            what = f"{r['what']} ({r['ours_label']} / {r['theirs_label']})"
            lines.append(f"| {r['case']:<4} | {what:<72} | {r['test']:<7} | {fmt(r['ours'], r['ours_sd']):>18} | "
                         f"{fmt(r['theirs'], r['theirs_sd']):>18} | {r['ratio']:>6.2f} | {tgt_s:>7} | {ok:<4} |")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Cases


def rotated(reps: int, configs: list) -> list:
    """`reps` single-repetition runs of each configuration (a function returning `by_test` rows), the
    order rotated every repetition (two sides: A B, B A, A B ...), merged per configuration and test:
    mean and sample standard deviation over the runs. On this shared VM throughput drifts by 10-30%
    over minutes; back-to-back blocks of repetitions put that drift between the configurations,
    rotating spreads it over all of them."""
    runs = [[] for _ in configs]
    for i in range(reps):
        k = i % len(configs)
        for c in list(range(k, len(configs))) + list(range(k)):
            runs[c].append(configs[c]())
    return [merge_runs(r) for r in runs]


def merge_runs(runs: list) -> dict:
    out = {}
    for key, row in runs[0].items():
        v = [r[key]["avg_ts"] for r in runs]
        mean = sum(v) / len(v)
        sd = (sum((x - mean) ** 2 for x in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0.0
        ns = [r[key].get("avg_ns", 0) for r in runs]
        # Every per-run figure is one repetition's; the merged row lists them all.
        out[key] = dict(row, avg_ts=mean, stddev_ts=sd, samples_ts=v, avg_ns=sum(ns) / len(ns), samples_ns=ns,
                        stddev_ns=None, runs=len(v))
    return out


def case_a(cfg, models, t: Table, res: dict) -> None:
    t.section(f"(a) local compute, {cfg.threads} thread(s): llamactl bench vs llama.cpp CPU (t/s)")
    for wtype, m in models.items():
        def run_ours():
            log(f"(a) {wtype}: llamactl bench")
            return by_test(llamactl_bench(cfg.llamactl, m, cfg.p, cfg.n, 1, cfg.threads))

        def run_theirs():
            log(f"(a) {wtype}: llama.cpp")
            return by_test(lcpp_bench(m, cfg.p, cfg.n, 1, cfg.threads)["results"])

        def run_wide():
            # llamactl attends the used KV cells rounded up to 32, llama.cpp to 256 (same logits,
            # see compute::model::KV_PAD); `--kv-pad 256` shows generation on llama.cpp's extent.
            log(f"(a) {wtype}: llamactl bench --kv-pad 256")
            return by_test(llamactl_bench(cfg.llamactl, m, [0], cfg.n, 1, cfg.threads, extra=["--kv-pad", "256"]))

        # One repetition per process, the configurations interleaved (see `rotated`); each process
        # warms up first, as llama-bench does.
        ours, theirs, wide = rotated(cfg.reps, [run_ours, run_theirs, run_wide])
        res.setdefault("a", {})[wtype] = {"ours": list(ours.values()), "llama.cpp": list(theirs.values()),
                                          "ours_kv_pad_256": list(wide.values())}
        for key in sorted(ours, key=lambda k: (k[1], k[0])):
            o, th = ours[key], theirs[key]
            t.speed("a", f"{wtype} {o['type']}-dominant, local", o["test"], o, th, 1.0, "llamactl", "llama.cpp")
        for key in sorted(wide, key=lambda k: (k[1], k[0])):
            w = wide[key]
            t.speed("a", f"{wtype} local, llama.cpp's KV extent", w["test"], w, theirs[key], None,
                    "llamactl --kv-pad 256", "llama.cpp")


def case_b(cfg, model, t: Table, res: dict) -> None:
    t.section(f"(b) llama.cpp master ({cfg.threads} thread(s)) with one worker: llamad vs reference rpc-server (t/s)")

    def run_ours():
        with llamad(cfg.threads) as w:
            log("(b) llama.cpp master on llamad")
            return by_test(lcpp_bench(model, cfg.p, cfg.n, 1, cfg.threads, [w.endpoint])["results"])

    def run_theirs():
        with peer.start_reference_server(threads=cfg.threads) as r:
            log("(b) llama.cpp master on the reference server")
            return by_test(lcpp_bench(model, cfg.p, cfg.n, 1, cfg.threads, [r.endpoint])["results"])

    # A fresh worker and master per repetition, the two sides interleaved (see `rotated`).
    o, th = rotated(cfg.reps, [run_ours, run_theirs])
    res["b"] = {"llamad": list(o.values()), "reference": list(th.values())}
    for key in sorted(o, key=lambda k: (k[1], k[0])):
        t.speed("b", "llama.cpp master, 1 worker", o[key]["test"], o[key], th[key], 1.0, "llamad", "rpc-server")


def case_c(cfg, model, t: Table, res: dict) -> None:
    t.section("(c) two workers of 1 thread each (t/s); llamactl in split mode row (linked llamad workers)")

    def run_two():
        with llamad(1) as w1, llamad(1) as w2:
            log("(c) llamactl --split-mode row over 2 llamad workers")
            return by_test(llamactl_bench(cfg.llamactl, model, cfg.p, cfg.n, 1, 1, [w1.endpoint, w2.endpoint],
                                          ["--split-mode", "row"]))

    def run_layer():
        with llamad(1) as w1, llamad(1) as w2:
            log("(c) llamactl --split-mode layer over 2 llamad workers (pipelined prompts)")
            return by_test(llamactl_bench(cfg.llamactl, model, cfg.p, cfg.n, 1, 1, [w1.endpoint, w2.endpoint]))

    def run_ref():
        with peer.start_reference_server(threads=1) as r1, peer.start_reference_server(threads=1) as r2:
            log("(c) llama.cpp over 2 reference servers")
            return by_test(lcpp_bench(model, cfg.p, cfg.n, 1, 1, [r1.endpoint, r2.endpoint])["results"])

    def run_one():
        with llamad(2) as w:
            log("(c) llamactl over one 2-thread llamad worker")
            return by_test(llamactl_bench(cfg.llamactl, model, cfg.p, cfg.n, 1, 1, [w.endpoint]))

    # The three configurations in rotation, one repetition per set of processes (see `rotated`), at
    # least 5 each: two 1-thread workers in row split both wait whenever either core stalls, so a
    # stall of this VM costs them about twice what it costs one 2-thread worker, and one such run
    # among three moved the mean by 15% (pp512 runs of 463, 417 and 284 t/s at 19:34).
    two, ref, one, layer = rotated(max(cfg.reps, 5), [run_two, run_ref, run_one, run_layer])
    res["c"] = {"llamactl_2x1": list(two.values()), "llama.cpp_2x1": list(ref.values()),
                "llamactl_1x2": list(one.values()), "llamactl_2x1_layer": list(layer.values())}
    for key in sorted(two, key=lambda k: (k[1], k[0])):
        t.speed("c", "2 workers x 1 thread (row)", two[key]["test"], two[key], ref[key], 1.5,
                "llamactl+2 llamad", "llama.cpp+2 rpc-server")
    for key in sorted(two, key=lambda k: (k[1], k[0])):
        t.speed("c", "2x1-thread vs 1x2-thread worker", two[key]["test"], two[key], one[key], 0.8,
                "llamactl+2 llamad", "llamactl+1 llamad -t 2")
    # llama.cpp's own split (layers), where the workers take turns: llamactl pipelines a prompt's
    # micro-batches through them, and generation still takes turns.
    for key in sorted(layer, key=lambda k: (k[1], k[0])):
        t.speed("c", "2 workers x 1 thread (layer)", layer[key]["test"], layer[key], ref[key], None,
                "llamactl+2 llamad", "llama.cpp+2 rpc-server")


def case_fa(cfg, model, t: Table, res: dict) -> None:
    t.section(f"(fa) prompt processing with flash attention on (t/s): llamactl FA on vs FA off vs llama.cpp FA on")
    p = [x for x in cfg.p if x > 0] or [512]
    fa = ["--flash-attn", "on"]

    def local(on: bool):
        def run():
            log(f"(fa) llamactl bench -t {cfg.threads} --flash-attn {'on' if on else 'off'}")
            return by_test(llamactl_bench(cfg.llamactl, model, p, [0], 1, cfg.threads, extra=fa if on else []))
        return run

    def local_theirs():
        log(f"(fa) llama.cpp CPU -t {cfg.threads}, flash attention on")
        return by_test(lcpp_bench(model, p, [0], 1, cfg.threads, flash_attn=True)["results"])

    def workers(on: bool, split: str):
        def run():
            with llamad(1) as w1, llamad(1) as w2:
                log(f"(fa) llamactl over 2 llamad x 1 thread, split {split}, flash attention {'on' if on else 'off'}")
                extra = (fa if on else []) + (["--split-mode", "row"] if split == "row" else [])
                return by_test(llamactl_bench(cfg.llamactl, model, p, [0], 1, 1, [w1.endpoint, w2.endpoint], extra))
        return run

    def workers_theirs():
        with peer.start_reference_server(threads=1) as r1, peer.start_reference_server(threads=1) as r2:
            log("(fa) llama.cpp over 2 reference servers x 1 thread, flash attention on")
            return by_test(lcpp_bench(model, p, [0], 1, 1, [r1.endpoint, r2.endpoint], flash_attn=True)["results"])

    names = ["local_on", "local_off", "local_lcpp_on", "layer_on", "layer_off", "row_on", "row_off", "2x1_lcpp_on"]
    runs = rotated(cfg.reps, [local(True), local(False), local_theirs, workers(True, "layer"),
                              workers(False, "layer"), workers(True, "row"), workers(False, "row"), workers_theirs])
    r = dict(zip(names, runs))
    res["fa"] = {k: list(v.values()) for k, v in r.items()}
    for key in sorted(r["local_on"]):
        test = r["local_on"][key]["test"]
        loc = f"local, {cfg.threads} thread(s)"
        t.speed("fa", f"{loc}: FA on vs llama.cpp FA on", test, r["local_on"][key], r["local_lcpp_on"][key], 1.0,
                "llamactl FA on", "llama.cpp FA on")
        t.speed("fa", f"{loc}: FA off vs llama.cpp FA on", test, r["local_off"][key], r["local_lcpp_on"][key], None,
                "llamactl FA off", "llama.cpp FA on")
        t.speed("fa", f"{loc}: FA on vs FA off", test, r["local_on"][key], r["local_off"][key], 1.0,
                "llamactl FA on", "llamactl FA off")
        for split in ("layer", "row"):
            on, off, th = r[f"{split}_on"][key], r[f"{split}_off"][key], r["2x1_lcpp_on"][key]
            what = f"2 llamad x 1 thread, split {split}"
            t.speed("fa", f"{what}: FA on vs llama.cpp FA on", test, on, th, 1.0, "llamactl FA on",
                    "llama.cpp+2 rpc-server FA on")
            t.speed("fa", f"{what}: FA off vs llama.cpp FA on", test, off, th, None, "llamactl FA off",
                    "llama.cpp+2 rpc-server FA on")
            t.speed("fa", f"{what}: FA on vs FA off", test, on, off, 1.0, "llamactl FA on", "llamactl FA off")


def llamactl_load_s(cfg, model: str, endpoint: str, extra=()) -> float:
    """`llamactl run`'s reported load time (open, tokenizer, connect, allocate, upload)."""
    r = subprocess.run([cfg.llamactl, "run", "-m", model, "-p", "hi", "-n", "1", "--temp", "0", "--no-progress",
                        "-c", "256", "--workers", endpoint, "--split-mode", "layer", *extra], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=600, check=True)
    for line in r.stderr.decode(errors="replace").splitlines():
        if "load time =" in line:
            return float(line.split("=")[1].split()[0]) / 1000.0
    raise RuntimeError("llamactl run printed no load time")


def case_d(cfg, model, t: Table, res: dict) -> None:
    t.section("(d) model load through one worker: cold vs warm cache (seconds, lower is better)")
    # llamactl asks the worker's cache for writes above --hash-threshold (1 MiB by default); a write is
    # a weight or a run of small neighbouring weights of one layer, so each SmolLM2 layer (2.2 MB in
    # nine weights) is one cached write. "all hashed" (threshold 0) adds the 2 KB output norm.
    # At least 5 pairs: on this VM a load now and then runs several times slower (first touches of
    # fresh memory were the worst of it until llamad began mapping cache hits instead of copying
    # them), and a median of 3 lands on such an outlier too often.
    reps = max(cfg.reps, 5)
    whos = ["llamactl+llamad", "llamactl+llamad, all hashed", "llama.cpp+llamad", "llama.cpp+rpc-server"]
    out = {who: {"cold_s": [], "warm_s": []} for who in whos}
    # The configurations in rotation, as in cases a-c: each repetition starts with another one, so
    # the VM's drift over the minutes this takes falls on all of them.
    for i in range(reps):
        k = i % len(whos)
        for who in whos[k:] + whos[:k]:
            cache = tempfile.mkdtemp(prefix="compare-cache-")
            try:
                for phase in ("cold", "warm"):
                    if who == "llama.cpp+rpc-server":
                        srv = peer.start_reference_server(threads=1, cache_dir=cache)
                    else:
                        srv = llamad(1, ["-c", "--cache-dir", cache])
                    with srv:
                        if who.startswith("llamactl"):
                            extra = ["--hash-threshold", "0"] if "all hashed" in who else []
                            s = llamactl_load_s(cfg, model, srv.endpoint, extra)
                        else:
                            s = lcpp_bench(model, [], [], 1, 1, [srv.endpoint], load_only=True)["load_s"]
                    out[who][f"{phase}_s"].append(s)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    for who in whos:
        log(f"(d) {who}: cold {out[who]['cold_s']} warm {out[who]['warm_s']}")
    res["d"] = out
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    for who, v in out.items():
        c, w = med(v["cold_s"]), med(v["warm_s"])
        target = 5.0 if who == "llamactl+llamad" else None
        t.value("d", f"{who} load", "cold/warm", w, c, target, "s", c / w if w > 0 else float("nan"),
                "warm", "cold")
    ours_w, ref_w = med(out["llamactl+llamad"]["warm_s"]), med(out["llama.cpp+rpc-server"]["warm_s"])
    t.value("d", "warm load", "warm", ours_w, ref_w, 1.0, "s", ref_w / ours_w if ours_w > 0 else float("nan"),
            "llamactl+llamad", "llama.cpp+rpc-server")
    lw = med(out["llama.cpp+llamad"]["warm_s"])
    t.value("d", "warm load, llama.cpp master", "warm", lw, ref_w, 1.0, "s", ref_w / lw if lw > 0 else float("nan"),
            "llamad", "rpc-server")


def admin_status(port: int, token: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def case_e(cfg, model, t: Table, res: dict) -> None:
    t.section("(e) llamad worker memory: peak RSS vs bytes of buffers held (MiB)")
    tmp = tempfile.mkdtemp(prefix="compare-admin-")
    try:
        tok_file = os.path.join(tmp, "token")
        aport = peer.free_port()
        w = llamad(cfg.threads, ["--admin-listen", f"127.0.0.1:{aport}", "--admin-token-file", tok_file],
                   env={"LLAMAD__ADMIN__ENABLED": "true"})
        with w:
            deadline = time.monotonic() + 20
            while not os.path.exists(tok_file) and time.monotonic() < deadline:
                time.sleep(0.05)
            with open(tok_file) as f:
                token = f.read().strip()
            idle = vm_hwm(w.proc.pid)
            proc = subprocess.Popen([cfg.llamactl, "bench", "-m", model, "-p", str(max(cfg.p)), "-n",
                                     str(max(cfg.n)), "-r", "1", "-t", "1", "-o", "json", "--workers", w.endpoint,
                                     "--split-mode", "layer"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            peak_alloc = peak_il = 0
            while proc.poll() is None:
                try:
                    st = admin_status(aport, token)
                    peak_alloc = max(peak_alloc, st["memory"]["allocated_rpc"])
                    peak_il = max(peak_il, st["memory"].get("interleaved", 0))
                except OSError:
                    pass
                time.sleep(0.02)
            hwm = vm_hwm(w.proc.pid)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mib = 1 << 20
    res["e"] = {"vm_hwm": hwm, "idle_vm_hwm": idle, "peak_allocated_rpc": peak_alloc, "peak_interleaved": peak_il}
    over = (hwm - peak_alloc) / mib
    t.value("e", "llamad peak RSS vs buffers (llamactl bench)", "rss", hwm / mib, peak_alloc / mib, None, "MiB",
            hwm / peak_alloc if peak_alloc else float("nan"), "VmHWM", "buffers",
            note=f"overhead {over:.1f} MiB (target ≤ 100); buffers include {peak_il / mib:.1f} MiB of interleaved "
                 "weight copies (server.interleave)")
    t.value("e", "RSS above buffers (target ≤ 100 MiB)", "over", over, 100.0, 1.0, "MiB",
            100.0 / over if over > 0 else float("inf"), "RSS-buffers", "limit")


def case_bw(cfg, models, t: Table, res: dict) -> None:
    t.section("(bw) generation vs the memory bandwidth (weight bytes read per token x t/s)")
    bw = json.loads(subprocess.run([cfg.llamactl, "bench", "--mem-bandwidth", "-t", str(cfg.threads), "-r", "5",
                                    "-o", "json"], check=True, stdout=subprocess.PIPE, timeout=600).stdout)[0]
    res["bw"] = {"mem_read": bw, "per_type": {}}
    gbps = bw["max_gbps"]
    t.value("bw", f"streaming read, {cfg.threads} thread(s)", "mem", gbps, None, None, "GB/s", float("nan"),
            "best", "")
    for wtype, runs in res.get("a", {}).items():
        for side in ("ours", "llama.cpp"):
            rows = [r for r in runs[side] if r["n_gen"] > 0 and r["n_prompt"] == 0]
            if not rows:
                continue
            tg = rows[-1]
            per_tok = runs["ours"][0]["model_bytes_per_token"]
            achieved = per_tok * tg["avg_ts"] / 1e9
            res["bw"]["per_type"].setdefault(wtype, {})[side] = {"bytes_per_token": per_tok, "gbps": achieved,
                                                                 "fraction": achieved / gbps}
            t.value("bw", f"{wtype} weights/s ({per_tok / 1e6:.1f} MB/token)", tg["test"], achieved, gbps, None,
                    "GB/s", achieved / gbps, "llamactl" if side == "ours" else "llama.cpp", "bandwidth")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamactl", required=True)
    ap.add_argument("--llamad", required=True)
    ap.add_argument("--model", required=True, help="the Q4_1 base model")
    ap.add_argument("--models-dir", required=True, help="where the requantized copies go (git-ignored)")
    ap.add_argument("--types", default="Q4_1,Q4_0,Q8_0,Q4_K,Q6_K")
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("-p", default="512", help="prompt tests, comma list")
    ap.add_argument("-n", default="128", help="generation tests, comma list")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quick", action="store_true", help="2 reps, pp128/tg32, types Q4_1,Q4_0")
    ap.add_argument("--synth", metavar="SHAPE[:LAYERS]",
                    help="compare `llamactl synth` models of this shape (1b, 8b, 70b, 405b) in each type instead "
                         "of llama.cpp's requantizations of --model (whose tokenizer they copy)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"))
    cfg = ap.parse_args()
    if cfg.quick:
        cfg.reps, cfg.p, cfg.n = 2, "128", "32"
        if cfg.types == ap.get_default("types"):
            cfg.types = "Q4_1,Q4_0"
    cfg.p = [int(x) for x in cfg.p.split(",") if x]
    cfg.n = [int(x) for x in cfg.n.split(",") if x]
    cases = [c.strip() for c in cfg.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        ap.error(f"unknown cases {bad}; choose from {ALL_CASES}")
    types = [x.strip().upper() for x in cfg.types.split(",") if x.strip()]
    known = SYNTH_TYPES if cfg.synth else list(FTYPES)
    bad = [x for x in types if x not in known]
    if bad:
        ap.error(f"unknown types {bad}; choose from {known}")
    os.environ["LLAMAD_BIN"] = cfg.llamad
    if cfg.synth:
        models = {w: synthesized(cfg.llamactl, cfg.model, cfg.synth, w, cfg.models_dir) for w in types}
    else:
        models = {w: quantized(cfg.model, w, cfg.models_dir) for w in types}
    base = models.get("Q4_1", cfg.model)
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_start": os.getloadavg(),
           "threads": cfg.threads, "reps": cfg.reps, "n_prompt": cfg.p, "n_gen": cfg.n, "types": types,
           "cases": cases}
    t = Table()
    if "a" in cases:
        case_a(cfg, models, t, res)
    if "b" in cases:
        case_b(cfg, base, t, res)
    if "c" in cases:
        case_c(cfg, base, t, res)
    if "fa" in cases:
        case_fa(cfg, base, t, res)
    if "d" in cases:
        case_d(cfg, base, t, res)
    if "e" in cases:
        case_e(cfg, base, t, res)
    if "bw" in cases:
        case_bw(cfg, models, t, res)
    res["loadavg_end"] = os.getloadavg()
    res["table"] = [r for k, r in t.rows if k == "row"]
    text = t.render()
    print(text)
    print(f"\nload average at start {res['loadavg_start'][0]:.2f}, at end {res['loadavg_end'][0]:.2f} "
          f"({os.cpu_count()} CPUs): figures from a busy machine are not comparable between runs.")
    os.makedirs(cfg.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"compare-{stamp}.json", "compare.json"):
        with open(os.path.join(cfg.out_dir, name), "w") as f:
            json.dump(res, f, indent=1)
    with open(os.path.join(cfg.out_dir, "compare.md"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {cfg.out_dir}/compare-{stamp}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
