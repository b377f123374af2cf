"""Distributed inference over emulated networks: llamactl (split mode layer and row, over llamad
workers) and llama.cpp's master (layer split, over its own ggml-rpc-server), one link profile at a
time; driven by bench/network.sh, which builds the binaries and picks the peer.

Each worker runs in its own network namespace. The master stays in this one. All nodes are joined
by `llamad-netem` (bench/netem), a userspace link emulator: one TUN device per node, moved into the
node's namespace with the address 10.213.0.<node + 1>/24, and every packet between two nodes goes
through an emulated link with the profile's rate, one-way delay and jitter (netem is not in every
kernel: this machine's has only tbf/htb/pfifo). Worker-to-worker traffic (split mode row's linked
workers) crosses the same links. Only the namespaces' own addresses are used.

Profiles (rate, one-way delay, jitter; a round trip costs twice the delay):
  lo    no delay, no rate limit (the emulator's own round trip, about loopback's)
  25g   25 Gbit/s, 50 µs        10g   10 Gbit/s, 100 µs
  1g    1 Gbit/s, 300 µs        wifi  300 Mbit/s, 2 ms ± 0.5 ms
The emulator itself moves a few Gbit/s on a small machine (printed as `emulator_max`), so the 25g
and 10g profiles are bounded by it there; their delays are exact.

Prints one line per profile and mode, `PROFILE MODE pp=<t/s> tg=<t/s>`, then a table; writes
target/bench/network.json. Exit status 0 when every mode completed on every profile.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))

PROFILES = {
    "lo": {"rate_mbit": 0, "delay_us": 0, "jitter_us": 0},
    "25g": {"rate_mbit": 25000, "delay_us": 50, "jitter_us": 0},
    "10g": {"rate_mbit": 10000, "delay_us": 100, "jitter_us": 0},
    "1g": {"rate_mbit": 1000, "delay_us": 300, "jitter_us": 0},
    "wifi": {"rate_mbit": 300, "delay_us": 2000, "jitter_us": 500},
}
QUICK_PROFILES = ["lo", "1g", "wifi"]
MODES = ["layer", "row", "auto", "llama.cpp-layer"]
NET = "10.213.0"
PREFIX = "llnet"


def log(msg: str) -> None:
    print(f"[network {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def why_unavailable() -> str:
    """Empty when namespaces and TUN devices can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no tun module)"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip() or r.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


class Network:
    """The emulator and one namespace per worker; torn down on exit."""

    def __init__(self, netem: str, workers: int, profile: dict, seed: int = 1):
        self.n = workers
        self.ns = [f"{PREFIX}w{i + 1}" for i in range(workers)]
        self.log = tempfile.NamedTemporaryFile(prefix="netem-", suffix=".log", delete=False)
        argv = [netem, "--nodes", str(workers + 1), "--prefix", PREFIX, "--delay-us", str(profile["delay_us"]),
                "--jitter-us", str(profile["jitter_us"]), "--rate-mbit", str(profile["rate_mbit"]),
                "--seed", str(seed)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"llamad-netem did not start: {open(self.log.name).read()[-2000:]}")
        try:
            self._configure()
        except BaseException:
            self.close()
            raise

    def _configure(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a leftover of a killed run
            sh("ip", "netns", "add", ns)
        for node in range(self.n + 1):
            dev = f"{PREFIX}{node}"
            ip = ["ip"] if node == 0 else ["ip", "-n", self.ns[node - 1]]
            if node:
                sh("ip", "link", "set", dev, "netns", self.ns[node - 1])
                sh(*ip, "link", "set", "lo", "up")
            sh(*ip, "link", "set", dev, "mtu", "65000")
            sh(*ip, "addr", "add", f"{NET}.{node + 1}/24", "dev", dev)
            sh(*ip, "link", "set", dev, "up")

    @staticmethod
    def address(worker: int) -> str:
        return f"{NET}.{worker + 2}"

    def exec_in(self, worker: int) -> list:
        return ["ip", "netns", "exec", self.ns[worker]]

    def rtt_us(self, samples: int = 40) -> float:
        """Median TCP round trip (one byte each way) from here to worker 0, microseconds."""
        port = 9
        code = ("import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                f"s.bind(('{self.address(0)}',{port}));s.listen()\nc,_=s.accept()\n"
                "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
                "while True:\n d=c.recv(1)\n if not d: break\n c.sendall(d)\n")
        srv = subprocess.Popen(self.exec_in(0) + [sys.executable, "-c", code])
        try:
            c = connect((self.address(0), port), 10)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ts = []
            for _ in range(samples):
                t = time.perf_counter()
                c.sendall(b"p")
                c.recv(1)
                ts.append(time.perf_counter() - t)
            c.close()
            ts.sort()
            return ts[len(ts) // 2] * 1e6
        finally:
            srv.kill()
            srv.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(addr, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(addr, timeout=2)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Workers:
    """`count` RPC servers of one kind, worker i in namespace i, on port 50052 of its address."""

    def __init__(self, net: Network, kind: str, count: int, threads: int, llamad: str):
        self.procs, self.logs, self.endpoints = [], [], []
        self.cache = tempfile.TemporaryDirectory(prefix="network-cache-")
        try:
            for i in range(count):
                host, port = net.address(i), 50052
                if kind == "llamad":
                    argv = [llamad, "-H", host, "-p", str(port), "-t", str(threads), "--allow", f"{NET}.0/24"]
                else:
                    argv = [sys.executable, os.path.join(ROOT, "tests", "interop", "ref_server.py"), "-H", host,
                            "-p", str(port), "-t", str(threads)]
                env = dict(os.environ, LLAMAD__ADMIN__ENABLED="false",
                           LLAMA_CACHE=os.path.join(self.cache.name, f"w{i}"))
                lf = tempfile.NamedTemporaryFile(prefix=f"network-{kind}-{i}-", suffix=".log", delete=False)
                self.logs.append(lf.name)
                self.procs.append(subprocess.Popen(net.exec_in(i) + argv, stdout=lf, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, env=env))
                self.endpoints.append(f"{host}:{port}")
            for i, ep in enumerate(self.endpoints):
                host, port = ep.rsplit(":", 1)
                deadline = time.monotonic() + 30
                while True:
                    if self.procs[i].poll() is not None:
                        raise RuntimeError(f"{kind} worker {i} exited: {open(self.logs[i]).read()[-2000:]}")
                    try:
                        # ggml-rpc-server serves one connection at a time: close the probe at once.
                        socket.create_connection((host, int(port)), timeout=1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{kind} worker {i} did not listen on {ep}")
                        time.sleep(0.1)
            time.sleep(0.2)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in self.logs:
            try:
                os.unlink(f)
            except OSError:
                pass
        self.cache.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def llamactl_bench(cfg, endpoints, mode: str) -> dict:
    argv = [cfg.llamactl, "bench", "-m", cfg.model, "-p", str(cfg.p), "-n", str(cfg.n), "-r", str(cfg.reps),
            "-t", "1", "-o", "json", "--workers", ",".join(endpoints), "--split-mode", mode]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=cfg.timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llamactl bench --split-mode {mode} failed ({r.returncode}): {r.stderr[-3000:]}")
    rows = json.loads(r.stdout)
    out = {"pp": rows_speed(rows, "pp"), "tg": rows_speed(rows, "tg")}
    chosen = [ln for ln in r.stderr.splitlines() if "split mode auto:" in ln]
    if chosen:
        out["auto"] = chosen[-1].split("split mode auto:", 1)[1].split()[0]
        out["auto_detail"] = chosen[-1].strip()
    return out


def lcpp_bench(cfg, endpoints) -> dict:
    with tempfile.TemporaryDirectory(prefix="network-lcpp-") as tmp:
        a, o = os.path.join(tmp, "args.json"), os.path.join(tmp, "out.json")
        with open(a, "w") as f:
            json.dump({"model": cfg.model, "endpoints": list(endpoints), "threads": 1, "reps": cfg.reps,
                       "n_prompt": [cfg.p], "n_gen": [cfg.n], "load_only": False}, f)
        r = subprocess.run([sys.executable, os.path.join(HERE, "lcpp_bench.py"), a, o], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=cfg.timeout)
        if r.returncode != 0 or not os.path.exists(o):
            raise RuntimeError(f"llama.cpp bench failed ({r.returncode}): {r.stdout.decode(errors='replace')[-3000:]}")
        with open(o) as f:
            rows = json.load(f)["results"]
    return {"pp": rows_speed(rows, "pp"), "tg": rows_speed(rows, "tg")}


def rows_speed(rows, kind: str) -> float:
    for r in rows:
        if (kind == "pp" and r["n_prompt"] and not r["n_gen"]) or (kind == "tg" and r["n_gen"] and not r["n_prompt"]):
            return float(r["avg_ts"])
    raise RuntimeError(f"no {kind} row in {rows}")


def emulator_max_mbit(net: Network) -> float:
    """What the emulator moves here on an unlimited link (a 1 s bulk send to worker 0)."""
    port = 10
    code = (f"import socket\ns=socket.socket();s.bind(('{net.address(0)}',{port}));s.listen()\nc,_=s.accept()\n"
            "while c.recv(1<<20): pass\n")
    srv = subprocess.Popen(net.exec_in(0) + [sys.executable, "-c", code])
    try:
        c = connect((net.address(0), port), 10)
        buf, n, t = b"x" * (1 << 20), 0, time.perf_counter()
        while time.perf_counter() - t < 1.0:
            c.sendall(buf)
            n += len(buf)
        c.close()
        return n * 8 / (time.perf_counter() - t) / 1e6
    finally:
        srv.kill()
        srv.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamactl", required=True)
    ap.add_argument("--llamad", required=True)
    ap.add_argument("--netem", required=True, help="the llamad-netem binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per bench run")
    ap.add_argument("--quick", action="store_true", help=f"profiles {','.join(QUICK_PROFILES)}, pp32/tg8, 1 rep")
    ap.add_argument("--check-auto", action="store_true",
                    help="fail when split mode auto picked the slower mode where layer and row generation "
                         "differ by more than a third, on profiles with a round trip of 0.5 ms or more")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench", "network.json"))
    cfg = ap.parse_args()
    if cfg.quick:
        cfg.reps, cfg.p, cfg.n = 1, 32, 8
        if cfg.profiles == ap.get_default("profiles"):
            cfg.profiles = ",".join(QUICK_PROFILES)
    profiles = [p for p in cfg.profiles.split(",") if p]
    modes = [m for m in cfg.modes.split(",") if m]
    bad = [p for p in profiles if p not in PROFILES] + [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown profiles or modes {bad} (profiles {list(PROFILES)}, modes {MODES})")
    reason = why_unavailable()
    if reason:
        print(f"network bench skipped: {reason}")
        return 0
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": os.path.basename(cfg.model),
           "workers": cfg.workers, "p": cfg.p, "n": cfg.n, "reps": cfg.reps, "loadavg_start": os.getloadavg(),
           "profiles": {}}
    failed = []
    for name in profiles:
        prof = PROFILES[name]
        entry = dict(prof)
        with Network(cfg.netem, cfg.workers, prof) as net:
            entry["rtt_us"] = round(net.rtt_us(), 1)
            entry["emulator_max_mbit"] = round(emulator_max_mbit(net), 0)
            log(f"{name}: rtt {entry['rtt_us']} us, emulator moves up to {entry['emulator_max_mbit']:.0f} Mbit/s")
            for mode in modes:
                kind = "reference" if mode.startswith("llama.cpp") else "llamad"
                t0 = time.monotonic()
                try:
                    with Workers(net, kind, cfg.workers, 1, cfg.llamad) as w:
                        if kind == "reference":
                            r = lcpp_bench(cfg, w.endpoints)
                        else:
                            r = llamactl_bench(cfg, w.endpoints, mode)
                except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
                    failed.append(f"{name}/{mode}")
                    log(f"{name} {mode} FAILED: {e}")
                    entry[mode] = {"error": str(e)[-2000:]}
                    continue
                r["seconds"] = round(time.monotonic() - t0, 1)
                entry[mode] = r
                extra = f" ({r['auto']})" if "auto" in r else ""
                print(f"{name} {mode} pp={r['pp']:.1f} tg={r['tg']:.1f}{extra}", flush=True)
        res["profiles"][name] = entry
        verdict = auto_verdict(entry)
        if verdict:
            entry["auto_verdict"] = verdict
            log(f"{name}: {verdict}")
            # Checked only where the network decides (a round trip of 0.5 ms or more): on a fast link
            # the choice also hangs on how busy the machine is (see master/src/auto_split.rs).
            if cfg.check_auto and verdict.startswith("WRONG") and entry["rtt_us"] >= 500:
                failed.append(f"{name}/auto-choice")
    res["loadavg_end"] = os.getloadavg()
    print()
    print(render(res, profiles, modes))
    os.makedirs(os.path.dirname(cfg.out), exist_ok=True)
    with open(cfg.out, "w") as f:
        json.dump(res, f, indent=1)
    if failed:
        print(f"\nfailed: {' '.join(failed)}")
        return 1
    return 0


def auto_verdict(entry: dict) -> str:
    """Whether split mode auto picked the faster of layer and row for generation (when both ran and
    differ clearly: by a third or more)."""
    auto, layer, row = entry.get("auto", {}), entry.get("layer", {}), entry.get("row", {})
    if "auto" not in auto or "tg" not in layer or "tg" not in row:
        return ""
    faster = "row" if row["tg"] > layer["tg"] else "layer"
    ratio = max(row["tg"], layer["tg"]) / max(min(row["tg"], layer["tg"]), 1e-9)
    if ratio < 4 / 3:
        return f"auto picked {auto['auto']}; layer and row within a third (tg {layer['tg']:.1f} vs {row['tg']:.1f})"
    if auto["auto"] == faster:
        return f"auto picked {auto['auto']}, the faster (tg x{ratio:.2f})"
    return f"WRONG: auto picked {auto['auto']}, but {faster} generates x{ratio:.2f} faster"


def render(res: dict, profiles, modes) -> str:
    head = (f"{res['model']}, {res['workers']} workers x 1 thread, pp{res['p']} / tg{res['n']} t/s "
            f"(llamactl modes over llamad; llama.cpp-layer: llama.cpp's master over its ggml-rpc-server)")
    cols = ["profile", "rtt µs"] + [f"{m} pp" for m in modes] + [f"{m} tg" for m in modes]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name in profiles:
        e = res["profiles"][name]
        cells = [name, f"{e['rtt_us']:.0f}"]
        for k in ("pp", "tg"):
            for m in modes:
                r = e.get(m, {})
                cells.append(f"{r[k]:.1f}" if k in r else "failed")
        lines.append("| " + " | ".join(cells) + " |")
    picks = [f"{n}: {res['profiles'][n]['auto']['auto']}" for n in profiles
             if "auto" in res["profiles"][n].get("auto", {})]
    if picks:
        lines += ["", "split mode auto picked " + ", ".join(picks)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
