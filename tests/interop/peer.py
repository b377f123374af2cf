"""Library for the interop tests: start reference/llamad RPC servers and run llama.cpp masters.

Everything here runs under the reference peer's Python (llama-cpp-python 0.3.36 built with RPC,
see tests/peer/build-peer.sh). Servers and masters are subprocesses: the reference server blocks
its process, and RPC device registration in ggml is process-global, so each master
configuration needs a fresh process (ref: ggml-rpc-protocol.md §11.1, §11.6).
"""

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))

# Server ports stay below the ephemeral range (32768+) that the master's many short
# connections draw from (ref: llama-cpp-python-peer.md, "Behaviour worth knowing").
PORT_RANGE = (20000, 32000)


def free_port() -> int:
    """A port in PORT_RANGE that nothing listens on right now."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        if not port_taken(port):
            return port
    raise RuntimeError("no free port found below 32768")


def listens(pid: int, port: int) -> Optional[bool]:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (IPv4): its socket inodes
    against the LISTEN rows of /proc/net/tcp. None when /proc cannot say."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open("/proc/net/tcp") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return None
    for row in rows:
        f = row.split()
        if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
            return True
    return False


def port_taken(port: int) -> bool:
    """Whether something holds 127.0.0.1:port (a bind fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class PortTaken(RuntimeError):
    """The server exited because another process took its port first."""


def wait_port(port: int, proc: subprocess.Popen, timeout: float, what: str, log_path: str) -> None:
    """Waits until the process itself listens on 127.0.0.1:port (a connection that succeeds counts
    where /proc cannot tell): a probe could otherwise reach another test's server that took the
    port first. Raises PortTaken when the process exits with its port held by another."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"{what} exited with status {proc.returncode} before listening:\n{_tail(log_path)}"
            raise PortTaken(msg) if port_taken(port) else RuntimeError(msg)
        mine = listens(proc.pid, port)
        if mine:
            return
        if mine is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s:\n{_tail(log_path)}")


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"


@dataclass
class Server:
    """A running server process; stops (kills) it on ``stop()`` or when leaving a ``with`` block."""

    kind: str
    port: int
    proc: subprocess.Popen
    log_path: str

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return _tail(self.log_path, 100_000)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Kills the process and removes its log (kept when LLAMAD_INTEROP_KEEP_LOGS=1)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if os.environ.get("LLAMAD_INTEROP_KEEP_LOGS") != "1":
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spawn(kind: str, argv: Sequence[str], port: int, env=None, timeout: float = 30.0) -> Server:
    log = tempfile.NamedTemporaryFile(prefix=f"interop-{kind}-{port}-", suffix=".log", delete=False)
    proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=HERE)
    log.close()
    server = Server(kind, port, proc, log.name)
    try:
        wait_port(port, proc, timeout, kind, log.name)
    except BaseException:
        server.stop()
        raise
    return server


def _spawn_on_free_port(kind: str, argv, port: Optional[int], env=None) -> Server:
    """``_spawn(kind, argv(port), port)``; without a given port, on a free one, and on another when
    a different process takes it before the server binds it."""
    if port:
        return _spawn(kind, argv(port), port, env=env)
    for _ in range(3):
        port = free_port()
        try:
            return _spawn(kind, argv(port), port, env=env)
        except PortTaken:
            pass
    port = free_port()
    return _spawn(kind, argv(port), port, env=env)


def start_reference_server(port: Optional[int] = None, cache_dir: Optional[str] = None, threads: int = 1) -> Server:
    """llama.cpp's RPC server (CPU device) from the wheel's libraries, on 127.0.0.1:port."""
    def argv(port: int) -> List[str]:
        extra = ["--cache-dir", cache_dir] if cache_dir else []
        return [sys.executable, os.path.join(HERE, "ref_server.py"), "-p", str(port), "-t", str(threads), *extra]

    return _spawn_on_free_port("reference", argv, port)


def llamactl_bin() -> str:
    """`$LLAMACTL_BIN`, else `llamactl` next to the llamad binary under test."""
    path = os.environ.get("LLAMACTL_BIN") or os.path.join(os.path.dirname(llamad_bin()), "llamactl")
    if not os.path.isfile(path):
        raise RuntimeError(f"llamactl not found at {path}: build it (cargo build --release) or set LLAMACTL_BIN")
    return path


def llamad_bin() -> str:
    path = os.environ.get("LLAMAD_BIN", "")
    if not path:
        raise RuntimeError("LLAMAD_BIN is not set (path to the llamad binary)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise RuntimeError(f"LLAMAD_BIN={path} is not an executable file")
    return path


# The reference peer (llama-cpp-python 0.3.36) speaks RPC protocol 7.0.0, and a master refuses a
# server of another major: llamad is told to announce 7 unless a test asks for another version.
PEER_PROTOCOL = 7


_PEER_NUMERICS: List[str] = []


def peer_numerics() -> str:
    """llamad's numerics profile reproducing this Python's llama.cpp build (``peer_build.py``, run in
    a child process so that this one loads no ggml library)."""
    if not _PEER_NUMERICS:
        out = subprocess.run([sys.executable, os.path.join(HERE, "peer_build.py")], capture_output=True,
                             text=True, timeout=60, check=True)
        _PEER_NUMERICS.append(out.stdout.strip())
    return _PEER_NUMERICS[0]


def start_llamad(
    port: Optional[int] = None,
    threads: int = 1,
    extra_args: Sequence[str] = (),
    env_extra=None,
    protocol: Optional[int] = PEER_PROTOCOL,
    numerics: Optional[str] = None,
) -> Server:
    """``$LLAMAD_BIN -H 127.0.0.1 -p PORT -t N --protocol P [extra_args]`` (ggml-rpc-server compatible
    flags, §10.1; ``protocol=None`` leaves llamad's default, 8). ``numerics`` is passed as
    ``--numerics``; by default llamad reproduces the peer's build (``LLAMAD_NUMERICS`` overrides)."""
    env = dict(os.environ)
    if numerics is None and not env.get("LLAMAD_NUMERICS"):
        numerics = peer_numerics()
    if numerics:
        extra_args = ["--numerics", numerics, *extra_args]
    # Several workers run side by side here: none of them needs the admin API (port 50053).
    env.setdefault("LLAMAD__ADMIN__ENABLED", "false")
    env.update(env_extra or {})
    binary = llamad_bin()
    return _spawn_on_free_port(
        "llamad",
        lambda p: [
            binary, "-H", "127.0.0.1", "-p", str(p), "-t", str(threads),
            *(["--protocol", str(protocol)] if protocol is not None else []), *extra_args,
        ],
        port,
        env=env,
    )


@dataclass
class MasterResult:
    devices: List[str]
    load_s: float
    runs: List[dict]
    eos: int = -1
    stderr: str = field(repr=False, default="")

    def texts(self) -> List[str]:
        return [r["text"] for r in self.runs]

    def tokens(self) -> List[List[int]]:
        return [r["tokens"] for r in self.runs]

    def speeds(self) -> dict:
        """Aggregate prompt and generation tokens/s over all prompts (llama.cpp's perf counters)."""
        n_p = sum(r["n_p_eval"] for r in self.runs)
        t_p = sum(r["t_p_eval_ms"] for r in self.runs)
        n_g = sum(r["n_eval"] for r in self.runs)
        t_g = sum(r["t_eval_ms"] for r in self.runs)
        return {
            "prompt_tokens": n_p,
            "prompt_tok_s": n_p / (t_p / 1000.0) if t_p > 0 else 0.0,
            "gen_tokens": n_g,
            "gen_tok_s": n_g / (t_g / 1000.0) if t_g > 0 else 0.0,
            "load_s": self.load_s,
        }

    def model_buffers(self) -> dict:
        """Device name -> model buffer MiB, from llama.cpp's load log ('<dev> model buffer size = X MiB')."""
        out = {}
        for line in self.stderr.splitlines():
            if "model buffer size" in line and "=" in line:
                name = line.split("model buffer size")[0].split(":", 1)[-1].strip()
                try:
                    out[name] = float(line.split("=")[1].split()[0])
                except (IndexError, ValueError):
                    pass
        return out


def run_master(
    model: str,
    prompts: Sequence[str],
    n_tokens: int = 32,
    endpoints: Sequence[str] = (),
    flash_attn: bool = False,
    n_gpu_layers: Optional[int] = None,
    n_threads: int = 1,
    seed: int = 1234,
    n_ctx: int = 512,
    timeout: float = 300.0,
    logits_dir: Optional[str] = None,
    n_batch: Optional[int] = None,
) -> MasterResult:
    """Runs ref_master.py in a fresh process: loads the model (layers on the endpoints' RPC devices
    when any, else the local CPU) and returns greedy completions of ``n_tokens`` for each prompt
    (``n_batch``: the prompt's batch and micro-batch, llama.cpp's 512 when None)."""
    if n_gpu_layers is None:
        n_gpu_layers = 99 if endpoints else 0
    with tempfile.TemporaryDirectory(prefix="interop-master-") as tmp:
        args_path = os.path.join(tmp, "args.json")
        out_path = os.path.join(tmp, "out.json")
        with open(args_path, "w") as f:
            json.dump(
                {
                    "model": model,
                    "endpoints": list(endpoints),
                    "n_gpu_layers": n_gpu_layers,
                    "flash_attn": flash_attn,
                    "n_ctx": n_ctx,
                    "seed": seed,
                    "n_threads": n_threads,
                    "prompts": list(prompts),
                    "n_tokens": n_tokens,
                    "logits_dir": logits_dir,
                    "n_batch": n_batch,
                },
                f,
            )
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "ref_master.py"), args_path, out_path],
            cwd=HERE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
        log = proc.stdout.decode("utf-8", errors="replace")
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"master (endpoints={list(endpoints)}) failed with status {proc.returncode}:\n{log[-6000:]}")
        with open(out_path) as f:
            res = json.load(f)
    return MasterResult(res["devices"], res["load_s"], res["runs"], res.get("eos", -1), log)
