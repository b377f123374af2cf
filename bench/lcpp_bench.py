"""llama.cpp's side of bench/compare.sh: llama-bench's pp/tg tests timed through llama-cpp-python.

Usage: python lcpp_bench.py ARGS.json OUT.json   (run under the reference peer's Python)

The wheel ships no llama-bench binary, so this times ``llama_decode`` the way llama-bench does:
for every test a fresh context of ``n_prompt + n_gen`` cells (llama.cpp pads it to 256), one
untimed warm-up, then ``reps`` repetitions, each after ``llama_memory_clear``: ``ppN`` decodes one
batch of N random tokens, ``tgN`` decodes N random tokens one at a time, each followed by
``llama_synchronize``. Speeds are tokens / wall seconds per repetition; the output is a JSON array
with llama-bench's fields (``n_prompt``, ``n_gen``, ``avg_ts``, ``stddev_ts``, ``samples_ts``).

ARGS.json: {"model": path, "endpoints": ["127.0.0.1:PORT", ...], "threads": 1, "reps": 3,
"n_prompt": [512], "n_gen": [128], "n_ubatch": 512, "flash_attn": false, "load_only": false}. With endpoints every layer
goes to the RPC devices (``n_gpu_layers = 99``); registration is process-global in ggml, so each
configuration runs in its own process (ref: tests/interop/ref_master.py). ``load_s`` in the output
is the wall time of ``llama_model_load_from_file`` (for RPC: including the weight upload).
"""

import ctypes
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))

import _ggml  # noqa: E402


def register_rpc(endpoints):
    if not endpoints:
        return
    ggml = _ggml.ggml()
    rpc = _ggml.ggml_rpc()
    for ep in endpoints:
        reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        if not reg:
            raise RuntimeError(f"ggml_backend_rpc_add_server({ep}) failed")
        ggml.ggml_backend_register(reg)


def stats(samples_ns, n_tokens):
    ts = [n_tokens * 1e9 / ns for ns in samples_ns]
    avg = statistics.fmean(ts)
    sd = statistics.stdev(ts) if len(ts) > 1 else 0.0
    return ts, avg, sd


def main() -> int:
    with open(sys.argv[1]) as f:
        args = json.load(f)
    endpoints = args.get("endpoints", [])
    register_rpc(endpoints)
    import llama_cpp  # after registration, so the registry already holds the RPC devices

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 99 if endpoints else 0
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(args["model"].encode(), mp)
    load_s = time.perf_counter() - t0
    if not model:
        raise RuntimeError(f"cannot load {args['model']}")
    out = {"load_s": load_s, "results": []}
    if args.get("load_only"):
        llama_cpp.llama_model_free(model)
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1)
        return 0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    threads = int(args.get("threads", 1))
    reps = int(args.get("reps", 3))
    n_ubatch = int(args.get("n_ubatch", 512))
    rng = random.Random(1234)
    tests = [(p, 0) for p in args.get("n_prompt", [512]) if p > 0]
    tests += [(0, n) for n in args.get("n_gen", [128]) if n > 0]
    for n_prompt, n_gen in tests:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_prompt + n_gen
        cp.n_batch = max(n_ubatch, n_prompt)
        cp.n_ubatch = n_ubatch
        cp.n_threads = threads
        cp.n_threads_batch = threads
        # Off unless asked (llama-bench's default and llamactl bench's); on = LLAMA_FLASH_ATTN_TYPE_ENABLED.
        cp.flash_attn_type = 1 if args.get("flash_attn") else 0
        cp.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        mem = llama_cpp.llama_get_memory(ctx)

        def decode(tokens):
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

        def one_run():
            llama_cpp.llama_memory_clear(mem, True)
            batch = [rng.randrange(n_vocab) for _ in range(n_prompt)]
            gen = [rng.randrange(n_vocab) for _ in range(n_gen)]
            t = time.perf_counter_ns()
            if batch:
                for i in range(0, len(batch), cp.n_batch):
                    decode(batch[i : i + cp.n_batch])
                llama_cpp.llama_synchronize(ctx)
            for tok in gen:
                decode([tok])
                llama_cpp.llama_synchronize(ctx)
            return time.perf_counter_ns() - t

        # Warm-up (untimed): as llama-bench, the prompt batch, or one generated token.
        llama_cpp.llama_memory_clear(mem, True)
        decode([rng.randrange(n_vocab) for _ in range(n_prompt)] if n_prompt else [rng.randrange(n_vocab)])
        llama_cpp.llama_synchronize(ctx)
        samples = [one_run() for _ in range(reps)]
        ts, avg, sd = stats(samples, n_prompt + n_gen)
        out["results"].append(
            {
                "test": f"pp{n_prompt}" if n_prompt else f"tg{n_gen}",
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "n_threads": threads,
                "endpoints": endpoints,
                "avg_ts": avg,
                "stddev_ts": sd,
                "samples_ns": samples,
                "samples_ts": ts,
            }
        )
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
