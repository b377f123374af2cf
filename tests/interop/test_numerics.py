"""llamad's numerics profile reproduces the llama.cpp build it names (issue 25, point 3).

llama.cpp's master (the peer's ``run_master``) generates the same greedy tokens over one llamad worker
started with ``--numerics`` = the peer's build (``avx2`` for the AVX2 baseline wheel, ``avx512`` for a
native build on an AVX-512 CPU; ``peer_build.py`` asks the peer's ggml which) as over llama.cpp's own
RPC server of that build, with flash attention off and on, on test_interop.py's prompts; with
flash attention on also in micro-batches of 64 tokens, so that the 135-token prompt spans three
(ggml's tiled path for the two 64-row ones, the second after 64 cached tokens; its per-row path for
the last 7 rows).

``LLAMAD_INTEROP_NUMERICS=NAME`` runs llamad with another profile instead (to measure how many prompts
a mismatched profile keeps; the assertion message counts them).
"""

import os

import pytest

import peer
from test_interop import MASTER_TIMEOUT, N_TOKENS, PROMPTS

_reference = {}

# (flash attention, prompt batch): llama.cpp's default batch of 512, and with FA on batches of 64.
SETTINGS = [(False, None), (True, None), (True, 64)]


def reference(model, reference_pool, fa: bool, n_batch) -> "peer.MasterResult":
    """llama.cpp's master over llama.cpp's own RPC server (the peer's build), once per setting."""
    key = (fa, n_batch)
    if key not in _reference:
        servers = reference_pool.get(1)
        _reference[key] = peer.run_master(model, PROMPTS, N_TOKENS, endpoints=[s.endpoint for s in servers],
                                          flash_attn=fa, n_batch=n_batch, timeout=MASTER_TIMEOUT)
    return _reference[key]


@pytest.mark.parametrize("fa,n_batch", SETTINGS, ids=["fa-off", "fa-on", "fa-on-ubatch64"])
def test_llamad_profile_matches_reference_server_of_the_peer_build(model, report, reference_pool, fa, n_batch):
    profile = os.environ.get("LLAMAD_INTEROP_NUMERICS") or peer.peer_numerics()
    ref = reference(model, reference_pool, fa, n_batch)
    with peer.start_llamad(threads=1, numerics=profile) as server:
        res = peer.run_master(model, PROMPTS, N_TOKENS, endpoints=[server.endpoint], flash_attn=fa,
                              n_batch=n_batch, timeout=MASTER_TIMEOUT)
    name = (f"llamad --numerics {profile} vs reference ({peer.peer_numerics()} build) fa={'on' if fa else 'off'}"
            + (f" batch={n_batch}" if n_batch else ""))
    report.add(name, res)
    assert len(res.runs) == len(ref.runs) == len(PROMPTS)
    same = sum(r["tokens"] == b["tokens"] for r, b in zip(res.runs, ref.runs))
    print(f"{name}: {same} of {len(PROMPTS)} prompts give the same tokens")
    diffs = [
        f"  prompt {r['prompt'][:40]!r} ({len(b['prompt_tokens'])} tokens):\n    reference: {b['text']!r}\n"
        f"    llamad:    {r['text']!r}"
        for r, b in zip(res.runs, ref.runs)
        if r["tokens"] != b["tokens"]
    ]
    assert not diffs, f"{name}: {same} of {len(PROMPTS)} prompts match\n" + "\n".join(diffs)
