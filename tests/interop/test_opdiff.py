"""Differential op tests: single-op graphs sent to llamad and to llama.cpp's RPC server, results compared.

Each case (tests/interop/opcases.py) builds its inputs from the same seed for both servers; the results must
agree within the stated normalized mean squared error. ggml's own kernels differ from ours only in float
summation order (and flash attention keeps its V accumulator in f16), so the bounds sit far below what a
wrong layout, broadcast or parameter would give (those show up as NMSE ~1e-3 to 1).
"""

import numpy as np
import pytest

import opcases
import peer
import rpcclient

# Normalized MSE bounds: float summation order only (exact ops must match bit for bit).
NMSE_BOUND = {"flash_attn": 1e-5}
DEFAULT_NMSE = 1e-10
EXACT = ("set_rows", "cont", "scale", "get_rows", "add", "rms_norm")

CASES = opcases.all_cases() + opcases.extra_cases()


@pytest.fixture(scope="module")
def servers():
    ref = peer.start_reference_server(threads=1)
    lld = peer.start_llamad(threads=1)
    yield ref, lld
    ref.stop()
    lld.stop()


@pytest.mark.parametrize("name,build", CASES, ids=[c[0] for c in CASES])
def test_op_matches_reference(servers, name, build):
    ref, lld = servers
    outs = []
    for port in (ref.port, lld.port):
        nodes, inputs, outputs = build(np.random.default_rng(1234))
        outs.append(rpcclient.run_graph(port, nodes, inputs, outputs)[0])
    dt = np.float16 if outputs[0].type == "f16" else np.float32
    a = np.frombuffer(outs[0], dtype=dt).astype(np.float64)
    b = np.frombuffer(outs[1], dtype=dt).astype(np.float64)
    assert a.shape == b.shape
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), "non-finite values differ"
    fin = np.isfinite(a)
    nmse = np.sum((a[fin] - b[fin]) ** 2) / max(np.sum(a[fin] ** 2), 1e-30)
    if name.startswith(EXACT):
        assert outs[0] == outs[1], f"{name}: expected bit-identical results, nmse {nmse:.3e}"
    bound = next((v for k, v in NMSE_BOUND.items() if k in name), DEFAULT_NMSE)
    assert nmse <= bound, f"{name}: nmse {nmse:.3e} > {bound:.0e}"
