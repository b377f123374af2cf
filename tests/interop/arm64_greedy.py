"""Greedy text on aarch64 under qemu-user: llama.cpp's master (the x86 reference peer, whose own CPU
part is only the token-embedding lookup) drives an aarch64 llamad and then llama.cpp's aarch64
ggml-rpc-server (tests/peer/build-peer-aarch64.sh), both emulated on the same qemu CPU, and the
greedy tokens are compared prompt by prompt (issue 25, point 4).

    LLAMAD_BIN=scripts/llamad-qemu-aarch64 LLAMAD_QEMU_CPU=neoverse-n1 \\
        ~/.cache/llamad-peer/venv-0.3.36-avx2/bin/python tests/interop/arm64_greedy.py \\
        --profile neon-dotprod --kernels neon-dotprod [--model M] [--tokens 8]

Exit status 1 when any prompt's tokens differ. Emulation is slow: a few short prompts only.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peer  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In 1969, the first person to walk on the moon was",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="neon-dotprod", help="reference profile (neon-dotprod|neon-i8mm|sve)")
    ap.add_argument("--kernels", default="", help="LLAMAD_KERNELS for llamad (default: its own choice)")
    ap.add_argument("--model", default=os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    args = ap.parse_args()
    prompts = PROMPTS[: args.prompts]
    wrapper = os.path.join(HERE, "..", "peer", "ggml-rpc-server-aarch64")

    results = {}
    env = {"LLAMAD_KERNELS": args.kernels} if args.kernels else None
    srv = peer.start_llamad(threads=1, env_extra=env)
    try:
        results["llamad"] = peer.run_master(args.model, prompts, n_tokens=args.tokens, endpoints=[srv.endpoint], timeout=1800)
    finally:
        srv.stop()
    ref = peer._spawn_on_free_port(
        "reference", lambda p: [wrapper, args.profile, "-H", "127.0.0.1", "-p", str(p), "-t", "1"], None
    )
    try:
        results["reference"] = peer.run_master(args.model, prompts, n_tokens=args.tokens, endpoints=[ref.endpoint], timeout=1800)
    finally:
        ref.stop()

    same = 0
    for i, p in enumerate(prompts):
        a, b = results["llamad"].tokens()[i], results["reference"].tokens()[i]
        ok = a == b
        same += ok
        print(f"{'same' if ok else 'DIFF'}  {p!r}")
        print(f"    llamad:    {results['llamad'].texts()[i]!r}")
        if not ok:
            print(f"    reference: {results['reference'].texts()[i]!r}")
    print(f"{args.profile} (qemu {os.environ.get('LLAMAD_QEMU_CPU', 'neoverse-n1')}): {same} of {len(prompts)} prompts give llama.cpp's tokens")
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
