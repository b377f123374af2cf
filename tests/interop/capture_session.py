"""Captures one real master session (model load, one prompt, N generated tokens) through proxy.py.

Usage: python capture_session.py OUTDIR [--model GGUF] [--tokens 8] [--elide-set-tensor-over BYTES]
                                 [--server ENDPOINT] [--responses] [--flash-attn]

Starts a reference server (unless ``--server`` names one, e.g. a running llamad), puts the
proxy in front of it with ``--capture OUTDIR``, runs the llama.cpp master with all layers on it,
and writes ``OUTDIR/session.json`` (prompt, text, counters). The request streams seed fuzz
corpora; see captures/README.md for the committed one.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peer  # noqa: E402
import proxy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--model", default=os.environ.get("LLAMAD_MODEL") or os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--elide-set-tensor-over", type=int, default=None)
    ap.add_argument("--responses", action="store_true")
    ap.add_argument("--flash-attn", action="store_true", help="run the master with flash attention on")
    ap.add_argument("--server", help="HOST:PORT of a running server instead of a fresh reference server")
    args = ap.parse_args()

    os.makedirs(args.outdir, exist_ok=True)
    server = None
    if args.server:
        host, port = args.server.rsplit(":", 1)
        upstream = (host, int(port))
    else:
        server = peer.start_reference_server()
        upstream = ("127.0.0.1", server.port)
    try:
        with proxy.Proxy(upstream[1], upstream[0], 0, args.outdir, args.responses, args.elide_set_tensor_over) as px:
            res = peer.run_master(args.model, [args.prompt], args.tokens, endpoints=[px.endpoint], flash_attn=args.flash_attn)
            px.wait_closed()
            snap = px.stats.snapshot()
    finally:
        if server:
            server.stop()
    session = {
        "model": os.path.basename(args.model),
        "prompt": args.prompt,
        "n_tokens": args.tokens,
        "flash_attn": args.flash_attn,
        "text": res.texts()[0],
        "tokens": res.tokens()[0],
        "server": "llama.cpp reference (llama-cpp-python 0.3.36)" if server else args.server,
        "elide_set_tensor_over": args.elide_set_tensor_over,
        "stats": {k: v for k, v in snap.items() if k != "hash_requests"},
    }
    with open(os.path.join(args.outdir, "session.json"), "w") as f:
        json.dump(session, f, indent=1)
    print(json.dumps({"text": session["text"], "connections": snap["connections"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
