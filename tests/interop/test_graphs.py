"""llamactl's graphs are llama.cpp's graphs (issue 25, point 1).

For every architecture llamactl runs, llama.cpp's master (llama-cpp-python 0.3.36, ``ref_master.py``)
and ``llamactl run`` each drive llama.cpp's own RPC server through a capturing proxy (``proxy.py``),
with the same prompt, context size and number of generated tokens. Every evaluation the server
receives (the prompt's ubatches, then one per generated token) is put in ``graphdiff.py``'s canonical
form (op, type, shape, strides, op_params, flags and sources of every node, in order; leaves by type,
shape and strides, weights by name) and the two masters' sequences must be equal, node for node, with
flash attention off and on. Then the two masters computed the same thing on the same server, so they
must also have generated the same tokens, which is asserted too.

Models: ``llamactl synth`` writes a small model of each architecture (2 layers, 256 wide, SmolLM2's
tokenizer, Q8_0 matrices); the real SmolLM2 model covers the llama shape at full depth; a prompt longer
than one 512-token ubatch covers the prompt split and the output-row selection.
"""

import os
import subprocess

import pytest

import graphdiff
import peer
import proxy

ARCHS = ["llama", "mistral3", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe"]
PROMPT = "The capital of France is"
N_TOKENS = 3
TIMEOUT = float(os.environ.get("LLAMAD_INTEROP_TIMEOUT", "180"))


@pytest.fixture(scope="module")
def server():
    srv = peer.start_reference_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def synth_dir(model, tmp_path_factory):
    """One small synthetic model per architecture (written once per test session)."""
    out = tmp_path_factory.mktemp("graph-models")
    for arch in ARCHS:
        argv = [peer.llamactl_bin(), "synth", "--arch", arch, "--shape", "custom", "--embd", "256", "--ff", "512",
                "--heads", "4", "--kv-heads", "2", "--layers", "2", "--experts", "4", "--experts-used", "2",
                "--expert-ff", "128", "--shared-expert-ff", "256", "-t", "q8_0", "--vocab-from", model,
                "-o", str(out / f"{arch}.gguf")]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr[-2000:]
    return out


def capture_both(model_path, servers, tmp, prompt, n_tokens, fa, n_ctx):
    """Runs llama.cpp's master and llamactl through capturing proxies in front of `servers` (the layers
    are split across them); returns, per server, ((llama.cpp evaluations, run), (llamactl evaluations,
    text))."""
    out = []
    for who in ("cpp", "ctl"):
        caps = [os.path.join(tmp, f"{who}{i}") for i in range(len(servers))]
        proxies = [proxy.Proxy(s.port, capture_dir=c) for s, c in zip(servers, caps)]
        for px in proxies:
            px.__enter__()
        endpoints = [px.endpoint for px in proxies]
        try:
            if who == "cpp":
                res = peer.run_master(model_path, [prompt], n_tokens, endpoints=endpoints, flash_attn=fa, n_ctx=n_ctx,
                                      timeout=TIMEOUT)
                result = res.runs[0]
            else:
                argv = [peer.llamactl_bin(), "run", "-m", model_path, "-p", prompt, "-n", str(n_tokens), "--temp", "0",
                        "-t", "1", "-c", str(n_ctx), "--flash-attn", "on" if fa else "off", "--no-progress",
                        "--workers", ",".join(endpoints)]
                r = subprocess.run(argv, capture_output=True, timeout=TIMEOUT)
                assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
                text = r.stdout.decode(errors="replace")
                result = text[:-1] if text.endswith("\n") else text
        finally:
            for px in proxies:
                px.wait_closed()
                px.__exit__(None, None, None)
        out.append([(graphdiff.evaluations(c), result) for c in caps])
    return list(zip(out[0], out[1]))


def assert_same_graphs(what, cpp, ctl, n_tokens):
    (ea, run), (eb, text) = cpp, ctl
    assert len(ea) >= n_tokens, f"{what}: llama.cpp sent {len(ea)} evaluations"
    assert len(ea) == len(eb), f"{what}: llama.cpp sent {len(ea)} evaluations, llamactl {len(eb)}"
    for k, (a, b) in enumerate(zip(ea, eb)):
        d = graphdiff.diff(a, b)
        assert not d, f"{what}: evaluation {k} ({len(a.nodes)} vs {len(b.nodes)} nodes) differs:\n" + "\n".join(d)
    # The same graphs on the same server: the same tokens (compared as text, replacing invalid UTF-8
    # the same way on both sides, since a random model's tokens need not be valid UTF-8).
    want = run["text"]
    assert text == want, f"{what}: same graphs but different text: llama.cpp {want!r}, llamactl {text!r}"


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("arch", ARCHS)
def test_llamactl_graphs_equal_llamacpp(arch, fa, synth_dir, server, tmp_path):
    """Prompt and generation graphs of each architecture, flash attention off and on."""
    (cpp, ctl), = capture_both(str(synth_dir / f"{arch}.gguf"), [server], tmp_path, PROMPT, N_TOKENS, fa, 512)
    assert_same_graphs(f"{arch} fa={'on' if fa else 'off'}", cpp, ctl, N_TOKENS)


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_llamactl_graphs_equal_llamacpp_smollm2(model, fa, server, tmp_path):
    """The real model (30 layers, 9 heads over 3 KV heads, tied output), with a prompt of digits."""
    (cpp, ctl), = capture_both(model, [server], tmp_path, "Q: What is 12 times 7?\nA:", 4, fa, 512)
    assert_same_graphs(f"smollm2 fa={'on' if fa else 'off'}", cpp, ctl, 4)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3moe"])
def test_llamactl_graphs_equal_llamacpp_over_two_ubatches(arch, synth_dir, server, tmp_path):
    """A prompt of more than 512 tokens: two ubatches (the second attending the first's cells), the
    output row selection of the last one, then generation past 512 cells."""
    prompt = " ".join(f"item {i} of the list is {i * 7 % 100}." for i in range(80))
    (cpp, ctl), = capture_both(str(synth_dir / f"{arch}.gguf"), [server], tmp_path, prompt, 2, False, 1024)
    assert len(cpp[0]) == 3, f"expected two prompt ubatches and one generation step, got {len(cpp[0])}"
    assert_same_graphs(f"{arch} two ubatches", cpp, ctl, 2)


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_llamactl_graphs_equal_llamacpp_layer_split(model, fa, tmp_path):
    """SmolLM2's layers split across two servers: each server gets the same layers and the same graphs
    from both masters (llama.cpp splits by the servers' free memory, llamactl too), the first without
    the output head (its hidden state unflagged), the second with it."""
    servers = [peer.start_reference_server(), peer.start_reference_server()]
    try:
        pairs = capture_both(model, servers, tmp_path, PROMPT, N_TOKENS, fa, 512)
    finally:
        for s in servers:
            s.stop()
    for i, (cpp, ctl) in enumerate(pairs):
        (ea, _), (eb, _) = cpp, ctl
        assert len(ea) == len(eb) >= N_TOKENS, f"server {i}: {len(ea)} vs {len(eb)} evaluations"
        for k, (a, b) in enumerate(zip(ea, eb)):
            d = graphdiff.diff(a, b)
            assert not d, f"server {i} evaluation {k} differs:\n" + "\n".join(d)
    (_, run), (_, text) = pairs[-1]
    assert text == run["text"]
