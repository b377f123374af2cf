"""Load of a multi-GB model over RPC: llamactl + llamad against llama.cpp's master, same run (issue 27).

Driven by bench/load.sh, which builds the binaries and picks the native peer. A `llamactl synth`
model (by default the 8B layer shape cut to 16 layers, Q4_0: 2.1 GiB) is loaded onto N workers
(default 2, one thread each, every layer offloaded, llama.cpp's layer split by free memory) by:

  ours        llamactl run (the master) over llamad workers with their tensor cache (-c)
  lcpp+llamad llama.cpp's master (llama-cpp-python 0.3.36 through ctypes) over the same llamad workers
  lcpp+rpc    llama.cpp's master over its own reference RPC servers with their cache (-c)

each twice: cold (empty worker caches; for llamactl also no hash memo of the model) and warm (fresh
worker processes over the caches the cold load filled). The load time is the master's own figure
(llamactl's "load time", llama.cpp's wall time of llama_model_load_from_file); both include the
upload. Each worker's /proc/PID/status is read when the load is over and the model still loaded
(VmRSS, RssAnon: private memory, RssFile: mapped file pages, such as cache objects mapped in;
VmHWM: the peak so far), and for llamactl once more at the end of its one generated token
(interleaved weight copies are made on the first compute, so anonymous memory grows then).

Prints a markdown table and writes it, with the raw figures, to target/bench/load-<time>.{md,json}.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
sys.path.insert(0, HERE)

import peer  # noqa: E402
from compare import synthesized  # noqa: E402

MIB = 1 << 20
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def log(msg: str) -> None:
    print(f"[load {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def proc_status(pid: int) -> dict:
    """The memory fields of /proc/PID/status, bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in FIELDS:
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def du(path: str) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(d, name))
            except OSError:
                pass
    return total


def start_workers(kind: str, caches: list, threads: int) -> list:
    out = []
    try:
        for c in caches:
            if kind == "rpc":
                out.append(peer.start_reference_server(threads=threads, cache_dir=c))
            else:
                out.append(peer.start_llamad(threads=threads, extra_args=["-c", "--cache-dir", c]))
    except BaseException:
        for s in out:
            s.stop()
        raise
    return out


def run_llamactl(cfg, model: str, workers: list, xdg: str) -> dict:
    """llamactl run over `workers`; the workers' memory read once every worker's upload is reported."""
    env = dict(os.environ, XDG_CACHE_HOME=xdg)
    argv = [cfg.llamactl, "run", "-m", model, "-p", "hi", "-n", "1", "--temp", "0", "-c", "256", "-t", "1",
            "--no-progress", "--workers", ",".join(w.endpoint for w in workers)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    # Every worker with layers reports "loading" when its upload starts (all at once: one thread each)
    # and "loaded" when it is over.
    loading, loaded, lines, after_load, load_s = 0, 0, [], None, None
    for line in proc.stderr:
        lines.append(line.rstrip())
        loading += line.startswith("llamactl: loading ")
        if line.startswith("llamactl: loaded "):
            loaded += 1
            if loaded == loading:
                after_load = [proc_status(w.proc.pid) for w in workers]
        if "load time =" in line:
            load_s = float(line.split("=")[1].split()[0]) / 1000.0
    # The end of the run: the last token generated, the connection about to close.
    rc = proc.wait(timeout=1800)
    if rc != 0 or load_s is None or after_load is None:
        raise RuntimeError(f"llamactl run failed ({rc}):\n" + "\n".join(lines[-40:]))
    return {"load_s": load_s, "after_load": after_load, "log": [x for x in lines if x.startswith("llamactl: load")]}


def run_lcpp(cfg, model: str, workers: list) -> dict:
    argv = [sys.executable, os.path.join(HERE, "lcpp_load.py"), model, ",".join(w.endpoint for w in workers)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        res = json.loads(line) if line.strip() else {"error": "no output"}
        if "load_s" not in res:
            raise RuntimeError(f"llama.cpp's load failed: {res}\n{proc.stderr.read()[-4000:]}")
        after = [proc_status(w.proc.pid) for w in workers]
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"load_s": res["load_s"], "after_load": after}


def one(cfg, who: str, model: str, scratch: str) -> dict:
    """Cold then warm load for one configuration, over fresh caches."""
    caches = [os.path.join(scratch, f"{who}-w{i}") for i in range(cfg.workers)]
    xdg = os.path.join(scratch, f"{who}-xdg")
    for d in caches + [xdg]:
        os.makedirs(d, exist_ok=True)
    kind = "rpc" if who == "lcpp+rpc" else "llamad"
    out = {}
    try:
        for phase in ("cold", "warm"):
            la = os.getloadavg()[0]
            workers = start_workers(kind, caches, cfg.threads)
            try:
                idle = [proc_status(w.proc.pid) for w in workers]
                r = run_llamactl(cfg, model, workers, xdg) if who == "ours" else run_lcpp(cfg, model, workers)
                # After the master is gone (llamactl: its token generated and the connection closed;
                # llama.cpp: the model freed): the peak over the whole run.
                time.sleep(0.2)
                r["end"] = [proc_status(w.proc.pid) for w in workers]
            finally:
                for w in workers:
                    w.stop()
            r["idle"] = idle
            r["loadavg"] = la
            r["cache_bytes"] = [du(c) for c in caches]
            out[phase] = r
            log(f"{who} {phase}: {r['load_s']:.2f} s (load average {la:.2f}); after load "
                + "; ".join(f"anon {s.get('RssAnon', 0) / MIB:.0f} file {s.get('RssFile', 0) / MIB:.0f} MiB"
                            for s in r["after_load"]))
    finally:
        for d in caches + [xdg]:
            shutil.rmtree(d, ignore_errors=True)
    return out


def table(res: dict, model_bytes: int) -> str:
    rows = ["| master + workers | load | s | load avg | worker | peak RSS (VmHWM) | after load: RSS | anon | file "
            "| cache on disk |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    names = {"ours": "llamactl + llamad", "lcpp+llamad": "llama.cpp + llamad", "lcpp+rpc": "llama.cpp + rpc-server"}
    for who, phases in res["runs"].items():
        for phase, r in phases.items():
            for i, s in enumerate(r["after_load"]):
                first = i == 0
                rows.append("| {} | {} | {} | {} | {} | {:.0f} MiB | {:.0f} MiB | {:.0f} MiB | {:.0f} MiB | {:.0f} MiB |"
                            .format(names[who] if first else "", phase if first else "",
                                    f"{r['load_s']:.2f}" if first else "", f"{r['loadavg']:.2f}" if first else "",
                                    i, r["end"][i].get("VmHWM", s.get("VmHWM", 0)) / MIB, s.get("VmRSS", 0) / MIB,
                                    s.get("RssAnon", 0) / MIB, s.get("RssFile", 0) / MIB, r["cache_bytes"][i] / MIB))
    ratio = []
    for who in res["runs"]:
        p = res["runs"][who]
        ratio.append(f"{names[who]}: cold {p['cold']['load_s']:.2f} s, warm {p['warm']['load_s']:.2f} s "
                     f"(cold/warm {p['cold']['load_s'] / p['warm']['load_s']:.1f}x)")
    if "ours" in res["runs"] and "lcpp+rpc" in res["runs"]:
        o, t = res["runs"]["ours"], res["runs"]["lcpp+rpc"]
        ratio.append(f"llama.cpp + rpc-server / llamactl + llamad: cold {t['cold']['load_s'] / o['cold']['load_s']:.2f}x, "
                     f"warm {t['warm']['load_s'] / o['warm']['load_s']:.2f}x (higher: llamactl faster)")
    head = f"model: {res['model']} ({model_bytes / MIB:.0f} MiB), {res['workers']} workers of {res['threads']} thread(s)"
    return "\n".join([head, "", *rows, "", *[f"- {x}" for x in ratio]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamactl", required=True)
    ap.add_argument("--llamad", required=True)
    ap.add_argument("--vocab-from", required=True, help="the GGUF whose tokenizer the synthesized model copies")
    ap.add_argument("--models-dir", required=True, help="where the synthesized model goes (made once)")
    ap.add_argument("--shape", default="8b:16", help="llamactl synth shape[:layers] (default 8b:16, 2.1 GiB Q4_0)")
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--who", default="ours,lcpp+llamad,lcpp+rpc")
    ap.add_argument("--quick", action="store_true", help="the 8B shape cut to 4 layers (0.7 GiB)")
    ap.add_argument("--scratch", default=None, help="where the worker caches go (default: a temporary folder "
                    "next to --models-dir, removed afterwards)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"))
    cfg = ap.parse_args()
    if cfg.quick:
        cfg.shape = "8b:4"
    os.environ["LLAMAD_BIN"] = cfg.llamad
    model = synthesized(cfg.llamactl, cfg.vocab_from, cfg.shape, cfg.type, cfg.models_dir)
    scratch = tempfile.mkdtemp(prefix="load-", dir=cfg.scratch or cfg.models_dir)
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": os.path.basename(model), "shape": cfg.shape,
           "workers": cfg.workers, "threads": cfg.threads, "loadavg_start": os.getloadavg(), "runs": {}}
    try:
        for who in [w.strip() for w in cfg.who.split(",") if w.strip()]:
            res["runs"][who] = one(cfg, who, model, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res["loadavg_end"] = os.getloadavg()
    text = table(res, os.path.getsize(model))
    text += (f"\n\nload average at start {res['loadavg_start'][0]:.2f}, at end {res['loadavg_end'][0]:.2f} "
             f"({os.cpu_count()} CPUs)")
    print(text)
    os.makedirs(cfg.out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(cfg.out_dir, f"load-{stamp}.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(cfg.out_dir, f"load-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {cfg.out_dir}/load-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
