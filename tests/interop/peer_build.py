"""Which llamad numerics profile reproduces the reference peer's build: asks the peer's own ggml CPU
library which instruction sets it was compiled for (``ggml_cpu_has_avx512``, ``ggml_cpu_has_avx2``).

``python peer_build.py`` prints the profile (``avx512``, ``avx2`` or ``portable``); the Rust test
harnesses (``e2e::server``, ``compute/tests/peer_support``) run it with the peer's Python.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _ggml  # noqa: E402


def numerics() -> str:
    """llamad's ``--numerics`` name for the ggml build in this Python's llama-cpp-python wheel."""
    _ggml.load("libggml-base")
    cpu = _ggml.load("libggml-cpu")
    for name in ("ggml_cpu_has_avx512", "ggml_cpu_has_avx2"):
        getattr(cpu, name).restype = ctypes.c_int
    if cpu.ggml_cpu_has_avx512():
        return "avx512"
    if cpu.ggml_cpu_has_avx2():
        return "avx2"
    return "portable"


if __name__ == "__main__":
    print(numerics())
