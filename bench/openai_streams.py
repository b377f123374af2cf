#!/usr/bin/env python3
"""Throughput of llamad's OpenAI API with 1 (sequential), 4 and 8 concurrent greedy streams.

Starts `llamad --openai-listen` (one model, 8 slots, in-process) as tests/openai does, warms it up,
then per row prints aggregate tokens/s, its ratio to one stream, the mean time to first token, and
llamad's CPU milliseconds per generated token (from /proc: on a busy machine the wall-clock rates
move with the other processes' load, CPU per token much less). The load average is printed with
each row; compare ratios measured in the same run.

    target/openai-venv/bin/python bench/openai_streams.py [--bin target/release/llamad]
        [--threads 2] [--tokens 64] [--reps 1] [--workers N [--worker-threads 1]]

With `--workers N` the model runs on N local llamad workers (`[[models]] workers`, each started
with `-t WORKER_THREADS`, split by layers, the default) instead of in-process, in the one slot a
model on workers has; the CPU column then counts the serving llamad and its workers together.

Environment as tests/openai (LLAMAD_MODEL). Needs the `openai` package (scripts/test.sh's venv).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/openai"))


def cpu_secs(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/llamad"))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--worker-threads", default="1")
    a = ap.parse_args()
    os.environ["LLAMAD_BIN"] = a.bin
    os.environ["LLAMAD_OPENAI_THREADS"] = a.threads
    import test_openai as t  # noqa: E402 (reads the environment above)

    ports = [t.free_port() for _ in range(a.workers)]
    workers = [
        subprocess.Popen([a.bin, "--port", str(p), "--admin-listen", "off", "-t", a.worker_threads],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in ports
    ]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for p in ports:
                t.wait_port(p)
            model = f'[[models]]\nname = "smol"\npath = "{t.MODEL}"\nctx = 512\n'
            if workers:
                # A model on workers has one slot (`parallel` > 1 is refused there).
                model += "workers = [%s]\n" % ", ".join(f'"127.0.0.1:{p}"' for p in ports)
            else:
                model += "parallel = 8\n"
            s = t.Server(Path(tmp), model)
            pids = [s.proc.pid] + [w.pid for w in workers]
            try:
                c = s.client()
                while c.models.list().data[0].model_extra["state"] == "loading":
                    time.sleep(0.2)
                t.concurrent(c, t.PROMPTS, 4)
                where = f"{a.workers} workers of {a.worker_threads} threads" if workers else f"{a.threads} threads"
                print(f"llamad {a.bin}, {where}, SmolLM2-135M Q4_1, greedy, {a.tokens} tokens per stream")
                print("| streams | aggregate tokens/s | vs one | mean TTFT | llamad CPU ms/token | load avg |")
                print("|---|---|---|---|---|---|")
                for _ in range(a.reps):
                    one = None
                    for k in (1, 4, 8):
                        load = os.getloadavg()[0]
                        c0 = sum(cpu_secs(p) for p in pids)
                        if k == 1:
                            out, t0 = {}, time.time()
                            for i, p in enumerate(t.PROMPTS):
                                t.stream_text(c, p, a.tokens, out, i)
                            secs = time.time() - t0
                        else:
                            out, secs = t.concurrent(c, t.PROMPTS[:k], a.tokens)
                        cpu = sum(cpu_secs(p) for p in pids) - c0
                        n = sum(o["tokens"] for o in out.values())
                        rate = n / secs
                        one = one or rate
                        ttft = sum(o["ttft"] for o in out.values()) / len(out)
                        print(f"| {k} | {rate:.1f} | {rate / one:.2f}x | {ttft * 1000:.0f} ms | {cpu * 1000 / n:.2f} | {load:.2f} |")
            finally:
                s.stop()
    finally:
        for w in workers:
            w.terminate()
            w.wait()


if __name__ == "__main__":
    main()
