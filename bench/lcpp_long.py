"""llama.cpp's side of bench/long_context.py: a long prompt, then generation, at a given context size.

Usage: python lcpp_long.py ARGS.json OUT.json   (run under the reference peer's Python)

ARGS.json: {"model": path, "endpoints": ["127.0.0.1:PORT", ...], "n_ctx": 32768, "n_prompt": 4096,
"n_gen": 32, "n_ubatch": 512, "threads": 1}. Every layer goes to the RPC servers (``n_gpu_layers =
99``, llama.cpp's layer split by their free memory). One context of ``n_ctx`` cells; ``n_prompt``
random tokens are decoded as one batch (split into ubatches of ``n_ubatch``) and timed to
``llama_synchronize``, then ``n_gen`` random tokens one at a time after them (generation at the
prompt's depth). OUT.json gets pp_ts, tg_ts, load_s and the KV buffer sizes llama.cpp logs per
device ("... KV buffer size = N MiB").
"""

import ctypes
import json
import random
import sys
import time

from lcpp_bench import register_rpc


def main() -> int:
    with open(sys.argv[1]) as f:
        args = json.load(f)
    register_rpc(args["endpoints"])
    import llama_cpp

    kv_lines = []

    @llama_cpp.llama_log_callback
    def on_log(level, text, user_data):  # noqa: ARG001
        line = text.decode(errors="replace") if text else ""
        if "KV buffer size" in line or "compute buffer size" in line:
            kv_lines.append(line.strip())

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 99
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(args["model"].encode(), mp)
    load_s = time.perf_counter() - t0
    if not model:
        raise RuntimeError(f"cannot load {args['model']}")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    n_prompt, n_gen, n_ubatch = int(args["n_prompt"]), int(args["n_gen"]), int(args.get("n_ubatch", 512))
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = int(args["n_ctx"])
    cp.n_batch = max(n_ubatch, n_prompt)
    cp.n_ubatch = n_ubatch
    cp.n_threads = cp.n_threads_batch = int(args.get("threads", 1))
    cp.flash_attn_type = 1 if args.get("flash_attn") else 0
    cp.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    rng = random.Random(1234)

    def decode(tokens):
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    t = time.perf_counter()
    decode([rng.randrange(n_vocab) for _ in range(n_prompt)])
    llama_cpp.llama_synchronize(ctx)
    pp_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(n_gen):
        decode([rng.randrange(n_vocab)])
        llama_cpp.llama_synchronize(ctx)
    tg_s = time.perf_counter() - t
    out = {"load_s": load_s, "pp_ts": n_prompt / pp_s, "tg_ts": n_gen / tg_s if n_gen else 0.0,
           "n_ctx": cp.n_ctx, "n_prompt": n_prompt, "n_gen": n_gen, "log": kv_lines}
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
