"""Greedy text of real requantized models through llamad equals llama.cpp's (issue 25).

SmolLM2 is requantized once with llama.cpp's own quantizer (``llama_model_quantize`` through the
peer's Python) into the git-ignored ``models/requant/``: Q4_K_M, Q5_K_M, Q6_K, Q8_0 and IQ4_XS. The
576-wide rows of SmolLM2 are not whole 256-element super-blocks, so llama.cpp falls back to other types
for some tensors; ``tensor_types`` lists what each file really holds (printed, and in the report).

``Q4_0`` (every layer matrix Q4_0) is made the same way for the local-CPU test below.

For each file, llama.cpp's master with every layer on one llamad worker (running the numerics profile
that reproduces the peer's build: ``avx2`` for the AVX2 baseline, ``avx512`` for a native AVX-512 build)
must give the tokens of the same master with the layers on llama.cpp's own RPC server; so must
``llamactl run`` with the layers on that worker. llama.cpp's local CPU repacks some types into its
CPU_REPACK buffers (Q4_K, Q4_0, IQ4_NL, ...), whose kernels sum in another order, so its text may
differ from its own RPC server's (``test_local_cpu_vs_reference_server`` records where). ``llamactl run``
in-process follows the local CPU's order for the repacked types it reproduces (``LOCAL_REPRODUCED``,
``compute::quant::local``), so in-process it must give llama.cpp's local text for files whose repacked
types are all reproduced (``test_llamactl_in_process_matches_local_cpu``: Q4_0, Q4_K_M, IQ4_XS), and the
RPC server's text for files with none.

Environment: as test_interop.py (LLAMAD_BIN, LLAMAD_MODEL); ``LLAMAD_REQUANT_DIR`` overrides the
directory of the requantized files.
"""

import collections
import json
import os
import subprocess
import sys

import pytest

import peer
from conftest import ROOT

# test_interop.py's prompts, plus digits, code, a non-English prompt and one over 128 tokens.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Q: What is 12 times 7?\nA:",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to "
    "synthesize foods from carbon dioxide and water. In a few sentences, explain why this process "
    "matters for life on Earth and what would happen without it:",
    "3.14159265358979 + 2.71828182845904 = ",
    "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 10; i++) {\n",
    "La tour Eiffel a été construite pour l'Exposition universelle de",
    " ".join(
        [
            "The history of computing is a story of abstraction layered upon abstraction.",
            "Early machines were programmed by rewiring panels and flipping switches, and every",
            "program was tied to the hardware it ran on. Assembly languages gave names to machine",
            "instructions; compilers then translated higher-level languages into those instructions,",
            "and operating systems hid the details of devices behind files and processes. Each layer",
            "let programmers think about larger problems while trusting the layers below. Today a",
            "single line of code in a scripting language may set in motion interpreters, virtual",
            "machines, libraries, kernels and microcode, all cooperating to produce a result.",
            "Summarize the main idea of this paragraph in one sentence:",
        ]
    ),
]
N_TOKENS = 32
MASTER_TIMEOUT = float(os.environ.get("LLAMAD_INTEROP_TIMEOUT", "300"))
FTYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS"]
# Files for the in-process comparison with llama.cpp's local CPU.
LOCAL_FTYPES = ["Q4_0", "Q4_K_M", "IQ4_XS"]

_REQUANT = r"""
import ctypes, sys, llama_cpp
inp, out, ftype = sys.argv[1], sys.argv[2], sys.argv[3]
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
p.allow_requantize = True
p.nthread = 2
rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(p))
sys.exit(rc)
"""


def requant_dir() -> str:
    return os.environ.get("LLAMAD_REQUANT_DIR") or os.path.join(ROOT, "models", "requant")


@pytest.fixture(scope="session")
def requantized(model):
    """ftype name -> path of SmolLM2 requantized by llama.cpp (made once, kept in models/requant/)."""
    out = {}
    os.makedirs(requant_dir(), exist_ok=True)
    for ft in FTYPES + [f for f in LOCAL_FTYPES if f not in FTYPES]:
        path = os.path.join(requant_dir(), f"SmolLM2-135M-Instruct.{ft}.gguf")
        if not os.path.isfile(path):
            tmp = path + ".part"
            proc = subprocess.run(
                [sys.executable, "-c", _REQUANT, model, tmp, ft], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            assert proc.returncode == 0 and os.path.isfile(tmp), proc.stdout.decode(errors="replace")[-3000:]
            os.replace(tmp, path)
        out[ft] = path
    return out


def tensor_types(path: str) -> dict:
    """GGML type name -> number of tensors of that type in the file."""
    import gguf

    r = gguf.GGUFReader(path)
    return dict(collections.Counter(t.tensor_type.name for t in r.tensors))


_results = {}


@pytest.fixture(scope="module", autouse=True)
def dump_results():
    """Writes every run's texts and tokens to target/interop-weight-types.json (for comparisons with
    other masters, e.g. llamactl)."""
    yield
    out = {
        f"{kind} {os.path.basename(path)}": {"texts": r.texts(), "tokens": r.tokens()}
        for (kind, path), r in _results.items()
    }
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    with open(os.path.join(ROOT, "target", "interop-weight-types.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "runs": out}, f, indent=1)


def run(kind: str, path: str, endpoints=()) -> "peer.MasterResult":
    key = (kind, path)
    if key not in _results:
        res = peer.run_master(path, PROMPTS, N_TOKENS, endpoints=endpoints, timeout=MASTER_TIMEOUT)
        for r in res.runs:
            assert r["tokens"], f"{kind} generated nothing for {r['prompt']!r}"
        _results[key] = res
    return _results[key]


@pytest.fixture(scope="module")
def reference_server():
    s = peer.start_reference_server(threads=1)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llamad_worker():
    """One llamad worker with the profile of the peer's build (peer.start_llamad's default)."""
    s = peer.start_llamad(threads=1)
    yield s
    s.stop()


def matching(res, ref) -> list:
    return [a["tokens"] == b["tokens"] for a, b in zip(res.runs, ref.runs)]


def diff_text(name, res, ref) -> str:
    return "\n".join(
        f"  prompt {b['prompt'][:40]!r}:\n    reference: {b['text']!r}\n    {name}: {a['text']!r}"
        for a, b in zip(res.runs, ref.runs)
        if a["tokens"] != b["tokens"]
    )


@pytest.mark.parametrize("ftype", FTYPES)
def test_requantized_file_types(requantized, ftype):
    """The file holds the type its name says for most weights (the fallbacks are listed)."""
    types = tensor_types(requantized[ftype])
    print(f"{ftype}: {types}")
    main = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "IQ4_XS": "IQ4_XS"}[ftype]
    assert types.get(main, 0) > 0, types


@pytest.mark.parametrize("ftype", FTYPES)
def test_llamad_matches_reference_server(requantized, reference_server, llamad_worker, ftype):
    path = requantized[ftype]
    ref = run("reference", path, [reference_server.endpoint])
    res = run("llamad", path, [llamad_worker.endpoint])
    ok = matching(res, ref)
    print(f"{ftype}: llamad ({peer.peer_numerics()}) = reference server on {sum(ok)}/{len(ok)} prompts")
    assert all(ok), f"{ftype}: llamad differs from llama.cpp's RPC server:\n" + diff_text("llamad", res, ref)


# Types llama.cpp's x86 AVX2 CPU backend repacks into CPU_REPACK buffers on its local CPU (repack.cpp,
# ggml_repack_get_optimal_repack_type; Q2_K too in an AVX-512 build). An RPC server's buffers are not
# repacked.
REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
# Of those, the ones whose local order llamactl's in-process runs reproduce (compute::quant::local).
LOCAL_REPRODUCED = {"Q4_0", "IQ4_NL", "MXFP4", "Q4_K"}


def repacked_types(path: str) -> set:
    """The types of `path` llama.cpp's local CPU of the peer's build repacks (Q2_K too natively)."""
    types = REPACKED | ({"Q2_K"} if peer.peer_numerics() == "avx512" else set())
    return types & set(tensor_types(path))


@pytest.mark.parametrize("ftype", FTYPES)
def test_local_cpu_vs_reference_server(requantized, reference_server, ftype):
    """llama.cpp's local CPU equals its own RPC server unless the file holds a type the local CPU
    repacks (CPU_REPACK changes the kernels' summation order); then the difference is only recorded,
    and the RPC server is the reference for llamad."""
    path = requantized[ftype]
    repacked = sorted(REPACKED & set(tensor_types(path)))
    ref = run("reference", path, [reference_server.endpoint])
    loc = run("local", path)
    ok = matching(loc, ref)
    print(f"{ftype}: local CPU = reference server on {sum(ok)}/{len(ok)} prompts (repacked types: {repacked})")
    if not repacked:
        assert all(ok), f"{ftype}: local CPU differs from its RPC server:\n" + diff_text("local", loc, ref)


def llamactl_texts(path: str, workers=None) -> list:
    """`llamactl run` greedy texts of every prompt (one run per prompt), with the layers on `workers`
    (endpoints) or in-process (with the profile of the peer's build)."""
    texts = []
    for prompt in PROMPTS:
        argv = [peer.llamactl_bin(), "run", "-m", path, "-p", prompt, "-n", str(N_TOKENS), "--temp", "0", "-t", "1",
                "-c", "512", "--flash-attn", "off", "--no-progress"]
        if workers:
            argv += ["--workers", ",".join(workers)]
        elif not os.environ.get("LLAMAD_NUMERICS"):
            argv += ["--numerics", peer.peer_numerics()]
        out = subprocess.run(argv, capture_output=True, timeout=MASTER_TIMEOUT)
        assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
        text = out.stdout.decode(errors="replace")
        texts.append(text[:-1] if text.endswith("\n") else text)
    return texts


@pytest.mark.parametrize("where", ["llamad-worker", "in-process"])
@pytest.mark.parametrize("ftype", FTYPES)
def test_llamactl_matches_reference_server(requantized, reference_server, llamad_worker, ftype, where):
    """Our own master gives the text of llama.cpp's master on llama.cpp's RPC server, with the layers on
    one llamad worker and in-process (both in the profile of the peer's build), every prompt."""
    path = requantized[ftype]
    if where == "in-process" and repacked_types(path) & LOCAL_REPRODUCED:
        pytest.skip("in-process follows llama.cpp's local CPU here: test_llamactl_in_process_matches_local_cpu")
    ref = run("reference", path, [reference_server.endpoint])
    if where == "in-process":
        got = llamactl_texts(path)
    else:
        got = llamactl_texts(path, workers=[llamad_worker.endpoint])
    want = [r["text"] for r in ref.runs]
    ok = [a == b for a, b in zip(got, want)]
    print(f"{ftype}: llamactl ({where}) = reference server on {sum(ok)}/{len(ok)} prompts")
    diffs = [f"  {p[:40]!r}:\n    reference: {b!r}\n    llamactl:  {a!r}" for p, a, b in zip(PROMPTS, got, want) if a != b]
    assert not diffs, f"{ftype}: llamactl ({where}) differs from llama.cpp on its RPC server:\n" + "\n".join(diffs)


@pytest.mark.parametrize("ftype", LOCAL_FTYPES)
def test_llamactl_in_process_matches_local_cpu(requantized, ftype):
    """`llamactl run` in-process gives llama.cpp's local CPU text (llama-cpp-python, no RPC, greedy),
    every prompt, when the file's repacked types are all reproduced; else the matches are recorded
    and the test is an expected failure naming the types whose local order is missing."""
    path = requantized[ftype]
    repacked = repacked_types(path)
    missing = sorted(repacked - LOCAL_REPRODUCED)
    loc = run("local", path)
    got = llamactl_texts(path)
    want = [r["text"] for r in loc.runs]
    ok = [a == b for a, b in zip(got, want)]
    print(f"{ftype}: llamactl in-process ({peer.peer_numerics()}) = llama.cpp local CPU on {sum(ok)}/{len(ok)} "
          f"prompts (repacked: {sorted(repacked)}, local order not reproduced: {missing})")
    diffs = [f"  {p[:40]!r}:\n    local CPU: {b!r}\n    llamactl:  {a!r}" for p, a, b in zip(PROMPTS, got, want) if a != b]
    if diffs and missing:
        pytest.xfail(f"{ftype}: the local order of {missing} is not reproduced ({sum(ok)}/{len(ok)} prompts match)")
    assert not diffs, f"{ftype}: llamactl in-process differs from llama.cpp's local CPU:\n" + "\n".join(diffs)
