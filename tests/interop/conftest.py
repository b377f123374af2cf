"""Fixtures for the interop tests: model path, server pools, and the run report.

Environment:
  LLAMAD_MODEL      the SmolLM2-135M-Instruct Q4_1 gguf (default: models/ in the checkout)
  LLAMAD_BIN        the llamad binary (llamad tests fail when it is missing)
  LLAMAD_INTEROP=0  skip every interop test (the only way to skip them)
  LLAMAD_INTEROP_REPORT  where to write the JSON report (default: target/interop-report.json)
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import peer  # noqa: E402

# These tests compare llamactl's texts and graphs with llama.cpp's bit for bit: split mode layer
# (llamactl's default `auto` may pick row, which sums partial products in another order).
os.environ.setdefault("LLAMACTL_SPLIT_MODE", "layer")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLAMAD_INTEROP") == "0":
        skip = pytest.mark.skip(reason="LLAMAD_INTEROP=0")
        for item in items:
            item.add_marker(skip)


class Report:
    """Results gathered during the session; printed at the end and written as JSON."""

    def __init__(self):
        self.prompts = []
        self.configs = {}  # config name -> {"texts", "tokens", "speeds", "devices", "buffers"}
        self.cache = {}

    def add(self, name: str, result: "peer.MasterResult") -> None:
        self.configs[name] = {
            "texts": result.texts(),
            "tokens": result.tokens(),
            "speeds": result.speeds(),
            "devices": result.devices,
            "model_buffers_mib": result.model_buffers(),
        }

    def comparison(self) -> dict:
        """llamad speed relative to the reference server, per matching configuration."""
        out = {}
        for name, c in self.configs.items():
            if not name.startswith("llamad "):
                continue
            ref = self.configs.get("reference " + name[len("llamad ") :])
            if not ref:
                continue
            out[name[len("llamad ") :]] = {
                k: (c["speeds"][k] / ref["speeds"][k] if ref["speeds"][k] else None) for k in ("prompt_tok_s", "gen_tok_s")
            }
        return out

    def to_json(self) -> dict:
        return {"prompts": self.prompts, "configs": self.configs, "llamad_vs_reference": self.comparison(), "cache": self.cache}


_REPORT = Report()


@pytest.fixture(scope="session")
def report() -> Report:
    return _REPORT


@pytest.fixture(scope="session")
def model() -> str:
    path = os.environ.get("LLAMAD_MODEL") or os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        raise RuntimeError(f"model {path} not found: run scripts/fetch-model.sh and set LLAMAD_MODEL")
    return os.path.abspath(path)


@pytest.fixture(scope="session", autouse=True)
def peer_present():
    """The reference peer must be importable in this Python: fail (not skip) otherwise."""
    if os.environ.get("LLAMAD_INTEROP") == "0":
        return
    import _ggml

    _ggml.lib_dir()  # raises with a clear message when llama_cpp or its RPC library is missing


class ServerPool:
    """Lazily started servers of one kind, restarted when one has died (e.g. crashed in a test)."""

    def __init__(self, start):
        self.start = start
        self.servers = []

    def get(self, n: int):
        for i, s in enumerate(self.servers):
            if not s.alive():
                s.stop()
                self.servers[i] = self.start()
        while len(self.servers) < n:
            self.servers.append(self.start())
        return self.servers[:n]

    def stop(self):
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="session")
def reference_pool():
    pool = ServerPool(lambda: peer.start_reference_server(threads=1))
    yield pool
    pool.stop()


@pytest.fixture(scope="session")
def llamad_pool():
    peer.llamad_bin()  # fail early with a clear message when LLAMAD_BIN is missing
    pool = ServerPool(lambda: peer.start_llamad(threads=1))
    yield pool
    pool.stop()


def _fmt_speed(s: dict) -> str:
    return f"prompt {s['prompt_tok_s']:7.1f} tok/s ({s['prompt_tokens']:3d} tok)  gen {s['gen_tok_s']:6.1f} tok/s ({s['gen_tokens']:3d} tok)  load {s['load_s']:.2f}s"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rep = _REPORT
    if not rep.configs and not rep.cache:
        return
    tr = terminalreporter
    tr.section("interop report")
    base = rep.configs.get("local-cpu fa=off")
    if base:
        tr.write_line("greedy text (local CPU, flash attention off):")
        for p, t in zip(rep.prompts, base["texts"]):
            tr.write_line(f"  {p[:40]!r:44} -> {t!r}")
    fa = rep.configs.get("local-cpu fa=on")
    if fa and base and fa["texts"] != base["texts"]:
        tr.write_line("greedy text differing with flash attention on (local CPU):")
        for p, a, b in zip(rep.prompts, base["texts"], fa["texts"]):
            if a != b:
                tr.write_line(f"  {p[:40]!r:44} -> {b!r}")
    tr.write_line("speeds (llama.cpp perf counters, summed over prompts; 1 thread everywhere):")
    for name, c in rep.configs.items():
        tr.write_line(f"  {name:28} {_fmt_speed(c['speeds'])}")
    for name, r in rep.comparison().items():
        tr.write_line(f"  llamad / reference {name:12} prompt x{r['prompt_tok_s']:.2f}  gen x{r['gen_tok_s']:.2f}")
    for name, c in rep.cache.items():
        tr.write_line(f"  cache {name}: {json.dumps(c)}")
    path = os.environ.get("LLAMAD_INTEROP_REPORT") or os.path.join(ROOT, "target", "interop-report.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rep.to_json(), f, indent=1)
    tr.write_line(f"report written to {path}")
