"""llamad's numerics profile reproduces the llama.cpp build it names (issue 25, point 3).

llama.cpp's master (the peer's ``run_master``) generates the same greedy tokens over one llamad worker
started with ``--numerics`` = the peer's build (``avx2`` for the AVX2 baseline wheel, ``avx512`` for a
native build on an AVX-512 CPU; ``peer_build.py`` asks the peer's ggml which) as over llama.cpp's own
RPC server of that build, with flash attention off and on, on test_interop.py's prompts.

``LLAMAD_INTEROP_NUMERICS=NAME`` runs llamad with another profile instead (to measure how many prompts
a mismatched profile keeps; the assertion message counts them).
"""

import os

import pytest

import peer
from test_interop import MASTER_TIMEOUT, N_TOKENS, PROMPTS, run_remote

_reference = {}


def reference(model, reference_pool, fa: bool) -> "peer.MasterResult":
    """llama.cpp's master over llama.cpp's own RPC server (the peer's build), once per FA setting."""
    if fa not in _reference:
        servers = reference_pool.get(1)
        _reference[fa] = run_remote("reference", model, servers, fa)
    return _reference[fa]


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_llamad_profile_matches_reference_server_of_the_peer_build(model, report, reference_pool, fa):
    profile = os.environ.get("LLAMAD_INTEROP_NUMERICS") or peer.peer_numerics()
    ref = reference(model, reference_pool, fa)
    with peer.start_llamad(threads=1, numerics=profile) as server:
        res = peer.run_master(model, PROMPTS, N_TOKENS, endpoints=[server.endpoint], flash_attn=fa,
                              timeout=MASTER_TIMEOUT)
    name = f"llamad --numerics {profile} vs reference ({peer.peer_numerics()} build) fa={'on' if fa else 'off'}"
    report.add(name, res)
    assert len(res.runs) == len(ref.runs) == len(PROMPTS)
    same = sum(r["tokens"] == b["tokens"] for r, b in zip(res.runs, ref.runs))
    print(f"{name}: {same} of {len(PROMPTS)} prompts give the same tokens")
    # Known gap (issue 26): with flash attention on, ggml computes prompts of 64 and more query rows in
    # a tiled f32 order llamad does not reproduce yet; under the native AVX-512 build that changes the
    # greedy text of test_interop.py's 135-token prompt. Such prompts are reported, not failed.
    def known_gap(r) -> bool:
        return fa and len(r["prompt_tokens"]) >= 64
    diffs, gaps = [], []
    for r, b in zip(res.runs, ref.runs):
        if r["tokens"] != b["tokens"]:
            line = f"  prompt {r['prompt'][:40]!r}:\n    reference: {b['text']!r}\n    llamad:    {r['text']!r}"
            (gaps if known_gap(b) else diffs).append(line)
    if gaps:
        print(f"{name}: {len(gaps)} prompt(s) of 64+ tokens differ with FA on (issue 26):\n" + "\n".join(gaps))
    assert not diffs, f"{name}: {same} of {len(PROMPTS)} prompts match\n" + "\n".join(diffs)
