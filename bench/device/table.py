"""The markdown tables of bench/device/scaling.sh from its JSON lines (no third-party modules).

Usage: python3 bench/device/table.py scaling.jsonl
"""

import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    bw = {r["n_threads"]: r["avg_gbps"] for r in rows if r.get("test") == "mem_read"}
    ours, theirs, two = {}, {}, []
    bytes_per_token = None
    for r in rows:
        side = r.get("side")
        kind = "pp" if r.get("n_prompt", 0) > 0 else "tg"
        if side == "llamactl":
            ours[(r["n_threads"], kind)] = r["avg_ts"]
            bytes_per_token = r.get("model_bytes_per_token", bytes_per_token)
        elif side == "llama.cpp":
            theirs[(r["n_threads"], kind)] = r["avg_ts"]
        elif side == "llamactl-2x":
            two.append(r)
    threads = sorted({t for t, _ in ours} | {t for t, _ in theirs})
    out = []
    out.append("| threads | llamactl pp | llama.cpp pp | ratio | llamactl tg | llama.cpp tg | ratio "
               "| tg scaling ours / llama.cpp | read GB/s | tg × bytes/token: ours / llama.cpp |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    ratio = lambda a, b: "-" if not a or not b else f"{a / b:.2f}"
    t1 = threads[0] if threads else None
    for t in threads:
        op, tp = ours.get((t, "pp")), theirs.get((t, "pp"))
        og, tgv = ours.get((t, "tg")), theirs.get((t, "tg"))
        sc = "-"
        if t1 is not None and og and tgv and ours.get((t1, "tg")) and theirs.get((t1, "tg")):
            sc = f"{og / ours[(t1, 'tg')]:.2f}x / {tgv / theirs[(t1, 'tg')]:.2f}x"
        frac = "-"
        if bytes_per_token and bw.get(t) and og and tgv:
            f = lambda ts: ts * bytes_per_token / (bw[t] * 1e9)
            frac = f"{100 * f(og):.0f}% / {100 * f(tgv):.0f}%"
        out.append(f"| {t} | {fmt(op)} | {fmt(tp)} | {ratio(op, tp)} | {fmt(og)} | {fmt(tgv)} | {ratio(og, tgv)} "
                   f"| {sc} | {fmt(bw.get(t))} | {frac} |")
    if two:
        n = max(threads) if threads else None
        out.append("")
        out.append(f"| configuration | pp t/s | tg t/s | vs one llamactl process of {n} threads (pp / tg) |")
        out.append("|---|---:|---:|---|")
        modes = {}
        for r in two:
            kind = "pp" if r.get("n_prompt", 0) > 0 else "tg"
            modes.setdefault(r.get("split_mode", "?"), {})[kind] = r["avg_ts"]
        for mode, v in modes.items():
            w = two[0].get("worker_threads", "?")
            rel = f"{ratio(v.get('pp'), ours.get((n, 'pp')))} / {ratio(v.get('tg'), ours.get((n, 'tg')))}"
            out.append(f"| 2 llamad x {w} threads, split {mode} | {fmt(v.get('pp'))} | {fmt(v.get('tg'))} | {rel} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
