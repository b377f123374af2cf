"""One llama.cpp master session (load the model, greedy completions), run in a fresh process.

Usage: python ref_master.py ARGS.json OUT.json

Registering RPC devices is process-global in ggml and cannot be undone, so every configuration
(local CPU, one server, two servers, flash attention on/off) runs in its own process. ARGS.json:

    {"model": path, "endpoints": ["127.0.0.1:PORT", ...], "n_gpu_layers": 99,
     "flash_attn": bool, "n_ctx": 512, "seed": 1234, "n_threads": 1,
     "prompts": [str, ...], "n_tokens": 32}

An optional "n_batch" sets the prompt's decode batch and micro-batch (llama.cpp's default is 512), so
that a prompt longer than it spans several micro-batches.

With "logits_dir", the logits at every prompt position are saved as logits-I.npy; "token_prompts"
([[id, ...], ...]) gives those prompts as token ids instead (no tokenizer needed: tiny test models),
and "prompts" may then be left out (no generation).

OUT.json receives the device list, the load time, and per prompt the prompt token ids, the
generated token ids and text, and llama.cpp's own prompt/generation timings. The route into
RPC follows ggml-rpc-protocol.md §11.6 (``rpc_servers=`` is ignored by llama-cpp-python 0.3.36).
"""

import json
import sys
import time

import _ggml


def register_rpc(endpoints):
    """Registers each endpoint as an RPC backend (what ``--rpc`` does); returns the device names."""
    ggml = _ggml.ggml()
    if endpoints:
        rpc = _ggml.ggml_rpc()
        for ep in endpoints:
            reg = rpc.ggml_backend_rpc_add_server(ep.encode())
            if not reg:
                raise RuntimeError(f"ggml_backend_rpc_add_server({ep}) failed")
            ggml.ggml_backend_register(reg)
    return [ggml.ggml_backend_dev_name(ggml.ggml_backend_dev_get(i)).decode() for i in range(ggml.ggml_backend_dev_count())]


def main() -> int:
    with open(sys.argv[1]) as f:
        args = json.load(f)
    devices = register_rpc(args.get("endpoints", []))

    import llama_cpp  # after registration, so the registry already holds the RPC devices

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args["model"],
        n_gpu_layers=args.get("n_gpu_layers", 0),
        flash_attn=bool(args.get("flash_attn", False)),
        n_ctx=args.get("n_ctx", 512),
        **({"n_batch": args["n_batch"], "n_ubatch": args["n_batch"]} if args.get("n_batch") else {}),
        seed=args.get("seed", 1234),
        n_threads=args.get("n_threads", 1),
        n_threads_batch=args.get("n_threads", 1),
        verbose=bool(args.get("verbose", True)),
        logits_all=bool(args.get("logits_dir")),
    )
    load_s = time.perf_counter() - t0
    eos = llm.token_eos()
    # Generation ends on any end-of-generation token (EOS, EOT, <|im_end|>, ...), as llama-cli and
    # llama-server stop, not on EOS alone.
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    if args.get("logits_dir"):
        # Logits at every prompt position, one .npy per prompt (for closeness checks).
        import numpy as np

        seqs = args.get("token_prompts") or [
            llm.tokenize(p.encode(), add_bos=True, special=False) for p in args["prompts"]
        ]
        for i, toks in enumerate(seqs):
            llm.reset()
            llm.eval(toks)
            np.save(f"{args['logits_dir']}/logits-{i}.npy", np.array(llm.scores[: len(toks)], dtype=np.float32))
    runs = []
    for prompt in args.get("prompts", []):
        ptoks = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        out = []
        t_start = time.perf_counter()
        t_first = None
        for tok in llm.generate(ptoks, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            if t_first is None:
                t_first = time.perf_counter()
            out.append(int(tok))
            if llama_cpp.llama_vocab_is_eog(vocab, tok) or len(out) >= args["n_tokens"]:
                break
        t_end = time.perf_counter()
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        runs.append(
            {
                "prompt": prompt,
                "prompt_tokens": [int(t) for t in ptoks],
                "tokens": out,
                "text": llm.detokenize(out, prev_tokens=ptoks).decode("utf-8", errors="replace"),
                "n_p_eval": perf.n_p_eval,
                "t_p_eval_ms": perf.t_p_eval_ms,
                "n_eval": perf.n_eval,
                "t_eval_ms": perf.t_eval_ms,
                "wall_first_token_s": (t_first or t_end) - t_start,
                "wall_total_s": t_end - t_start,
            }
        )
    result = {"devices": devices, "load_s": load_s, "eos": int(eos), "runs": runs}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f, indent=1)
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
