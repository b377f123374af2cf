"""llamad interoperates with the real llama.cpp (llama-cpp-python 0.3.36, RPC protocol 7.0.0).

(a) The harness itself is proven against llama.cpp's own RPC server: greedy text through one or
    two reference servers equals llama.cpp's local CPU text, with flash attention on and off.
(b) The same with one and two llamad workers in place of the reference servers.
(c) The tensor cache: with the cache on, the second model load answers SET_TENSOR_HASH with 1
    and no tensor larger than 10 MiB is sent again (observed through proxy.py).
Ref: ggml-rpc-protocol.md §9, §11.6, §15 items 29 and 32.
"""

import json
import os
import tempfile
import time

import pytest

import peer
import proxy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Q: What is 12 times 7?\nA:",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to "
    "synthesize foods from carbon dioxide and water. In a few sentences, explain why this process "
    "matters for life on Earth and what would happen without it:",
    "Der schnelle braune Fuchs springt über den faulen Hund, und dann",
    "import numpy as np\n\ndef softmax(x):\n    # subtract the max for stability (x has shape [n, 16])\n",
    "In 2023 the city recorded 1,284 births, 907 deaths and 3.5% growth; in 2024 the figures were",
    # Over 128 tokens: the prompt's attention spans more than one 128-cell block.
    "The history of the printing press begins long before Gutenberg. In China, woodblock printing was "
    "used as early as the seventh century to reproduce texts and images on paper and cloth, and movable "
    "type made of baked clay was described by Shen Kuo in the eleventh century. Korean printers later "
    "cast metal type and produced books such as the Jikji in 1377. In Europe, Johannes Gutenberg combined "
    "a screw press, oil-based ink and an adjustable mould for casting uniform metal letters around 1450, "
    "which made printing fast and cheap enough to spread across the continent within fifty years. "
    "Summarise the main steps of this history in three short bullet points:",
]
N_TOKENS = 32
MASTER_TIMEOUT = float(os.environ.get("LLAMAD_INTEROP_TIMEOUT", "180"))

_local = {}
_timed_out = set()


def local_cpu(model, report, fa: bool) -> "peer.MasterResult":
    """llama.cpp's own CPU backend, no RPC: the reference text (computed once per FA setting)."""
    if fa not in _local:
        res = peer.run_master(model, PROMPTS, N_TOKENS, flash_attn=fa, timeout=MASTER_TIMEOUT)
        for r in res.runs:
            assert r["tokens"], f"local CPU generated nothing for {r['prompt']!r}"
        _local[fa] = res
        report.prompts = PROMPTS
        report.add(f"local-cpu fa={'on' if fa else 'off'}", res)
    return _local[fa]


def run_remote(kind: str, model, servers, fa: bool) -> "peer.MasterResult":
    if kind in _timed_out:
        pytest.fail(f"an earlier {kind} master run timed out; not waiting again")
    try:
        return peer.run_master(model, PROMPTS, N_TOKENS, endpoints=[s.endpoint for s in servers], flash_attn=fa, timeout=MASTER_TIMEOUT)
    except Exception as e:
        if "timed out" in str(e).lower() or e.__class__.__name__ == "TimeoutExpired":
            _timed_out.add(kind)
        logs = "\n".join(f"--- {s.kind} {s.endpoint} alive={s.alive()}\n{s.log()[-3000:]}" for s in servers)
        raise AssertionError(f"{kind} master run failed: {e}\n{logs}") from e


def assert_layers_remote(res: "peer.MasterResult", servers) -> None:
    """Every server got a share of the model, and the CPU kept only the input embedding."""
    rpc_devs = [d for d in res.devices if d.startswith("RPC")]
    assert len(rpc_devs) == len(servers), f"expected {len(servers)} RPC devices, got {res.devices}"
    bufs = res.model_buffers()
    for s in servers:
        mib = [v for k, v in bufs.items() if k.endswith(f"[{s.endpoint}]")]
        assert mib and mib[0] > 1.0, f"no model buffer on {s.endpoint}: {bufs}"
    remote = sum(v for k, v in bufs.items() if k.startswith("RPC"))
    local = sum(v for k, v in bufs.items() if not k.startswith("RPC"))
    assert remote > 2 * local, f"most of the model should be remote: {bufs}"


def assert_same_tokens(name: str, res: "peer.MasterResult", ref: "peer.MasterResult") -> None:
    diffs = [
        f"  prompt {r['prompt'][:40]!r}:\n    local: {b['text']!r}\n    {name}: {r['text']!r}"
        for r, b in zip(res.runs, ref.runs)
        if r["tokens"] != b["tokens"]
    ]
    assert len(res.runs) == len(ref.runs) == len(PROMPTS)
    assert not diffs, f"{name} differs from llama.cpp's local CPU:\n" + "\n".join(diffs)


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_local_cpu_reference_runs(model, report, fa):
    res = local_cpu(model, report, fa)
    assert res.devices == ["CPU"]
    for r in res.runs:
        assert len(r["tokens"]) == N_TOKENS or r["tokens"][-1] == res.eos, r
        assert r["n_p_eval"] == len(r["prompt_tokens"])


@pytest.mark.parametrize("n_servers", [1, 2], ids=["1-server", "2-servers"])
@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_reference_server_matches_local_cpu(model, report, reference_pool, fa, n_servers):
    base = local_cpu(model, report, fa)
    servers = reference_pool.get(n_servers)
    res = run_remote("reference", model, servers, fa)
    report.add(f"reference x{n_servers} fa={'on' if fa else 'off'}", res)
    assert_layers_remote(res, servers)
    assert_same_tokens(f"reference x{n_servers}", res, base)


# Flash attention: ggml's CPU kernel keeps the V accumulator in f16 and converts Q to f16 for token
# generation (ggml-compute-semantics.md §3.3); llamad's does not reproduce that bit for bit yet, so its
# FA-on text drifts after some tokens (issue 3). strict=True: the marker must go once it passes.
@pytest.mark.parametrize("n_servers", [1, 2], ids=["1-worker", "2-workers"])
@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_llamad_matches_local_cpu(model, report, llamad_pool, fa, n_servers):
    base = local_cpu(model, report, fa)
    servers = llamad_pool.get(n_servers)
    res = run_remote("llamad", model, servers, fa)
    report.add(f"llamad x{n_servers} fa={'on' if fa else 'off'}", res)
    assert_layers_remote(res, servers)
    assert_same_tokens(f"llamad x{n_servers}", res, base)


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
def test_llamad_logits_close_to_local_cpu(model, llamad_pool, fa):
    """llamad as the only RPC device computes the same model as llama.cpp's CPU backend: at every prompt
    position the argmax agrees, logits correlate above 0.998 and differ by less than 3 (llama.cpp's own
    FA-on vs FA-off runs differ by up to ~0.5; a wrong op, layout or parameter gives differences of several
    units and a different argmax)."""
    import numpy as np

    (server,) = llamad_pool.get(1)
    prompts = PROMPTS[:3]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        peer.run_master(model, prompts, 1, flash_attn=fa, timeout=MASTER_TIMEOUT, logits_dir=a)
        peer.run_master(model, prompts, 1, endpoints=[server.endpoint], flash_attn=fa, timeout=MASTER_TIMEOUT,
                        logits_dir=b)
        for i, prompt in enumerate(prompts):
            x = np.load(os.path.join(a, f"logits-{i}.npy")).astype(np.float64)
            y = np.load(os.path.join(b, f"logits-{i}.npy")).astype(np.float64)
            assert x.shape == y.shape and x.shape[0] >= 4, (prompt, x.shape, y.shape)
            assert np.array_equal(x.argmax(1), y.argmax(1)), (prompt, x.argmax(1), y.argmax(1))
            diff = np.abs(x - y).max()
            corr = min(np.corrcoef(x[p], y[p])[0, 1] for p in range(x.shape[0]))
            print(f"logits {prompt[:30]!r} fa={fa}: max |diff| {diff:.3f}, min corr {corr:.6f}")
            assert diff < 3.0, (prompt, diff)
            assert corr > 0.998, (prompt, corr)


def test_proxy_sees_every_evaluation_on_the_server(model, reference_pool):
    """The proxy's parser against independent figures: one graph run per decode (prompt + each
    generated token but the last), and SET_TENSOR bytes covering the model buffer llama.cpp reports."""
    (server,) = reference_pool.get(1)
    with proxy.Proxy(server.port) as px:
        res = peer.run_master(model, PROMPTS[:2], 8, endpoints=[px.endpoint], timeout=MASTER_TIMEOUT)
        assert px.wait_closed()
        snap = px.stats.snapshot()
    assert not snap["protocol_errors"], snap["protocol_errors"]
    cmds = snap["commands"]
    graph_runs = cmds.get("GRAPH_COMPUTE", {}).get("count", 0) + cmds.get("GRAPH_RECOMPUTE", {}).get("count", 0)
    decodes = sum(1 + r["n_eval"] for r in res.runs)
    assert graph_runs == decodes, (graph_runs, decodes)
    assert cmds["HELLO"]["count"] == snap["connections"]
    (mib,) = [v for k, v in res.model_buffers().items() if k.startswith("RPC")]
    weights = mib * 1024 * 1024
    assert weights * 0.99 <= snap["set_tensor_data_bytes"] <= weights * 1.05, (snap["set_tensor_data_bytes"], weights)


def cache_second_load(model, start_server, name, report):
    """Loads the model twice through a counting proxy; returns both snapshots."""
    snaps = []
    texts = []
    loads = []
    with start_server() as server, proxy.Proxy(server.port) as px:
        for _ in range(2):
            px.stats.reset()
            res = peer.run_master(model, PROMPTS[:1], 8, endpoints=[px.endpoint], timeout=MASTER_TIMEOUT)
            assert px.wait_closed()
            snaps.append(px.stats.snapshot())
            texts.append(res.texts())
            loads.append(res.load_s)
    first, second = snaps
    keys = ("hash_hits", "hash_misses", "set_tensor_big_count", "set_tensor_data_bytes")
    report.cache[name] = {
        "first": {**{k: first[k] for k in keys}, "load_s": round(loads[0], 3)},
        "second": {**{k: second[k] for k in keys}, "load_s": round(loads[1], 3)},
    }
    return first, second, texts


def assert_cache_hits(first, second, texts):
    # The master hashes weight tensors > 10 MiB (§9): SmolLM2's token embedding (30 081 024 bytes) is one.
    assert first["hash_requests"], "the master sent no SET_TENSOR_HASH: nothing to cache"
    assert first["hash_misses"] == len(first["hash_requests"]) and first["hash_hits"] == 0, first["hash_requests"]
    assert first["set_tensor_big_count"] == len(first["hash_requests"])
    assert first["set_tensor_flagged_count"] == len(first["hash_requests"])
    assert second["hash_hits"] == len(second["hash_requests"]) == len(first["hash_requests"]), second["hash_requests"]
    assert second["set_tensor_big_count"] == 0 and second["set_tensor_big_bytes"] == 0
    assert second["set_tensor_data_bytes"] < first["set_tensor_data_bytes"] - 10 * 1024 * 1024
    assert texts[0] == texts[1]
    assert not first["protocol_errors"] and not second["protocol_errors"]


def test_reference_cache_second_load_hits(model, report):
    with tempfile.TemporaryDirectory(prefix="interop-refcache-") as cache:
        first, second, texts = cache_second_load(
            model, lambda: peer.start_reference_server(cache_dir=cache), "reference", report
        )
        files = os.listdir(cache)
    assert_cache_hits(first, second, texts)
    # File names are the FNV-1a hashes the master sent (§9).
    assert sorted(files) == sorted(h["hash"] for h in first["hash_requests"])


def test_llamad_cache_second_load_hits(model, report):
    """Same assertions for llamad with `-c` (cache under $LLAMA_CACHE, as ggml-rpc-server does)."""
    peer.llamad_bin()
    with tempfile.TemporaryDirectory(prefix="interop-llamadcache-") as cache:
        first, second, texts = cache_second_load(
            model, lambda: peer.start_llamad(extra_args=["-c"], env_extra={"LLAMA_CACHE": cache}), "llamad", report
        )
    assert_cache_hits(first, second, texts)


def test_llamad_cache_prewarmed_by_import_hits_on_first_load(model, report, tmp_path):
    """`POST /v1/cache/import` of the GGUF file before any master connects: the llama.cpp master's very
    first load then hits on every SET_TENSOR_HASH probe, sends no large tensor, and gets the same text."""
    import urllib.request

    base = local_cpu(model, report, False)
    cache = tmp_path / "cache"
    token_file = tmp_path / "admin.token"
    admin_port = peer.free_port()
    env = {"LLAMA_CACHE": str(cache), "LLAMAD__ADMIN__ENABLED": "true"}
    args = ["-c", "--admin-listen", f"127.0.0.1:{admin_port}", "--admin-token-file", str(token_file)]
    with peer.start_llamad(extra_args=args, env_extra=env) as server:
        # The RPC port accepts as soon as it is bound, before the admin API has written its token and
        # bound its own port: wait for the unauthenticated health route first.
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/v1/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "llamad's admin API did not come up within 30 s"
                time.sleep(0.1)
        req = urllib.request.Request(
            f"http://127.0.0.1:{admin_port}/v1/cache/import",
            data=json.dumps({"path": os.path.abspath(model)}).encode(),
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            imported = json.load(r)
        assert imported["tensors"] > 0 and imported["new"] == imported["tensors"], imported
        with proxy.Proxy(server.port) as px:
            res = peer.run_master(model, PROMPTS[:1], 8, endpoints=[px.endpoint], timeout=MASTER_TIMEOUT)
            assert px.wait_closed()
            snap = px.stats.snapshot()
    report.cache["llamad pre-warmed by import"] = {
        "first": {k: snap[k] for k in ("hash_hits", "hash_misses", "set_tensor_big_count", "set_tensor_data_bytes")}
        | {"load_s": round(res.load_s, 3)}
    }
    assert snap["hash_requests"], "the master sent no SET_TENSOR_HASH"
    assert snap["hash_hits"] == len(snap["hash_requests"]) and snap["hash_misses"] == 0, snap["hash_requests"]
    assert snap["set_tensor_big_count"] == 0 and snap["set_tensor_big_bytes"] == 0
    assert not snap["protocol_errors"], snap["protocol_errors"]
    assert res.tokens()[0] == base.tokens()[0][:8]


def walk_frames(data: bytes):
    """Splits a captured request stream into (cmd, payload) frames (ref: §3.1); fails on a torn frame."""
    frames, i = [], 0
    while i < len(data):
        assert i + 9 <= len(data), f"torn header at {i}"
        cmd = data[i]
        length = int.from_bytes(data[i + 1 : i + 9], "little")
        assert i + 9 + length <= len(data), f"torn payload at {i}"
        frames.append((cmd, data[i + 9 : i + 9 + length]))
        i += 9 + length
    return frames


def check_capture_dir(path: str) -> dict:
    """Every connection's stream is well-framed, opens with a 24-byte HELLO, matches its index."""
    counts = {}
    conns = sorted(f[:-4] for f in os.listdir(path) if f.endswith(".req"))
    assert conns, f"no capture in {path}"
    for conn in conns:
        with open(os.path.join(path, conn + ".req"), "rb") as f:
            frames = walk_frames(f.read())
        with open(os.path.join(path, conn + ".json")) as f:
            index = [e for e in json.load(f) if not e["elided"]]
        assert frames[0][0] == 14 and len(frames[0][1]) == 24, f"{conn} does not open with HELLO"
        assert [proxy.cmd_name(c) for c, _ in frames] == [e["cmd"] for e in index]
        assert [len(p) for _, p in frames] == [e["len"] for e in index]
        for c, _ in frames:
            counts[proxy.cmd_name(c)] = counts.get(proxy.cmd_name(c), 0) + 1
    return counts


def test_capture_session_is_well_framed(model, reference_pool, tmp_path):
    """--capture with elided weight uploads: what is kept is exactly the frames the server got."""
    (server,) = reference_pool.get(1)
    with proxy.Proxy(server.port, capture_dir=str(tmp_path), elide_set_tensor_over=65536) as px:
        peer.run_master(model, PROMPTS[:1], 8, endpoints=[px.endpoint], timeout=MASTER_TIMEOUT)
        assert px.wait_closed()
        snap = px.stats.snapshot()
    counts = check_capture_dir(str(tmp_path))
    for name, c in snap["commands"].items():
        if name != "SET_TENSOR":
            assert counts.get(name, 0) == c["count"], (name, counts.get(name), c["count"])
    elided = sum(1 for s in px.stats.set_tensor if s["data_len"] > 65536)
    assert counts.get("SET_TENSOR", 0) == snap["commands"]["SET_TENSOR"]["count"] - elided
    assert counts.get("GRAPH_COMPUTE", 0) >= 1


def test_committed_capture_is_well_framed():
    """tests/interop/captures (a reference session, see its README) stays a valid fuzz seed set."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "captures")
    counts = check_capture_dir(path)
    assert counts.get("GRAPH_COMPUTE", 0) >= 1 and counts.get("HELLO", 0) >= 10


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize(
    "workers", [("none", 0), ("llamad", 1), ("llamad", 2), ("reference", 1)],
    ids=["in-process", "1-llamad-worker", "2-llamad-workers", "reference-server"],
)
def test_llamactl_matches_local_cpu(model, report, llamad_pool, reference_pool, workers, fa):
    """Our own master (`llamactl run`, greedy, flash attention on and off) produces llama.cpp's CPU text
    token for token: in-process, with the layers on one or two llamad workers, and on llama.cpp's own RPC
    server (issue 5)."""
    import subprocess

    base = local_cpu(model, report, fa)
    kind, n = workers
    args = []
    if n:
        pool = llamad_pool if kind == "llamad" else reference_pool
        args = ["--workers", ",".join(s.endpoint for s in pool.get(n))]
    diffs = []
    for prompt, want in zip(PROMPTS, [r["text"] for r in base.runs]):
        argv = [peer.llamactl_bin(), "run", "-m", model, "-p", prompt, "-n", str(N_TOKENS), "--temp", "0", "-t", "1",
                "--flash-attn", "on" if fa else "off", "--no-progress", *args,
                # In-process compute reproduces the peer's build (LLAMAD_NUMERICS overrides).
                *([] if os.environ.get("LLAMAD_NUMERICS") else ["--numerics", peer.peer_numerics()])]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=MASTER_TIMEOUT)
        assert out.returncode == 0, out.stderr[-3000:]
        got = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout
        if got != want:
            diffs.append(f"  {prompt[:40]!r}:\n    llama.cpp: {want!r}\n    llamactl:  {got!r}")
    assert not diffs, "llamactl differs from llama.cpp's local CPU:\n" + "\n".join(diffs)


def test_llama_cpp_master_pools_memory_of_three_small_llamad(model, report):
    """Memory pooling from llama.cpp's own master: three llamad workers whose budgets (`--mem`) are each
    well below the model's size hold it together; llama.cpp splits the layers by the free memory each
    worker reports (so the worker with the larger budget gets more), and the text is llama.cpp's own.
    llama.cpp puts the output matrix (here a copy of the tied embedding, 28 MiB) on the last device
    without counting it in the split, so the last worker gets the largest budget."""
    size_mib = os.path.getsize(model) / 2**20
    budgets = [int(size_mib * 0.55), int(size_mib * 0.40), int(size_mib * 0.80)]
    servers = [peer.start_llamad(threads=1, extra_args=["--mem", f"{b}M"]) for b in budgets]
    try:
        base = local_cpu(model, report, False)
        # Micro-batches of 64: llama.cpp's compute buffer on the last device holds a micro-batch's
        # logits (vocabulary × tokens; 100 MB at 512). The prompts are shorter, so the sums are the same.
        res = peer.run_master(model, PROMPTS, N_TOKENS, endpoints=[s.endpoint for s in servers], flash_attn=False,
                              timeout=MASTER_TIMEOUT, n_batch=64)
        assert_layers_remote(res, servers)
        bufs = res.model_buffers()
        held = []
        for s, b in zip(servers, budgets):
            mib = [v for k, v in bufs.items() if k.endswith(f"[{s.endpoint}]")][0]
            assert mib < b and mib < 0.6 * size_mib, f"{s.endpoint}: {mib:.1f} MiB of a {b} MiB budget: {bufs}"
            held.append(mib)
        assert sum(held) > 0.7 * size_mib, f"the workers hold {sum(held):.1f} of {size_mib:.1f} MiB: {bufs}"
        print(f"pooled: budgets {budgets} MiB, model buffers {[round(h, 1) for h in held]} MiB of a {size_mib:.1f} MiB model")
        assert held[0] > held[1], f"the larger budget should get the larger share of the layers: {held}"
        assert_same_tokens("llama.cpp master over 3 pooled llamad", res, base)
    finally:
        for s in servers:
            s.stop()
